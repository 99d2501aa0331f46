"""Event retention: the housekeeping that keeps the append-only event log from growing forever.

Events older than ``events.retention_days`` are deleted in chunks of ``events.prune_chunk``, each
chunk its own short transaction, so pruning a large backlog never holds locks for long and never
stalls the writers that append. The database itself refuses to delete events younger than a day
(migration 0008).

Never: hold SQL (``store.retention`` does), or delete events younger than the horizon asked for.
"""

from __future__ import annotations

import functools

from scheduler_service.store.retention import delete_oldest_events
from scheduler_service.store.transactions import Transactions

SECONDS_PER_DAY = 86400


class EventRetention:
    def __init__(self, db: Transactions) -> None:
        self._db = db

    def prune(self, *, now: float, retention_days: int, chunk: int, max_chunks: int = 100) -> int:
        """Delete events older than ``retention_days`` before ``now`` (0: none), at most ``chunk`` per
        transaction and ``max_chunks`` transactions per call (the rest waits for the next call);
        returns how many were deleted."""
        if retention_days <= 0:
            return 0
        before = now - retention_days * SECONDS_PER_DAY
        deleted = 0
        for _ in range(max_chunks):
            count = self._db.write(functools.partial(delete_oldest_events, before=before, limit=chunk))
            deleted += count
            if count < chunk:
                break
        return deleted
