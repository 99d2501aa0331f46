"""The scratch state of one Aryl cycle (``_Cycle``: computed once, changed step by step), the running jobs
as the plan changes them (``_Job``), and the small helpers the steps share: each job's estimate
(``goodput_estimate``), the work a preemption loses, the queues' usage, a start's message.

Must never decide anything a step decides (``loans``, ``base``, ``sizing`` do), and never import them.
Pure: no I/O, no wall clock (``now`` is the snapshot's).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter

import numpy as np

from scheduler_service.core.goodput_fit import GPUS_PER_SERVER, goodput_curve, job_goodput
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import (
    KeepPending,
    LoanNote,
    LoanStep,
    PreemptJob,
    Reason,
    ServerAction,
    StartJob,
    WorkerPlacement,
)
from scheduler_service.core.protection import Mechanism, Protection
from scheduler_service.core.quota import QuotaLedger
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView, WorkerView
from scheduler_service.core.throughput import JobEstimate, ThroughputModel, estimate, model_for
from scheduler_service.lifecycle import JobState, ServerState

RUNNING_STATES = (JobState.RUNNING, JobState.SCALING)
_TRAINING_CAPABLE = (ServerState.TRAINING, ServerState.LOANED)

# A worker as the plan holds it, in rank order within its job: the snapshot's own (a WorkerView) while
# it stays, or a new placement. Never changed in place; only server_id and gpu_indices are read.
_Worker = WorkerView | WorkerPlacement


_rank, _server_id, _state = attrgetter("rank"), attrgetter("server_id"), attrgetter("state")


@dataclass(slots=True)
class _Job:
    """A running job as this cycle's plan changes it."""

    view: JobView
    workers: list[_Worker]
    reason: Reason | None = None
    message: str = ""
    reclaimed: bool = False  # scaled in off loaned servers going back to inference
    made_room_for: list[int] = field(default_factory=list)  # queued jobs that took its extras' GPUs
    override: str = ""  # a hard need set its protection window aside (``core.protection.overridden``)
    # The size its move to the GPU type it is on was valued at (``base.move_to_faster_types``), this cycle or an
    # earlier one (``_Cycle.floors``); 0: none.
    floor: int = 0
    moved: bool = False  # moved to another GPU type this cycle (``base.move_to_faster_types``)

    @property
    def base(self) -> int:
        """The workers step 3 keeps it at, at least: ``min_workers``, or the size its move to the GPU type it is on
        was valued at (the move pays at that size only: sharing out the spare GPUs may grow it past it, never
        shrink it below)."""
        return max(self.view.min_workers, self.floor)

    @property
    def extras(self) -> int:
        return len(self.workers) - self.base

    def scaled_in(self, reason: Reason) -> None:
        """Say why this cycle forced the job smaller, at the size it has now. A later step may shrink it
        again (another queued gang takes more extras): each step rewrites the message, so it names the
        size the plan ends with, as the "(now N worker(s))" the applier appends does. The first forced
        step's reason stays the job's reason."""
        self.reason = self.reason or reason
        message = f"scaled in to {len(self.workers)} worker(s)"
        if self.reclaimed:
            message += ": loaned server(s) went back to inference"
        if self.made_room_for:
            jobs = f"job{'s' if len(self.made_room_for) > 1 else ''} {', '.join(map(str, self.made_room_for))}"
            message += f"{', and' if self.reclaimed else ''} so {jobs} can start"
        self.message = message + (f"; {self.override}" if self.override else "")


@dataclass(frozen=True, slots=True)
class LoanRisk:
    """How likely a worker on a loaned server is to lose it, by how long it must keep it (the risk-valued loans:
    ``loans.loan_risk`` builds it, ``sizing.completion_rates`` reads it). ``windows_s``: ascending horizons from
    now; ``shares``: the expected share of the loaned servers inference takes back within each
    (``core.demand_forecast.ForecastView.reclaimed_shares``, the reclaim lead included). Between them the chance
    grows linearly from 0 at no time; beyond the last window it stays at its share (the forecast reaches no
    further)."""

    windows_s: tuple[float, ...]
    shares: tuple[float, ...]

    def lost_within(self, seconds: float, scale: float = 1.0) -> tuple[float, float]:
        """``(F, I)`` at ``seconds``: ``F`` the chance that a loaned server has gone back by then, ``I`` the
        integral of that chance from now to then (seconds), both times ``scale``."""
        xs, ys = (0.0, *self.windows_s), (0.0, *self.shares)
        area = 0.0
        for (x0, y0), (x1, y1) in itertools.pairwise(zip(xs, ys, strict=True)):
            if seconds <= x1:
                y = y0 + (y1 - y0) * (seconds - x0) / (x1 - x0)
                return scale * y, scale * (area + (y0 + y) * (seconds - x0) / 2)
            area += (y0 + y1) * (x1 - x0) / 2
        return scale * ys[-1], scale * (area + ys[-1] * (seconds - xs[-1]))


@dataclass(slots=True)
class _Cycle:
    """Scratch state of one scheduling cycle, computed once and changed step by step."""

    snapshot: ClusterSnapshot
    servers: dict[str, ServerView]
    server_state: dict[str, ServerState]
    running: dict[int, _Job]
    params: PolicyParams
    estimates: dict[int, JobEstimate] = field(default_factory=dict)  # filled on first use (estimate())
    # The last cycle's estimates of queued jobs, with the view and server size each was made from: a job
    # whose view is the same object (its row unchanged: ``store.snapshot``) keeps its estimate.
    carried: Mapping[int, tuple[JobView, int, JobEstimate]] = field(default_factory=dict)
    capacity: FreeCapacity = field(init=False)
    starts: list[StartJob] = field(default_factory=list)
    preemptions: list[PreemptJob] = field(default_factory=list)
    server_actions: list[ServerAction] = field(default_factory=list)
    pending: list[KeepPending] = field(default_factory=list)
    reserved: frozenset[str] = frozenset()
    reserved_for: int | None = None
    reserved_until: float = 0.0  # when the reserved servers' jobs are estimated to have ended (``base._reserve``)
    server_gpus: list[int] | None = None  # GPUs of each server the policy may place on (``base._unplaceable``)
    # ``core.fit.never_fits`` over ``server_gpus`` per gang shape (GPUs per worker, workers): it walks every
    # server, and a long queue holds 10,000s of jobs of a few shapes.
    never_fit: dict[tuple[int, int], str | None] = field(default_factory=dict)
    # Why a running job below max_workers keeps its size this cycle (``sizing.elastic_extras``;
    # ``job_changes.size_notes``).
    holds: dict[int, tuple[Reason, str]] = field(default_factory=dict)
    loan_note: LoanNote | None = None  # why no (further) server is loaned (``loans.loan_cycle``)
    quota: QuotaLedger | None = None  # queues' quotas and usage as step 1 changes them (``core.quota``)
    # The servers' GPUs when fitted jobs are valued by their goodput model (``goodput_estimate``); 0: never.
    goodput_servers: int = 0
    # Running jobs in their protection window (``core.protection``), asked by every step; and, per queued
    # job, the protected jobs whose GPUs it would have taken (its pending reason names them).
    protected: dict[int, Protection] = field(default_factory=dict)
    # (Groups of protections: one per step that found some, shared by the jobs one preemption scan served.)
    blocked_by: dict[int, list[tuple[tuple[Protection, Mechanism], ...]]] = field(default_factory=dict)
    # ``base._place_by_preemption``'s scans of the running jobs, by kind of preemptor and by how many jobs the
    # cycle had started and preempted (only those change the running jobs and quotas): (victims in
    # preemption order, the protected jobs it may not take). A long queue of one class asks 1,000s of times.
    preemption_scans: dict[tuple[str, int, int, int, int],
                           tuple[list[JobView], tuple[tuple[Protection, Mechanism], ...]]] = field(
        default_factory=dict)
    # ``base._protected_pending``'s text of each ``blocked_by`` group, by the group's id (the groups live in
    # ``blocked_by`` as long as the cycle, so no id is reused meanwhile).
    shield_texts: dict[int, str] = field(default_factory=dict)
    # The joint sizing's answer (``sizing.joint_sizing``; None: the policy does not size jointly): the queued jobs
    # it admits this cycle (step 2 starts them at min_workers, step 3 grows them as the sizing would), and the
    # queued jobs it weighed and left waiting, with why (step 2 starts those only on what admitted gangs left).
    admitted: set[int] | None = None
    deferred: dict[int, str] = field(default_factory=dict)
    # Running jobs the joint sizing took out so that queued jobs could start on their GPUs (preempt-to-admit):
    # out of ``running`` and ``capacity`` until ``sizing.settle_suspensions`` preempts those a start took GPUs
    # of and puts the others back as they were.
    suspended: list[_Job] = field(default_factory=list)
    # Jobs a reclaim left below min_workers, to be restarted elsewhere before anything else is placed
    # (``base.relocate_displaced``), each with its preemption should that fail; in the reclaim's order.
    displaced: list[tuple[_Job, PreemptJob]] = field(default_factory=list)
    # The risk-valued loans (``loans.loan_risk``; None: extra workers on loaned servers are valued as if the
    # servers stayed -- no forecast, nothing loaned, or a variant without it).
    loan_risk: LoanRisk | None = None
    # Each job's speed per GPU type over its reference type's (``type_factors``; None: one speed everywhere), by
    # job id, worked out on first use (``speed_factors``).
    factors: dict[int, dict[str, float] | None] = field(default_factory=dict)
    gpu_types: tuple[str, ...] | None = None  # the servers' GPU types (``server_types``)
    declared_speeds: dict[str, float] = field(default_factory=dict)  # ``ClusterSnapshot.gpu_speed`` (the same)
    # The floors of the moves of earlier cycles (``_Job.floor``: job id -> the GPU type it moved to, the size the
    # move was valued at), as the cycle before left them (``kept_floors``).
    floors: Mapping[int, tuple[str, int]] = field(default_factory=dict)
    # Per GPU type, its elastic jobs' step-3 options as ``sizing.type_worth`` weighs them (job ids, weights,
    # values, limits), kept until a move changes the jobs on a type (``base._MoveWorth.moved`` clears them).
    type_tables: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    # Per job, its options' values there (``extra_gains``), kept until the job itself moves.
    type_rows: dict[int, list[float]] = field(default_factory=dict)

    def server_types(self) -> tuple[str, ...]:
        """The servers' GPU types, sorted, with their declared speeds (``declared_speeds``): once per cycle."""
        if self.gpu_types is None:
            self.gpu_types = tuple(sorted({s.gpu_type for s in self.snapshot.servers}))
            self.declared_speeds = dict(self.snapshot.gpu_speed)
        return self.gpu_types

    def estimate(self, job: JobView) -> JobEstimate:
        """The job's remaining work and speed curve at ``now``; computed once per cycle, and only for
        the jobs a step asks about (the queue, the elastic jobs), not every active job. A running job's is at its
        GPU type's speed (``type_factors``), a queued job's at its reference type's."""
        known = self.estimates.get(job.job_id)
        if known is None:
            carried = self.carried.get(job.job_id)
            factor = self.factor_on(job, self.servers[job.workers[0].server_id].gpu_type) if job.workers else 1.0
            if carried is not None and carried[0] is job and carried[1] == self.goodput_servers:
                known = carried[2]
            elif factor == 1.0:
                known = goodput_estimate(job, self.snapshot.now, self.params, self.goodput_servers)
            else:
                known = at_speed(goodput_estimate(_progress_at(job, factor, self.snapshot.now, self.params),
                                                  self.snapshot.now, self.params, self.goodput_servers), factor)
            self.estimates[job.job_id] = known
        return known

    def speed_factors(self, job: JobView) -> dict[str, float] | None:
        """The job's ``type_factors`` over the servers' GPU types, once per cycle (None: one speed everywhere)."""
        if job.job_id in self.factors:
            return self.factors[job.job_id]
        types = self.server_types()
        known = self.factors[job.job_id] = type_factors(job, self.declared_speeds, types)
        return known

    def factor_on(self, job: JobView, gpu_type: str) -> float:
        """How fast the job runs on ``gpu_type`` relative to its reference type (1.0: as declared)."""
        factors = self.speed_factors(job)
        return 1.0 if factors is None else factors.get(gpu_type, 1.0)

    def type_preference(self, job: JobView, capacity: FreeCapacity | None = None) -> tuple[str, ...] | None:
        """The GPU types to place a gang of ``job`` on (``core.placement`` tries them in this order), the fastest
        for it *at the size each has room for* first: its speed on the type (``factor_on``) times its speed curve
        at as many workers as the type's free GPUs hold, within ``min_workers .. max_workers`` (``speed_at_room``);
        ties in the order placement would try them (the most free GPUs first). Not the fastest per GPU: a job that
        starts on the one free GPU of the fastest type, because it is fastest per GPU, cannot grow there while the
        type is busy, however many GPUs of a slower type are free (a job grows on its own type only), and ran its
        whole life on one GPU in the heterogeneous evaluation (docs/simulator.md). None -- placement's own order --
        when the job names its types (the user's order stands) or runs as fast everywhere."""
        factors = None if job.gpu_types else self.speed_factors(job)
        if factors is None:
            return None
        free = (capacity or self.capacity).free_by_type()
        return tuple(sorted(free, key=lambda t: (-self.speed_at_room(job, t, free[t], factors), -free[t], t)))

    def speed_at_room(self, job: JobView, gpu_type: str, free_gpus: int,
                      factors: Mapping[str, float] | None = None) -> float:
        """The job's speed (in its speed curve's unit) on ``gpu_type`` at as many workers as ``free_gpus`` hold,
        within ``min_workers .. max_workers``: what ``type_preference`` ranks the types by."""
        factors = self.speed_factors(job) if factors is None else factors
        workers = min(max(free_gpus // max(job.gpus_per_worker, 1), job.min_workers, 1), job.max_workers)
        return (1.0 if factors is None else factors.get(gpu_type, 1.0)) * self.estimate(job).model.speed(workers)

    def carry(self) -> dict[int, tuple[JobView, int, JobEstimate]]:
        """The estimates the next cycle may keep: those of jobs holding no GPUs, which do not depend on
        ``now`` (``core.throughput.estimate`` reads the clock only for a running job)."""
        views = {job.job_id: job for job in self.snapshot.jobs}
        return {job_id: (view, self.goodput_servers, known) for job_id, known in self.estimates.items()
                if (view := views.get(job_id)) is not None and not view.workers}

    def kept_floors(self) -> dict[int, tuple[str, int]]:
        """The floors the next cycle keeps (``_Job.floor``): each running job's that has one, with the GPU type it
        holds. A job that leaves the type, or ends, drops its floor; one shrunk below its floor (a reclaim, a queued
        gang taking its workers) keeps the size it has as its floor."""
        return {job_id: (self.servers[job.workers[0].server_id].gpu_type, min(job.floor, len(job.workers)))
                for job_id, job in self.running.items() if job.floor and job.workers}

    def rebuild_capacity(self) -> None:
        """Free GPUs on the servers that may run training once this cycle's loan steps are done."""
        held: dict[str, set[int]] = {}
        for job in self.running.values():
            for w in job.workers:
                on_server = held.get(w.server_id)
                if on_server is None:
                    held[w.server_id] = set(w.gpu_indices)
                else:
                    on_server.update(w.gpu_indices)
        state = self.server_state
        self.capacity = FreeCapacity.without(
            (s for sid, s in self.servers.items() if state[sid] in _TRAINING_CAPABLE), held)

    def act(self, server_id: str, step: LoanStep, target: ServerState, reason: Reason, message: str) -> None:
        self.server_actions.append(ServerAction(server_id, step, reason, message))
        self.server_state[server_id] = target


def goodput_estimate(job: JobView, now: float, params: PolicyParams, gpus_per_server: int) -> JobEstimate:
    """The job's ``core.throughput.estimate``; for a job with a fitted goodput model
    (``core.goodput_fit.job_goodput``) when ``gpus_per_server`` > 0, the same remaining work over the
    speed curve of its goodput at the best batch size per worker count (``goodput_curve``: anchored at
    its declared speed at ``min_workers``, so the queue order, which reads that speed, is unchanged)."""
    known = estimate(job, now=now, default_runtime_s=params.default_runtime_s, alpha=params.amdahl_alpha)
    if gpus_per_server <= 0:
        return known
    model = job_goodput(job)
    if model is None:
        return known
    last = max(job.max_workers, job.min_workers, job.num_workers)
    curve = goodput_curve(job, model, last, alpha=params.amdahl_alpha, gpus_per_server=gpus_per_server)
    return JobEstimate(ThroughputModel(curve, params.amdahl_alpha), known.remaining_work)


def type_factors(job: JobView, declared: Mapping[str, float], types: Sequence[str]) -> dict[str, float] | None:
    """How fast ``job`` runs on each GPU type of ``types`` relative to its *reference* type, the type its
    declared speed curve is of: declared factor 1.0 (``ClusterSnapshot.gpu_speed``; a type not named is 1.0).

    On a type it ran on, its measured per-GPU speed there (``JobView.type_speeds``, ``core.type_speed``) over
    its reference speed; elsewhere the type's declared factor. Its reference speed is what it measured on a
    reference type (factor 1.0) where it has; else it is bootstrapped as ``core.type_speed.estimate`` bootstraps
    an unseen type: its measured speed on each type it ran on over that type's declared factor, averaged (so a
    job measured on its reference type and on others keeps factor 1.0 at home and its own ratios elsewhere; the
    average would carry the declared factors' error, made for the fleet's mix of models, into every type's).
    None when nothing tells the types apart -- one type, or neither a declared factor nor a measure: every type
    then runs at the declared curve, as before types had speeds."""
    if len(types) <= 1 or (not declared and not job.type_speeds):
        return None
    measured = {t: speed for t, speed in job.type_speeds if speed > 0}
    at_home = [speed for t, speed in measured.items() if declared.get(t, 1.0) == 1.0]
    anchors = at_home or [speed / declared.get(t, 1.0) for t, speed in measured.items()]
    if not anchors:
        return {t: declared.get(t, 1.0) for t in types}
    reference = sum(anchors) / len(anchors)
    return {t: measured[t] / reference if t in measured else declared.get(t, 1.0) for t in types}


def _progress_at(job: JobView, factor: float, now: float, params: PolicyParams) -> JobView:
    """A running job that reported no progress, as ``core.throughput.estimate`` reckons it (at its current size
    since its last resize), at ``factor`` times its curve's speed; any other job as it is."""
    if job.work_done or job.last_resized_at is None or (job.throughput_points and job.total_work > 0):
        return job
    speed = model_for(job.throughput_points, params.amdahl_alpha).speed(job.num_workers)
    return replace(job, work_done=max(now - job.last_resized_at, 0.0) * speed * factor)


def at_speed(known: JobEstimate, factor: float) -> JobEstimate:
    """``known`` for a job running ``factor`` times as fast as its speed curve says (the same work, in the
    curve's unit, done at ``factor`` times each speed). ``known`` itself at 1.0."""
    if factor == 1.0 or factor <= 0:
        return known
    return JobEstimate(known.model, known.remaining_work / factor)


def _work_lost(job: _Job, now: float) -> float:
    """GPU-seconds lost if the job is preempted now: work since its last checkpoint or resize."""
    return _since_checkpoint(job.view, now) * len(job.workers) * job.view.gpus_per_worker


def _since_checkpoint(view: JobView, now: float) -> float:
    """Seconds of its progress a preemption now throws away: since its last checkpoint or resize (at least 1)."""
    since = max(t for t in (view.last_checkpoint_at, view.last_resized_at, view.started_at, 0.0) if t is not None)
    return max(now - since, 1.0)


def _running_jobs(snapshot: ClusterSnapshot) -> dict[int, _Job]:
    """The running jobs of the snapshot, each with its workers in rank order."""
    return {
        j.job_id: _Job(j, sorted(j.workers, key=_rank) if len(j.workers) > 1 else list(j.workers))
        for j in snapshot.jobs
        if j.state in RUNNING_STATES and j.workers
    }


def _server_gpus(snapshot: ClusterSnapshot) -> int:
    """GPUs of the largest server: how a goodput model packs a job's workers (``core.goodput_fit.nodes_for``)."""
    return max((len(s.gpu_indices) for s in snapshot.servers), default=GPUS_PER_SERVER)


def _ledger(cycle: _Cycle, workers: dict[int, int]) -> QuotaLedger:
    """The queues' usage with each running job at ``workers[job id]`` workers (default: as planned now)."""
    held = ((j.view, workers.get(j.view.job_id, len(j.workers)) * j.view.gpus_per_worker)
            for j in cycle.running.values())
    return QuotaLedger.of(cycle.snapshot, held)


def _placed(workers: Sequence[WorkerPlacement]) -> str:
    """The start message's opening: how many workers, on which servers."""
    return f"placed {len(workers)} worker(s) on {', '.join(sorted({w.server_id for w in workers}))}"
