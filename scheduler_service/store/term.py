"""Scheduler terms in the store: one row per term (a scheduler's start; on PostgreSQL, each time a
scheduler takes the leader lease, ``store.lease``), whose id is the epoch that fences agents against
older schedulers.

Never: commit.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges


def start_term(session: Session, changes: StateChanges, clock: Clock, holder: str, *, how: str = "") -> int:
    """Record a new term held by ``holder`` (``how`` it came to be, for the event); returns its epoch."""
    term = m.SchedulerTerm(started_at=clock.now(), holder=holder)
    session.add(term)
    session.flush()
    message = f"epoch {term.epoch} by {holder}" + (f": {how}" if how else "")
    changes.event(session, "SCHEDULER_STARTED", reason="STARTED", message=message)
    return term.epoch
