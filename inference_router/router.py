"""The router: an asyncio HTTP reverse proxy over the serving pool, plus the loops around it.

One event loop runs everything: the aiohttp server (every path except ``/aryl/...`` is proxied),
the pool source (the scheduler's WatchServingPool, or a static list), one active health check per
backend, one drain per DRAINING backend, and the demand loop. Ports, each replaceable in tests:
``PoolSource`` (pool.py), ``DrainReporter`` and ``DemandSink`` (``SchedulerLink`` implements all
three), and the clocks (``clock``: monotonic seconds; ``wall_clock``: epoch seconds).

Drain: when a backend turns DRAINING it gets no new request (pool.py guarantees it); once its
in-flight count reaches zero, ``ReportDrained`` is called once -- retried with backoff while the
scheduler is unreachable (``Retryable``), given up with a log line when the scheduler refuses it
(``Refused``, e.g. FAILED_PRECONDITION: the server is no longer DRAINING, the scheduler moved on).
A server that leaves the pool gets nothing at all; one that returns to SERVING cancels its drain.

Load: every proxied request counts towards the rate, including those answered 503 for want of a
backend (unserved demand is still demand); latency is measured over relayed answers only.

Router endpoints: ``GET /aryl/stats`` (JSON: backends, rates, latency, demand) and
``GET /aryl/healthz`` (the router itself is up). The router never decides loans: it reports demand.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import Protocol

import aiohttp
import structlog
from aiohttp import web

from aryl_common.backoff import Backoff
from aryl_common.metrics import MetricsConfig, serve_metrics
from inference_router.config import RouterSection, split_host_port
from inference_router.demand import DemandEstimate, DemandEstimator, LoadMeter
from inference_router.metrics import RouterMetrics
from inference_router.pool import Backend, BackendPool, PoolSource, PoolUpdate, RoutingState, StaticPoolSource
from inference_router.proxy import Outcome, forward, json_error
from inference_router.scheduler_link import Refused, Retryable, SchedulerLink

STATS_PATH = "/aryl/stats"
HEALTH_PATH = "/aryl/healthz"


class DrainReporter(Protocol):
    """Tells the scheduler a DRAINING server has nothing in flight. Raises Retryable or Refused."""

    async def report_drained(self, server_id: str) -> object: ...


class DemandSink(Protocol):
    """Takes the demand signal. Raises Retryable or Refused."""

    async def report_demand(self, servers_needed: int, observed_rps: float) -> object: ...


class Router:
    """``await start()`` binds and starts every loop; ``await stop()`` shuts down gracefully."""

    def __init__(
        self,
        config: RouterSection,
        *,
        pool_source: PoolSource,
        drain_reporter: DrainReporter | None = None,
        demand_sink: DemandSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        closers: tuple[Callable[[], object], ...] = (),
    ) -> None:
        self.config = config
        self.pool_source = pool_source
        self.drain_reporter = drain_reporter
        self.demand_sink = demand_sink
        self.clock = clock
        self.wall_clock = wall_clock
        self._closers = closers
        self.pool = BackendPool(unhealthy_after_failures=config.unhealthy_after_failures,
                                unhealthy_cooldown_s=config.unhealthy_cooldown_s)
        self.pool.listeners.append(self._on_pool_change)
        self.meter = LoadMeter(config.short_window_s, config.long_window_s, started_at=clock())
        measured = config.servers_needed is None and bool(config.server_capacity_rps)
        self.estimator = DemandEstimator(config) if measured else None
        self.last_estimate: DemandEstimate | None = None
        self.demand_reported: int | None = None
        self.demand_reports = 0
        self.drains_reported: list[str] = []
        self.responses_failed = 0      # answers the router made up (502/503/504) or aborted
        # Requests that arrived, and those that arrived while the serving pool held fewer SERVING servers than
        # the router's current servers_needed (``servers_needed_now``): the live form of the simulator's
        # requests_short_share, which policy.inference_short_budget bounds.
        self.requests_arrived = 0
        self.requests_short = 0
        self.retries = 0
        self.in_flight = 0
        self._log = structlog.get_logger("inference_router").bind(source=config.source)
        self._health_tasks: dict[str, asyncio.Task[None]] = {}
        self._drain_tasks: dict[str, asyncio.Task[None]] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.address: tuple[str, int] | None = None
        self._stopped = False
        self._pool_known = asyncio.Event()  # set by the first pool update
        self.metrics = RouterMetrics(self)  # served by ``serve`` ([metrics] port)

    @classmethod
    def from_config(cls, config: RouterSection, **ports: object) -> Router:
        """The router the config describes: a scheduler link when an address is set, static backends if listed."""
        if not config.scheduler_address:
            return cls(config, pool_source=StaticPoolSource(config.static_backends), **ports)  # type: ignore[arg-type]
        link = SchedulerLink(config.scheduler_address, source=config.source, rpc_timeout_s=config.rpc_timeout_s,
                             max_backoff_s=config.reconnect_max_backoff_s, security=config.client_security())
        source: PoolSource = StaticPoolSource(config.static_backends) if config.static_backends else link
        return cls(config, pool_source=source, drain_reporter=link, demand_sink=link, closers=(link.close,),
                   **ports)  # type: ignore[arg-type]

    @property
    def demand_mode(self) -> str:
        """``off`` (no scheduler to tell), ``static`` (router.servers_needed) or ``measured``."""
        if self.demand_sink is None:
            return "off"
        return "static" if self.estimator is None else "measured"

    @property
    def url(self) -> str:
        assert self.address is not None, "not started"
        return f"http://{self.address[0]}:{self.address[1]}"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=cfg.backend_connections,
                                         keepalive_timeout=cfg.keepalive_timeout_s)
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            timeout=aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s,
                                          sock_read=cfg.request_timeout_s),
        )
        app = web.Application(client_max_size=0)
        app.router.add_get(STATS_PATH, self._stats)
        app.router.add_get(HEALTH_PATH, self._own_health)
        app.router.add_route("*", "/{tail:.*}", self._proxy)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=cfg.shutdown_timeout_s)
        await self._runner.setup()
        host, port = split_host_port(cfg.listen)
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        bound = self._runner.addresses[0]
        self.address = (host, bound[1])
        self._loops.append(asyncio.create_task(self._run_pool_source(), name="pool-source"))
        if self.demand_sink is not None:
            self._loops.append(asyncio.create_task(self._demand_loop(), name="demand"))
        self._log.info("router listening", url=self.url, demand=self.demand_mode,
                       backends="static" if isinstance(self.pool_source, StaticPoolSource) else "scheduler")

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (``shutdown_timeout_s``), then stop the loops.
        Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self._runner is not None:
            await self._runner.cleanup()
        tasks = [*self._loops, *self._health_tasks.values(), *self._drain_tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
        for close in self._closers:
            result = close()
            if asyncio.iscoroutine(result):
                await result
        self._log.info("router stopped", demand_reports=self.demand_reports)

    async def _run_pool_source(self) -> None:
        while True:
            try:
                await self.pool_source.run(self._apply_pool)
            except Exception:  # noqa: BLE001 - a bug in a source must not leave the router deaf to pool changes
                self._log.exception("the pool source failed; routing to the last known pool and restarting it")
            await asyncio.sleep(self.config.reconnect_max_backoff_s)

    def _apply_pool(self, update: PoolUpdate) -> None:
        self.pool.apply(update)
        if not self._pool_known.is_set():
            self._pool_known.set()
            if self.estimator is not None:  # measured demand starts from what serves now
                serving = sum(1 for m in update.members if m.state is RoutingState.SERVING)
                self.estimator.hold_at_least(self.clock(), max(serving, self.config.min_servers))

    # -- pool changes: health checks and drains ----------------------------------------------------

    def _on_pool_change(self, backend: Backend, previous: RoutingState | None, gone: bool) -> None:
        sid = backend.server_id
        if gone:
            self._log.info("backend left the pool; it gets no more requests", server_id=sid,
                           endpoint=backend.endpoint, in_flight=backend.in_flight)
            self._cancel(self._health_tasks, sid)
            self._cancel_drain(backend)
            return
        if previous is None:
            self._log.info("backend joined the pool", server_id=sid, endpoint=backend.endpoint,
                           state=backend.state.value)
            if self.config.health_check_interval_s > 0:
                self._health_tasks[sid] = asyncio.create_task(self._health_loop(backend), name=f"health-{sid}")
        else:
            self._log.info("backend changed state", server_id=sid, state=backend.state.value,
                           previous=previous.value, in_flight=backend.in_flight)
        if backend.state is RoutingState.DRAINING and sid not in self._drain_tasks:
            self._drain_tasks[sid] = asyncio.create_task(self._drain(backend), name=f"drain-{sid}")
        elif backend.state is RoutingState.SERVING:
            self._cancel_drain(backend)

    @staticmethod
    def _cancel(tasks: dict[str, asyncio.Task[None]], sid: str) -> None:
        task = tasks.pop(sid, None)
        if task is not None:
            task.cancel()

    def _cancel_drain(self, backend: Backend) -> None:
        """Call a drain off -- unless its ReportDrained is on the wire: the scheduler usually publishes
        the server's next state before its answer arrives, and the answer must still be recorded.
        The drain loop itself stops retrying once the server is no longer DRAINING."""
        if not backend.reporting_drained:
            self._cancel(self._drain_tasks, backend.server_id)

    async def _drain(self, backend: Backend) -> None:
        sid = backend.server_id
        try:
            await backend.idle.wait()
            if self.drain_reporter is None:
                self._log.info("backend drained (no scheduler to tell)", server_id=sid)
                return
            backoff = Backoff.capped(self.config.reconnect_max_backoff_s)
            while not backend.left_pool and backend.state is RoutingState.DRAINING:
                backend.reporting_drained = True
                try:
                    state = await self.drain_reporter.report_drained(sid)
                except Retryable as exc:
                    backend.reporting_drained = False
                    delay = backoff.next_delay()
                    self._log.warning("ReportDrained failed; retrying", server_id=sid, error=str(exc),
                                      retry_in_s=round(delay, 2))
                    await asyncio.sleep(delay)
                    continue
                except Refused as exc:
                    self._log.info("ReportDrained refused: the scheduler moved on", server_id=sid, error=str(exc))
                    return
                finally:
                    backend.reporting_drained = False
                backend.drained_reported = True
                self.drains_reported.append(sid)
                self._log.info("backend drained and reported", server_id=sid, state_after=state)
                return
        finally:
            if self._drain_tasks.get(sid) is asyncio.current_task():
                del self._drain_tasks[sid]

    async def _health_loop(self, backend: Backend) -> None:
        cfg = self.config
        timeout = aiohttp.ClientTimeout(total=cfg.health_check_timeout_s)
        while True:
            assert self._session is not None
            try:
                async with self._session.get(backend.url + cfg.health_path, timeout=timeout) as response:
                    await response.read()
                    ok, why = 200 <= response.status < 300, f"HTTP {response.status}"
            except (aiohttp.ClientError, TimeoutError) as exc:
                ok, why = False, type(exc).__name__
            if ok != backend.active_ok:
                (self._log.info if ok else self._log.warning)(
                    "backend health check " + ("passes again" if ok else "fails"),
                    server_id=backend.server_id, endpoint=backend.endpoint, result=why)
            backend.active_ok = ok
            await asyncio.sleep(cfg.health_check_interval_s)

    # -- the proxy ---------------------------------------------------------------------------------

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        started = self.clock()
        response = await self._route(request)
        self.metrics.request_done(response.status, self.clock() - started)
        return response

    async def _route(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        started = self.clock()
        self.meter.record_arrival(started)
        self.requests_arrived += 1
        needed = self.servers_needed_now()
        if needed is not None and self.pool.serving < needed:
            self.requests_short += 1
        self.in_flight += 1
        tried: set[str] = set()
        errors: list[str] = []
        try:
            for _ in range(self.config.max_attempts):
                backend = self.pool.pick(self.clock(), tried)
                if backend is None:
                    break
                self.pool.begin(backend)          # no await between pick and begin
                tried.add(backend.server_id)
                if len(tried) > 1:
                    self.retries += 1
                try:
                    attempt = await forward(self._session, request, backend.url)
                finally:
                    self.pool.end(backend)
                if attempt.outcome in (Outcome.OK, Outcome.CLIENT_GONE):
                    self.pool.record_success(backend)
                    self.meter.record_latency(self.clock(), self.clock() - started)
                    assert attempt.response is not None
                    return attempt.response
                self.pool.record_failure(backend, self.clock())
                errors.append(f"{backend.server_id}: {attempt.error}")
                self._log.warning("backend request failed", server_id=backend.server_id,
                                  outcome=attempt.outcome.value, error=attempt.error)
                if attempt.outcome is Outcome.ABORTED:
                    self.responses_failed += 1
                    assert attempt.response is not None
                    return attempt.response
                if attempt.outcome is Outcome.FAILED:
                    self.responses_failed += 1
                    if attempt.timed_out:
                        return json_error(504, "backend_timeout",
                                          f"the backend sent nothing for {self.config.request_timeout_s} s; not "
                                          "retried because the backend may have acted on the request", attempts=errors)
                    return json_error(502, "backend_failed",
                                      "the backend's connection broke after the request was sent; not retried "
                                      "because the backend may have acted on it", attempts=errors)
            self.responses_failed += 1
            if not tried:
                return json_error(503, "no_backend_available", self.pool.why_none_routable(self.clock()))
            return json_error(502, "backend_unreachable",
                              f"no backend could be reached ({len(tried)} tried)", attempts=errors)
        finally:
            self.in_flight -= 1

    # -- demand ------------------------------------------------------------------------------------

    def servers_needed_now(self) -> int | None:
        """What the router holds the load to need now: ``router.servers_needed`` (static), else the latest
        estimate (after hysteresis: what it reports); None before the first estimate."""
        if self.estimator is None:
            return self.config.servers_needed
        return self.last_estimate.servers_needed if self.last_estimate else None

    def evaluate_demand(self) -> tuple[int, float]:
        """``(servers_needed, observed_rps)`` now: static, or from the meter through the estimator."""
        now = self.clock()
        short, long = self.meter.short_rate(now), self.meter.long_rate(now)
        if self.estimator is None:
            assert self.config.servers_needed is not None
            return self.config.servers_needed, short
        self.last_estimate = self.estimator.evaluate(now, self.wall_clock(), short, long)
        return self.last_estimate.servers_needed, short

    async def _demand_loop(self) -> None:
        assert self.demand_sink is not None
        cfg = self.config
        backoff = Backoff.capped(cfg.reconnect_max_backoff_s)
        last_at = -math.inf
        retry_at = -math.inf
        if self.estimator is not None:
            await self._pool_known.wait()  # measured demand needs to know what serves (hold_at_least)
        while True:
            needed, rps = self.evaluate_demand()
            now = self.clock()
            due = needed != self.demand_reported or now - last_at >= cfg.report_interval_s
            if due and now >= retry_at:
                try:
                    response = await self.demand_sink.report_demand(needed, rps)
                except (Retryable, Refused) as exc:
                    retry_at = now + backoff.next_delay()
                    self._log.warning("demand report failed; retrying with backoff", error=str(exc),
                                      attempt=backoff.failures)
                else:
                    changed = needed != self.demand_reported
                    (self._log.info if changed or backoff.failures else self._log.debug)(
                        "demand reported", servers_needed=needed, observed_rps=round(rps, 2),
                        servers_serving=getattr(response, "servers_serving", None))
                    backoff.reset()
                    self.demand_reported, last_at = needed, now
                    self.demand_reports += 1
            await asyncio.sleep(min(cfg.evaluate_interval_s, cfg.report_interval_s))

    # -- router endpoints --------------------------------------------------------------------------

    async def _own_health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.json_response(self.stats())

    def stats(self) -> dict[str, object]:
        now = self.clock()
        p50, p99 = self.meter.latency_percentiles(now, 50, 99)
        estimate = self.last_estimate
        return {
            "pool_version": self.pool.version,
            "backends": [
                {
                    "server_id": b.server_id,
                    "endpoint": b.endpoint,
                    "state": b.state.value,
                    "routable": b.routable(now),
                    "healthy": b.healthy(now),
                    "health_check_ok": b.active_ok,
                    "ejected_for_s": round(max(0.0, b.ejected_until - now), 3) if b.ejected_until else 0.0,
                    "in_flight": b.in_flight,
                    "requests": b.requests,
                    "failures": b.failures,
                    "drained_reported": b.drained_reported,
                }
                for b in sorted(self.pool.backends.values(), key=lambda b: b.server_id)
            ],
            "requests": self.meter.total_arrivals,
            "requests_short": self.requests_short,
            "in_flight": self.in_flight,
            "responses_failed": self.responses_failed,
            "retries": self.retries,
            "rate_rps": {"short": self.meter.short_rate(now), "long": self.meter.long_rate(now),
                         "short_window_s": self.config.short_window_s, "long_window_s": self.config.long_window_s},
            "latency_ms": {"p50": None if p50 is None else p50 * 1000, "p99": None if p99 is None else p99 * 1000},
            "demand": {
                "mode": self.demand_mode,
                "servers_needed": self.servers_needed_now(),
                "servers_serving": self.pool.serving,
                "raw_need": estimate.raw_need if estimate else None,
                "forecast_rps": estimate.forecast_rate if estimate else None,
                "reported": self.demand_reported,
                "reports_sent": self.demand_reports,
            },
            "drains_reported": list(self.drains_reported),
        }


class ListenError(Exception):
    """The HTTP listen address could not be bound."""


async def serve(config: RouterSection, stop: asyncio.Event, metrics: MetricsConfig | None = None) -> None:
    """Run a router from ``config`` until ``stop`` is set, then shut it down gracefully; with
    ``metrics`` (a port), its Prometheus metrics are served meanwhile."""
    router = Router.from_config(config)
    try:
        await router.start()
    except OSError as exc:
        await router.stop()
        raise ListenError(f"cannot serve on {config.listen}: {exc.strerror or exc}") from exc
    try:
        endpoint = serve_metrics(router.metrics.registry, metrics) if metrics is not None else None
    except BaseException:
        await router.stop()
        raise
    try:
        await stop.wait()
    finally:
        await router.stop()
        if endpoint is not None:
            endpoint.close()

