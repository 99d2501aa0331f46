"""The benchmarks' fake node agents: many simulated agents, in shard processes, against one real
scheduler. The ``agent_fleet`` benchmark (``benchmarks.bench_agents``) and the soak
(``benchmarks.soak``) both run this one fleet; what differs between them is a ``FleetOptions``.

Nouns:
- A *fake agent* is one real gRPC client with its own channel (its own TCP connection, and TLS
  session when it has credentials). It registers one 8-GPU server (``FakeServer``: training or
  inference), keeps a ``WatchDesiredState`` stream open (on a second channel to the port that
  ``RegisterServer`` names in its initial metadata, where the scheduler serves the streams from a
  process of their own: ``scheduler_service.push_process``), and calls ``ReportStatus`` at the interval
  ``RegisterServer`` returned, starting at a random phase, with eight GPU samples and a status for
  every desired worker. It runs no processes: a worker is only a line in its reports.
- A *shard* is one process holding many agents on one asyncio loop. The fleet is split over a few
  shards so the load is not one GIL, and none of them is the scheduler's.
- The *fleet* (``Fleet``) is the coordinator's handle on its shards: it starts them, switches how
  the agents report (``set_mode``), drains what they recorded (``drain``) and stops every process on
  exit, even on failure.

What each shard records: every accepted report's answer time and round-trip, failed calls by
``Method:CODE`` with the first message of each, bare health checks' answer times while probing,
and, where asked, each push that adds or drops a job on ``Fleet.pushes``.

Never: import from ``tests/``, run a worker process, judge what it sees (errors are counted for its
caller to judge), or keep loading the scheduler once its coordinator has died.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing as mp
import os
import random
import resource
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Literal, NamedTuple

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from aryl_common.channels import desired_state_addresses
from aryl_common.security import ClientSecurity, secure_aio_channel
from benchmarks.bench_auth import _client as client_security
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, types_pb2

log = logging.getLogger("aryl.bench")

GPUS_PER_SERVER = 8
AGENTS_PER_SHARD = 250
REGISTRATIONS_IN_FLIGHT = 32   # per shard
RPC_TIMEOUT_S = 60.0
RUN_ENV = "SOAK_RUN_S"         # a job's run time in seconds, in its environment (``workers_exit``)
INFERENCE_ENDPOINT = "http://127.0.0.1:9"  # an inference server's endpoint: the serving pool lists it; never called
RETRY_S = 1.0                  # pause before a broken stream is reopened (``rewatch``)
SATURATED_ERROR_PAUSE_S = 0.1  # pause after a failed report when reporting back to back

Pool = Literal["training", "inference"]
Mode = Literal["interval", "saturate", "quiet"]


class FakeServer(NamedTuple):
    """The server one fake agent registers."""

    server_id: str
    pool: Pool


@dataclass(frozen=True)
class FleetOptions:
    """How the fleet's agents differ between the benchmarks that run it; every default is the
    ``agent_fleet`` benchmark's."""

    # Mutual TLS with each agent's own certificate and token from this ``arylctl certs init`` folder,
    # so the scheduler's ``require_server`` runs on every report as in production (the soak). None:
    # plaintext without identities (``agent_fleet``, which measures the report path without TLS, and
    # the soak's ``--insecure``).
    pki: Path | None = None
    # What RegisterServer is told, so the scheduler's server list shows which load registered a server.
    agent_version: str = "bench"
    # A worker reports EXITED 0 once it has run for the seconds its job's ``RUN_ENV`` names, counted from
    # when its job first reached the agent, so an hour's jobs complete and the load turns over (the soak).
    # Off: every desired worker reports RUNNING until it is taken away, so each job placed is one decision
    # and its cancellation another (``agent_fleet``). A job without the variable runs until stopped either way.
    workers_exit: bool = False
    # Put ("placed" | "released", job id, server id, arrival time.time()) on ``Fleet.pushes`` for every
    # push that adds or drops a job: ``agent_fleet``'s push latency. Off for the soak, which never reads
    # them and would otherwise fill a queue for an hour.
    record_pushes: bool = True
    # A broken WatchDesiredState stream is counted as an error and reopened after RETRY_S: an hour-long
    # run rides out a transient UNAVAILABLE and leaves the summary to judge the errors (the soak). Off:
    # the agent's task fails and with it the shard, since a reopened stream would turn a lost push into
    # a late one (``agent_fleet``: a dead stream is a broken benchmark, not a slow one).
    rewatch: bool = False
    # The shard processes' names (``ps``), so a stray one says whose it is.
    process_name: str = "aryl-bench-agents"


def agent_security(pki: Path | None, server_id: str) -> ClientSecurity:
    """What the agent of ``server_id`` presents: its own certificate and token from ``pki``; nothing
    (plaintext) without one."""
    return client_security(pki, f"agent-{server_id}", server_id)


def shards_for(agents: int) -> int:
    """Shard processes that ``agents`` added at once take."""
    return math.ceil(agents / AGENTS_PER_SHARD)


@dataclass
class FleetStats:
    """What the agents recorded since the last drain; ``errors`` and ``messages`` since the start."""

    reports: list[tuple[float, float]] = field(default_factory=list)  # (answered at time.time(), round-trip s)
    errors: dict[str, int] = field(default_factory=dict)              # "Method:CODE" -> count
    messages: dict[str, str] = field(default_factory=dict)            # "Method:CODE" -> its first details
    probes: list[float] = field(default_factory=list)                 # answer times of bare health checks

    def error(self, method: str, exc: grpc.aio.AioRpcError) -> None:
        key = f"{method}:{exc.code().name}"
        self.errors[key] = self.errors.get(key, 0) + 1
        self.messages.setdefault(key, exc.details() or "")

    def add(self, other: FleetStats) -> None:
        self.reports += other.reports
        self.probes += other.probes
        for key, count in other.errors.items():
            self.errors[key] = self.errors.get(key, 0) + count
        for key, text in other.messages.items():
            self.messages.setdefault(key, text)


@dataclass
class _ShardState:
    stats: FleetStats = field(default_factory=FleetStats)
    mode: Mode = "interval"                      # at the interval, back to back, or not at all
    mode_changed: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0                           # reports sent and not yet answered


class FakeAgent:
    def __init__(self, server: FakeServer, address: str, shard: _ShardState, options: FleetOptions,
                 pushes: Any) -> None:
        self.server_id = server.server_id
        self._pool = server.pool
        self._shard = shard
        self._options = options
        self._pushes = pushes if options.record_pushes else None
        # Its own subchannel pool: without it gRPC would share one connection (and one TLS session)
        # between all agents.
        self._address = address
        self.channel = secure_aio_channel(address, agent_security(options.pki, server.server_id),
                                          [("grpc.use_local_subchannel_pool", 1)])
        self._stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.watch_channel: grpc.aio.Channel | None = None  # to the streams' own process, where it has one
        self._watch_stub = self._stub
        self._epoch = 0
        self.interval = 5.0
        self._generation = 0
        self._workers: tuple[agent_pb2.DesiredWorker, ...] = ()
        self._jobs: set[str] = set()           # job ids of the last desired state
        self._arrived: dict[str, float] = {}   # job id -> when it first reached this agent (monotonic)
        self.watching = asyncio.Event()

    async def register(self) -> None:
        inference = self._pool == "inference"
        call = self._stub.RegisterServer(agent_pb2.RegisterServerRequest(
            hostname=self.server_id, agent_address=self.server_id, agent_version=self._options.agent_version,
            pool=types_pb2.POOL_INFERENCE if inference else types_pb2.POOL_TRAINING,
            inference_endpoint=INFERENCE_ENDPOINT if inference else "",
            gpus=[agent_pb2.GpuInfo(index=i, uuid=f"GPU-{self.server_id}-{i}", model="H100",
                                    memory_total_bytes=80 << 30) for i in range(GPUS_PER_SERVER)],
        ), timeout=RPC_TIMEOUT_S, wait_for_ready=True)
        reply = await call
        # The first process the answer names: a standby's where the leader named one, else the scheduler's own
        # (``aryl-agent`` falls back along the rest where one is unreachable; the benchmark's are all up).
        watch_at = desired_state_addresses(dict(await call.initial_metadata() or ()), self._address)
        if watch_at and self.watch_channel is None:
            self.watch_channel = secure_aio_channel(watch_at[0], agent_security(self._options.pki, self.server_id),
                                                    [("grpc.use_local_subchannel_pool", 1)])
            self._watch_stub = agent_pb2_grpc.AgentServiceStub(self.watch_channel)
        self._epoch = reply.scheduler_epoch
        self.interval = reply.report_interval.ToTimedelta().total_seconds() or 5.0

    async def watch(self) -> None:
        while True:
            call = self._watch_stub.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=self.server_id))
            try:
                async for desired in call:
                    self._desired(desired, time.time())
                return  # the scheduler ended the stream: only on its shutdown
            except grpc.aio.AioRpcError as exc:
                if not self._options.rewatch:
                    raise
                self._shard.stats.error("WatchDesiredState", exc)
                await asyncio.sleep(RETRY_S)

    def _desired(self, desired: agent_pb2.DesiredState, arrived: float) -> None:
        self.watching.set()
        jobs = {w.job_id for w in desired.workers}
        if self._pushes is not None:
            for job_id in jobs - self._jobs:
                self._pushes.put(("placed", job_id, self.server_id, arrived))
            for job_id in self._jobs - jobs:
                self._pushes.put(("released", job_id, self.server_id, arrived))
        if self._options.workers_exit:
            now = time.monotonic()
            self._arrived = {j: self._arrived.get(j, now) for j in jobs}
        self._jobs = jobs
        self._generation = desired.generation
        self._workers = tuple(desired.workers)

    def _exited(self, worker: agent_pb2.DesiredWorker, now: float) -> bool:
        if not self._options.workers_exit:
            return False
        return now - self._arrived.get(worker.job_id, now) >= float(worker.env.get(RUN_ENV, "inf"))

    def report(self) -> agent_pb2.ReportStatusRequest:
        now = time.monotonic()
        return agent_pb2.ReportStatusRequest(
            server_id=self.server_id, scheduler_epoch=self._epoch, observed_generation=self._generation,
            gpus=[agent_pb2.GpuStatus(index=i, utilization=0.5, memory_used_bytes=1 << 30, temperature_c=50.0,
                                      healthy=True) for i in range(GPUS_PER_SERVER)],
            workers=[agent_pb2.WorkerStatus(
                job_id=w.job_id, rank=w.rank, incarnation=w.incarnation, exit_code=0,
                phase=agent_pb2.WORKER_PHASE_EXITED if self._exited(w, now) else agent_pb2.WORKER_PHASE_RUNNING,
            ) for w in self._workers],
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
                await self._stub.ReportStatus(self.report(), timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                shard.stats.error("ReportStatus", exc)
                if shard.mode == "saturate":  # at the interval the next slot paces the retry
                    await asyncio.sleep(SATURATED_ERROR_PAUSE_S)
                continue
            finally:
                shard.in_flight -= 1
            shard.stats.reports.append((time.time(), time.perf_counter() - sent))

    async def probe_forever(self) -> None:
        """Bare health checks back to back on this agent's channel: the unary round-trip ceiling."""
        health = health_pb2_grpc.HealthStub(self.channel)
        while True:
            # The stubs (types-grpcio-health-checking) declare HealthStub without its methods.
            await health.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=""), timeout=RPC_TIMEOUT_S)
            self._shard.stats.probes.append(time.time())


# ---------------------------------------------------------------------------------------------
# One shard: many agents on one asyncio loop, in its own process


async def _run_shard(address: str, servers: Sequence[FakeServer], control: Connection, options: FleetOptions,
                     pushes: Any) -> None:
    shard = _ShardState()
    agents = [FakeAgent(server, address, shard, options, pushes) for server in servers]
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(_exit_with_parent())]
    loop = asyncio.get_running_loop()
    try:
        sem = asyncio.Semaphore(REGISTRATIONS_IN_FLIGHT)

        async def start(agent: FakeAgent) -> None:
            async with sem:
                await agent.register()
            tasks.append(asyncio.create_task(agent.watch()))
            await agent.watching.wait()
            tasks.append(asyncio.create_task(agent.report_forever()))

        await asyncio.gather(*(start(a) for a in agents))
        control.send(("ready", agents[0].interval))
        probes: list[asyncio.Task[None]] = []
        while True:
            command, arg = await loop.run_in_executor(None, control.recv)
            for task in tasks:  # a dead stream or reporter is a broken run, not a slow one
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
                control.send(("stats", shard.stats))
                shard.stats = FleetStats(errors=shard.stats.errors, messages=shard.stats.messages)
            elif command == "stop":
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.channel.close() for a in agents), return_exceptions=True)
        await asyncio.gather(*(a.watch_channel.close() for a in agents if a.watch_channel is not None),
                             return_exceptions=True)


async def _exit_with_parent() -> None:
    """A shard whose coordinator died (killed, not stopped) must not keep loading the scheduler."""
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 - nothing signals a parent's death; poll it
        await asyncio.sleep(1.0)
    os._exit(3)


def _shard_main(address: str, servers: Sequence[FakeServer], control: Connection, options: FleetOptions,
                pushes: Any) -> None:
    try:
        asyncio.run(_run_shard(address, servers, control, options, pushes))
    except BaseException as exc:  # reported to the coordinator, which fails the run
        try:
            control.send(("error", repr(exc)))
        except OSError:
            pass
        raise


# ---------------------------------------------------------------------------------------------
# The coordinator's side


class Fleet:
    """Shard processes under one coordinator; every process is stopped on exit, even on failure."""

    def __init__(self, address: str, options: FleetOptions) -> None:
        self._address = address
        self._options = options
        self._ctx = mp.get_context("spawn")  # never fork a process that has started gRPC
        self.pushes: Any = self._ctx.Queue() if options.record_pushes else None
        self._shards: list[tuple[Any, Connection]] = []
        self.agents = 0
        self.report_interval = 0.0  # what RegisterServer told the agents

    def add(self, servers: Sequence[FakeServer], *, timeout_s: float = 300.0) -> None:
        """Start shards for ``servers`` (at most AGENTS_PER_SHARD each); return once every agent is
        registered, watching and reporting."""
        started = []
        for first in range(0, len(servers), AGENTS_PER_SHARD):
            ours, theirs = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_shard_main,
                args=(self._address, list(servers[first:first + AGENTS_PER_SHARD]), theirs, self._options,
                      self.pushes),
                name=f"{self._options.process_name}-{len(self._shards)}", daemon=True,
            )
            proc.start()
            theirs.close()  # the child's end: once we die, the child reads EOF
            self._shards.append((proc, ours))
            started.append(ours)
        for conn in started:
            self.report_interval = self._expect(conn, "ready", timeout_s)
        self.agents += len(servers)

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

    def set_mode(self, mode: Mode) -> None:
        """``interval``: each agent reports at its interval (the start); ``saturate``: back to back, one
        call in flight each; ``quiet``: not at all (returns once no report is left unanswered)."""
        self._all("mode", mode, "ok")

    def set_probing(self, on: bool) -> None:
        """Every agent sends bare health checks back to back on its channel, or stops."""
        self._all("probe", on, "ok")

    def drain(self) -> FleetStats:
        """Reports and health checks answered since the last drain; errors and their first messages
        since the start."""
        total = FleetStats()
        for got in self._all("stats", None, "stats"):
            total.add(got)
        return total

    def alive(self) -> bool:
        return all(proc.is_alive() for proc, _ in self._shards)

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
        if self.pushes is not None:
            self.pushes.close()
            self.pushes.join_thread()

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# The coordinator's process


def raise_fd_limit() -> None:
    """About one socket per agent on both sides; children (scheduler, shards) inherit the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the fleet runs, so a killed run still stops the scheduler
    and the shards and drops its database on the way out."""
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
