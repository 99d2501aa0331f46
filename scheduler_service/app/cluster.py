"""The scheduling cycle's port onto the database: ``snapshot`` and ``apply``, the ``ClusterState``
of ``scheduler_service.cycle``.

Never: decide (the policy does), or hold SQL (``store.snapshot`` reads, ``store.applier`` writes);
agents hear of an applied plan only after its commit.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.orm import Session

from scheduler_service.app.notices import Announcer
from scheduler_service.core.plan import ApplyResult, Plan
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.kill_points import kill_point
from scheduler_service.store.applier import Applier, SqlApplyLog
from scheduler_service.store.snapshot import SnapshotReader
from scheduler_service.store.transactions import Transactions


class DatabaseCluster:
    def __init__(self, db: Transactions, reader: SnapshotReader, applier: Applier, notices: Announcer) -> None:
        self._db = db
        self._reader = reader
        self._applier = applier
        self._notices = notices

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        """The frozen view the policy decides on: schedulable state only, read in one transaction."""
        return self._db.read(lambda session: self._reader.read(session, seed))

    def apply(self, plan: Plan) -> ApplyResult:
        """Commit ``plan`` in one transaction, each action re-checked and refused alone when fresh
        state no longer allows it (``store.applier.Applier.apply``); then tell the agents of every
        touched server."""
        if plan.is_empty:
            return ApplyResult((), (), frozenset())
        stamps = self._reader.stamps(p.job_id for p in plan.pending)
        log = self._db.write(lambda session: self._apply(session, plan, stamps))
        self._reader.reasons_written(log.restamped)  # committed: the next snapshot need not read those rows
        if log.changed:
            self._notices.servers_changed(log.touched)
        elif plan.pending or plan.held or plan.loan_note is not None:  # reasons recorded: events to watch
            self._notices.notifier.events_appended()
        return log.result()

    def _apply(self, session: Session, plan: Plan, stamps: Mapping[int, str]) -> SqlApplyLog:
        log = self._applier.apply(session, plan, stamps)
        kill_point("apply.written")  # tests only (kill_points)
        return log
