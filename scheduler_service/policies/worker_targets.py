"""A worker count per job -> a Plan: shared by the policies that decide *how many* workers each job gets
and leave *where* to the core's placement (``optimus``, ``pollux``, ``drf``, ``dl2``).

The rules (one set for all of them, so that comparisons isolate the decision, not its application):

- a running job whose target is 0 is preempted (all its GPUs free), one whose target is below its size
  shrinks to its lowest ranks (its highest ranks' GPUs free);
- then, fewest target workers first (then submission, job id), a pending job with a target starts with
  that many workers as one gang (``FreeCapacity.place_gang``: all or nothing), a running job with a
  larger target keeps its workers and adds new ones on free GPUs. A job that cannot be placed stays as it
  is, with the placement's explanation.

A growing job never releases a GPU and a shrinking one never takes one, so no GPU moves between jobs in
a cycle and the plan always has an apply order. Must never: decide a count (the caller's job).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import attrgetter

from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import KeepPending, Plan, PreemptJob, Reason, ScaleJob, StartJob, WorkerPlacement
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView, without_jobs
from scheduler_service.lifecycle import JobState


def plan_worker_targets(snapshot: ClusterSnapshot, active: Sequence[JobView], target: Mapping[int, int], *,
                        who: str, why_waiting: str, why_shrunk: str = "its others went to other jobs",
                        why_grown: str = "", why_preempted: str = "its GPUs went to other jobs",
                        largest_first: bool = False) -> Plan:
    """The plan that moves ``active`` (PENDING and RUNNING jobs) to ``target`` workers each (0 or
    ``min_workers..max_workers``; a job missing from ``target`` keeps its size). ``who`` prefixes the
    messages (the policy's name); ``why_waiting`` explains a pending job given no workers, ``why_shrunk``
    a smaller one, ``why_grown`` (if any) a larger one, ``why_preempted`` one given none. Starts and
    growth go fewest target workers first, or with ``largest_first`` most first."""
    want = {j.job_id: target.get(j.job_id, j.num_workers) for j in active}
    running = [j for j in active if j.state == JobState.RUNNING]
    preempt = {j.job_id for j in running if want[j.job_id] == 0}
    shrink = {j.job_id: want[j.job_id] for j in running if 0 < want[j.job_id] < j.num_workers}
    capacity = FreeCapacity.of(without_jobs(snapshot, preempt))
    for job in running:
        if job.job_id in shrink:
            capacity.release_many((w.server_id, w.gpu_indices) for w in job.workers[shrink[job.job_id]:])
    starts: list[StartJob] = []
    scales: list[ScaleJob] = []
    pending: list[KeepPending] = []
    for job in running:
        if job.job_id in shrink:
            kept = tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in job.workers[: shrink[job.job_id]])
            scales.append(ScaleJob(job.job_id, kept, Reason.SCALED_IN, f"{who}: {len(kept)} worker(s); {why_shrunk}"))
    sign = -1 if largest_first else 1
    grown = f", {why_grown}" if why_grown else ""
    for job in sorted(active, key=lambda j: (sign * want[j.job_id], j.submitted_at, j.job_id)):
        key, wanted = job.job_id, want[job.job_id]
        if job.state == JobState.PENDING:
            workers = capacity.place_gang(job, wanted) if wanted else None
            if workers is not None:
                starts.append(StartJob(key, workers, Reason.PLACED, f"{who}: {wanted} worker(s)"))
            elif wanted:
                pending.append(KeepPending(key, *capacity.explain_unplaceable(job, wanted)))
            else:
                pending.append(KeepPending(key, Reason.WAITING_FOR_GANG, f"{who}: {why_waiting}"))
        elif job.state == JobState.RUNNING and wanted > job.num_workers:
            extra = capacity.place_gang(job, wanted - job.num_workers, first_rank=job.num_workers)
            if extra is not None:
                kept = tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in job.workers)
                scales.append(ScaleJob(key, kept + extra, Reason.SCALED_OUT, f"{who}: {wanted} worker(s){grown}"))
    preemptions = tuple(PreemptJob(k, Reason.PREEMPTED_BY_POLICY, f"{who}: {why_preempted}") for k in sorted(preempt))
    return Plan(starts=tuple(starts), scales=tuple(scales), preemptions=preemptions, pending=tuple(pending))


def training_servers(snapshot: ClusterSnapshot) -> list[ServerView]:
    """The servers that may run training now (not cordoned)."""
    return [s for s in snapshot.servers if s.runs_training and not s.cordoned]


def training_gpus(snapshot: ClusterSnapshot) -> int:
    """Healthy GPUs on servers that may run training now (not cordoned)."""
    return sum(len(s.healthy_gpus) for s in training_servers(snapshot))


def active_jobs(snapshot: ClusterSnapshot) -> list[JobView]:
    """PENDING and RUNNING jobs in arrival order (submission time, then id)."""
    return sorted([j for j in snapshot.jobs if j.state in _ACTIVE], key=_ARRIVAL)


_ACTIVE = frozenset((JobState.PENDING, JobState.RUNNING))
_ARRIVAL = attrgetter("submitted_at", "job_id")
