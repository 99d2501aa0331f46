"""Engine and session factory for PostgreSQL (production) and SQLite (embedded default).

SQLite is made to behave like a real transactional store: foreign keys on, WAL journal, a busy
timeout, and ``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing half-way (and so
SAVEPOINTs work with the pysqlite driver). PostgreSQL gets a per-statement timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker


def create_engine_for(url: str, *, statement_timeout_ms: int = 5000, pool_size: int = 20) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _make_sqlite_transactional(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return create_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            # No pre-ping (a round trip per checkout); recycle instead, and a dead connection's error
            # surfaces as one failed request that the client may retry.
            pool_recycle=1800,
            # psycopg2's own executemany is a loop of round trips; batch UPDATEs too (every status
            # report updates a server's GPUs in one executemany). The ORM still checks versioned
            # rows one by one, as this mode cannot count rows per statement.
            executemany_mode="values_plus_batch",
            connect_args={"options": f"-c statement_timeout={statement_timeout_ms}", "connect_timeout": 5},
        )
    raise ValueError(f"unsupported database {parsed.get_backend_name()!r}: use postgresql or sqlite")


def _make_sqlite_transactional(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from pysqlite (its implicit BEGIN breaks SAVEPOINT).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # Rows stay readable after commit: the API layer converts them to protobuf outside the session.
    return sessionmaker(engine, expire_on_commit=False)
