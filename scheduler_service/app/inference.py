"""The inference side: demand reports and drain acknowledgements from the router, the serving pool
it routes to, and a dry run of a reclaim.

Never: decide how many servers inference gets (the policy does, from the demand), or hold SQL.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler_service.app.notices import Announcer
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.registry import ReclaimDecision
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.lifecycle import ServerState
from scheduler_service.policies.aryl import preview_reclaim
from scheduler_service.records import DemandInfo
from scheduler_service.store import views
from scheduler_service.store.inference import InferenceStore
from scheduler_service.store.transactions import Transactions


class Inference:
    """``snapshot``: the cycle's view of the cluster (a reclaim preview decides on what a cycle would)."""

    def __init__(
        self, db: Transactions, store: InferenceStore, notices: Announcer, *, snapshot: Callable[[], ClusterSnapshot]
    ) -> None:
        self._db = db
        self._store = store
        self._notices = notices
        self._snapshot = snapshot

    def report_demand(self, servers_needed: int, observed_rps: float, source: str) -> tuple[DemandInfo, int, int]:
        """Record inference demand; returns it with the inference servers SERVING and LOANED now."""
        result = self._db.write(
            lambda session: self._store.report_demand(session, servers_needed, observed_rps, source)
        )
        self._notices.state_changed()
        return result

    def latest_demand(self) -> DemandInfo | None:
        return self._db.read(views.latest_demand)

    def serving_pool(self) -> tuple[int, list[tuple[str, str, str]]]:
        """The inference servers a router may know, as (server id, endpoint, state), with a version
        that grows with every change (``store.inference.InferenceStore.serving_pool``)."""
        return self._db.read(self._store.serving_pool)

    def report_drained(self, server_id: str, source: str) -> str:
        """The router routes nothing to this DRAINING server any more and nothing is in flight there:
        the policy may loan it now instead of waiting for the drain timeout. Idempotent."""
        state = self._db.write(lambda session: self._store.report_drained(session, server_id, source))
        self._notices.state_changed()
        return state

    def preview_reclaim(self, servers: int, params: PolicyParams) -> tuple[ReclaimDecision, int]:
        """Dry run of a reclaim of ``servers`` loaned servers on the current state; writes nothing."""
        snapshot = self._snapshot()
        loaned = sum(1 for s in snapshot.servers if s.state == ServerState.LOANED)
        return preview_reclaim(snapshot, servers, params), loaned
