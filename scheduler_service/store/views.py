"""Read-only views of the cluster for users: servers with their GPUs, loans, job counts, the event
log.

Never: write, or serve the scheduling cycle (the snapshot reader does, with its own columns).
"""

from __future__ import annotations

from collections import defaultdict

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.apply_rules import LoanState
from scheduler_service.lifecycle import Pool
from scheduler_service.records import DemandInfo, EventInfo, LoanInfo, LoanNoteInfo, ServerInfo
from scheduler_service.store import models as m
from scheduler_service.store.inference import DemandRules, fresh_demand
from scheduler_service.store.rows import Values, demand_info, event_info, loan_info, server_info


def servers(session: Session, pool: Pool | None = None) -> list[ServerInfo]:
    """Every server (of ``pool``), inference first, with its GPUs and the jobs holding them."""
    s, g, a = m.SERVERS.c, m.GPUS.c, m.ALLOCATIONS.c
    stmt = (
        sa.select(m.SERVERS, m.LAST_SEEN_AT.label("last_seen_at"), m.OBSERVED_GENERATION.label("observed_generation"))
        .select_from(m.SERVERS_WITH_HEARTBEATS).order_by(s.pool.desc(), s.id)
    )
    if pool is not None:
        stmt = stmt.where(s.pool == pool)
    rows = [row._mapping for row in session.execute(stmt)]
    gpus: dict[str, list[Values]] = defaultdict(list)
    for row in session.execute(sa.select(m.GPUS).order_by(g.server_id, g.index)):
        gpu = row._mapping
        gpus[gpu["server_id"]].append(gpu)
    holders: dict[str, dict[int, int]] = defaultdict(dict)
    for sid, index, jid in session.execute(sa.select(a.server_id, a.gpu_index, a.job_id)):
        holders[sid][index] = jid
    return [server_info(server, gpus[server["id"]], holders[server["id"]]) for server in rows]


def loans(session: Session, include_returned: bool) -> list[LoanInfo]:
    """Loans, newest first; only the open ones unless ``include_returned``."""
    ln = m.LOANS.c
    stmt = sa.select(m.LOANS).order_by(ln.id.desc())
    if not include_returned:
        stmt = stmt.where(ln.state != LoanState.RETURNED)
    return [loan_info(row._mapping) for row in session.execute(stmt)]


def loan_note(session: Session) -> LoanNoteInfo | None:
    """Why the last scheduling cycle loaned no (further) server (None: it loaned one, or its policy
    does not say)."""
    n = m.SCHEDULER_NOTES.c
    row = session.execute(sa.select(n.reason, n.message, n.since).where(n.topic == m.LOANS_TOPIC)).first()
    return LoanNoteInfo(row.reason, row.message, row.since) if row is not None else None


def counts(
    session: Session, now: float | None = None, rules: DemandRules | None = None
) -> tuple[dict[str, int], DemandInfo | None, int]:
    """Jobs per state, the inference demand (``latest_demand``), and the number of open loans."""
    jobs = dict(session.execute(sa.select(m.Job.state, sa.func.count()).group_by(m.Job.state)).all())
    demand = latest_demand(session, now, rules)
    open_loans = session.scalar(sa.select(sa.func.count()).where(m.Loan.state != LoanState.RETURNED)) or 0
    return jobs, demand, open_loans


def latest_demand(session: Session, now: float | None = None, rules: DemandRules | None = None) -> DemandInfo | None:
    """The inference demand that counts at ``now`` (``store.inference.fresh_demand``: the fresh routers'
    reports combined); without ``now``, the newest report whatever its age."""
    if now is not None:
        return fresh_demand(session, now, rules or DemandRules())
    d = m.DEMAND_REPORTS.c
    row = session.execute(sa.select(m.DEMAND_REPORTS).order_by(d.id.desc()).limit(1)).one_or_none()
    return demand_info(row._mapping) if row is not None else None


def events_after(
    session: Session, after_id: int, *, job_id: int | None = None, server_id: str = "", limit: int = 500,
    upto: int | None = None,
) -> list[EventInfo]:
    """Up to ``limit`` events after ``after_id`` (and at most ``upto``; of one job or server), oldest first."""
    e = m.EVENTS.c
    stmt = sa.select(m.EVENTS).where(e.id > after_id)
    if upto is not None:
        stmt = stmt.where(e.id <= upto)
    if job_id is not None:
        stmt = stmt.where(e.job_id == job_id)
    if server_id:
        stmt = stmt.where(e.server_id == server_id)
    return [event_info(row._mapping) for row in session.execute(stmt.order_by(e.id).limit(limit))]


def last_event_id(session: Session) -> int:
    return session.scalar(sa.select(sa.func.max(m.Event.id))) or 0
