"""The Aryl policy (our reconstruction of Lyra, EuroSys'23) and the baselines that share its parts.

One cycle, in order (each step works on the state the previous ones left):

0. **Loan cycle.** From the inference demand: drained loans become active; loans still draining are
   cancelled first when inference needs servers back; then loaned servers are **reclaimed** greedily
   on server preemption cost (``solvers.reclaim``): elastic jobs that stay at or above
   ``min_workers`` are scaled in, the others preempted and requeued. Vacated reclaimed servers return
   to serving. Idle inference servers beyond demand + a buffer, idle long enough, are **loaned**
   while training has work for them (hysteresis: the buffer is the band between loan and reclaim).
1. **Base demands.** The queue in order: starving jobs first (waited past ``starvation_s``), then
   priority, then shortest estimated remaining GPU-time, then arrival. Each job gets ``min_workers``
   as a gang, or waits; later jobs backfill around a waiting one, except onto the servers reserved
   for the first starving job that does not fit. Base workers prefer training-owned servers. A gang
   may take GPUs from other jobs' elastic *extra* workers (they are scaled in for it). Queues
   (``core.quota``): a job its queue may not take the GPUs for waits aside; within the starving/other
   split, jobs within their queue's quota come first, then higher priority classes, then fair share;
   a gang that still does not fit may preempt, cheapest first, jobs of queues that borrow (when it is
   within its own quota) or of lower classes of its own queue. Growth in step 2 stays within quotas.
2. **Elastic extras.** A multiple-choice knapsack (``solvers.knapsack``) over the elastic jobs: option
   k = k more workers than ``min_workers``, weight k x gpus_per_worker, value = JCT reduction minus a
   restart cost when the size changes, plus, for an option that turns a predicted deadline miss
   into a hit, ``deadline_weight`` x the job's remaining time at ``min_workers``. Capacity: the GPUs
   left after step 1, including loaned ones and those extras already hold. Extra workers prefer
   loaned servers, so a reclaim shrinks, not kills. A reclaim's preemption cost counts a deadline it
   would make a job miss (``deadline_weight`` x the job's remaining GPU-time).
   Anti-thrashing (``core.protection``, one window for every step): a job in its protection window
   (started or resized less than ``min_resize_interval_s`` ago, or ``max_disruptions_per_hour``
   reached) keeps its size in step 2, keeps its extras in step 1 (queued gangs, starving jobs) and is
   not preempted for quota or priority; an inference reclaim prefers servers without protected jobs
   and overrides the window only when those do not suffice, saying so in the job's message.

Goodput (issue 17): a job that reports step times and gradient statistics and declares batch limits has
a fitted goodput model (``core.goodput_fit``); the elastic variants value it by that model (JCT
reductions from its goodput at the best batch size per size, the reclaim's scale-in cost from the same
model) and send the batch chosen with its allocation (``Plan.batches``). Jobs without one: as before.

Variants (same code, same placement, so comparisons isolate the mechanism): ``aryl`` (loaning and
elasticity), ``aryl-noloan``, ``aryl-noelastic``, ``sjf`` (neither: separate clusters, jobs run at
``min_workers``), ``aryl-naivereclaim`` (``aryl`` with a naive reclaim: most recently loaned first), and
``aryl-nogoodput`` (``aryl`` on declared throughput only: no goodput model, no batch choice).

Pure: no I/O, no wall clock; deterministic for a given snapshot.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from scheduler_service.core.fit import never_fits
from scheduler_service.core.goodput_fit import GPUS_PER_SERVER, batch_for, goodput_curve, job_goodput
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import LOANED_FIRST, TRAINING_FIRST, FreeCapacity
from scheduler_service.core.plan import (
    BatchSize,
    KeepPending,
    KeepSize,
    LoanNote,
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
    WorkerPlacement,
    clock_time,
)
from scheduler_service.core.protection import (
    Mechanism,
    Protection,
    ProtectionRule,
    blocked,
    overridden,
    protected_jobs,
    protection,
    reclaim_penalty,
)
from scheduler_service.core.quota import DEFAULT_QUEUE, QuotaLedger, preemption_order
from scheduler_service.core.registry import ReclaimDecision, ReclaimPreviewUnsupported, policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView, WorkerView
from scheduler_service.core.throughput import JobEstimate, ThroughputModel, estimate
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.policies.qos import predicted_remaining
from scheduler_service.solvers.knapsack import MAX_OPTIONS as _MAX_OPTIONS
from scheduler_service.solvers.knapsack import solve_knapsack
from scheduler_service.solvers.reclaim import ReclaimInstance, reclaim_greedy, reclaim_most_recent_first

RUNNING_STATES = (JobState.RUNNING, JobState.SCALING)
_TRAINING_CAPABLE = (ServerState.TRAINING, ServerState.LOANED)
_TRAINING_OR_DRAINING = (ServerState.TRAINING, ServerState.LOANED, ServerState.DRAINING)

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

    @property
    def extras(self) -> int:
        return len(self.workers) - self.view.min_workers

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
    reserved_until: float = 0.0  # when the reserved servers' jobs are estimated to have ended (``_reserve``)
    server_gpus: list[int] | None = None  # GPUs of each server the policy may place on (``_unplaceable``)
    # ``core.fit.never_fits`` over ``server_gpus`` per gang shape (GPUs per worker, workers): it walks every
    # server, and a long queue holds 10,000s of jobs of a few shapes.
    never_fit: dict[tuple[int, int], str | None] = field(default_factory=dict)
    # Why a running job below max_workers keeps its size this cycle (``_elastic_extras``; ``_size_notes``).
    holds: dict[int, tuple[Reason, str]] = field(default_factory=dict)
    loan_note: LoanNote | None = None  # why no (further) server is loaned (``_loan_cycle``)
    quota: QuotaLedger | None = None  # queues' quotas and usage as step 1 changes them (``core.quota``)
    # The servers' GPUs when fitted jobs are valued by their goodput model (``goodput_estimate``); 0: never.
    goodput_servers: int = 0
    # Running jobs in their protection window (``core.protection``), asked by every step; and, per queued
    # job, the protected jobs whose GPUs it would have taken (its pending reason names them).
    protected: dict[int, Protection] = field(default_factory=dict)
    # (Groups of protections: one per step that found some, shared by the jobs one preemption scan served.)
    blocked_by: dict[int, list[tuple[tuple[Protection, Mechanism], ...]]] = field(default_factory=dict)
    # ``_place_by_preemption``'s scans of the running jobs, by kind of preemptor and by how many jobs the
    # cycle had started and preempted (only those change the running jobs and quotas): (victims in
    # preemption order, the protected jobs it may not take). A long queue of one class asks 1,000s of times.
    preemption_scans: dict[tuple[str, int, int, int, int],
                           tuple[list[JobView], tuple[tuple[Protection, Mechanism], ...]]] = field(
        default_factory=dict)
    # ``_protected_pending``'s text of each ``blocked_by`` group, by the group's id (the groups live in
    # ``blocked_by`` as long as the cycle, so no id is reused meanwhile).
    shield_texts: dict[int, str] = field(default_factory=dict)
    # The joint sizing's answer (``_joint_sizing``; None: the policy does not size jointly): the queued jobs
    # it admits this cycle, by job id, with the workers it sized them at; and the queued jobs it weighed
    # and left waiting, with why (step 1 starts none of those unless it starves).
    admitted: dict[int, int] | None = None
    deferred: dict[int, str] = field(default_factory=dict)

    def training_capable(self, server_id: str) -> bool:
        return self.server_state[server_id] in _TRAINING_CAPABLE

    def estimate(self, job: JobView) -> JobEstimate:
        """The job's remaining work and speed curve at ``now``; computed once per cycle, and only for
        the jobs a step asks about (the queue, the elastic jobs), not every active job."""
        known = self.estimates.get(job.job_id)
        if known is None:
            carried = self.carried.get(job.job_id)
            if carried is not None and carried[0] is job and carried[1] == self.goodput_servers:
                known = carried[2]
            else:
                known = goodput_estimate(job, self.snapshot.now, self.params, self.goodput_servers)
            self.estimates[job.job_id] = known
        return known

    def carry(self) -> dict[int, tuple[JobView, int, JobEstimate]]:
        """The estimates the next cycle may keep: those of jobs holding no GPUs, which do not depend on
        ``now`` (``core.throughput.estimate`` reads the clock only for a running job)."""
        views = {job.job_id: job for job in self.snapshot.jobs}
        return {job_id: (view, self.goodput_servers, known) for job_id, known in self.estimates.items()
                if (view := views.get(job_id)) is not None and not view.workers}

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


def _goodput_scale_in_cost(job: _Job, now: float, params: PolicyParams, gpus_per_server: int) -> float:
    """What one worker fewer costs a job with a fitted goodput model beyond its restart, in GPU-seconds:
    the completion time its goodput model says the worker saves, x its GPUs per worker (0 for other
    jobs, and when ``gpus_per_server`` is 0)."""
    view = job.view
    if gpus_per_server <= 0 or job_goodput(view) is None or len(job.workers) <= 1:
        return 0.0
    est = goodput_estimate(view, now, params, gpus_per_server)
    w = len(job.workers)
    return max(0.0, est.remaining_time(w - 1) - est.remaining_time(w)) * view.gpus_per_worker


def choose_reclaim(running: dict[int, _Job], loaned: list[ServerView], count: int, params: PolicyParams,
                   now: float, *, naive: bool = False, goodput_servers: int = 0) -> ReclaimDecision:
    """Greedy on server preemption cost (solvers.reclaim), recomputed after each pick. Loans younger
    than ``min_loan_s`` are taken only when the older ones do not suffice. ``naive``: the baseline
    the greedy is measured against -- the most recently loaned servers, whatever runs on them.
    ``goodput_servers`` > 0 (the servers' GPUs; a goodput-aware policy): a job with a fitted goodput
    model also pays, per worker it loses, the completion time its goodput model says that worker saves
    (``_goodput_scale_in_cost``), and its deadline cost reads its goodput estimate; 0: as without."""
    old = [s for s in loaned if s.loan_started_at is None or now - s.loan_started_at >= params.min_loan_s]
    candidates = old if len(old) >= count else loaned
    count = min(count, len(candidates))
    if count <= 0:
        return ReclaimDecision((), (), (), 0.0)
    index = {s.server_id: i for i, s in enumerate(candidates)}
    jobs = sorted(
        (j for j in running.values() if any(w.server_id in index for w in j.workers)), key=lambda j: j.view.job_id
    )
    # Anti-thrashing (``core.protection``): a protected job weighs a penalty per worker stopped, so the
    # greedy takes a server with one only when the servers without do not suffice (inference must get
    # its servers back). The decision's cost leaves the penalties out.
    penalty = [reclaim_penalty(protection(j.view, now, params)) for j in jobs]
    triples: dict[tuple[int, int], int] = {}
    for ji, job in enumerate(jobs):
        for w in job.workers:
            if w.server_id in index:
                key = (ji, index[w.server_id])
                triples[key] = triples.get(key, 0) + 1
    instance = ReclaimInstance.from_triples(
        [(j, s, n) for (j, s), n in sorted(triples.items())],
        n_servers=len(candidates),
        job_workers=[len(j.workers) for j in jobs],
        job_min=[j.view.min_workers for j in jobs],
        # A preemption loses the work since the checkpoint and pays a restart, like a scale-in does;
        # so even a job that has just checkpointed is cheaper to shrink than to requeue.
        # A preemption that makes a job miss the deadline it would meet costs that deadline too.
        job_cost=[_with_deadline_cost(j, now, params, _work_lost(j, now)
                                      + params.restart_cost_s * len(j.workers) * j.view.gpus_per_worker,
                                      goodput_servers)
                  + m * len(j.workers) for j, m in zip(jobs, penalty, strict=True)],
        scale_in_cost=[params.restart_cost_s * j.view.gpus_per_worker + m
                       + _goodput_scale_in_cost(j, now, params, goodput_servers)
                       for j, m in zip(jobs, penalty, strict=True)],
    )
    if naive:
        loaned_at = [s.loan_started_at if s.loan_started_at is not None else s.state_since for s in candidates]
        outcome = reclaim_most_recent_first(instance, count, loaned_at)
    else:
        outcome = reclaim_greedy(instance, count)
    return ReclaimDecision(
        servers=tuple(candidates[int(i)].server_id for i in outcome.servers),
        preempted=tuple(jobs[ji].view.job_id for ji in range(len(jobs)) if outcome.preempted[ji]),
        scaled_in=tuple(
            (jobs[ji].view.job_id, len(jobs[ji].workers), int(outcome.new_workers[ji]))
            for ji in range(len(jobs))
            if not outcome.preempted[ji] and int(outcome.new_workers[ji]) < len(jobs[ji].workers)
        ),
        cost_gpu_s=float(outcome.total_cost) - sum(
            penalty[ji] * (len(jobs[ji].workers) if outcome.preempted[ji] else len(jobs[ji].workers)
                           - int(outcome.new_workers[ji]))
            for ji in range(len(jobs))),
    )


def _work_lost(job: _Job, now: float) -> float:
    """GPU-seconds lost if the job is preempted now: work since its last checkpoint or resize."""
    view = job.view
    since = max(t for t in (view.last_checkpoint_at, view.last_resized_at, view.started_at, 0.0) if t is not None)
    return max(now - since, 1.0) * len(job.workers) * view.gpus_per_worker


def _with_deadline_cost(job: _Job, now: float, params: PolicyParams, cost: float, goodput_servers: int = 0
                        ) -> float:
    """``cost`` (GPU-seconds) of preempting ``job``, plus ``deadline_weight`` x its remaining GPU-time
    when it meets its deadline at its size and would miss it requeued: restarted now at
    ``min_workers`` (a restart's cost, the work lost since its checkpoint redone, the rest). Jobs
    without a deadline (or with ``deadline_weight`` 0) cost exactly ``cost``."""
    view = job.view
    if view.deadline is None or not params.deadline_weight:
        return cost
    est = goodput_estimate(view, now, params, goodput_servers)
    size, low = len(job.workers), view.min_workers
    at_size = predicted_remaining(view, size, now, est, params.amdahl_alpha)
    if now + at_size > view.deadline:
        return cost  # it misses anyway: the preemption does not make it miss
    at_min = predicted_remaining(view, low, now, est, params.amdahl_alpha)
    since = max(t for t in (view.last_checkpoint_at, view.last_resized_at, view.started_at, 0.0) if t is not None)
    redo = max(now - since, 0.0) * (at_min / at_size if at_size > 0 else 1.0)  # the lost work, at min_workers
    if now + params.restart_cost_s + redo + at_min <= view.deadline:
        return cost
    return cost + params.deadline_weight * at_size * size * view.gpus_per_worker


def _deadline_bonus(cycle: _Cycle, job: _Job, count: int) -> list[float] | None:
    """What meeting its deadline adds to option k = 1..count of the knapsack (k workers beyond
    ``min_workers``): ``deadline_weight`` x its remaining time at ``min_workers`` for each option that
    meets the deadline when ``min_workers`` misses it (a start or resize costs ``restart_cost_s``);
    None when no option turns a miss into a hit (no deadline, met anyway, or missed anyway)."""
    p, view, now = cycle.params, job.view, cycle.snapshot.now
    if view.deadline is None or not p.deadline_weight:
        return None
    est, current = cycle.estimate(view), len(job.workers)

    def finish(workers: int) -> float:
        restart = 0.0 if workers == current else p.restart_cost_s
        return now + restart + predicted_remaining(view, workers, now, est, p.amdahl_alpha)

    low = view.min_workers
    if finish(low) <= view.deadline:
        return None
    worth = p.deadline_weight * predicted_remaining(view, low, now, est, p.amdahl_alpha)
    bonus = [worth if finish(low + k) <= view.deadline else 0.0 for k in range(1, count + 1)]
    return bonus if any(bonus) else None


def _running_jobs(snapshot: ClusterSnapshot) -> dict[int, _Job]:
    """The running jobs of the snapshot, each with its workers in rank order."""
    return {
        j.job_id: _Job(j, sorted(j.workers, key=_rank) if len(j.workers) > 1 else list(j.workers))
        for j in snapshot.jobs
        if j.state in RUNNING_STATES and j.workers
    }


def _loaned_oldest_first(snapshot: ClusterSnapshot) -> list[ServerView]:
    """The LOANED servers in the order the reclaim considers them: longest in that state first."""
    return sorted((s for s in snapshot.servers if s.state == ServerState.LOANED),
                  key=lambda s: (s.state_since, s.server_id))


class ArylPolicy:
    """``goodput``: jobs with a fitted goodput model (``core.goodput_fit``) are valued by it -- their
    completion-time estimates (the knapsack's JCT reductions, the queue order's remaining GPU-time, the
    reclaim's costs) come from their goodput at the best batch size for each size, and the plan carries
    that batch (``Plan.batches``) for every job with batch limits that holds workers. Jobs without a
    fitted model are decided exactly as without it."""

    def __init__(self, name: str, params: PolicyParams, *, loaning: bool, elastic: bool,
                 naive_reclaim: bool = False, goodput: bool = False, joint: bool = False) -> None:
        self.name = name
        self.joint = joint and elastic
        self.params = params
        self.loaning = loaning
        self.elastic = elastic
        self.naive_reclaim = naive_reclaim
        self.goodput = goodput
        self._carried: dict[int, tuple[JobView, int, JobEstimate]] = {}  # the last cycle's (``_Cycle.carry``)

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        cycle = _Cycle(
            snapshot=snapshot,
            servers=dict(zip(map(_server_id, snapshot.servers), snapshot.servers, strict=True)),
            server_state=dict(zip(map(_server_id, snapshot.servers), map(_state, snapshot.servers), strict=True)),
            running=_running_jobs(snapshot),
            params=self.params,
            goodput_servers=_server_gpus(snapshot) if self.goodput else 0,
            carried=self._carried,
        )
        cycle.protected = protected_jobs((j.view for j in cycle.running.values()), snapshot.now, self.params)
        if self.loaning:
            self._loan_cycle(cycle)
        else:
            cycle.loan_note = LoanNote(Reason.NOT_LOANED_BY_POLICY,
                                       f"policy {self.name!r} never loans inference servers to training")
        cycle.rebuild_capacity()
        if self.joint:
            _joint_sizing(cycle)
        self._base_demands(cycle)
        if self.elastic:
            self._elastic_extras(cycle)
        else:
            for job in cycle.running.values():
                if len(job.workers) < job.view.max_workers:
                    cycle.holds[job.view.job_id] = (
                        Reason.HELD_NOT_ELASTIC, f"policy {self.name!r} runs jobs at min_workers (no elastic scaling)")
        scales = tuple(self._scales(cycle))  # first: it may grow this cycle's starts to full size
        self._carried = cycle.carry()
        return Plan(
            starts=tuple(cycle.starts),
            scales=scales,
            preemptions=tuple(cycle.preemptions),
            server_actions=tuple(cycle.server_actions),
            pending=tuple(cycle.pending),
            held=_size_notes(cycle, scales),
            loan_note=cycle.loan_note,
            batches=_batches(cycle) if self.goodput else (),
        )

    def preview_reclaim(self, snapshot: ClusterSnapshot, count: int) -> ReclaimDecision:
        """Dry run (``core.registry.ReclaimPreviewer``): what this policy's reclaim would choose if
        inference needed ``count`` loaned servers back now. Changes nothing."""
        if not self.loaning:
            raise ReclaimPreviewUnsupported(self.name)
        return choose_reclaim(_running_jobs(snapshot), _loaned_oldest_first(snapshot), count, self.params,
                              snapshot.now, naive=self.naive_reclaim,
                              goodput_servers=_server_gpus(snapshot) if self.goodput else 0)

    # -- step 0: loans and reclaims --------------------------------------------------------------

    def _loan_cycle(self, cycle: _Cycle) -> None:
        p, snap = self.params, cycle.snapshot
        inference = [s for s in snap.servers if s.pool == Pool.INFERENCE]
        by_state: dict[ServerState, list[ServerView]] = {}
        for s in sorted(inference, key=lambda s: (s.state_since, s.server_id)):
            by_state.setdefault(s.state, []).append(s)
        # Vacated reclaimed servers serve again once their agent confirms it stopped the workers, or
        # at the reclaim's hard deadline, set by the RECLAIM step (``core.apply_rules.reclaim_deadline``;
        # the router still routes there only once the agent confirms).
        for s in by_state.get(ServerState.RECLAIMING, []):
            if s.allocated:
                continue
            why = (
                "training workers stopped; serving inference again" if s.agent_converged
                # The stored deadline, not this policy's params: they may have changed since the RECLAIM.
                else f"reclaim deadline of {s.reclaim_deadline - s.state_since:.0f}s passed before the agent "
                     "confirmed the workers stopped; returned to inference by force"
                if s.reclaim_deadline is not None and snap.now >= s.reclaim_deadline else None
            )
            if why is not None:
                cycle.act(s.server_id, LoanStep.RETURN, ServerState.SERVING, Reason.RETURNED_TO_SERVING, why)
        # Servers an operator took out: a loan still draining is cancelled (training may not use a
        # cordoned server), and a drained one on loan is reclaimed the normal way (its jobs shrink or
        # requeue as for any reclaim).
        for s in by_state.get(ServerState.DRAINING, []):
            if s.cordoned:
                cycle.act(s.server_id, LoanStep.CANCEL, ServerState.SERVING, Reason.LOAN_CANCELLED,
                          f"server {s.server_id} is cordoned ({s.admin}): not lent to training")
        # A drain honours protection windows until its deadline, as on any server (``core.faults``): a loaned
        # server holding a protected job is taken back once the window ends or the deadline passes.
        taken_out = [s for s in by_state.get(ServerState.LOANED, []) if s.draining
                     and not _drain_waits(cycle, s)]
        if taken_out:
            self._reclaim(cycle, taken_out, len(taken_out), why="an operator drains it", mechanism=Mechanism.DRAIN,
                          need="must meet the operator's deadline")
        if snap.demand is None:  # no demand signal yet: never loan blind
            cycle.loan_note = LoanNote(Reason.NOT_LOANED_NO_DEMAND,
                                       "no server loaned: no inference demand reported yet (loans follow the "
                                       "router's demand signal)")
            return
        needed = snap.demand.servers_needed
        serving = list(cycle.server_state.values()).count(ServerState.SERVING)
        coming_back = sum(1 for s in by_state.get(ServerState.RECLAIMING, [])
                          if cycle.server_state[s.server_id] == ServerState.RECLAIMING)
        deficit = needed - serving - coming_back
        draining = [s for s in by_state.get(ServerState.DRAINING, []) if not s.cordoned]
        if deficit > 0:
            for s in reversed(draining):  # the most recent loans are the cheapest to cancel
                if deficit == 0:
                    break
                cycle.act(s.server_id, LoanStep.CANCEL, ServerState.SERVING, Reason.LOAN_CANCELLED,
                          f"inference needs {needed} server(s) again")
                deficit -= 1
            if deficit > 0:
                self._reclaim(cycle, [s for s in by_state.get(ServerState.LOANED, []) if not s.draining], deficit,
                              why=f"inference needs {needed} serving server(s)")
        for s in draining:
            if cycle.server_state[s.server_id] != ServerState.DRAINING:
                continue
            # The router's acknowledgement is the normal path; the timeout covers deployments without
            # a router (demand reported by hand or by the user's own load balancer).
            why = (
                "the router reports no requests in flight; lent to training" if s.drained
                else f"drained for {p.drain_timeout_s:.0f}s; lent to training"
                if snap.now - s.state_since >= p.drain_timeout_s else None
            )
            if why is not None:
                cycle.act(s.server_id, LoanStep.ACTIVATE, ServerState.LOANED, Reason.LOAN_ACTIVE, why)
        surplus = serving - needed - p.loan_buffer_servers
        if deficit <= 0 and surplus > 0:
            self._loan(cycle, by_state.get(ServerState.SERVING, []), surplus, needed)
        else:
            cycle.loan_note = LoanNote(
                Reason.NOT_LOANED_NO_SURPLUS,
                f"{_no_loan(cycle)}: inference needs {needed} server(s) + {p.loan_buffer_servers} spare "
                f"(policy.loan_buffer_servers); {serving} serving" + (f", {coming_back} coming back" if coming_back
                                                                      else ""))

    def _reclaim(self, cycle: _Cycle, loaned: list[ServerView], count: int, *, why: str,
                 mechanism: Mechanism = Mechanism.RECLAIM, need: str = "") -> None:
        decision = choose_reclaim(cycle.running, loaned, count, self.params, cycle.snapshot.now,
                                  naive=self.naive_reclaim,
                                  goodput_servers=cycle.goodput_servers)
        chosen = set(decision.servers)
        # A protected job is disrupted only when the servers without one did not suffice (``choose_reclaim``).
        need = need or (f"needs {len(decision.servers)} loaned server(s) back and those without protected jobs "
                        "do not suffice")
        for job_id in decision.preempted:
            job = cycle.running.pop(job_id)
            shield = cycle.protected.get(job_id)
            cycle.preemptions.append(
                PreemptJob(job_id, Reason.PREEMPTED_FOR_RECLAIM,
                           f"its loaned server(s) {', '.join(sorted(chosen & {w.server_id for w in job.workers}))} "
                           f"went back to inference; below min_workers={job.view.min_workers}, requeued"
                           + (f"; {overridden(shield, mechanism, need)}" if shield else ""))
            )
        for job_id, _, after in decision.scaled_in:
            job = cycle.running[job_id]
            job.workers = [w for w in job.workers if w.server_id not in chosen]
            assert len(job.workers) == after
            job.reclaimed = True
            shield = cycle.protected.get(job_id)
            if shield is not None:
                job.override = overridden(shield, mechanism, need)
            job.scaled_in(Reason.SCALED_IN_FOR_RECLAIM)
        for server_id in decision.servers:
            cycle.act(server_id, LoanStep.RECLAIM, ServerState.RECLAIMING, Reason.RECLAIMED_FOR_INFERENCE, why)

    def _loan(self, cycle: _Cycle, serving: list[ServerView], surplus: int, needed: int) -> None:
        p, snap = self.params, cycle.snapshot
        demand = self._training_demand_gpus(cycle)
        if demand <= 0:
            cycle.loan_note = LoanNote(Reason.NOT_LOANED_NO_TRAINING_DEMAND,
                                       f"{_no_loan(cycle)}: training needs no more GPUs than are free")
            return
        idle = [s for s in serving
                if snap.now - s.state_since >= p.loan_idle_s and not s.unhealthy_gpus and not s.cordoned]
        if not idle:
            waiting = [s for s in serving if snap.now - s.state_since < p.loan_idle_s and not s.unhealthy_gpus]
            cycle.loan_note = LoanNote(
                Reason.NOT_LOANED_NOT_IDLE,
                f"{_no_loan(cycle)}: {surplus} serving server(s) to spare, but "
                + (f"none has served {p.loan_idle_s:.0f}s (policy.loan_idle_s) in its state yet; the first may "
                   f"be loaned at {clock_time(min(s.state_since for s in waiting) + p.loan_idle_s)}" if waiting
                   else "none is fit to lend (unhealthy GPUs, or taken out by an operator)"))
            return
        cycle.loan_note = LoanNote(None)  # loans this cycle: their LOAN events say why
        for s in idle[:surplus]:  # longest idle first
            if demand <= 0:
                break
            cycle.act(s.server_id, LoanStep.LOAN, ServerState.DRAINING, Reason.LOANED_IDLE_SERVER,
                      f"inference needs {needed} server(s) + {p.loan_buffer_servers} spare; training waits for "
                      f"{demand} GPU(s)")
            demand -= len(s.gpu_indices)

    def _training_demand_gpus(self, cycle: _Cycle) -> int:
        """GPUs training could use now beyond what is free on training-capable servers."""
        snap = cycle.snapshot
        pending = sum(j.min_workers * j.gpus_per_worker for j in snap.pending_jobs())
        growth = sum(
            (j.view.max_workers - len(j.workers)) * j.view.gpus_per_worker
            for j in cycle.running.values()
        ) if self.elastic else 0
        free, state = 0, cycle.server_state
        for s in snap.servers:
            if state[s.server_id] in _TRAINING_OR_DRAINING and not s.cordoned:
                free += len(s.free_gpus)
        return pending + growth - free

    # -- step 1: base demands --------------------------------------------------------------------

    def _base_demands(self, cycle: _Cycle) -> None:
        p, snap = self.params, cycle.snapshot

        def starving(job: JobView) -> bool:
            return snap.now - job.submitted_at >= p.starvation_s

        def order(job: JobView) -> tuple[bool, int, float, float, int]:
            gpu_time = cycle.estimate(job).remaining_gpu_time(job.min_workers, job.gpus_per_worker)
            return (not starving(job) and not self.joint, -job.priority, gpu_time, job.submitted_at, job.job_id)

        quota = cycle.quota = _ledger(cycle, {})
        waiting_before: JobView | None = None
        # Gang shapes (gpus per worker, workers) that fit nowhere, not even over extras. Free GPUs plus
        # extras only shrink during this step, so any shape at least as large fails too.
        no_fit: list[tuple[int, int]] = []
        # The last job that waited with no victims to preempt and not starving (``_Waited``). A next job of the same
        # kind (``_kind``), not starving either, while the plan has started, preempted and reserved
        # nothing more would take the same steps on the same free GPUs and quota usage and fail them
        # the same way (its shape is in ``no_fit`` by then, so it tries no extras and names no
        # protection): it waits for the same reason without the steps. A long queue holds 10,000s of
        # jobs of a few kinds (a job array is one), and a burst of submits wakes a cycle after another.
        last_wait: _Waited | None = None

        def waited(job: JobView, victims: bool, reason: Reason, message: str) -> _Waited | None:
            if victims or starving(job):
                return None
            return _Waited(_kind(job), len(cycle.starts), len(cycle.preemptions), cycle.reserved, reason, message)

        later: list[JobView] = []  # deferred by the joint sizing (``_joint_sizing``): after the others
        for job in quota.order(snap.pending_jobs(), order):  # quota first, classes, fair share (core.quota)
            if (last_wait is not None and last_wait.kind == _kind(job) and last_wait.starts == len(cycle.starts)
                    and last_wait.preemptions == len(cycle.preemptions) and last_wait.reserved is cycle.reserved
                    and not starving(job)):
                cycle.pending.append(KeepPending(job.job_id, last_wait.reason, last_wait.message))
                continue
            last_wait = None
            if job.job_id in cycle.deferred:
                later.append(job)
                continue
            verdict = quota.check(job, job.min_workers * job.gpus_per_worker)
            if not verdict.allowed:  # its queue may not take the GPUs: it waits without holding others up,
                # unless lower classes of its own queue give way (their GPUs count against the same quota)
                victims = quota.has_victims(job)
                workers = self._place_by_preemption(cycle, job) if victims else None
                if workers is None:
                    reason, message = verdict.reason or Reason.WAITING_FOR_QUOTA, verdict.message
                    cycle.pending.append(_protected_pending(cycle, job, reason, message))
                    last_wait = waited(job, victims, reason, message)
                    continue
                quota.charge(job, job.min_workers * job.gpus_per_worker)
                cycle.starts.append(StartJob(job.job_id, workers, Reason.PLACED, _placed(workers)))
                cycle.running[job.job_id] = _Job(job, list(workers))
                continue
            exclude = _exclusion(cycle, job)
            workers = cycle.capacity.place_gang(job, job.min_workers, pools=TRAINING_FIRST, exclude=exclude)
            if workers is None and not any(
                g <= job.gpus_per_worker and n <= job.min_workers for g, n in no_fit
            ):
                workers = self._place_over_extras(cycle, job, exclude)
                if workers is None:
                    no_fit.append((job.gpus_per_worker, job.min_workers))
            victims = quota.has_victims(job)
            if workers is None and victims:
                workers = self._place_by_preemption(cycle, job)
            if workers is not None:
                quota.charge(job, job.min_workers * job.gpus_per_worker)
                if waiting_before is None:
                    reason, why = Reason.PLACED, ""
                else:
                    reason, why = Reason.BACKFILLED, f"; backfilled ahead of job {waiting_before.job_id}"
                cycle.starts.append(StartJob(job.job_id, workers, reason, _placed(workers) + why))
                cycle.running[job.job_id] = _Job(job, list(workers))
                continue
            waiting_before = waiting_before or job
            if cycle.reserved and job.job_id != cycle.reserved_for:
                reason, message = self._unplaceable(cycle, job)
                if reason == Reason.WAITING_FOR_GANG:
                    reason = Reason.WAITING_FOR_RESERVATION
                    message += f"; server(s) {', '.join(sorted(cycle.reserved))} are held for a starving job"
                cycle.pending.append(_protected_pending(cycle, job, reason, message))
                last_wait = waited(job, victims, reason, message)
                continue
            reason, message = self._unplaceable(cycle, job)
            if starving(job) and not cycle.reserved and reason != Reason.CANNOT_FIT:
                cycle.reserved = self._reserve(cycle, job)
                if cycle.reserved:
                    cycle.reserved_for = job.job_id
                    message += (f"; waiting {snap.now - job.submitted_at:.0f}s: server(s) "
                                f"{', '.join(sorted(cycle.reserved))} are reserved for it")
            cycle.pending.append(_protected_pending(cycle, job, reason, message))
            last_wait = waited(job, victims, reason, message)
        if later:
            self._start_deferred(cycle, later)

    def _start_deferred(self, cycle: _Cycle, later: list[JobView]) -> None:
        """The joint sizing's deferred jobs, in the queue's order, after every other: the GPUs it admitted
        jobs for that then did not fit (their gangs found no room on the servers, where the sizing counts
        GPUs) go to these on free GPUs, so no GPU the sizing gave out idles. The rest wait, saying why."""
        admitted = cycle.admitted or {}
        started = {s.job_id for s in cycle.starts}
        views = {j.job_id: j for j in cycle.snapshot.pending_jobs() if j.job_id in admitted}
        budget = sum(v.min_workers * v.gpus_per_worker for job_id, v in views.items() if job_id not in started)
        quota = cycle.quota
        assert quota is not None
        for job in later:
            need = job.min_workers * job.gpus_per_worker
            verdict = quota.check(job, need)
            if not verdict.allowed:  # the others' starts took its queue's room: the reason that lasts
                cycle.pending.append(KeepPending(job.job_id, verdict.reason or Reason.WAITING_FOR_QUOTA,
                                                 verdict.message))
                continue
            workers = None
            if need <= budget:
                workers = cycle.capacity.place_gang(job, job.min_workers, pools=TRAINING_FIRST,
                                                    exclude=_exclusion(cycle, job))
            if workers is None:
                cycle.pending.append(KeepPending(job.job_id, Reason.WAITING_FOR_GANG, cycle.deferred[job.job_id]))
                continue
            budget -= need
            quota.charge(job, need)
            cycle.starts.append(StartJob(job.job_id, workers, Reason.BACKFILLED, _placed(workers) + (
                "; backfilled on GPUs the joint sizing gave jobs whose gangs did not fit")))
            cycle.running[job.job_id] = _Job(job, list(workers))

    def _unplaceable(self, cycle: _Cycle, job: JobView) -> tuple[Reason, str]:
        """Why a queued job's gang is not placed this cycle: CANNOT_FIT when it would not fit even on
        every server this policy may ever place on, all free (``core.fit``: the cluster shrank under
        it, or SubmitJob could not know yet), else what the free capacity lacks now."""
        if cycle.server_gpus is None:
            cycle.server_gpus = [len(s.gpu_indices) for s in cycle.snapshot.servers
                                 if s.pool == Pool.TRAINING or self.loaning]
        shape = (job.gpus_per_worker, job.min_workers)
        if shape in cycle.never_fit:
            why = cycle.never_fit[shape]
        else:
            why = cycle.never_fit[shape] = never_fits(
                job.gpus_per_worker, job.min_workers, cycle.server_gpus,
                servers="training + inference servers" if self.loaning else "training servers")
        if why is not None:
            return Reason.CANNOT_FIT, f"can never fit the servers registered now: {why}"
        return cycle.capacity.explain_unplaceable(job, job.min_workers)

    def _place_over_extras(self, cycle: _Cycle, job: JobView, exclude: frozenset[str]
                           ) -> tuple[WorkerPlacement, ...] | None:
        """Place a gang on free GPUs plus those of other jobs' extra workers, scaling those in. Extras of
        a job in its protection window stay (``core.protection``); when only they would have made room,
        the job's pending reason says so (``cycle.blocked_by``)."""
        extras: list[tuple[_Job, _Worker]] = []
        shielded: list[tuple[_Job, _Worker]] = []
        for other in cycle.running.values():
            if other.extras > 0:
                pair = [(other, w) for w in other.workers[other.view.min_workers:]]
                (shielded if other.view.job_id in cycle.protected else extras).extend(pair)
        if not extras and not shielded:
            return None
        trial = cycle.capacity.copy()
        trial.release_many((w.server_id, w.gpu_indices) for _, w in extras)
        placed = trial.place_gang(job, job.min_workers, pools=TRAINING_FIRST, exclude=exclude)
        if placed is None and shielded:
            trial.release_many((w.server_id, w.gpu_indices) for _, w in shielded)
            if trial.place_gang(job, job.min_workers, pools=TRAINING_FIRST, exclude=exclude) is not None:
                starving = cycle.snapshot.now - job.submitted_at >= cycle.params.starvation_s
                mechanism = Mechanism.STARVATION if starving else Mechanism.BASE_DEMAND
                cycle.blocked_by.setdefault(job.job_id, []).append(
                    tuple((cycle.protected[i], mechanism) for i in sorted({o.view.job_id for o, _ in shielded})))
        if placed is None:
            return None
        taken = {(w.server_id, g) for w in placed for g in w.gpu_indices}
        shrunk: dict[int, _Job] = {}
        for other, w in extras:
            if any((w.server_id, g) in taken for g in w.gpu_indices):
                other.workers.remove(w)
                shrunk[other.view.job_id] = other
                cycle.capacity.release(w.server_id, [g for g in w.gpu_indices if (w.server_id, g) not in taken])
                if cycle.quota is not None:
                    cycle.quota.release(other.view, other.view.gpus_per_worker)
        for other in shrunk.values():  # once all its taken extras are gone: the message names the size left
            other.made_room_for.append(job.job_id)
            other.scaled_in(Reason.SCALED_IN_FOR_BASE_DEMAND)
        for w in placed:
            cycle.capacity.take(w.server_id, w.gpu_indices)
        return placed

    def _place_by_preemption(self, cycle: _Cycle, job: JobView) -> tuple[WorkerPlacement, ...] | None:
        """Place a gang by preempting running jobs it may preempt (``QuotaLedger.may_preempt``: a queue's
        borrowed GPUs for a job within its quota, lower priority classes of its own queue), cheapest
        first, as few as make the gang fit and its queue's quota allow it; a victim is spared when the
        gang does not use its GPUs and the quota does not need them."""
        quota, p, now = cycle.quota, self.params, cycle.snapshot.now
        assert quota is not None
        # What may_preempt answers depends on the job's queue, class and (queues enforced) its gang's GPUs,
        # and on the running jobs and quotas, which change only as this cycle starts or preempts a job.
        key = (job.queue, job.priority_class, job.min_workers * job.gpus_per_worker if quota.enforced else 0,
               len(cycle.starts), len(cycle.preemptions))
        scan = cycle.preemption_scans.get(key)
        if scan is None:
            started = {s.job_id for s in cycle.starts}
            candidates, shielded = [], []
            for o in cycle.running.values():
                may = quota.may_preempt(job, o.view)
                if may is None:
                    continue
                gpus = len(o.workers) * o.view.gpus_per_worker
                if o.view.job_id in cycle.protected:  # anti-thrashing: never a protected job (core.protection)
                    shielded.append((cycle.protected[o.view.job_id],
                                     Mechanism.QUOTA if may == Reason.PREEMPTED_FOR_QUOTA else Mechanism.PRIORITY))
                elif o.view.job_id not in started:
                    candidates.append((o.view, _work_lost(o, now) + p.restart_cost_s * gpus, gpus))
            scan = cycle.preemption_scans[key] = (preemption_order(candidates), tuple(shielded))
        victims, shielded_by = scan
        if not victims:  # a long queue of such jobs: no copy of the capacity each
            _not_preempted(cycle, job, shielded_by)
            return None
        trial, chosen, placed = cycle.capacity.copy(), [], None
        for victim in victims:
            reason = quota.may_preempt(job, victim)  # again: its queue may be back within its quota
            if reason is None:
                continue
            other = cycle.running[victim.job_id]
            trial.release_many((w.server_id, w.gpu_indices) for w in other.workers)
            quota.release(victim, len(other.workers) * victim.gpus_per_worker)
            chosen.append((other, reason))
            placed = trial.place_gang(job, job.min_workers, pools=TRAINING_FIRST, exclude=cycle.reserved)
            if placed is not None and not quota.check(job, job.min_workers * job.gpus_per_worker).allowed:
                trial.release_many((w.server_id, w.gpu_indices) for w in placed)  # fits, but not in its quota yet
                placed = None
            if placed is not None:
                break
        taken = {(w.server_id, g) for w in placed for g in w.gpu_indices} if placed is not None else set()
        need = job.min_workers * job.gpus_per_worker
        for other, reason in chosen:
            view = other.view
            if not any((w.server_id, g) in taken for w in other.workers for g in w.gpu_indices):
                quota.charge(view, len(other.workers) * view.gpus_per_worker)
                if placed is None or quota.check(job, need).allowed:
                    continue  # spared: the gang does not use its GPUs, and the quota does not need them
                quota.release(view, len(other.workers) * view.gpus_per_worker)
            del cycle.running[view.job_id]
            cycle.capacity.release_many((w.server_id, w.gpu_indices) for w in other.workers)
            q = quota.queue_of(view)
            cycle.preemptions.append(PreemptJob(
                view.job_id, reason,
                f"queue `{q.name}` borrowed GPUs beyond its quota of {q.quota_gpus}; job {job.job_id} of queue "
                f"`{job.queue}` needed them back within its quota; requeued"
                if reason == Reason.PREEMPTED_FOR_QUOTA else
                f"job {job.job_id} of a higher priority class ({job.priority_class} > {view.priority_class}) in "
                f"queue `{q.name}` needed its GPUs; requeued"))
        if placed is None:
            _not_preempted(cycle, job, shielded_by)
            return None
        for w in placed:
            cycle.capacity.take(w.server_id, w.gpu_indices)
        return placed

    def _reserve(self, cycle: _Cycle, job: JobView) -> frozenset[str]:
        """Servers that together could hold the job's gang once their workers finish: those whose jobs are
        estimated to end soonest (a job's elastic extras count as free: the gang may take them), training
        servers before loaned ones, so that the reservation idles as few GPUs as briefly as it can. Sets
        ``cycle.reserved_until``: queued jobs estimated to finish by then may still use those servers
        (``_exclusion``)."""
        ends: dict[str, float] = {}
        for other in cycle.running.values():
            left = cycle.estimate(other.view).remaining_time(len(other.workers))
            for w in other.workers[: other.view.min_workers]:
                ends[w.server_id] = max(ends.get(w.server_id, 0.0), left)
        slots, chosen, until = 0, [], 0.0
        for s in sorted(cycle.capacity.servers.values(),
                        key=lambda s: (ends.get(s.server_id, 0.0), s.pool != Pool.TRAINING, -len(s.gpu_indices),
                                       s.server_id)):
            usable = len(s.gpu_indices) - len(s.unhealthy_gpus)
            if usable >= job.gpus_per_worker:
                chosen.append(s.server_id)
                slots += usable // job.gpus_per_worker
                until = max(until, ends.get(s.server_id, 0.0))
            if slots >= job.min_workers:
                cycle.reserved_until = cycle.snapshot.now + until
                return frozenset(chosen)
        return frozenset()

    # -- step 2: elastic extras ------------------------------------------------------------------

    def _elastic_extras(self, cycle: _Cycle) -> None:
        p = self.params
        def locked(job: _Job) -> bool:
            """Anti-thrashing: in its protection window (``core.protection``), and nothing forced a change
            this cycle."""
            return job.reason is None and job.view.job_id in cycle.protected

        jobs = sorted(
            (j for j in cycle.running.values() if j.view.max_workers > j.view.min_workers and not locked(j)),
            key=lambda j: j.view.job_id,
        )
        for job in cycle.running.values():  # the locked ones below max_workers say so, if GPUs are spare
            at, shield = job.view.last_resized_at, cycle.protected.get(job.view.job_id)
            if shield is not None and len(job.workers) < job.view.max_workers and locked(job):
                interval = p.min_resize_interval_s
                cycle.holds[job.view.job_id] = (
                    ((Reason.HELD_RESIZE_INTERVAL,
                      f"resized at {clock_time(at)}; resizes at most every {interval:.0f}s "
                      f"(policy.min_resize_interval_s), next possible at {clock_time(at + interval)}")
                     if shield.rule == ProtectionRule.MIN_RUNTIME and at is not None
                     else (Reason.HELD_DISRUPTION_CAP, shield.summary))
                    if _spare(cycle) >= job.view.gpus_per_worker else _no_spare(cycle))
        if not jobs:
            return
        # The knapsack's capacity: free GPUs plus those the extras hold now (they may move). Worked out
        # on the side -- each touched server's free GPUs as if every extra were released -- and only
        # the net change is written back once the kept extras are known: most extras stay put.
        free_cap = cycle.capacity
        released: dict[str, set[int]] = {}
        for job in jobs:
            for w in job.workers[job.view.min_workers:]:
                free = released.get(w.server_id)
                if free is None:
                    free = free_cap.free_set(w.server_id)
                    if free is None:
                        continue  # not schedulable: its GPUs are not this cycle's to share out
                    released[w.server_id] = free
                free.update(w.gpu_indices)
        total = free_cap.total + sum(len(free) for free in released.values()) - free_cap.free_on(released)
        reserved = sum(len(released[sid]) if sid in released else len(free_cap.free(sid)) for sid in cycle.reserved)
        capacity = total - reserved
        counts = [min(j.view.max_workers - j.view.min_workers, p.max_extra_options) for j in jobs]
        k_max = max(counts)
        # Option k of job g: k more workers. gains[g][k - 1]: the JCT reduction it buys.
        gains = [cycle.estimate(j.view).jct_reductions(j.view.min_workers, n)
                 for j, n in zip(jobs, counts, strict=True)]
        weights, values = [], []
        restart = p.restart_cost_s
        started = {start.job_id for start in cycle.starts}
        rows: dict[tuple[int, int], list[int]] = {}  # weights by (gpus per worker, count): few distinct
        for job, count, gain in zip(jobs, counts, gains, strict=True):
            current, per_worker = len(job.workers) - job.view.min_workers, job.view.gpus_per_worker
            # Changing size costs a restart; shifting the whole group by that cost keeps option 0 at 0.
            shift = restart if current > 0 else 0.0
            padding = k_max - count  # slots beyond the job's count are ignored by the solver
            row = rows.get((per_worker, count))
            if row is None:
                row = rows[(per_worker, count)] = [k * per_worker for k in range(1, count + 1)] + [0] * padding
            weights.append(row)
            bonus = _deadline_bonus(cycle, job, count)  # a worker that saves a deadline is worth more
            if self.joint:  # the joint sizing's completion rates (a job started this cycle: no resize)
                fresh = job.view.job_id in started
                rates = completion_rates(cycle.estimate(job.view), job.view.min_workers, count,
                                         -1 if fresh else len(job.workers), restart)
                value = [r - rates[0] + b for r, b in zip(rates[1:], _rate_bonus(bonus, rates), strict=True)]
            else:
                value = [g + shift if k == current else g + shift - restart for k, g in enumerate(gain, 1)]
                if bonus is not None:
                    value = [v + b for v, b in zip(value, bonus, strict=True)]
            values.append(value + [-1.0] * padding)
        solution = solve_knapsack(np.array(weights, np.int64), np.array(values, np.float64),
                                  np.array(counts, np.int64), capacity)
        # Shrink first (frees GPUs), then grow, most valuable growth first.
        choice = solution.choice.tolist()
        targets = {job.view.job_id: choice[g] for g, job in enumerate(jobs)}
        value_per_gpu = {  # of the chosen option
            job.view.job_id: value[target - 1] / (target * job.view.gpus_per_worker) if target > 0 else 0.0
            for job, value, target in zip(jobs, values, choice, strict=True)
        }
        kept: dict[int, list[_Worker]] = {}
        for job in jobs:
            extras = job.workers[job.view.min_workers:]
            # Extras on a cordoned server stay where they are (cordon adds nothing, removes nothing;
            # a drain's evictions came first): outside the knapsack, they fill the target first.
            pinned = [w for w in extras if w.server_id not in released and cycle.servers[w.server_id].cordoned]
            keep = [w for w in extras if w.server_id in released and released[w.server_id].issuperset(w.gpu_indices)]
            if pinned:  # in their rank order, as the others are
                chosen = {id(w) for w in (*pinned, *keep[: max(0, targets[job.view.job_id] - len(pinned))])}
                keep = [w for w in extras if id(w) in chosen]
            else:
                keep = keep[: targets[job.view.job_id]]
            for w in keep:
                if w.server_id in released:
                    released[w.server_id].difference_update(w.gpu_indices)
            kept[job.view.job_id] = keep
        for server_id, free in released.items():  # the net change: extras dropped free their GPUs
            free_cap.set_free(server_id, free)
        # Growth borrows within the queues' rules (``core.quota``), as the dropped extras leave usage.
        quota = _ledger(cycle, {job.view.job_id: job.view.min_workers + len(kept[job.view.job_id]) for job in jobs}
                        ) if cycle.snapshot.queues else QuotaLedger((), (), training_gpus=0, loaned_gpus=0)
        capped: set[int] = set()
        held: list[_Job] = []  # below max_workers at the size it has: why is worked out once all have grown
        for job in sorted(jobs, key=lambda j: -value_per_gpu[j.view.job_id]):
            view = job.view
            target, keep = targets[view.job_id], kept[view.job_id]
            if target == len(keep) == job.extras:
                if job.reason is None and len(job.workers) < view.max_workers:
                    held.append(job)
                continue  # keeps exactly the extras it has
            new: tuple[WorkerPlacement, ...] = ()
            room = quota.headroom(view) if target > len(keep) else None
            if room is not None and (target - len(keep)) * view.gpus_per_worker > room:
                target = len(keep) + room // view.gpus_per_worker
                capped.add(view.job_id)
            if target > len(keep):
                for extra in range(target - len(keep), 0, -1):  # as many as fit, if fragmentation bites
                    new = cycle.capacity.place_gang(view, extra, pools=LOANED_FIRST, exclude=cycle.reserved,
                                                    gpu_types=_gpu_type_of(cycle, job)) or ()
                    if new:
                        break
                quota.charge(view, len(new) * view.gpus_per_worker)
            before = len(job.workers)
            job.workers = job.workers[: view.min_workers] + keep + list(new)
            if len(job.workers) == before and job.reason is None and before < view.max_workers:
                held.append(job)
            if len(job.workers) != before and job.reason is not None:
                job.message += f"; {len(job.workers)} worker(s) after sharing out the spare GPUs"
            elif len(job.workers) != before:
                grew = len(job.workers) > before
                job.reason = Reason.SCALED_OUT if grew else Reason.SCALED_IN
                est = cycle.estimate(view)
                job.message = (
                    f"{before} -> {len(job.workers)} worker(s): estimated completion "
                    f"{est.remaining_time(before):.0f}s -> {est.remaining_time(len(job.workers)):.0f}s"
                )
        spare = _spare(cycle)
        for job in held:  # the knapsack's answer, in the terms of what was left over
            per_worker = job.view.gpus_per_worker
            if job.view.job_id in capped:
                q = quota.queue_of(job.view)
                cycle.holds[job.view.job_id] = (
                    Reason.HELD_BY_QUOTA, f"queue `{q.name}` holds {q.used_gpus} GPUs (quota {q.quota_gpus}"
                    + (f", borrow limit {q.borrow_limit_gpus}" if q.borrow_limit_gpus is not None else "")
                    + f") and its cohort has {quota.cohort_idle(q)} idle")
                continue
            cycle.holds[job.view.job_id] = (
                (Reason.HELD_NO_GAIN,
                 f"another worker would not cut its estimated completion time by more than a restart costs "
                 f"(policy.restart_cost_s = {p.restart_cost_s:.0f}s)")
                if spare >= per_worker and cycle.capacity.largest_block() >= per_worker
                else (Reason.HELD_FRAGMENTED, f"the spare GPUs are spread out: no server has {per_worker} of them free")
                if spare >= per_worker else _no_spare(cycle)
            )

    # -- the plan's job changes ------------------------------------------------------------------

    def _scales(self, cycle: _Cycle) -> list[ScaleJob]:
        started = {s.job_id for s in cycle.starts}
        scales = []
        changed = sorted((job_id, job) for job_id, job in cycle.running.items()
                         if job_id in started or not _unchanged(job))
        for job_id, job in changed:
            before = [(w.rank, w.server_id, w.gpu_indices) for w in sorted(job.view.workers, key=lambda w: w.rank)]
            after = [(rank, w.server_id, w.gpu_indices) for rank, w in enumerate(job.workers)]
            if job_id in started:
                if len(job.workers) != job.view.min_workers:
                    # A job started this cycle and grown at once: start it at its full size, and say so
                    # (the message names the size it starts with, not only its minimum).
                    grown = tuple(WorkerPlacement(r, sid, g) for r, sid, g in after)
                    extras = len(grown) - job.view.min_workers
                    cycle.starts = [
                        StartJob(s.job_id, grown, s.reason,
                                 f"{_placed(grown)}: its minimum of {job.view.min_workers} and {extras} elastic "
                                 f"extra(s) from this cycle's spare GPUs{s.message.removeprefix(_placed(s.workers))}")
                        if s.job_id == job_id else s
                        for s in cycle.starts
                    ]
                continue
            if after != before:
                scales.append(
                    ScaleJob(job_id, tuple(WorkerPlacement(r, sid, g) for r, sid, g in after),
                             job.reason or Reason.SCALED_OUT, job.message)
                )
        return scales


# -- the joint sizing (step 1's admissions and step 2's values) -------------------------------------

# Lexicographic tiers of the joint sizing, far above any completion rate (a rate is 1 / seconds left, at most
# 1e3 for a job a millisecond from done, times a queued job's response ratio): a queue within its quota
# before one that borrows, a higher priority class, a higher priority (``tier``); within a tier the rates
# decide.
_TIER_BONUS = 1e9
# Queued jobs the joint sizing weighs, densest first (value per GPU at the minimum, wait counted), until their
# minimums need this many times the GPUs it shares out: one further down is worth less per GPU at its minimum
# than each of those. Bounds the knapsack of a long queue.
_CANDIDATE_SPAN = 2


def completion_rates(est: JobEstimate, low: int, count: int, current: int, restart_s: float) -> list[float]:
    """The joint sizing's value of a job at ``low .. low + count`` workers: the rate at which it completes
    what is left, ``1 / (remaining time there + restart_s if that is not its current size)``. The sum over
    jobs is the rate at which the cluster completes jobs; maximising it runs short jobs first and gives a
    job another worker only while that speeds it up more than the same GPUs would elsewhere (elastic jobs
    scale sub-linearly, so that makes efficient sizes). ``current``: its size now (0 for a queued job, which
    pays the restart of its start at any size; -1: no size pays one, a job started this cycle)."""
    work, out = est.remaining_work, []
    for n, speed in enumerate(est.model.speeds(low, count + 1), start=low):
        left = work / speed if speed > 0 else math.inf
        if current >= 0 and n != current:
            left += restart_s
        out.append(1.0 / max(left, 1e-3) if math.isfinite(left) else 0.0)
    return out


def response_ratio(job: JobView, est: JobEstimate, now: float, restart_s: float) -> float:
    """``(waited + estimated run) / estimated run`` at ``min_workers`` (highest-response-ratio-next): what a
    queued job's completion rates are multiplied by in the joint sizing. Shortest-first alone would keep a
    long job waiting for as long as shorter ones arrive; the ratio lets it rise as it waits, so no queued job
    waits forever, without the cliff of a fixed threshold that puts every job past it ahead of every other."""
    run = max(est.remaining_time(job.min_workers) + restart_s, 1.0)
    return 1.0 + max(now - job.submitted_at, 0.0) / run


def _rate_bonus(seconds: list[float] | None, rates: list[float]) -> list[float]:
    """A deadline bonus worth ``seconds[k - 1]`` of completion time at option k, as a completion rate: a
    cut of ``d`` seconds from ``T`` to ``T'`` raises the rate by ``d / (T T')``."""
    if seconds is None:
        return [0.0] * (len(rates) - 1)
    return [b * rates[0] * r for b, r in zip(seconds, rates[1:], strict=True)]


def _joint_sizing(cycle: _Cycle) -> None:
    """Step 1's admissions, decided jointly with step 2's extras: one multiple-choice knapsack
    (``solvers.knapsack``) over every queued job (wait, or start at ``min_workers .. max_workers``) and
    every running elastic job outside its protection window (``min_workers`` plus 0 .. its extras), on the
    free GPUs plus those the extras hold, maximising the sum of completion rates (``completion_rates``; a
    queued job's times its ``response_ratio``), within tiers of quota, class and priority. Queued jobs it
    admits take their gangs in step 1 as before, over other jobs' extras where needed (shrink-to-admit); the
    others wait (``cycle.deferred``; ``_start_deferred`` gives them what admitted gangs could not use).
    Running jobs in their protection window, and queued jobs their queue's quota stops, are outside it:
    step 1 handles them as before. A starving job is not put first: its response ratio has grown; if its
    gang finds no room, step 1 reserves servers for it."""
    p, snap = cycle.params, cycle.snapshot
    now, restart = snap.now, p.restart_cost_s
    open_jobs = sorted((j for j in cycle.running.values()
                        if j.view.max_workers > j.view.min_workers and j.view.job_id not in cycle.protected),
                       key=lambda j: j.view.job_id)
    capacity = cycle.capacity.total - cycle.capacity.free_on(cycle.reserved) + sum(
        j.extras * j.view.gpus_per_worker for j in open_jobs)
    pending = snap.pending_jobs()
    cycle.admitted = {}
    if not pending or capacity <= 0:
        return
    quota = _ledger(cycle, {})

    fair = {name for name, q in quota.queues.items() if q.fair_share} if quota.enforced else set()
    share: dict[int, int] = {}  # a queued job's user's GPUs in a fair-share queue, with its earlier jobs' (below)

    def tier(job: JobView) -> tuple[bool, int, int, int]:
        """What step 1's order puts before the rates (``QuotaLedger.order``): a queue within its quota before
        one that borrows (queues enforced), a higher priority class, a higher priority, then, in a fair-share
        queue, the user holding fewer GPUs (a running job: its user's GPUs now)."""
        within = quota.enforced and quota.within_quota(job, job.min_workers * job.gpus_per_worker)
        queue = job.queue or DEFAULT_QUEUE
        held = share.get(job.job_id, quota.user_gpus.get((queue, job.user), 0)) if queue in fair else 0
        return (within, job.priority_class, job.priority, -held)

    def density(job: JobView) -> float:
        """Its value per GPU at its minimum: the candidates are the densest (``_CANDIDATE_SPAN``)."""
        est = cycle.estimate(job)
        rate = completion_rates(est, job.min_workers, 0, 0, restart)[0] * response_ratio(job, est, now, restart)
        return rate / (job.min_workers * job.gpus_per_worker)

    order = sorted(pending, key=lambda j: (-j.priority_class, -j.priority, -density(j), j.submitted_at, j.job_id))
    queued: list[JobView] = []
    span = 0
    for job in order:
        need = job.min_workers * job.gpus_per_worker
        if need > capacity or not quota.check(job, need).allowed or job.gpu_types:
            continue  # step 1 says why it waits (the free capacity, its queue's quota), or places it on its types
        if span >= _CANDIDATE_SPAN * capacity:
            cycle.deferred[job.job_id] = (
                "the joint sizing gave the GPUs to jobs that complete more per GPU (shorter estimated "
                "remaining GPU-time, or longer waits)")
            continue
        span += need
        queued.append(job)
    if not queued:
        return
    mine: dict[tuple[str, str], int] = {}
    for job in queued:  # densest first, as QuotaLedger.order counts a user's earlier jobs
        key = (job.queue or DEFAULT_QUEUE, job.user)
        if key[0] in fair:
            share[job.job_id] = mine.setdefault(key, quota.user_gpus.get(key, 0))
            mine[key] += job.min_workers * job.gpus_per_worker
    tiers = {t: i for i, t in enumerate(sorted({tier(j) for j in queued} | {tier(j.view) for j in open_jobs}))}
    groups: list[tuple[list[int], list[float]]] = []
    for job in queued:
        count = min(job.max_workers - job.min_workers, p.max_extra_options, _MAX_OPTIONS - 1)
        est = cycle.estimate(job)
        aged = response_ratio(job, est, now, restart)
        bonus = _TIER_BONUS * tiers[tier(job)]
        groups.append(([n * job.gpus_per_worker for n in range(job.min_workers, job.min_workers + count + 1)],
                       [bonus + r * aged for r in completion_rates(est, job.min_workers, count, 0, restart)]))
    for other in open_jobs:
        view = other.view
        count = min(view.max_workers - view.min_workers, p.max_extra_options)
        rates = completion_rates(cycle.estimate(view), view.min_workers, count, len(other.workers), restart)
        extra = _rate_bonus(_deadline_bonus(cycle, other, count), rates)
        bonus = _TIER_BONUS * tiers[tier(view)]  # for an option that speeds it up at all
        gains = [r - rates[0] + b for r, b in zip(rates[1:], extra, strict=True)]
        groups.append(([k * view.gpus_per_worker for k in range(1, count + 1)],
                       [g + bonus if g > 0 else g for g in gains]))
    width = max(len(w) for w, _ in groups)
    weights = np.array([w + [0] * (width - len(w)) for w, _ in groups], np.int64)
    values = np.array([v + [-1.0] * (width - len(v)) for _, v in groups], np.float64)
    counts = np.array([len(w) for w, _ in groups], np.int64)
    choice = solve_knapsack(weights, values, counts, capacity).choice.tolist()
    for job, option in zip(queued, choice, strict=False):
        if option > 0:
            cycle.admitted[job.job_id] = job.min_workers + option - 1
        else:
            cycle.deferred[job.job_id] = (
                f"the joint sizing found that the {capacity} GPUs it shares out (free, and running jobs' "
                f"elastic extras) cut the estimated average completion time more on other jobs")


def _drain_waits(cycle: _Cycle, server: ServerView) -> bool:
    """Does an operator's drain of this loaned server wait (``core.protection``)? While a job on it is in
    its protection window and the drain's deadline (if any) has not passed."""
    deadline = server.drain_deadline
    if deadline is not None and cycle.snapshot.now >= deadline:
        return False
    return any(job_id in cycle.protected and any(w.server_id == server.server_id for w in job.workers)
               for job_id, job in cycle.running.items())


# A waiting job's reason names at most this many of the protected jobs holding it up, the first out of
# protection first, and counts the rest: a burst of high-class jobs on a cluster of newly started low-class
# ones would otherwise name 100s in each queued job's reason (cut at 2,048 characters where it is stored).
NAMED_PROTECTIONS = 3


_Kind = tuple[str, int, int, int, tuple[str, ...]]


def _kind(job: JobView) -> _Kind:
    """What the base-demand steps read of a queued job that waits without victims (``_base_demands``),
    besides its id and whether it starves: its queue and class (quota and preemption), its gang's shape
    and GPU types (placement and the explanation)."""
    return job.queue, job.priority_class, job.gpus_per_worker, job.min_workers, job.gpu_types


class _Waited(NamedTuple):
    """A queued job that waited with no victims and not starving, and the plan's progress then: a next
    job of its kind waits for the same reason while the plan has started, preempted and reserved nothing
    more (``_base_demands``)."""

    kind: _Kind
    starts: int
    preemptions: int
    reserved: frozenset[str]
    reason: Reason
    message: str


def _protected_pending(cycle: _Cycle, job: JobView, reason: Reason, message: str) -> KeepPending:
    """Why ``job`` waits; WAITING_FOR_PROTECTED_JOBS, naming the protections (``NAMED_PROTECTIONS`` of
    them), when running jobs whose GPUs it could have taken (extras, or by quota or priority) are in
    their protection window."""
    groups = cycle.blocked_by.get(job.job_id)
    if not groups:  # (a group is never empty)
        return KeepPending(job.job_id, reason, message)
    if len(groups) == 1:  # a queue of jobs held up by one preemption scan: its text is made once
        text = cycle.shield_texts.get(id(groups[0]))
        if text is None:
            text = cycle.shield_texts[id(groups[0])] = _shields_text(groups[0])
    else:
        text = _shields_text([shield for group in groups for shield in group])
    return KeepPending(job.job_id, Reason.WAITING_FOR_PROTECTED_JOBS, f"{message}; {text}")


def _shields_text(shields: Sequence[tuple[Protection, Mechanism]]) -> str:
    """The protections named in a pending reason: each job once (its first mechanism), the first out of
    protection first, ``NAMED_PROTECTIONS`` of them and a count of the rest."""
    first: dict[int, tuple[Protection, Mechanism]] = {}
    for shield, mechanism in shields:
        first.setdefault(shield.job_id, (shield, mechanism))
    named = heapq.nsmallest(NAMED_PROTECTIONS, first.values(), key=lambda s: (s[0].until, s[0].job_id))
    parts = [blocked(shield, mechanism) for shield, mechanism in named]
    if len(first) > len(named):
        parts.append(f"{len(first) - len(named)} more protected job(s) likewise")
    return "; ".join(parts)


def _not_preempted(cycle: _Cycle, job: JobView, shielded: tuple[tuple[Protection, Mechanism], ...]) -> None:
    """No gang by preemption: the protected jobs ``job`` may have preempted go to its reason (one group,
    shared by the jobs of one scan)."""
    if shielded:
        cycle.blocked_by.setdefault(job.job_id, []).append(shielded)


def _server_gpus(snapshot: ClusterSnapshot) -> int:
    """GPUs of the largest server: how a goodput model packs a job's workers (``core.goodput_fit.nodes_for``)."""
    return max((len(s.gpu_indices) for s in snapshot.servers), default=GPUS_PER_SERVER)


def _batches(cycle: _Cycle) -> tuple[BatchSize, ...]:
    """The batch of every job with batch limits that holds workers once the plan is applied, at the size
    and on the servers it then has (``core.goodput_fit.batch_for``), in job order; every cycle, as the
    choice follows the job's fit (the applier passes on only a change)."""
    out = []
    for _, job in sorted(cycle.running.items()):
        if job.view.batch_limits is not None and job.workers:
            batch = batch_for(job.view, len({w.server_id for w in job.workers}), len(job.workers))
            if batch is not None:
                out.append(batch)
    return tuple(out)


def _ledger(cycle: _Cycle, workers: dict[int, int]) -> QuotaLedger:
    """The queues' usage with each running job at ``workers[job id]`` workers (default: as planned now)."""
    held = ((j.view, workers.get(j.view.job_id, len(j.workers)) * j.view.gpus_per_worker)
            for j in cycle.running.values())
    return QuotaLedger.of(cycle.snapshot, held)


def _gpu_type_of(cycle: _Cycle, job: _Job) -> tuple[str, ...] | None:
    """The GPU type a running job's workers are on: its extras must be on it too (None: not placed yet)."""
    return (cycle.servers[job.workers[0].server_id].gpu_type,) if job.workers else None


def _exclusion(cycle: _Cycle, job: JobView) -> frozenset[str]:
    """The servers a queued job may not start on: those reserved for a starving job, unless it is estimated
    to finish before their jobs end anyway (backfilling that does not delay the reservation, as EASY
    backfilling does)."""
    if not cycle.reserved or job.job_id == cycle.reserved_for:
        return cycle.reserved
    left = cycle.estimate(job).remaining_time(job.min_workers) + cycle.params.restart_cost_s
    return frozenset() if cycle.snapshot.now + left <= cycle.reserved_until else cycle.reserved


def _spare(cycle: _Cycle) -> int:
    """Free GPUs now that are not held for a starving job."""
    return cycle.capacity.total - cycle.capacity.free_on(cycle.reserved)


def _no_spare(cycle: _Cycle) -> tuple[Reason, str]:
    """Why a job gets no GPU more when none is spare: held for a starving job, or none left over."""
    if cycle.reserved and cycle.capacity.free_on(cycle.reserved):
        return (Reason.HELD_FOR_RESERVATION,
                f"the spare GPUs are held for starving job {cycle.reserved_for} on server(s) "
                f"{', '.join(sorted(cycle.reserved))}")
    return (Reason.HELD_NO_SPARE_GPUS,
            "no spare GPUs: each runs a job's minimum, or an extra worker that cuts its job's completion time more")


def _size_notes(cycle: _Cycle, scales: Sequence[ScaleJob]) -> tuple[KeepSize, ...]:
    """One note per running job below max_workers that keeps its size this cycle (``cycle.holds``), and
    a clearing one for each job whose standing note no longer holds (it changed size, reached its
    maximum, or nothing holds it back); ``cycle.only_changed_reasons`` keeps only the changes."""
    changed = {s.job_id for s in scales} | {s.job_id for s in cycle.starts}
    notes = []
    for job_id, job in sorted(cycle.running.items()):
        hold = cycle.holds.get(job_id) if job_id not in changed else None
        if hold is not None:
            view = job.view
            notes.append(KeepSize(job_id, hold[0], f"held at {len(job.workers)} of {view.min_workers}-"
                                                   f"{view.max_workers} worker(s): {hold[1]}"))
        elif job.view.size_note:
            notes.append(KeepSize(job_id, None))
    return tuple(notes)


def _no_loan(cycle: _Cycle) -> str:
    """How a loan note begins: whether some server is lent already."""
    lent = any(state in (ServerState.DRAINING, ServerState.LOANED) for state in cycle.server_state.values())
    return "no further server loaned" if lent else "no server loaned"


def _placed(workers: Sequence[WorkerPlacement]) -> str:
    """The start message's opening: how many workers, on which servers."""
    return f"placed {len(workers)} worker(s) on {', '.join(sorted({w.server_id for w in workers}))}"


def _unchanged(job: _Job) -> bool:
    """Does the job still hold exactly the snapshot's workers, ranks 0..n-1? (Then it needs no scale.)"""
    workers, shown = job.workers, job.view.workers
    if len(workers) != len(shown):
        return False
    for rank, (a, b) in enumerate(zip(workers, shown, strict=True)):
        if a is not b or a.rank != rank:
            return False
    return True


def _register(name: str, *, loaning: bool, elastic: bool, naive_reclaim: bool = False, goodput: bool = False,
              joint: bool = True) -> None:
    policies.register(name)(
        lambda params: ArylPolicy(name, params, loaning=loaning, elastic=elastic, naive_reclaim=naive_reclaim,
                                  goodput=goodput, joint=joint)
    )


# The elastic variants use a job's goodput model where it has one (jobs without one: as before).
_register("aryl", loaning=True, elastic=True, goodput=True)
_register("aryl-noloan", loaning=False, elastic=True, goodput=True)
_register("aryl-noelastic", loaning=True, elastic=False)
_register("sjf", loaning=False, elastic=False)  # separate clusters: the paper's baseline
# The reclaim ablation: the full policy, but reclaim takes the most recently loaned servers back.
_register("aryl-naivereclaim", loaning=True, elastic=True, naive_reclaim=True, goodput=True)
# The goodput ablation: the full policy, elastic on declared throughput only (no fit, no batch choice).
_register("aryl-nogoodput", loaning=True, elastic=True)
# The sizing ablation: the full policy with the earlier two steps -- queued gangs first, shortest first (taking
# other jobs' extras), then the spare GPUs to running jobs by the JCT reduction they buy -- instead of one
# joint decision over every running and queued job.
_register("aryl-nojoint", loaning=True, elastic=True, goodput=True, joint=False)
