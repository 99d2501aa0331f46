"""SQLite's file lock held past ``busy_timeout`` ("database is locked") is the database being busy:
the store answers ``Unavailable`` with the message that says to retry, as for PostgreSQL's lock and
statement timeouts, never an internal error. A real database file, its lock held by another
connection (as a second scheduler process or an operator's ``sqlite3`` shell would hold it)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from scheduler_service.app.failures import database_unavailable
from scheduler_service.errors import Unavailable
from scheduler_service.store.db import BUSY, create_engine_for, session_factory
from scheduler_service.store.transactions import Transactions


@pytest.fixture
def locked(tmp_path: Path) -> Iterator[tuple[Transactions, sa.Engine]]:
    path = tmp_path / "aryl.db"
    engine = create_engine_for(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _short_wait(dbapi_connection: Any, _record: Any) -> None:  # after the store's 30 s: wait 50 ms
        dbapi_connection.execute("PRAGMA busy_timeout=50")

    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held until the test ends
    try:
        yield Transactions(session_factory(engine), publish=lambda _states: None), engine
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        engine.dispose()


def test_a_write_or_read_that_waits_out_the_lock_answers_unavailable_busy(locked: tuple[Transactions, Any]) -> None:
    transactions, _ = locked
    with pytest.raises(Unavailable, match="busy") as written:
        transactions.write(lambda session: session.execute(sa.text("INSERT INTO t VALUES (1)")))
    assert str(written.value) == BUSY
    with pytest.raises(Unavailable, match="busy"):
        transactions.read(lambda session: session.execute(sa.text("SELECT count(*) FROM t")).scalar())


def test_the_backstop_classifies_the_driver_s_locked_error_as_busy(locked: tuple[Transactions, Any]) -> None:
    _, engine = locked
    with pytest.raises(sa.exc.OperationalError, match="database is locked") as raised:
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
    classified = database_unavailable(raised.value)
    assert isinstance(classified, Unavailable) and str(classified) == BUSY
