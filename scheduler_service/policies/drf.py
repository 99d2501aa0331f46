"""``drf``: Dominant Resource Fairness (Ghodsi et al., NSDI'11), the fairness baseline of DL2 (Peng et al.,
2019), over GPUs between users, then between each user's jobs.

GPUs are the only resource Aryl allocates, so a user's dominant share is its share of the GPUs, and DRF
is *progressive filling* (max-min fairness) of GPUs. The decision (``drf_allocate``, pure):

- every cycle starts from nothing (running jobs included: DRF reallocates each round);
- repeatedly, the user with the fewest GPUs given so far gets one more *unit* -- for its job with the
  fewest GPUs so far -- as long as it fits in the GPUs left. A job's first unit is its whole gang
  (``min_workers`` workers: gangs are all or nothing), each later unit one more worker, up to
  ``max_workers`` (an inelastic job, ``min == max``, takes one unit). So elastic jobs grow one worker at
  a time, interleaved fairly with every other user's jobs, while GPUs last;
- ties: between users, the fewer GPUs, then the user whose earliest active job was submitted first, then
  the user's name; between one user's jobs, the fewer GPUs, then earlier submission, then job id;
- a unit that does not fit in the GPUs left is skipped, and that job gets nothing more this cycle
  (another, smaller one of the same user may still fit); a user none of whose jobs can take a unit is
  done. It ends when every user is done.

Counts are checked against the total of GPUs; where a worker goes is the core's placement
(``worker_targets.plan_worker_targets``: a fragmented cluster may leave a counted job pending, with the
placement's explanation).

Users: a job's user is ``JobView.user`` (the service's snapshot carries the job's owner; a simulated
trace job carries its ``user`` column). A job without one (a trace without users) counts as its own
user, so DRF is then between jobs.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler_service.core.plan import Plan
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.policies.worker_targets import active_jobs, plan_worker_targets, training_gpus


@dataclass(frozen=True, slots=True)
class DrfJob:
    """One job as DRF sees it, in workers of ``gpus_per_worker`` GPUs."""

    key: int
    user: str
    submitted_at: float
    gpus_per_worker: int
    min_workers: int
    max_workers: int


def drf_allocate(jobs: Sequence[DrfJob], total_gpus: int) -> dict[int, int]:
    """Workers per job (0 or ``min_workers..max_workers``), by progressive filling (module doc)."""
    workers = {j.key: 0 for j in jobs}
    by_user: dict[str, list[DrfJob]] = {}
    for job in jobs:
        by_user.setdefault(job.user, []).append(job)
    free = total_gpus
    # Per user: a heap of its jobs still able to grow, keyed (GPUs given, submitted_at, key).
    job_heaps: dict[str, list[tuple[int, float, int]]] = {}
    for user, own in by_user.items():
        job_heaps[user] = [(0, j.submitted_at, j.key) for j in own if j.max_workers > 0]
        heapq.heapify(job_heaps[user])
    by_key = {j.key: j for j in jobs}
    first = {user: min(j.submitted_at for j in own) for user, own in by_user.items()}
    users = [(0, first[u], u) for u in sorted(by_user)]
    heapq.heapify(users)
    while users and free > 0:
        share, since, user = heapq.heappop(users)
        heap = job_heaps[user]
        while heap:
            gpus, submitted, key = heapq.heappop(heap)
            job = by_key[key]
            unit = job.min_workers if workers[key] == 0 else 1
            if unit * job.gpus_per_worker > free:
                continue  # does not fit: this job is done for the cycle
            workers[key] += unit
            free -= unit * job.gpus_per_worker
            if workers[key] < job.max_workers:
                heapq.heappush(heap, (gpus + unit * job.gpus_per_worker, submitted, key))
            heapq.heappush(users, (share + unit * job.gpus_per_worker, since, user))
            break
        # (a user whose heap emptied without a grant is done: not pushed back)
    return workers


def user_of(job: JobView) -> str:
    """The job's user, or the job itself when it has none (module doc)."""
    return job.user or f"job:{job.job_id}"


@dataclass(frozen=True)
class DrfPolicy:
    """Uses none of the tunables in PolicyParams (like ``optimus``, it ignores ``min_resize_interval_s``:
    every cycle is a new round of filling)."""

    name: str = "drf"

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        active = active_jobs(snapshot)
        jobs = [DrfJob(j.job_id, user_of(j), j.submitted_at, max(1, j.gpus_per_worker), max(1, j.min_workers),
                       j.max_workers) for j in active]
        target = drf_allocate(jobs, training_gpus(snapshot))
        return plan_worker_targets(snapshot, active, target, who="DRF",
                                   why_waiting="no fair share left for its gang this round")


policies.register("drf")(lambda params: DrfPolicy())
