"""The inference router's Prometheus metrics, on a registry of its own (``aryl_common.metrics``;
served by ``inference_router.router.serve`` on ``[metrics] port``).

- ``aryl_router_requests_total{code}`` (the answer's status class: 2xx, 4xx, 5xx...): every request
  for the pool, the data plane's own 502/503/504 answers included (request rate:
  ``rate(aryl_router_requests_total[1m])``); haproxy: HAProxy's counters, read at each scrape.
- ``aryl_router_request_duration_seconds{code}``: python data plane only (HAProxy keeps averages, not
  a distribution): each request's time to answer. haproxy: ``aryl_router_haproxy_avg_seconds{phase}``
  (queue, connect, response, total: averages over HAProxy's last 1,024 requests),
  ``aryl_router_queued`` (requests waiting in HAProxy's queue) and ``aryl_router_haproxy_restarts_total``.
- Read from the router at each scrape: ``aryl_router_in_flight``, ``aryl_router_retries_total``,
  ``aryl_router_backends{state,routable}``, ``aryl_router_observed_rps{window}`` (short, long),
  ``aryl_router_demand_servers_needed`` (what it would report now; absent while unknown),
  ``aryl_router_demand_servers_reported`` and ``aryl_router_demand_reports_total``.
- The inference shortfall, read at each scrape: ``aryl_router_requests_arrived_total`` (every request
  to be proxied, as it arrives) and ``aryl_router_requests_short_total`` (those that arrived while the
  serving pool held fewer SERVING servers than ``aryl_router_demand_servers_needed``): their ratio is the
  live ``requests_short_share`` that ``policy.inference_short_budget`` bounds
  (``rate(aryl_router_requests_short_total[1h]) / rate(aryl_router_requests_arrived_total[1h])``), and
  ``aryl_router_serving_servers``, the serving pool's size.

Never: change how requests are routed.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from inference_router.router import Router

# Seconds: model servers answer in milliseconds to a minute.
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class RouterMetrics:
    def __init__(self, router: Router) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests: Counter | None = None
        self.duration: Histogram | None = None
        if not router.uses_haproxy:  # the Python proxy sees each request; HAProxy's counters are read instead
            self.requests = Counter("aryl_router_requests", "Proxied requests, by answer status class", ["code"],
                                    registry=r)
            self.duration = Histogram("aryl_router_request_duration_seconds",
                                      "Proxied requests' time to answer, by status class", ["code"],
                                      buckets=REQUEST_BUCKETS, registry=r)
        r.register(_RouterCollector(router))

    def request_done(self, status: int, seconds: float) -> None:
        assert self.requests is not None and self.duration is not None, "the python data plane's hook"
        code = f"{status // 100}xx"
        self.requests.labels(code=code).inc()
        self.duration.labels(code=code).observe(seconds)


class _RouterCollector(Collector):
    def __init__(self, router: Router) -> None:
        self._router = router

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        router = self._router
        now = router.clock()
        yield GaugeMetricFamily("aryl_router_in_flight", "Requests being proxied now", value=router.in_flight)
        yield CounterMetricFamily("aryl_router_retries", "Requests tried on another backend", value=router.retries)
        backends = GaugeMetricFamily("aryl_router_backends", "Backends in the serving pool, by state and routability",
                                     labels=["state", "routable"])
        counts = Tally((b.state.value, str(router.routable(b, now)).lower()) for b in router.pool.backends.values())
        for (state, routable), n in sorted(counts.items()):
            backends.add_metric([state, routable], n)
        yield backends
        rps = GaugeMetricFamily("aryl_router_observed_rps", "Request arrival rate over each window",
                                labels=["window"])
        rps.add_metric(["short"], router.meter.short_rate(now))
        rps.add_metric(["long"], router.meter.long_rate(now))
        yield rps
        needed = router.servers_needed_now()
        if needed is not None:
            yield GaugeMetricFamily("aryl_router_demand_servers_needed",
                                    "Inference servers the load needs (static, or the latest estimate)", value=needed)
        if router.demand_reported is not None:
            yield GaugeMetricFamily("aryl_router_demand_servers_reported",
                                    "Inference servers last reported to the scheduler", value=router.demand_reported)
        yield CounterMetricFamily("aryl_router_demand_reports", "Demand reports the scheduler accepted",
                                  value=router.demand_reports)
        yield CounterMetricFamily("aryl_router_requests_arrived", "Requests that arrived to be proxied",
                                  value=router.requests_arrived)
        yield CounterMetricFamily("aryl_router_requests_short",
                                  "Requests that arrived while fewer servers were SERVING than the load needs "
                                  "(aryl_router_demand_servers_needed)", value=router.requests_short)
        yield GaugeMetricFamily("aryl_router_serving_servers", "Backends SERVING in the pool",
                                value=router.pool.serving)
        if router.plane is not None:
            yield from self._haproxy(router)

    @staticmethod
    def _haproxy(router: Router) -> Iterator[Metric]:
        assert router.plane is not None
        sample = router.plane.last_sample
        if sample is not None:
            requests = CounterMetricFamily("aryl_router_requests", "Requests for the pool, by answer status class "
                                           "(HAProxy's counters)", labels=["code"])
            for code, n in sample.responses.items():
                if n:
                    requests.add_metric([code], n)
            yield requests
            avg = GaugeMetricFamily("aryl_router_haproxy_avg_seconds",
                                    "HAProxy's average times over its last 1024 requests", labels=["phase"])
            for phase, ms in sample.avg_ms.items():
                avg.add_metric([phase], ms / 1000)
            yield avg
        yield GaugeMetricFamily("aryl_router_queued", "Requests waiting in HAProxy's queue", value=router.queued)
        yield CounterMetricFamily("aryl_router_haproxy_restarts", "Times the router restarted a dead HAProxy",
                                  value=router.plane.restarts)
