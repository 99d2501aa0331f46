"""Cluster views for users: servers with their GPUs, loans, a summary per pool, the event log.

Never: write, or hold SQL (``store.views`` does).
"""

from __future__ import annotations

from scheduler_service.core.clock import Clock
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.records import ClusterSummary, EventInfo, LoanInfo, LoanNoteInfo, PoolStats, ServerInfo
from scheduler_service.store import views
from scheduler_service.store.inference import DemandRules
from scheduler_service.store.transactions import Transactions


class ClusterViews:
    def __init__(self, db: Transactions, clock: Clock | None = None, demand_rules: DemandRules | None = None) -> None:
        self._db = db
        self._clock = clock  # with it, the demand shown is the one that counts now (store.inference)
        self._demand_rules = demand_rules

    def servers(self, pool: Pool | None = None) -> list[ServerInfo]:
        return self._db.read(lambda session: views.servers(session, pool))

    def loans(self, include_returned: bool) -> list[LoanInfo]:
        return self._db.read(lambda session: views.loans(session, include_returned))

    def loan_note(self) -> LoanNoteInfo | None:
        """Why the last cycle loaned no (further) server (None: it loaned one, or the policy does not say)."""
        return self._db.read(views.loan_note)

    def summary(self) -> ClusterSummary:
        """Servers and GPUs per pool (used, loaned, unavailable), jobs per state, the latest demand,
        the open loans."""
        servers = self.servers()
        now = self._clock.now() if self._clock is not None else None
        counts, demand, loans, note = self._db.read(
            lambda session: (*views.counts(session, now, self._demand_rules), views.loan_note(session))
        )
        pools = {p: dict(servers=0, gpus_total=0, gpus_used=0, gpus_loaned=0, gpus_unavailable=0) for p in Pool}
        for server in servers:
            stats = pools[server.pool]
            stats["servers"] += 1
            stats["gpus_total"] += len(server.gpus)
            stats["gpus_used"] += server.gpus_used
            if server.state in (ServerState.LOANED, ServerState.RECLAIMING):
                stats["gpus_loaned"] += len(server.gpus)
            down = server.state in (ServerState.LOST, ServerState.UNHEALTHY)
            stats["gpus_unavailable"] += sum(1 for g in server.gpus if down or not g.healthy)
        return ClusterSummary(
            pools=tuple(PoolStats(pool=p, **v) for p, v in pools.items()),
            jobs_by_state=counts,
            demand=demand,
            active_loans=loans,
            not_loaned=note,
        )

    def events_after(
        self, after_id: int, *, job_id: int | None = None, server_id: str = "", limit: int = 500,
        upto: int | None = None,
    ) -> list[EventInfo]:
        return self._db.read(lambda session: views.events_after(
            session, after_id, job_id=job_id, server_id=server_id, limit=limit, upto=upto
        ))

    def last_event_id(self) -> int:
        return self._db.read(views.last_event_id)
