"""Event retention on SQLite and PostgreSQL: old events are pruned in chunks (by the use case and by a
running scheduler's housekeeping loop), and the append-only guard (migration 0008) still refuses every
UPDATE and any DELETE of the last day's events, on both databases; downgrading restores the old guard.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from migrations import downgrade, upgrade
from scheduler_service.app import SchedulerApp
from scheduler_service.clock import SystemClock
from scheduler_service.config import EventsConfig
from scheduler_service.server import serve_in_background
from scheduler_service.store import models as m
from scheduler_service.store.db import create_engine_for, session_factory
from tests.harness import scheduler_config
from tests.helpers import wait_for

DAY = 86400.0


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = create_engine_for(database_url)
    yield engine
    engine.dispose()


# The events columns these tests write, as every revision since 0001 has them (a test may downgrade to before
# a column was added, e.g. 0012's ``actor``; the ORM table would name it).
EVENT_COLUMNS = sa.table("events", sa.column("id", sa.Integer), sa.column("time", sa.Float),
                         sa.column("kind", sa.String), sa.column("from_state", sa.String),
                         sa.column("to_state", sa.String), sa.column("reason", sa.String),
                         sa.column("message", sa.String), sa.column("details", sa.JSON))


def add_events(engine: sa.Engine, *ages_days: float) -> list[int]:
    """One event per age (days before now), oldest first; returns their ids."""
    now = time.time()
    with engine.begin() as conn:
        return [
            conn.execute(sa.insert(EVENT_COLUMNS).values(
                time=now - age * DAY, kind="TEST", from_state="", to_state="", reason="TEST",
                message=f"{age} days old", details={},
            ).returning(EVENT_COLUMNS.c.id)).scalar_one()
            for age in ages_days
        ]


def event_ids(engine: sa.Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(m.EVENTS.c.id).order_by(m.EVENTS.c.id)).scalars())


def refused(engine: sa.Engine, statement: Any) -> bool:
    try:
        with engine.begin() as conn:
            conn.execute(statement)
    except sa.exc.DBAPIError as exc:
        assert "append-only" in str(exc)
        return True
    return False


def test_prune_deletes_only_events_older_than_the_retention_in_chunks(engine: sa.Engine) -> None:
    ids = add_events(engine, 90, 40, 31, 31, 29, 0.5, 0)
    app = SchedulerApp(session_factory(engine), SystemClock())
    # Batches of 2 over 4 old events: several transactions, all of them pruned, nothing newer.
    assert app.retention.prune(now=time.time(), retention_days=30, chunk=2) == 4
    assert event_ids(engine) == ids[4:]
    assert app.retention.prune(now=time.time(), retention_days=30, chunk=2) == 0
    assert app.retention.prune(now=time.time(), retention_days=0, chunk=2) == 0  # 0: kept forever
    assert event_ids(engine) == ids[4:]


def test_the_guard_refuses_updates_and_deletes_of_recent_events(engine: sa.Engine) -> None:
    old, recent = add_events(engine, 40, 0.5)
    e = m.EVENTS.c
    assert refused(engine, sa.delete(m.EVENTS).where(e.id == recent))
    assert refused(engine, sa.update(m.EVENTS).where(e.id == recent).values(message="rewritten"))
    assert refused(engine, sa.update(m.EVENTS).where(e.id == old).values(message="rewritten"))
    # A delete that reaches a recent event is refused as a whole.
    assert refused(engine, sa.delete(m.EVENTS))
    assert event_ids(engine) == [old, recent]
    assert not refused(engine, sa.delete(m.EVENTS).where(e.id == old))  # older than a day: retention may
    assert event_ids(engine) == [recent]


def test_downgrade_restores_the_strict_guard(database_url: str, engine: sa.Engine) -> None:
    downgrade(database_url, "0007")
    try:
        (old,) = add_events(engine, 40)
        assert refused(engine, sa.delete(m.EVENTS).where(m.EVENTS.c.id == old))
    finally:
        upgrade(database_url)
    assert not refused(engine, sa.delete(m.EVENTS).where(m.EVENTS.c.id == old))


def test_a_running_scheduler_prunes_old_events(database_url: str, engine: sa.Engine) -> None:
    ids = add_events(engine, 40, 35, 3)
    handle = serve_in_background(scheduler_config(
        database_url, events={"retention_days": 30, "prune_interval_s": 0.1, "prune_chunk": 1}))
    try:
        wait_for(lambda: ids[0] not in event_ids(engine) and ids[1] not in event_ids(engine), timeout=30,
                 what="the housekeeping loop to prune the old events")
        assert ids[2] in event_ids(engine)
    finally:
        handle.stop()


def test_retention_of_one_day_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        EventsConfig(retention_days=1)
    assert EventsConfig(retention_days=0).retention_days == 0
