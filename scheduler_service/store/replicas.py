"""The registry of scheduler replicas in the store: which schedulers (leader and standbys) share this database,
where each one's desired-state streams' own process serves, and when each last beat -- every time by the
*database's* clock, so that no replica's clock decides whether another is alive.

- ``beat``: write this replica's row (its address, its push process's address, now), made at its first beat.
- ``listed``: every row, with the age of its last beat (``app.replicas`` judges which are live).
- ``leave``: delete this replica's row (a clean stop: it is no longer named at once).

Works on PostgreSQL and SQLite (one scheduler there: its own row only). Never: commit, decide which replica
an agent watches (``app.replicas`` does), or judge the leader (``store.lease`` does).
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.store.lease import DB_NOW
from scheduler_service.store.transactions import is_postgresql

# SQLite's clock in the same unit as ``store.lease.DB_NOW`` (seconds since the UNIX epoch), now.
_SQLITE_NOW = "((julianday('now') - 2440587.5) * 86400.0)"


def _now(session: Session) -> str:
    return DB_NOW if is_postgresql(session) else _SQLITE_NOW


@dataclass(frozen=True)
class ReplicaView:
    """``address``: the replica's advertised address (its name in the lease); ``push_address``: host:port of its
    desired-state streams' own process ('' while none serves); ``age_s``: since its last beat, by the database's
    clock; ``up_s``: since its first."""

    address: str
    push_address: str
    age_s: float
    up_s: float


def beat(session: Session, *, address: str, push_address: str) -> None:
    """This replica (``address``) is alive now, its push process at ``push_address`` ('' while none serves)."""
    now = _now(session)
    session.execute(sa.text(
        f"INSERT INTO scheduler_replicas (address, push_address, started_at, heartbeat_at) "
        f"VALUES (:address, :push, {now}, {now}) "
        f"ON CONFLICT (address) DO UPDATE SET push_address = :push, heartbeat_at = {now}"
    ), {"address": address, "push": push_address})


def listed(session: Session) -> list[ReplicaView]:
    """Every replica's row, by address."""
    now = _now(session)
    rows = session.execute(sa.text(
        f"SELECT address, push_address, {now} - heartbeat_at, {now} - started_at "
        "FROM scheduler_replicas ORDER BY address"
    )).all()
    return [ReplicaView(row[0], row[1], max(0.0, float(row[2])), max(0.0, float(row[3]))) for row in rows]


def leave(session: Session, *, address: str) -> None:
    """Delete ``address``'s row."""
    session.execute(sa.text("DELETE FROM scheduler_replicas WHERE address = :address"), {"address": address})
