"""The snapshot reader reuses the views of jobs that did not change (``store.snapshot``): on PostgreSQL
it tells them by their rows' ``xmin`` without reading them, elsewhere by comparing whole rows. Whatever
changes between cycles -- any column through Core (which bumps no version), an allocation, a job ending,
a new job -- a reused reader must see exactly what a fresh one reads.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.api import job_validation
from scheduler_service.clock import SystemClock
from scheduler_service.core.plan import KeepPending, Reason
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.store import models as m
from scheduler_service.store.db import create_engine_for
from scheduler_service.store.jobs import JobStore
from scheduler_service.store.pending_reasons import pending_reasons_in_one_statement
from scheduler_service.store.snapshot import SnapshotReader
from tests.fixtures.store import NOW, make_server
from tests.harness import job_spec


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine_for(database_url)
    yield engine
    engine.dispose()


def read(engine: sa.Engine, reader: SnapshotReader) -> ClusterSnapshot:
    with Session(engine) as session, session.begin():
        if engine.dialect.name == "postgresql":  # as ``Transactions.read``: one consistent view
            session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
        return reader.read(session)


def add_jobs(engine: sa.Engine, count: int, tag: str) -> None:
    subs = [job_validation.job_submission(job_spec(f"{tag}-{i}", workers=1, max_workers=2), "", now=NOW)
            for i in range(count)]
    with Session(engine) as session, session.begin():
        # Inserting uses neither the state changes nor the desired states: None stands for both.
        JobStore(None, None, SystemClock()).insert(session, subs, NOW)  # type: ignore[arg-type]


def test_a_reused_reader_sees_every_change_a_fresh_one_sees(engine: sa.Engine) -> None:
    with Session(engine) as session, session.begin():
        make_server(session, "s1", gpus=8)
    add_jobs(engine, 60, "a")
    reader = SnapshotReader(SystemClock())
    first = read(engine, reader)
    assert len(first.jobs) == 60
    again = read(engine, reader)
    assert all(x is y for x, y in zip(first.jobs, again.jobs, strict=True))  # nothing changed: all reused

    rng = random.Random(7)
    j = m.JOBS.c
    for round_ in range(6):
        with engine.begin() as conn:
            ids = [row.id for row in conn.execute(sa.select(j.id).where(j.state == "PENDING").order_by(j.id))]
            picked = rng.sample(ids, 6)
            # Core updates of columns the views are built from (none bumps ``version``).
            conn.execute(sa.update(m.JOBS).where(j.id == picked[0]).values(pending_reason=f"round {round_}"))
            conn.execute(sa.update(m.JOBS).where(j.id == picked[1]).values(work_done=float(round_ + 1)))
            conn.execute(sa.update(m.JOBS).where(j.id == picked[2]).values(state="COMPLETED", finished_at=NOW))
            conn.execute(sa.update(m.JOBS).where(j.id == picked[3]).values(priority=round_ + 10))
            # The same value written again: a new row version, and still the same view.
            conn.execute(sa.update(m.JOBS).where(j.id == picked[4]).values(priority=0))
            # A job placed: its state and one allocation; the round after, taken off again.
            conn.execute(sa.delete(m.ALLOCATIONS))
            conn.execute(sa.update(m.JOBS).where(j.state == "RUNNING").values(state="PREEMPTED", num_workers=0))
            conn.execute(sa.update(m.JOBS).where(j.id == picked[5]).values(state="RUNNING", num_workers=1))
            conn.execute(sa.insert(m.ALLOCATIONS).values(job_id=picked[5], server_id="s1", gpu_index=round_,
                                                         rank=0, allocated_at=NOW))
        if round_ % 2:
            add_jobs(engine, 5, f"r{round_}")
        cached, fresh = read(engine, reader), read(engine, SnapshotReader(SystemClock()))
        assert cached.jobs == fresh.jobs, f"round {round_}: a reused view is stale"
        assert cached.servers == fresh.servers
        by_id = {view.job_id: view for view in cached.jobs}
        assert picked[2] not in by_id  # ended: gone from the snapshot
        assert by_id[picked[0]].pending_reason == f"round {round_}"
        assert by_id[picked[5]].workers and by_id[picked[5]].workers[0].gpu_indices == (round_,)


@pytest.mark.postgres
def test_a_cycles_own_pending_reasons_are_not_read_back(postgres_url: str) -> None:
    """The cycle writes each new job's first pending reason; the reader keeps those views with the reason
    (``reasons_written``) instead of reading the rows again, but only for rows still at the version it
    read: a job changed meanwhile gets no reason this cycle (the next decides on the change) and is read."""
    engine = create_engine_for(postgres_url)
    try:
        add_jobs(engine, 20, "p")
        reader = SnapshotReader(SystemClock())
        first = read(engine, reader)
        ids = [view.job_id for view in first.jobs]
        changed = ids[3:5]
        with engine.begin() as conn:  # after the read, before the apply: another writer
            conn.execute(sa.update(m.JOBS).where(m.JOBS.c.id.in_(changed)).values(priority=5))
        pending = [KeepPending(job_id, Reason.NO_TRAINING_CAPACITY, f"no server ({job_id})") for job_id in ids]
        with Session(engine) as session, session.begin():
            written = pending_reasons_in_one_statement(session, pending, NOW, reader.stamps(ids))
        assert [w[0] for w in written] == [i for i in ids if i not in changed]
        reader.reasons_written(written)
        reader.reasons_written([(ids[0], "not the version read", "1", "a reason decided elsewhere")])  # left alone

        queried: list[object] = []
        sa.event.listen(engine, "before_cursor_execute",
                        lambda conn, cursor, statement, params, context, many: queried.append(params))
        cached = read(engine, reader)
        fresh = read(engine, SnapshotReader(SystemClock()))
        assert cached.jobs == fresh.jobs
        assert [p.get("changed") for p in queried[:6] if isinstance(p, dict) and "changed" in p] == [changed]
        by_id = {view.job_id: view for view in cached.jobs}
        assert by_id[ids[0]].pending_reason == f"NO_TRAINING_CAPACITY: no server ({ids[0]})"
        assert [by_id[i].pending_reason for i in changed] == ["", ""]  # left to the next cycle
        assert by_id[changed[0]].priority == 5
    finally:
        engine.dispose()
