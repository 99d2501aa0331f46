"""What a policy decides: a Plan of actions, each carrying a reason code that ends up in the event
log and in ExplainJob. Planning never writes; the applier commits a plan and reports what it refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    """Machine-readable reason codes (stable: users and tools match on them)."""

    SUBMITTED = "SUBMITTED"
    PLACED = "PLACED"
    CANCELLED_BY_USER = "CANCELLED_BY_USER"
    # Why a job is still pending:
    WAITING_FOR_GANG = "WAITING_FOR_GANG"          # not enough free GPUs for min_workers at once
    BLOCKED_BY_EARLIER_JOB = "BLOCKED_BY_EARLIER_JOB"  # FIFO: an earlier job waits first
    NO_TRAINING_CAPACITY = "NO_TRAINING_CAPACITY"  # no schedulable server exists at all
    WORKER_TOO_LARGE = "WORKER_TOO_LARGE"          # no server has gpus_per_worker healthy GPUs
    # Applier refusals:
    STALE_PLAN = "STALE_PLAN"


@dataclass(frozen=True, slots=True)
class WorkerPlacement:
    rank: int
    server_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class StartJob:
    """Start a pending job with these workers (a whole gang: all of them or none)."""

    job_id: int
    workers: tuple[WorkerPlacement, ...]
    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class KeepPending:
    """The job stays queued; ``message`` tells the user why, in numbers."""

    job_id: int
    reason: Reason
    message: str

    @property
    def summary(self) -> str:
        """The text stored as the job's pending reason (and shown by ExplainJob)."""
        return f"{self.reason}: {self.message}"[:1024]


@dataclass(frozen=True, slots=True)
class Plan:
    starts: tuple[StartJob, ...] = ()
    pending: tuple[KeepPending, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not self.starts and not self.pending


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What the applier committed, and what it refused (job id, why) after re-checking fresh state."""

    started: tuple[int, ...]
    rejected: tuple[tuple[int, str], ...]
    touched_servers: frozenset[str]
