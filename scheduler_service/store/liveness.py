"""A server lost in the store: marked LOST, its open loan ended, and the jobs that ran there shrunk
to their workers elsewhere or requeued.

Kept as the service has always done it. The shrink-or-requeue decision below belongs to the policy
(it decides everything else that moves a job) and is isolated here so that it can move there
whole: the simulator cannot run it while it lives in the store.

Never: judge silence (the liveness use case does, on the scheduler's monotonic clock), or commit.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.lifecycle import JobState, ServerState
from scheduler_service.store import models as m
from scheduler_service.store.applier import LoanState
from scheduler_service.store.changes import StateChanges, free_allocations, new_incarnation
from scheduler_service.store.desired import DesiredStates


class LivenessStore:
    def __init__(self, changes: StateChanges, desired: DesiredStates, clock: Clock) -> None:
        self._changes = changes
        self._desired = desired
        self._clock = clock

    @staticmethod
    def servers_not_lost(session: Session) -> list[str]:
        return list(session.scalars(sa.select(m.Server.id).where(m.Server.state != ServerState.LOST)))

    def mark_lost(
        self, session: Session, server_id: str, *, silence: float, lost_after_s: float,
        silence_now: Callable[[str], float],
    ) -> set[str] | None:
        """Mark the server LOST after ``silence`` seconds without a report, if it still is silent
        (``silence_now``) and not LOST already; returns the servers whose desired state changed, or
        None when there was nothing to do."""
        server = session.get(m.Server, server_id)
        # Re-checked inside the transaction: a report may have arrived meanwhile.
        if server is None or server.state == ServerState.LOST or silence_now(server_id) <= lost_after_s:
            return None
        touched = self._mark_lost(session, server, silence, lost_after_s)
        self._desired.bump(session, touched)
        return touched

    def _mark_lost(self, session: Session, server: m.Server, silence: float, lost_after_s: float) -> set[str]:
        now = self._clock.now()
        server.state_before_fault = server.state
        self._changes.set_server_state(
            session, server, ServerState.LOST, "AGENT_SILENT",
            f"no report from the agent for {silence:.0f}s (lost after {lost_after_s:g}s)",
        )
        loan = session.scalar(
            sa.select(m.Loan).where(m.Loan.server_id == server.id, m.Loan.state != LoanState.RETURNED)
        )
        if loan is not None:  # a lost server is no use to training; inference gets it back when it returns
            loan.state, loan.ended_at, loan.reason = LoanState.RETURNED, now, "SERVER_LOST: agent silent"
            self._changes.event(session, "LOAN_ENDED", server_id=server.id, reason="SERVER_LOST",
                                message=f"server lost while on loan (loaned for {now - loan.started_at:.0f}s)",
                                details={"loan_id": str(loan.id)})
        touched = {server.id}
        job_ids = sorted(set(session.scalars(
            sa.select(m.Allocation.job_id).where(m.Allocation.server_id == server.id)
        )))
        for job in session.scalars(sa.select(m.Job).where(m.Job.id.in_(job_ids)).order_by(m.Job.id)):
            touched |= self._evict_from_lost_server(session, job, server.id, now)
        return touched

    def _evict_from_lost_server(self, session: Session, job: m.Job, server_id: str, now: float) -> set[str]:
        """A job with workers on a lost server: shrink it to the workers it has elsewhere when that is
        still at least ``min_workers`` (ranks renumbered densely, a new incarnation), else requeue it."""
        allocations = list(session.scalars(sa.select(m.Allocation).where(m.Allocation.job_id == job.id)))
        servers = {a.server_id for a in allocations}
        remaining = sorted({a.rank for a in allocations if a.server_id != server_id}
                           - {a.rank for a in allocations if a.server_id == server_id})
        message = f"server {server_id} lost (agent silent)"
        if job.state == JobState.RUNNING and len(remaining) >= job.min_workers:
            renumber = {old: new for new, old in enumerate(remaining)}
            workers = []
            for a in allocations:
                if a.server_id == server_id or a.rank not in renumber:
                    session.delete(a)
                else:
                    a.rank = renumber[a.rank]
                    workers.append(a)
            session.flush()
            self._changes.set_job_state(session, job, JobState.SCALING, "SERVER_LOST", message)
            new_incarnation(job, workers)
            job.num_workers = len(remaining)
            job.last_resized_at = now
            self._changes.set_job_state(session, job, JobState.RUNNING, "SERVER_LOST",
                                        f"{message}; continues with {len(remaining)} worker(s)")
            return servers
        free_allocations(session, job.id)
        job.num_workers = 0
        job.preemptions += 1
        job.pending_reason = f"SERVER_LOST: {message}"[:1024]
        self._changes.set_job_state(session, job, JobState.PREEMPTED, "SERVER_LOST", message)
        self._changes.set_job_state(session, job, JobState.PENDING, "SERVER_LOST", f"requeued: {message}")
        return servers
