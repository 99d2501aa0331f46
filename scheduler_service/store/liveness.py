"""A server lost in the store: marked LOST (with its event) and its open loan ended. That is all.

The jobs that ran there keep their allocations until the next scheduling cycle: the snapshot shows
the server LOST, and the policy's plan shrinks or requeues them (``scheduler_service.core.faults``,
applied first by every registered policy), so the service and the simulator decide alike.

Never: judge silence (the liveness use case does, on the scheduler's monotonic clock), touch jobs,
or commit.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.apply_rules import LoanState
from scheduler_service.core.clock import Clock
from scheduler_service.lifecycle import ServerState
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges
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
        # Its jobs are left as they are: the next cycle's plan evicts them (``core.faults``: shrink to
        # the workers elsewhere, or requeue), whatever the policy -- as the simulator's failures are.
        return {server.id}
