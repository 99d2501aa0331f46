"""The database itself enforces the scheduler's invariants, whatever the Python above it does.

Each test runs on SQLite and on PostgreSQL (the ``database_url`` fixture) against the schema the
migrations build, using plain SQLAlchemy sessions over the models. A refused write must raise
``IntegrityError`` (or, for the event log's triggers, a ``DatabaseError``) and leave the data untouched.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.orm import Session

from scheduler_service.store.db import create_engine_for
from scheduler_service.store.models import Allocation, Event, Gpu, Job, Loan, Server
from tests.fixtures.store import NOW, make_job, make_server

# How each dialect names the violated unique key: PostgreSQL by constraint name, SQLite by columns.
ONE_WORKER_PER_GPU = (
    r"uq_allocations_one_worker_per_gpu"
    r"|UNIQUE constraint failed: allocations\.server_id, allocations\.gpu_index"
)
ONE_OPEN_LOAN_PER_SERVER = r"uq_loans_one_open_per_server|UNIQUE constraint failed: loans\.server_id"


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    # The store's own engine factory: on SQLite it is what turns foreign-key enforcement on.
    engine = create_engine_for(database_url)
    yield engine
    engine.dispose()


# --- builders -------------------------------------------------------------------------------------


def make_allocation(session: Session, job_id: int, server_id: str, gpu_index: int, rank: int = 0) -> Allocation:
    allocation = Allocation(job_id=job_id, rank=rank, server_id=server_id, gpu_index=gpu_index, allocated_at=NOW)
    session.add(allocation)
    session.flush()
    return allocation


def make_loan(session: Session, server_id: str, state: str = "ACTIVE") -> Loan:
    loan = Loan(
        server_id=server_id,
        state=state,
        started_at=NOW,
        ended_at=NOW + 60 if state == "RETURNED" else None,
    )
    session.add(loan)
    session.flush()
    return loan


def make_event(session: Session, **overrides: Any) -> Event:
    fields: dict[str, Any] = dict(time=NOW, kind="JOB_STATE", job_id=1, from_state="PENDING", to_state="RUNNING")
    fields.update(overrides)
    event = Event(**fields)
    session.add(event)
    session.flush()
    return event


def count(engine: sa.Engine, model: type) -> int:
    with Session(engine) as session:
        rows = session.scalar(sa.select(sa.func.count()).select_from(model))
        assert rows is not None  # count(*) always answers one row
        return rows


# --- one GPU, one worker --------------------------------------------------------------------------


def test_one_gpu_cannot_be_allocated_to_two_workers_of_different_jobs(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "s1", gpus=2)
        first, second = make_job(session).id, make_job(session).id
        make_allocation(session, first, "s1", 0)

    with Session(engine) as session, session.begin():
        make_allocation(session, second, "s1", 1)  # a different GPU on the same server is fine

    with pytest.raises(sa.exc.IntegrityError, match=ONE_WORKER_PER_GPU):
        with Session(engine) as session, session.begin():
            make_allocation(session, second, "s1", 0, rank=1)

    assert count(engine, Allocation) == 2


def test_one_gpu_cannot_be_allocated_twice_to_the_same_job(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "s1", gpus=1)
        job_id = make_job(session).id
        make_allocation(session, job_id, "s1", 0, rank=0)

    with pytest.raises(sa.exc.IntegrityError, match=ONE_WORKER_PER_GPU):
        with Session(engine) as session, session.begin():
            make_allocation(session, job_id, "s1", 0, rank=1)


def test_the_same_gpu_index_on_different_servers_are_different_gpus(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "s1", gpus=1)
        make_server(session, "s2", gpus=1)
        job_id = make_job(session).id
        make_allocation(session, job_id, "s1", 0, rank=0)
        make_allocation(session, job_id, "s2", 0, rank=1)

    assert count(engine, Allocation) == 2


@pytest.mark.parametrize(("server_id", "gpu_index"), [("s1", 4), ("nowhere", 0)])
def test_an_allocation_of_a_gpu_that_does_not_exist_is_refused(
    engine: sa.Engine, server_id: str, gpu_index: int
) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "s1", gpus=4)
        job_id = make_job(session).id

    with pytest.raises(sa.exc.IntegrityError, match=r"(?i)foreign key"):
        with Session(engine) as session, session.begin():
            make_allocation(session, job_id, server_id, gpu_index)

    assert count(engine, Allocation) == 0


def test_an_allocation_for_a_job_that_does_not_exist_is_refused(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "s1", gpus=1)

    with pytest.raises(sa.exc.IntegrityError, match=r"(?i)foreign key"):
        with Session(engine) as session, session.begin():
            make_allocation(session, 12345, "s1", 0)


# Two servers with two GPUs each; index 2 exists on neither, so some attempts must be refused by the FK.
SERVER_GPUS = {"s1": 2, "s2": 2}
allocate = st.tuples(
    st.just("allocate"),
    st.integers(0, 2),  # which of three jobs
    st.integers(0, 3),  # rank
    st.sampled_from(sorted(SERVER_GPUS)),
    st.integers(0, 2),  # gpu index
)
release = st.tuples(st.just("release"), st.sampled_from(sorted(SERVER_GPUS)), st.integers(0, 2))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.one_of(allocate, allocate, release), max_size=25))
def test_random_allocation_attempts_never_double_book_a_gpu(engine: sa.Engine, steps: list[tuple]) -> None:
    # The fixture's database is shared by all examples of this test, so each example starts from scratch.
    with Session(engine) as session, session.begin():
        for model in (Allocation, Job, Gpu, Server):
            session.execute(sa.delete(model))
    with Session(engine) as session, session.begin():
        for server_id, gpus in SERVER_GPUS.items():
            make_server(session, server_id, gpus=gpus)
        job_ids = [make_job(session).id for _ in range(3)]

    # The model of what the database must hold: which (server, gpu) is taken, by which (job, rank).
    held: dict[tuple[str, int], tuple[int, int]] = {}
    for step in steps:
        if step[0] == "release":
            _, server_id, gpu_index = step
            with Session(engine) as session, session.begin():
                session.execute(
                    sa.delete(Allocation).where(
                        Allocation.server_id == server_id, Allocation.gpu_index == gpu_index
                    )
                )
            held.pop((server_id, gpu_index), None)
            continue

        _, job, rank, server_id, gpu_index = step
        gpu = (server_id, gpu_index)
        gpu_is_free = gpu_index < SERVER_GPUS[server_id] and gpu not in held
        try:
            with Session(engine) as session, session.begin():
                make_allocation(session, job_ids[job], server_id, gpu_index, rank=rank)
            accepted = True
        except sa.exc.IntegrityError:
            accepted = False
        assert accepted == gpu_is_free, f"allocating {gpu} when held={held}: accepted={accepted}"
        if accepted:
            held[gpu] = (job_ids[job], rank)

    with Session(engine) as session:
        rows = session.execute(sa.select(Allocation))
        stored = [((a.server_id, a.gpu_index), (a.job_id, a.rank)) for a in rows.scalars()]
    stored_gpus = [gpu for gpu, _ in stored]
    assert len(stored_gpus) == len(set(stored_gpus)), f"a GPU is held twice: {sorted(stored_gpus)}"
    assert dict(stored) == held


# --- jobs -----------------------------------------------------------------------------------------


def test_a_well_formed_job_is_accepted(engine: sa.Engine) -> None:
    # The control for the refusals below: the builder's defaults satisfy every constraint.
    with Session(engine) as session, session.begin():
        make_job(session)

    assert count(engine, Job) == 1


@pytest.mark.parametrize(
    ("overrides", "constraint"),
    [
        ({"min_workers": 0}, "ck_jobs_min_workers_positive"),
        ({"min_workers": 3, "max_workers": 2}, "ck_jobs_max_not_below_min"),
        ({"gpus_per_worker": 0}, "ck_jobs_gpus_per_worker_positive"),
        ({"state": "SLEEPING"}, "ck_jobs_state_known"),
        ({"num_workers": 3, "max_workers": 2}, "ck_jobs_num_workers_in_range"),
    ],
    ids=["min_workers_0", "max_below_min", "gpus_per_worker_0", "unknown_state", "too_many_workers"],
)
def test_a_malformed_job_is_refused(engine: sa.Engine, overrides: dict[str, Any], constraint: str) -> None:
    with pytest.raises(sa.exc.IntegrityError, match=constraint):
        with Session(engine) as session, session.begin():
            make_job(session, **overrides)

    assert count(engine, Job) == 0


def test_idempotency_key_is_unique(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_job(session, idempotency_key="submit-42")
        # Jobs submitted without a key never collide with each other.
        make_job(session, idempotency_key=None)
        make_job(session, idempotency_key=None)

    with pytest.raises(sa.exc.IntegrityError, match="idempotency_key"):
        with Session(engine) as session, session.begin():
            make_job(session, name="retry", idempotency_key="submit-42")

    assert count(engine, Job) == 3


# --- servers and loans ----------------------------------------------------------------------------


def test_an_inference_server_may_be_loaned(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "inf1", pool="INFERENCE", state="LOANED")

    assert count(engine, Server) == 1


@pytest.mark.parametrize("state", ["LOANED", "SERVING"])
def test_a_training_server_in_an_inference_state_is_refused(engine: sa.Engine, state: str) -> None:
    with pytest.raises(sa.exc.IntegrityError, match="ck_servers_state_matches_pool"):
        with Session(engine) as session, session.begin():
            make_server(session, "train1", pool="TRAINING", state=state)

    assert count(engine, Server) == 0


def test_a_server_has_at_most_one_open_loan(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "inf1", pool="INFERENCE")
        make_server(session, "inf2", pool="INFERENCE")
        make_loan(session, "inf1", state="ACTIVE")
        make_loan(session, "inf2", state="ACTIVE")  # another server's open loan is no conflict

    for second in ("ACTIVE", "RECLAIMING"):
        with pytest.raises(sa.exc.IntegrityError, match=ONE_OPEN_LOAN_PER_SERVER):
            with Session(engine) as session, session.begin():
                make_loan(session, "inf1", state=second)

    assert count(engine, Loan) == 2


def test_returned_loans_do_not_count_as_open(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "inf1", pool="INFERENCE")
        make_loan(session, "inf1", state="RETURNED")
        make_loan(session, "inf1", state="RETURNED")
        make_loan(session, "inf1", state="RECLAIMING")

    assert count(engine, Loan) == 3


# --- the event log --------------------------------------------------------------------------------


# A refused write to the event log comes from a trigger: SQLite's RAISE(ABORT) surfaces as
# IntegrityError, PostgreSQL's RAISE EXCEPTION as InternalError; both are DatabaseErrors.
APPEND_ONLY_ERROR = {"sqlite": sa.exc.IntegrityError, "postgresql": sa.exc.InternalError}


def event_row(engine: sa.Engine, event_id: int) -> tuple | None:
    with engine.connect() as conn:
        return conn.execute(sa.select(Event.__table__).where(Event.id == event_id)).one_or_none()


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda id_: sa.update(Event).where(Event.id == id_).values(kind="FORGED"), id="update"),
        pytest.param(lambda id_: sa.delete(Event).where(Event.id == id_), id="delete"),
    ],
)
def test_events_are_append_only(engine: sa.Engine, write) -> None:
    # A recent event: only events older than the retention floor (a day, migration 0008) may be pruned.
    with Session(engine) as session, session.begin():
        event_id = make_event(session, time=time.time(), details={"gpus": [0, 1]}).id
    before = event_row(engine, event_id)

    with pytest.raises(APPEND_ONLY_ERROR[engine.dialect.name], match="events is append-only"):
        with Session(engine) as session, session.begin():
            session.execute(write(event_id))

    assert event_row(engine, event_id) == before

    # Appending is still allowed after a refused rewrite.
    with Session(engine) as session, session.begin():
        make_event(session, kind="JOB_SCALED")
    assert count(engine, Event) == 2


@pytest.mark.postgres
def test_a_concurrent_change_to_a_versioned_row_is_detected_even_in_a_batched_flush(postgres_url: str) -> None:
    """Optimistic concurrency holds with the engine's batched executemany (PostgreSQL only; SQLite
    serialises writers anyway): a flush that updates several versioned rows still finds the one
    another transaction changed meanwhile."""
    from sqlalchemy.orm.exc import StaleDataError

    engine = create_engine_for(postgres_url)
    try:
        with Session(engine) as session, session.begin():
            ids = [make_job(session, name=f"job-{i}").id for i in range(3)]
        with Session(engine) as first, Session(engine) as second:
            mine = first.scalars(sa.select(Job).where(Job.id.in_(ids)).order_by(Job.id)).all()
            with second.begin():
                second_job = second.get(Job, ids[1])
                assert second_job is not None
                second_job.priority = 7  # commits: version 1 -> 2
            for job in mine:
                job.priority = 3
            with pytest.raises(StaleDataError):
                first.commit()
    finally:
        engine.dispose()
