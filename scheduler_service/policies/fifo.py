"""``fifo``: first come, first served, strict gangs of ``min_workers``, no elasticity, no loaning.

Queue order is priority (higher first), then submission time, then job id. Strict FIFO: once a job
cannot be placed, every later job waits behind it (head-of-line blocking is the point of the
baseline; backfilling is the Aryl policy's job).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import KeepPending, Plan, Reason, StartJob
from scheduler_service.core.quota import QuotaLedger
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView


def queue_order(job: JobView) -> tuple[int, float, int]:
    return (-job.priority, job.submitted_at, job.job_id)


@dataclass(frozen=True)
class FifoPolicy:
    """Uses none of the tunables in PolicyParams."""

    name: str = "fifo"

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        capacity = FreeCapacity.of(snapshot)
        starts: list[StartJob] = []
        pending: list[KeepPending] = []
        blocker: JobView | None = None
        quota = QuotaLedger.of(snapshot)  # queues' quotas (core.quota): a job its queue may not start waits aside
        for job in quota.order(snapshot.pending_jobs(), lambda j: (0, *queue_order(j))):
            verdict = quota.check(job, job.min_workers * job.gpus_per_worker)
            if not verdict.allowed:
                pending.append(KeepPending(job.job_id, verdict.reason or Reason.WAITING_FOR_QUOTA, verdict.message))
                continue
            if blocker is not None:
                pending.append(
                    KeepPending(job.job_id, Reason.BLOCKED_BY_EARLIER_JOB, f"queued behind job {blocker.job_id} (FIFO)")
                )
                continue
            workers = capacity.place_gang(job, job.min_workers)
            if workers is None:
                reason, message = capacity.explain_unplaceable(job, job.min_workers)
                pending.append(KeepPending(job.job_id, reason, message))
                blocker = job
                continue
            quota.charge(job, job.min_workers * job.gpus_per_worker)
            where = ", ".join(sorted({w.server_id for w in workers}))
            starts.append(
                StartJob(job.job_id, workers, Reason.PLACED, f"placed {len(workers)} worker(s) on {where}")
            )
        return Plan(starts=tuple(starts), pending=tuple(pending))


policies.register("fifo")(lambda params: FifoPolicy())
