"""The writes every use case shares: an entry in the event log, a job's or server's state change
checked against its lifecycle table (with its event), and a job's GPUs taken or given back.

Events are stamped with the clock when they are recorded. A state changes only through
``set_job_state``/``set_server_state`` (or, for a batch written in one statement, after
``job_state_event`` checked it), so the log holds every move with its reason.

Never: commit (the caller's transaction does), or change a state without its event.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.audit import current_actor
from scheduler_service.core.clock import Clock
from scheduler_service.errors import NotFound
from scheduler_service.lifecycle import JOB_LIFECYCLE, SERVER_LIFECYCLE, JobState, ServerState
from scheduler_service.store import models as m


class StateChanges:
    """Events and lifecycle-checked state changes, stamped with ``clock``."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock

    def event(self, session: Session, kind: str, **fields: Any) -> None:
        fields.setdefault("actor", current_actor())
        session.add(m.Event(time=self._clock.now(), kind=kind, details=fields.pop("details", {}), **fields))

    def set_job_state(self, session: Session, job: m.Job, target: JobState, reason: str, message: str) -> None:
        self.job_state_event(session, job, target, reason, message)
        job.state = target
        job.state_reason = reason
        job.state_message = message[:1024]

    def job_state_event(self, session: Session, job: m.Job, target: JobState, reason: str, message: str) -> None:
        """The event of a job's state change, checked against the lifecycle (the change is the caller's)."""
        JOB_LIFECYCLE.check(job.state, target)
        self.event(
            session, "JOB_STATE_CHANGED", job_id=job.id, from_state=job.state, to_state=target,
            reason=reason, message=message[:2048],
        )

    def set_server_state(
        self, session: Session, server: m.Server, target: ServerState, reason: str, message: str
    ) -> None:
        SERVER_LIFECYCLE.check(server.state, target)
        self.event(
            session, "SERVER_STATE_CHANGED", server_id=server.id, from_state=server.state,
            to_state=target, reason=reason, message=message[:2048],
        )
        server.state = target
        server.state_reason = message[:1024]
        server.state_changed_at = self._clock.now()
        server.drained_at = None  # a drain acknowledgement holds for one DRAINING spell only


def load_job(session: Session, job_id: int, *, for_update: bool = False) -> m.Job:
    stmt = sa.select(m.Job).where(m.Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    job = session.scalar(stmt)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def free_allocations(session: Session, job_id: int) -> set[str]:
    """Delete a job's allocations; returns the servers they were on."""
    a = m.ALLOCATIONS.c
    return set(session.scalars(sa.delete(m.ALLOCATIONS).where(a.job_id == job_id).returning(a.server_id)))


def insert_allocations(session: Session, job_id: int, gpus: Sequence[tuple[int, str, int]], now: float) -> None:
    """One INSERT for all (rank, server id, gpu index) rows of a job."""
    if gpus:
        session.execute(
            sa.insert(m.ALLOCATIONS),
            [dict(job_id=job_id, rank=rank, server_id=server_id, gpu_index=index, allocated_at=now)
             for rank, server_id, index in gpus],
        )


def new_incarnation(job: m.Job, workers: Iterable[Any]) -> None:
    """Every worker of the job (re)starts: a new incarnation, no exits yet, and where each rank
    now runs (merged into the history, so logs of ranks a shrink removed stay findable)."""
    job.incarnation = (job.incarnation or 0) + 1
    job.worker_exits = None
    job.rank_servers = {**(job.rank_servers or {}), **{str(w.rank): w.server_id for w in workers}}


def at_least(column: Any, value: Any) -> Any:
    """SQL for ``max(column, value)`` on both databases (a generation never goes back)."""
    return sa.case((column < value, value), else_=column)


@functools.lru_cache(maxsize=1024)
def index_list(aggregated: str | None) -> tuple[int, ...]:
    """GPU indices aggregated as text (``"3,0,1"``), ascending; most servers share a few such lists."""
    return tuple(sorted(int(i) for i in aggregated.split(","))) if aggregated else ()
