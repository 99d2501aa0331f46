"""A fleet of simulated node agents against one real scheduler: status-report rate and the latency
from a scheduler decision to the agent that must act on it.

Nouns:
- A *simulated agent* is one real gRPC client over loopback, with its own channel (its own TCP
  connection): it registers one 8-GPU training server, keeps a ``WatchDesiredState`` stream open,
  and calls ``ReportStatus`` with eight GPU samples and a RUNNING status for every desired worker.
  It runs no workers; it only records when each desired-state push arrived.
- A *shard* is one process holding many agents on one asyncio loop. The fleet is split over a few
  shards so the load generator is not one GIL, and none of them is the scheduler's.
- A *decision* is a committed change to a server's desired workers: a scheduling cycle committing
  a plan that starts a job there, or a CancelJob committing the release of a job's GPUs (each
  writes the job's ``JOB_STATE_CHANGED`` event, to ``RUNNING`` or ``CANCELLED``). Its time is when
  the scheduler recorded it in its transaction (the event's time, scheduler wall clock); the rest
  of that transaction (generation bumps, the commit) counts in the latency: see ``push_latencies``.
  The time the scheduler spends deciding and applying the rest of a plan before it records a
  start does not (a plan's many starts are recorded together, near its end).
- The *push latency* of a decision is the agent's ``time.time()`` when the first desired state
  that shows the change (the job's worker appearing or disappearing) came out of its stream, minus
  the decision's time. Every process runs on this machine, so the two clocks are the same clock.

Never: import from ``tests/``, assert on timings, or touch a database it did not create.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing as mp
import os
import queue as queue_mod
import random
import resource
import signal
import statistics
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import emit_figure
from benchmarks.harness import FULL, BenchContext, Benchmark, SchedulerProcess, scratch_database
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

log = logging.getLogger("aryl.bench")

PUSH_TARGET_P99_MS = 100.0
GPUS_PER_SERVER = 8
AGENTS_PER_SHARD = 250
REFERENCE_AGENTS = 10          # the small fleet whose push latency is the reference
RPC_TIMEOUT_S = 60.0
WAVE_TIMEOUT_S = 120.0         # a wave whose pushes have not all arrived by then is reported as lost
CANCEL_IN_FLIGHT = 16


@dataclass(frozen=True)
class FleetSizes:
    agents: int              # simulated agents in the fleet (REFERENCE_AGENTS of them are the reference fleet)
    wave: int                # jobs submitted at once in each wave of the fleet's latency phase
    waves: int               # waves at the full fleet; each wave also cancels all its jobs
    reference_waves: int     # waves of REFERENCE_AGENTS jobs with only the reference fleet connected
    rate_window_s: float     # how long reports are counted at the configured interval
    saturation_window_s: float  # how long reports are counted with every agent reporting back to back


# 30 waves: a wave's 100 placements share one commit, so the p99 of only a few waves is the slowest
# wave's and swings with one unlucky commit; 30 waves (6,000 decisions) give a steadier p99.
FULL_FLEET = FleetSizes(agents=1000, wave=100, waves=30, reference_waves=20,
                        rate_window_s=30.0, saturation_window_s=15.0)
QUICK_FLEET = FleetSizes(agents=200, wave=20, waves=5, reference_waves=5,
                         rate_window_s=10.0, saturation_window_s=5.0)


def server_name(index: int) -> str:
    return f"bench-agent-{index:05d}"


# ---------------------------------------------------------------------------------------------
# One shard: many agents on one asyncio loop, in its own process


@dataclass
class _ShardState:
    mode: str = "interval"                      # "interval", "saturate" or "quiet"
    mode_changed: asyncio.Event = field(default_factory=asyncio.Event)
    report_done: list[float] = field(default_factory=list)     # completion times of accepted reports
    report_latency: list[float] = field(default_factory=list)  # their round-trip seconds
    report_errors: dict[str, int] = field(default_factory=dict)
    probe_done: list[float] = field(default_factory=list)      # completion times of health checks
    in_flight: int = 0                                          # reports sent and not yet answered


class _Agent:
    def __init__(self, index: int, address: str, shard: _ShardState, pushes: Any) -> None:
        self.server_id = server_name(index)
        self._address = address
        self._shard = shard
        self._pushes = pushes
        # Its own subchannel pool: without it gRPC would share one connection between all agents.
        self.channel = grpc.aio.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
        self._stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self._epoch = 0
        self.interval = 5.0
        self._generation = 0
        self._workers: tuple[agent_pb2.DesiredWorker, ...] = ()
        self.watching = asyncio.Event()

    async def register(self) -> None:
        reply = await self._stub.RegisterServer(agent_pb2.RegisterServerRequest(
            hostname=self.server_id, pool=types_pb2.POOL_TRAINING, agent_address=self.server_id,
            agent_version="bench",
            gpus=[agent_pb2.GpuInfo(index=i, uuid=f"GPU-{self.server_id}-{i}", model="H100",
                                    memory_total_bytes=80 << 30) for i in range(GPUS_PER_SERVER)],
        ), timeout=RPC_TIMEOUT_S, wait_for_ready=True)
        self._epoch = reply.scheduler_epoch
        self.interval = reply.report_interval.ToTimedelta().total_seconds() or 5.0

    async def watch(self) -> None:
        jobs: set[str] = set()
        call = self._stub.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=self.server_id))
        async for desired in call:
            arrived = time.time()
            self.watching.set()
            now = {w.job_id for w in desired.workers}
            for job_id in now - jobs:
                self._pushes.put(("placed", job_id, self.server_id, arrived))
            for job_id in jobs - now:
                self._pushes.put(("released", job_id, self.server_id, arrived))
            jobs = now
            self._generation = desired.generation
            self._workers = tuple(desired.workers)

    def _report(self) -> agent_pb2.ReportStatusRequest:
        return agent_pb2.ReportStatusRequest(
            server_id=self.server_id, scheduler_epoch=self._epoch, observed_generation=self._generation,
            gpus=[agent_pb2.GpuStatus(index=i, utilization=0.5, memory_used_bytes=1 << 30, temperature_c=50.0,
                                      healthy=True) for i in range(GPUS_PER_SERVER)],
            workers=[agent_pb2.WorkerStatus(job_id=w.job_id, rank=w.rank, phase=agent_pb2.WORKER_PHASE_RUNNING,
                                            incarnation=w.incarnation) for w in self._workers],
        )

    async def report_forever(self) -> None:
        shard = self._shard
        next_at = time.monotonic() + random.uniform(0, self.interval)  # agents start out of phase
        while True:
            if shard.mode != "saturate":
                delay = next_at - time.monotonic() if shard.mode == "interval" else 3600.0
                if delay > 0:
                    try:
                        await asyncio.wait_for(shard.mode_changed.wait(), delay)
                        continue  # the mode changed: look again
                    except TimeoutError:
                        pass
                next_at = max(next_at + self.interval, time.monotonic())
            sent = time.perf_counter()
            shard.in_flight += 1
            try:
                await self._stub.ReportStatus(self._report(), timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                name = exc.code().name
                shard.report_errors[name] = shard.report_errors.get(name, 0) + 1
                await asyncio.sleep(0.1)
                continue
            finally:
                shard.in_flight -= 1
            shard.report_done.append(time.time())
            shard.report_latency.append(time.perf_counter() - sent)

    async def probe_forever(self) -> None:
        """Bare health checks back to back on this agent's channel: the unary round-trip ceiling."""
        health = health_pb2_grpc.HealthStub(self.channel)
        while True:
            # The stubs (types-grpcio-health-checking) declare HealthStub without its methods.
            await health.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
            self._shard.probe_done.append(time.time())


async def _run_shard(address: str, indices: Sequence[int], control: Connection, pushes: Any) -> None:
    shard = _ShardState()
    agents = [_Agent(i, address, shard, pushes) for i in indices]
    tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()
    try:
        sem = asyncio.Semaphore(32)  # registrations in flight per shard

        async def start(agent: _Agent) -> None:
            async with sem:
                await agent.register()
            tasks.append(asyncio.create_task(agent.watch()))
            await agent.watching.wait()
            tasks.append(asyncio.create_task(agent.report_forever()))

        tasks.append(asyncio.create_task(_exit_with_parent()))
        await asyncio.gather(*(start(a) for a in agents))
        control.send(("ready", agents[0].interval))
        probes: list[asyncio.Task[None]] = []
        while True:
            command, arg = await loop.run_in_executor(None, control.recv)
            for task in tasks:  # a dead stream or reporter is a broken benchmark, not a slow one
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"an agent task failed: {task.exception()!r}")
            if command == "mode":
                shard.mode = arg
                shard.mode_changed.set()
                shard.mode_changed = asyncio.Event()
                # quiet means: no report left unanswered (a counter, with no event to wait on)
                while arg == "quiet" and shard.in_flight:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                control.send(("ok", None))
            elif command == "probe":
                probes = [asyncio.create_task(a.probe_forever()) for a in agents] if arg else probes
                if not arg:
                    for task in probes:
                        task.cancel()
                    await asyncio.gather(*probes, return_exceptions=True)
                control.send(("ok", None))
            elif command == "stats":
                control.send(("stats", (list(shard.report_done), list(shard.report_latency),
                                        dict(shard.report_errors), list(shard.probe_done))))
                shard.report_done.clear()
                shard.report_latency.clear()
                shard.probe_done.clear()
            elif command == "stop":
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.channel.close() for a in agents), return_exceptions=True)


async def _exit_with_parent() -> None:
    """A shard whose coordinator died (killed, not stopped) must not keep loading the scheduler."""
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 - nothing signals a parent's death; poll it
        await asyncio.sleep(1.0)
    os._exit(3)


def _shard_main(address: str, indices: Sequence[int], control: Connection, pushes: Any) -> None:
    try:
        asyncio.run(_run_shard(address, indices, control, pushes))
    except BaseException as exc:  # reported to the coordinator, which fails the benchmark
        try:
            control.send(("error", repr(exc)))
        except OSError:
            pass
        raise


class Fleet:
    """Shard processes under one coordinator; every process is stopped on exit, even on failure."""

    def __init__(self, address: str) -> None:
        self._address = address
        self._ctx = mp.get_context("spawn")  # never fork a process that has started gRPC
        self.pushes: Any = self._ctx.Queue()
        self._shards: list[tuple[Any, Connection]] = []
        self.agents = 0
        self.report_interval = 0.0  # what RegisterServer told the agents

    def add(self, indices: Sequence[int], *, timeout_s: float = 300.0) -> None:
        """Start shards for ``indices`` (at most AGENTS_PER_SHARD each); return once every agent is
        registered, watching and reporting."""
        started = []
        for first in range(0, len(indices), AGENTS_PER_SHARD):
            ours, theirs = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_shard_main, args=(self._address, list(indices[first:first + AGENTS_PER_SHARD]), theirs,
                                          self.pushes),
                name=f"aryl-bench-agents-{len(self._shards)}", daemon=True,
            )
            proc.start()
            theirs.close()  # the child's end: once we die, the child reads EOF
            self._shards.append((proc, ours))
            started.append(ours)
        for conn in started:
            self.report_interval = self._expect(conn, "ready", timeout_s)
        self.agents += len(indices)

    @staticmethod
    def _expect(conn: Connection, kind: str, timeout_s: float = 60.0) -> Any:
        if not conn.poll(timeout_s):
            raise TimeoutError(f"an agent shard did not answer {kind!r} within {timeout_s:.0f}s")
        got, payload = conn.recv()
        if got != kind:
            raise RuntimeError(f"an agent shard failed: {payload}")
        return payload

    def _all(self, command: str, arg: Any, kind: str) -> list[Any]:
        for _, conn in self._shards:
            conn.send((command, arg))
        return [self._expect(conn, kind) for _, conn in self._shards]

    def set_mode(self, mode: str) -> None:
        self._all("mode", mode, "ok")

    def set_probing(self, on: bool) -> None:
        self._all("probe", on, "ok")

    def stats(self) -> tuple[list[float], list[float], dict[str, int], list[float]]:
        done: list[float] = []
        latency: list[float] = []
        errors: dict[str, int] = {}
        probes: list[float] = []
        for d, lat, err, pr in self._all("stats", None, "stats"):
            done += d
            latency += lat
            probes += pr
            for name, count in err.items():
                errors[name] = errors.get(name, 0) + count
        return done, latency, errors, probes

    def close(self) -> None:
        for _proc, conn in self._shards:
            try:
                conn.send(("stop", None))
            except OSError:
                pass
        for proc, _ in self._shards:
            proc.join(timeout=10)
            if proc.is_alive():
                log.warning("agent shard pid %d did not stop; terminating it", proc.pid)
                proc.terminate()
                proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.pushes.close()
        self.pushes.join_thread()


@contextmanager
def fleet(address: str) -> Iterator[Fleet]:
    agents = Fleet(address)
    try:
        yield agents
    finally:
        agents.close()


# ---------------------------------------------------------------------------------------------
# Decisions: waves of one-server jobs, then their cancellation


def _wave_requests(count: int, tag: str) -> list[scheduler_pb2.SubmitJobRequest]:
    # One worker of every GPU of a server, inelastic: each job is one decision about one server.
    return [
        scheduler_pb2.SubmitJobRequest(spec=types_pb2.JobSpec(
            name=f"bench-{tag}-{i}", user=f"user-{i % 10}", command=["sleep", "infinity"],
            gpus_per_worker=GPUS_PER_SERVER, min_workers=1, max_workers=1,
        ))
        for i in range(count)
    ]


def _await_pushes(pushes: Any, kind: str, job_ids: set[str], arrivals: dict[tuple[str, str], float]) -> None:
    """Collect push records until every job in ``job_ids`` has one of ``kind``."""
    missing = set(job_ids)
    deadline = time.monotonic() + WAVE_TIMEOUT_S
    while missing:
        try:
            got, job_id, _server, arrived = pushes.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue_mod.Empty:
            raise TimeoutError(f"{len(missing)} of {len(job_ids)} {kind} pushes did not arrive "
                               f"within {WAVE_TIMEOUT_S:.0f}s") from None
        arrivals.setdefault((got, job_id), arrived)
        if got == kind:
            missing.discard(job_id)


def run_waves(address: str, pushes: Any, *, waves: int, size: int, tag: str) -> dict[tuple[str, str], float]:
    """Submit ``size`` jobs, wait until each one's server got it, cancel them all, wait until each
    server dropped it; ``waves`` times. Returns the first arrival of each (kind, job_id)."""
    arrivals: dict[tuple[str, str], float] = {}
    with grpc.insecure_channel(address) as channel, ThreadPoolExecutor(CANCEL_IN_FLIGHT) as pool:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        for wave in range(waves):
            replies = list(pool.map(lambda r: stub.SubmitJob(r, timeout=RPC_TIMEOUT_S),
                                    _wave_requests(size, f"{tag}{wave}")))
            job_ids = {r.job.job_id for r in replies}
            _await_pushes(pushes, "placed", job_ids, arrivals)
            list(pool.map(lambda j: stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=j, reason="bench"),
                                                   timeout=RPC_TIMEOUT_S), sorted(job_ids)))
            _await_pushes(pushes, "released", job_ids, arrivals)
    return arrivals


@dataclass(frozen=True)
class Decisions:
    """Push latencies of one phase, in seconds, per kind ("placed", "released")."""

    latency: dict[str, list[float]]
    # Per decision: how long its transaction went on after stamping the job's event (the rest of the
    # plan's apply); the latency starts after it.
    stamp_to_commit: dict[str, list[float]]

    def all(self, kinds: Sequence[str]) -> list[float]:
        return [x for k in kinds for x in self.latency[k]]


def push_latencies(engine: sa.Engine, arrivals: dict[tuple[str, str], float]) -> Decisions:
    """Push latency of every decision the agents saw: arrival minus the time it was recorded.

    That time is the latest ``time`` among the events written with the decision (rows written
    together share ``xmin``, the writing transaction's or savepoint's id; the event log is
    append-only, so ``xmin`` is the writing one). The starts of one plan are written together."""
    stamped: dict[tuple[str, str], tuple[float, str]] = {}
    last_event: dict[str, float] = {}
    with engine.connect() as conn:
        for job_id, to_state, at, xid in conn.execute(sa.text(
            "SELECT job_id, to_state, time, xmin::text FROM events"
        )):
            last_event[xid] = max(at, last_event.get(xid, at))
            if to_state in ("RUNNING", "CANCELLED") and job_id is not None:
                kind = "placed" if to_state == "RUNNING" else "released"
                stamped.setdefault((kind, str(job_id)), (at, xid))  # here a job starts and ends once
    latency: dict[str, list[float]] = {"placed": [], "released": []}
    stamp_to_commit: dict[str, list[float]] = {"placed": [], "released": []}
    for (kind, job_id), arrived in arrivals.items():
        if (kind, job_id) in stamped:
            at, xid = stamped[(kind, job_id)]
            latency[kind].append(arrived - last_event[xid])
            stamp_to_commit[kind].append(last_event[xid] - at)
    return Decisions(latency, stamp_to_commit)


def _pct_ms(samples: Sequence[float], pct: int) -> float:
    if len(samples) < 2:
        return samples[0] * 1e3 if samples else math.nan
    return statistics.quantiles(samples, n=100, method="inclusive")[pct - 1] * 1e3


def _window_rate(done: Sequence[float], start: float, end: float) -> float:
    return sum(1 for t in done if start <= t < end) / (end - start)


# ---------------------------------------------------------------------------------------------
# The benchmark


def _raise_fd_limit() -> None:
    # ~1 socket per agent on both sides; children (scheduler, shards) inherit the limit.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the fleet runs, so a killed benchmark still stops the
    scheduler and the shards and drops its database on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def agent_fleet(ctx: BenchContext) -> None:
    sizes = FULL_FLEET if ctx.sizes is FULL else QUICK_FLEET
    _raise_fd_limit()
    with _sigterm_unwinds(), scratch_database(ctx.admin_url) as url:
        engine = sa.create_engine(url, pool_size=1, max_overflow=1)
        try:
            with SchedulerProcess(url) as scheduler, fleet(scheduler.address) as agents:
                # 1. The reference: push latency with a small fleet and nothing else connected.
                agents.add(range(REFERENCE_AGENTS))
                ref = push_latencies(engine, run_waves(
                    scheduler.address, agents.pushes, waves=sizes.reference_waves, size=REFERENCE_AGENTS, tag="ref"))
                log.info("reference fleet of %d: %d pushes measured", REFERENCE_AGENTS,
                         len(ref.all(("placed", "released"))))

                # 2. The whole fleet, reporting at the interval the scheduler gave it.
                started = time.monotonic()
                agents.add(range(REFERENCE_AGENTS, sizes.agents))
                log.info("%d agents registered and watching in %.1fs", agents.agents, time.monotonic() - started)
                interval = agents.report_interval
                time.sleep(interval)  # one interval: every agent has reported once, out of phase
                agents.stats()
                window_start = time.time()
                time.sleep(sizes.rate_window_s)
                window_end = time.time()
                done, latency, errors, _ = agents.stats()
                rate = _window_rate(done, window_start, window_end)
                offered = agents.agents / interval
                log.info("interval reports: %.0f/s accepted of %.0f/s offered, errors %s", rate, offered, errors)

                # 3. Push latency at the whole fleet, the agents still reporting at their interval.
                fleet_lat = push_latencies(engine, run_waves(
                    scheduler.address, agents.pushes, waves=sizes.waves, size=sizes.wave, tag="fleet"))
                _, during_latency, errors_during, _ = agents.stats()
                log.info("reports during the pushes: errors %s", errors_during)

                # 4. Saturation: every agent reports back to back; then bare health checks the same way.
                agents.set_mode("saturate")
                time.sleep(1.0)
                agents.stats()
                sat_start = time.time()
                time.sleep(sizes.saturation_window_s)
                sat_end = time.time()
                agents.set_mode("quiet")
                sat_done, sat_latency, sat_errors, _ = agents.stats()
                saturated = _window_rate(sat_done, sat_start, sat_end)
                agents.set_probing(True)
                time.sleep(1.0)
                agents.stats()
                probe_start = time.time()
                time.sleep(sizes.saturation_window_s)
                probe_end = time.time()
                agents.set_probing(False)
                *_, probe_done = agents.stats()
                probe_rate = _window_rate(probe_done, probe_start, probe_end)
                log.info("saturated: %.0f reports/s (errors %s); bare health checks %.0f/s",
                         saturated, sat_errors, probe_rate)
        finally:
            engine.dispose()

    common = dict(agents=sizes.agents, gpus_per_server=GPUS_PER_SERVER, shards=math.ceil(
        REFERENCE_AGENTS / AGENTS_PER_SHARD) + math.ceil((sizes.agents - REFERENCE_AGENTS) / AGENTS_PER_SHARD))
    emit_figure(
        "agent_status_report_rate", rate, "reports/s", **common, report_interval_s=interval,
        window_s=sizes.rate_window_s, errors=sum(errors.values()),
        latency_p50_ms=_pct_ms(latency, 50), latency_p99_ms=_pct_ms(latency, 99),
        reference_name="offered_report_rate", reference_value=offered, reference_unit="reports/s",
    )
    emit_figure(
        "agent_status_report_saturation", saturated, "reports/s", **common, in_flight=sizes.agents,
        window_s=sizes.saturation_window_s, errors=sum(sat_errors.values()),
        latency_p50_ms=_pct_ms(sat_latency, 50), latency_p99_ms=_pct_ms(sat_latency, 99),
        reference_name="health_check_saturation", reference_value=probe_rate, reference_unit="calls/s",
    )
    for label, kinds in (("", ("placed", "released")), ("_placed", ("placed",)), ("_released", ("released",))):
        ours, theirs = fleet_lat.all(kinds), ref.all(kinds)
        for pct in (50, 99):
            emit_figure(
                f"desired_state_push_latency{label}_p{pct}", _pct_ms(ours, pct), "ms", **common,
                decisions=len(ours), wave=sizes.wave, waves=sizes.waves, max_ms=max(ours, default=math.nan) * 1e3,
                target=PUSH_TARGET_P99_MS if pct == 99 else None,
                report_latency_p99_ms=_pct_ms(during_latency, 99) if not label else None,
                stamp_to_commit_p99_ms=_pct_ms([x for k in kinds for x in fleet_lat.stamp_to_commit[k]], 99),
                reference_name=f"push_latency_{REFERENCE_AGENTS}_agents_p{pct}",
                reference_value=_pct_ms(theirs, pct), reference_unit="ms", reference_decisions=len(theirs),
            )


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("agent_fleet", agent_fleet,
              "1,000 simulated node agents over gRPC: status reports/s (interval and saturated, vs bare health "
              "checks) and decision-to-agent push latency p50/p99 (vs a 10-agent fleet)"),
)
