"""The leader lease in the store (PostgreSQL only): the one ``leader_lease`` row says which scheduler
leads, in which term (epoch), until when -- every time by the *database's* clock
(``clock_timestamp()``), so no scheduler's clock, paused process or clock jump can stretch a lease.

- ``look``: the lease as it stands (no lock), for a standby deciding whether to try.
- ``take``: become the holder, in a new term, if the lease lapsed or already names this scheduler
  (whose earlier process, then, is gone: see ``app.lease``). Locks the row ``FOR UPDATE``, which waits
  for every write transaction between its fence check and its commit (they hold ``FOR KEY SHARE``),
  and makes every later fence check see the new holder.
- ``renew``: push the expiry on, only while the lease is still this holder's and not lapsed.
- ``release``: let it lapse now (a clean shutdown), so a standby need not wait out the lease.
- ``holds``: the fence, run inside a write transaction just before its commit.
- ``end_sessions_of``: end the database sessions of a holder whose lease lapsed (``tag_connections``
  names each scheduler's connections), so that a transaction of a paused or cut-off leader neither
  holds back the takeover nor keeps its row locks until the database's idle timeout ends it.

Never: commit, or decide when to take or renew (``app.lease`` does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.term import start_term

log = structlog.get_logger("aryl.scheduler")

# application_name of a scheduler's connections: this prefix, its lease name, its process id.
APPLICATION_PREFIX = "aryl-scheduler "
# The database's clock, now (not the transaction's start, ``now()``, which a long transaction makes old).
DB_NOW = "extract(epoch FROM clock_timestamp())"


@dataclass(frozen=True)
class LeaseView:
    """``holder``: the leader's advertised address ('' before the first term); ``remaining_s``: until
    its lease lapses by the database's clock (<= 0: lapsed, anyone may take it)."""

    holder: str
    epoch: int
    remaining_s: float

    @property
    def lapsed(self) -> bool:
        return self.remaining_s <= 0


def look(session: Session) -> LeaseView:
    """The lease now; lapsed when its row is missing (``take`` puts it back: the migration made it,
    but a wiped table must not keep every scheduler a standby)."""
    row = session.execute(sa.text(
        f"SELECT holder, epoch, expires_at - {DB_NOW} FROM leader_lease WHERE id = 1"
    )).one_or_none()
    if row is None:
        return LeaseView("", 0, -1.0)
    return LeaseView(row[0], int(row[1]), float(row[2]))


def take(session: Session, changes: StateChanges, clock: Clock, *, me: str, lease_s: float) -> int | None:
    """Become the holder in a new term (its epoch, returned) if the lease lapsed or is ``me``'s already;
    None when another scheduler holds it."""
    session.execute(sa.text(
        "INSERT INTO leader_lease (id, holder, epoch, acquired_at, expires_at) VALUES (1, '', 0, 0, 0) "
        "ON CONFLICT (id) DO NOTHING"
    ))
    row = session.execute(sa.text(
        f"SELECT holder, epoch, expires_at - {DB_NOW} FROM leader_lease WHERE id = 1 FOR UPDATE"
    )).one()
    holder, previous, remaining = row[0], int(row[1]), float(row[2])
    if remaining > 0 and holder != me:
        return None
    if not holder:
        how = "the first term on this database"
    elif holder == me:
        how = f"after epoch {previous}, held by this address before (that process is gone)"
    else:
        how = f"after epoch {previous}, whose holder {holder} let its lease lapse {-remaining:.1f}s ago"
    epoch = start_term(session, changes, clock, me, how=how)
    session.execute(
        sa.text(f"UPDATE leader_lease SET holder = :me, epoch = :epoch, acquired_at = {DB_NOW}, "
                f"expires_at = {DB_NOW} + :lease_s WHERE id = 1"),
        {"me": me, "epoch": epoch, "lease_s": lease_s},
    )
    return epoch


def renew(session: Session, *, me: str, epoch: int, lease_s: float) -> bool:
    """Expire ``lease_s`` from now instead; False when the lease is no longer ``me``'s at ``epoch`` or
    has lapsed (then the term is over: a new one starts with ``take``)."""
    renewed = session.execute(
        sa.text(f"UPDATE leader_lease SET expires_at = {DB_NOW} + :lease_s "
                f"WHERE id = 1 AND holder = :me AND epoch = :epoch AND expires_at > {DB_NOW} RETURNING epoch"),
        {"me": me, "epoch": epoch, "lease_s": lease_s},
    ).one_or_none()
    return renewed is not None


def release(session: Session, *, me: str, epoch: int) -> bool:
    """Let the lease lapse now, if it is still ``me``'s at ``epoch``."""
    released = session.execute(
        sa.text(f"UPDATE leader_lease SET expires_at = {DB_NOW} "
                f"WHERE id = 1 AND holder = :me AND epoch = :epoch AND expires_at > {DB_NOW} RETURNING epoch"),
        {"me": me, "epoch": epoch},
    ).one_or_none()
    return released is not None


def holds(session: Session, *, me: str, epoch: int) -> bool:
    """The fence: whether ``me`` holds the unexpired lease at ``epoch``, checked inside the caller's
    transaction. ``FOR KEY SHARE`` keeps ``take`` (``FOR UPDATE``) from passing it until this
    transaction ends, while renewals (which change no key) and other writers go on."""
    held = session.execute(
        sa.text(f"SELECT epoch FROM leader_lease WHERE id = 1 AND holder = :me AND epoch = :epoch "
                f"AND expires_at > {DB_NOW} FOR KEY SHARE"),
        {"me": me, "epoch": epoch},
    ).one_or_none()
    return held is not None


def application_name(me: str) -> str:
    # PostgreSQL keeps 63 bytes of it; the pid tells a restarted process's sessions from its predecessor's.
    return f"{APPLICATION_PREFIX}{me} {os.getpid()}"[:63]


def tag_connections(engine: Engine, me: str) -> None:
    """Name every new connection of ``engine`` after this scheduler (``application_name``)."""
    name = application_name(me)

    @sa.event.listens_for(engine, "connect")
    def _tag(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SET application_name = %s", (name,))
        finally:
            cursor.close()
        dbapi_connection.commit()


def end_sessions_of(session: Session, holder: str, *, me: str) -> int:
    """End the database sessions of the scheduler named ``holder`` (whose lease lapsed), but not
    this process's; how many. Their transactions roll back. Without the privilege (another role's
    sessions, no pg_signal_backend) nothing is ended: the database's own timeouts end them later."""
    prefix = f"{APPLICATION_PREFIX}{holder} "[:63]
    try:
        with session.begin_nested():
            ended = session.execute(sa.text(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                "AND left(application_name, length(:prefix)) = :prefix AND application_name <> :mine"
            ), {"prefix": prefix, "mine": application_name(me)}).scalar()
    except DBAPIError as exc:
        log.warning("could not end the sessions of the previous leader", holder=holder, reason=str(exc.orig))
        return 0
    return int(ended or 0)
