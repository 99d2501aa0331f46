"""``optimus``: Optimus (Peng et al., EuroSys'18) in the Pollux study's "Optimus+Oracle" variant --
greedy allocation by marginal gain in remaining time, with the true step times and the true remaining
iterations known (the oracle), batch sizes fixed as submitted.

The decision (``optimus_allocate``, pure):

- every active job gets one GPU, in arrival order, while GPUs last (the rest get none this cycle);
- then, one GPU at a time, the job whose remaining time falls most by one more GPU gets it:
  ``(t(n) - t(n + 1)) x remaining``, with ``t(n)`` its step time on ``n`` GPUs and ``remaining`` its
  remaining steps; ties go to the earlier job; up to each job's ``max_gpus``; it stops when no job
  gains or no GPU is left.

Placement (``optimus_place``): a job whose GPU count is unchanged keeps its GPUs; the others, fewest
GPUs first, take GPUs from the server with the most free first (``tiresias.place_most_free``).

The registered policy (``OptimusPolicy``) runs the same decision on a ``ClusterSnapshot`` in units of
workers (a job gets its ``min_workers`` gang first, then one worker of ``gpus_per_worker`` GPUs at a time,
up to ``max_workers``), with the snapshot's knowledge instead of the oracle: time per unit of work from
the job's declared throughput points (``core.throughput``), remaining work ``total_work - work_done`` (or
the policy's run-time estimate). A shrinking job keeps its lowest ranks, a growing one keeps its workers
and adds new ones, so no GPU moves between jobs in a cycle. Like the original it ignores
``min_resize_interval_s``: every cycle may resize. The simulator's goodput model
(``simulator.goodput_sim``) hands it the oracle's step times and remaining iterations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import KeepPending, Plan, PreemptJob, Reason, ScaleJob, StartJob, WorkerPlacement
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import ThroughputModel
from scheduler_service.lifecycle import JobState
from scheduler_service.policies.tiresias import _without, place_in_order


@dataclass(frozen=True, slots=True)
class OptimusJob:
    """One job as Optimus sees it, in *units* of allocation (GPUs in the Pollux study; workers of
    ``gpus_per_worker`` GPUs for the registered policy)."""

    key: int
    max_units: int
    remaining: float                    # remaining steps (any unit the step time is per)
    step_time: Callable[[int], float]   # seconds per step on n units
    min_units: int = 1                  # the least it runs on (a gang); fewer: none
    unit_gpus: int = 1                  # GPUs per unit


def optimus_allocate(jobs: Sequence[OptimusJob], total_gpus: int) -> dict[int, int]:
    """Units per job (module doc); ``jobs`` in arrival order."""
    free = total_gpus
    count: dict[int, int] = {}
    gain: dict[int, float] = {}
    by_key = {j.key: j for j in jobs}

    def marginal(job: OptimusJob) -> float:
        n = count[job.key]
        if n + 1 > job.max_units or free < job.unit_gpus:
            return 0.0
        return (job.step_time(n) - job.step_time(n + 1)) * job.remaining

    for job in jobs:
        need = job.min_units * job.unit_gpus
        if need > free:
            count[job.key], gain[job.key] = 0, 0.0
            continue
        count[job.key] = job.min_units
        free -= need
        gain[job.key] = marginal(job)
    while free > 0 and gain and max(gain.values()) > 0:
        key = max(gain, key=lambda k: gain[k])
        count[key] += 1
        gain[key] = marginal(by_key[key])  # (judged on the GPUs free before this unit is taken)
        free -= by_key[key].unit_gpus
    return count


def optimus_place(count: Mapping[int, int], previous: Mapping[int, list[int]], capacity: Mapping[int, int]
                  ) -> dict[int, list[int]]:
    """Each job's GPUs (one server id per GPU), given its GPU ``count``, the ``previous`` placement and
    the GPUs per server (``capacity``, in server order)."""
    kept = {k: list(v) for k, v in previous.items() if count.get(k, 0) == len(v) and v}
    return place_in_order(sorted(count, key=lambda k: count[k]), count, kept, capacity)


# --------------------------------------------------------------------------------------------------
# The registered policy, on a ClusterSnapshot
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimusPolicy:
    """Uses ``default_runtime_s`` and ``amdahl_alpha`` (for jobs that declare no points or work)."""

    params: PolicyParams
    name: str = "optimus"

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        active = sorted((j for j in snapshot.jobs if j.state in (JobState.PENDING, JobState.RUNNING)),
                        key=lambda j: (j.submitted_at, j.job_id))
        total = sum(len(s.healthy_gpus) for s in snapshot.servers if s.runs_training and not s.cordoned)
        target = optimus_allocate([self._job(j) for j in active], total)
        running = [j for j in active if j.state == JobState.RUNNING]
        preempt = {j.job_id for j in running if target[j.job_id] == 0}
        shrink = {j.job_id: target[j.job_id] for j in running if 0 < target[j.job_id] < j.num_workers}
        # Preempted jobs free all their GPUs, shrinking ones their highest ranks; a growing job keeps its
        # workers and adds new ones on GPUs free after those -- so no GPU moves in a cycle.
        after = _without(snapshot, preempt)
        capacity = FreeCapacity.of(after)
        for job in running:
            if job.job_id in shrink:
                capacity.release_many((w.server_id, w.gpu_indices) for w in job.workers[shrink[job.job_id]:])
        starts: list[StartJob] = []
        scales: list[ScaleJob] = []
        pending: list[KeepPending] = []
        for job in running:
            if job.job_id in shrink:
                kept = tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices)
                             for w in job.workers[: shrink[job.job_id]])
                scales.append(ScaleJob(job.job_id, kept, Reason.SCALED_IN,
                                       f"Optimus: {len(kept)} worker(s); its others cut other jobs' remaining "
                                       "time more"))
        for job in sorted(active, key=lambda j: (target[j.job_id], j.submitted_at, j.job_id)):
            key, wanted = job.job_id, target[job.job_id]
            if job.state == JobState.PENDING:
                workers = capacity.place_gang(job, wanted) if wanted else None
                if workers is not None:
                    starts.append(StartJob(key, workers, Reason.PLACED, f"Optimus: {wanted} worker(s)"))
                elif wanted:
                    pending.append(KeepPending(key, *capacity.explain_unplaceable(job, wanted)))
                else:
                    pending.append(KeepPending(key, Reason.WAITING_FOR_GANG, "Optimus: the free GPUs cut other "
                                               "jobs' remaining time more"))
            elif wanted > job.num_workers:
                extra = capacity.place_gang(job, wanted - job.num_workers, first_rank=job.num_workers)
                if extra is not None:
                    kept = tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in job.workers)
                    scales.append(ScaleJob(key, kept + extra, Reason.SCALED_OUT,
                                           f"Optimus: {wanted} worker(s), the greatest marginal gain"))
        preemptions = tuple(PreemptJob(k, Reason.PREEMPTED_BY_POLICY, "Optimus: its GPUs cut other jobs' remaining "
                                                            "time more") for k in sorted(preempt))
        return Plan(starts=tuple(starts), scales=tuple(scales), preemptions=preemptions, pending=tuple(pending))

    def _job(self, job: JobView) -> OptimusJob:
        model = ThroughputModel(job.throughput_points, self.params.amdahl_alpha)
        if job.total_work > 0 and job.throughput_points:
            remaining = max(job.total_work - job.work_done, 0.0)
        else:  # relative speeds: remaining = seconds at min_workers, scaled by the speed there
            runtime = job.estimated_runtime_s or self.params.default_runtime_s
            remaining = runtime * model.speed(max(1, job.min_workers))
        return OptimusJob(job.job_id, job.max_workers, remaining, lambda workers: 1.0 / model.speed(workers),
                          min_units=max(1, job.min_workers), unit_gpus=max(1, job.gpus_per_worker))


policies.register("optimus")(OptimusPolicy)
