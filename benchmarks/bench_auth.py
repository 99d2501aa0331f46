"""What TLS and tokens cost (docs/security.md): SubmitJob throughput and desired-state push latency
with mutual TLS + bearer tokens beside plaintext, the same scheduler build, database and load, in the
same run (``python -m benchmarks --only auth_overhead``).

Each mode gets a fresh PostgreSQL database and its own ``aryl-scheduler`` process: ``plaintext``
(``security.insecure``) and ``tls_tokens`` (a development CA from ``arylctl certs init``; jobs are
submitted by a ``user`` whose token the interceptor looks up, so ownership checks run too).

- ``auth_submit_throughput``: SubmitJob calls per second through one channel at 16 calls in flight;
  p50/p99 latency per call.
- ``auth_push_latency``: one agent (registered through the AgentService, its certificate naming its
  server id in the TLS mode) watches its desired state; a 1-GPU job is submitted and the time until
  the job's worker appears in the pushed state is measured, one job at a time (each cancelled before
  the next). This is submit + cycle + commit + push, the path an agent's workers wait on.

The plaintext figure is each line's reference (``reference_*``).

``token_lookup`` (no scheduler): what the interceptor's token lookup (``aryl_common.security.lookup_token``)
costs a call with a token per agent, ``FLEET_TOKENS`` of them, beside a token file of one, in the same run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from aryl_common.security import (
    ClientSecurity,
    Principal,
    hash_token,
    lookup_token,
    secure_aio_channel,
    token_from_file,
)
from arylctl import certs
from benchmarks import emit_figure
from benchmarks.harness import (
    FULL,
    RPC_TIMEOUT_S,
    BenchContext,
    Benchmark,
    SchedulerProcess,
    percentile_ms,
    scratch_database,
)
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

log = logging.getLogger("aryl.bench.auth")

IN_FLIGHT = 16
SERVER_ID = "bench-gpu-1"


def _settings(pki: Path | None) -> dict[str, str]:
    if pki is None:
        return {"ARYL_SECURITY__INSECURE": "true", "ARYL_SCHEDULING__CYCLE_INTERVAL_S": "0.2"}
    return {
        "ARYL_SECURITY__INSECURE": "false", "ARYL_SECURITY__TLS_CERT": str(pki / "scheduler.crt"),
        "ARYL_SECURITY__TLS_KEY": str(pki / "scheduler.key"), "ARYL_SECURITY__TLS_CLIENT_CA": str(pki / "ca.crt"),
        "ARYL_SECURITY__TOKENS_FILE": str(pki / "tokens"), "ARYL_SCHEDULING__CYCLE_INTERVAL_S": "0.2",
    }


def _client(pki: Path | None, cert: str, principal: str) -> ClientSecurity:
    if pki is None:
        return ClientSecurity(insecure=True)
    return ClientSecurity(ca_file=str(pki / "ca.crt"), cert_file=str(pki / f"{cert}.crt"),
                          key_file=str(pki / f"{cert}.key"), token=token_from_file(pki / f"token-{principal}"))


def _spec(i: int, user: str) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(name=f"auth-{i}", user=user, command=["python", "train.py"], gpus_per_worker=1,
                             min_workers=1)


async def _submit(address: str, security: ClientSecurity, count: int, user: str) -> tuple[float, list[float]]:
    latencies: list[float] = []
    async with secure_aio_channel(address, security, []) as channel:
        await asyncio.wait_for(channel.channel_ready(), RPC_TIMEOUT_S)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        queue = iter(range(count))

        async def caller() -> None:
            for i in queue:
                sent = time.perf_counter()
                await stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(i, user)), timeout=RPC_TIMEOUT_S)
                latencies.append(time.perf_counter() - sent)

        began = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(IN_FLIGHT)))
        return time.perf_counter() - began, latencies


async def _push_latencies(address: str, user: ClientSecurity, agent: ClientSecurity, user_name: str,
                          rounds: int) -> list[float]:
    async with secure_aio_channel(address, agent, []) as agent_channel, \
            secure_aio_channel(address, user, []) as user_channel:
        agents = agent_pb2_grpc.AgentServiceStub(agent_channel)
        jobs = scheduler_pb2_grpc.SchedulerServiceStub(user_channel)
        registered = await agents.RegisterServer(agent_pb2.RegisterServerRequest(
            hostname=SERVER_ID, pool=types_pb2.POOL_TRAINING, agent_address="127.0.0.1", agent_version="bench",
            gpus=[agent_pb2.GpuInfo(index=0, uuid="GPU-bench-0", model="Fake", memory_total_bytes=1 << 34)],
        ), timeout=RPC_TIMEOUT_S)
        epoch = registered.scheduler_epoch
        stream = agents.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=SERVER_ID))
        seen: asyncio.Queue[tuple[float, agent_pb2.DesiredState]] = asyncio.Queue()

        async def watch() -> None:
            async for state in stream:
                await seen.put((time.perf_counter(), state))
                # Converge, as an agent that applied it does, so the scheduler counts the server as caught up.
                await agents.ReportStatus(agent_pb2.ReportStatusRequest(
                    server_id=SERVER_ID, scheduler_epoch=epoch, observed_generation=state.generation),
                    timeout=RPC_TIMEOUT_S)

        watcher = asyncio.create_task(watch())
        samples: list[float] = []
        try:
            for i in range(rounds):
                sent = time.perf_counter()
                job = (await jobs.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=_spec(i, user_name)),
                                            timeout=RPC_TIMEOUT_S)).job
                while True:
                    at, state = await asyncio.wait_for(seen.get(), 30)
                    if any(w.job_id == job.job_id for w in state.workers):
                        samples.append(at - sent)
                        break
                await jobs.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.job_id), timeout=RPC_TIMEOUT_S)
                while True:  # the GPU back: the worker gone from the pushed state
                    _, state = await asyncio.wait_for(seen.get(), 30)
                    if not any(w.job_id == job.job_id for w in state.workers):
                        break
        finally:
            stream.cancel()
            watcher.cancel()
        return samples


def _measure(ctx: BenchContext, pki: Path | None, count: int, rounds: int) -> dict[str, Any]:
    user_name = "alice" if pki is not None else "bench"
    user = _client(pki, "client", "alice")
    agent = _client(pki, f"agent-{SERVER_ID}", SERVER_ID)
    with scratch_database(ctx.admin_url) as url, SchedulerProcess(url, _settings(pki)) as scheduler:
        asyncio.run(_submit(scheduler.address, user, min(200, count), user_name))  # warm up
        elapsed, latencies = asyncio.run(_submit(scheduler.address, user, count, user_name))
    with scratch_database(ctx.admin_url) as url, SchedulerProcess(url, _settings(pki)) as scheduler:
        pushes = asyncio.run(_push_latencies(scheduler.address, user, agent, user_name, rounds))
    return {"jobs_per_s": count / elapsed, "p50_ms": percentile_ms(latencies, 50),
            "p99_ms": percentile_ms(latencies, 99), "push_ms": [s * 1e3 for s in pushes]}


def auth_overhead(ctx: BenchContext) -> None:
    count = ctx.sizes.submit_jobs
    rounds = 10 if count < 1000 else 40
    with tempfile.TemporaryDirectory(prefix="aryl-bench-pki-") as tmp:
        pki = Path(tmp)
        certs.init(pki, certs.DevCluster(agents=(SERVER_ID,), users=("alice",)))
        plain = _measure(ctx, None, count, rounds)
        secure = _measure(ctx, pki, count, rounds)
    for label, figures in (("plaintext", plain), ("tls_tokens", secure)):
        log.info("%s: %.0f jobs/s, submit p99 %.1f ms, push p50 %.1f ms", label, figures["jobs_per_s"],
                 figures["p99_ms"], statistics.median(figures["push_ms"]))
    emit_figure("auth_submit_throughput", secure["jobs_per_s"], "jobs/s", mode="tls_tokens", jobs=count,
                in_flight=IN_FLIGHT, latency_p50_ms=secure["p50_ms"], latency_p99_ms=secure["p99_ms"],
                reference_name="plaintext", reference_value=plain["jobs_per_s"], reference_unit="jobs/s",
                reference_latency_p50_ms=plain["p50_ms"], reference_latency_p99_ms=plain["p99_ms"])
    for pct in (50, 99):
        emit_figure(f"auth_push_latency_p{pct}", percentile_ms([s / 1e3 for s in secure["push_ms"]], pct), "ms",
                    mode="tls_tokens", rounds=rounds, reference_name="plaintext",
                    reference_value=percentile_ms([s / 1e3 for s in plain["push_ms"]], pct), reference_unit="ms")


FLEET_TOKENS = 1000
LOOKUPS = 200_000


def _lookup_us(tokens: dict[str, Principal], presented: list[str], lookups: int) -> float:
    """Microseconds per ``lookup_token`` call, cycling through ``presented`` (best of 3 timings)."""
    best = math.inf
    for _ in range(3):
        started = time.perf_counter()
        for i in range(lookups):
            lookup_token(tokens, presented[i % len(presented)])
        best = min(best, time.perf_counter() - started)
    return best / lookups * 1e6


def token_lookup(ctx: BenchContext) -> None:
    lookups = LOOKUPS if ctx.sizes is FULL else LOOKUPS // 20
    secrets_ = [f"agent-token-{i:04d}-{'x' * 32}" for i in range(FLEET_TOKENS)]
    fleet = {hash_token(t): Principal("agent", f"gpu-{i}") for i, t in enumerate(secrets_)}
    one = {hash_token(secrets_[0]): Principal("agent", "gpu-0")}
    reference = _lookup_us(one, secrets_[:1], lookups)
    known = _lookup_us(fleet, secrets_, lookups)
    unknown = _lookup_us(fleet, [f"guess-{i}" for i in range(64)], lookups)
    emit_figure("token_lookup", known, "us", tokens=FLEET_TOKENS, lookups=lookups, unknown_token_us=unknown,
                reference_name="token_lookup_one_token", reference_value=reference, reference_unit="us")


BENCHMARKS = (
    Benchmark("auth_overhead", auth_overhead,
              "SubmitJob throughput and push latency with mutual TLS + tokens beside plaintext (same run)"),
    Benchmark("token_lookup", token_lookup,
              f"the interceptor's token lookup with {FLEET_TOKENS} tokens (one per agent) beside one token"),
)
