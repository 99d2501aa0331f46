"""The inference side: demand reports and drain acknowledgements from the router, the serving pool
it routes to, and a dry run of a reclaim.

Never: decide how many servers inference gets (the policy does, from the demand), or hold SQL.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler_service.app.notices import Announcer
from scheduler_service.core.clock import Clock
from scheduler_service.core.registry import ReclaimDecision, ReclaimPreviewer, ReclaimPreviewUnsupported
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.errors import FailedPrecondition
from scheduler_service.lifecycle import ServerState
from scheduler_service.records import DemandInfo
from scheduler_service.store import views
from scheduler_service.store.inference import InferenceStore
from scheduler_service.store.transactions import Transactions


class Inference:
    """``snapshot``: the cycle's view of the cluster (a reclaim preview decides on what a cycle would)."""

    def __init__(
        self, db: Transactions, store: InferenceStore, notices: Announcer, *, snapshot: Callable[[], ClusterSnapshot],
        clock: Clock,
    ) -> None:
        self._clock = clock
        self._db = db
        self._store = store
        self._notices = notices
        self._snapshot = snapshot

    def report_demand(self, servers_needed: int, observed_rps: float, source: str) -> tuple[DemandInfo, int, int]:
        """Record router ``source``'s demand; returns the demand that counts now (all fresh routers',
        ``store.inference``) with the inference servers SERVING and LOANED now. InvalidArgument for more
        servers than the inference pool has."""
        result = self._db.write(
            lambda session: self._store.report_demand(session, servers_needed, observed_rps, source)
        )
        self._notices.state_changed()
        return result

    def latest_demand(self) -> DemandInfo | None:
        """The demand that counts now: the fresh routers' reports combined (``store.inference``)."""
        return self._db.read(lambda session: views.latest_demand(session, self._clock.now(), self._store.rules))

    def serving_pool(self) -> tuple[int, list[tuple[str, str, str]]]:
        """The inference servers a router may know, as (server id, endpoint, state), with a version
        that grows with every change (``store.inference.InferenceStore.serving_pool``)."""
        return self._db.read(self._store.serving_pool)

    def report_drained(self, server_id: str, source: str) -> str:
        """Router ``source`` routes nothing to this DRAINING server any more and nothing is in flight
        there: once every fresh router said so, the policy may loan it now instead of waiting for the
        drain timeout. Idempotent."""
        state = self._db.write(lambda session: self._store.report_drained(session, server_id, source))
        self._notices.state_changed()
        return state

    def preview_reclaim(self, servers: int, policy: ReclaimPreviewer) -> tuple[ReclaimDecision, int]:
        """Dry run on the current state: what ``policy`` (the configured one) would reclaim if inference
        needed ``servers`` loaned servers back now, and how many are loaned; writes nothing.
        FailedPrecondition when the policy never loans servers."""
        snapshot = self._snapshot()
        loaned = sum(1 for s in snapshot.servers if s.state == ServerState.LOANED)
        try:
            return policy.preview_reclaim(snapshot, servers), loaned
        except ReclaimPreviewUnsupported as exc:
            raise FailedPrecondition(str(exc)) from None
