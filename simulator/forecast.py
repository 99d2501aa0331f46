"""Forecasts from the cluster as it is now: each job's expected start and finish (the ETA), and what-if
runs of the next hours under another policy, other parameters or more inference servers.

Both run the simulator's engine (``simulator.engine.simulate``: the service's own scheduling cycle and
policy, a virtual clock, simulated agents) forward from a ``ClusterSnapshot`` -- the live service's,
or a simulation's -- with no arrivals beyond the jobs already there and the inference demand held at
its last value. Nouns:

- *Estimate* (``trace_jobs``): what the forecast takes a job's remaining work and speed to be. The
  remaining time at its reference size (its current size while it runs, ``min_workers`` while it
  waits) is ``core.predict.remaining_seconds`` -- the job's own measured rate once it reported
  progress, else its throughput hints -- and, where nothing is declared or measured, the policy's
  own estimate (``core.throughput.estimate`` with ``default_runtime_s``). Other sizes follow the
  job's throughput model (``core.throughput``). The forecast's policy sees these estimates as the
  jobs' declared points and total work, so it decides on the best estimate there is.
- *ETA* (``JobForecast``): the start a pending job gets in the forecast and when it finishes there;
  ``after``: the jobs whose GPUs it takes when it starts (they finish, shrink or are preempted first).
- *Budget*: a forecast stops at ``horizon_s`` of virtual time, after ``max_cycles`` cycles, or after
  ``wall_budget_s`` seconds of host time, whichever comes first; a job not started by then has no ETA
  (``Forecast.stop_reason`` says why the run stopped).

Assumptions (beside the simulated agents', ``simulator.cluster``): no job arrives, fails or is
cancelled; no server fails; demand stays as last reported; a running job checkpointed last at its
``last_checkpoint_at`` and checkpoints every ``checkpoint_interval_s`` from now. What this module
must never do: write to the live cluster, decide (the policy does), or read the wall clock for
anything but its own budget.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler_service.core.apply_rules import ApplySettings
from scheduler_service.core.params import PolicyParams, changed_params
from scheduler_service.core.plan import ApplyResult, Plan, ScaleJob, StartJob
from scheduler_service.core.predict import remaining_seconds
from scheduler_service.core.registry import FaultsFirst, Policy
from scheduler_service.core.snapshot import ClusterSnapshot, ServerView, derived
from scheduler_service.core.throughput import estimate
from scheduler_service.cycle import ClusterState
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.solvers import warm_up as warm_up_solvers
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import SimulationResult, simulate
from simulator.model import TraceJob
from simulator.results import Summary, format_table, summarize

# Defaults of a forecast's bounds. A week of virtual time covers any queue worth an ETA; the cycle
# and wall budgets keep one forecast to a small share of a scheduler's time (docs/evaluation.md, eta).
DEFAULT_HORIZON_S = 7 * 86400.0
DEFAULT_MAX_CYCLES = 2000
DEFAULT_WALL_BUDGET_S = 2.0
# What-if: at most this far ahead, and this long in host time per run (two runs per call).
WHAT_IF_MAX_HORIZON_S = 7 * 86400.0
WHAT_IF_WALL_BUDGET_S = 10.0
# Points of a job's speed curve handed to the forecast (1..this workers; beyond, the model's slope).
_MAX_POINTS = 256


@dataclass(frozen=True, slots=True)
class ForecastSettings:
    """How a forecast runs: its bounds and the simulated agents' timings (``simulator.engine``)."""

    horizon_s: float = DEFAULT_HORIZON_S
    max_cycles: int = DEFAULT_MAX_CYCLES
    wall_budget_s: float = DEFAULT_WALL_BUDGET_S
    cycle_interval_s: float = 300.0
    restart_overhead_s: float = 30.0
    checkpoint_interval_s: float = 1800.0
    drain_ack_s: float | None = 1.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class JobForecast:
    """One job in a forecast. Times on the snapshot's clock; None: not within the forecast."""

    job_id: int
    start: float | None          # a pending job's next start; a running job's first start
    finish: float | None
    after: tuple[int, ...] = ()  # pending: the jobs whose GPUs it takes when it starts, ascending
    after_finished: bool = True  # ... all of them finished by then (else some shrank or were preempted)


@dataclass(frozen=True)
class Forecast:
    made_at: float                      # the snapshot's ``now``
    policy: str
    jobs: Mapping[int, JobForecast]     # every active job of the snapshot
    stop_reason: str                    # the engine's: "completed", "max_time", "stalled" or "budget"
    horizon_end: float                  # virtual time the run reached
    cycles: int
    wall_s: float = field(default=0.0, compare=False)

    def get(self, job_id: int) -> JobForecast | None:
        return self.jobs.get(job_id)


def trace_jobs(snapshot: ClusterSnapshot, params: PolicyParams) -> tuple[dict[int, TraceJob], dict[int, float]]:
    """Each active job of ``snapshot`` as the forecast's trace job (see *Estimate* in the module doc),
    and the work each running job did since its last checkpoint (lost if it is preempted)."""
    traces: dict[int, TraceJob] = {}
    done: dict[int, float] = {}
    now = snapshot.now
    speeds = dict(snapshot.gpu_speed)
    for job in snapshot.jobs:
        if job.state.is_terminal:
            continue
        running = job.state.holds_gpus and bool(job.workers)
        size = job.num_workers if running else job.min_workers
        est = estimate(job, now=now, default_runtime_s=params.default_runtime_s, alpha=params.amdahl_alpha)
        model = est.model
        estimated = est.remaining_time(size)
        predicted = remaining_seconds(job, size, now, alpha=params.amdahl_alpha)
        # The speed curve scaled so that the job needs ``predicted`` seconds at ``size`` (the policy's own
        # estimate where nothing better is known).
        scale = estimated / predicted if predicted and math.isfinite(estimated) and estimated > 0 else 1.0
        window = job.progress_window
        if running and speeds and window is not None and window.rate is not None:
            # A measured rate is already at its GPU type's speed, which the simulated cluster applies again.
            scale /= speeds.get(snapshot.server(job.workers[0].server_id).gpu_type, 1.0) or 1.0
        most = max(min(job.max_workers, _MAX_POINTS), job.min_workers)
        points = tuple((w, scale * model.speed(w)) for w in range(1, most + 1))
        speed = scale * model.speed(size)
        remaining = est.remaining_work if math.isfinite(estimated) else 0.0
        # Work since its last checkpoint (a resize or start is one: it resumed from a checkpoint then).
        since = job.since_checkpoint(now) * speed if running else 0.0
        work = remaining + since
        if not work > 0:
            work = max(speed, 1.0) * 1e-6  # done already: it completes at once
        traces[job.job_id] = TraceJob(
            job_id=job.job_id, name=f"job {job.job_id}", submit_time=job.submitted_at,
            gpus_per_worker=job.gpus_per_worker, min_workers=job.min_workers, max_workers=job.max_workers,
            work=work, throughput=points, deadline=job.deadline, priority=job.priority, queue=job.queue,
            user=job.user, priority_class=job.priority_class, gpu_types=job.gpu_types,
        )
        if since > 0:
            done[job.job_id] = since
    return traces, done


class _StartWatcher:
    """A port decorator that notes, for each job the forecast starts, whose GPUs it takes: the last job
    each GPU was held by, as the snapshots showed it and the applied starts and resizes placed it."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._holder: dict[tuple[str, int], int] = {}
        self.after: dict[int, tuple[int, ...]] = {}
        self.cycles = 0

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        snapshot = self._state.snapshot(seed=seed)
        for server in snapshot.servers:
            for gpu, job_id in server.allocated:
                self._holder[(server.server_id, gpu)] = job_id
        return snapshot

    def apply(self, plan: Plan) -> ApplyResult:
        self.cycles += 1
        result = self._state.apply(plan)
        started, scaled = set(result.started), set(result.scaled)
        placed: tuple[StartJob | ScaleJob, ...] = (*plan.starts, *plan.scales)
        for action in placed:
            if action.job_id not in started and action.job_id not in scaled:
                continue
            gpus = [(w.server_id, g) for w in action.workers for g in w.gpu_indices]
            if action.job_id in started and action.job_id not in self.after:
                holders = {h for gpu in gpus if (h := self._holder.get(gpu)) is not None and h != action.job_id}
                self.after[action.job_id] = tuple(sorted(holders))
            for gpu in gpus:  # it may finish before the next snapshot sees it there
                self._holder[gpu] = action.job_id
        return result


def _decider(policy: str | Policy) -> str | Policy:
    """A registry-made policy runs as the engine would wrap it (``FaultsFirst`` once)."""
    return policy.policy if isinstance(policy, FaultsFirst) else policy


def run_forward(
    snapshot: ClusterSnapshot, policy: str | Policy, params: PolicyParams, settings: ForecastSettings,
) -> tuple[SimulationResult, dict[int, tuple[int, ...]]]:
    """The engine run from ``snapshot`` under ``policy`` within ``settings``' bounds, and each started
    job's ``after`` jobs. Raises UnknownPolicy for a name not registered."""
    clock = VirtualClock(snapshot.now)
    traces, done = trace_jobs(snapshot, params)
    cluster = SimulatedCluster.from_snapshot(
        snapshot, traces, clock, done_since_checkpoint=done, restart_overhead_s=settings.restart_overhead_s,
        checkpoint_interval_s=settings.checkpoint_interval_s, drain_ack_s=settings.drain_ack_s,
        apply_settings=ApplySettings.of(params),
    )
    watchers: list[_StartWatcher] = []

    def watch(state: ClusterState) -> ClusterState:
        watchers.append(_StartWatcher(state))
        return watchers[0]

    wall_end = time.perf_counter() + settings.wall_budget_s

    def over_budget() -> bool:
        return (bool(watchers) and watchers[0].cycles >= settings.max_cycles) or time.perf_counter() > wall_end

    result = simulate(
        [], [], cluster.spec, _decider(policy), params, seed=settings.seed,
        cycle_interval_s=settings.cycle_interval_s, max_time_s=snapshot.now + settings.horizon_s,
        cluster=cluster, clock=clock, wrap_state=watch, stop_when=over_budget,
    )
    return result, (watchers[0].after if watchers else {})


def forecast(
    snapshot: ClusterSnapshot, policy: str | Policy, params: PolicyParams,
    settings: ForecastSettings = ForecastSettings(),
) -> Forecast:
    """Every active job's expected start and finish from ``snapshot`` under ``policy`` (see the module doc)."""
    began = time.perf_counter()
    result, after = run_forward(snapshot, policy, params, settings)
    ends = {o.job_id: o.end for o in result.jobs}
    jobs: dict[int, JobForecast] = {}
    for outcome in result.jobs:
        start = outcome.start
        blockers = after.get(outcome.job_id, ())
        finished = start is not None and all((e := ends.get(b)) is not None and e <= start for b in blockers)
        jobs[outcome.job_id] = JobForecast(outcome.job_id, start, outcome.end, blockers, finished)
    return Forecast(made_at=snapshot.now, policy=result.policy, jobs=jobs, stop_reason=result.stop_reason,
                    horizon_end=result.end_time, cycles=result.cycles, wall_s=time.perf_counter() - began)


# -- what-if -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WhatIfRun:
    label: str                # the table's column: "now: aryl", "what-if: pollux"
    policy: str
    params: PolicyParams
    summary: Summary          # ``simulator.results.summarize`` of the run, times from the snapshot's now


@dataclass(frozen=True)
class WhatIf:
    horizon_s: float
    current: WhatIfRun
    alternative: WhatIfRun
    table: str                # ``aryl-sim compare``'s table: the alternative's ratios to the current setting
    wall_s: float = field(default=0.0, compare=False)


def with_inference_servers(snapshot: ClusterSnapshot, change: int) -> ClusterSnapshot:
    """``snapshot`` with ``change`` more inference servers (SERVING, as many GPUs as the largest there is),
    or ``-change`` fewer (idle SERVING ones, the last ids first). ValueError when not that many are idle."""
    if change == 0:
        return snapshot
    inference = [s for s in snapshot.servers if s.pool == Pool.INFERENCE]
    if change > 0:
        gpus = max((len(s.gpu_indices) for s in inference or snapshot.servers), default=8) or 8
        gpu_type = inference[0].gpu_type if inference else ""
        added = tuple(
            ServerView(f"what-if-{k:04d}", Pool.INFERENCE, ServerState.SERVING, tuple(range(gpus)),
                       state_since=snapshot.now - 86400.0, gpu_type=gpu_type)
            for k in range(change)
        )
        return derived(snapshot, servers=snapshot.servers + added)
    idle = [s for s in inference if s.state == ServerState.SERVING and not s.allocated and not s.cordoned]
    if len(idle) < -change:
        raise ValueError(f"cannot remove {-change} inference server(s): {len(idle)} are serving and idle")
    gone = {s.server_id for s in sorted(idle, key=lambda s: s.server_id)[change:]}
    return derived(snapshot, servers=tuple(s for s in snapshot.servers if s.server_id not in gone))


def _rebased(result: SimulationResult, origin: float) -> SimulationResult:
    """``result`` with its times counted from ``origin`` (the snapshot's now), as a trace's are from its
    start: the table's makespan and utilisation then cover the forecast alone."""
    jobs = tuple(dataclasses.replace(
        j, submit=j.submit - origin, start=None if j.start is None else j.start - origin,
        end=None if j.end is None else j.end - origin, deadline=None if j.deadline is None else j.deadline - origin,
    ) for j in result.jobs)
    samples = tuple(dataclasses.replace(s, time=s.time - origin) for s in result.utilisation)
    return dataclasses.replace(result, jobs=jobs, utilisation=samples, end_time=result.end_time - origin)


def what_if(
    snapshot: ClusterSnapshot, current: tuple[str, PolicyParams], alternative: tuple[str, PolicyParams], *,
    horizon_s: float, extra_inference_servers: int = 0, settings: ForecastSettings = ForecastSettings(),
) -> WhatIf:
    """The next ``horizon_s`` from ``snapshot`` under the ``current`` (policy name, parameters) and under
    the ``alternative`` one (with ``extra_inference_servers`` more inference servers, or fewer when
    negative), summarised and set side by side as ``aryl-sim compare`` prints them. ValueError for a
    horizon outside (0, WHAT_IF_MAX_HORIZON_S]; UnknownPolicy for a name not registered."""
    if not 0 < horizon_s <= WHAT_IF_MAX_HORIZON_S:
        raise ValueError(f"the horizon must be > 0 and at most {WHAT_IF_MAX_HORIZON_S / 3600:.0f} h (got "
                         f"{horizon_s / 3600:g} h)")
    began = time.perf_counter()
    bounded = dataclasses.replace(settings, horizon_s=horizon_s, max_cycles=10**9,
                                  wall_budget_s=min(settings.wall_budget_s, WHAT_IF_WALL_BUDGET_S))
    runs = []
    for kind, (name, params), state in (("now", current, snapshot),
                                         ("what-if", alternative,
                                          with_inference_servers(snapshot, extra_inference_servers))):
        result, _ = run_forward(state, name, params, bounded)
        label = f"{kind}: {name}"
        runs.append(WhatIfRun(label, name, params, summarize(_rebased(result, snapshot.now))))
    table = format_table({run.label: run.summary for run in runs})
    return WhatIf(horizon_s, runs[0], runs[1], table, wall_s=time.perf_counter() - began)


def warm_up_kernels() -> None:
    """Load (or compile) the scheduling kernels (numba) before any forecast is timed: in a fresh process the
    first forecast would pay for it out of its wall budget (``ForecastSettings.wall_budget_s``)."""
    warm_up_solvers()


@dataclass(frozen=True, slots=True)
class SimulatorForecastEngine:
    """The forecast engine the service is given (``scheduler_service.app.forecast.ForecastEngine``; wired
    in by ``scheduler_service.server``, the one module of the service that imports the simulator): the
    forecast and the what-if above, under ``settings``. A plain value, so that it can be sent to the
    forecast's own process (``app.forecast.ForecastProcess``)."""

    settings: ForecastSettings = ForecastSettings()

    def forecast(self, snapshot: ClusterSnapshot, policy: str, params: PolicyParams) -> Forecast:
        return forecast(snapshot, policy, params, self.settings)

    def what_if(self, snapshot: ClusterSnapshot, current: tuple[str, PolicyParams],
                alternative: tuple[str, PolicyParams], *, horizon_s: float, extra_inference_servers: int) -> WhatIf:
        return what_if(snapshot, current, alternative, horizon_s=horizon_s,
                       extra_inference_servers=extra_inference_servers, settings=self.settings)

    def warm_up(self) -> None:
        warm_up_kernels()


__all__ = [
    "DEFAULT_HORIZON_S", "WHAT_IF_MAX_HORIZON_S", "Forecast", "ForecastSettings", "JobForecast",
    "SimulatorForecastEngine", "WhatIf", "WhatIfRun", "changed_params", "forecast", "trace_jobs", "what_if",
    "with_inference_servers",
]
