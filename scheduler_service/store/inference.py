"""The inference side in the store: demand reports from the routers, their drain acknowledgements,
and the serving pool they route to.

Several routers (docs/security.md, "Inference safety"): each report is kept with its router (the
authenticated router's id, else the request's ``source``). The demand that counts (``fresh_demand``)
combines each router's newest report of the last ``DemandRules.ttl_s`` seconds: the largest
``servers_needed`` of them (``combine = "max"``: routers that each see all the traffic, the default,
so a router pair never doubles the need) or their sum (``"sum"``: routers that split the traffic).
A router that stops reporting stops counting once its report is older than the TTL; with no fresh
report there is no demand (as before any report). A DRAINING server is drained (loanable) once every
fresh router has acknowledged it (each acknowledgement is a SERVER_DRAINED event naming its router;
the last one is the ``DRAINED`` one that sets ``drained_at``).

Never: decide how many servers inference gets (the policy does, from the demand), or commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.errors import FailedPrecondition, InvalidArgument, NotFound
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.records import DemandInfo
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.rows import demand_info


@dataclass(frozen=True)
class DemandRules:
    """How reports of several routers make the demand (module doc; ``[inference]`` config)."""

    ttl_s: float = 60.0
    combine: Literal["max", "sum"] = "max"


# Reports read back to find each router's newest (by primary key, newest first; no index on time is
# needed): routers re-report every ~10 s, so this covers hundreds of routers within a 60 s TTL.
RECENT_REPORTS = 2000


def fresh_reports(session: Session, now: float, rules: DemandRules) -> list[DemandInfo]:
    """Each router's newest demand report of the last ``rules.ttl_s`` seconds, by router."""
    d = m.DEMAND_REPORTS.c
    newest: dict[str, DemandInfo] = {}
    for row in session.execute(sa.select(m.DEMAND_REPORTS).order_by(d.id.desc()).limit(RECENT_REPORTS)):
        report = demand_info(row._mapping)
        if report.time >= now - rules.ttl_s:
            newest.setdefault(report.source, report)
    return [newest[source] for source in sorted(newest)]


def fresh_demand(session: Session, now: float, rules: DemandRules) -> DemandInfo | None:
    """The demand that counts (module doc); None when no router reported within the TTL. Its ``source``
    lists the routers counted, its ``time`` is the oldest of their reports."""
    return combine_reports(fresh_reports(session, now, rules), rules)


def combine_reports(reports: list[DemandInfo], rules: DemandRules) -> DemandInfo | None:
    if not reports:
        return None
    if len(reports) == 1:
        return reports[0]
    if rules.combine == "sum":
        needed = sum(r.servers_needed for r in reports)
    else:
        needed = max(r.servers_needed for r in reports)
    return DemandInfo(
        time=min(r.time for r in reports), servers_needed=needed,
        observed_rps=sum(r.observed_rps for r in reports) if rules.combine == "sum"
        else max(r.observed_rps for r in reports),
        source=",".join(r.source for r in reports)[:253],
    )


class InferenceStore:
    def __init__(self, changes: StateChanges, clock: Clock, rules: DemandRules | None = None) -> None:
        self._changes = changes
        self._clock = clock
        self.rules = rules or DemandRules()

    def report_demand(
        self, session: Session, servers_needed: int, observed_rps: float, source: str
    ) -> tuple[DemandInfo, int, int]:
        """Record router ``source``'s demand report (an event when the demand that counts changed);
        returns the demand that counts now with the inference servers SERVING and LOANED now.
        InvalidArgument when ``servers_needed`` is more than the inference pool's servers."""
        pool_size = session.scalar(sa.select(sa.func.count()).where(m.Server.pool == Pool.INFERENCE)) or 0
        if servers_needed > pool_size:
            raise InvalidArgument(
                "servers_needed", f"must be between 0 and the inference pool's size, {pool_size} registered "
                f"server(s) (got {servers_needed})",
            )
        now = self._clock.now()
        previous = fresh_demand(session, now, self.rules)
        session.add(m.DemandReport(time=now, servers_needed=servers_needed, observed_rps=observed_rps, source=source))
        session.flush()
        demand = fresh_demand(session, now, self.rules)
        assert demand is not None  # this report is fresh
        if previous is None or previous.servers_needed != demand.servers_needed:
            self._changes.event(
                session, "DEMAND_CHANGED", reason="DEMAND_REPORTED",
                message=f"inference needs {demand.servers_needed} server(s); {source} reports {servers_needed} "
                        f"and measured {observed_rps:.1f} req/s",
                details={"servers_needed": str(demand.servers_needed), "router": source,
                         "router_servers_needed": str(servers_needed),
                         "previous": str(previous.servers_needed if previous else "")},
            )
        counts = dict(
            session.execute(
                sa.select(m.Server.state, sa.func.count())
                .where(m.Server.pool == Pool.INFERENCE)
                .group_by(m.Server.state)
            ).all()
        )
        return demand, counts.get(ServerState.SERVING, 0), counts.get(ServerState.LOANED, 0)

    @staticmethod
    def serving_pool(session: Session) -> tuple[int, list[tuple[str, str, str]]]:
        """The inference servers a router may know: (server id, endpoint, state) of SERVING and
        DRAINING servers that registered an endpoint and whose agent has applied the newest desired
        state, and a version that grows with every change."""
        s = m.SERVERS.c
        rows = session.execute(
            sa.select(s.id, s.inference_endpoint, s.state).select_from(m.SERVERS_WITH_HEARTBEATS)
            .where(s.pool == Pool.INFERENCE, s.state.in_([ServerState.SERVING, ServerState.DRAINING]),
                   s.inference_endpoint.is_not(None), s.inference_endpoint != "",
                   # SERVING: routable only once its agent confirmed the newest desired state, so a
                   # server that ran training (a returned loan, a lost server back) has no workers left.
                   # DRAINING: listed regardless, so the router stops routing there and acknowledges.
                   sa.or_(s.state == ServerState.DRAINING, m.OBSERVED_GENERATION >= s.desired_generation))
            .order_by(s.id)
        ).all()
        version = session.scalar(sa.select(sa.func.coalesce(sa.func.max(m.Event.id), 0)))
        return int(version or 0), [(r.id, r.inference_endpoint, r.state) for r in rows]

    def report_drained(self, session: Session, server_id: str, source: str) -> str:
        """Record router ``source``'s acknowledgement that it routes nothing to this DRAINING server and
        has nothing in flight there (once per router and drain); the server is drained once every fresh
        router has acknowledged (module doc). Returns its state."""
        server = session.get(m.Server, server_id)
        if server is None:
            raise NotFound(f"server {server_id} is not registered")
        if server.state != ServerState.DRAINING:
            raise FailedPrecondition(
                f"server {server_id} is {server.state}, not DRAINING: there is no drain to acknowledge"
            )
        if server.drained_at is not None:
            return server.state
        e = m.EVENTS.c
        acknowledged = {
            (details or {}).get("router", "")
            for (details,) in session.execute(
                sa.select(e.details).where(e.kind == "SERVER_DRAINED", e.server_id == server.id,
                                           e.time >= server.state_changed_at)
            )
        }
        if source in acknowledged:
            return server.state
        acknowledged.add(source)
        now = self._clock.now()
        waiting = sorted({r.source for r in fresh_reports(session, now, self.rules)} - acknowledged)
        if waiting:
            self._changes.event(
                session, "SERVER_DRAINED", server_id=server.id, reason="ACKNOWLEDGED", details={"router": source},
                message=f"router {source} has no inference requests in flight; waiting for {', '.join(waiting)}",
            )
        else:
            server.drained_at = now
            self._changes.event(session, "SERVER_DRAINED", server_id=server.id, reason="DRAINED",
                                details={"router": source},
                                message=f"no inference requests in flight (reported by {source})")
        return server.state
