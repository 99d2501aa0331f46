"""The soak's fleet: simulated node agents of both pools whose workers finish.

It extends the ``agent_fleet`` benchmark's agents (``benchmarks.bench_agents``: one real gRPC
client per agent, its own channel, a ``WatchDesiredState`` stream and ``ReportStatus`` at the
interval ``RegisterServer`` returned, many agents per shard process) in two ways:

- An agent registers a training or an inference server (inference servers name an endpoint, which
  the serving pool lists; nothing calls it).
- A worker *runs* for the seconds its job's environment names in ``SOAK_RUN_S``, counted from when
  its job first reached this agent; after that the agent reports it EXITED with status 0, so a job
  whose every rank has run that long completes. A job without the variable runs until stopped.

Each shard records every report's round-trip with the time it was answered, and counts failed
calls by method and status; the coordinator drains both once a minute (``SoakFleet.stats``).

Security as a production agent has it, given a ``pki`` folder (``arylctl certs init``'s, which
``benchmarks.soak`` makes): each agent opens a mutual-TLS channel with the certificate issued for its
own server id and sends its own bearer token (``token-<ID>``) on every call, so the scheduler's
``require_server`` checks run on every report. Without a ``pki`` (``--insecure``): plaintext.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

import grpc

from aryl_common.security import ClientSecurity, secure_aio_channel
from benchmarks.bench_agents import AGENTS_PER_SHARD, GPUS_PER_SERVER, RPC_TIMEOUT_S, Fleet, _exit_with_parent
from benchmarks.bench_auth import _client as client_security
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, types_pb2

RUN_ENV = "SOAK_RUN_S"        # a job's run time in seconds, in its environment
INFERENCE_ENDPOINT = "http://127.0.0.1:9"  # listed by the serving pool; never called
RETRY_S = 1.0                  # pause before a failed call or a broken stream is tried again


def soak_server_name(pool: str, index: int) -> str:
    return f"soak-{pool[:5]}-{index:05d}"


def agent_security(pki: Path | None, server_id: str) -> ClientSecurity:
    """What the agent of ``server_id`` presents: its own certificate and token from ``pki``; nothing
    (plaintext) without one."""
    return client_security(pki, f"agent-{server_id}", server_id)


@dataclass
class _ShardStats:
    reports: list[tuple[float, float]] = field(default_factory=list)  # (answered at, round-trip s)
    errors: dict[str, int] = field(default_factory=dict)              # "Method:CODE" -> count
    messages: dict[str, str] = field(default_factory=dict)            # "Method:CODE" -> its first details

    def error(self, method: str, exc: grpc.aio.AioRpcError) -> None:
        key = f"{method}:{exc.code().name}"
        self.errors[key] = self.errors.get(key, 0) + 1
        self.messages.setdefault(key, exc.details() or "")


class SoakAgent:
    def __init__(self, server_id: str, pool: str, address: str, stats: _ShardStats, pki: Path | None) -> None:
        self.server_id = server_id
        self._pool = pool
        self._stats = stats
        # Its own subchannel pool: without it gRPC would share one connection (and one TLS session)
        # between all agents.
        self.channel = secure_aio_channel(address, agent_security(pki, server_id),
                                          [("grpc.use_local_subchannel_pool", 1)])
        self._stub = agent_pb2_grpc.AgentServiceStub(self.channel)
        self._epoch = 0
        self.interval = 5.0
        self._generation = 0
        self._workers: tuple[agent_pb2.DesiredWorker, ...] = ()
        self._arrived: dict[str, float] = {}  # job id -> when its workers first reached this agent
        self.watching = asyncio.Event()

    async def register(self) -> None:
        inference = self._pool == "inference"
        reply = await self._stub.RegisterServer(agent_pb2.RegisterServerRequest(
            hostname=self.server_id, agent_address=self.server_id, agent_version="soak",
            pool=types_pb2.POOL_INFERENCE if inference else types_pb2.POOL_TRAINING,
            inference_endpoint=INFERENCE_ENDPOINT if inference else "",
            gpus=[agent_pb2.GpuInfo(index=i, uuid=f"GPU-{self.server_id}-{i}", model="H100",
                                    memory_total_bytes=80 << 30) for i in range(GPUS_PER_SERVER)],
        ), timeout=RPC_TIMEOUT_S, wait_for_ready=True)
        self._epoch = reply.scheduler_epoch
        self.interval = reply.report_interval.ToTimedelta().total_seconds() or 5.0

    async def watch_forever(self) -> None:
        while True:
            call = self._stub.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=self.server_id))
            try:
                async for desired in call:
                    self.watching.set()
                    now = time.monotonic()
                    jobs = {w.job_id for w in desired.workers}
                    self._arrived = {j: self._arrived.get(j, now) for j in jobs}
                    self._generation = desired.generation
                    self._workers = tuple(desired.workers)
                return  # the scheduler ended the stream: only on its shutdown
            except grpc.aio.AioRpcError as exc:
                self._stats.error("WatchDesiredState", exc)
                await asyncio.sleep(RETRY_S)

    def _report(self) -> agent_pb2.ReportStatusRequest:
        now = time.monotonic()
        workers = []
        for w in self._workers:
            run_s = float(w.env.get(RUN_ENV, "inf"))
            done = now - self._arrived.get(w.job_id, now) >= run_s
            workers.append(agent_pb2.WorkerStatus(
                job_id=w.job_id, rank=w.rank, incarnation=w.incarnation, exit_code=0,
                phase=agent_pb2.WORKER_PHASE_EXITED if done else agent_pb2.WORKER_PHASE_RUNNING))
        return agent_pb2.ReportStatusRequest(
            server_id=self.server_id, scheduler_epoch=self._epoch, observed_generation=self._generation,
            gpus=[agent_pb2.GpuStatus(index=i, utilization=0.5, memory_used_bytes=1 << 30, temperature_c=50.0,
                                      healthy=True) for i in range(GPUS_PER_SERVER)],
            workers=workers,
        )

    async def report_forever(self) -> None:
        next_at = time.monotonic() + random.uniform(0, self.interval)  # agents start out of phase
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at + self.interval, time.monotonic())
            sent = time.perf_counter()
            try:
                await self._stub.ReportStatus(self._report(), timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                self._stats.error("ReportStatus", exc)
                continue
            self._stats.reports.append((time.time(), time.perf_counter() - sent))


async def _run_shard(address: str, agents_of: Sequence[tuple[str, str]], control: Connection,
                     pki: Path | None) -> None:
    stats = _ShardStats()
    agents = [SoakAgent(server_id, pool, address, stats, pki) for server_id, pool in agents_of]
    tasks: list[asyncio.Task[None]] = [asyncio.create_task(_exit_with_parent())]
    loop = asyncio.get_running_loop()
    try:
        sem = asyncio.Semaphore(32)  # registrations in flight per shard

        async def start(agent: SoakAgent) -> None:
            async with sem:
                await agent.register()
            tasks.append(asyncio.create_task(agent.watch_forever()))
            await agent.watching.wait()
            tasks.append(asyncio.create_task(agent.report_forever()))

        await asyncio.gather(*(start(a) for a in agents))
        control.send(("ready", agents[0].interval))
        while True:
            command, _arg = await loop.run_in_executor(None, control.recv)
            for task in tasks:  # a dead reporter is a broken soak, not a slow one
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"an agent task failed: {task.exception()!r}")
            if command == "stats":
                control.send(("stats", (stats.reports, dict(stats.errors), dict(stats.messages))))
                stats.reports = []
            elif command == "stop":
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(a.channel.close() for a in agents), return_exceptions=True)


def _shard_main(address: str, agents_of: Sequence[tuple[str, str]], control: Connection,
                pki: Path | None) -> None:
    try:
        asyncio.run(_run_shard(address, agents_of, control, pki))
    except BaseException as exc:  # reported to the coordinator, which fails the soak
        try:
            control.send(("error", repr(exc)))
        except OSError:
            pass
        raise


class SoakFleet(Fleet):
    """``bench_agents.Fleet`` (shard processes, stopped on exit) with the soak's agents, each with its
    own certificate and token from ``pki`` (plaintext when None)."""

    def __init__(self, address: str, pki: Path | None) -> None:
        super().__init__(address)
        self._ctx = mp.get_context("spawn")  # never fork a process that has started gRPC
        self._pki = pki

    def add_agents(self, agents_of: Sequence[tuple[str, str]], *, timeout_s: float = 600.0) -> None:
        """Start shards for ``agents_of`` ((server id, pool) pairs, at most AGENTS_PER_SHARD per
        shard); return once every agent is registered, watching and reporting."""
        started = []
        for first in range(0, len(agents_of), AGENTS_PER_SHARD):
            ours, theirs = self._ctx.Pipe()
            proc = self._ctx.Process(
                target=_shard_main,
                args=(self._address, list(agents_of[first:first + AGENTS_PER_SHARD]), theirs, self._pki),
                name=f"aryl-soak-agents-{len(self._shards)}", daemon=True,
            )
            proc.start()
            theirs.close()  # the child's end: once we die, the child reads EOF
            self._shards.append((proc, ours))
            started.append(ours)
        for conn in started:
            self.report_interval = self._expect(conn, "ready", timeout_s)
        self.agents += len(agents_of)

    def drain(self) -> tuple[list[tuple[float, float]], dict[str, int], dict[str, str]]:
        """Reports answered since the last call ((answered at, seconds)), errors so far by kind, and
        the first message of each kind."""
        reports: list[tuple[float, float]] = []
        errors: dict[str, int] = {}
        messages: dict[str, str] = {}
        for got, err, msg in self._all("stats", None, "stats"):
            reports += got
            for key, count in err.items():
                errors[key] = errors.get(key, 0) + count
            for key, text in msg.items():
                messages.setdefault(key, text)
        return reports, errors, messages

    def __enter__(self) -> SoakFleet:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def alive(self) -> bool:
        return all(proc.is_alive() for proc, _ in self._shards)


def shards_for(agents: int) -> int:
    return math.ceil(agents / AGENTS_PER_SHARD)
