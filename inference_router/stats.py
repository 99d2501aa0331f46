"""What the router's ``GET /aryl/stats`` answers: its backends, request counters and rates, latency, the
data plane's state and the demand it reports, as one JSON-ready dict.

Nouns (``inference_router.router``): a *backend* is one inference server of the serving pool; with
HAProxy each has a *slot* in its pool backend, whose counters are read from HAProxy's statistics
(counts since the slot was assigned: ``base_dispatched``, ``base_failures``); without it the router's
own counts are shown. This module only reads the router: it never changes a backend or the pool.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from inference_router.pool import Backend

if TYPE_CHECKING:
    from inference_router.router import Router


def router_stats(router: Router) -> dict[str, object]:
    """What ``GET /aryl/stats`` answers (``Router.stats``)."""
    now = router.clock()
    estimate = router.last_estimate
    return {
        "data_plane": router.config.data_plane,
        "pool_version": router.pool.version,
        "backends": [backend_stats(router, b, now)
                     for b in sorted(router.pool.backends.values(), key=lambda b: b.server_id)],
        "requests": router.meter.total_arrivals,
        "requests_short": router.requests_short,
        "in_flight": router.in_flight,
        "responses_failed": router.responses_failed,
        "retries": router.retries,
        "rate_rps": {"short": router.meter.short_rate(now), "long": router.meter.long_rate(now),
                     "short_window_s": router.config.short_window_s, "long_window_s": router.config.long_window_s},
        **plane_stats(router, now),
        "demand": {
            "mode": router.demand_mode,
            "servers_needed": router.servers_needed_now(),
            "servers_serving": router.pool.serving,
            "raw_need": estimate.raw_need if estimate else None,
            "forecast_rps": estimate.forecast_rate if estimate else None,
            "reported": router.demand_reported,
            "reports_sent": router.demand_reports,
        },
        "drains_reported": list(router.drains_reported),
    }


def backend_stats(router: Router, b: Backend, now: float) -> dict[str, object]:
    common = {"server_id": b.server_id, "endpoint": b.endpoint, "state": b.state.value,
              "routable": router.routable(b, now), "healthy": router.healthy(b, now),
              "drained_reported": b.drained_reported}
    if router.plane is None:
        return {**common, "health_check_ok": b.active_ok,
                "ejected_for_s": round(max(0.0, b.ejected_until - now), 3) if b.ejected_until else 0.0,
                "in_flight": b.in_flight, "requests": b.requests, "failures": b.failures}
    slot, stats = router.plane.slot_of(b.server_id), router.plane.slot_stats(b.server_id)
    return {**common, "slot": slot.name if slot else None,
            "haproxy_status": stats.status if stats else None,
            "unroutable_because": router.plane.unroutable.get(b.server_id),
            "in_flight": stats.in_flight if stats else 0, "queued": stats.queued if stats else 0,
            "requests": stats.dispatched - slot.base_dispatched if stats and slot else 0,
            "failures": stats.failures - slot.base_failures if stats and slot else 0}


def plane_stats(router: Router, now: float) -> dict[str, object]:
    if router.plane is None:
        p50, p99 = router.meter.latency_percentiles(now, 50, 99)
        return {"latency_ms": {"p50": None if p50 is None else p50 * 1000,
                               "p99": None if p99 is None else p99 * 1000}}
    sample = router.plane.last_sample
    return {"queued": router.queued,
            "latency_ms": {f"avg_{k}": v for k, v in sample.avg_ms.items()} if sample else {},
            "latency_over": "haproxy's last 1024 requests",
            "haproxy": {"pid": router.plane.pid, "restarts": router.plane.restarts,
                        "slots": len(router.plane.slots), "slots_used": len(router.plane.by_server),
                        "sampled_s_ago": round(time.monotonic() - sample.taken_at, 3) if sample else None}}

