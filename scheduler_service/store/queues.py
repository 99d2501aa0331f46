"""Queues in the store: the admin-configured rows of ``queues`` (``core.quota`` defines the nouns), and
the reads the snapshot and the submission check need.

Never: decide anything about quotas (``core.quota`` does), or commit.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.quota import DEFAULT_QUEUE
from scheduler_service.core.snapshot import QueueView
from scheduler_service.errors import AlreadyExists, FailedPrecondition, NotFound
from scheduler_service.lifecycle import JobState
from scheduler_service.records import QueueSettings
from scheduler_service.store import models as m

_ACTIVE = [str(s) for s in (JobState.PENDING, JobState.RUNNING, JobState.SCALING, JobState.PREEMPTED)]


def queue_views(session: Session) -> tuple[QueueView, ...]:
    """The configured queues, by name (the snapshot's ``queues``)."""
    q = m.QUEUES.c
    return tuple(
        QueueView(row.name, row.quota_gpus, row.borrow_limit_gpus, row.cohort, row.fair_share)
        for row in session.execute(
            sa.select(q.name, q.quota_gpus, q.borrow_limit_gpus, q.cohort, q.fair_share).order_by(q.name))
    )


def queue_names(session: Session) -> set[str]:
    return set(session.scalars(sa.select(m.QUEUES.c.name)))


class QueueStore:
    def create(self, session: Session, settings: QueueSettings, now: float) -> QueueView:
        if session.get(m.Queue, settings.name) is not None:
            raise AlreadyExists(f"queue {settings.name!r} already exists; change it with UpdateQueue "
                                "(arylctl queues set)")
        session.add(m.Queue(name=settings.name, cohort=settings.cohort, quota_gpus=settings.quota_gpus,
                            borrow_limit_gpus=settings.borrow_limit_gpus, fair_share=settings.fair_share,
                            created_at=now, updated_at=now))
        session.flush()
        return _view(settings)

    def update(self, session: Session, name: str, change: dict[str, object], now: float) -> QueueView:
        """Set the fields in ``change`` (``quota_gpus`` None: the rest, "default" only). "default" without
        a row gets one (configuring it) from what it is unconfigured: the rest as its quota unless one
        is given, no borrow limit, no cohort, no fair share."""
        row = session.get(m.Queue, name)
        if row is None:
            if name != DEFAULT_QUEUE:
                raise NotFound(f"queue {name!r} does not exist; create it with CreateQueue (arylctl queues create)")
            row = m.Queue(name=name, cohort="", quota_gpus=None, borrow_limit_gpus=None, fair_share=False,
                          created_at=now, updated_at=now)
            session.add(row)
        for key, value in change.items():
            setattr(row, key, value)
        row.updated_at = now
        session.flush()
        return QueueView(row.name, row.quota_gpus, row.borrow_limit_gpus, row.cohort, row.fair_share)

    def delete(self, session: Session, name: str) -> None:
        """Delete the queue ``name``, which must have no active job. "default" is never deleted: its row
        goes (with active jobs too: they stay in it), so it is unconfigured again, its quota the rest."""
        row = session.get(m.Queue, name)
        if row is None:
            if name == DEFAULT_QUEUE:
                raise NotFound('queue "default" is not configured: its quota is already the rest (what the other '
                               "queues leave)")
            raise NotFound(f"queue {name!r} does not exist")
        if name == DEFAULT_QUEUE:
            session.delete(row)
            return
        active = session.scalar(sa.select(sa.func.count()).select_from(m.JOBS).where(
            m.JOBS.c.queue == name, m.JOBS.c.state.in_(_ACTIVE)))
        if active:
            raise FailedPrecondition(f"queue {name!r} still has {active} active job(s); cancel them or wait "
                                     "for them to finish before deleting it")
        session.delete(row)


def _view(s: QueueSettings) -> QueueView:
    return QueueView(s.name, s.quota_gpus, s.borrow_limit_gpus, s.cohort, s.fair_share)
