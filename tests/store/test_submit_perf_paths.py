"""The submit paths' two ways to write jobs (``store.jobs``): PostgreSQL's COPY path stores exactly the
rows the multi-row INSERT path stores (every column of the jobs and of their JOB_SUBMITTED events, the
answer it returns, job arrays), with values COPY's text format must escape; and a used idempotency key
fails it as an IntegrityError that leaves nothing stored, as the INSERT path's does. And the cycle's
snapshot, which decodes the jobs' JSON columns once per distinct text, still gives each job its own. And
the cycle's pending reasons, written on PostgreSQL in one statement, are what the bulk path writes."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from migrations import upgrade
from protos.aryl.v1 import types_pb2
from scheduler_service.api import job_validation
from scheduler_service.clock import SystemClock
from scheduler_service.core.plan import KeepPending, Reason
from scheduler_service.records import JobInfo, JobSubmission
from scheduler_service.store import jobs as store_jobs
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import create_engine_for
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.jobs import JobStore
from scheduler_service.store.pending_reasons import pending_reasons_in_bulk, pending_reasons_in_one_statement
from scheduler_service.store.rows import job_info
from scheduler_service.store.snapshot import SnapshotReader

pytestmark = pytest.mark.postgres

NOW = 1_790_000_000.125


@pytest.fixture
def engine(postgres_url: str) -> Iterator[sa.Engine]:
    engine = create_engine_for(postgres_url)
    yield engine
    engine.dispose()


def _submissions() -> list[JobSubmission]:
    plain = job_validation.job_submission(types_pb2.JobSpec(
        name="plain", user="alice", command=["python", "train.py"], gpus_per_worker=1, min_workers=1,
    ), "", now=NOW)
    full = job_validation.job_submission(types_pb2.JobSpec(
        name="ünïcode-job", user="bob", queue="", command=["sh", "-c", r"echo 'a\b' \"c\" %s {}"],
        env={"PATH_LIKE": r"C:\dir\N", "QUOTE": "it's \"quoted\"", "EMPTY": ""},
        gpus_per_worker=2, min_workers=1, max_workers=4, priority=7, max_restarts=3,
        working_dir="/data/runs", working_dir_if_exists=True,
    ), "key-1", now=NOW)
    # What COPY's text format must escape (the store writes what it is given; validation refuses
    # controls in commands before this point): tab, newline, carriage return, backslash, \N itself.
    escaped = dataclasses.replace(full, name="esc", idempotency_key="key-2", max_runtime_s=3600.5,
                                  env={"T": "a\tb", "NL": "a\nb\r", "BS": "\\", "NULL_LIKE": "\\N"},
                                  throughput={"points": [[1, 1.5], [2, 2.75]], "total_work": 1e6},
                                  deadline=NOW + 0.1, gpu_types=("h100", "a100"), priority_class="high",
                                  priority_value=100, submitted_by="user:bob")
    return [plain, full, escaped]


def _stored(session: Session, first: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every stored job and event, ids made relative to the first job (so two runs compare)."""
    jobs = [dict(r._mapping) for r in session.execute(sa.select(m.JOBS).order_by(m.JOBS.c.id))]
    events = [dict(r._mapping) for r in session.execute(sa.select(m.EVENTS).order_by(m.EVENTS.c.id))]
    for job in jobs:
        job["id"] -= first
        if job["array_job_id"] is not None:
            job["array_job_id"] -= first
    for event in events:
        event.pop("id")
        event["job_id"] -= first
    return jobs, events


def _write(engine: sa.Engine, write: Any, *, array: bool) -> tuple[list[JobInfo], list[dict[str, Any]],
                                                                   list[dict[str, Any]], list[JobInfo]]:
    """Write the submissions with ``write`` in a transaction, read everything back, roll back."""
    subs = _submissions()
    with Session(engine) as session:
        answer = write(session, subs, [store_jobs._job_row(sub, NOW) for sub in subs], array=array)
        first = answer[0].id
        read_back = [job_info(r._mapping) for r in session.execute(sa.select(m.JOBS).order_by(m.JOBS.c.id))]
        jobs, events = _stored(session, first)
        session.rollback()
    relative = [dataclasses.replace(a, id=a.id - first, array_job_id=None if a.array_job_id is None
                                    else a.array_job_id - first) for a in answer]
    return relative, jobs, events, read_back


@pytest.mark.parametrize("array", [False, True])
def test_copy_stores_what_the_insert_path_stores(engine: sa.Engine, array: bool) -> None:
    copied, copied_jobs, copied_events, copied_read = _write(engine, store_jobs._copy_in, array=array)
    inserted, inserted_jobs, inserted_events, _ = _write(engine, store_jobs._insert_values, array=array)
    assert copied_jobs == inserted_jobs
    assert copied_events == inserted_events
    assert copied == inserted  # the answers too
    # Built without JobInfo's __init__ (``rows._frozen``): every field is set all the same.
    assert all(vars(a).keys() == {f.name for f in dataclasses.fields(JobInfo)} for a in copied + copied_read)
    assert len(copied_jobs) == 3 and len(copied_events) == 3
    assert copied_jobs[2]["env"] == {"T": "a\tb", "NL": "a\nb\r", "BS": "\\", "NULL_LIKE": "\\N"}
    assert copied_jobs[0]["gpu_types"] is None and copied_jobs[2]["gpu_types"] == ["h100", "a100"]
    assert copied_events[1]["message"] == "ünïcode-job by bob in queue default: 1..4 worker(s) x 2 GPU(s)"
    assert copied_events[2]["actor"] == "user:bob"
    assert [j["array_job_id"] for j in copied_jobs] == ([0, 0, 0] if array else [None] * 3)
    # What the COPY path answers is what a read of the stored rows gives.
    assert [dataclasses.replace(a, id=0, array_job_id=None) for a in copied] == [
        dataclasses.replace(r, id=0, array_job_id=None) for r in copied_read]


def test_a_used_key_fails_the_copy_as_an_integrity_error_and_stores_nothing(engine: sa.Engine) -> None:
    store = JobStore(StateChanges(SystemClock()), DesiredStates(epoch=lambda: 1), SystemClock())
    subs = _submissions()
    with Session(engine) as session, session.begin():
        [held] = store.insert(session, [subs[1]], NOW)
    with pytest.raises(IntegrityError, match="uq_jobs_user_idempotency_key"), Session(engine) as session, \
            session.begin():
        store.insert(session, subs, NOW)
    with Session(engine) as session:
        assert list(session.scalars(sa.select(m.JOBS.c.id))) == [held.id]
        assert session.scalar(sa.select(sa.func.count()).select_from(m.EVENTS)) == 1


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_snapshot_decodes_each_jobs_json_columns(database: str, tmp_path: Any, request: Any) -> None:
    """The snapshot reads throughput and GPU types as JSON text, decoding each distinct text once; every
    job still gets its own values (none, declared points, GPU types), on both databases."""
    if database == "sqlite":
        url = f"sqlite:///{tmp_path / 'aryl.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("postgres_url")
    engine = create_engine_for(url)
    store = JobStore(StateChanges(SystemClock()), DesiredStates(epoch=lambda: 1), SystemClock())
    plain, _, escaped = _submissions()
    again = dataclasses.replace(escaped, idempotency_key="key-3")
    timed = dataclasses.replace(plain, throughput={"estimated_runtime_s": 120.0})
    try:
        with Session(engine) as session, session.begin():
            store.insert(session, [plain, escaped, plain, timed, again], NOW)
        with Session(engine) as session:
            jobs = SnapshotReader(SystemClock()).read(session).jobs
    finally:
        engine.dispose()
    assert [(j.throughput_points, j.total_work, j.estimated_runtime_s, j.gpu_types) for j in jobs] == [
        ((), 0.0, None, ()),
        (((1, 1.5), (2, 2.75)), 1e6, None, ("h100", "a100")),
        ((), 0.0, None, ()),
        ((), 0.0, 120.0, ()),
        (((1, 1.5), (2, 2.75)), 1e6, None, ("h100", "a100")),
    ]


@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_snapshot_reuses_a_job_view_only_while_its_row_is_unchanged(database: str, tmp_path: Any,
                                                                       request: Any) -> None:
    if database == "sqlite":
        url = f"sqlite:///{tmp_path / 'aryl.db'}"
        upgrade(url)
    else:
        url = request.getfixturevalue("postgres_url")
    engine = create_engine_for(url)
    store = JobStore(StateChanges(SystemClock()), DesiredStates(epoch=lambda: 1), SystemClock())
    reader = SnapshotReader(SystemClock())
    plain, _, escaped = _submissions()
    try:
        with Session(engine) as session, session.begin():
            first, second = store.insert(session, [plain, escaped], NOW)
        with Session(engine) as session:
            before = reader.read(session).jobs
        with Session(engine) as session, session.begin():
            session.execute(sa.update(m.JOBS).where(m.JOBS.c.id == second.id)
                            .values(priority=9, pending_reason="waiting for 2 GPUs"))
        with Session(engine) as session:
            after = reader.read(session).jobs
        with Session(engine) as session, session.begin():
            session.execute(sa.update(m.JOBS).where(m.JOBS.c.id == first.id).values(state="CANCELLED", finished_at=NOW))
        with Session(engine) as session:
            last = reader.read(session).jobs
    finally:
        engine.dispose()
    assert after[0] is before[0]  # unchanged: the same view
    assert (after[1].priority, after[1].pending_reason) == (9, "waiting for 2 GPUs")
    assert (before[1].priority, before[1].pending_reason) == (7, "")
    assert [j.job_id for j in last] == [second.id] and last[0] is after[1]


@pytest.mark.parametrize("write", [pending_reasons_in_bulk, pending_reasons_in_one_statement])
def test_pending_reasons_in_one_statement_store_what_the_bulk_path_stores(engine: sa.Engine, write: Any) -> None:
    """Each path, from the same jobs, in its own rolled-back transaction: a job that left PENDING since the
    plan is not written; the others get their reason (a long message cut, quotes and newlines kept) and
    a JOB_PENDING_REASON event each, in the plan's order, not the ids'."""
    def stored(write: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        store = JobStore(StateChanges(SystemClock()), DesiredStates(epoch=lambda: 1), SystemClock())
        with Session(engine) as session:
            jobs = store.insert(session, _submissions(), NOW)
            a, b, c = (j.id for j in jobs)
            session.execute(sa.update(m.JOBS).where(m.JOBS.c.id == b).values(state="RUNNING"))
            write(session, [
                KeepPending(c, Reason.WAITING_FOR_GANG, "it's \"quoted\"\nand ünïcode " + "x" * 3000),
                KeepPending(b, Reason.WAITING_FOR_GANG, "started meanwhile"),
                KeepPending(a, Reason.NO_TRAINING_CAPACITY, "no server is registered"),
            ], NOW + 5)
            rows, events = _stored(session, a)
            session.rollback()
        return rows, [e for e in events if e["kind"] == "JOB_PENDING_REASON"]

    rows, events = stored(write)
    assert (rows, events) == stored(pending_reasons_in_bulk)
    assert [(r["pending_reason"][:40], r["version"]) for r in rows] == [
        ("NO_TRAINING_CAPACITY: no server is regis", 2), ("", 1), ("WAITING_FOR_GANG: it's \"quoted\"\nand ünïc", 2)]
    assert len(rows[2]["pending_reason"]) == 1024
    assert [(e["job_id"], e["reason"], len(e["message"]), e["time"], e["details"], e["actor"]) for e in events] == [
        (2, "WAITING_FOR_GANG", 2048, NOW + 5, {}, ""), (0, "NO_TRAINING_CAPACITY", 23, NOW + 5, {}, "")]
