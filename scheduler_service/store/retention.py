"""Event retention's SQL: deleting the oldest events of the log, one short chunk at a time.

Events are appended in id order with the scheduler's clock, so the oldest events are the first ids:
a chunk reads the first ``limit`` ids by primary key (never a scan of the table) and deletes those of
them older than the horizon. The append-only guard (migration 0008) lets only events older than a
day go; it refuses the whole chunk otherwise, leaving the log as it was.

Never: delete anything younger than the horizon it is given, or commit (the caller's transaction does).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.store import models as m


def delete_oldest_events(session: Session, before: float, limit: int) -> int:
    """Delete up to ``limit`` of the oldest events whose time is before ``before``; returns how many."""
    e = m.EVENTS.c
    oldest = session.execute(sa.select(e.id, e.time).order_by(e.id).limit(limit)).all()
    ids = []
    for row in oldest:
        if row.time >= before:
            break  # the rest of the log is newer (ids follow time, up to clock adjustments)
        ids.append(row.id)
    if not ids:
        return 0
    deleted = session.execute(
        sa.delete(m.EVENTS).where(e.id >= ids[0], e.id <= ids[-1], e.time < before).returning(e.id)
    ).all()
    return len(deleted)
