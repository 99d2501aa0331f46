"""The inference side in the store: demand reports from the router, its drain acknowledgements,
and the serving pool it routes to.

Never: decide how many servers inference gets (the policy does, from the demand), or commit.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.errors import FailedPrecondition, NotFound
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.records import DemandInfo
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges


class InferenceStore:
    def __init__(self, changes: StateChanges, clock: Clock) -> None:
        self._changes = changes
        self._clock = clock

    def report_demand(
        self, session: Session, servers_needed: int, observed_rps: float, source: str
    ) -> tuple[DemandInfo, int, int]:
        """Record a demand report (an event when the number of servers needed changed); returns it
        with the inference servers SERVING and LOANED now."""
        previous = session.scalar(sa.select(m.DemandReport).order_by(m.DemandReport.id.desc()).limit(1))
        report = m.DemandReport(
            time=self._clock.now(), servers_needed=servers_needed, observed_rps=observed_rps, source=source
        )
        session.add(report)
        if previous is None or previous.servers_needed != servers_needed:
            self._changes.event(
                session, "DEMAND_CHANGED", reason="DEMAND_REPORTED",
                message=f"inference needs {servers_needed} server(s); {source} measured {observed_rps:.1f} req/s",
                details={"servers_needed": str(servers_needed),
                         "previous": str(previous.servers_needed if previous else "")},
            )
        counts = dict(
            session.execute(
                sa.select(m.Server.state, sa.func.count())
                .where(m.Server.pool == Pool.INFERENCE)
                .group_by(m.Server.state)
            ).all()
        )
        demand = DemandInfo(time=report.time, servers_needed=servers_needed, observed_rps=observed_rps, source=source)
        return demand, counts.get(ServerState.SERVING, 0), counts.get(ServerState.LOANED, 0)

    @staticmethod
    def serving_pool(session: Session) -> tuple[int, list[tuple[str, str, str]]]:
        """The inference servers a router may know: (server id, endpoint, state) of SERVING and
        DRAINING servers that registered an endpoint and whose agent has applied the newest desired
        state, and a version that grows with every change."""
        s = m.SERVERS.c
        rows = session.execute(
            sa.select(s.id, s.inference_endpoint, s.state)
            .where(s.pool == Pool.INFERENCE, s.state.in_([ServerState.SERVING, ServerState.DRAINING]),
                   s.inference_endpoint.is_not(None), s.inference_endpoint != "",
                   # SERVING: routable only once its agent confirmed the newest desired state, so a
                   # server that ran training (a returned loan, a lost server back) has no workers left.
                   # DRAINING: listed regardless, so the router stops routing there and acknowledges.
                   sa.or_(s.state == ServerState.DRAINING, s.observed_generation >= s.desired_generation))
            .order_by(s.id)
        ).all()
        version = session.scalar(sa.select(sa.func.coalesce(sa.func.max(m.Event.id), 0)))
        return int(version or 0), [(r.id, r.inference_endpoint, r.state) for r in rows]

    def report_drained(self, session: Session, server_id: str, source: str) -> str:
        """Record that nothing is routed to or in flight on this DRAINING server (once per drain);
        returns its state."""
        server = session.get(m.Server, server_id)
        if server is None:
            raise NotFound(f"server {server_id} is not registered")
        if server.state != ServerState.DRAINING:
            raise FailedPrecondition(
                f"server {server_id} is {server.state}, not DRAINING: there is no drain to acknowledge"
            )
        if server.drained_at is None:
            server.drained_at = self._clock.now()
            self._changes.event(session, "SERVER_DRAINED", server_id=server.id, reason="DRAINED",
                                message=f"no inference requests in flight (reported by {source})")
        return server.state
