"""Database connection faults, for real, on PostgreSQL (issue 19: a lost connection came back to
clients as INTERNAL and was not retried).

The scheduler's own connections are ended with ``pg_terminate_backend`` (only in this test
session's scratch database): the next call of every kind succeeds, the service running it once
more on a fresh connection. With the database unreachable (the scheduler reaches PostgreSQL
through a TCP relay the test closes) every call answers UNAVAILABLE with a message saying to
retry, never INTERNAL; once the relay is back, calls succeed again. On the store: a write whose
connection is ended before COMMIT runs again on a fresh connection; one ended during COMMIT is
not run again (it may have been saved) and answers UNAVAILABLE.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2
from scheduler_service.errors import Unavailable
from scheduler_service.server import serve_in_background
from scheduler_service.store import models as m
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.transactions import Transactions
from tests.fixtures.tcp_relay import TcpRelay
from tests.harness import job_spec, register_fake_server, scheduler_config, scheduler_stub

pytestmark = pytest.mark.postgres

UNREACHABLE = "the scheduler's database is unreachable; retry"


@contextlib.contextmanager
def _scheduler(database_url: str) -> Iterator[str]:
    # Cycles on their own only every minute: the calls under test, not a background cycle, should
    # be the first to meet a dead connection.
    handle = serve_in_background(scheduler_config(database_url, scheduling={"cycle_interval_s": 60.0},
                                                  agents={"lost_after_s": 600.0}))
    try:
        yield handle.address
    finally:
        handle.stop()


def _calls(address: str) -> dict[str, Callable[[], Any]]:
    """One call of each kind: reads, writes through the group commit, an agent's writes."""
    channel, stub = scheduler_stub(address)
    agent = agent_pb2_grpc.AgentServiceStub(channel)
    first = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("first")), timeout=10).job
    registered = register_fake_server(address, "node-1", gpus=2)
    flips = itertools.count()

    def report() -> agent_pb2.ReportStatusResponse:
        # GPU 1's health flips each time, so the report is never answered from memory.
        healthy = next(flips) % 2 == 1
        return agent.ReportStatus(agent_pb2.ReportStatusRequest(
            server_id="node-1", scheduler_epoch=registered.scheduler_epoch,
            gpus=[agent_pb2.GpuStatus(index=0, healthy=True),
                  agent_pb2.GpuStatus(index=1, healthy=healthy, health_reason="" if healthy else "XID 79")],
        ), timeout=10)

    return {
        "ListJobs": lambda: stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10),
        "GetJob": lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=first.job_id), timeout=10),
        "ListServers": lambda: stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=10),
        "SubmitJob": lambda: stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("next")), timeout=10),
        "RegisterServer": lambda: register_fake_server(address, "node-1", gpus=2),
        "ReportStatus": report,
    }


def _terminate_scheduler_connections(url: str) -> int:
    """End every other session on the test's scratch database (the scheduler's); returns how many."""
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )).scalar_one())
    finally:
        admin.dispose()


def test_every_call_succeeds_after_the_schedulers_connections_are_terminated(postgres_url: str) -> None:
    with _scheduler(postgres_url) as address:
        calls = _calls(address)
        for name, call in calls.items():
            call()  # every kind has used a pooled connection before
            assert _terminate_scheduler_connections(postgres_url) > 0
            try:
                call()
            except grpc.RpcError as exc:
                pytest.fail(f"{name} after pg_terminate_backend: {exc.code().name}: {exc.details()}")


def test_calls_answer_unavailable_while_the_database_is_unreachable(postgres_url: str) -> None:
    url = make_url(postgres_url)
    relay = TcpRelay((url.host or "127.0.0.1", url.port or 5432))
    relayed = url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)
    try:
        with _scheduler(relayed) as address:
            calls = _calls(address)
            relay.close()
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                    pytest.fail(f"{name} answered while the database was unreachable")
                assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, (
                    f"{name}: {refused.value.code().name}: {refused.value.details()}")
                assert refused.value.details() == UNREACHABLE, name
            relay.open()  # the database is back: so is the scheduler, without a restart
            for call in calls.values():
                call()
    finally:
        relay.close()


def _terminate(url: str, pid: int) -> None:
    """End backend ``pid`` and wait until it is gone."""
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            deadline = time.monotonic() + 5
            while conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"),
                               {"pid": pid}).scalar_one():
                assert time.monotonic() < deadline, f"backend {pid} still alive"
                time.sleep(0.01)
    finally:
        admin.dispose()


def _add_event(runs: list[int], reason: str) -> Callable[[Session], int]:
    def work(session: Session) -> int:
        runs.append(session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())
        session.add(m.Event(time=0.0, kind="TEST", reason=reason, message="", details={}))
        return runs[-1]
    return work


def _events(transactions: Transactions, reason: str) -> int:
    return transactions.read(
        lambda session: session.execute(
            sa.select(sa.func.count()).select_from(m.Event).where(m.Event.reason == reason)).scalar_one())


def test_a_write_whose_connection_is_lost_before_commit_runs_again(postgres_url: str) -> None:
    engine = create_engine_for(postgres_url)
    transactions = Transactions(session_factory(engine), publish=lambda _states: None)
    runs: list[int] = []
    add = _add_event(runs, "BEFORE_COMMIT")

    def terminated_once(session: Session) -> int:
        pid = add(session)
        if len(runs) == 1:
            _terminate(postgres_url, pid)  # mid-transaction: the database rolls it back
        return pid

    try:
        transactions.write(terminated_once)
        assert len(runs) == 2 and runs[0] != runs[1]  # again, on a fresh connection
        assert _events(transactions, "BEFORE_COMMIT") == 1
    finally:
        engine.dispose()


def test_a_write_whose_connection_is_lost_during_commit_is_not_run_again(postgres_url: str) -> None:
    engine = create_engine_for(postgres_url)
    transactions = Transactions(session_factory(engine), publish=lambda _states: None)
    runs: list[int] = []
    terminated: list[int] = []

    @sa.event.listens_for(engine, "commit")
    def _on_commit(_conn: sa.Connection) -> None:  # right before the DBAPI's COMMIT
        if runs and not terminated:
            terminated.append(runs[0])
            _terminate(postgres_url, runs[0])

    try:
        with pytest.raises(Unavailable, match="may or may not have been saved"):
            transactions.write(_add_event(runs, "DURING_COMMIT"))
        assert len(runs) == 1  # whether it was saved is unknown to the scheduler: never blindly again
        assert _events(transactions, "DURING_COMMIT") == 0  # (here it was not: COMMIT never arrived)
    finally:
        engine.dispose()


def _conflicting(engine: sa.Engine, job_id: int, conflicts: int, runs: list[int]) -> Callable[[Session], int]:
    """A unit of work that loses a real optimistic-concurrency race on its first ``conflicts`` runs:
    a rival transaction changes the job (and its version) between this unit's read and its write."""

    def work(session: Session) -> int:
        job = session.get(m.Job, job_id)
        assert job is not None
        runs.append(job.version)
        if len(runs) <= conflicts:
            with Session(engine) as rival, rival.begin():
                rival_job = rival.get(m.Job, job_id)
                assert rival_job is not None
                rival_job.priority += 1
        job.priority = 1000 + len(runs)  # always a change: an UPDATE that checks the version read
        return job_id

    return work


def test_a_write_that_keeps_losing_races_runs_again_after_pauses_until_it_wins(postgres_url: str) -> None:
    """A status report and a plan often touch the same server and job rows; the hour-long soak saw
    three immediate attempts all lose (ABORTED to the agent). The write now pauses, jittered, between
    attempts and tries up to CONFLICT_RETRIES times."""
    from sqlalchemy.orm import sessionmaker

    from scheduler_service.errors import Aborted
    from scheduler_service.store.transactions import CONFLICT_RETRIES
    from tests.fixtures.store import make_job

    engine = create_engine_for(postgres_url)
    try:
        with sessionmaker(engine).begin() as session:
            job_id = make_job(session, name="raced").id
        transactions = Transactions(session_factory(engine), publish=lambda _states: None)
        runs: list[int] = []
        assert transactions.write(_conflicting(engine, job_id, 3, runs)) == job_id  # three lost races, then won
        assert len(runs) == 4 and runs == sorted(runs) and len(set(runs)) == 4
        with Session(engine) as session:
            assert session.get_one(m.Job, job_id).priority == 1004

        runs.clear()
        with pytest.raises(Aborted, match="a concurrent change modified the same object"):
            transactions.write(_conflicting(engine, job_id, CONFLICT_RETRIES, runs))
        assert len(runs) == CONFLICT_RETRIES  # every attempt lost: the caller hears ABORTED, nothing half-written
        with Session(engine) as session:
            assert session.get_one(m.Job, job_id).priority == 1004 + CONFLICT_RETRIES
    finally:
        engine.dispose()
