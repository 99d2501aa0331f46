"""``python -m benchmarks.soak`` (``make soak``; ``make soak-ci`` is its short form): the scheduler
under steady load for a long time, sampled once a minute, to show what grows.

Real parts: the scheduler as a child process (``benchmarks.bench_service.SchedulerProcess``) on a
fresh PostgreSQL database of its own (created, migrated and dropped here), a fleet of simulated
agents of both pools in shard processes (``benchmarks.soak_fleet``), and, in this process, a load
driver on its own thread.

It runs as a production deployment does (the README's and compose's path): mutual TLS and bearer
tokens from a development CA (``arylctl certs init``, in a temporary folder removed at the end), each
agent with the certificate and token of its own server id, each submitting user with its own token
(ten users, each cancelling only its own jobs), the demand reported by a router with its own; and the
leader lease, which a scheduler on PostgreSQL always holds (``ha.lease_s``/``renew_s`` at their
defaults). ``--insecure`` runs plaintext without identities instead, an explicit opt-in.

- **Submits** arrive as a Poisson stream; a fifth of the jobs are rigid (1..4 workers), the rest
  elastic (1..4 up to 8..32 workers), all of 8-GPU workers, each running ``SOAK_RUN_S`` seconds
  (uniform in the run-time range) once placed; then the agents report its workers exited 0 and the
  job completes. Every submission carries an idempotency key, and is made by the user it names.
- **Cancels** arrive as a Poisson stream too and pick a random recent job not yet cancelled. One
  that has ended meanwhile is refused FAILED_PRECONDITION: that is the one expected error.
- **Inference demand** (``ReportDemand``, every few seconds like a router) follows a sine between
  a fifth of the inference pool and all of it but one, so idle inference servers are lent to
  training while it is low (after a short drain timeout: no router acknowledges drains) and
  reclaimed while it rises.

A **sample** (at the start, then each minute): the scheduler's RSS and open file descriptors
(``/proc/PID``), the database's size (``pg_database_size``), row counts of ``events`` and ``jobs``,
loans and reclaims so far (``loans`` rows), and the p50/p99 of SubmitJob and of the agents'
ReportStatus round-trips answered during the minute before it, and the machine's load average.

The **checks** (exit 1 when one fails): the scheduler's RSS grew 10% or more from the end of the
warm-up to the end; its descriptors grew by more than ``FD_SLACK``; an acknowledged submission is
missing from the database, or an acknowledged cancellation did not end its job CANCELLED; any error
other than the expected one; the scheduler exited; it lost the leader lease (the lease's term at the
end is not the one it took at the start); **latency drift**: the median of the per-minute p99s of
SubmitJob, or of ReportStatus, over the last ``DRIFT_WINDOW`` samples is more than ``DRIFT_LIMIT``
times its median over the first ``DRIFT_WINDOW`` samples after the warm-up. Medians of ten minutes
because the machine is shared: a minute of a neighbour's burst moves one p99, not the median of ten
(benchmarks/README.md, "Soak", says why the bound is 2x). A run with fewer than two disjoint windows
after its warm-up (``soak-ci``'s five minutes) reports its drift over shorter windows but is not
judged on it.

Never: import from ``tests/``, or touch a database it did not create.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import logging
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import grpc
import sqlalchemy as sa

from aryl_common.security import secure_aio_channel
from arylctl import certs
from benchmarks.bench_agents import _raise_fd_limit, _sigterm_unwinds
from benchmarks.harness import SchedulerProcess, scratch_database
from benchmarks.soak_fleet import RUN_ENV, SoakFleet, client_security, shards_for, soak_server_name
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

log = logging.getLogger("aryl.soak")

DEFAULT_ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
RSS_GROWTH_LIMIT = 0.10          # the target, and a check
# Latency drift (a check): the median of the per-minute p99s over the last DRIFT_WINDOW samples
# against the median over the first DRIFT_WINDOW after the warm-up, at most DRIFT_LIMIT times it.
# Why these values: benchmarks/README.md, "Soak".
DRIFT_WINDOW = 10
DRIFT_LIMIT = 2.0
FD_SLACK = 16                    # descriptors the scheduler may gain after the warm-up (streams, pool churn)
EXPECTED_ERRORS = frozenset({"CancelJob:FAILED_PRECONDITION"})  # the job ended before the cancel came
RPC_TIMEOUT_S = 60.0
DEMAND_REPORT_S = 5.0
INFERENCE_SHARE = 0.2            # of the fleet's agents
SUBMITS_PER_S_PER_1000_AGENTS = 1.0
CANCEL_SHARE = 0.1               # cancels per submit
RIGID_SHARE = 0.2
RUN_S = (60.0, 240.0)
GPUS_PER_WORKER = 8
RECENT_JOBS = 200                # cancels pick among the latest acknowledged jobs
USERS = tuple(f"user-{i}" for i in range(10))  # who submits; each with a token of its own
ROUTER = "soak-router"           # who reports the inference demand
# The scheduler's settings: loans and reclaims within minutes, not the production half hour.
SETTINGS = {
    "ARYL_POLICY__LOAN_IDLE_S": "15", "ARYL_POLICY__DRAIN_TIMEOUT_S": "5", "ARYL_POLICY__MIN_LOAN_S": "60",
}


# ---------------------------------------------------------------------------------------------
# Samples, and what the summary makes of them (pure: tests/test_soak_summary.py)


@dataclass(frozen=True)
class Sample:
    t_s: float                 # seconds since the load started
    rss_mib: float             # scheduler resident set
    fds: int                   # scheduler open descriptors
    db_mib: float              # pg_database_size
    events_rows: int
    jobs_rows: int
    jobs_active: int           # PENDING, RUNNING, SCALING, PREEMPTED
    submits: int               # acknowledged so far
    cancels: int               # acknowledged so far
    completed: int             # jobs COMPLETED so far
    loans: int                 # loans so far (loans rows)
    reclaims: int              # of them reclaimed (RECLAIMING or RETURNED)
    errors: int                # unexpected errors so far
    submit_calls: int          # SubmitJob calls answered in the minute before
    submit_p50_ms: float
    submit_p99_ms: float
    reports: int               # ReportStatus calls answered in the minute before
    report_p50_ms: float
    report_p99_ms: float
    load1: float               # the machine's 1-minute load average


@dataclass(frozen=True)
class Outcome:
    """What the end-of-run verification found, and the error counts by ``Method:CODE``."""

    acknowledged: int
    lost: int                       # acknowledged submissions missing from the database
    cancels_not_applied: int        # acknowledged cancellations whose job is not CANCELLED
    errors: Mapping[str, int]
    scheduler_exit: int | None = None  # set when the scheduler exited during the run
    messages: Mapping[str, str] = field(default_factory=dict)  # the first message of each kind of error
    # The leader lease's term (epoch) when the load started and after it stopped; None: no lease row
    # (a scheduler on PostgreSQL that does not lead).
    lease_epochs: tuple[int | None, int | None] = (None, None)


@dataclass(frozen=True)
class Summary:
    warmup_s: float
    rss_start_mib: float
    rss_end_mib: float
    rss_growth: float               # fraction of rss_start
    fds_start: int
    fds_end: int
    fd_growth: int
    # Latency drift: medians of the per-minute p99s over the first window after the warm-up and the
    # last window, each of ``drift_window`` samples (DRIFT_WINDOW, fewer in a short run).
    drift_window: int
    drift_judged: bool              # two disjoint windows of DRIFT_WINDOW samples fit after the warm-up
    first_window: tuple[float, float]  # (t_s of its first sample, of its last)
    last_window: tuple[float, float]
    submit_p99_first_ms: float
    submit_p99_last_ms: float
    report_p99_first_ms: float
    report_p99_last_ms: float
    load_first: float               # mean load1 over each window
    load_last: float
    db_start_mib: float
    db_end_mib: float
    submits: int
    cancels: int
    completed: int
    loans: int
    reclaims: int
    outcome: Outcome
    failures: tuple[str, ...] = field(default=())

    @property
    def submit_drift(self) -> float:
        return _ratio(self.submit_p99_last_ms, self.submit_p99_first_ms)

    @property
    def report_drift(self) -> float:
        return _ratio(self.report_p99_last_ms, self.report_p99_first_ms)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) and not math.isnan(b) else math.nan


def warmup_seconds(minutes: float) -> float:
    """The warm-up: the first 10% of the run, at least one minute."""
    return max(60.0, 0.1 * minutes * 60.0)


def _median_p99(window: Sequence[Sample], p99: Callable[[Sample], float]) -> float:
    """The median of the window's per-minute p99s that have a value (a minute without calls has none)."""
    values = [v for v in map(p99, window) if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def summarize(samples: Sequence[Sample], outcome: Outcome, *, warmup_s: float,
              rss_limit: float = RSS_GROWTH_LIMIT, fd_slack: int = FD_SLACK,
              drift_window: int = DRIFT_WINDOW, drift_limit: float = DRIFT_LIMIT) -> Summary:
    """Growth from the first sample at or after ``warmup_s`` to the last, latency drift (the first
    ``drift_window`` samples after it against the last ``drift_window``), and the checks that failed.
    Drift is judged only when the two windows are disjoint and full; a shorter run compares windows
    of half the samples after its warm-up (at least one each) and reports them only."""
    if len(samples) < 2:
        raise ValueError(f"a soak needs at least two samples (got {len(samples)})")
    start = next((i for i, s in enumerate(samples) if s.t_s >= warmup_s), len(samples) - 1)
    start = min(start, len(samples) - 2)  # a run no longer than its warm-up: growth over its last window
    base, last = samples[start], samples[-1]
    after = samples[start + 1:]  # each holds the latencies of the minute before it: all after the base
    judged = len(after) >= 2 * drift_window
    window = drift_window if judged else max(1, len(after) // 2)
    first_w, last_w = after[:window], after[-window:]
    submit_first, submit_last = (_median_p99(w, lambda s: s.submit_p99_ms) for w in (first_w, last_w))
    report_first, report_last = (_median_p99(w, lambda s: s.report_p99_ms) for w in (first_w, last_w))
    rss_growth = (last.rss_mib - base.rss_mib) / base.rss_mib if base.rss_mib > 0 else math.nan
    fails = []
    if not rss_growth < rss_limit:
        fails.append(f"scheduler RSS grew {_pct(rss_growth)} after the warm-up "
                     f"({base.rss_mib:.1f} -> {last.rss_mib:.1f} MiB; limit {rss_limit:.0%})")
    if last.fds - base.fds > fd_slack:
        fails.append(f"scheduler file descriptors grew by {last.fds - base.fds} after the warm-up "
                     f"({base.fds} -> {last.fds}; limit {fd_slack})")
    if outcome.lost:
        fails.append(f"{outcome.lost} of {outcome.acknowledged} acknowledged job(s) are missing from the database")
    if outcome.cancels_not_applied:
        fails.append(f"{outcome.cancels_not_applied} acknowledged cancellation(s) did not end their job CANCELLED")
    unexpected = {k: v for k, v in outcome.errors.items() if k not in EXPECTED_ERRORS and v}
    if unexpected:
        fails.append("unexpected errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(unexpected.items())))
    if outcome.scheduler_exit is not None:
        fails.append(f"the scheduler exited during the run (code {outcome.scheduler_exit})")
    began, ended = outcome.lease_epochs
    if began is None or ended is None or began != ended:
        fails.append(f"the scheduler did not hold the leader lease throughout (its term when the load started: "
                     f"{began}, after it stopped: {ended})")
    for method, before, after_ in (("SubmitJob", submit_first, submit_last),
                                   ("ReportStatus", report_first, report_last)):
        drift = _ratio(after_, before)
        if judged and drift > drift_limit:
            fails.append(f"{method} p99 drifted x{drift:.2f} (median of the minutes' p99s {before:.1f} -> "
                         f"{after_:.1f} ms, first {window} samples after the warm-up against the last {window}; "
                         f"limit x{drift_limit:g})")
    return Summary(
        warmup_s=base.t_s, rss_start_mib=base.rss_mib, rss_end_mib=last.rss_mib, rss_growth=rss_growth,
        fds_start=base.fds, fds_end=last.fds, fd_growth=last.fds - base.fds,
        drift_window=window, drift_judged=judged,
        first_window=(first_w[0].t_s, first_w[-1].t_s), last_window=(last_w[0].t_s, last_w[-1].t_s),
        submit_p99_first_ms=submit_first, submit_p99_last_ms=submit_last,
        report_p99_first_ms=report_first, report_p99_last_ms=report_last,
        load_first=statistics.fmean(s.load1 for s in first_w), load_last=statistics.fmean(s.load1 for s in last_w),
        db_start_mib=base.db_mib, db_end_mib=last.db_mib,
        submits=last.submits, cancels=last.cancels, completed=last.completed, loans=last.loans,
        reclaims=last.reclaims, outcome=outcome, failures=tuple(fails),
    )


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.1%}"


def render(summary: Summary, regime: Mapping[str, object]) -> str:
    s, o = summary, summary.outcome
    limit = (f"limit x{DRIFT_LIMIT:g}" if s.drift_judged else
             f"not judged: fewer than 2 x {DRIFT_WINDOW} samples after the warm-up")
    expected = {k: v for k, v in o.errors.items() if k in EXPECTED_ERRORS}
    unexpected = {k: v for k, v in o.errors.items() if k not in EXPECTED_ERRORS and v}
    lines = [
        "Aryl soak: " + ("PASS" if not s.failures else "FAIL"),
        "load regime: " + "; ".join(f"{k}={v}" for k, v in regime.items()),
        f"measured from the end of the warm-up (sample at {s.warmup_s / 60:.1f} min) to the end:",
        f"  scheduler RSS        {s.rss_start_mib:.1f} -> {s.rss_end_mib:.1f} MiB ({_pct(s.rss_growth)}; "
        f"target < {RSS_GROWTH_LIMIT:.0%})",
        f"  scheduler fds        {s.fds_start} -> {s.fds_end} ({s.fd_growth:+d}; limit +{FD_SLACK})",
        f"  database size        {s.db_start_mib:.1f} -> {s.db_end_mib:.1f} MiB",
        f"latency drift: median of the per-minute p99s, samples at {_minutes(s.first_window)} min "
        f"(load1 {s.load_first:.1f}) against {_minutes(s.last_window)} min (load1 {s.load_last:.1f}):",
        f"  SubmitJob p99        {s.submit_p99_first_ms:.1f} -> {s.submit_p99_last_ms:.1f} ms "
        f"(x{s.submit_drift:.2f}; {limit})",
        f"  ReportStatus p99     {s.report_p99_first_ms:.1f} -> {s.report_p99_last_ms:.1f} ms "
        f"(x{s.report_drift:.2f}; {limit})",
        f"counts at the last sample: submits {s.submits}, cancels {s.cancels}, completed {s.completed}, "
        f"loans {s.loans}, reclaims {s.reclaims}",
        f"after the load stopped: acknowledged jobs {o.acknowledged}, lost {o.lost}; cancellations not applied "
        f"{o.cancels_not_applied}",
        "errors: expected " + (", ".join(f"{k} x{v}" for k, v in sorted(expected.items())) or "none")
        + "; unexpected " + (", ".join(f"{k} x{v}" for k, v in sorted(unexpected.items())) or "none"),
    ]
    lines += [f"  first {k}: {o.messages[k]}" for k in sorted(o.messages) if k in o.errors]
    lines.append(f"leader lease: term {o.lease_epochs[0]} when the load started, {o.lease_epochs[1]} after it stopped")
    lines += [f"FAILED: {f}" for f in s.failures]
    return "\n".join(lines) + "\n"


def _minutes(window: tuple[float, float]) -> str:
    a, b = (t / 60 for t in window)
    return f"{a:.0f}" if round(a) == round(b) else f"{a:.0f}-{b:.0f}"


def percentile_ms(samples_s: Sequence[float], pct: int) -> float:
    if len(samples_s) < 2:
        return samples_s[0] * 1e3 if samples_s else math.nan
    return statistics.quantiles(samples_s, n=100, method="inclusive")[pct - 1] * 1e3


# ---------------------------------------------------------------------------------------------
# The load driver: submits, cancels and demand, on its own thread and event loop


@dataclass(frozen=True)
class Regime:
    agents: int
    inference_agents: int
    submits_per_s: float
    cancels_per_s: float
    demand_period_s: float

    @property
    def training_agents(self) -> int:
        return self.agents - self.inference_agents

    def demand(self, t_s: float) -> int:
        """Inference servers needed at ``t_s``: a sine from all but one (t = 0) down to a fifth."""
        high, low = max(1, self.inference_agents - 1), max(1, self.inference_agents // 5)
        return round(low + (high - low) * (0.5 + 0.5 * math.cos(2 * math.pi * t_s / self.demand_period_s)))

    def describe(self) -> dict[str, object]:
        return {
            "agents": f"{self.agents} ({self.training_agents} training + {self.inference_agents} inference, "
                      f"{shards_for(self.agents)} shard processes, 8 GPUs each, one report per interval)",
            "submits": f"{self.submits_per_s:g}/s Poisson ({RIGID_SHARE:.0%} rigid 1..4 workers, the rest elastic "
                       f"1..4 up to 8..32 workers, 8 GPUs/worker, run {RUN_S[0]:.0f}..{RUN_S[1]:.0f} s once placed)",
            "cancels": f"{self.cancels_per_s:g}/s Poisson among the {RECENT_JOBS} latest jobs",
            "demand": f"ReportDemand every {DEMAND_REPORT_S:g} s, servers_needed a sine "
                      f"{self.demand(self.demand_period_s / 2)}..{self.demand(0)} over {self.demand_period_s:g} s",
            "scheduler": "defaults except " + ", ".join(f"{k.removeprefix('ARYL_').lower()}={v}"
                                                         for k, v in SETTINGS.items()),
        }


class Driver:
    """Submits, cancels and demand reports. With a ``pki`` each user calls with its own token (and the
    client certificate), and the demand comes from the router ``ROUTER`` with its certificate and
    token; without one, plaintext on one channel."""

    def __init__(self, address: str, regime: Regime, seed: int, pki: Path | None) -> None:
        self._address = address
        self._pki = pki
        self._regime = regime
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="soak-driver", daemon=True)
        self.acked: list[str] = []               # acknowledged job ids, in order
        self._owner: dict[str, str] = {}         # job id -> the user that submitted it
        self.cancelled: set[str] = set()         # acknowledged cancellations
        self._tried: set[str] = set()            # jobs a cancellation was sent for (never picked again)
        self.errors: Counter[str] = Counter()
        self.messages: dict[str, str] = {}       # the first message of each kind of error
        self._submit_latency: list[float] = []
        self.crashed: BaseException | None = None
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=RPC_TIMEOUT_S + 30)

    def drain_latency(self) -> list[float]:
        with self._lock:
            got, self._submit_latency = self._submit_latency, []
        return got

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # a broken driver fails the soak
            log.exception("the load driver failed")
            self.crashed = exc

    async def _run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            def channel(cert: str, principal: str) -> grpc.aio.Channel:
                opened = secure_aio_channel(self._address, client_security(self._pki, cert, principal), [])
                stack.push_async_callback(opened.close)
                return opened

            if self._pki is None:
                shared = channel("", "")
                jobs = {user: scheduler_pb2_grpc.SchedulerServiceStub(shared) for user in USERS}
                inference = inference_pb2_grpc.InferenceServiceStub(shared)
            else:
                jobs = {user: scheduler_pb2_grpc.SchedulerServiceStub(channel("client", user)) for user in USERS}
                inference = inference_pb2_grpc.InferenceServiceStub(channel(f"router-{ROUTER}", ROUTER))
            calls: set[asyncio.Task[None]] = set()
            loops = [self._poisson(self._regime.submits_per_s, lambda: self._submit(jobs), calls),
                     self._poisson(self._regime.cancels_per_s, lambda: self._cancel(jobs), calls),
                     self._demand(inference)]
            await asyncio.gather(*loops)
            await asyncio.gather(*calls)  # every call sent is answered before the checks

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; False once stopping."""
        end = time.monotonic() + seconds
        while not self._stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, 0.5))
        return False

    async def _poisson(
        self, rate: float, call: Callable[[], Coroutine[Any, Any, None]], calls: set[asyncio.Task[None]]
    ) -> None:
        if rate <= 0:
            return
        while await self._sleep(self._rng.expovariate(rate)):
            task = asyncio.create_task(call())
            calls.add(task)
            task.add_done_callback(calls.discard)

    def _spec(self) -> types_pb2.JobSpec:
        rng = self._rng
        if rng.random() < RIGID_SHARE:
            low = high = rng.randint(1, 4)
        else:
            low, high = rng.randint(1, 4), rng.randint(8, 32)
        return types_pb2.JobSpec(
            name=f"soak-{'rigid' if low == high else 'elastic'}-{uuid.uuid4().hex[:8]}",
            user=rng.choice(USERS), command=["python", "train.py"],
            env={RUN_ENV: f"{rng.uniform(*RUN_S):.0f}"}, gpus_per_worker=GPUS_PER_WORKER,
            min_workers=low, max_workers=high,
        )

    async def _submit(self, stubs: Mapping[str, scheduler_pb2_grpc.SchedulerServiceStub]) -> None:
        request = scheduler_pb2.SubmitJobRequest(spec=self._spec(), idempotency_key=uuid.uuid4().hex)
        sent = time.perf_counter()
        try:
            reply = await stubs[request.spec.user].SubmitJob(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._error("SubmitJob", exc)
            return
        with self._lock:
            self._submit_latency.append(time.perf_counter() - sent)
            self.acked.append(reply.job.job_id)
            self._owner[reply.job.job_id] = request.spec.user

    async def _cancel(self, stubs: Mapping[str, scheduler_pb2_grpc.SchedulerServiceStub]) -> None:
        with self._lock:
            recent = [j for j in self.acked[-RECENT_JOBS:] if j not in self._tried]
        if not recent:
            return
        job_id = self._rng.choice(recent)
        self._tried.add(job_id)
        try:  # by its owner: a user may cancel only its own jobs
            await stubs[self._owner[job_id]].CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="soak"),
                                                       timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._error("CancelJob", exc)
            return
        self.cancelled.add(job_id)

    def _error(self, method: str, exc: grpc.aio.AioRpcError) -> None:
        key = f"{method}:{exc.code().name}"
        self.errors[key] += 1
        self.messages.setdefault(key, exc.details() or "")

    async def _demand(self, stub: inference_pb2_grpc.InferenceServiceStub) -> None:
        while not self._stop.is_set():
            needed = self._regime.demand(time.monotonic() - self._started)
            try:
                await stub.ReportDemand(inference_pb2.ReportDemandRequest(
                    servers_needed=needed, observed_rps=10.0 * needed, source="aryl-soak"), timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                self._error("ReportDemand", exc)
            await self._sleep(DEMAND_REPORT_S)


# ---------------------------------------------------------------------------------------------
# Sampling, output and the run


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


_DB_SQL = sa.text("""
    SELECT pg_database_size(current_database()),
           (SELECT count(*) FROM events),
           (SELECT count(*) FROM jobs),
           (SELECT count(*) FROM jobs WHERE state IN ('PENDING', 'RUNNING', 'SCALING', 'PREEMPTED')),
           (SELECT count(*) FROM jobs WHERE state = 'COMPLETED'),
           (SELECT count(*) FROM loans),
           (SELECT count(*) FROM loans WHERE state <> 'ACTIVE')
""")


class Recorder:
    """Writes ``soak.csv`` as samples come (a killed run keeps what it had) and the plot."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.samples: list[Sample] = []
        self._csv = (out / "soak.csv").open("w", newline="")
        self._writer = csv.DictWriter(self._csv, fieldnames=[f.name for f in fields(Sample)])
        self._writer.writeheader()

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        self._writer.writerow({k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(sample).items()})
        self._csv.flush()

    def close(self) -> None:
        self._csv.close()

    def plot(self, title: str) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t = [s.t_s / 60 for s in self.samples]
        fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
        panels: list[tuple[Any, str, list[tuple[str, list[float]]]]] = [
            (axes[0][0], "scheduler RSS (MiB)", [("rss", [s.rss_mib for s in self.samples])]),
            (axes[0][1], "scheduler open fds", [("fds", [float(s.fds) for s in self.samples])]),
            (axes[1][0], "database size (MiB)", [("db", [s.db_mib for s in self.samples])]),
            (axes[1][1], "rows", [("events", [float(s.events_rows) for s in self.samples]),
                                  ("jobs", [float(s.jobs_rows) for s in self.samples]),
                                  ("active jobs", [float(s.jobs_active) for s in self.samples])]),
            (axes[2][0], "SubmitJob latency (ms)", [("p50", [s.submit_p50_ms for s in self.samples]),
                                                   ("p99", [s.submit_p99_ms for s in self.samples])]),
            (axes[2][1], "ReportStatus latency (ms)", [("p50", [s.report_p50_ms for s in self.samples]),
                                                      ("p99", [s.report_p99_ms for s in self.samples])]),
        ]
        for ax, label, series in panels:
            for name, ys in series:
                ax.plot(t, ys, marker=".", label=name)
            ax.set_title(label)
            ax.grid(True, alpha=0.3)
            if len(series) > 1:
                ax.legend()
        for ax in axes[2]:
            ax.set_xlabel("minutes")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(self.out / "soak.png", dpi=90)
        plt.close(fig)


def _sample(t_s: float, pid: int, engine: sa.Engine, driver: Driver, fleet: SoakFleet, *, window: bool = True
            ) -> Sample:
    """One sample; ``window``: latencies over the calls answered since the last one (the first
    sample has no window before it: its latencies are NaN)."""
    with engine.connect() as conn:
        db_bytes, events, jobs, active, completed, loans, reclaims = conn.execute(_DB_SQL).one()
    submit = driver.drain_latency()
    reports, report_errors, _ = fleet.drain()
    report_s = [lat for _, lat in reports]
    if not window:
        submit, report_s = [], []
    errors = Counter(driver.errors) + Counter(report_errors)
    return Sample(
        t_s=t_s, rss_mib=_rss_mib(pid), fds=_fds(pid), db_mib=db_bytes / 2**20, events_rows=events, jobs_rows=jobs,
        jobs_active=active, submits=len(driver.acked), cancels=len(driver.cancelled), completed=completed, loans=loans,
        reclaims=reclaims, errors=sum(v for k, v in errors.items() if k not in EXPECTED_ERRORS),
        submit_calls=len(submit), submit_p50_ms=percentile_ms(submit, 50), submit_p99_ms=percentile_ms(submit, 99),
        reports=len(report_s), report_p50_ms=percentile_ms(report_s, 50), report_p99_ms=percentile_ms(report_s, 99),
        load1=os.getloadavg()[0],
    )


def _code_version() -> str:
    """The commit the scheduler ran from, and whether the working tree differed from it."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{head}" + (f" with {len(dirty)} modified tracked file(s)" if dirty else "")


def _exit_code(scheduler: SchedulerProcess) -> int | None:
    """The scheduler's exit status once it has exited, else None."""
    proc = scheduler._proc  # SchedulerProcess keeps its Popen private; only read here
    return None if proc is None else proc.poll()


_LEASE_SQL = sa.text("SELECT epoch FROM leader_lease WHERE id = 1")


def _lease_epoch(engine: sa.Engine) -> int | None:
    """The leader lease's current term; None when no scheduler has taken it."""
    with engine.connect() as conn:
        epoch = conn.execute(_LEASE_SQL).scalar_one_or_none()
    return None if epoch is None else int(epoch)


def _database_settings(engine: sa.Engine) -> str:
    """The PostgreSQL server's settings that move a long run's figures: without autovacuum, dead rows
    of the tables updated on every cycle (allocations, jobs, gpus) pile up for the whole run."""
    with engine.connect() as conn:
        got = {name: conn.execute(sa.text(f"SHOW {name}")).scalar_one() for name in ("autovacuum", "jit")}
        version = conn.execute(sa.text("SHOW server_version")).scalar_one()
    return f"PostgreSQL {version}, " + ", ".join(f"{k}={v}" for k, v in got.items())


def _autovacuum_off(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SHOW autovacuum")).scalar_one()).lower() == "off"


def _vacuum(engine: sa.Engine) -> None:
    """VACUUM (ANALYZE) the scratch database: what autovacuum does on a server that runs it (``--vacuum``)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE)"))


def make_pki(directory: Path, server_ids: Sequence[str]) -> None:
    """A development CA (``arylctl certs init``) with a certificate and token for every agent, the
    router and each user."""
    certs.init(directory, certs.DevCluster(agents=tuple(server_ids), routers=(ROUTER,), users=USERS))


def security_settings(pki: Path | None) -> dict[str, str]:
    """The scheduler's security settings: mutual TLS and the token file from ``pki``; plaintext
    without identities when None."""
    if pki is None:
        return {"ARYL_SECURITY__INSECURE": "true"}
    return {"ARYL_SECURITY__INSECURE": "false", "ARYL_SECURITY__TLS_CERT": str(pki / "scheduler.crt"),
            "ARYL_SECURITY__TLS_KEY": str(pki / "scheduler.key"),
            "ARYL_SECURITY__TLS_CLIENT_CA": str(pki / "ca.crt"),
            "ARYL_SECURITY__TOKENS_FILE": str(pki / certs.TOKENS_FILE)}


def _verify(engine: sa.Engine, driver: Driver, errors: Mapping[str, int], messages: Mapping[str, str],
            scheduler_exit: int | None, lease_epochs: tuple[int | None, int | None]) -> Outcome:
    acked = {int(j) for j in driver.acked}
    cancelled = {int(j) for j in driver.cancelled}
    with engine.connect() as conn:
        states = {int(job_id): str(state) for job_id, state in conn.execute(sa.text("SELECT id, state FROM jobs"))}
    lost = sorted(acked - states.keys())
    not_cancelled = sorted(j for j in cancelled if states.get(j) not in (None, "CANCELLED"))
    if lost:
        log.error("acknowledged jobs missing from the database: %s", lost[:20])
    if not_cancelled:
        log.error("acknowledged cancellations not CANCELLED: %s", [(j, states[j]) for j in not_cancelled[:20]])
    return Outcome(acknowledged=len(acked), lost=len(lost), cancels_not_applied=len(not_cancelled),
                   errors=dict(errors), scheduler_exit=scheduler_exit, messages=dict(messages),
                   lease_epochs=lease_epochs)


def _sample_until(duration_s: float, sample_s: float, scheduler: SchedulerProcess, engine: sa.Engine,
                  driver: Driver, fleet: SoakFleet, recorder: Recorder, *, vacuum: bool = False) -> int | None:
    """Sample at the start and every ``sample_s`` until ``duration_s``; the scheduler's exit status
    if it exited meanwhile (sampling stops there), else None. ``vacuum``: after each sample, VACUUM the
    scratch database (``_vacuum``)."""
    t0 = time.monotonic()
    recorder.add(_sample(0.0, scheduler.pid, engine, driver, fleet, window=False))
    n = 1
    while True:
        due = t0 + min(n * sample_s, duration_s)
        while time.monotonic() < due:
            time.sleep(min(1.0, due - time.monotonic()))
            if _exit_code(scheduler) is not None or driver.crashed is not None or not fleet.alive():
                break
        if (code := _exit_code(scheduler)) is not None:
            log.error("the scheduler exited with code %s", code)
            return code
        if driver.crashed is not None:
            raise RuntimeError(f"the load driver failed: {driver.crashed!r}")
        if not fleet.alive():
            raise RuntimeError("an agent shard died")
        recorder.add(s := _sample(time.monotonic() - t0, scheduler.pid, engine, driver, fleet))
        if vacuum:
            _vacuum(engine)
        log.info("%.1f min: RSS %.1f MiB, fds %d, db %.1f MiB, submit p99 %.1f ms, report p99 %.1f ms, submits %d, "
                 "cancels %d, completed %d, active %d, loans %d, reclaims %d, errors %d, load %.1f",
                 s.t_s / 60, s.rss_mib, s.fds, s.db_mib, s.submit_p99_ms, s.report_p99_ms, s.submits, s.cancels,
                 s.completed, s.jobs_active, s.loans, s.reclaims, s.errors, s.load1)
        if n % 10 == 0:
            recorder.plot("Aryl soak (in progress)")
        if s.t_s >= duration_s - 1:
            return None
        n += 1


def run(args: argparse.Namespace) -> Summary:
    agents = args.agents
    inference = max(2, round(agents * INFERENCE_SHARE))
    submits = args.submits_per_s or SUBMITS_PER_S_PER_1000_AGENTS * agents / 1000
    regime = Regime(agents=agents, inference_agents=inference, submits_per_s=submits,
                    cancels_per_s=submits * CANCEL_SHARE, demand_period_s=args.demand_period_s)
    described = regime.describe()
    described["security"] = (
        "INSECURE (--insecure): plaintext, no identities" if args.insecure else
        f"mutual TLS + bearer tokens (arylctl certs init: a certificate and token per agent, {len(USERS)} users "
        f"with a token each, router {ROUTER!r})")
    described["leader lease"] = "on (always on PostgreSQL), ha.lease_s and ha.renew_s at their defaults"
    described["duration"] = f"{args.minutes:g} min, sampled every {args.sample_s:g} s"
    described["code"] = _code_version()
    warmup_s = warmup_seconds(args.minutes)
    duration_s = args.minutes * 60.0
    recorder = Recorder(Path(args.out))
    agents_of = ([(soak_server_name("training", i), "training") for i in range(regime.training_agents)]
                 + [(soak_server_name("inference", i), "inference") for i in range(inference)])
    _raise_fd_limit()
    try:
        with _sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="aryl-soak-pki-") as tmp, \
                scratch_database(args.database_url) as url:
            pki = None if args.insecure else Path(tmp)
            if pki is not None:
                make_pki(pki, [server_id for server_id, _ in agents_of])
            engine = sa.create_engine(url, pool_size=1, max_overflow=1)
            try:
                described["database"] = _database_settings(engine)
                vacuum = args.vacuum == "auto" and _autovacuum_off(engine)
                described["vacuum"] = ("by the soak after each sample (the server's autovacuum is off; "
                                       "a production server runs it: docs/operations.md)" if vacuum else "autovacuum's")
                with SchedulerProcess(url, {**SETTINGS, **security_settings(pki)}) as scheduler, \
                        SoakFleet(scheduler.address, pki) as fleet:
                    started = time.monotonic()
                    fleet.add_agents(agents_of)
                    log.info("%d agents registered and watching in %.0fs", fleet.agents, time.monotonic() - started)
                    lease_began = _lease_epoch(engine)
                    driver = Driver(scheduler.address, regime, args.seed, pki)
                    driver.start()
                    try:
                        scheduler_exit = _sample_until(duration_s, args.sample_s, scheduler, engine, driver, fleet,
                                                       recorder, vacuum=vacuum)
                    finally:
                        driver.stop()  # every call sent has been answered
                    _, report_errors, messages = fleet.drain()
                    errors = Counter(driver.errors) + Counter(report_errors)
                    outcome = _verify(engine, driver, errors, {**messages, **driver.messages}, scheduler_exit,
                                      (lease_began, _lease_epoch(engine)))
            finally:
                engine.dispose()
    finally:
        recorder.close()
    summary = summarize(recorder.samples, outcome, warmup_s=warmup_s)
    text = render(summary, described)
    recorder.plot(f"Aryl soak: {regime.agents} agents, {args.minutes:g} min "
                  f"(RSS {_pct(summary.rss_growth)} after warm-up)")
    (recorder.out / "summary.txt").write_text(text)
    print(text, end="")
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the load (default %(default)s)")
    parser.add_argument("--agents", type=int, default=1000,
                        help="simulated agents, a fifth of them inference servers (default %(default)s)")
    parser.add_argument("--out", default="soak-results", help="folder for soak.csv, soak.png, summary.txt")
    parser.add_argument("--submits-per-s", type=float, default=0.0,
                        help=f"submission rate (default {SUBMITS_PER_S_PER_1000_AGENTS:g}/s per 1,000 agents); "
                             f"cancels come at {CANCEL_SHARE:g} times it")
    parser.add_argument("--demand-period-s", type=float, default=300.0,
                        help="period of the inference demand's sine (default %(default)s)")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext gRPC without certificates or tokens (default: mutual TLS + tokens, as "
                             "a production deployment runs)")
    parser.add_argument("--vacuum", choices=("auto", "never"), default="auto",
                        help="auto (the default): where the PostgreSQL server has autovacuum off, VACUUM the "
                             "soak's database after each sample, as autovacuum would on a production server; "
                             "never: leave its dead rows (what a server without autovacuum does to the scheduler)")
    parser.add_argument(
        "--database-url", default=os.environ.get("ARYL_BENCH_DATABASE_URL", DEFAULT_ADMIN_URL),
        help="PostgreSQL URL allowed to create databases; the soak creates, migrates and drops its own "
             "aryl_bench_<random> next to it (default: $ARYL_BENCH_DATABASE_URL, else %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.agents < 10 or args.minutes <= 0 or args.sample_s <= 0:
        parser.error("--agents must be at least 10, --minutes and --sample-s positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    log.info("soak: %g min, %d agents; load average %.2f on %d CPUs", args.minutes, args.agents,
             os.getloadavg()[0], os.cpu_count() or 0)
    try:
        summary = run(args)
    except Exception:
        log.exception("the soak could not run")
        return 1
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
