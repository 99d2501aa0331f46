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
GPUs first, take GPUs from the server with the most free first (``core.most_free``).

The registered policy (``OptimusPolicy``) runs the same decision on a ``ClusterSnapshot`` in units of
workers (a job gets its ``min_workers`` gang first, then one worker of ``gpus_per_worker`` GPUs at a time,
up to ``max_workers``), with the snapshot's knowledge instead of the oracle: time per unit of work from
the job's declared throughput points (``core.throughput``), remaining work as every policy estimates it
(``core.throughput.estimate``: ``total_work - work_done``, else the run-time estimate less the work
done). A shrinking job keeps its lowest ranks, a growing one keeps its workers and adds new ones, so no
GPU moves between jobs in a cycle. Like the original it ignores ``min_resize_interval_s``: every cycle may
resize. The simulator's goodput model
(``simulator.goodput_sim``) hands it the oracle's step times and remaining iterations.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduler_service.core.most_free import place_in_order
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import estimate
from scheduler_service.lifecycle import JobState
from scheduler_service.policies.worker_targets import plan_worker_targets


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
        target = optimus_allocate([self._job(j, snapshot.now) for j in active], total)
        return plan_worker_targets(
            snapshot, active, target, who="Optimus", why_waiting="the free GPUs cut other jobs' remaining time more",
            why_shrunk="its others cut other jobs' remaining time more", why_grown="the greatest marginal gain",
            why_preempted="its GPUs cut other jobs' remaining time more")

    def _job(self, job: JobView, now: float) -> OptimusJob:
        # Remaining work as every policy estimates it (``core.throughput.estimate``): declared total work less
        # progress, else the declared (or default) run time at min_workers less the work done so far.
        est = estimate(job, now=now, default_runtime_s=self.params.default_runtime_s, alpha=self.params.amdahl_alpha)
        model = est.model
        return OptimusJob(job.job_id, job.max_workers, est.remaining_work, lambda workers: 1.0 / model.speed(workers),
                          min_units=max(1, job.min_workers), unit_gpus=max(1, job.gpus_per_worker))


policies.register("optimus")(OptimusPolicy)
