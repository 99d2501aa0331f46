"""Servers an operator takes out, or whose agent leaves: the admin state in the store
(``servers.admin_state``, ``core.snapshot.AdminState``), its event, and the removal of a deleted server.

Marking is all this module does: the snapshot shows the admin state, the policy moves work off a
draining server (``core.faults``), placement and the apply rules place nothing on a cordoned one.
A server is removed from the store only when nothing runs there: its GPUs, its loans' history and its
row go; the event log keeps its events.

Never: decide what moves (the policy does), or commit.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.apply_rules import LoanState
from scheduler_service.core.clock import Clock
from scheduler_service.core.snapshot import AdminState
from scheduler_service.errors import FailedPrecondition, NotFound
from scheduler_service.lifecycle import ServerState
from scheduler_service.records import AdminChange
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.desired import DesiredStates

EVENT_KIND = "SERVER_ADMIN_CHANGED"


class ServerAdminStore:
    def __init__(self, changes: StateChanges, desired: DesiredStates, clock: Clock) -> None:
        self._changes = changes
        self._desired = desired
        self._clock = clock

    def cordon(self, session: Session, server_id: str, reason: str) -> AdminChange:
        server = _load(session, server_id)
        _refuse_if_leaving(server, "cordon")
        if server.admin_state in (AdminState.CORDONED, AdminState.DRAINING):
            return AdminChange(server_id, f"server {server_id} is already {server.admin_state.lower()}; "
                                          "nothing changed")
        self._set(session, server, AdminState.CORDONED, "CORDONED", reason or "cordoned by an operator")
        return AdminChange(server_id, f"server {server_id} cordoned: no new workers or loans; what runs there "
                                      "keeps running")

    def uncordon(self, session: Session, server_id: str) -> AdminChange:
        server = _load(session, server_id)
        _refuse_if_leaving(server, "uncordon")
        if server.admin_state == AdminState.NONE:
            return AdminChange(server_id, f"server {server_id} is not cordoned; nothing changed")
        self._set(session, server, AdminState.NONE, "UNCORDONED", "uncordoned by an operator")
        return AdminChange(server_id, f"server {server_id} uncordoned: it takes new work again")

    def drain(self, session: Session, server_id: str, reason: str, *, timeout_s: float, force: bool) -> AdminChange:
        """``timeout_s`` > 0: jobs that cannot shrink off are requeued after that long; 0: never
        (they finish there); ``force``: now."""
        server = _load(session, server_id)
        _refuse_if_leaving(server, "drain")
        now = self._clock.now()
        deadline = now if force else now + timeout_s if timeout_s > 0 else None
        self._set(session, server, AdminState.DRAINING, "DRAINING", reason or "drained by an operator",
                  deadline=deadline, details={"deadline_in_s": "now" if force else f"{timeout_s:g}" if deadline else
                                              "none"})
        after = ("jobs that cannot shrink off it are requeued now" if force
                 else f"jobs that cannot shrink off it are requeued after {timeout_s:g}s" if deadline is not None
                 else "jobs that cannot shrink off it are left to finish (--timeout or --force to requeue them)")
        return AdminChange(server_id, f"server {server_id} draining: elastic jobs shrink off it; {after}; "
                                      "it shows DRAINED once nothing runs there")

    def delete(self, session: Session, server_id: str, *, force: bool) -> AdminChange:
        """Remove the server now when nothing runs there; else, when it is LOST or ``force``, mark it
        DELETING (its jobs are evicted as by a drain whose deadline passed) for ``remove_vacated``;
        else refuse."""
        server = _load(session, server_id)
        holders = _jobs_on(session, server_id)
        if not holders:
            self._remove(session, server)
            agent_alive = server.state != ServerState.LOST
            return AdminChange(server_id, f"server {server_id} deleted" + (
                "; its agent still runs and will register it again: stop the agent (it deregisters)"
                if agent_alive else ""), deleted=True)
        if server.state != ServerState.LOST and not force:
            raise FailedPrecondition(
                f"server {server_id} still runs workers of job(s) {', '.join(map(str, holders))}; "
                f"drain it first (arylctl servers drain {server_id}) and delete it once it shows DRAINED, "
                "or delete it with --force to requeue or shrink those jobs now"
            )
        if server.admin_state != AdminState.DELETING:
            self._set(session, server, AdminState.DELETING, "DELETING",
                      "deleted by an operator" + (" (--force)" if force else " (server LOST)"),
                      deadline=self._clock.now())
        return AdminChange(server_id, f"server {server_id} is being deleted: job(s) "
                                      f"{', '.join(map(str, holders))} are requeued or shrink off it first")

    def deregister(self, session: Session, server_id: str, reason: str) -> AdminChange:
        """Its agent leaves: the server is LOST at once (its open loan ends) and LEFT, so the next plan
        evicts its jobs (reason SERVER_LEFT) and nothing more is placed there until it registers."""
        server = _load(session, server_id)
        touched: set[str] = set()
        if server.state != ServerState.LOST:
            server.state_before_fault = server.state
            self._changes.set_server_state(session, server, ServerState.LOST, "AGENT_DEREGISTERED",
                                           f"its agent left the cluster: {reason or 'agent stopped'}")
            _end_open_loan(self._changes, session, server, self._clock.now())
            touched.add(server_id)
        if server.admin_state != AdminState.LEFT:
            self._set(session, server, AdminState.LEFT, "DEREGISTERED", reason or "agent stopped")
        if touched:
            self._desired.bump(session, touched)
        return AdminChange(server_id, f"server {server_id} left the cluster", touched=frozenset(touched))

    def remove_vacated(self, session: Session) -> list[str]:
        """Remove the DELETING servers nothing runs on any more; returns their ids."""
        s, a = m.SERVERS.c, m.ALLOCATIONS.c
        vacated = list(session.scalars(
            sa.select(s.id).where(s.admin_state == AdminState.DELETING,
                                  ~sa.exists().where(a.server_id == s.id)).order_by(s.id)))
        for server_id in vacated:
            server = session.get(m.Server, server_id)
            if server is not None:
                self._remove(session, server)
        return vacated

    # -- helpers -----------------------------------------------------------------------------------

    def _set(self, session: Session, server: m.Server, admin: AdminState, event_reason: str, why: str, *,
             deadline: float | None = None, details: dict[str, str] | None = None) -> None:
        before = server.admin_state
        server.admin_state = admin
        server.admin_reason = why[:1024]
        server.admin_changed_at = self._clock.now()
        server.drain_deadline = deadline
        self._changes.event(session, EVENT_KIND, server_id=server.id, from_state=before, to_state=admin,
                            reason=event_reason, message=why[:2048], details=details or {})
        session.flush()

    def _remove(self, session: Session, server: m.Server) -> None:
        server_id = server.id
        self._changes.event(session, EVENT_KIND, server_id=server_id, from_state=server.admin_state,
                            to_state="", reason="DELETED",
                            message=f"server removed from the cluster ({server.state}, {server.pool.lower()})")
        session.execute(sa.delete(m.LOANS).where(m.LOANS.c.server_id == server_id))
        session.execute(sa.delete(m.GPUS).where(m.GPUS.c.server_id == server_id))
        session.delete(server)
        session.flush()


def _load(session: Session, server_id: str) -> m.Server:
    server = session.get(m.Server, server_id)
    if server is None:
        raise NotFound(f"server {server_id} is not registered (arylctl servers lists them)")
    return server


def _refuse_if_leaving(server: m.Server, what: str) -> None:
    if server.admin_state == AdminState.LEFT:
        raise FailedPrecondition(f"server {server.id}'s agent deregistered; it cannot be {what}ed until its agent "
                                 f"registers again (or delete it: arylctl servers delete {server.id})")
    if server.admin_state == AdminState.DELETING:
        raise FailedPrecondition(f"server {server.id} is being deleted; it leaves once its jobs are off it")


def _jobs_on(session: Session, server_id: str) -> list[int]:
    a = m.ALLOCATIONS.c
    return list(session.scalars(sa.select(a.job_id).where(a.server_id == server_id).distinct().order_by(a.job_id)))


def _end_open_loan(changes: StateChanges, session: Session, server: m.Server, now: float) -> None:
    """A server leaving is no use to training; inference gets it back when its agent returns."""
    loan = session.scalar(sa.select(m.Loan).where(m.Loan.server_id == server.id, m.Loan.state != LoanState.RETURNED))
    if loan is not None:
        loan.state, loan.ended_at, loan.reason = LoanState.RETURNED, now, "SERVER_LEFT: agent deregistered"
        changes.event(session, "LOAN_ENDED", server_id=server.id, reason="SERVER_LEFT",
                      message=f"server left the cluster while on loan (loaned for {now - loan.started_at:.0f}s)",
                      details={"loan_id": str(loan.id)})
