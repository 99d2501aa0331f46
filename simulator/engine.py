"""The discrete-event engine: replays a trace through the service's own scheduling cycle.

``simulate`` wires the ports -- a ``VirtualClock``, a ``SimulatedCluster`` (the ``ClusterState``) --
to ``scheduler_service.cycle.SchedulingCycle`` and a policy from ``scheduler_service.policies``, all
imported, none copied, and then moves virtual time from event to event:

- **events**: job arrivals (``submit_time``), job completions (exact: the remaining work at the
  segment's true speed, after its restart overhead), inference-demand changes, the router's drain
  acknowledgements (``drain_ack_s`` after a loan begins), server failures and repairs
  (``simulator.failures``);
- **cycles**: as in the service (``scheduler_service.service_loops``), a cycle runs on events and at least
  every ``cycle_interval_s`` (the periodic tick, so that time-based thresholds -- loan idle time, drain
  timeout, anti-thrashing, starvation -- take effect without events). Events at one instant are
  processed together, then one cycle runs. ``min_cycle_gap_s`` is the service's setting of the same
  name: with it > 0 a cycle runs no sooner than that after the previous one, and the events in
  between are batched into it (their state changes -- an arrival, a completion -- still happen at
  their own instant). Default 0: every event instant gets its cycle. After a cycle that evicted jobs
  from a LOST server, another cycle follows at once (as soon as the gap allows), so a requeued job
  queues again without waiting for the tick: the service runs a cycle after every commit; this
  engine does so only after evictions, and after a plan that stopped a job to move it
  (``Reason.PREEMPTED_TO_MOVE``: a swap of GPUs between two jobs, done in two cycles; one such
  follow-up per instant), and after a plan that reclaimed a loaned server: the simulated agent stops its
  workers at once and reports so, and the service's report of that requests a cycle
  (``app.agents``), so the server serves again at the next cycle the gap allows -- not at whatever event or
  tick comes next, which would make a reclaim's measured latency (``core.demand_forecast``) and the
  shortfall while it comes back depend on unrelated arrivals. Other runs cycle as before.

The run ends when every job has completed, or at a guard: ``max_time_s`` (virtual seconds), or a
*stall* -- nothing running, no event left, and no cycle committed anything for longer than the
largest time threshold of the policy parameters plus two ticks (jobs no cluster state can ever place).
``SimulationResult.stop_reason`` says which.

Deterministic: the same inputs and seed give the same result (no wall clock in anything recorded,
no set or dict order that depends on hashing). What this module must never do: decide, or branch on
the policy -- it only moves time and calls the cycle.
"""

from __future__ import annotations

import shutil
import sys
import time
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NoReturn

from scheduler_service.core.apply_rules import ApplySettings
from scheduler_service.core.demand_forecast import DemandForecaster
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import ApplyResult, LoanStep, Plan, Reason
from scheduler_service.core.registry import FaultsFirst, Policy
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.cycle import ClusterState, SchedulingCycle
from scheduler_service.policies import create_policy
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.estimates import EXACT, Estimates
from simulator.failures import FAIL, FailureSchedule
from simulator.model import ClusterSpec, DemandPoint, FailureRate, ServerFailure, TraceJob
from simulator.outcomes import JobOutcome, ServerOutcome, UtilisationSample

if TYPE_CHECKING:  # imported where used: tqdm loads only when a bar is drawn
    from tqdm import tqdm

_NEVER = float("inf")

__all__ = ["PlanInvariantError", "PlanRefusedError", "SchedulingCycle", "SimulationResult", "simulate"]


class PlanInvariantError(AssertionError):
    """A policy produced a plan that breaks the core's invariants (``check_plan``)."""


class PlanRefusedError(AssertionError):
    """The applier refused part of a plan that passed ``check_plan``: a defect of the apply order
    (``core.plan.apply_order``) or of the applier's checks, never of the policy."""


@dataclass(frozen=True)
class SimulationResult:
    """Everything one run produced. ``jobs`` in job-id order, ``servers`` in server-id order,
    ``utilisation`` in time order (piecewise constant: each sample holds until the next)."""

    policy: str
    seed: int
    spec: ClusterSpec
    params: PolicyParams
    settings: dict[str, float]         # cycle_interval_s, restart_overhead_s, checkpoint_interval_s, ...
    jobs: tuple[JobOutcome, ...]
    servers: tuple[ServerOutcome, ...]
    utilisation: tuple[UtilisationSample, ...]
    end_time: float                    # virtual time when the run stopped (the last completion if all did)
    stop_reason: str                   # "completed", "max_time", "stalled" or "budget" (``stop_when``)
    cycles: int                        # scheduling cycles run
    # Plan actions the applier refused. A defect signal, always 0 in a sound run: nothing changes
    # between a snapshot and its plan's apply here, so a valid plan is applied in full (with
    # ``check_plans`` a refusal raises ``PlanRefusedError``). Not 0: a plan broke the invariants (run
    # with ``check_plans`` to see which) or the applier refused a valid one.
    rejected_actions: int
    server_failures: int = 0           # injected failures that made a server LOST
    fault_evictions: int = 0           # jobs shrunk or requeued because a server they ran on was lost
    # When kept progress was made: (from, until, useful GPU-seconds per second), as ``simulator.cluster``
    # defines them (in the order recorded); ``simulator.results`` integrates them.
    useful_spans: tuple[tuple[float, float, float], ...] = ()
    estimates: str = "exact"           # what policies saw of jobs' lengths (``simulator.estimates``)
    wall_s: float = field(default=0.0, compare=False)  # host seconds taken (never written to result files)


class PlanChecker:
    """A ``ClusterState`` decorator that asserts every plan passes ``check_plan`` against the snapshot
    it was made from, before applying it, and that the applier then refuses none of its actions. A port
    wrapper, not a simulation branch. The second assertion holds for a state that changes only through
    ``apply`` between a snapshot and its plan, as the simulated cluster does (the service's state does
    not: an agent or a user may change it meanwhile, and a refusal there is the applier doing its job)."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state
        self._snapshot: ClusterSnapshot | None = None
        self.plans_checked = 0

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        self._snapshot = self._state.snapshot(seed=seed)
        return self._snapshot

    def apply(self, plan: Plan) -> ApplyResult:
        assert self._snapshot is not None, "apply() before snapshot()"
        problems = check_plan(self._snapshot, plan)
        if problems:
            raise PlanInvariantError(f"plan at t={self._snapshot.now} breaks invariants: {problems[:5]}")
        self.plans_checked += 1
        result = self._state.apply(plan)
        if result.rejected:
            raise PlanRefusedError(f"a valid plan at t={self._snapshot.now} was partly refused: "
                                   f"{list(result.rejected[:5])}")
        return result


def simulate(
    jobs: list[TraceJob],
    demand: list[DemandPoint],
    spec: ClusterSpec,
    policy: str | Policy,
    params: PolicyParams,
    *,
    seed: int,
    cycle_interval_s: float = 300.0,
    restart_overhead_s: float = 30.0,
    checkpoint_interval_s: float = 1800.0,
    min_cycle_gap_s: float = 0.0,
    max_time_s: float | None = None,
    drain_ack_s: float | None = 1.0,
    failures: FailureRate | Sequence[ServerFailure] | None = None,
    check_plans: bool = False,
    progress: bool = False,
    estimates: Estimates | str = EXACT,
    cluster: SimulatedCluster | None = None,
    clock: VirtualClock | None = None,
    wrap_state: Callable[[ClusterState], ClusterState] | None = None,
    stop_when: Callable[[], bool] | None = None,
) -> SimulationResult:
    """Replay ``jobs`` (arrivals at ``submit_time``) and ``demand`` (inference servers needed, a step
    function of time; empty: no demand signal, so a loaning policy never loans) on a cluster of
    ``spec`` under ``policy`` (a registered name, built with ``params``; or a policy instance).

    ``seed`` is handed to every snapshot (policies that randomise use it) and seeds the failure
    draws of a ``FailureRate``. ``drain_ack_s``: the router acknowledges a drain this long after the
    loan begins (its in-flight requests finish; default 1 s); None or < 0: no router, so a policy
    waits its ``drain_timeout_s``. ``failures``: servers that fail and come back, as a rate or a list
    (``simulator.failures``); None: no failures. ``check_plans``: assert
    that every plan passes ``check_plan`` and is then applied in full (slower; tests use it).
    ``progress``: a tqdm bar on stderr (only when stderr is a terminal). ``estimates``: what the
    policy sees of each job's length (``simulator.estimates``: ``"exact"``, ``"lognormal:SIGMA"``,
    ``"none"``); noisy estimates are drawn from ``seed``. The true ``work`` drives completion.

    Starting from a cluster as it is (``simulator.forecast``: the live cluster's snapshot): ``cluster``
    and its ``clock`` (both or neither) replace the empty cluster of ``spec`` (its servers, jobs,
    demand and settings are its own; the overhead arguments are then ignored), and a cycle runs at
    once, at the clock's time. ``wrap_state``: a port decorator around the cluster (as ``check_plans``'
    ``PlanChecker``), to watch what each cycle saw and applied. ``stop_when``: asked at every event
    instant; True stops the run there (``stop_reason`` "budget": a caller's wall-clock or step budget)."""
    if not cycle_interval_s > 0:
        raise ValueError(f"cycle_interval_s must be > 0 (got {cycle_interval_s})")
    if min_cycle_gap_s < 0:
        raise ValueError(f"min_cycle_gap_s must be >= 0 (got {min_cycle_gap_s})")
    for job in jobs:
        if job.submit_time < 0:
            raise ValueError(f"job {job.job_id}: submit_time {job.submit_time} is before the trace's start (0)")
    wall_start = time.perf_counter()
    declared = Estimates.parse(estimates)
    jobs = declared.apply(jobs, seed)
    if (cluster is None) != (clock is None):
        raise ValueError("a cluster to start from needs its clock, and a clock its cluster")
    restored = cluster is not None
    if cluster is None or clock is None:
        clock = VirtualClock(0.0)
        cluster = SimulatedCluster(spec, clock, restart_overhead_s=restart_overhead_s,
                                   checkpoint_interval_s=checkpoint_interval_s, drain_ack_s=drain_ack_s,
                                   apply_settings=ApplySettings.of(params))
    faults = FailureSchedule(failures, cluster.server_ids, seed=seed)
    state: ClusterState = PlanChecker(cluster) if check_plans else cluster
    if wrap_state is not None:
        state = wrap_state(state)
    # A name is built from the registry; an instance (training's sampling ``dl2``) runs as the registry would.
    decider = create_policy(policy, params) if isinstance(policy, str) else FaultsFirst(policy, params)
    cycle = SchedulingCycle(state, decider, clock, seed=seed, forecaster=DemandForecaster())

    arrivals = sorted(jobs, key=lambda j: (j.submit_time, j.job_id))
    points = sorted(demand, key=lambda p: p.time)  # stable: of points at one time, the last one wins
    stall_after_s = max(params.starvation_s, params.loan_idle_s, params.min_loan_s, params.drain_timeout_s,
                        params.min_resize_interval_s) + 2 * cycle_interval_s

    bar = _progress_bar(len(arrivals), progress)
    next_arrival = next_point = 0
    cycles = 0
    last_cycle: float | None = None
    # The first event since the last cycle (a restored cluster: its present state calls for one).
    trigger_at: float | None = clock.now() if restored else None
    last_change = clock.now()              # when a cycle last committed anything
    stop_reason = "completed"
    try:
        while True:
            completion = cluster.next_completion()
            if completion is None and next_arrival == len(arrivals) and cluster.active_jobs == 0:
                break
            drain_ack = cluster.next_drain_ack()
            now = min(
                _next_cycle(last_cycle, trigger_at, cycle_interval_s, min_cycle_gap_s),
                completion if completion is not None else _NEVER,
                arrivals[next_arrival].submit_time if next_arrival < len(arrivals) else _NEVER,
                points[next_point].time if next_point < len(points) else _NEVER,
                drain_ack if drain_ack is not None else _NEVER,
                faults.next_time(),
            )
            if max_time_s is not None and now > max_time_s:
                clock.advance_to(max(max_time_s, clock.now()))
                stop_reason = "max_time"
                break
            if stop_when is not None and stop_when():
                stop_reason = "budget"
                break
            clock.advance_to(now)

            # Events at this instant: demand, completions, arrivals. Each one triggers a cycle.
            if next_point < len(points) and points[next_point].time <= now:
                next_point = bisect_right(points, now, lo=next_point, key=lambda p: p.time)
                cluster.set_demand(points[next_point - 1])
                trigger_at = now if trigger_at is None else trigger_at
            done = cluster.complete_due()
            if done:
                trigger_at = now if trigger_at is None else trigger_at
                if bar is not None:
                    bar.update(len(done))
            while next_arrival < len(arrivals) and arrivals[next_arrival].submit_time <= now:
                cluster.submit(arrivals[next_arrival])
                next_arrival += 1
                trigger_at = now if trigger_at is None else trigger_at
            if drain_ack is not None and drain_ack <= now and cluster.acknowledge_drains():
                trigger_at = now if trigger_at is None else trigger_at
            for kind, server_id in faults.pop_due(now):
                (cluster.fail_server if kind == FAIL else cluster.repair_server)(server_id)
                trigger_at = now if trigger_at is None else trigger_at

            if now >= _next_cycle(last_cycle, trigger_at, cycle_interval_s, min_cycle_gap_s):
                evicted = cluster.fault_evictions
                followed_up = last_cycle == now  # one follow-up per instant for moves (no endless swapping)
                report = cycle.run_once()
                cycles += 1
                last_cycle, trigger_at = now, None
                result = report.result
                if result.started or result.scaled or result.preempted or result.server_steps:
                    last_change = now
                if cluster.fault_evictions > evicted or (not followed_up and any(
                        p.reason == Reason.PREEMPTED_TO_MOVE for p in report.plan.preemptions)):
                    trigger_at = now  # requeued or moving jobs queue again at once (see the module docstring)
                if any(step == LoanStep.RECLAIM for _, step in result.server_steps):
                    trigger_at = now  # the reclaimed servers' agents report them vacated (the module docstring)
            cluster.sample()

            # A server that is down will come back, which may let a waiting job run: not a stall.
            idle = (cluster.running_jobs == 0 and next_arrival == len(arrivals) and next_point == len(points)
                    and not faults.any_down)
            if idle and cluster.active_jobs and now - last_change > stall_after_s:
                stop_reason = "stalled"
                break
    finally:
        if bar is not None:
            bar.close()
    cluster.close_useful_spans()

    outcomes = dict(cluster.outcomes)
    for job in arrivals[next_arrival:]:  # a guard stopped the run before these arrived
        outcomes[job.job_id] = JobOutcome(job.job_id, job.name, job.submit_time, job.gpus_per_worker,
                                          job.min_workers, job.max_workers, deadline=job.deadline)
    return SimulationResult(
        policy=decider.name,
        seed=seed,
        spec=cluster.spec,
        params=params,
        settings={
            "cycle_interval_s": float(cycle_interval_s),
            "restart_overhead_s": cluster.restart_overhead_s,
            "checkpoint_interval_s": cluster.checkpoint_interval_s,
            "min_cycle_gap_s": float(min_cycle_gap_s),
            "drain_ack_s": cluster.drain_ack_s if cluster.drain_ack_s is not None else -1.0,
        },
        jobs=tuple(outcomes[job_id] for job_id in sorted(outcomes)),
        servers=tuple(cluster.server_outcomes[sid] for sid in sorted(cluster.server_outcomes)),
        utilisation=tuple(cluster.samples),
        end_time=clock.now(),
        stop_reason=stop_reason,
        cycles=cycles,
        rejected_actions=cluster.rejected_actions,
        server_failures=cluster.server_failures,
        fault_evictions=cluster.fault_evictions,
        useful_spans=tuple(cluster.useful_spans),
        estimates=str(declared),
        wall_s=time.perf_counter() - wall_start,
    )


def _next_cycle(last_cycle: float | None, trigger_at: float | None, interval_s: float, gap_s: float) -> float:
    """When the next cycle is due: after an event, as soon as the gap since the last cycle allows;
    without one, a tick ``interval_s`` after the last cycle (never before the first event)."""
    if trigger_at is not None:
        return trigger_at if last_cycle is None else max(trigger_at, last_cycle + gap_s)
    return _NEVER if last_cycle is None else last_cycle + interval_s


def _progress_bar(total: int, wanted: bool) -> tqdm[NoReturn] | None:
    if not wanted or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    # An explicit size: a terminal that reports none (a 0 x 0 pty) makes tqdm draw nothing at all.
    size = shutil.get_terminal_size((100, 24))
    return tqdm(total=total, unit="job", desc="simulating", file=sys.stderr, ncols=size.columns or 100,
                nrows=size.lines or 24)
