"""The sizing of an Aryl cycle: the joint sizing (``joint_sizing``: before step 1, one knapsack over every
queued job and every running elastic job, valued by completion rates, ``completion_rates`` and
``response_ratio``) and step 2 (``elastic_extras``: the GPUs left over to the running jobs' extra workers,
by a knapsack of JCT reductions or completion rates, a deadline saved counted in). The sizes it leaves
become the plan's scales, size notes and batches in ``job_changes``.

Must never start, preempt or reclaim (steps 0 and 1: ``loans``, ``base``); the joint sizing only says
which queued jobs step 1 admits. Pure: no I/O, no wall clock; deterministic for a given snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from scheduler_service.core.placement import LOANED_FIRST
from scheduler_service.core.plan import PreemptJob, Reason, WorkerPlacement, clock_time
from scheduler_service.core.predict import predicted_remaining, remaining_seconds
from scheduler_service.core.protection import ProtectionRule
from scheduler_service.core.quota import DEFAULT_QUEUE, QuotaLedger
from scheduler_service.core.snapshot import JobView
from scheduler_service.core.throughput import JobEstimate
from scheduler_service.lifecycle import ServerState
from scheduler_service.policies.aryl.cycle import _Cycle, _Job, _ledger, _since_checkpoint, _Worker, at_speed
from scheduler_service.solvers.knapsack import MAX_OPTIONS as _MAX_OPTIONS
from scheduler_service.solvers.knapsack import solve_knapsack

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


def completion_rates(est: JobEstimate, low: int, count: int, current: int, restart_s: float,
                     risk: Callable[[float], tuple[float, float]] | None = None) -> list[float]:
    """The joint sizing's value of a job at ``low .. low + count`` workers: the rate at which it completes
    what is left, ``1 / (remaining time there + restart_s if that is not its current size)``. The sum over
    jobs is the rate at which the cluster completes jobs; maximising it runs short jobs first and gives a
    job another worker only while that speeds it up more than the same GPUs would elsewhere (elastic jobs
    scale sub-linearly, so that makes efficient sizes). ``current``: its size now (0 for a queued job, which
    pays the restart of its start at any size; -1: no size pays one, a job started this cycle).

    ``risk`` (the risk-valued loans; None: every worker keeps its server): for a time ``t``, ``(F(t), I(t))``,
    the chance that the workers beyond ``low`` have lost their server to inference by ``t`` and its integral
    from now (``_extra_risk``). A size above ``low`` is then valued by its expected remaining time: ``L`` (its
    time there) if the server stays; if it goes back at ``T < L``, ``T``, a restart, and what is left at
    ``low``, ``A (1 - T / L)``. Over ``T``'s distribution that is ``L + restart F(L) + (A / L - 1) I(L)``."""
    # The hottest loop of a decision (10,000s of calls at 5,000 jobs): no builtin call per option.
    work, out, inf = est.remaining_work, [], math.inf
    speeds = est.model.speeds(low, count + 1)
    at_low = work / speeds[0] if speeds[0] > 0 else inf
    for n, speed in enumerate(speeds, start=low):
        left = work / speed if speed > 0 else inf
        if risk is not None and n > low and at_low < inf and left > 0:
            lost, area = risk(left)
            left += restart_s * lost + (at_low / left - 1.0) * area
        if current >= 0 and n != current:
            left += restart_s
        out.append(1.0 / (left if left > 1e-3 else 1e-3) if left < inf else 0.0)
    return out


def _extra_risk(cycle: _Cycle, loaned_gpus: int, capacity: int) -> Callable[[float], tuple[float, float]] | None:
    """The risk of one knapsack's extra workers (``completion_rates``): the chance a loaned server goes back
    within a time (``cycle.loan_risk``) times the share of the GPUs the knapsack shares out that are on loaned
    servers (``loaned_gpus`` of ``capacity``) -- where a given extra worker lands is placement's to say
    (extras prefer loaned servers, base workers training ones), so the knapsack values every extra at that
    share. None when nothing loaned is shared out or the policy does not value the risk."""
    risk = cycle.loan_risk
    if risk is None or loaned_gpus <= 0 or capacity <= 0:
        return None
    share = min(1.0, loaned_gpus / capacity)
    return lambda seconds: risk.lost_within(seconds, share)


def response_ratio(job: JobView, est: JobEstimate, now: float, restart_s: float) -> float:
    """``(waited + estimated run) / estimated run`` at ``min_workers`` (highest-response-ratio-next): what a
    queued job's completion rates are multiplied by in the joint sizing. Shortest-first alone would keep a
    long job waiting for as long as shorter ones arrive; the ratio lets it rise as it waits, so no queued job
    waits forever, without the cliff of a fixed threshold that puts every job past it ahead of every other."""
    run = max(est.remaining_time(job.min_workers) + restart_s, 1.0)
    return 1.0 + max(now - job.submitted_at, 0.0) / run


def extra_gains(cycle: _Cycle, job: _Job, count: int, current: int,
                risk: Callable[[float], tuple[float, float]] | None = None) -> list[float]:
    """What 1 .. ``count`` extra workers add to a running job's completion rate (``completion_rates`` from
    ``current`` workers, at the knapsack's ``risk``), plus a deadline they save (``_deadline_bonus``, as a
    rate): its knapsack values, in the joint sizing and in step 3 alike."""
    view = job.view
    rates = completion_rates(cycle.estimate(view), job.base, count, current, cycle.params.restart_cost_s, risk)
    saved = _rate_bonus(_deadline_bonus(cycle, job, count), rates)
    return [r - rates[0] + b for r, b in zip(rates[1:], saved, strict=True)]


def _rate_bonus(seconds: list[float] | None, rates: list[float]) -> list[float]:
    """A deadline bonus worth ``seconds[k - 1]`` of completion time at option k, as a completion rate: a
    cut of ``d`` seconds from ``T`` to ``T'`` raises the rate by ``d / (T T')``."""
    if seconds is None:
        return [0.0] * (len(rates) - 1)
    return [b * rates[0] * r for b, r in zip(seconds, rates[1:], strict=True)]


def joint_sizing(cycle: _Cycle, *, shrink: bool = True, suspend: bool = True) -> None:
    """Step 1's admissions, decided jointly with step 2's extras: one multiple-choice knapsack
    (``solvers.knapsack``) over every queued job (wait, or start at ``min_workers .. max_workers``) and
    every running elastic job outside its protection window (``min_workers`` plus 0 .. its extras), on the
    free GPUs plus those the extras hold, maximising the sum of completion rates (``completion_rates``; a
    queued job's times its ``response_ratio``), within tiers of quota, class and priority. Queued jobs it
    admits take their gangs in step 1 as before, over other jobs' extras where needed (shrink-to-admit); the
    others wait (``cycle.deferred``; ``base._start_deferred`` gives them what admitted gangs could not use).
    Running jobs in their protection window, and queued jobs their queue's quota stops, are outside it:
    step 1 handles them as before. A starving job is not put first: its response ratio has grown; if its
    gang finds no room, step 1 reserves servers for it. ``shrink`` False (the ``aryl-noshrink`` ablation):
    no running job is in it, so it shares out the free GPUs alone.

    Preempt-to-admit (``suspend``; off in ``aryl-nopreempt`` and with ``shrink`` off): running jobs outside
    their protection window are in it at every size from 0 (preempted and requeued) up, their whole GPUs
    shared out, when every queued job it weighs is of one tier and none is of a lower one
    (``_suspension_candidates``: so a job is never preempted for one its tiers rank below it). Keeping one
    is worth its completion rate times its response ratio plus what a preemption would cost it
    (``_kept_options``, ``_suspension_cost``: the work since its checkpoint and a restart); a job whose GPUs
    are worth more to queued jobs is taken out of the cycle
    (``cycle.suspended``) and preempted once step 1 has started a job on them (``settle_suspensions``)."""
    p, snap = cycle.params, cycle.snapshot
    now, restart = snap.now, p.restart_cost_s
    open_jobs = sorted((j for j in cycle.running.values()
                        if shrink and j.view.max_workers > j.view.min_workers and j.view.job_id not in cycle.protected),
                       key=lambda j: j.view.job_id)
    # Nothing new goes on a cordoned server (``core.placement``): its free GPUs, and extras there, are not shared out.
    cordoned = {sid for sid, server in cycle.servers.items() if server.cordoned}
    capacity = cycle.capacity.total - cycle.capacity.free_on(cycle.reserved | cordoned) + sum(
        j.view.gpus_per_worker for j in open_jobs for w in j.workers[j.view.min_workers:]
        if w.server_id not in cordoned)
    loaned = _loaned_servers(cycle) - cycle.reserved - cordoned
    risk = _extra_risk(cycle, cycle.capacity.free_on(loaned) + sum(
        j.view.gpus_per_worker for j in open_jobs for w in j.workers[j.view.min_workers:] if w.server_id in loaned),
        capacity)
    pending = snap.pending_jobs()
    cycle.admitted = set()
    # Preempt-to-admit: the running jobs it may take out, least completion per GPU first (``_preemptible``), and
    # the GPUs they hold, which queued jobs may reach.
    preemptible = _preemptible(cycle, cordoned) if suspend and shrink and pending else []
    reach = capacity + sum(j.view.min_workers * j.view.gpus_per_worker for j in preemptible)
    if not pending or reach <= 0:
        return
    quota = _ledger(cycle, {})
    typed = len(cycle.capacity.gpu_types) > 1
    rooms: list[dict[str, int]] = []  # the GPUs per type it shares out (``_room_for_starts``), counted on first use

    def room() -> dict[str, int]:
        if not rooms:
            rooms.append(_room_for_starts(cycle, open_jobs, cycle.reserved | cordoned))
        return rooms[0]

    def landing(job: JobView) -> JobEstimate:
        """A queued job's estimate at the speed of the GPU type it would start on (``_landing_type``); at its
        reference type's where its speed is the same on every type."""
        est = cycle.estimate(job)
        if cycle.speed_factors(job) is None:
            return est
        landing_type = _landing_type(cycle, job, room())
        return est if landing_type is None else at_speed(est, cycle.factor_on(job, landing_type))

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
        est = landing(job)
        rate = completion_rates(est, job.min_workers, 0, 0, restart)[0] * response_ratio(job, est, now, restart)
        return rate / (job.min_workers * job.gpus_per_worker)

    order = sorted(pending, key=lambda j: (-j.priority_class, -j.priority, -density(j), j.submitted_at, j.job_id))
    queued: list[JobView] = []
    span = 0
    for job in order:
        need = job.min_workers * job.gpus_per_worker
        if need > reach or not quota.check(job, need).allowed or job.gpu_types:
            continue  # step 1 says why it waits (the free capacity, its queue's quota), or places it on its types
        if span >= _CANDIDATE_SPAN * reach:
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
    candidates = _suspension_candidates(preemptible, queued, open_jobs, tier)
    capacity += sum(j.view.min_workers * j.view.gpus_per_worker for j in candidates)
    chosen = {j.view.job_id for j in candidates}
    fixed = [j for j in candidates if j.view.max_workers <= j.view.min_workers]  # running at their only size
    tiers = {t: i for i, t in enumerate(sorted({tier(j) for j in queued} | {tier(j.view) for j in open_jobs}
                                               | {tier(j.view) for j in fixed}))}
    groups: list[tuple[list[int], list[float]]] = []
    for job in queued:
        count = min(job.max_workers - job.min_workers, p.max_extra_options, _MAX_OPTIONS - 1)
        est = landing(job)
        aged = response_ratio(job, est, now, restart)
        bonus = _TIER_BONUS * tiers[tier(job)]
        groups.append(([n * job.gpus_per_worker for n in range(job.min_workers, job.min_workers + count + 1)],
                       [bonus + r * aged for r in completion_rates(est, job.min_workers, count, 0, restart, risk)]))
    for other in open_jobs:
        view = other.view
        count = min(view.max_workers - view.min_workers, p.max_extra_options)
        if typed:  # it grows on its own type only (``core.placement``): no more extras than that type has room for
            count = min(count, room().get(cycle.servers[other.workers[0].server_id].gpu_type, 0)
                        // view.gpus_per_worker)
        bonus = _TIER_BONUS * tiers[tier(view)]  # for an option that speeds it up at all
        if view.job_id in chosen:  # 0 (preempted), or min_workers plus 0 .. its extras
            groups.append(_kept_options(cycle, other, min(count, _MAX_OPTIONS - 1), bonus, risk))
            continue
        gains = extra_gains(cycle, other, count, len(other.workers), risk)
        groups.append(([k * view.gpus_per_worker for k in range(1, count + 1)],
                       [g + bonus if g > 0 else g for g in gains]))
    for other in fixed:
        groups.append(_kept_options(cycle, other, 0, _TIER_BONUS * tiers[tier(other.view)], risk))
    width = max(len(w) for w, _ in groups)
    weights = np.array([w + [0] * (width - len(w)) for w, _ in groups], np.int64)
    values = np.array([v + [-1.0] * (width - len(v)) for _, v in groups], np.float64)
    counts = np.array([len(w) for w, _ in groups], np.int64)
    choice = solve_knapsack(weights, values, counts, capacity).choice.tolist()
    for other, option in zip([*open_jobs, *fixed], choice[len(queued):], strict=True):
        if option == 0 and other.view.job_id in chosen:  # its GPUs go to queued jobs: out until step 1 has placed them
            del cycle.running[other.view.job_id]
            cycle.capacity.release_many((w.server_id, w.gpu_indices) for w in other.workers)
            cycle.suspended.append(other)
    for job, option in zip(queued, choice, strict=False):
        if option > 0:
            cycle.admitted.add(job.job_id)
        else:
            cycle.deferred[job.job_id] = (
                f"the joint sizing found that the {capacity} GPUs it shares out (free, and running jobs' "
                f"elastic extras) cut the estimated average completion time more on other jobs")


def _room_for_starts(cycle: _Cycle, open_jobs: list[_Job], blocked: frozenset[str] | set[str]) -> dict[str, int]:
    """The GPUs of each type the joint sizing shares out: free ones and those the open jobs' extras hold, none on
    a reserved or cordoned server."""
    room: dict[str, int] = {}
    for sid in cycle.capacity.servers:
        if sid not in blocked:
            gpu_type = cycle.servers[sid].gpu_type
            room[gpu_type] = room.get(gpu_type, 0) + len(cycle.capacity.free(sid))
    for job in open_jobs:
        for w in job.workers[job.view.min_workers:]:
            if w.server_id not in blocked:
                gpu_type = cycle.servers[w.server_id].gpu_type
                room[gpu_type] = room.get(gpu_type, 0) + job.view.gpus_per_worker
    return room


def _landing_type(cycle: _Cycle, job: JobView, room: dict[str, int]) -> str | None:
    """The GPU type a queued job's gang would start on, as placement tries the types for it
    (``_Cycle.type_preference``: fastest at the room each has first): the first with room for its ``min_workers``;
    else None (it starts only on GPUs that free up, or that a preemption frees, of a type not known now: valued at
    its reference type's speed)."""
    need = job.min_workers * job.gpus_per_worker
    for gpu_type in cycle.type_preference(job) or cycle.capacity.type_order(job.gpu_types):
        if room.get(gpu_type, 0) >= need:
            return gpu_type
    return None


def _preemptible(cycle: _Cycle, cordoned: set[str]) -> list[_Job]:
    """The running jobs preempt-to-admit may take (``joint_sizing``): outside their protection window, untouched
    so far this cycle (a reclaim, a move), on no reserved or cordoned server, without a deadline, whose time left
    something measured or declared says (``core.predict.remaining_seconds``: no job is preempted on
    ``default_runtime_s``, a guess), and
    checkpointed at most ``restart_cost_s`` ago; least completion per GPU first (their rate at
    ``min_workers``).

    Why only just after a checkpoint: a preemption throws away the work since then, GPU-time the whole
    cluster pays for again, which the completion rates (each job's own) do not see; so a job is preempted
    to admit others only when that loses at most what a restart costs (a job that never checkpoints never
    is). On the headline's busy trace (seed 0), allowing it at any point preempted 10,006 times and lost
    11,342 GPU-hours (127 and 1,656 without preempt-to-admit), for no lower average JCT."""
    blocked = cycle.reserved | cordoned
    now, restart = cycle.snapshot.now, cycle.params.restart_cost_s
    out = []
    for job in cycle.running.values():
        view = job.view
        if (view.job_id in cycle.protected or job.reason is not None or view.deadline is not None
                or len(job.workers) < view.min_workers or _since_checkpoint(view, now) > restart
                or any(w.server_id in blocked for w in job.workers)
                or remaining_seconds(view, view.min_workers, now, alpha=cycle.params.amdahl_alpha) is None):
            continue
        rate = completion_rates(cycle.estimate(view), view.min_workers, 0, view.min_workers, restart)[0]
        out.append((rate / (view.min_workers * view.gpus_per_worker), view.job_id, job))
    out.sort(key=lambda c: (c[0], c[1]))
    return [job for _, _, job in out]


def _suspension_candidates(preemptible: list[_Job], queued: list[JobView], open_jobs: list[_Job],
                           tier: Callable[[JobView], tuple[bool, int, int, int]]) -> list[_Job]:
    """Of the ``preemptible`` jobs, those the joint sizing weighs at size 0: none unless every queued job is of
    one tier and no job it weighs is of a lower one (a queued job then never takes the GPUs of a job its tiers
    -- quota, class, priority, fair share -- rank above it); then those of that tier, in order, as many as
    hold the GPUs the queued jobs' minimums need."""
    levels = {tier(j) for j in queued}
    if len(levels) != 1 or not preemptible:
        return []
    level = next(iter(levels))
    if any(tier(j.view) < level for j in open_jobs):
        return []
    need = sum(j.min_workers * j.gpus_per_worker for j in queued)
    chosen: list[_Job] = []
    for job in preemptible:
        if need <= 0:
            break
        if tier(job.view) == level:
            chosen.append(job)
            need -= job.view.min_workers * job.view.gpus_per_worker
    return chosen


def _kept_options(cycle: _Cycle, job: _Job, count: int, bonus: float,
                  risk: Callable[[float], tuple[float, float]] | None) -> tuple[list[int], list[float]]:
    """A preempt-to-admit candidate's knapsack group (``joint_sizing``): option 0, preempted (worth 0); then
    ``min_workers``, worth its completion rate there times its response ratio plus what a preemption would cost
    it (``_suspension_cost``), plus the tier's bonus; then 1 .. ``count`` extras on top, each adding the rate
    it buys (a deadline it saves counted in), as ``extra_gains`` values any running job's."""
    view, restart = job.view, cycle.params.restart_cost_s
    est = cycle.estimate(view)
    rate = completion_rates(est, view.min_workers, 0, len(job.workers), restart, risk)[0]
    # Its age counts as a queued job's does (``response_ratio``, since its submission): a job it is preempted for
    # must complete more even against that, or the two would take turns -- the one preempted, queued again and
    # older, preempting the other back (a demo's two equal jobs did, every protection window).
    kept = bonus + rate * response_ratio(view, est, cycle.snapshot.now, restart) + _suspension_cost(cycle, job, rate)
    # Its extras are valued as any running job's (``extra_gains``: the rate they add, not aged).
    return ([n * view.gpus_per_worker for n in range(view.min_workers, view.min_workers + count + 1)],
            [kept] + [kept + g for g in extra_gains(cycle, job, count, len(job.workers), risk)])


def _suspension_cost(cycle: _Cycle, job: _Job, rate: float) -> float:
    """What preempting a running job costs it, as a completion rate: it loses the work since its checkpoint
    and pays a restart when it runs again, ``d`` seconds more to its completion, and a cut of ``d`` from
    ``T + d`` to ``T`` (``T = 1 / rate``) raises a rate by ``d / (T (T + d))``."""
    d = _since_checkpoint(job.view, cycle.snapshot.now) + cycle.params.restart_cost_s
    return d * rate * rate / (1.0 + d * rate)


def settle_suspensions(cycle: _Cycle) -> None:
    """After step 1: each job the joint sizing took out (``cycle.suspended``) is preempted and requeued when a
    start took any of its GPUs, with the jobs that did named; one whose GPUs no gang used (they did not fit
    there) is put back as it was, so no job is preempted for nothing."""
    if not cycle.suspended:
        return
    started = {(w.server_id, g): s.job_id for s in cycle.starts for w in s.workers for g in w.gpu_indices}
    for job in cycle.suspended:
        view = job.view
        takers = sorted({started[key] for w in job.workers for g in w.gpu_indices
                         if (key := (w.server_id, g)) in started})
        if not takers:
            for w in job.workers:
                cycle.capacity.take(w.server_id, w.gpu_indices)
            cycle.running[view.job_id] = job
            if cycle.quota is not None:
                cycle.quota.charge(view, len(job.workers) * view.gpus_per_worker)
            continue
        names = ", ".join(map(str, takers[:3])) + (f" and {len(takers) - 3} more" if len(takers) > 3 else "")
        left = cycle.estimate(view).remaining_time(view.min_workers)
        cycle.preemptions.append(PreemptJob(
            view.job_id, Reason.PREEMPTED_BY_POLICY,
            f"preempted to admit job{'s' if len(takers) > 1 else ''} {names}: the joint sizing found they "
            f"complete sooner on its GPUs than it does (an estimated {left:.0f}s left at {view.min_workers} "
            f"worker(s)); requeued, it resumes from its checkpoint"))
    cycle.suspended = []


def _loaned_servers(cycle: _Cycle) -> set[str]:
    """The servers on loan to training as the cycle stands (after step 0's loans and reclaims)."""
    return {sid for sid, state in cycle.server_state.items() if state == ServerState.LOANED}


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

    low = job.base
    if finish(low) <= view.deadline:
        return None
    worth = p.deadline_weight * predicted_remaining(view, low, now, est, p.amdahl_alpha)
    bonus = [worth if finish(low + k) <= view.deadline else 0.0 for k in range(1, count + 1)]
    return bonus if any(bonus) else None


# -- what a type's GPUs are worth to the jobs on it (a move's cost, ``base.move_to_faster_types``) ------------

def type_worth(cycle: _Cycle, gpu_type: str, mover: int) -> Callable[[int], float]:
    """What GPUs of ``gpu_type``'s room are worth to the jobs running there, in step 3's currency: for a room of
    ``gpus`` (the type's free GPUs and its jobs' extras), the most completion rate their extras can add
    (``extra_gains``, one knapsack as step 3 shares out the type). The jobs: every elastic job on the type but
    ``mover``, outside its protection window, its extras counted from ``_Job.base`` at a restart for a change. What a
    move onto the type takes from them, or a move off it gives them, is the difference at two rooms. The type's
    options are worked out once for every mover (``_Cycle.type_tables``)."""
    table = cycle.type_tables.get(gpu_type)
    if table is None:
        jobs = sorted((j for j in cycle.running.values()
                       if j.workers and j.view.max_workers > j.base and j.view.job_id not in cycle.protected
                       and cycle.servers[j.workers[0].server_id].gpu_type == gpu_type), key=lambda j: j.view.job_id)
        counts = [min(j.view.max_workers - j.base, cycle.params.max_extra_options) for j in jobs]
        k_max = max(counts, default=0)
        table = cycle.type_tables[gpu_type] = (
            np.array([j.view.job_id for j in jobs], np.int64),
            np.array([[k * j.view.gpus_per_worker for k in range(1, count + 1)] + [0] * (k_max - count)
                      for j, count in zip(jobs, counts, strict=True)], np.int64).reshape(len(jobs), k_max),
            np.array([_type_row(cycle, j, count) + [-1.0] * (k_max - count)
                      for j, count in zip(jobs, counts, strict=True)], np.float64).reshape(len(jobs), k_max),
            np.array(counts, np.int64))
    ids, weights, values, limits = table
    others = ids != mover
    if not others.all():
        weights, values, limits = weights[others], values[others], limits[others]
    if not len(limits):
        return lambda gpus: 0.0
    known: dict[int, float] = {}

    def worth(gpus: int) -> float:
        if gpus not in known:
            known[gpus] = solve_knapsack(weights, values, limits, gpus).total_value if gpus > 0 else 0.0
        return known[gpus]
    return worth


def _type_row(cycle: _Cycle, job: _Job, count: int) -> list[float]:
    row = cycle.type_rows.get(job.view.job_id)
    if row is None:
        row = cycle.type_rows[job.view.job_id] = extra_gains(cycle, job, count, len(job.workers))
    return row


# -- step 2: elastic extras ------------------------------------------------------------------------

def elastic_extras(cycle: _Cycle, *, joint: bool) -> None:
    """Step 2: the GPUs left over to the running elastic jobs' extras, by a knapsack (the module doc).
    ``joint``: its values are the joint sizing's completion rates (``completion_rates``), else the JCT
    reductions. A job's extras are its workers beyond ``_Job.base``: ``min_workers``, or the size its move to
    another GPU type was valued at (``base.move_to_faster_types``), which it keeps; a job moved this cycle pays
    the move's restart at any size (none more for growing)."""
    p = cycle.params

    def locked(job: _Job) -> bool:
        """Anti-thrashing: in its protection window (``core.protection``), and nothing forced a change
        this cycle."""
        return job.reason is None and job.view.job_id in cycle.protected

    jobs = sorted(
        (j for j in cycle.running.values() if j.view.max_workers > j.base and not locked(j)),
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
        for w in job.workers[job.base:]:
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
    risk = _extra_risk(cycle, sum(len(released[sid]) if sid in released else len(free_cap.free(sid))
                                  for sid in _loaned_servers(cycle) - cycle.reserved), capacity)
    # A job grows on its own GPU type only (``core.placement``): on a cluster of several types, each type's GPUs
    # are shared out among the jobs running on it, a knapsack per type (``_room_by_type``); else one knapsack.
    rooms = _room_by_type(cycle, released, jobs) if len(free_cap.gpu_types) > 1 else None
    counts = [min(j.view.max_workers - j.base, p.max_extra_options) for j in jobs]
    k_max = max(counts)
    # Option k of job g: k more workers, valued by what it adds to the job's completion rate (joint) or
    # the JCT reduction it buys.
    weights, values = [], []
    restart = p.restart_cost_s
    started = {start.job_id for start in cycle.starts}
    rows: dict[tuple[int, int], list[int]] = {}  # weights by (gpus per worker, count): few distinct
    for job, count in zip(jobs, counts, strict=True):
        current, per_worker = job.extras, job.view.gpus_per_worker
        padding = k_max - count  # slots beyond the job's count are ignored by the solver
        row = rows.get((per_worker, count))
        if row is None:
            row = rows[(per_worker, count)] = [k * per_worker for k in range(1, count + 1)] + [0] * padding
        weights.append(row)
        if joint:  # the joint sizing's completion rates (a job started this cycle: no resize)
            value = extra_gains(cycle, job, count, -1 if job.view.job_id in started or job.moved else len(job.workers),
                                risk if rooms is None else rooms[1][_gpu_type_of(cycle, job)])
        else:
            gain = cycle.estimate(job.view).jct_reductions(job.base, count)
            # Changing size costs a restart; shifting the whole group by that cost keeps option 0 at 0.
            shift = restart if current > 0 else 0.0
            value = [g + shift if k == current else g + shift - restart for k, g in enumerate(gain, 1)]
            bonus = _deadline_bonus(cycle, job, count)  # a worker that saves a deadline is worth more
            if bonus is not None:
                value = [v + b for v, b in zip(value, bonus, strict=True)]
        values.append(value + [-1.0] * padding)
    if rooms is None:
        choice = solve_knapsack(np.array(weights, np.int64), np.array(values, np.float64),
                                np.array(counts, np.int64), capacity).choice.tolist()
    else:
        choice = _solve_by_type(cycle, jobs, weights, values, counts, rooms[0])
    # Shrink first (frees GPUs), then grow, most valuable growth first.
    targets = {job.view.job_id: choice[g] for g, job in enumerate(jobs)}
    value_per_gpu = {  # of the chosen option
        job.view.job_id: value[target - 1] / (target * job.view.gpus_per_worker) if target > 0 else 0.0
        for job, value, target in zip(jobs, values, choice, strict=True)
    }
    kept: dict[int, list[_Worker]] = {}
    for job in jobs:
        extras = job.workers[job.base:]
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
    quota = _ledger(cycle, {job.view.job_id: job.base + len(kept[job.view.job_id]) for job in jobs}
                    ) if cycle.snapshot.queues else QuotaLedger((), (), training_gpus=0, loaned_gpus=0)
    capped: set[int] = set()
    held: list[_Job] = []  # below max_workers at the size it has: why is worked out once all have grown
    freed: dict[int, list[tuple[str, frozenset[int]]]] | None = None  # ``_gpus_freed``, once a changed job grows
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
            if job.reason is not None and freed is None:
                freed = _gpus_freed(cycle)
            hidden = _hide_freed_by_others(cycle, view.job_id, freed) if freed and view.job_id in freed else []
            for extra in range(target - len(keep), 0, -1):  # as many as fit, if fragmentation bites
                new = cycle.capacity.place_gang(view, extra, pools=LOANED_FIRST, exclude=cycle.reserved,
                                                gpu_types=_gpu_type_of(cycle, job)) or ()
                if new:
                    break
            cycle.capacity.release_many(hidden)
            quota.charge(view, len(new) * view.gpus_per_worker)
        before = len(job.workers)
        job.workers = job.workers[: job.base] + keep + list(new)
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


def _gpus_freed(cycle: _Cycle) -> dict[int, list[tuple[str, frozenset[int]]]]:
    """By running job an earlier step changed (scaled in for a queued gang or a reclaim, moved): the GPUs it held at
    the snapshot and holds no longer, by server."""
    out: dict[int, list[tuple[str, frozenset[int]]]] = {}
    for job in cycle.running.values():
        if job.reason is None:
            continue
        now = {(w.server_id, g) for w in job.workers for g in w.gpu_indices}
        gone: dict[str, set[int]] = {}
        for w in job.view.workers:
            for g in w.gpu_indices:
                if (w.server_id, g) not in now:
                    gone.setdefault(w.server_id, set()).add(g)
        if gone:
            out[job.view.job_id] = [(server_id, frozenset(gpus)) for server_id, gpus in gone.items()]
    return out


def _hide_freed_by_others(cycle: _Cycle, job_id: int, freed: dict[int, list[tuple[str, frozenset[int]]]]
                          ) -> list[tuple[str, frozenset[int]]]:
    """Take out of ``cycle.capacity`` (``FreeCapacity.take_free``; the caller gives them back) the free GPUs other
    changed jobs freed this cycle, while job ``job_id`` -- itself freeing GPUs this cycle -- grows. Two such jobs
    each growing onto GPUs the other freed is a swap no applier can order (``core.plan.apply_order``): the
    headline's exact run (seed 1) had two jobs scaled in for queued gangs each grow onto the other's GPUs, refusing
    both and the two starts waiting on them. GPUs a preemption frees, or extras this step drops, stay available:
    those actions take nothing. A changed job that ends up only shrinking cannot be told apart yet (it may grow
    later in this step): its GPUs are hidden too."""
    return cycle.capacity.take_free(pair for other, pairs in freed.items() if other != job_id for pair in pairs)


_Risk = Callable[[float], tuple[float, float]] | None


def _room_by_type(cycle: _Cycle, released: dict[str, set[int]], jobs: list[_Job]
                  ) -> tuple[dict[tuple[str, ...] | None, int], dict[tuple[str, ...] | None, _Risk]]:
    """Step 3 on a cluster of several GPU types: per type of the jobs' (``_gpu_type_of``), the GPUs its jobs'
    extras may take (free, and those its extras hold now, none of a reserved server), and the risk of the loaned
    ones among them (``_extra_risk``)."""
    free_cap, loaned = cycle.capacity, _loaned_servers(cycle)
    room: dict[str, int] = {}
    lent: dict[str, int] = {}
    for sid, server in free_cap.servers.items():
        if sid in cycle.reserved:
            continue
        gpus = len(released[sid]) if sid in released else len(free_cap.free(sid))
        room[server.gpu_type] = room.get(server.gpu_type, 0) + gpus
        if sid in loaned:
            lent[server.gpu_type] = lent.get(server.gpu_type, 0) + gpus
    rooms: dict[tuple[str, ...] | None, int] = {}
    risks: dict[tuple[str, ...] | None, _Risk] = {}
    for job in jobs:
        key = _gpu_type_of(cycle, job)
        if key not in rooms:
            rooms[key] = room.get(key[0], 0) if key else 0
            risks[key] = _extra_risk(cycle, lent.get(key[0], 0) if key else 0, rooms[key])
    return rooms, risks


def _solve_by_type(cycle: _Cycle, jobs: list[_Job], weights: list[list[int]], values: list[list[float]],
                   counts: list[int], rooms: dict[tuple[str, ...] | None, int]) -> list[int]:
    """Step 3's knapsack per GPU type (``_room_by_type``): each job's chosen option, its type's GPUs shared out
    among the jobs on that type."""
    choice = [0] * len(jobs)
    groups: dict[tuple[str, ...] | None, list[int]] = {}
    for g, job in enumerate(jobs):
        groups.setdefault(_gpu_type_of(cycle, job), []).append(g)
    for key, members in groups.items():
        solution = solve_knapsack(np.array([weights[g] for g in members], np.int64),
                                  np.array([values[g] for g in members], np.float64),
                                  np.array([counts[g] for g in members], np.int64), rooms[key])
        for g, option in zip(members, solution.choice.tolist(), strict=True):
            choice[g] = option
    return choice


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


def _gpu_type_of(cycle: _Cycle, job: _Job) -> tuple[str, ...] | None:
    """The GPU type a running job's workers are on: its extras must be on it too (None: not placed yet)."""
    return (cycle.servers[job.workers[0].server_id].gpu_type,) if job.workers else None
