"""The scheduler service process: the composition root that builds and wires every part, serves until
stopped, and shuts down gracefully.

``SchedulerService.run()`` serves until ``stop()``; ``serve_in_background(config)`` runs one in a
thread (tests, the demo). It builds the use cases (``app``), the policy, the leadership, the
post-commit fan-outs and the servicers; ``grpc_server`` puts them on a gRPC server (asyncio) with
health checking and server reflection, and ``service_loops`` runs the scheduling cycles, liveness
sweeps and event pruning beside the RPCs. Where asked (``server.desired_state_port``), the agents' desired-state streams
are served by a process of their own too (``scheduler_service.push_process``), fed after each commit, so that
a push never waits for this process's interpreter lock. What this module must never do: decide anything or hold
SQL (it wires what does).

On PostgreSQL several schedulers may share the database (``docs/ha.md``): each starts as a standby
and the one that takes the leader lease leads (``app.lease``, on a thread of its own); a standby
serves every Aryl RPC as UNAVAILABLE naming the leader (``api.leader_gate``) and runs no cycle,
liveness sweep or pruning; a leader that steps down becomes a standby again. SQLite keeps today's
single scheduler: each start is a new term, with no lease and no fence (two schedulers on one SQLite
file are not supported).
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy.exc
import structlog
from grpc_health.v1 import health_pb2
from sqlalchemy.engine import make_url

from aryl_common.entry import BadInput, Unreachable, one_line
from aryl_common.metrics import MetricsEndpoint, serve_metrics
from aryl_common.security import ClientSecurity
from migrations import upgrade
from scheduler_service.api.agent_logs import AgentLogReader
from scheduler_service.api.agent_servicer import AgentServicer
from scheduler_service.api.inference_servicer import InferenceServicer
from scheduler_service.api.leader_gate import LeaderGate
from scheduler_service.api.scheduler_servicer import SchedulerServicer, event_topics
from scheduler_service.api.stream_limits import StreamLimits
from scheduler_service.app import SchedulerApp
from scheduler_service.app.deadlines import DeadlineAdmission
from scheduler_service.app.demand_forecast import DemandForecastInfo, LiveDemandForecast
from scheduler_service.app.forecast import ForecastProcess, Forecasts
from scheduler_service.app.lease import Leadership
from scheduler_service.app.replicas import Replicas
from scheduler_service.clock import SystemClock
from scheduler_service.config import SchedulerConfig
from scheduler_service.core.apply_rules import ApplySettings
from scheduler_service.core.clock import Clock
from scheduler_service.core.params import PolicyParams
from scheduler_service.cycle import SchedulingCycle
from scheduler_service.group_commit import GroupCommitter
from scheduler_service.grpc_server import SERVICE_NAMES, add_services, bind_servers, watch_committer
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.notify.notifier import AsyncNotifier
from scheduler_service.policies import create_policy
from scheduler_service.push_process import FeedingNotifier, PushProcess
from scheduler_service.service_loops import ServiceLoops
from scheduler_service.solvers import warm_up as warm_up_solvers
from scheduler_service.store import lease as lease_store
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import AUTOVACUUM_OFF, autovacuum_off, create_engine_for, session_factory
from scheduler_service.store.inference import DemandRules
from scheduler_service.store.transactions import Transactions
from scheduler_service.write_behind import LatestWriter
from simulator.forecast import SimulatorForecastEngine

log = structlog.get_logger("aryl.scheduler")

class DatabaseUnreachable(Unreachable):
    """The database of ``database.url`` cannot be reached or opened (exit 3)."""


def displayed_url(url: str) -> str:
    """A database URL fit for a message: its password hidden (as given when it does not parse)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sqlalchemy.exc.ArgumentError:
        return url


@contextmanager
def reaching_database(url: str) -> Iterator[None]:
    """Turns SQLAlchemy's failure to connect (server down, database missing, file not openable) into
    DatabaseUnreachable, whose one line names the database (password hidden) and what to check."""
    try:
        yield
    except (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError) as exc:
        cause = one_line(str(exc.orig)) if exc.orig is not None else one_line(str(exc))
        raise DatabaseUnreachable(
            f"cannot reach the database {displayed_url(url)}: {cause}; check database.url (--database-url, "
            "ARYL_DATABASE__URL) and that the database exists and its server is running"
        ) from exc


class SchedulerService:
    def __init__(self, config: SchedulerConfig, *, tune_gc: bool = False, clock: Clock | None = None) -> None:
        """``tune_gc``: the service owns its process (``aryl-scheduler``), so it may tune the garbage
        collector for it (``tune_garbage_collector``); not for a service inside another program.
        ``clock``: the system's unless given (tests jump its wall time, ``tests/chaos``)."""
        self.config = config
        self._tune_gc = tune_gc
        # The desired-state streams' own process (``server.desired_state_port``; None: this process serves them
        # alone), started in ``run``. Off by default: at a load average of 11-16 on 2 cores it measured no better
        # than one process (benchmarks/README.md, ``agent_fleet``).
        self.push_process: PushProcess | None = None
        if config.server.desired_state_port >= 0:
            self.push_process = PushProcess(config, config.server.listen.rsplit(":", 1)[0],
                                            config.server.desired_state_port)
        self.clock: Clock = clock or SystemClock()
        # Fail fast on an unknown name or a bad tunable.
        missing = config.security.missing()
        if missing:
            raise BadInput(f"{', '.join(missing)} must be set for TLS and identities ('arylctl certs init DIR' makes "
                           "them and prints the settings; docs/security.md), or start without both: aryl-scheduler "
                           "--insecure (or ARYL_SECURITY__INSECURE=true, security.insecure = true; development only)")
        self.policy_params = PolicyParams(**config.policy.model_dump())
        self.policy = create_policy(config.scheduling.policy, self.policy_params)
        # The inference demand's forecast (``app.demand_forecast``): one per process, fed by its scheduling
        # cycles. It lives as long as the process, across its leadership terms; a scheduler that becomes the
        # leader starts from the history it learned itself -- empty if it never led (nothing is stored).
        self.demand_forecast = LiveDemandForecast(config.demand_forecast.settings())
        self.engine = create_engine_for(
            config.database.url,
            statement_timeout_ms=config.database.statement_timeout_ms,
            lock_timeout_ms=config.database.lock_timeout_ms,
            transaction_timeout_ms=config.database.transaction_timeout_ms,
            pool_size=config.database.pool_size,
        )
        self.port: int | None = None
        self.group_committers: tuple[GroupCommitter[Any, Any], ...] = ()  # SubmitJob's and CancelJob's, once running
        self.stream_limits: StreamLimits | None = None  # the open watch streams, once running
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Prometheus metrics on a registry of their own (scheduler_service.metrics), served on [metrics] port.
        self.metrics = SchedulerMetrics(Transactions(session_factory(self.engine), publish=lambda states: None).read)
        self.metrics_endpoint: MetricsEndpoint | None = None
        self.gate = LeaderGate()
        # PostgreSQL: the leader lease (None on SQLite, and until ``run`` set it up).
        self.leadership: Leadership | None = None
        # PostgreSQL: this replica in the registry of replicas, beating on the lease thread (``app.replicas``).
        self.replicas: Replicas | None = None
        self._lease_stop: threading.Event | None = None  # ends the lease thread (``stop_leading``)

    async def run(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stop = asyncio.Event()
        # The port first, then the database, and only then the term: a start that cannot serve
        # (address taken) or cannot reach its database fails before it writes SCHEDULER_STARTED.
        server = bind_servers(cfg, self.gate)
        self.port = server.port
        # The lease is renewed on a thread of its own from the moment it is taken: what follows (the
        # solvers' warm-up, setting up the services) may take longer than a lease on a loaded machine.
        lease_stop = self._lease_stop = threading.Event()
        lease_thread: threading.Thread | None = None
        try:
            self.metrics_endpoint = serve_metrics(self.metrics.registry, cfg.metrics)
            with reaching_database(cfg.database.url):
                if cfg.database.auto_migrate:
                    await asyncio.to_thread(upgrade, cfg.database.url)
                notifier = AsyncNotifier(loop)
                push = self.push_process
                app = SchedulerApp(
                    session_factory(self.engine), self.clock,
                    notifier=notifier if push is None else FeedingNotifier(notifier, push.feed),
                    master_ports=cfg.scheduling.master_ports, telemetry_write_s=cfg.agents.telemetry_write_s,
                    apply_settings=ApplySettings.of(self.policy_params),
                    deadline_admission=DeadlineAdmission(cfg.scheduling.deadline_admission),
                    amdahl_alpha=self.policy_params.amdahl_alpha,
                    priority_classes=cfg.scheduling.priority_classes,
                    gpu_speeds=cfg.scheduling.gpu_speeds,
                    demand_rules=DemandRules(cfg.inference.demand_ttl_s, cfg.inference.demand_combine),
                )
                if self.engine.dialect.name == "postgresql":
                    leadership = self.leadership = self._leadership(app, loop)
                    await asyncio.to_thread(leadership.step)  # alone, or restarted on its address: leads at once
                    epoch = leadership.epoch
                    lease_thread = threading.Thread(target=leadership.run, args=(lease_stop,), name="aryl-lease",
                                                    daemon=True)
                    lease_thread.start()
                    # Only now: the leadership names every new connection after this scheduler, so that a
                    # successor can end its sessions; one opened before would stay in the pool unnamed.
                    if await asyncio.to_thread(autovacuum_off, self.engine):
                        log.warning(AUTOVACUUM_OFF)
                else:
                    epoch = await asyncio.to_thread(app.term.start, socket.gethostname())
        except BaseException:
            await self._stop_lease(lease_stop, lease_thread)
            self._close_policy()
            await server.stop(None)  # gives the port back
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.close()
            self.engine.dispose()
            if self.leadership is not None:
                self.leadership.close()
            raise
        try:
            await asyncio.to_thread(warm_up_solvers)  # the first cycle must not pay numba's compile time
        except BaseException:
            await self._stop_lease(lease_stop, lease_thread)
            raise
        if push is not None:
            push.feed.leading(self._leading())  # a standby's push process follows the leader on the change feed
            try:
                await asyncio.to_thread(push.start)
            except Exception as exc:  # noqa: BLE001 - this process serves the streams alone, as without one
                log.error("the desired-state streams' own process did not start; the scheduler serves them alone",
                          error=repr(exc))
                await asyncio.to_thread(push.close)
                push = self.push_process = None
        if self._tune_gc:
            tune_garbage_collector()
        executor = ThreadPoolExecutor(max_workers=cfg.server.worker_threads, thread_name_prefix="aryl-rpc")
        # One read per burst of decisions feeds every agent stream (scheduler_service.notify),
        # on a thread of its own: a push must not queue behind 100s of status reports.
        desired_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aryl-desired")
        notifier.serve_desired_states(app.agents.desired_states, desired_reader, app.agents.desired_generations)
        # Event and serving-pool streams: one read per change feeds all of them, however many, on a
        # thread of its own; an idle stream reads nothing (scheduler_service.notify).
        watch_reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aryl-watch")
        notifier.serve_event_log(lambda after, limit: app.views.events_after(after, limit=limit),
                                 app.views.last_event_id, watch_reader, recheck_s=cfg.events.watch_recheck_s,
                                 topics=event_topics, capacity=cfg.events.watch_buffer,
                                 stream_buffer=cfg.events.watch_stream_buffer)
        notifier.serve_serving_pool(app.inference.serving_pool, watch_reader, recheck_s=cfg.events.watch_recheck_s,
                                    key=lambda pool: pool[1])
        stream_limits = self.stream_limits = StreamLimits(
            per_client=cfg.server.max_watch_streams_per_client, total=cfg.server.max_watch_streams,
            per_principal=cfg.server.max_watch_streams_per_principal, reserved=cfg.server.max_watch_streams_reserved)
        # Telemetry-only status reports are written behind their answers, on a thread of their own: a
        # report never holds an RPC thread for a write that decides nothing (``app.agents``).
        # Many at a time (``Agents.write_behind_many``), gathered for a moment: telemetry written every
        # ``telemetry_write_s`` may wait a quarter of that more (at most a second) to share a transaction.
        telemetry_writer = LatestWriter(
            app.agents.write_behind, key=lambda item: item.server_id, name="aryl-telemetry",
            write_many=app.agents.write_behind_many, batch=TELEMETRY_BATCH,
            gather_s=min(1.0, cfg.agents.telemetry_write_s / 4))
        app.agents.write_telemetry_behind(telemetry_writer)
        self.metrics.telemetry_backlog.set_function(telemetry_writer.backlog)
        submissions = GroupCommitter(app.jobs.submit_many, max_group=256, name="aryl-submit")
        cancellations = GroupCommitter(app.jobs.cancel_many, max_group=256, name="aryl-cancel")
        # The ETA forecast after cycles, on a thread of its own (``app.forecast``); what-if on request.
        # Its simulation in a process of its own: a long queue's forecast must not take the RPCs' interpreter lock.
        # The engine is the simulator's (this module is the one of the service that imports the simulator).
        forecast_engine = SimulatorForecastEngine()
        forecast_process = ForecastProcess(forecast_engine)
        forecasts = Forecasts(lambda: app.cluster.snapshot(seed=cfg.scheduling.seed), self.clock,
                              policy=cfg.scheduling.policy, params=self.policy_params, engine=forecast_engine,
                              min_gap_s=cfg.scheduling.forecast_interval_s, run=forecast_process)
        forecast_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aryl-forecast")
        sec = cfg.security
        log_reader = AgentLogReader(timeout_s=cfg.agents.rpc_timeout_s, security=ClientSecurity(
            insecure=sec.insecure, ca_file=sec.tls_client_ca, cert_file=sec.tls_cert, key_file=sec.tls_key))
        replicas = self.replicas if cfg.server.desired_state_port >= 0 else None
        agents = AgentServicer(app, executor, notifier, report_interval_s=cfg.agents.report_interval_s,
                               desired_state_refresh_s=cfg.agents.desired_state_refresh_s,
                               grace_period_s=cfg.scheduling.default_grace_period_s,
                               endpoint_allow=cfg.inference.endpoint_allow,
                               desired_state_port=(lambda: None) if push is None else (lambda: push.port),
                               # A live standby's process first (``app.replicas``): it follows this scheduler's
                               # commits on the change feed, which is announced only where the port is on.
                               desired_state_address=(lambda server_id: None) if replicas is None
                               else replicas.push_address_for)
        if push is not None:
            # Its agents' states are read by the push process after commit, not inside the decision's transaction.
            app.agents.read_in_transaction_only(agents.watching)
        if cfg.server.desired_state_port >= 0:
            # Every replica's push process follows this scheduler's decisions when it leads (``store.change_feed``):
            # the key, not this replica's own process, decides (if that one did not start, the others' still listen).
            app.agents.announce_changes()
        health_servicer = add_services(
            server,
            SchedulerServicer(app, executor, notifier, policy_name=self.policy.name, clock_now=self.clock.now,
                              submissions=submissions, cancellations=cancellations,
                              policy=self.policy, policy_params=self.policy_params, log_reader=log_reader,
                              stream_limits=stream_limits, forecasts=forecasts,
                              allow_loader_env=cfg.security.allow_loader_env, gpu_speeds=cfg.scheduling.gpu_speeds,
                              demand_forecast=self._demand_outlook, replicas=self.replicas),
            agents,
            InferenceServicer(app, executor, notifier, stream_limits=stream_limits),
        )
        await server.start()
        for name in ("", *SERVICE_NAMES):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.group_committers = (submissions, cancellations)
        for committer in self.group_committers:
            watch_committer(committer, health_servicer, loop, stopping=self._stopping)
        cycle = SchedulingCycle(app.cluster, self.policy, self.clock, seed=cfg.scheduling.seed,
                                forecaster=self.demand_forecast)
        # The cycle on a thread of its own: it never waits for a free RPC thread behind a burst of
        # status reports, and cycles never overlap (one decides at a time).
        cycle_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aryl-cycle")
        loops = ServiceLoops(cfg, self.clock, leading=self._leading, metrics=self.metrics,
                             demand_outlook=self._demand_outlook)
        cycle_task = asyncio.create_task(loops.cycles(cycle, notifier, cycle_thread, forecasts, forecast_thread))
        liveness_task = asyncio.create_task(loops.liveness(app.liveness, executor))
        retention_task = asyncio.create_task(loops.retention(app.retention, executor))
        log.info("scheduler started", listen=cfg.server.listen, port=self.port, epoch=epoch,
                 role="leader" if self._leading() else "standby", policy=self.policy.name,
                 database=self.engine.url.render_as_string(hide_password=True))
        self._started.set()
        await self._stop.wait()

        log.info("scheduler stopping", grace_s=cfg.server.shutdown_grace_s)
        await health_servicer.enter_graceful_shutdown()
        cycle_task.cancel()
        liveness_task.cancel()
        retention_task.cancel()
        await server.stop(cfg.server.shutdown_grace_s)
        for task in (cycle_task, liveness_task, retention_task):
            try:
                await task
            except asyncio.CancelledError:
                pass
        await asyncio.to_thread(telemetry_writer.close)  # what waits is written while this scheduler leads
        if push is not None:
            await asyncio.to_thread(push.close)
        if self.leadership is not None and lease_thread is not None:
            await self._stop_lease(lease_stop, lease_thread)
            if self.replicas is not None:  # no longer named to agents (its push process has ended)
                await asyncio.to_thread(self.replicas.leave)
            self.leadership.close()
        await log_reader.close()
        submissions.close()
        cancellations.close()
        executor.shutdown(wait=True, cancel_futures=True)
        cycle_thread.shutdown(wait=True, cancel_futures=True)
        # The process first: it was started from the forecast thread and is killed when that thread ends.
        await asyncio.to_thread(forecast_process.close)
        forecast_thread.shutdown(wait=True, cancel_futures=True)
        desired_reader.shutdown(wait=True, cancel_futures=True)
        watch_reader.shutdown(wait=True, cancel_futures=True)
        await asyncio.to_thread(self._close_policy)
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.engine.dispose()
        log.info("scheduler stopped")

    async def _stop_lease(self, stop: threading.Event, thread: threading.Thread | None) -> None:
        """End the lease thread and let the lease lapse now (nothing writes any more: a standby may lead)."""
        if self.leadership is None or thread is None:
            return
        stop.set()
        await asyncio.to_thread(thread.join)
        await asyncio.to_thread(self.leadership.release)

    def _close_policy(self) -> None:
        """Stop what the policy runs beside the cycles (``dl2``'s online learning thread), once no cycle runs."""
        close = getattr(getattr(self.policy, "policy", self.policy), "close", None)  # FaultsFirst wraps it
        if callable(close):
            close()

    def _leadership(self, app: SchedulerApp, loop: asyncio.AbstractEventLoop) -> Leadership:
        """The leader lease of this scheduler (PostgreSQL), on a connection pool of its own, its fence
        installed on every write of ``app``; the gate opens and closes with its terms."""
        cfg = self.config
        ms = int(cfg.ha.renew_s * 1000)
        lease_engine = create_engine_for(cfg.database.url, statement_timeout_ms=ms, lock_timeout_ms=ms,
                                         transaction_timeout_ms=int(cfg.ha.lease_s * 1000), pool_size=1)

        def elected(epoch: int) -> None:  # on the lease thread, before the gate opens
            app.liveness.begin_term()
            loop.call_soon_threadsafe(self.gate.term_began)
            app.notifier.cycle_requested()
            if self.push_process is not None:  # its streams are fed by this scheduler's commits now
                self.push_process.feed.leading(True)

        def deposed(reason: str) -> None:  # on the lease thread or an RPC thread
            if self.push_process is not None:  # its streams follow the leader's commits on the change feed
                self.push_process.feed.leading(False)
            try:
                loop.call_soon_threadsafe(self.gate.term_ended)
            except RuntimeError:
                pass  # the loop closed: the service has stopped

        me = advertised_address(cfg, self.port or 0)
        for engine in (self.engine, lease_engine):
            lease_store.tag_connections(engine, me)
        lease_db = Transactions(session_factory(lease_engine), publish=lambda states: None)
        host = me.rsplit(":", 1)[0]

        def push_address() -> str:  # where agents reach this replica's push process: its advertised host
            push = self.push_process
            port = push.port if push is not None else None
            return f"{host}:{port}" if port else ""

        replicas = self.replicas = Replicas(lease_db, self.clock, me=me, push_address=push_address,
                                            stale_s=cfg.ha.replica_stale_after_s)
        leadership = Leadership(
            lease_db, StateChanges(self.clock),
            self.clock, app.term, me=me, lease_s=cfg.ha.lease_s,
            renew_s=cfg.ha.renew_s, on_elected=elected, on_deposed=deposed, close=lease_engine.dispose,
            heartbeat=replicas.beat,
        )
        app.term.fence_writes(leadership.fence)
        self.gate.attach(leadership)
        return leadership

    def _demand_outlook(self) -> DemandForecastInfo | None:
        """The inference demand's forecast at the last cycle, over the policy's lead (``app.demand_forecast``)."""
        return self.demand_forecast.outlook(self.policy_params)

    def _stopping(self) -> bool:
        """Whether the service is shutting down (or not running): a group-commit worker that stops then is
        no news for health (``grpc_server.watch_committer``)."""
        return self._stop is None or self._stop.is_set()

    def _leading(self) -> bool:
        """Whether this scheduler decides: always on SQLite; while it holds the lease on PostgreSQL."""
        return self.leadership is None or self.leadership.leading

    def stop_leading(self) -> None:
        """End the lease thread now (thread-safe), whatever the rest of the shutdown is doing: the lease
        is no longer renewed or taken again, so it lapses and a standby leads. For a shutdown that overran
        (``ServerHandle.stop``): a scheduler that never finished stopping must not lead again."""
        if self._lease_stop is not None:
            self._lease_stop.set()

    def stop(self) -> None:
        """Ask a running service to shut down gracefully (thread-safe)."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:
                pass  # the loop closed meanwhile: already stopped



def advertised_address(config: SchedulerConfig, port: int) -> str:
    """This scheduler's name in the leader lease, where standbys send clients: ``ha.advertise_address``,
    else ``server.listen`` with the bound port, a wildcard host replaced by this machine's hostname."""
    if config.ha.advertise_address:
        return config.ha.advertise_address
    host = config.server.listen.rsplit(":", 1)[0]
    if host in ("", "0.0.0.0", "[::]", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


# Telemetry-only status reports written in one transaction at most (``Agents.write_behind_many``): it
# locks their jobs' rows until it commits, which a decision on one of those jobs waits for.
TELEMETRY_BATCH = 128


# Young-generation collections every this many net allocations (CPython's default is 700): a
# scheduler serving 1,000s of agents allocates protobufs and rows fast, and each collection is a
# pause of the event loop that pushes desired states. Not much higher: a young collection's pause
# grows faster than its threshold (at 50,000 they took 20-105 ms each on a 2-core machine, and
# more collector time in all than at 5,000).
GC_YOUNG_THRESHOLD = 5_000


def tune_garbage_collector() -> None:
    """Keep the garbage collector's pauses off the push path: what start-up loaded (libraries, numba's
    compiled solvers, configuration) lives as long as the process, so it is moved out of the
    collector's reach (``gc.freeze``) instead of being rescanned by every full collection, and
    young collections run less often. Measured (after the freeze) with 1,000 simulated agents over 30
    waves of 100 decisions, about 45 s: at CPython's young threshold of 700 (one run), 2,373 pauses,
    2.7 s in all, the longest 96 ms, push p99 93 ms; at 5,000 (three runs), about 200 pauses, 0.85-1.1 s
    in all, the longest 60-89 ms, push p99 69-71 ms; at 50,000 (three runs), 1.7-2.3 s in all, the
    longest 150-178 ms, push p99 101-105 ms."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


@dataclass
class ServerHandle:
    service: SchedulerService
    thread: threading.Thread
    address: str

    def stop(self, timeout_s: float = 30.0) -> None:
        """Shut the scheduler down and wait for it; one that has not stopped within ``timeout_s`` stops
        leading at once (``SchedulerService.stop_leading``) and is said so in the log, so that it cannot
        take the lease back from the schedulers after it (it had, in a test whose database went away)."""
        self.service.stop()
        self.thread.join(timeout=timeout_s)
        if self.thread.is_alive():
            self.service.stop_leading()
            log.error("the scheduler did not stop in time; its lease thread was stopped so it cannot lead again",
                      address=self.address, waited_s=timeout_s)


def serve_in_background(config: SchedulerConfig, *, ready_timeout: float = 120.0,
                        clock: Clock | None = None) -> ServerHandle:
    """Start a scheduler in a daemon thread (on ``clock``, the system's by default); returns once it
    accepts connections."""
    service = SchedulerService(config, clock=clock)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(service.run())
        except BaseException as exc:  # noqa: BLE001 - surfaced to the caller below
            errors.append(exc)
            service._started.set()

    thread = threading.Thread(target=target, name="aryl-scheduler", daemon=True)
    thread.start()
    if not service._started.wait(ready_timeout):
        raise TimeoutError("scheduler did not start in time")
    if errors:
        raise errors[0]
    host = config.server.listen.rsplit(":", 1)[0]
    return ServerHandle(service, thread, f"{host}:{service.port}")
