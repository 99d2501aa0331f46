"""Any replica serves the agents' desired-state streams, the leader alone decides (issue 35 item 2,
``docs/ha.md``): a leader (in this process) and a standby (a real ``aryl-scheduler`` process) on one PostgreSQL
database, both with their desired-state streams' own processes (``server.desired_state_port``), and a real
``aryl-agent`` given the leader's address alone.

The standby beats in the registry of replicas (``store.replicas``) and the leader sees its push process live;
the agent registers with the leader, is told to watch the standby's process, and a job submitted to the leader
reaches it through the standby's stream (it runs to completion, the agent having registered once and never
watched anything else). Then the standby is killed with SIGKILL: its push process ends with it, the agent falls
back to the leader's own push process without registering again, the leader drops the silent standby after
``ha.replica_stale_s``, and a second job reaches the agent and completes. ``arylctl cluster`` shows the
replicas: the leader, the live standby with its push process, then the standby stale.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arylctl.commands.cluster import describe_cluster
from protos.aryl.v1 import scheduler_pb2, types_pb2
from tests.chaos.conftest import SchedulerProcess
from tests.fixtures.cluster import Cluster, end_leftovers
from tests.helpers import wait_for

pytestmark = pytest.mark.postgres

# The default 8 s lease (a leader on a busy machine keeps it), renewed and beaten every second; a replica
# silent 3 s drops out.
HA = {"lease_s": 8.0, "renew_s": 1.0, "replica_stale_s": 3.0}
WATCHING = re.compile(r"watching the desired state on the scheduler's desired-state streams' process.*"
                      r"address=(\S+)")


def _replicas_shown(cluster: Cluster, count: int) -> list[scheduler_pb2.SchedulerReplica] | None:
    replicas = list(cluster.client.get_cluster().replicas)
    return replicas if len(replicas) == count and all(r.push_address for r in replicas) else None


def test_an_agent_watches_a_standby_s_process_and_falls_back_when_the_standby_dies(
    tmp_path: Path, chaos_db: str
) -> None:
    cluster = Cluster(tmp_path, chaos_db)
    standby = SchedulerProcess(
        chaos_db, tmp_path / "standby.log", tmp_path / "kill-standby",
        ARYL_SERVER__DESIRED_STATE_PORT="0", ARYL_LOGGING__LEVEL="info",
        **{f"ARYL_HA__{name.upper()}": str(value) for name, value in HA.items()},
        CHAOS_TEST_MARKER=str(tmp_path),  # its push process inherits it: ``end_leftovers`` finds both
    )
    try:
        cluster.start_scheduler(server={"desired_state_port": 0}, ha=HA)
        leader = cluster.scheduler.service
        assert leader.leadership is not None and leader.leadership.leading
        assert leader.replicas is not None and leader.push_process is not None
        own_push = f"{cluster.scheduler.address.rpartition(':')[0]}:{leader.push_process.port}"
        standby.start()

        def standby_push() -> str | None:
            assert leader.replicas is not None
            return next((r.push_address for r in leader.replicas.live()
                         if r.address == standby.address and r.push_address), None)

        standby_push_address = wait_for(standby_push, timeout=60, what="the leader to see the standby's push process")
        assert standby_push_address != own_push
        # ``arylctl cluster`` shows both (GetCluster, from the leader's view: no table is read).
        shown = {r.address: r for r in wait_for(lambda: _replicas_shown(cluster, 2), timeout=30,
                                                  what="GetCluster to show both replicas")}
        assert shown[cluster.scheduler.address].leader and shown[cluster.scheduler.address].push_address == own_push
        assert shown[standby.address].live and not shown[standby.address].leader
        assert shown[standby.address].push_address == standby_push_address
        table = describe_cluster(cluster.client.get_cluster())
        assert re.search(rf"{re.escape(standby.address)}\s+standby\s+{re.escape(standby_push_address)}", table), table

        cluster.start_agent("node-a")
        log = tmp_path / "node-a.log"

        def watched() -> list[str]:
            return WATCHING.findall(log.read_text(errors="replace"))

        wait_for(watched, timeout=60, what="the agent watching a desired-state streams' process")
        assert watched() == [standby_push_address]
        job_id = cluster.submit("through-the-standby", "--total-steps", "3", "--step-time", "0.1")
        cluster.wait_job(job_id, lambda j: j.state == types_pb2.JOB_STATE_COMPLETED, "completed")
        text = log.read_text(errors="replace")
        assert watched() == [standby_push_address], text[-3000:]  # the job reached it on the standby's stream
        assert text.count("registered with the scheduler") == 1, text[-3000:]

        # The standby dies (no shutdown of any kind): its push process ends with it; the agent falls back to the
        # leader's own, and the leader stops naming the standby once it is silent past the staleness.
        standby.kill9()
        wait_for(lambda: len(watched()) == 2, timeout=60, what="the agent watching the leader's push process")
        assert watched() == [standby_push_address, own_push]
        wait_for(lambda: standby_push() is None, timeout=30, what="the leader to drop the silent standby")
        assert [r.live for r in cluster.client.get_cluster().replicas if r.address == standby.address] == [False]
        assert re.search(rf"{re.escape(standby.address)}\s+stale", describe_cluster(cluster.client.get_cluster()))
        again = cluster.submit("after-the-standby", "--total-steps", "3", "--step-time", "0.1")
        cluster.wait_job(again, lambda j: j.state == types_pb2.JOB_STATE_COMPLETED, "completed")
        text = log.read_text(errors="replace")
        assert text.count("registered with the scheduler") == 1, text[-3000:]  # its one session throughout
        assert "watching the scheduler itself" not in text, text[-3000:]
    finally:
        cluster.close()
        standby.stop()
        end_leftovers(tmp_path)
