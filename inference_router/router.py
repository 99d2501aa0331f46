"""The router: the controller of the inference data plane, plus the loops around it.

The data plane (``router.data_plane``) is one of two:
- ``haproxy`` (the default): HAProxy carries every request (``inference_router.haproxy``). The router
  starts and supervises it, programs its pool over the runtime API as the serving pool changes, and reads
  its statistics every ``stats_interval_s``: the requests it received (the load, 503s included), its
  queue, the requests in flight at each server, its own 5xx answers and its average times. The router's
  own HTTP server listens on a loopback port of its own and gets only ``/aryl/...`` from HAProxy.
- ``python``: the router's own aiohttp proxy (``proxy.py``; routing and health checks: ``python_plane.py``)
  carries them, on the same event loop as everything else; for a host without HAProxy. Every path except
  ``/aryl/...`` is proxied.

One event loop runs the rest: the pool source (the scheduler's WatchServingPool, or a static list), the
health checks (python: one per backend; haproxy: HAProxy's own), one drain per DRAINING backend, and
the demand loop. Ports, each replaceable in tests: ``PoolSource`` (pool.py), ``DrainReporter`` and
``DemandSink`` (``SchedulerLink`` implements all three), and the clocks (``clock``: monotonic seconds;
``wall_clock``: epoch seconds).

Drain: when a backend turns DRAINING it gets no new request (python: pool.py guarantees it; haproxy:
its slot is set to ``drain`` before anything else is waited on); once nothing is in flight there
(python: the router's own count; haproxy: a statistics sample taken after the drain was programmed
shows no session and no queued request at its slot), ``ReportDrained`` is called once -- retried with
backoff while the scheduler is unreachable (``Retryable``), given up with a log line when the scheduler
refuses it (``Refused``, e.g. FAILED_PRECONDITION: the server is no longer DRAINING, the scheduler moved
on). A server that leaves the pool gets nothing at all; one that returns to SERVING cancels its drain.

Load: every request for the pool counts towards the rate, including those answered 503 for want of a
backend (unserved demand is still demand). Python: counted as it arrives, latency percentiles over
relayed answers. HAProxy: the pool backend's request counter, read at each sample, and HAProxy's
average times over its last 1,024 requests.

Router endpoints: ``GET /aryl/stats`` (JSON: backends, rates, latency, demand) and
``GET /aryl/healthz`` (the router itself is up: 200 once started, with a static pool routed to; 503
before). The router never decides loans: it reports demand.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from inference_router.haproxy import (
    HaproxyError,
    HaproxyListenError,
    HaproxyPlane,
    RuntimeApiError,
    StatSample,
    Wanted,
    choose_listen,
)
from inference_router.metrics import RouterMetrics
from inference_router.pool import Backend, BackendPool, PoolSource, PoolUpdate, RoutingState, StaticPoolSource
from inference_router.python_plane import health_check_loop, route_request
from inference_router.scheduler_link import Refused, Retryable, SchedulerLink
from inference_router.stats import router_stats

STATS_PATH = "/aryl/stats"
PROGRAM_TIMEOUT_S = 30.0  # the longest start() waits for HAProxy to take a static pool
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
        self.started = False
        self._pool_known = asyncio.Event()  # set by the first pool update
        # haproxy: the plane, the pool changes it has yet to get, and the counters' last values read
        self.plane: HaproxyPlane | None = None
        self.control_address: tuple[str, int] | None = None  # the router's own HTTP server (haproxy: loopback)
        self.queued = 0
        self._pool_dirty = asyncio.Event()
        self._programmed_version = 0
        self._programmed_once = asyncio.Event()  # haproxy: the first pool is in HAProxy
        self._seen_requests = 0
        self._seen_own_errors = 0
        self._seen_retries = 0
        self._absorbed_at = -math.inf
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
    def uses_haproxy(self) -> bool:
        return self.config.data_plane == "haproxy"

    @property
    def url(self) -> str:
        assert self.address is not None, "not started"
        return f"http://{self.address[0]}:{self.address[1]}"

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        """Bind, start the data plane and every loop. Raises OSError (python) or HaproxyListenError when
        the listen address cannot be bound, HaproxyError when HAProxy cannot be found or started."""
        cfg = self.config
        app = web.Application(client_max_size=0)
        app.router.add_get(STATS_PATH, self._stats)
        app.router.add_get(HEALTH_PATH, self._own_health)
        if not self.uses_haproxy:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=cfg.backend_connections,
                                             keepalive_timeout=cfg.keepalive_timeout_s)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
                timeout=aiohttp.ClientTimeout(total=None, connect=cfg.connect_timeout_s,
                                              sock_read=cfg.request_timeout_s),
            )
            app.router.add_route("*", "/{tail:.*}", self._proxy)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=cfg.shutdown_timeout_s)
        await self._runner.setup()
        # haproxy: the router's own server gets /aryl/... from HAProxy on a loopback port of its own.
        host, port = ("127.0.0.1", 0) if self.uses_haproxy else split_host_port(cfg.listen)
        site = web.TCPSite(self._runner, host, port, backlog=1024)
        await site.start()
        bound = self._runner.addresses[0]
        self.control_address = (host, bound[1])
        if self.uses_haproxy:
            listen = choose_listen(cfg.listen)
            self.plane = HaproxyPlane(cfg, listen=listen, control_port=bound[1])
            await self.plane.start()
            self.address = listen
            self._loops.append(asyncio.create_task(self.plane.run(self._on_haproxy_restart), name="haproxy"))
            self._loops.append(asyncio.create_task(self._program_loop(), name="haproxy-program"))
            self._loops.append(asyncio.create_task(self._stats_loop(), name="haproxy-stats"))
        else:
            self.address = self.control_address
        self._loops.append(asyncio.create_task(self._run_pool_source(), name="pool-source"))
        if self.demand_sink is not None:
            self._loops.append(asyncio.create_task(self._demand_loop(), name="demand"))
        if self.plane is not None and isinstance(self.pool_source, StaticPoolSource):
            # A static pool is known now: route to it before saying we listen (no 503 for the first requests).
            # The scheduler's pool comes when it comes; until then HAProxy answers 503, as the Python proxy does.
            await asyncio.wait_for(self._programmed_once.wait(), PROGRAM_TIMEOUT_S)
        self.started = True
        self._log.info("router listening", url=self.url, demand=self.demand_mode, data_plane=cfg.data_plane,
                       backends="static" if isinstance(self.pool_source, StaticPoolSource) else "scheduler")

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (``shutdown_timeout_s``), then stop the loops
        (haproxy: the loops first, since HAProxy finishes its requests on its own). Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if self.plane is not None:
            await self._cancel_loops()
            with contextlib.suppress(RuntimeApiError):   # the requests counted since the last sample
                await self.refresh_stats()
            await self.plane.stop()      # HAProxy's soft stop: no new connection, in-flight ones finish
        if self._runner is not None:
            await self._runner.cleanup()
        await self._cancel_loops()
        if self._session is not None:
            await self._session.close()
        for close in self._closers:
            result = close()
            if asyncio.iscoroutine(result):
                await result
        self._log.info("router stopped", demand_reports=self.demand_reports)

    async def _cancel_loops(self) -> None:
        tasks = [*self._loops, *self._health_tasks.values(), *self._drain_tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_pool_source(self) -> None:
        while True:
            try:
                await self.pool_source.run(self._apply_pool)
            except Exception:  # noqa: BLE001 - a bug in a source must not leave the router deaf to pool changes
                self._log.exception("the pool source failed; routing to the last known pool and restarting it")
            await asyncio.sleep(self.config.reconnect_max_backoff_s)

    def _apply_pool(self, update: PoolUpdate) -> None:
        self.pool.apply(update)
        self._pool_dirty.set()   # haproxy: the program loop takes it from here
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
            if self.config.health_check_interval_s > 0 and not self.uses_haproxy:  # HAProxy checks its own
                self._health_tasks[sid] = asyncio.create_task(health_check_loop(self, backend), name=f"health-{sid}")
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
            if self.plane is not None:
                await self.plane.wait_idle(sid)   # programmed ``drain``, then nothing in flight there
            else:
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

    # -- haproxy: programming it and reading it ----------------------------------------------------

    def wanted_in_haproxy(self) -> dict[str, Wanted]:
        return {b.server_id: Wanted(b.endpoint, "ready" if b.state is RoutingState.SERVING else "drain")
                for b in self.pool.backends.values()}

    async def _program_loop(self) -> None:
        """Give HAProxy every pool change, in order, one at a time; retried with backoff when its runtime
        API fails (the supervisor restarts a dead HAProxy and marks the pool to be given again)."""
        assert self.plane is not None
        backoff = Backoff.capped(self.config.reconnect_max_backoff_s)
        while True:
            await self._pool_dirty.wait()
            self._pool_dirty.clear()
            version = self.pool.version
            try:
                await self.plane.program(self.wanted_in_haproxy())
                self._programmed_version = version
                self._programmed_once.set()
            except Exception as exc:  # noqa: BLE001 - RuntimeApiError, or a bug: either way HAProxy must get the pool
                self._pool_dirty.set()
                delay = backoff.next_delay()
                (self._log.warning if isinstance(exc, RuntimeApiError) else self._log.exception)(
                    "programming haproxy failed; retrying", error=str(exc), retry_in_s=round(delay, 2))
                await asyncio.sleep(delay)
            else:
                backoff.reset()

    @property
    def programmed_version(self) -> int:
        """The pool version the data plane routes by (python: the pool itself; haproxy: the last one given to
        HAProxy in full)."""
        return self.pool.version if self.plane is None else self._programmed_version

    def _on_haproxy_restart(self) -> None:
        self._seen_requests = self._seen_own_errors = self._seen_retries = 0   # a new HAProxy counts from zero
        self._pool_dirty.set()

    async def _stats_loop(self) -> None:
        failures = 0
        while True:
            try:
                await self.refresh_stats()
                failures = 0
            except RuntimeApiError as exc:
                failures += 1
                if failures == 1 or failures % 100 == 0:
                    self._log.warning("reading haproxy's statistics failed", error=str(exc), failures=failures)
            await asyncio.sleep(self.config.stats_interval_s)

    async def refresh_stats(self) -> StatSample:
        """Sample HAProxy now and take what it counted since the last sample into the load meter and the
        counters. Raises RuntimeApiError."""
        assert self.plane is not None
        sample = await self.plane.sample()
        if sample.taken_at > self._absorbed_at:   # a later sample may have been absorbed first
            self._absorbed_at = sample.taken_at
            self._absorb(sample)
        return sample

    def _absorb(self, sample: StatSample) -> None:
        arrived = sample.requests - self._seen_requests
        if arrived < 0:          # HAProxy restarted between two samples: its counters started again
            arrived = sample.requests
        self._seen_requests = sample.requests
        own = sample.own_errors - self._seen_own_errors
        self._seen_own_errors = sample.own_errors
        self.responses_failed += max(0, own if own >= 0 else sample.own_errors)
        retried = sample.retries - self._seen_retries
        self._seen_retries = sample.retries
        self.retries += retried if retried >= 0 else sample.retries
        self.in_flight, self.queued = sample.in_flight, sample.queued
        if arrived:
            self.meter.record_arrivals(self.clock(), arrived)
            self.requests_arrived += arrived
            needed = self.servers_needed_now()
            # Sampled: the requests of one interval count as short when the pool is short at its end.
            if needed is not None and self.pool.serving < needed:
                self.requests_short += arrived

    def routable(self, backend: Backend, now: float) -> bool:
        """Would the next request be allowed to go to ``backend``? (haproxy: its slot is UP and ready)."""
        if self.plane is None:
            return backend.routable(now)
        slot = self.plane.slot_of(backend.server_id)
        stats = self.plane.slot_stats(backend.server_id)
        return (backend.state is RoutingState.SERVING and slot is not None and slot.state == "ready"
                and stats is not None and stats.up)

    def healthy(self, backend: Backend, now: float) -> bool:
        if self.plane is None:
            return backend.healthy(now)
        stats = self.plane.slot_stats(backend.server_id)
        return stats is not None and stats.up

    # -- the proxy ---------------------------------------------------------------------------------

    async def _proxy(self, request: web.Request) -> web.StreamResponse:
        started = self.clock()
        response = await route_request(self, request)
        self.metrics.request_done(response.status, self.clock() - started)
        return response

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
        """200 once ``start`` has returned (a static pool is routed to by then); 503 while it is starting."""
        if not self.started:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ok"})

    async def _stats(self, _request: web.Request) -> web.Response:
        if self.plane is not None:
            with contextlib.suppress(RuntimeApiError):   # the last sample, if HAProxy does not answer now
                await self.refresh_stats()
        return web.json_response(self.stats())

    def stats(self) -> dict[str, object]:
        """What ``GET /aryl/stats`` answers (``inference_router.stats``)."""
        return router_stats(self)


class ListenError(Exception):
    """The HTTP listen address could not be bound."""


class DataPlaneError(Exception):
    """The data plane (HAProxy) could not be found or started; the message says what to do."""


async def serve(config: RouterSection, stop: asyncio.Event, metrics: MetricsConfig | None = None) -> None:
    """Run a router from ``config`` until ``stop`` is set, then shut it down gracefully; with
    ``metrics`` (a port), its Prometheus metrics are served meanwhile."""
    router = Router.from_config(config)
    try:
        await router.start()
    except (OSError, HaproxyListenError) as exc:
        await router.stop()
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ListenError(f"cannot serve on {config.listen}: {why}") from exc
    except HaproxyError as exc:
        await router.stop()
        raise DataPlaneError(str(exc)) from exc
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

