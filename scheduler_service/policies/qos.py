"""``qos``: deadline-aware scheduling and autoscaling (after the QoS-oriented framework, IJCNN'19):
users state when a job must be done; the policy sizes each job to meet it.

Nouns, for a job with a deadline at a size of ``n`` workers:

- *predicted finish*: ``now + restart + remaining(n)``, with ``remaining`` the service's prediction
  (``core.predict.remaining_seconds``: the job's measured rate, scaled by its throughput model) or,
  where that has none, the policy's estimate (``core.throughput.estimate``, ``default_runtime_s`` for
  a job that declares nothing); ``restart`` = ``policy.restart_cost_s`` when ``n`` is not the size it
  runs at now (a start or a resize), else 0;
- *slack*: ``deadline - predicted finish``; it meets its deadline at ``n`` when the slack is >= 0;
- *need*: the smallest ``n`` in ``min_workers..max_workers`` that meets its deadline;
- *hopeless*: no size meets it (not even ``max_workers``);
- *at risk*: its slack at the size it gets is below ``policy.qos_margin`` x its remaining time there.

One cycle sizes every PENDING and RUNNING job (a job in SCALING keeps its GPUs), in GPUs counted
over the cluster (free GPUs of schedulable servers plus the GPUs the running jobs hold), then places:

1. **Deadline jobs that can make it**, most urgent first: earliest deadline first (then least slack
   at ``min_workers``, then job id), each at its *need*. When their needs exceed the GPUs, the job
   with the largest need (in GPUs; ties: the later deadline, the higher id) among those taken so far
   is *sacrificed* -- Moore and Hodgson's rule, which walks jobs in deadline order and drops the
   longest -- so that as many deadlines as possible are met: one large job gives way to several small
   ones. With ``qos_hopeless = keep`` nothing is sacrificed, and each gets what is left up to its
   need (hopeless ones: ``max_workers``). Deadline order, not least slack first: slacks cross as time
   passes (a waiting job's shrinks, a running one's grows), so a least-slack order swaps the same
   jobs back and forth, each swap a preemption that loses the work since the last checkpoint.
2. **Running jobs keep their minimum**: those without a deadline, then the hopeless and sacrificed
   ones, each group shortest remaining GPU-time first, while the GPUs step 1 left last: a running job
   is shrunk or preempted only to meet a deadline, never for a job without one.
3. **Queued jobs without a deadline** get ``min_workers``, in ``sjf``'s order (shortest estimated
   remaining GPU-time at ``min_workers``, then submission, then id; no starvation reservation), then
   the queued hopeless and sacrificed ones (``qos_hopeless = deprioritise``, the default; with
   ``keep``, hopeless jobs stay in step 1 by urgency, at ``max_workers``, and the queued ones lead).
4. **Running jobs keep their size** (no shrink just to hand GPUs to others), in the order above.
5. **Spare GPUs to the jobs most at risk**: one worker at a time to the deadline job at risk with
   the least slack relative to its remaining time, then one worker at a time to the job (any) whose
   remaining time falls most per GPU -- a running job's first added worker only when it saves more
   than a restart costs. A job in its protection window (``core.protection``: resized less than
   ``min_resize_interval_s`` ago, or ``max_disruptions_per_hour`` reached) gets none here.

Placement: preempted jobs free all their GPUs, shrinking ones their highest ranks; then, in the
order of steps 1-3, each queued job starts at its size (or the largest smaller one that fits, down to
``min_workers``) and each growing job adds workers on the GPUs left (as many as fit). No GPU moves
between running jobs in one cycle; a job's workers share one GPU type (``core.placement``). No loans
(a training-only policy). Not used: ``priority``, and queues' quotas and priority classes
(``core.quota``).

Pure: no I/O, no wall clock; deterministic for a given snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import (
    KeepPending,
    LoanNote,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    StartJob,
    WorkerPlacement,
    clock_time,
)
from scheduler_service.core.predict import predicted_remaining
from scheduler_service.core.protection import protection
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, WorkerView, without_jobs
from scheduler_service.core.throughput import JobEstimate, estimate
from scheduler_service.lifecycle import JobState

# The tiers a job is sized in (the order of steps 1-3 of the module doc).
URGENT, BEST_EFFORT, LATE = 0, 1, 2


@dataclass(slots=True)
class _Sized:
    """One job as this cycle sizes it."""

    view: JobView
    estimate: JobEstimate
    now: float
    restart_s: float
    alpha: float
    tier: int = BEST_EFFORT
    need: int | None = None         # smallest size meeting the deadline (None: no deadline, or hopeless)
    sacrificed: bool = False        # could make it alone, gave way so that more deadlines are met
    size: int = 0                   # workers this cycle's plan gives it
    notes: list[str] = field(default_factory=list)
    _remaining: dict[int, float] = field(default_factory=dict)

    def remaining(self, workers: int) -> float:
        """Predicted seconds to finish at ``workers`` workers from now (``core.predict.predicted_remaining``)."""
        known = self._remaining.get(workers)
        if known is None:
            known = self._remaining[workers] = predicted_remaining(self.view, workers, self.now, self.estimate,
                                                                   self.alpha)
        return known

    @property
    def running(self) -> bool:
        return self.view.state == JobState.RUNNING and bool(self.view.workers)

    @property
    def current(self) -> int:
        return self.view.num_workers if self.running else 0

    def finish(self, workers: int) -> float:
        """Predicted finish at ``workers`` workers (a restart when that is not its size now)."""
        restart = 0.0 if workers == self.current else self.restart_s
        return self.now + restart + self.remaining(workers)

    def slack(self, workers: int) -> float:
        assert self.view.deadline is not None
        return self.view.deadline - self.finish(workers)

    def gpus(self, workers: int) -> int:
        return workers * self.view.gpus_per_worker

    def sjf_key(self) -> tuple[float, float, int]:
        v = self.view
        return (self.remaining(v.min_workers) * v.min_workers * v.gpus_per_worker, v.submitted_at, v.job_id)


def _smallest_meeting(job: _Sized) -> int | None:
    for n in range(job.view.min_workers, job.view.max_workers + 1):
        if job.slack(n) >= 0:
            return n
    return None


@dataclass(frozen=True)
class QosPolicy:
    """Uses ``restart_cost_s``, ``min_resize_interval_s``, ``default_runtime_s``, ``amdahl_alpha``,
    ``qos_hopeless`` and ``qos_margin``."""

    params: PolicyParams
    name: str = "qos"

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        p, now = self.params, snapshot.now
        jobs = [
            _Sized(j, estimate(j, now=now, default_runtime_s=p.default_runtime_s, alpha=p.amdahl_alpha), now,
                   p.restart_cost_s, p.amdahl_alpha)
            for j in sorted(snapshot.jobs, key=lambda j: j.job_id)
            if j.state == JobState.PENDING or (j.state == JobState.RUNNING and j.workers)
        ]
        budget = sum(len(s.free_gpus) for s in snapshot.servers if s.runs_training and not s.cordoned)
        budget += sum(len(w.gpu_indices) for j in jobs if j.running for w in j.view.workers)
        order = self._size(jobs, budget)
        return self._place(snapshot, order)

    # -- sizing (steps 1-5) -----------------------------------------------------------------------

    def _size(self, jobs: list[_Sized], budget: int) -> list[_Sized]:
        """Sets every job's ``size``; returns the jobs in placement order (steps 1-3)."""
        keep_hopeless = self.params.qos_hopeless == "keep"
        urgent: list[_Sized] = []
        for job in jobs:
            if job.view.deadline is None:
                continue
            job.need = _smallest_meeting(job)
            if job.need is not None or keep_hopeless:
                job.tier = URGENT
                urgent.append(job)
            else:
                job.tier = LATE
                job.notes.append(f"cannot meet its deadline {clock_time(job.view.deadline)} any more, even at "
                                 f"{job.view.max_workers} worker(s) (predicted finish "
                                 f"{clock_time(job.finish(job.view.max_workers))}): deprioritised")
        urgent.sort(key=lambda j: (j.view.deadline, j.slack(j.view.min_workers), j.view.job_id))

        # Step 1: the deadline jobs that can make it, at their need; sacrifice the largest when short.
        left = budget
        if keep_hopeless:
            for job in urgent:
                want = job.need if job.need is not None else job.view.max_workers
                job.size = self._fit(job, want, left)
                left -= job.gpus(job.size)
        else:
            taken: list[_Sized] = []
            used = 0
            for job in urgent:
                assert job.need is not None
                taken.append(job)
                used += job.gpus(job.need)
                while used > budget:
                    drop = max(taken, key=lambda j: (j.gpus(j.need or 0), j.view.deadline, j.view.job_id))
                    taken.remove(drop)
                    used -= drop.gpus(drop.need or 0)
                    drop.sacrificed, drop.tier = True, LATE
            for job in taken:
                job.size = job.need or 0
            left = budget - used
            for job in urgent:
                if job.sacrificed:
                    job.notes.append(f"gives way: meeting its deadline {clock_time(job.view.deadline or 0)} needs "
                                     f"{job.gpus(job.need or 0)} GPU(s), which meet more deadlines of other jobs")
            urgent = taken

        # Steps 2-3: running jobs keep their minimum (step 1 took what it needed from the last ones),
        # then the queued ones without a deadline, then the queued late ones.
        rest = [j for j in jobs if j.tier != URGENT]
        running = sorted((j for j in rest if j.running), key=lambda j: (j.tier, j.sjf_key()))
        queued = sorted((j for j in rest if not j.running), key=lambda j: (j.tier, j.sjf_key()))
        for job in (*running, *queued):
            if job.gpus(job.view.min_workers) <= left:
                job.size = job.view.min_workers
                left -= job.gpus(job.size)
        order = [*urgent, *running, *queued]

        # Step 4: running jobs keep their size while GPUs are left.
        for job in order:
            if job.running and 0 < job.size < job.current:
                more = min(job.current - job.size, left // job.view.gpus_per_worker)
                job.size += more
                left -= job.gpus(more)

        # Step 5: spare GPUs, first to the deadline jobs at risk, then by the greatest cut per GPU.
        left = self._spare(order, left)
        return order

    def _fit(self, job: _Sized, want: int, left: int) -> int:
        """``want`` workers, or as many as ``left`` GPUs hold; 0 below ``min_workers``."""
        n = min(want, left // job.view.gpus_per_worker)
        return n if n >= job.view.min_workers else 0

    def _spare(self, order: list[_Sized], left: int) -> int:
        p = self.params
        now = order[0].now if order else 0.0

        def may_grow(job: _Sized) -> bool:
            v = job.view
            if not 0 < job.size < v.max_workers or job.gpus(1) > left:
                return False
            # Anti-thrashing: a job in its protection window (``core.protection``) keeps its size.
            return not (job.running and protection(v, now, p) is not None)

        def relative_slack(job: _Sized) -> float:
            remaining = job.remaining(job.size)
            return job.slack(job.size) / remaining if remaining > 0 else float("inf")

        while True:  # at-risk deadline jobs, least relative slack first
            at_risk = [j for j in order if j.tier == URGENT and j.view.deadline is not None and may_grow(j)
                       and relative_slack(j) < p.qos_margin]
            if not at_risk:
                break
            job = min(at_risk, key=lambda j: (relative_slack(j), j.view.job_id))
            job.size += 1
            left -= job.gpus(1)

        def gain_per_gpu(job: _Sized) -> float:
            gain = job.remaining(job.size) - job.remaining(job.size + 1)
            if job.running and job.size == job.current:
                gain -= p.restart_cost_s  # this worker restarts the job
            return gain / job.gpus(1)

        while True:  # then the greatest cut in remaining time per GPU
            growing = [(gain_per_gpu(j), j) for j in order if may_grow(j)]
            growing = [(g, j) for g, j in growing if g > 0]
            if not growing:
                return left
            _, job = max(growing, key=lambda pair: (pair[0], -pair[1].view.job_id))
            job.size += 1
            left -= job.gpus(1)

    # -- placement --------------------------------------------------------------------------------

    def _place(self, snapshot: ClusterSnapshot, order: list[_Sized]) -> Plan:
        preempt = {j.view.job_id for j in order if j.running and j.size == 0}
        after = without_jobs(snapshot, preempt)
        capacity = FreeCapacity.of(after)
        scales: list[ScaleJob] = []
        for job in order:
            if job.running and 0 < job.size < job.current:
                capacity.release_many((w.server_id, w.gpu_indices) for w in _ranked(job)[job.size:])
                kept = tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in _ranked(job)[: job.size])
                scales.append(ScaleJob(job.view.job_id, kept, Reason.SCALED_IN,
                                       f"qos: {job.current} -> {job.size} worker(s); {self._why(job)}"))
        starts: list[StartJob] = []
        pending: list[KeepPending] = []
        for job in order:
            v = job.view
            if not job.running:
                if job.size == 0:
                    pending.append(KeepPending(v.job_id, Reason.WAITING_FOR_GANG,
                                               f"qos: {self._why(job, waiting=True)}"))
                    continue
                workers = None
                for n in range(job.size, v.min_workers - 1, -1):
                    workers = capacity.place_gang(v, n)
                    if workers is not None:
                        break
                if workers is None:
                    pending.append(KeepPending(v.job_id, *capacity.explain_unplaceable(v, v.min_workers)))
                    continue
                job.size = len(workers)
                starts.append(StartJob(v.job_id, workers, Reason.PLACED,
                                       f"qos: {len(workers)} worker(s); {self._why(job)}"))
            elif job.size > job.current:
                kept = tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in _ranked(job))
                same_type = (snapshot.server(kept[0].server_id).gpu_type,)  # a job's workers share one GPU type
                for extra in range(job.size - job.current, 0, -1):
                    new = capacity.place_gang(v, extra, first_rank=job.current, gpu_types=same_type)
                    if new is not None:
                        job.size = job.current + extra
                        scales.append(ScaleJob(v.job_id, kept + new, Reason.SCALED_OUT,
                                               f"qos: {job.current} -> {job.size} worker(s); {self._why(job)}"))
                        break
        preemptions = tuple(
            PreemptJob(j.view.job_id, Reason.PREEMPTED_BY_POLICY, f"qos: {self._why(j, waiting=True)}")
            for j in sorted(order, key=lambda j: j.view.job_id) if j.view.job_id in preempt)
        return Plan(starts=tuple(starts), scales=tuple(sorted(scales, key=lambda s: s.job_id)),
                    preemptions=preemptions, pending=tuple(pending),
                    loan_note=LoanNote(Reason.NOT_LOANED_BY_POLICY,
                                       f"policy {self.name!r} never loans inference servers to training"))

    def _why(self, job: _Sized, *, waiting: bool = False) -> str:
        """The deadline in numbers: what the job's size (or its wait) means for it."""
        v = job.view
        if job.notes:
            return "; ".join(job.notes)
        if v.deadline is None:
            return ("jobs with deadlines, and shorter jobs without one, hold the GPUs" if waiting
                    else "no deadline; sized by spare GPUs")
        if waiting:
            return f"deadline {clock_time(v.deadline)}; jobs with less slack hold the GPUs"
        slack = job.slack(job.size)
        verdict = "on track" if slack >= 0 else "at risk"
        return (f"{verdict} for its deadline {clock_time(v.deadline)}: predicted finish "
                f"{clock_time(job.finish(job.size))} ({slack:+.0f}s)")


def _ranked(job: _Sized) -> list[WorkerView]:
    return sorted(job.view.workers, key=lambda w: w.rank)


policies.register("qos")(QosPolicy)
