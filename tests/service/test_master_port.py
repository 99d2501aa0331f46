"""MASTER_PORT per (master server, job), from a configured range below the ephemeral ports: over real
gRPC on SQLite and PostgreSQL, read from the desired state agents receive (``store.ports``).

Before: every job met on ``29500 + job id % 10000``, so jobs 10,000 ids apart shared a port on the
same server and the ports ran into Linux's ephemeral range (32768+)."""

from __future__ import annotations

import json

import pydantic
import pytest
import sqlalchemy as sa

from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.store.db import create_engine_for
from tests.fixtures.workers import Agent, get_job, running, submit
from tests.harness import job_spec, register_fake_server, scheduler_config, scheduler_stub
from tests.helpers import wait_for

TWO_PORTS = {"master_port_min": 29500, "master_port_max": 29501}


def master_ports(agent: Agent) -> dict[str, int]:
    """job id -> MASTER_PORT, as the agent is told (rank 0's entries)."""
    return {w.job_id: w.master_port for w in agent.desired().workers if w.rank == 0}


def test_jobs_on_one_server_get_distinct_ports_from_the_range_and_a_full_range_makes_a_job_wait(
    scheduler_factory,
) -> None:
    scheduler = scheduler_factory(scheduling=TWO_PORTS)
    channel, stub = scheduler_stub(scheduler.address)
    agent = Agent(scheduler.address, "gpu-1", register_fake_server(scheduler.address, "gpu-1", gpus=4).scheduler_epoch)
    try:
        first, second = submit(stub, job_spec("a")), submit(stub, job_spec("b"))
        running(stub, first), running(stub, second)
        ports = wait_for(lambda: len(p := master_ports(agent)) == 2 and p, what="two jobs' ports")
        assert sorted(ports.values()) == [29500, 29501]

        # GPUs are free, but both ports of the range are held on gpu-1: the third job waits, and says why.
        third = submit(stub, job_spec("c"))
        waiting = wait_for(lambda: (j := get_job(stub, third)).pending_reason and j, what="a pending reason")
        assert waiting.state == types_pb2.JOB_STATE_PENDING
        assert waiting.pending_reason.startswith("WAITING_FOR_MASTER_PORT: no free rendezvous port on server gpu-1")
        assert "29500-29501" in waiting.pending_reason
        explained = stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=third), timeout=5)
        assert [d.reason for d in explained.decisions].count("WAITING_FOR_MASTER_PORT") == 1  # once, not per cycle

        # A job ends: its port is reused, and never shared with the job still running.
        stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=first, reason="done"), timeout=5)
        running(stub, third)
        after = wait_for(lambda: third in (p := master_ports(agent)) and p, what="the third job's port")
        assert after == {second: ports[second], third: ports[first]}
    finally:
        agent.close()
        channel.close()


def test_a_job_keeps_its_port_while_it_grows(scheduler_factory) -> None:
    scheduler = scheduler_factory(scheduling=TWO_PORTS, policy={"min_resize_interval_s": 0, "restart_cost_s": 1})
    channel, stub = scheduler_stub(scheduler.address)
    agent = Agent(scheduler.address, "gpu-1", register_fake_server(scheduler.address, "gpu-1", gpus=4).scheduler_epoch)
    try:
        job = submit(stub, job_spec("elastic", workers=1, max_workers=4))
        running(stub, job, 4)
        desired = wait_for(lambda: len((d := agent.desired()).workers) == 4 and d, what="four workers")
        assert {w.master_port for w in desired.workers} == {29500}
    finally:
        agent.close()
        channel.close()


def test_the_database_refuses_two_jobs_on_one_port_of_one_server(database_url: str) -> None:
    engine = create_engine_for(database_url)
    try:
        with engine.begin() as conn:
            ids = [conn.execute(sa.text(
                "INSERT INTO jobs (name, \"user\", queue, command, env, gpus_per_worker, min_workers, max_workers, "
                "priority, throughput, restart_policy, max_restarts, state, state_reason, state_message, "
                "pending_reason, num_workers, restarts, preemptions, submitted_at, version) VALUES ('j', 'u', 'q', "
                "'[]', '{}', 1, 1, 1, 0, '{}', 'NEVER', 0, 'PENDING', '', '', '', 0, 0, 0, 0, 1) RETURNING id"
            )).scalar_one() for _ in range(2)]
            insert = sa.text("INSERT INTO master_ports (server_id, port, job_id, allocated_at) "
                             "VALUES ('s', 29500, :j, 0)")
            conn.execute(insert, {"j": ids[0]})
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(insert, {"j": ids[1]})
    finally:
        engine.dispose()


@pytest.mark.parametrize(("low", "high", "complaint"), [
    (29500, 40000, "less than 32768"), (29999, 29500, "below master_port_min"),
])
def test_a_range_into_the_ephemeral_ports_or_upside_down_is_refused(low: int, high: int, complaint: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=complaint):
        scheduler_config("sqlite://", scheduling={"master_port_min": low, "master_port_max": high})


def test_migration_0007_gives_running_jobs_distinct_ports_and_previews_and_goes_back(tmp_path) -> None:
    from migrations import downgrade, upgrade

    url = f"sqlite:///{tmp_path / 'aryl.db'}"
    upgrade(url, "0006")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            # (SQLite enforces no foreign keys on this plain connection: no server or GPU rows needed.)
            for gpu in (0, 1):
                job = conn.execute(sa.text(
                    "INSERT INTO jobs (name, \"user\", queue, command, env, gpus_per_worker, min_workers, "
                    "max_workers, priority, throughput, restart_policy, max_restarts, state, state_reason, "
                    "state_message, pending_reason, num_workers, restarts, preemptions, submitted_at, version) VALUES "
                    "('j', 'u', 'q', :command, '{}', 1, 1, 1, 0, '{}', 'NEVER', 0, 'RUNNING', '', '', '', 1, 0, 0, "
                    "0, 1) RETURNING id"), {"command": '["python", "' + "x" * 300 + '"]'}).scalar_one()
                conn.execute(sa.text("INSERT INTO allocations (job_id, rank, server_id, gpu_index, allocated_at) "
                                     "VALUES (:j, 0, 's', :g, 0)"), {"j": job, "g": gpu})
        upgrade(url, "0007")
        with engine.connect() as conn:
            assert sorted(conn.execute(sa.text("SELECT port FROM master_ports WHERE server_id = 's'")).scalars()) \
                == [29500, 29501]
            previews = conn.execute(sa.text("SELECT command_preview FROM jobs")).scalars().all()
            assert [json.loads(p) for p in previews] == [["python"], ["python"]]  # 256 characters at most
        downgrade(url, "0006")
        assert "master_ports" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
