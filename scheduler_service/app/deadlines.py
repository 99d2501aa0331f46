"""Deadlines for users: each job's predicted finish and where it stands against its deadline
(``core.predict``), and SubmitJob's admission feedback (``scheduling.deadline_admission``).

The prediction is made on the same ``JobView`` the policies decide on: ``job_view`` builds it from a
stored job, ``submission_view`` from a job not queued yet. *The most workers a job could have* is its
``max_workers`` capped by what the registered servers would hold were they all free (the count
SubmitJob's never-fits check uses, ``core.fit``): optimistic on a busy cluster, and said so.

Never: write, or hold SQL (``store.jobs`` reads the servers' sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from scheduler_service.core.clock import Clock
from scheduler_service.core.predict import (
    DEFAULT_ALPHA,
    DeadlineOutlook,
    DeadlineStatus,
    admission_outlook,
    deadline_outlook,
)
from scheduler_service.core.snapshot import JobView, WorkerView
from scheduler_service.errors import FailedPrecondition
from scheduler_service.lifecycle import JobState
from scheduler_service.records import JobInfo, JobSubmission
from scheduler_service.store.jobs import JobStore
from scheduler_service.store.snapshot import progress_window
from scheduler_service.store.transactions import Transactions


class DeadlineAdmission(StrEnum):
    """What SubmitJob does with a job's deadline (``scheduling.deadline_admission``)."""

    OFF = "off"        # nothing: no prediction in the answer
    WARN = "warn"      # answers with the predicted finish and whether the deadline looks feasible
    REJECT = "reject"  # as WARN, and refuses a job that would miss it even at its most workers


class Deadlines:
    def __init__(self, db: Transactions, clock: Clock, *, admission: DeadlineAdmission = DeadlineAdmission.WARN,
                 alpha: float = DEFAULT_ALPHA) -> None:
        self._db = db
        self._clock = clock
        self._admission = admission
        self._alpha = alpha

    def outlooks(self, jobs: Sequence[JobInfo]) -> dict[int, DeadlineOutlook]:
        """Each job's outlook (``core.predict.deadline_outlook``), by id. The servers' sizes are read only
        when a job still running or waiting has a deadline."""
        now = self._clock.now()
        sizes = self._server_sizes() if any(j.deadline is not None and not j.state.is_terminal for j in jobs) else []
        return {
            j.id: deadline_outlook(job_view(j), now, finished_at=j.finished_at, alpha=self._alpha,
                                   most_workers=_most_workers(sizes, j.gpus_per_worker, j.max_workers))
            for j in jobs
        }

    def admit(self, sub: JobSubmission) -> DeadlineOutlook | None:
        """The admission feedback on ``sub`` (None with ``deadline_admission = off``); FailedPrecondition
        with ``reject`` when it would miss its deadline even at the most workers it could have."""
        if self._admission == DeadlineAdmission.OFF:
            return None
        now = self._clock.now()
        sizes = self._server_sizes() if sub.deadline is not None else []
        most = _most_workers(sizes, sub.gpus_per_worker, sub.max_workers)
        outlook = admission_outlook(submission_view(sub, now), now, most, alpha=self._alpha)
        if self._admission == DeadlineAdmission.REJECT and outlook.status == DeadlineStatus.WILL_MISS:
            raise FailedPrecondition(
                f"job {sub.name!r} {outlook.note} (scheduling.deadline_admission = reject); set a later deadline, "
                "or raise max_workers if the job scales further")
        return outlook

    def _server_sizes(self) -> list[int]:
        return self._db.read(JobStore.server_gpu_counts)


def _most_workers(server_gpus: Sequence[int], gpus_per_worker: int, max_workers: int) -> int:
    """``max_workers``, capped by the workers the registered servers hold were they all free (none
    registered: not capped)."""
    if not server_gpus:
        return max_workers
    return min(max_workers, sum(n // gpus_per_worker for n in server_gpus))


def _declared(throughput: dict[str, object]) -> dict[str, object]:
    """JobView's fields of throughput hints as stored (``api.job_validation``'s JSON)."""
    points = throughput.get("points") or ()
    runtime = throughput.get("estimated_runtime_s")
    return dict(
        throughput_points=tuple((int(w), float(s)) for w, s in points),  # type: ignore[attr-defined]
        total_work=float(throughput.get("total_work") or 0.0),  # type: ignore[arg-type]
        estimated_runtime_s=float(runtime) if runtime else None,  # type: ignore[arg-type]
    )


def job_view(job: JobInfo) -> JobView:
    """The policies' view of a stored job, as far as a prediction needs it (its workers' places do not
    matter here, only how many there are)."""
    return JobView(
        job_id=job.id, state=job.state, gpus_per_worker=job.gpus_per_worker, min_workers=job.min_workers,
        max_workers=job.max_workers, priority=job.priority, submitted_at=job.submitted_at,
        workers=tuple(WorkerView(rank, "", ()) for rank in range(job.num_workers)),
        work_done=job.work_done, started_at=job.started_at, last_resized_at=job.last_resized_at,
        deadline=job.deadline, progress_window=progress_window(job), **_declared(job.throughput),  # type: ignore[arg-type]
    )


def submission_view(sub: JobSubmission, now: float) -> JobView:
    """The view of a job about to be queued ``now``."""
    return JobView(
        job_id=0, state=JobState.PENDING, gpus_per_worker=sub.gpus_per_worker, min_workers=sub.min_workers,
        max_workers=sub.max_workers, priority=sub.priority, submitted_at=now, deadline=sub.deadline,
        **_declared(sub.throughput),  # type: ignore[arg-type]
    )
