"""The edges of the application layer (issue 32): ExplainJob as a use case that returns a plain value,
judged by the policy parameters it is given; and the store's domain errors in place of SQLAlchemy's
(a repeated idempotency key is ``KeyTaken``, a GPU registered elsewhere ``GpuTaken``), on SQLite and
PostgreSQL."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from protos.aryl.v1 import types_pb2
from scheduler_service.api import job_validation
from scheduler_service.app.explain import JobExplainer, JobExplanation
from scheduler_service.clock import SystemClock
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.predict import DeadlineOutlook, DeadlineStatus
from scheduler_service.errors import GpuTaken, KeyTaken
from scheduler_service.lifecycle import JobState, Pool
from scheduler_service.records import EventInfo, Explanation, GpuReport, JobInfo, ServerRegistration
from scheduler_service.store import models as m
from scheduler_service.store.agents import AgentStore
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.jobs import JobStore
from scheduler_service.store.transactions import Transactions
from tests.helpers import scaled_timeout, wait_for

NOW = 1_790_000_000.0


# -- ExplainJob's use case, over hand-made reads -----------------------------------------------------


def _running_job(**fields: Any) -> JobInfo:
    base: dict[str, Any] = dict(
        id=7, name="train", user="alice", queue="research", command=("python", "train.py"), env={},
        gpus_per_worker=1, min_workers=1, max_workers=4, priority=0, deadline=None, throughput={},
        max_runtime_s=None, restart_policy="NEVER", max_restarts=0, idempotency_key=None, state=JobState.RUNNING,
        state_reason="STARTED", state_message="", pending_reason="", num_workers=2, restarts=0, preemptions=0,
        submitted_at=NOW - 1000, started_at=NOW - 900, finished_at=None, version=3, last_resized_at=NOW - 100,
        work_done=0.0, last_checkpoint_at=None, incarnation=1, checkpoint_work=None, worker_exits=None,
        rank_servers=None, disruptions=(NOW - 100,),
    )
    return JobInfo(**{**base, **fields})


class _Jobs:
    def __init__(self, job: JobInfo, decisions: tuple[EventInfo, ...] = ()) -> None:
        self.job, self.decisions = job, decisions

    def explain(self, job_id: int) -> Explanation:
        assert job_id == self.job.id
        return Explanation(self.job, "running on 2 worker(s)", self.decisions)


class _Deadlines:
    OUTLOOK = DeadlineOutlook(DeadlineStatus.NONE, "no deadline", None)

    def outlooks(self, jobs: list[JobInfo]) -> dict[int, DeadlineOutlook]:
        return {j.id: self.OUTLOOK for j in jobs}


class _Queues:
    def describe(self, name: str) -> str:
        return f"queue `{name}`: described"


def _explainer(job: JobInfo) -> JobExplainer:
    return JobExplainer(_Jobs(job), _Deadlines(), _Queues())  # type: ignore[arg-type]  # fakes of the stores


def test_the_use_case_returns_a_plain_value_judged_by_the_params_it_is_given() -> None:
    job = _running_job()
    explained = _explainer(job).explain(7, now=NOW, params=PolicyParams(min_resize_interval_s=600.0))

    assert isinstance(explained, JobExplanation)
    with pytest.raises(dataclasses.FrozenInstanceError):
        explained.summary = "changed"  # type: ignore[misc]
    assert explained.job is job
    assert explained.summary == "running on 2 worker(s)"
    assert explained.decisions == ()
    assert explained.outlook is _Deadlines.OUTLOOK
    assert explained.queue_status == "queue `research`: described"
    # Resized 100 s ago, a window of 600 s (the params given, not the defaults' 300 s): protected for 500 s more.
    assert explained.protection.startswith("protected (MIN_RUNTIME) until ")
    assert "a job runs at least 600s at a size" in explained.protection
    assert explained.disruptions_last_hour == 1


def test_a_shorter_window_given_leaves_the_job_unprotected() -> None:
    explained = _explainer(_running_job()).explain(7, now=NOW, params=PolicyParams(min_resize_interval_s=60.0))
    assert explained.protection == ""
    assert explained.disruptions_last_hour == 1


def test_a_pending_job_has_no_window() -> None:
    job = _running_job(state=JobState.PENDING, num_workers=0, started_at=None, last_resized_at=None, disruptions=())
    explained = _explainer(job).explain(7, now=NOW, params=PolicyParams())
    assert (explained.protection, explained.disruptions_last_hour) == ("", 0)


# -- the store's domain errors -------------------------------------------------------------------------


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine_for(database_url)
    yield engine
    engine.dispose()


def _db(engine: sa.Engine) -> Transactions:
    return Transactions(session_factory(engine), publish=lambda states: None)


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0


def test_a_repeated_idempotency_key_is_key_taken_and_writes_nothing(engine: sa.Engine) -> None:
    clock = SystemClock()
    store, db = JobStore(StateChanges(clock), DesiredStates(epoch=lambda: 1), clock), _db(engine)
    first = job_validation.job_submission(types_pb2.JobSpec(
        name="first", user="alice", command=["python", "train.py"], gpus_per_worker=1, min_workers=1,
    ), "key-1", now=NOW)
    db.write(lambda session: store.insert(session, [first], NOW))
    again = dataclasses.replace(first, name="again")
    other = dataclasses.replace(first, name="other", idempotency_key="key-2")

    with pytest.raises(KeyTaken):
        db.write(lambda session: store.insert(session, [other, again], NOW))
    assert _count(engine, m.JOBS) == 1
    # Keys are per user: bob's key-1 is his own.
    db.write(lambda session: store.insert(session, [dataclasses.replace(first, user="bob")], NOW))
    assert _count(engine, m.JOBS) == 2


def test_a_gpu_registered_to_another_server_is_gpu_taken_and_writes_nothing(engine: sa.Engine) -> None:
    clock = SystemClock()
    store, db = AgentStore(StateChanges(clock), DesiredStates(epoch=lambda: 1), clock), _db(engine)

    def register(hostname: str, uuid: str) -> set[str]:
        reg = ServerRegistration(hostname=hostname, pool=Pool.TRAINING, agent_address="", agent_version="test",
                                 gpus=(GpuReport(index=0, uuid=uuid, model="Fake-GPU", memory_total_bytes=1 << 30),))
        return db.write(lambda session: store.register(session, reg, NOW))

    register("node-a", "GPU-1")
    with pytest.raises(GpuTaken):
        register("node-b", "GPU-1")
    assert _count(engine, m.SERVERS) == 1 and _count(engine, m.GPUS) == 1
    register("node-b", "GPU-2")
    assert _count(engine, m.GPUS) == 2


@pytest.mark.postgres
def test_a_registration_that_loses_the_insert_race_updates_the_winners_row(postgres_url: str) -> None:
    # Two agents register the same new hostname at once. The first's INSERT is in flight (uncommitted) when the
    # second's arrives: on PostgreSQL the second INSERT waits for the first transaction, then breaks the primary
    # key. The store turns that into an update of the row the first committed: both registrations succeed.
    engine = create_engine_for(postgres_url)
    clock = SystemClock()
    store, db = AgentStore(StateChanges(clock), DesiredStates(epoch=lambda: 1), clock), _db(engine)
    reg = ServerRegistration(hostname="node-a", pool=Pool.TRAINING, agent_address="", agent_version="test",
                             gpus=(GpuReport(index=0, uuid="GPU-1", model="Fake-GPU", memory_total_bytes=1 << 30),))
    first = session_factory(engine)()
    first.begin()
    store.register(first, reg, NOW)
    first.flush()
    outcome: list[object] = []
    second = threading.Thread(target=lambda: outcome.append(_attempt(lambda: db.write(
        lambda session: store.register(session, reg, NOW + 1)))), daemon=True)
    second.start()
    try:
        wait_for(lambda: _waiting_on_a_lock(engine), timeout=30.0,
                 what="the second registration to wait for the first's INSERT")
    finally:
        first.commit()
        first.close()
    second.join(timeout=scaled_timeout(60.0))
    assert outcome == [{"node-a"}]  # the update path: its desired generation bumped
    with engine.connect() as conn:
        rows = conn.execute(sa.select(m.SERVERS.c.id, m.SERVERS.c.desired_generation)).all()
        registered = conn.scalar(sa.select(sa.func.count()).select_from(m.EVENTS).where(
            m.EVENTS.c.kind == "SERVER_REGISTERED"))
    assert [tuple(r) for r in rows] == [("node-a", 2)] and registered == 1
    engine.dispose()


def _attempt(call: Any) -> object:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 -- the test asserts on whatever it raised
        return exc


def _waiting_on_a_lock(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.scalar(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")))
