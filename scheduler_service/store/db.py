"""Engine and session factory for PostgreSQL (production) and SQLite (embedded default), and how a
database failure reads to the rest of the service.

SQLite is made to behave like a real transactional store: foreign keys on, WAL journal, a busy
timeout, and ``BEGIN IMMEDIATE`` so concurrent writers queue instead of failing half-way (and so
SAVEPOINTs work with the pysqlite driver). PostgreSQL gets a per-statement timeout and a lock
timeout. Every transaction, on both, is bounded in time (``transaction_timeout_ms``): a statement
issued past the bound is refused (``TransactionTimedOut``) and the transaction rolls back, so no unit
of work holds its locks for long however much it has to write; PostgreSQL also ends a session left
idle inside a transaction that long (a stalled thread's locks).

``connection_lost`` and ``database_busy`` sort SQLAlchemy's errors into what a client can act on
(UNAVAILABLE: retry) and the rest (a bug: INTERNAL); ``refusal`` turns a broken unique key the domain
names into its domain error (``KeyTaken``, ``GpuTaken``), so no use case sees SQLAlchemy's.

Never: decide whether a unit of work may run again (``store.transactions`` does).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, Table, UniqueConstraint, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.schema import ColumnCollectionConstraint

from scheduler_service.errors import GpuTaken, KeyTaken, Unavailable
from scheduler_service.store import models as m

UNREACHABLE = "the scheduler's database is unreachable; retry"
BUSY = "the scheduler's database is busy (a lock or statement timed out); retry"
# Connection.info key: when the connection's current transaction began (time.monotonic()).
_BEGAN_AT = "aryl.transaction_began_at"
# PostgreSQL SQLSTATEs of a connection the server ended: admin_shutdown (pg_terminate_backend),
# crash_shutdown, cannot_connect_now; class 08 is "connection exception".
_CONNECTION_ENDED = frozenset({"57P01", "57P02", "57P03"})
# query_canceled (statement_timeout) and lock_not_available (lock_timeout).
_TIMED_OUT = frozenset({"57014", "55P03"})
# SQLite's SQLITE_BUSY and SQLITE_LOCKED primary result codes.
_SQLITE_BUSY = frozenset({5, 6})
_NO_SQLSTATE = object()  # sqlite3's errors have no pgcode attribute at all
_UNIQUE_VIOLATION = "23505"  # PostgreSQL's unique_violation


class TransactionTimedOut(Unavailable):
    """A transaction ran past ``transaction_timeout_ms``; it was rolled back, nothing of it saved."""


def create_engine_for(
    url: str, *, statement_timeout_ms: int = 5000, lock_timeout_ms: int = 5000, transaction_timeout_ms: int = 30000,
    pool_size: int = 20,
) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        _bound_transactions(engine, transaction_timeout_ms)
        _make_sqlite_transactional(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        options = (
            f"-c statement_timeout={statement_timeout_ms} -c lock_timeout={lock_timeout_ms}"
            f" -c idle_in_transaction_session_timeout={transaction_timeout_ms}"
        )
        engine = create_engine(
            url,
            pool_size=pool_size,
            max_overflow=pool_size,
            # No pre-ping (a round trip per checkout); recycle instead. A connection found dead
            # invalidates the pool's older ones, and ``Transactions`` runs the unit of work once
            # more on a fresh connection where that is safe.
            pool_recycle=1800,
            # psycopg2's own executemany is a loop of round trips; batch UPDATEs too (every status
            # report updates a server's GPUs in one executemany). The ORM still checks versioned
            # rows one by one, as this mode cannot count rows per statement.
            executemany_mode="values_plus_batch",
            connect_args={"options": options, "connect_timeout": 5},
        )
        _bound_transactions(engine, transaction_timeout_ms)
        return engine
    raise ValueError(f"unsupported database {parsed.get_backend_name()!r}: use postgresql or sqlite")


def _bound_transactions(engine: Engine, transaction_timeout_ms: int) -> None:
    """Refuse any statement of a transaction older than ``transaction_timeout_ms``. (A per-statement
    timeout bounds one statement, not a unit of work issuing 100,000s of quick ones; PostgreSQL 15
    has no transaction timeout of its own.) Checked in memory, no round trip."""
    limit_s = transaction_timeout_ms / 1000

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.info[_BEGAN_AT] = time.monotonic()

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _on_end(conn: Connection) -> None:
        if not conn.invalidated:  # an invalidated connection's info goes with its DBAPI connection
            conn.info.pop(_BEGAN_AT, None)

    @event.listens_for(engine, "before_cursor_execute")
    def _on_statement(conn: Connection, *_: Any) -> None:
        began_at = conn.info.get(_BEGAN_AT)
        if began_at is not None and time.monotonic() - began_at > limit_s:
            raise TransactionTimedOut(
                f"a database transaction ran past its {transaction_timeout_ms} ms bound and was rolled back; retry"
            )


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


def connection_lost(exc: BaseException) -> bool:
    """True when ``exc`` says the connection to the database was lost or could not be made (the
    server ended it, it went away, or it refused a new one): running the unit of work again on a
    fresh connection may succeed. False for every other database error."""
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated or isinstance(exc, InterfaceError):
        return True  # SQLAlchemy recognised a disconnect; psycopg2's "connection already closed"
    if not isinstance(exc, OperationalError):
        return False
    code = getattr(exc.orig, "pgcode", _NO_SQLSTATE)
    # libpq's own errors (refused, reset, timed out connecting) carry no SQLSTATE.
    return code is None or (isinstance(code, str) and (code.startswith("08") or code in _CONNECTION_ENDED))


def database_busy(exc: BaseException) -> bool:
    """True when PostgreSQL cancelled a statement for running or waiting on a lock too long, or SQLite
    gave up waiting for its file lock (``busy_timeout`` ran out: "database is locked")."""
    if not isinstance(exc, DBAPIError):
        return False
    if getattr(exc.orig, "pgcode", None) in _TIMED_OUT:
        return True
    code = getattr(exc.orig, "sqlite_errorcode", None)  # the extended code: its low byte is the primary one
    return isinstance(code, int) and code & 0xFF in _SQLITE_BUSY


def broke_unique_key(exc: IntegrityError, key: ColumnCollectionConstraint) -> bool:
    """True when ``exc`` is the database refusing a row because another row holds its ``key`` (a unique key or
    the primary key) already (not a foreign key, a check or another unique key): PostgreSQL names the constraint
    (``store.models``' naming convention, the migrations' names), SQLite names its columns."""
    diag = getattr(exc.orig, "diag", None)
    if diag is not None:  # psycopg2
        return getattr(exc.orig, "pgcode", None) == _UNIQUE_VIOLATION and diag.constraint_name == key.name
    table = key.table.name
    return str(exc.orig) == "UNIQUE constraint failed: " + ", ".join(f"{table}.{c.name}" for c in key.columns)


def _unique_key(table: Table, name: str) -> UniqueConstraint:
    return next(c for c in table.constraints if isinstance(c, UniqueConstraint) and c.name == name)


# The unique keys whose breach is a fact of the domain, not a bug, and the error the store raises for
# each in place of the driver's (``refusal``).
_REFUSALS: tuple[tuple[UniqueConstraint, Callable[[], Exception]], ...] = (
    # A user's idempotency keys are unique (a retry finds its own job, never another user's).
    (_unique_key(m.JOBS, "uq_jobs_user_idempotency_key"),
     lambda: KeyTaken("a submission repeats an idempotency key its user has used before")),
    # A GPU is one server's.
    (_unique_key(m.GPUS, "uq_gpus_uuid"), lambda: GpuTaken("a GPU UUID is already registered to another server")),
)


def refusal(exc: IntegrityError) -> Exception | None:
    """The domain error (``KeyTaken``, ``GpuTaken``) for an integrity error that broke one of the unique
    keys the domain names; None for any other (a bug: it surfaces as it is)."""
    return next((make() for key, make in _REFUSALS if broke_unique_key(exc, key)), None)


AUTOVACUUM_OFF = (
    "PostgreSQL's autovacuum is off on this server: the allocations, jobs and events tables fill with dead rows "
    "as jobs start, resize and end, and the scheduler's reads slow until they time out (a one-hour soak saw 150,000 "
    "dead allocation rows beside 6,600 live ones). Turn it on (autovacuum = on in postgresql.conf, or ALTER SYSTEM "
    "SET autovacuum = on; SELECT pg_reload_conf()), or VACUUM those tables on a schedule")


def autovacuum_off(engine: Engine) -> bool:
    """Whether the (PostgreSQL) server has autovacuum switched off, server-wide (``AUTOVACUUM_OFF`` says why
    that matters); False elsewhere."""
    if engine.dialect.name != "postgresql":
        return False
    with engine.connect() as conn:
        return str(conn.execute(text("SHOW autovacuum")).scalar()).lower() == "off"


def session_factory(engine: Engine) -> sessionmaker[Session]:
    # Rows stay readable after commit: the API layer converts them to protobuf outside the session.
    return sessionmaker(engine, expire_on_commit=False)
