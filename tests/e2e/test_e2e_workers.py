"""End to end with real processes: a real scheduler (PostgreSQL, real gRPC), real ``aryl-agent``
daemons with fake GPUs, and ``examples/train.py`` as the job. Covers what a user relies on: a job
runs to completion and its logs can be read; a crash follows the restart policy; an agent killed
with -9 loses its server, the job resumes from its checkpoint elsewhere and the agent, back, stops
what no longer belongs there; an elastic resize keeps the progress; a scheduler restart leaves the
workers running; a worker ignoring SIGTERM is killed after the grace period. No process outlives a
test (checked through /proc).
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from arylctl.cli import main as arylctl
from protos.aryl.v1 import types_pb2
from tests.fixtures.cluster import Cluster, end_leftovers
from tests.helpers import processes_mentioning, wait_for

J = types_pb2

pytestmark = pytest.mark.postgres


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    c = Cluster(tmp_path, postgres_url)
    yield c
    c.close()
    end_leftovers(tmp_path)


def logs(cluster: Cluster, job_id: str, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = arylctl(["--server", cluster.scheduler.address, "logs", job_id, *args], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_a_job_runs_to_completion_reports_progress_and_its_logs_can_be_read(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a")
    cluster.start_agent("node-b")
    job_id = cluster.submit("two-ranks", "--total-steps", "12", "--step-time", "0.3", "--log-every", "4",
                            workers=2, gpus=2)
    job = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_COMPLETED, "completed")
    assert job.progress == 12 and not job.workers
    assert job.incarnation == 1 and job.restarts == 0
    rank1 = logs(cluster, job_id, "--rank", "1")
    assert "[rank 1/2] starting at step 0" in rank1 and "done: step 12" in rank1
    assert logs(cluster, job_id, "--tail", "1").strip().endswith("checkpointed at 12")


def test_a_crash_is_restarted_under_on_failure_and_fails_when_restarts_run_out(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a")
    job_id = cluster.submit("crashy", "--total-steps", "50", "--step-time", "0.05", "--fail-at-step", "3",
                            max_restarts=1, restart_policy=J.RESTART_POLICY_ON_FAILURE)
    job = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_FAILED, "failed")
    assert job.restarts == 1 and job.incarnation == 2
    assert "rank 0 failed (exited with status 3)" in job.message
    assert logs(cluster, job_id).count("injected failure at step 3") == 2


def test_a_killed_agent_loses_its_server_and_the_job_resumes_from_its_checkpoint(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a")
    job_id = cluster.submit("resumable", "--total-steps", "100000", "--step-time", "0.05", "--checkpoint-every", "5")
    cluster.wait_job(job_id, lambda j: j.progress >= 20, "progress past step 20")
    cluster.start_agent("node-b")
    wait_for(lambda: len(cluster.client.list_servers()) == 2, what="node-b registered")

    cluster.kill_agent("node-a")  # kill -9: its worker keeps running, but the scheduler hears nothing
    job = cluster.wait_job(job_id, lambda j: j.incarnation == 2 and j.state == J.JOB_STATE_RUNNING,
                           "restarted on node-b", timeout=30)
    assert [w.server_id for w in job.workers] == ["node-b"] and job.preemptions == 1
    servers = {s.server_id: s for s in cluster.client.list_servers()}
    assert servers["node-a"].state == J.SERVER_STATE_LOST
    log_b = wait_for(lambda: text if "(incarnation 2)" in (text := logs(cluster, job_id)) else None,
                     what="the new incarnation's log")
    resumed_at = int(log_b.split("starting at step ")[-1].split()[0])
    assert resumed_at >= 20  # from the checkpoint, not from scratch

    # node-a's agent comes back, adopts the old worker and stops it: it no longer belongs there.
    cluster.start_agent("node-a")
    wait_for(lambda: {s.server_id: s.state for s in cluster.client.list_servers()}["node-a"] == J.SERVER_STATE_TRAINING,
             what="node-a back")
    old_log = cluster.tmp / "agent-node-a" / "logs" / job_id / "rank-0.log"
    wait_for(lambda: "preempted (SIGTERM)" in old_log.read_text(), timeout=20, what="the old worker stopped")


def test_an_elastic_job_scales_out_and_keeps_its_progress(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a", gpus=1)
    job_id = cluster.submit("elastic", "--total-steps", "100000", "--step-time", "0.05", "--checkpoint-every", "5",
                            workers=1, max_workers=3)
    cluster.wait_job(job_id, lambda j: j.progress >= 15, "progress past step 15")
    cluster.start_agent("node-b", gpus=2)
    job = cluster.wait_job(job_id, lambda j: j.num_workers == 3 and j.incarnation >= 2, "scaled out to 3", timeout=30)
    before = job.progress
    assert before >= 15
    # The new world of 3 resumes from the checkpoint and carries on: progress never restarts at 0.
    job = cluster.wait_job(job_id, lambda j: j.progress >= before + 10, "progress after the resize")
    for rank in range(3):
        def started(r: int = rank) -> str | None:
            return t if "/3] starting" in (t := logs(cluster, job_id, "--rank", str(r))) else None
        text = wait_for(started, what=f"rank {rank} started in the world of 3")
        assert int(text.split("/3] starting at step ")[-1].split()[0]) >= 15


def test_workers_keep_running_through_a_scheduler_restart(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a")
    job_id = cluster.submit("steady", "--total-steps", "80", "--step-time", "0.1")
    cluster.wait_job(job_id, lambda j: j.progress >= 5, "progress")
    log = cluster.tmp / "agent-node-a" / "logs" / job_id / "rank-0.log"
    cluster.stop_scheduler()
    cluster.start_scheduler()  # a new term (epoch); the agent re-registers with backoff
    job = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_COMPLETED, "completed after the restart")
    assert job.incarnation == 1 and job.restarts == 0 and job.progress == 80
    assert log.read_text().count("starting at step") == 1  # never restarted


def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(cluster: Cluster) -> None:
    cluster.start_scheduler(scheduling={"default_grace_period_s": 1.0})
    cluster.start_agent("node-a")
    job_id = cluster.submit("stubborn", "--total-steps", "100000", "--step-time", "0.05", "--ignore-sigterm")
    cluster.wait_job(job_id, lambda j: j.progress >= 3, "progress")
    cluster.client.cancel_job(job_id, reason="test")
    log = cluster.tmp / "agent-node-a" / "logs" / job_id / "rank-0.log"
    wait_for(lambda: not processes_mentioning(str(cluster.tmp), command="train.py"),
             timeout=15, what="the worker killed")
    assert "done" not in log.read_text() and "preempted" not in log.read_text()  # it never saw a clean end
    assert cluster.job(job_id).state == J.JOB_STATE_CANCELLED
