"""A fleet of simulated node agents against one real scheduler: status-report rate and the latency
from a scheduler decision to the agent that must act on it.

Nouns:
- The *fleet* is ``benchmarks.fake_fleet``'s, with its defaults: each simulated agent is a real gRPC
  client over loopback with its own plaintext channel, registers one 8-GPU training server, keeps a
  ``WatchDesiredState`` stream open and calls ``ReportStatus`` with a RUNNING status for every desired
  worker. It runs no workers; it records when each desired-state push arrived (``Fleet.pushes``), and
  a broken stream fails the benchmark. Its agents live in shard processes of at most 250.
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

import logging
import math
import queue as queue_mod
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import sqlalchemy as sa

from benchmarks import emit_figure
from benchmarks.fake_fleet import (
    GPUS_PER_SERVER,
    RPC_TIMEOUT_S,
    FakeServer,
    Fleet,
    FleetOptions,
    FleetStats,
    raise_fd_limit,
    shards_for,
    sigterm_unwinds,
)
from benchmarks.harness import FULL, BenchContext, Benchmark, SchedulerProcess, scratch_database
from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

log = logging.getLogger("aryl.bench")

PUSH_TARGET_P99_MS = 100.0
REFERENCE_AGENTS = 10          # the small fleet whose push latency is the reference
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


def _servers(indices: range) -> list[FakeServer]:
    return [FakeServer(server_name(i), "training") for i in indices]


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


def _report_errors(stats: FleetStats) -> dict[str, int]:
    """Failed ReportStatus calls so far, by status code."""
    return {key.partition(":")[2]: n for key, n in stats.errors.items() if key.startswith("ReportStatus:")}


# ---------------------------------------------------------------------------------------------
# The benchmark


def agent_fleet(ctx: BenchContext) -> None:
    sizes = FULL_FLEET if ctx.sizes is FULL else QUICK_FLEET
    raise_fd_limit()
    with sigterm_unwinds(), scratch_database(ctx.admin_url) as url:
        engine = sa.create_engine(url, pool_size=1, max_overflow=1)
        try:
            with SchedulerProcess(url) as scheduler, Fleet(scheduler.address, FleetOptions()) as agents:
                # 1. The reference: push latency with a small fleet and nothing else connected.
                agents.add(_servers(range(REFERENCE_AGENTS)))
                ref = push_latencies(engine, run_waves(
                    scheduler.address, agents.pushes, waves=sizes.reference_waves, size=REFERENCE_AGENTS, tag="ref"))
                log.info("reference fleet of %d: %d pushes measured", REFERENCE_AGENTS,
                         len(ref.all(("placed", "released"))))

                # 2. The whole fleet, reporting at the interval the scheduler gave it.
                started = time.monotonic()
                agents.add(_servers(range(REFERENCE_AGENTS, sizes.agents)))
                log.info("%d agents registered and watching in %.1fs", agents.agents, time.monotonic() - started)
                interval = agents.report_interval
                time.sleep(interval)  # one interval: every agent has reported once, out of phase
                agents.drain()
                window_start = time.time()
                time.sleep(sizes.rate_window_s)
                window_end = time.time()
                got = agents.drain()
                latency, errors = [rtt for _, rtt in got.reports], _report_errors(got)
                rate = _window_rate([t for t, _ in got.reports], window_start, window_end)
                offered = agents.agents / interval
                log.info("interval reports: %.0f/s accepted of %.0f/s offered, errors %s", rate, offered, errors)

                # 3. Push latency at the whole fleet, the agents still reporting at their interval.
                fleet_lat = push_latencies(engine, run_waves(
                    scheduler.address, agents.pushes, waves=sizes.waves, size=sizes.wave, tag="fleet"))
                got = agents.drain()
                during_latency = [rtt for _, rtt in got.reports]
                log.info("reports during the pushes: errors %s", _report_errors(got))

                # 4. Saturation: every agent reports back to back; then bare health checks the same way.
                agents.set_mode("saturate")
                time.sleep(1.0)
                agents.drain()
                sat_start = time.time()
                time.sleep(sizes.saturation_window_s)
                sat_end = time.time()
                agents.set_mode("quiet")
                got = agents.drain()
                sat_latency, sat_errors = [rtt for _, rtt in got.reports], _report_errors(got)
                saturated = _window_rate([t for t, _ in got.reports], sat_start, sat_end)
                agents.set_probing(True)
                time.sleep(1.0)
                agents.drain()
                probe_start = time.time()
                time.sleep(sizes.saturation_window_s)
                probe_end = time.time()
                agents.set_probing(False)
                probe_rate = _window_rate(agents.drain().probes, probe_start, probe_end)
                log.info("saturated: %.0f reports/s (errors %s); bare health checks %.0f/s",
                         saturated, sat_errors, probe_rate)
        finally:
            engine.dispose()

    common = dict(agents=sizes.agents, gpus_per_server=GPUS_PER_SERVER,
                  shards=shards_for(REFERENCE_AGENTS) + shards_for(sizes.agents - REFERENCE_AGENTS))
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
