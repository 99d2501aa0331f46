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

The registered policy (``OptimusPolicy``) runs the same decision on a ``ClusterSnapshot``, with the
snapshot's knowledge instead of the oracle: step time per unit of work from the job's declared
throughput points (``core.throughput``), remaining work ``total_work - work_done`` (or the policy's
run-time estimate), workers within ``min_workers..max_workers``. The simulator's goodput model
(``simulator.goodput_sim``) hands it the oracle's step times and remaining iterations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import KeepPending, Plan, PreemptJob, Reason, ScaleJob, StartJob
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import ThroughputModel
from scheduler_service.lifecycle import JobState
from scheduler_service.policies.tiresias import _without, place_most_free


@dataclass(frozen=True, slots=True)
class OptimusJob:
    key: int
    max_gpus: int
    remaining: float                    # remaining steps (any unit the step time is per)
    step_time: Callable[[int], float]   # seconds per step on n GPUs


def optimus_allocate(jobs: Sequence[OptimusJob], total_gpus: int) -> dict[int, int]:
    """GPUs per job (module doc); ``jobs`` in arrival order."""
    free = total_gpus
    count: dict[int, int] = {}
    gain: dict[int, float] = {}
    by_key = {j.key: j for j in jobs}

    def marginal(job: OptimusJob) -> float:
        n = count[job.key]
        if n + 1 > job.max_gpus or free < 1:
            return 0.0
        return (job.step_time(n) - job.step_time(n + 1)) * job.remaining

    for job in jobs:
        if free < 1:
            count[job.key], gain[job.key] = 0, 0.0
            continue
        count[job.key] = 1
        free -= 1
        gain[job.key] = marginal(job)
    while free > 0 and gain and max(gain.values()) > 0:
        key = max(gain, key=lambda k: gain[k])
        count[key] += 1
        gain[key] = marginal(by_key[key])  # (judged on the GPUs free before this one is taken)
        free -= 1
    return count


def optimus_place(count: Mapping[int, int], previous: Mapping[int, list[int]], capacity: Mapping[int, int]
                  ) -> dict[int, list[int]]:
    """Each job's GPUs (one server id per GPU), given its GPU ``count``, the ``previous`` placement and
    the GPUs per server (``capacity``, in server order)."""
    kept = {k: list(v) for k, v in previous.items() if count.get(k, 0) == len(v) and v}
    free = dict(capacity)
    for servers in kept.values():
        for s in servers:
            free[s] -= 1
    free = {s: n for s, n in free.items() if n > 0}
    placed = dict(kept)
    for key in sorted(count, key=lambda k: count[k]):
        if count[key] > 0 and key not in placed:
            placed[key] = place_most_free(free, count[key])
    return placed


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
        gpw = {j.job_id: max(1, j.gpus_per_worker) for j in active}
        decision = optimus_allocate([self._job(j, gpw[j.job_id]) for j in active], total)
        # Whole workers only, and at least a gang of min_workers (a smaller share waits).
        target = {j.job_id: decision[j.job_id] // gpw[j.job_id] for j in active}
        target = {k: (w if w >= _job(active, k).min_workers else 0) for k, w in target.items()}
        by_id = {j.job_id: j for j in active}
        changed = {k for k, j in by_id.items() if j.state == JobState.RUNNING and target[k] != j.num_workers}
        preempt = {k for k in changed if target[k] == 0}
        resized = changed - preempt
        after = _without(snapshot, changed)
        capacity = FreeCapacity.of(after)
        starts: list[StartJob] = []
        scales: list[ScaleJob] = []
        pending: list[KeepPending] = []
        for job in sorted(active, key=lambda j: (target[j.job_id], j.submitted_at, j.job_id)):
            key, workers_wanted = job.job_id, target[job.job_id]
            if workers_wanted == 0 or (job.state == JobState.RUNNING and key not in changed):
                if job.state == JobState.PENDING:
                    pending.append(KeepPending(key, Reason.WAITING_FOR_GANG, "Optimus: every free GPU cuts "
                                               "other jobs' remaining time more"))
                continue
            workers = capacity.place_gang(job, workers_wanted)
            if workers is None:
                if key in resized:
                    preempt.add(key)
                reason, message = capacity.explain_unplaceable(job, workers_wanted)
                pending.append(KeepPending(key, reason, message))
                continue
            if key in resized:
                grew = workers_wanted > job.num_workers
                scales.append(ScaleJob(key, workers, Reason.SCALED_OUT if grew else Reason.SCALED_IN,
                                       f"Optimus: {workers_wanted} worker(s), greatest marginal gain"))
            else:
                starts.append(StartJob(key, workers, Reason.PLACED, f"Optimus: {workers_wanted} worker(s)"))
        preemptions = tuple(PreemptJob(k, Reason.SCALED_IN, "Optimus: its GPUs cut other jobs' remaining "
                                                            "time more") for k in sorted(preempt))
        return Plan(starts=tuple(starts), scales=tuple(scales), preemptions=preemptions, pending=tuple(pending))

    def _job(self, job: JobView, gpus_per_worker: int) -> OptimusJob:
        model = ThroughputModel(job.throughput_points, self.params.amdahl_alpha)
        if job.total_work > 0 and job.throughput_points:
            remaining = max(job.total_work - job.work_done, 0.0)
        else:  # relative speeds: remaining = seconds at min_workers, scaled by the speed there
            runtime = job.estimated_runtime_s or self.params.default_runtime_s
            remaining = runtime * model.speed(max(1, job.min_workers))

        def seconds_per_unit(gpus: int) -> float:
            workers = gpus // gpus_per_worker
            if workers >= 1:
                return 1.0 / model.speed(workers)
            return gpus_per_worker / (max(gpus, 1) * model.speed(1))  # part of a worker: proportional

        return OptimusJob(job.job_id, job.max_workers * gpus_per_worker, remaining, seconds_per_unit)


def _job(jobs: Sequence[JobView], key: int) -> JobView:
    return next(j for j in jobs if j.job_id == key)


policies.register("optimus")(OptimusPolicy)
