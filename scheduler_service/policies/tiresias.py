"""``tiresias``: Tiresias (Gu et al., NSDI'19) as the Pollux study ran it -- two-queue discretised
least-attained-service (2D-LAS), strict gangs of the requested GPUs, no elasticity, no loaning.

The decision (``tiresias_decide``, pure, state in and out):

- a job enters queue 0 when first seen, and moves to the back of queue 1 once its attained service --
  seconds it has been running times its GPUs -- reaches ``queue_threshold_gpu_s`` (16 GPU-hours, the
  Pollux study's threshold); it never comes back (the starvation promotion of the original is off, as in
  that study);
- queue 0 before queue 1, each in its order: a job runs if its whole gang fits in the GPUs not yet given
  to a job before it (later, smaller jobs may skip ahead of one that does not fit); a running job that
  no longer fits is preempted;
- a job that starts takes GPUs from the server with the most free GPUs first (``core.most_free``);
  a running job keeps its GPUs.

Service is counted from the cycles' own times: a job running at one cycle is credited, at the next, with
the time between them (so the restart delay after a start counts as service, as in the study).

The registered policy (``TiresiasPolicy``) runs the same decision on a ``ClusterSnapshot``. The snapshot
has no attained-service history, so it rebuilds the state each cycle: attained service is approximated
by ``(now - started_at) x GPUs`` for every job that has started (so time queued again after a preemption
counts as service), 0 for one never started, and queue 1 is ordered by submission (not by demotion
time). The simulator's goodput model (``simulator.goodput_sim``)
keeps the exact state between cycles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import KeepPending, Plan, PreemptJob, Reason, StartJob
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, without_jobs
from scheduler_service.lifecycle import JobState

QUEUE_THRESHOLD_GPU_S = 16 * 3600.0


@dataclass(frozen=True, slots=True)
class TiresiasJob:
    key: int
    gpus: int  # the gang: all or nothing


@dataclass(frozen=True, slots=True)
class TiresiasState:
    """What the policy remembers between cycles: the two queues (in order), who ran after the last
    cycle, each job's running seconds, and when each was last looked at."""

    queue0: tuple[int, ...] = ()
    queue1: tuple[int, ...] = ()
    running: frozenset[int] = frozenset()
    executed_s: Mapping[int, float] = field(default_factory=dict)
    last_seen: Mapping[int, float] = field(default_factory=dict)


def tiresias_decide(state: TiresiasState, jobs: Sequence[TiresiasJob], now: float, total_gpus: int, *,
                    queue_threshold_gpu_s: float = QUEUE_THRESHOLD_GPU_S) -> tuple[TiresiasState, list[int]]:
    """The jobs (keys, in queue order) that run from ``now``, and the state to hand to the next cycle.
    ``jobs``: the active jobs in arrival order; a job absent from it has completed and is forgotten."""
    active = {j.key: j for j in jobs}
    queue0 = [k for k in state.queue0 if k in active]
    queue1 = [k for k in state.queue1 if k in active]
    known = set(queue0) | set(queue1)
    queue0.extend(j.key for j in jobs if j.key not in known)
    executed = {k: v for k, v in state.executed_s.items() if k in active}
    last_seen = {k: v for k, v in state.last_seen.items() if k in active}
    demoted: list[int] = []
    in_queue0 = set(queue0)
    for job in jobs:
        since = now - last_seen.get(job.key, 0.0)
        last_seen[job.key] = now
        if job.key in state.running:
            executed[job.key] = executed.get(job.key, 0.0) + since
            if job.key in in_queue0 and executed[job.key] * job.gpus >= queue_threshold_gpu_s:
                demoted.append(job.key)
    if demoted:
        gone = set(demoted)
        queue0 = [k for k in queue0 if k not in gone]
        queue1.extend(demoted)
    free = total_gpus
    running: list[int] = []
    for key in (*queue0, *queue1):
        if active[key].gpus <= free:
            running.append(key)
            free -= active[key].gpus
    new_state = replace(state, queue0=tuple(queue0), queue1=tuple(queue1), running=frozenset(running),
                        executed_s=executed, last_seen=last_seen)
    return new_state, running


# --------------------------------------------------------------------------------------------------
# The registered policy, on a ClusterSnapshot
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TiresiasPolicy:
    """Uses none of the tunables in PolicyParams; jobs run at ``min_workers`` (their gang)."""

    name: str = "tiresias"
    queue_threshold_gpu_s: float = QUEUE_THRESHOLD_GPU_S

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        active = sorted((j for j in snapshot.jobs if j.state in (JobState.PENDING, JobState.RUNNING)),
                        key=lambda j: (j.submitted_at, j.job_id))
        running_now = {j.job_id: j for j in active if j.state == JobState.RUNNING}
        # Every job that ever ran, queued again or not: a demoted job stays in queue 1 (were a requeued
        # one back in queue 0, it would preempt the queue-1 job that ran instead, and be demoted again).
        executed = {j.job_id: _attained_s(j, snapshot.now) for j in active}
        total = sum(len(s.healthy_gpus) for s in snapshot.servers if s.runs_training and not s.cordoned)
        queue1 = tuple(j.job_id for j in active
                       if executed.get(j.job_id, 0.0) * _gang_gpus(j) >= self.queue_threshold_gpu_s)
        queue0 = tuple(j.job_id for j in active if j.job_id not in set(queue1))
        state = TiresiasState(queue0, queue1, frozenset(running_now), executed,
                              {k: snapshot.now for k in running_now})
        _, run = tiresias_decide(state, [TiresiasJob(j.job_id, _gang_gpus(j)) for j in active], snapshot.now,
                                 total, queue_threshold_gpu_s=self.queue_threshold_gpu_s)
        chosen = set(run)
        by_id = {j.job_id: j for j in active}
        preemptions = tuple(PreemptJob(k, Reason.PREEMPTED_BY_POLICY, "Tiresias: a job earlier in the 2D-LAS queues "
                                                            "needs its GPUs")
                            for k in sorted(running_now) if k not in chosen)
        after = without_jobs(snapshot, {p.job_id for p in preemptions})
        capacity = FreeCapacity.of(after)
        starts: list[StartJob] = []
        pending: list[KeepPending] = []
        for key in run:
            job = by_id[key]
            if key in running_now:
                continue
            workers = capacity.place_gang(job, job.min_workers)
            if workers is None:
                reason, message = capacity.explain_unplaceable(job, job.min_workers)
                pending.append(KeepPending(key, reason, message))
                continue
            starts.append(StartJob(key, workers, Reason.PLACED, f"Tiresias: {len(workers)} worker(s), "
                                   f"queue {0 if key not in set(queue1) else 1}"))
        for job in active:
            if job.job_id not in chosen and job.state == JobState.PENDING:
                pending.append(KeepPending(job.job_id, Reason.WAITING_FOR_GANG,
                                           f"Tiresias: {_gang_gpus(job)} GPUs needed at once; jobs earlier in "
                                           "the 2D-LAS queues hold the GPUs"))
        return Plan(starts=tuple(starts), preemptions=preemptions, pending=tuple(pending))


def _gang_gpus(job: JobView) -> int:
    return job.min_workers * job.gpus_per_worker


def _attained_s(job: JobView, now: float) -> float:
    """Running seconds, approximated by the time since the first start (the snapshot keeps no history
    of service: the time queued again after a preemption counts too); 0 for a job never started."""
    return max(0.0, now - (job.started_at if job.started_at is not None else now))


policies.register("tiresias")(lambda params: TiresiasPolicy())
