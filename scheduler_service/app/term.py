"""The scheduler's term: each start of a scheduler begins a new one (on PostgreSQL: each time it
takes the leader lease, ``app.lease``), whose epoch fences agents against older schedulers (an agent
obeys only the newest epoch it has seen).

Never: start a term anywhere but at the service's start-up (SQLite) or with the lease (PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.term import start_term
from scheduler_service.store.transactions import Transactions


class Term:
    """``epoch``: the current term's (0 until ``start``)."""

    def __init__(self, db: Transactions, changes: StateChanges, clock: Clock) -> None:
        self._db = db
        self._changes = changes
        self._clock = clock
        self.epoch = 0

    def start(self, holder: str) -> int:
        """Begin a new scheduler term held by ``holder``; returns its epoch."""
        self.epoch = self._db.write(lambda session: start_term(session, self._changes, self._clock, holder))
        return self.epoch

    def begin(self, epoch: int) -> None:
        """Adopt the epoch of a term begun with the leader lease (``app.lease``)."""
        self.epoch = epoch

    def fence_writes(self, fence: Callable[[Session], None]) -> None:
        """Run ``fence`` inside every write transaction, just before its commit (``app.lease``)."""
        self._db.fence = fence
