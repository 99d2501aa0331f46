"""Step 1 of an Aryl cycle: the base demands. The queue in order (quota, classes, fair share; starving jobs
first unless the joint sizing ran), each job's gang at ``min_workers`` on free GPUs, else over other
jobs' elastic extras (they are scaled in for it), else by preempting jobs its queue or class may preempt;
a starving job that still does not fit gets a reservation, which later jobs backfill around (EASY).
The joint sizing's deferred jobs take, last, what admitted gangs could not use; on a cluster of several GPU
types, after the extras, the GPUs no step took (``backfill_idle``). A job that waits says why, naming the
protected jobs that held it up.

Must never grow a running job (step 2, ``sizing``) or touch a loan (step 0, ``loans``).
Pure: no I/O, no wall clock; deterministic for a given snapshot.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import NamedTuple

from scheduler_service.core.fit import never_fits
from scheduler_service.core.placement import TRAINING_FIRST, FreeCapacity
from scheduler_service.core.plan import KeepPending, PreemptJob, Reason, StartJob, WorkerPlacement
from scheduler_service.core.protection import Mechanism, Protection, blocked
from scheduler_service.core.quota import preemption_order
from scheduler_service.core.snapshot import JobView
from scheduler_service.core.throughput import JobEstimate
from scheduler_service.lifecycle import Pool
from scheduler_service.policies.aryl.cycle import _Cycle, _Job, _ledger, _placed, _work_lost, _Worker


def base_demands(cycle: _Cycle, *, joint: bool, loaning: bool, shrink: bool = True) -> None:
    """Step 1: the queue's gangs at ``min_workers``, in order (the module doc). ``joint``: the joint sizing
    ran first (``sizing.joint_sizing``: starving jobs are not put first, its deferred jobs go last);
    ``loaning``: the policy may place on inference servers (what can never fit); ``shrink`` False (the
    ``aryl-noshrink`` ablation): a gang starts on free GPUs only, never over other jobs' extras."""
    p, snap = cycle.params, cycle.snapshot

    def starving(job: JobView) -> bool:
        return snap.now - job.submitted_at >= p.starvation_s

    def order(job: JobView) -> tuple[bool, int, float, float, int]:
        gpu_time = cycle.estimate(job).remaining_gpu_time(job.min_workers, job.gpus_per_worker)
        return (not starving(job) and not joint, -job.priority, gpu_time, job.submitted_at, job.job_id)

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

    later: list[JobView] = []  # deferred by the joint sizing (``sizing.joint_sizing``): after the others
    for job in quota.order(snap.pending_jobs(), order):  # quota first, classes, fair share (core.quota)
        if job.job_id in cycle.deferred:  # (before the shortcut: a deferred job changes nothing it relies on)
            later.append(job)
            continue
        if (last_wait is not None and last_wait.kind == _kind(job) and last_wait.starts == len(cycle.starts)
                and last_wait.preemptions == len(cycle.preemptions) and last_wait.reserved is cycle.reserved
                and not starving(job)):
            cycle.pending.append(KeepPending(job.job_id, last_wait.reason, last_wait.message))
            continue
        last_wait = None
        verdict = quota.check(job, job.min_workers * job.gpus_per_worker)
        if not verdict.allowed:  # its queue may not take the GPUs: it waits without holding others up,
            # unless lower classes of its own queue give way (their GPUs count against the same quota)
            victims = quota.has_victims(job)
            workers = _place_by_preemption(cycle, job) if victims else None
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
        workers = cycle.capacity.place_gang(job, job.min_workers, pools=TRAINING_FIRST, exclude=exclude,
                                            gpu_types=cycle.type_preference(job))
        if workers is None and shrink and not any(
            g <= job.gpus_per_worker and n <= job.min_workers for g, n in no_fit
        ):
            workers = _place_over_extras(cycle, job, exclude)
            if workers is None:
                no_fit.append((job.gpus_per_worker, job.min_workers))
        victims = quota.has_victims(job)
        if workers is None and victims:
            workers = _place_by_preemption(cycle, job)
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
            reason, message = _unplaceable(cycle, job, loaning=loaning)
            if reason == Reason.WAITING_FOR_GANG:
                reason = Reason.WAITING_FOR_RESERVATION
                message += f"; server(s) {', '.join(sorted(cycle.reserved))} are held for a starving job"
            cycle.pending.append(_protected_pending(cycle, job, reason, message))
            last_wait = waited(job, victims, reason, message)
            continue
        reason, message = _unplaceable(cycle, job, loaning=loaning)
        if starving(job) and not cycle.reserved and reason != Reason.CANNOT_FIT:
            cycle.reserved = _reserve(cycle, job)
            if cycle.reserved:
                cycle.reserved_for = job.job_id
                message += (f"; waiting {snap.now - job.submitted_at:.0f}s: server(s) "
                            f"{', '.join(sorted(cycle.reserved))} are reserved for it")
        cycle.pending.append(_protected_pending(cycle, job, reason, message))
        last_wait = waited(job, victims, reason, message)
    if later:
        _start_deferred(cycle, later)


def relocate_displaced(cycle: _Cycle) -> None:
    """Before anything else is placed: each job a reclaim left below ``min_workers`` (``cycle.displaced``, from
    step 0) restarts at ``min_workers`` elsewhere -- a graceful resize, checkpoint first, so it loses no work --
    on free GPUs (its own that stay count), else over other jobs' unprotected elastic extras (scaled in for it,
    as for a queued gang: ``_place_over_extras``); only a job that fits nowhere is preempted and requeued.

    Why before the queue: a move costs the job one restart and each job scaled in for it one, while a
    preemption costs it the work since its checkpoint, the restart and the wait for a place again; and a
    displaced job has waited once already. In the order the reclaim chose them."""
    for job, preemption in cycle.displaced:
        view = job.view
        workers = cycle.capacity.place_gang(view, view.min_workers, pools=TRAINING_FIRST, exclude=cycle.reserved,
                                            gpu_types=cycle.type_preference(view))
        if workers is None:  # (place_gang took its GPUs; _place_over_extras takes them, scaling the extras in)
            workers = _place_over_extras(cycle, view, cycle.reserved)
        if workers is None:
            workers = _place_by_moving(cycle, view)
        if workers is None:
            cycle.preemptions.append(preemption)
            continue
        servers = sorted({w.server_id for w in job.workers} - {w.server_id for w in workers})
        # The GPUs it leaves (on servers still lent or training) stay out of this cycle's capacity: a job scaled
        # in for it that then grew onto them would take GPUs this move frees while it frees GPUs this move takes,
        # a cycle no applier can order (``core.plan.apply_order``). They are free again next cycle.
        kept = {(w.server_id, g) for w in workers for g in w.gpu_indices}
        for w in job.workers:
            left = [g for g in w.gpu_indices if (w.server_id, g) not in kept]
            if left and w.server_id in cycle.capacity.servers:
                cycle.capacity.take(w.server_id, left)
        job.workers = list(workers)
        job.reason = Reason.MOVED_FOR_RECLAIM
        job.message = (f"moved: its server(s) {', '.join(servers)} went back to inference and left it below "
                       f"min_workers={view.min_workers}; restarted at {len(workers)} worker(s) on "
                       f"{', '.join(sorted({w.server_id for w in workers}))} instead of being requeued"
                       + preemption.message.partition(", requeued")[2])
        cycle.running[view.job_id] = job
    cycle.displaced = []


def _place_by_moving(cycle: _Cycle, job: JobView) -> tuple[WorkerPlacement, ...] | None:
    """A displaced gang that fits nowhere as the GPUs lie: clear a server for each of its workers by moving other
    jobs' workers off it to free GPUs elsewhere, each moved job restarting once at its size (a graceful resize,
    checkpoint first: no work lost; ``Reason.MOVED_TO_MAKE_ROOM``). Only unprotected jobs not otherwise changed
    this cycle move, and the moved jobs hold at most as many GPUs in all as the gang's minimum: so the moves cost
    at most the restarts of the gang's own GPUs, less than its preemption (that restart, the work since its
    checkpoint and the wait for a place again). Per worker, the server whose clearing moves the fewest GPUs (ties:
    the server id). None, and nothing changed, when the gang cannot be placed so.

    Why: in the busy regime nearly every job a reclaim preempted after ``_place_over_extras`` was a whole-server
    worker (8 GPUs) with enough free GPUs in the cluster -- scattered over servers by smaller jobs (the inference
    evaluation, servegen seed 1: 124 of 143)."""
    per_worker, budget = job.gpus_per_worker, job.min_workers * job.gpus_per_worker
    if cycle.capacity.total < budget:  # moves only shift GPUs between servers: they must be free somewhere already
        return None
    movable: dict[str, list[_Job]] = {}  # server -> the movable jobs with a worker there
    for other in cycle.running.values():
        if other.reason is None and other.workers and other.view.job_id not in cycle.protected:
            for server_id in {w.server_id for w in other.workers}:
                movable.setdefault(server_id, []).append(other)
    if not movable:
        return None
    trial = cycle.capacity.copy()
    # The gang's own GPUs on servers that stay (free in the capacity as it leaves them) are not for the moved
    # workers: the gang would take the GPUs a moved job frees while that job took the gang's, a swap no applier can
    # order (``core.plan.apply_order``; the inference evaluation's applier refused 14 such actions).
    own = [(w.server_id, frozenset(w.gpu_indices)) for w in job.workers]
    moved: dict[int, tuple[_Job, list[_Worker]]] = {}  # job id -> (job, its workers after the moves)
    placed: list[WorkerPlacement] = []
    spent = 0
    types = cycle.type_preference(job) or job.gpu_types
    for rank in range(job.min_workers):
        candidates: list[tuple[int, str, list[_Job]]] = []  # (GPUs to move, server, the jobs to move off it)
        block = trial.largest_block()  # a moved worker needs its GPUs free on one server
        for server_id, there in movable.items():
            server = cycle.servers[server_id]
            if (server_id in cycle.reserved or server_id not in trial.servers or len(server.healthy_gpus) < per_worker
                    or (types and server.gpu_type not in types)
                    or (placed and server.gpu_type != cycle.servers[placed[0].server_id].gpu_type)):
                continue
            chosen, freed, cost, widest = [], len(trial.free(server_id)), 0, 0
            for other in sorted((o for o in there if o.view.job_id not in moved),
                                key=lambda o: (len(o.workers) * o.view.gpus_per_worker, o.view.job_id)):
                if freed >= per_worker:  # the smallest jobs first, until the worker fits
                    break
                chosen.append(other)
                freed += sum(len(w.gpu_indices) for w in other.workers if w.server_id == server_id)
                cost += len(other.workers) * other.view.gpus_per_worker
                widest = max(widest, other.view.gpus_per_worker)
            # (what moves off the server, ``freed`` less its free GPUs, needs as many free elsewhere)
            if per_worker <= freed <= trial.total and widest <= block and spent + cost <= budget:
                candidates.append((cost, server_id, chosen))
        best: tuple[int, str, list[tuple[_Job, list[_Worker]]], FreeCapacity, list[int]] | None = None
        for cost, server_id, chosen in sorted(candidates, key=lambda c: c[:2]):  # the first whose moves fit
            twin = trial.copy()
            twin.release_many((w.server_id, w.gpu_indices) for o in chosen for w in o.workers
                              if w.server_id == server_id)
            held = sorted(twin.free_set(server_id) or ())
            twin.take(server_id, held)  # the cleared server is the gang's: the moved workers go elsewhere
            hidden = twin.take_free((sid, gpus) for sid, gpus in own if sid != server_id)
            after: list[tuple[_Job, list[_Worker]]] = []
            for other in chosen:
                staying = [w for w in other.workers if w.server_id != server_id]
                kind = cycle.servers[staying[0].server_id].gpu_type if staying else None
                new = twin.place_gang(other.view, len(other.workers) - len(staying), pools=TRAINING_FIRST,
                                      exclude=cycle.reserved, gpu_types=(kind,) if kind else None)
                if new is None:
                    break
                after.append((other, staying + list(new)))
            else:
                twin.release_many(hidden)
                best = (cost, server_id, after, twin, held)
                break
        if best is None:
            return None
        # The gang's worker takes the cleared server's first GPUs; the rest stay out of this cycle's capacity, as
        # the GPUs a displaced job leaves do (``relocate_displaced``: no applier can order a cycle of frees and
        # takes); they are free again next cycle.
        cost, server_id, after, trial, held = best
        spent += cost
        placed.append(WorkerPlacement(rank, server_id, tuple(held[:per_worker])))
        for other, workers in after:
            moved[other.view.job_id] = (other, workers)
    for other, workers in moved.values():
        gone = sorted({w.server_id for w in other.workers} - {w.server_id for w in workers})
        other.workers = workers
        other.reason = Reason.MOVED_TO_MAKE_ROOM
        other.message = (f"moved off {', '.join(gone)} at its size ({len(workers)} worker(s)) so that job "
                         f"{job.job_id}, whose loaned server went back to inference, restarts there instead of "
                         "being requeued")
    cycle.capacity = trial
    return tuple(placed)


def move_to_faster_types(cycle: _Cycle, worth: Callable[[_Cycle, str, int], Callable[[int], float]] | None = None
                         ) -> None:
    """After the queue's gangs (on a cluster of several GPU types whose speeds it knows, ``_Cycle.speed_factors``):
    a running job outside its protection window restarts on another type where it runs faster *at the room there*
    -- its speed on the type times its speed curve at as many workers as the type's free GPUs hold, within
    ``min_workers .. max_workers`` (``_Cycle.speed_at_room``) -- than it can on its own type (its workers and the
    free GPUs there), when that saves more than two restarts: the one the move costs, and one as a margin for the
    estimates' error. A job that started on a loaned T4 because the fast GPUs were busy moves once they free up,
    instead of running its whole life on the slow type; and a job on one GPU of a type faster per GPU but full (it
    grows on its own type only) moves to a slower type with GPUs to spare (in the heterogeneous evaluation
    deepspeech2 jobs, 1.19x as fast per A100 as per RTX GPU, held one A100 each for hours while RTX GPUs freed up:
    docs/simulator.md). The longest-running first (the most to save), each to the first type that saves it that
    much, in the order its gang would try them (``_Cycle.type_preference``), up to its own type or the first no
    faster at its room than its own (a type its gang would try after that is not worth a move).

    It moves at the smallest size at which it saves that much and keeps that size (``_Job.floor``) while it stays
    on the type: step 3 sizes it there above it, growing it past it, never shrinking it below (a queued gang, a
    reclaim still may). Why: a move valued at all the type's free GPUs was left by step 3, that cycle or a later
    one, at far fewer (shorter jobs complete more on them), slower than before it moved, and a later cycle moved it
    back -- in the Sia philly workload (seed 0) 68 of 156 moves ended smaller than they were valued at, and yolov3
    jobs went back and forth between the A100s and the RTX GPUs a dozen times. The policy carries the floors from
    cycle to cycle (``_Cycle.floors``, ``_Cycle.kept_floors``).

    ``worth`` (``sizing.type_worth``; None: a move is weighed by its own time alone): a move is a resize as well,
    so it is weighed as step 3 weighs one, by the rate at which the cluster completes jobs: what it adds to its own
    completion rate, plus what the GPUs it leaves are worth to the jobs on its type, must exceed what the GPUs it
    takes would have added to the jobs on the new one (their extras, as step 3 would share that type out). Before,
    a move took the free GPUs it saved time on ahead of step 3, whatever the jobs already on the type would have made
    of them: in philly/workload-3 (inference-pool, seed 0) yolov3 jobs moved from one A100 to six RTX GPUs to
    finish 1% sooner, and back when an A100 freed up (docs/simulator.md). A type no job there wants more of costs
    nothing, so a job still moves to GPUs that would idle.

    The GPUs it leaves stay out of this cycle's capacity (it holds them now), as a reclaim's move leaves them
    (``relocate_displaced``: no applier can order a cycle of frees and takes). Last, each job not moved now takes
    back the floor of an earlier move while it is on that move's type (at most the workers it holds)."""
    restart = cycle.params.restart_cost_s
    started = {s.job_id for s in cycle.starts}
    weigh = _MoveWorth(cycle, worth) if worth is not None else None
    movable = []
    for job in cycle.running.values():
        view = job.view
        if (view.job_id in cycle.protected or view.job_id in started or job.reason is not None or view.gpu_types
                or not job.workers or cycle.speed_factors(view) is None):
            continue
        movable.append((-cycle.estimate(view).remaining_time(len(job.workers)), view.job_id, job))
    movable.sort(key=lambda m: (m[0], m[1]))
    for minus_left, _, job in movable:
        view = job.view  # (bound first: ``cycle.estimate(view)`` beside it read the previous job's view)
        left, est = -minus_left, cycle.estimate(view)
        here = cycle.servers[job.workers[0].server_id].gpu_type
        speed_here, per_worker = cycle.factor_on(view, here), view.gpus_per_worker
        free = cycle.capacity.free_by_type()
        best_here = cycle.speed_at_room(view, here, free.get(here, 0) + len(job.workers) * per_worker)
        for gpu_type in cycle.type_preference(view) or ():
            if gpu_type == here or cycle.speed_at_room(view, gpu_type, free.get(gpu_type, 0)) <= best_here:
                break  # (the order above: no later type is worth a move)
            speed = cycle.factor_on(view, gpu_type)
            workers, size, after = None, view.min_workers, left
            for size in range(view.min_workers, min(view.max_workers, free.get(gpu_type, 0) // per_worker) + 1):
                after = restart + est.remaining_time(size) * speed_here / speed
                if left - after <= restart:
                    continue  # too small to pay (a larger size may)
                if weigh is not None and not weigh.pays(job, here, gpu_type, size, left, after, free):
                    break  # its GPUs complete more on the type's own jobs (a larger size takes more of them)
                workers = cycle.capacity.place_gang(view, size, pools=TRAINING_FIRST, exclude=cycle.reserved,
                                                    gpu_types=(gpu_type,))
                break  # placed, or not: a larger gang does not fit where this one did not (one worker at a time)
            if workers is None:
                continue
            cycle.estimates[view.job_id] = JobEstimate(est.model, est.remaining_work * speed_here / speed)
            if weigh is not None:
                weigh.moved(view.job_id)
            before = len(job.workers)
            job.workers = list(workers)
            job.floor, job.moved = size, True
            job.reason = Reason.SCALED_OUT
            job.message = (f"moved from {before} worker(s) on {here} to {size} on {gpu_type} GPUs "
                           f"({speed / speed_here:.2f}x as fast per GPU for it): estimated completion {left:.0f}s -> "
                           f"{after:.0f}s with the restart")
            break
    for job in cycle.running.values():  # the floors of earlier cycles' moves, while their jobs stay on that type
        kept = cycle.floors.get(job.view.job_id)
        if (kept is not None and not job.moved and job.workers
                and cycle.servers[job.workers[0].server_id].gpu_type == kept[0]):
            job.floor = min(kept[1], len(job.workers))


class _MoveWorth:
    """Whether a move raises the rate at which the cluster completes jobs (``move_to_faster_types``, ``pays``), with
    what every candidate move of a cycle reads of a type -- its worth to its jobs (``worth``: ``sizing.type_worth``)
    and the extras they hold -- worked out once per type until a move changes the cluster, not once per candidate:
    a cluster of 5,000 jobs on two types spent 0.2 s a cycle rebuilding them."""

    def __init__(self, cycle: _Cycle, worth: Callable[[_Cycle, str, int], Callable[[int], float]]) -> None:
        self.cycle, self.worth = cycle, worth
        self._worths: dict[str, Callable[[int], float]] = {}  # per type, to every job on it
        self._extras: dict[str, int] = {}  # per type, the GPUs of the extras outside their protection window

    def moved(self, job_id: int) -> None:
        """A move of job ``job_id`` changed the jobs on two types: their worths and extras, and its own options."""
        self._worths.clear()
        self._extras.clear()
        self.cycle.type_tables.clear()
        self.cycle.type_rows.pop(job_id, None)

    def pays(self, job: _Job, here: str, there: str, size: int, left: float, after: float,
             free: dict[str, int]) -> bool:
        """Whether ``job``'s move from ``here`` to ``size`` workers on ``there`` raises the rate at which the cluster
        completes jobs: its own rate, from ``1 / left`` to ``1 / after``, plus what the GPUs it leaves add to the jobs
        on ``here``, less what the GPUs it takes would have added to the jobs on ``there`` -- each type's room its
        free GPUs and its jobs' extras."""
        per_worker, mover = job.view.gpus_per_worker, job.view.job_id
        gain = 1.0 / max(after, 1e-3) - 1.0 / max(left, 1e-3)
        on_there = self._worths.get(there)
        if on_there is None:  # (the mover is on ``here``, not on ``there``: the same for every mover)
            on_there = self._worths[there] = self.worth(self.cycle, there, mover)
        on_here = self.worth(self.cycle, here, mover)
        room_there = free.get(there, 0) + self._extras_on(there)
        own = job.extras * per_worker if mover not in self.cycle.protected and job.extras > 0 else 0
        room_here = free.get(here, 0) + self._extras_on(here) - own
        taken = on_there(room_there) - on_there(room_there - size * per_worker)
        given = on_here(room_here + len(job.workers) * per_worker) - on_here(room_here)
        return gain + given > taken

    def _extras_on(self, gpu_type: str) -> int:
        """The GPUs of the extras that the jobs on ``gpu_type`` outside their protection window hold: what step 3
        would share out there beside the free ones (``sizing.type_worth``)."""
        known = self._extras.get(gpu_type)
        if known is None:
            cycle = self.cycle
            known = self._extras[gpu_type] = sum(
                job.extras * job.view.gpus_per_worker for job in cycle.running.values()
                if job.workers and job.view.job_id not in cycle.protected and job.extras > 0
                and cycle.servers[job.workers[0].server_id].gpu_type == gpu_type)
        return known


def _start_deferred(cycle: _Cycle, later: list[JobView]) -> None:
    """The joint sizing's deferred jobs, in the queue's order, after every other: the GPUs it admitted
    jobs for that then did not fit (their gangs found no room on the servers, where the sizing counts
    GPUs) go to these on free GPUs, so no GPU the sizing gave out idles. The rest wait, saying why."""
    admitted = cycle.admitted or set()
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
                                                exclude=_exclusion(cycle, job), gpu_types=cycle.type_preference(job))
        if workers is None:
            cycle.pending.append(KeepPending(job.job_id, Reason.WAITING_FOR_GANG, cycle.deferred[job.job_id]))
            continue
        budget -= need
        quota.charge(job, need)
        cycle.starts.append(StartJob(job.job_id, workers, Reason.BACKFILLED, _placed(workers) + (
            "; backfilled on GPUs the joint sizing gave jobs whose gangs did not fit")))
        cycle.running[job.job_id] = _Job(job, list(workers))


def backfill_idle(cycle: _Cycle) -> bool:
    """After the extras (``sizing.elastic_extras``): each of the joint sizing's deferred jobs still waiting, in the
    queue's order, starts at ``min_workers`` on GPUs no step gave out, where its gang fits (none reserved for a
    starving job it would delay: ``_exclusion``). True if any started (the caller shares the rest out again).

    Why: the joint sizing shares out the GPUs of every type as one pool, and sizes admitted jobs as if they could
    grow anywhere; a job grows on its own GPU type only (``core.placement``), so on a cluster of several types the
    GPUs it counted on one type can stand idle while the jobs it deferred for them wait (the heterogeneity
    evaluation's philly/workload-3, ``aryl-noloan``, seed 2: 11 RTX GPUs idle from 6.75 h while 4 jobs waited).
    A GPU that stays idle cuts no one's completion time."""
    quota = cycle.quota
    if not cycle.deferred or quota is None:
        return False
    views = {j.job_id: j for j in cycle.snapshot.pending_jobs() if j.job_id in cycle.deferred}
    started: set[int] = set()
    for entry in cycle.pending:
        job = views.get(entry.job_id)
        if job is None or job.job_id in cycle.running:
            continue
        need = job.min_workers * job.gpus_per_worker
        if need > cycle.capacity.total or not quota.check(job, need).allowed:
            continue
        workers = cycle.capacity.place_gang(job, job.min_workers, pools=TRAINING_FIRST,
                                            exclude=_exclusion(cycle, job), gpu_types=cycle.type_preference(job))
        if workers is None:
            continue
        quota.charge(job, need)
        cycle.starts.append(StartJob(job.job_id, workers, Reason.BACKFILLED, _placed(workers) + (
            "; backfilled on GPUs that no job's minimum or elastic extras took this cycle")))
        cycle.running[job.job_id] = _Job(job, list(workers))
        started.add(job.job_id)
    if started:
        cycle.pending = [entry for entry in cycle.pending if entry.job_id not in started]
    return bool(started)


def _unplaceable(cycle: _Cycle, job: JobView, *, loaning: bool) -> tuple[Reason, str]:
    """Why a queued job's gang is not placed this cycle: CANNOT_FIT when it would not fit even on
    every server this policy may ever place on, all free (``core.fit``: the cluster shrank under
    it, or SubmitJob could not know yet), else what the free capacity lacks now."""
    if cycle.server_gpus is None:
        cycle.server_gpus = [len(s.gpu_indices) for s in cycle.snapshot.servers
                             if s.pool == Pool.TRAINING or loaning]
    shape = (job.gpus_per_worker, job.min_workers)
    if shape in cycle.never_fit:
        why = cycle.never_fit[shape]
    else:
        why = cycle.never_fit[shape] = never_fits(
            job.gpus_per_worker, job.min_workers, cycle.server_gpus,
            servers="training + inference servers" if loaning else "training servers")
    if why is not None:
        return Reason.CANNOT_FIT, f"can never fit the servers registered now: {why}"
    return cycle.capacity.explain_unplaceable(job, job.min_workers)


def _place_over_extras(cycle: _Cycle, job: JobView, exclude: frozenset[str]
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
    placed = trial.place_gang(job, job.min_workers, pools=TRAINING_FIRST, exclude=exclude,
                              gpu_types=cycle.type_preference(job, trial))
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


def _place_by_preemption(cycle: _Cycle, job: JobView) -> tuple[WorkerPlacement, ...] | None:
    """Place a gang by preempting running jobs it may preempt (``QuotaLedger.may_preempt``: a queue's
    borrowed GPUs for a job within its quota, lower priority classes of its own queue), cheapest
    first, as few as make the gang fit and its queue's quota allow it; a victim is spared when the
    gang does not use its GPUs and the quota does not need them."""
    quota, p, now = cycle.quota, cycle.params, cycle.snapshot.now
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
        placed = trial.place_gang(job, job.min_workers, pools=TRAINING_FIRST, exclude=cycle.reserved,
                                  gpu_types=cycle.type_preference(job, trial))
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


def _reserve(cycle: _Cycle, job: JobView) -> frozenset[str]:
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


def _exclusion(cycle: _Cycle, job: JobView) -> frozenset[str]:
    """The servers a queued job may not start on: those reserved for a starving job, unless it is estimated
    to finish before their jobs end anyway (backfilling that does not delay the reservation, as EASY
    backfilling does)."""
    if not cycle.reserved or job.job_id == cycle.reserved_for:
        return cycle.reserved
    left = cycle.estimate(job).remaining_time(job.min_workers) + cycle.params.restart_cost_s
    return frozenset() if cycle.snapshot.now + left <= cycle.reserved_until else cycle.reserved


# A waiting job's reason names at most this many of the protected jobs holding it up, the first out of
# protection first, and counts the rest: a burst of high-class jobs on a cluster of newly started low-class
# ones would otherwise name 100s in each queued job's reason (cut at 2,048 characters where it is stored).
NAMED_PROTECTIONS = 3


_Kind = tuple[str, int, int, int, tuple[str, ...]]


def _kind(job: JobView) -> _Kind:
    """What the base-demand steps read of a queued job that waits without victims (``base_demands``),
    besides its id and whether it starves: its queue and class (quota and preemption), its gang's shape
    and GPU types (placement and the explanation)."""
    return job.queue, job.priority_class, job.gpus_per_worker, job.min_workers, job.gpu_types


class _Waited(NamedTuple):
    """A queued job that waited with no victims and not starving, and the plan's progress then: a next
    job of its kind waits for the same reason while the plan has started, preempted and reserved nothing
    more (``base_demands``)."""

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
