"""What a policy decides: a Plan of actions, each carrying a reason code that ends up in the event
log and in ExplainJob. Planning never writes; the applier commits a plan and reports what it refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
    WAITING_FOR_RESERVATION = "WAITING_FOR_RESERVATION"  # GPUs are held for a starving job
    # Why a job started or changed size:
    BACKFILLED = "BACKFILLED"                      # started ahead of a waiting job it does not delay
    RESERVATION_HONOURED = "RESERVATION_HONOURED"  # a starving job got the GPUs held for it
    SCALED_OUT = "SCALED_OUT"                      # spare GPUs cut its completion time most
    SCALED_IN = "SCALED_IN"                        # its extra workers were worth more elsewhere
    SCALED_IN_FOR_BASE_DEMAND = "SCALED_IN_FOR_BASE_DEMAND"  # a queued job's minimum needed them
    SCALED_IN_FOR_RECLAIM = "SCALED_IN_FOR_RECLAIM"  # its loaned server went back to inference
    PREEMPTED_FOR_RECLAIM = "PREEMPTED_FOR_RECLAIM"  # reclaim left it below min_workers
    # Servers and loans:
    LOANED_IDLE_SERVER = "LOANED_IDLE_SERVER"      # inference had more servers than it needed
    LOAN_ACTIVE = "LOAN_ACTIVE"                    # drained: training may use it now
    LOAN_CANCELLED = "LOAN_CANCELLED"              # demand rose while it was still draining
    RECLAIMED_FOR_INFERENCE = "RECLAIMED_FOR_INFERENCE"  # inference demand rose
    RETURNED_TO_SERVING = "RETURNED_TO_SERVING"    # vacated by training: serving again
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
class ScaleJob:
    """Restart a running elastic job at a new world size. ``workers`` is its complete new placement
    (ranks 0..n-1); a worker that stays keeps its server and GPUs. Shrinking drops the highest ranks."""

    job_id: int
    workers: tuple[WorkerPlacement, ...]
    reason: Reason
    message: str


def releases_gpus(held: Iterable[tuple[str, int]], scale: ScaleJob) -> bool:
    """Does ``scale`` give up any GPU its job holds now (``held``: (server, gpu) pairs)? Such scales
    are applied before the plan's starts -- whatever their worker count -- since a start may have
    been planned onto exactly those GPUs."""
    kept = {(w.server_id, g) for w in scale.workers for g in w.gpu_indices}
    return any(pair not in kept for pair in held)


@dataclass(frozen=True, slots=True)
class PreemptJob:
    """Stop every worker of a running job and requeue it; it resumes from its checkpoint."""

    job_id: int
    reason: Reason
    message: str


class LoanStep(StrEnum):
    LOAN = "LOAN"          # SERVING -> DRAINING: the router stops sending it new requests
    ACTIVATE = "ACTIVATE"  # DRAINING -> LOANED: drained; training may be placed on it
    CANCEL = "CANCEL"      # DRAINING -> SERVING: demand rose before the loan began
    RECLAIM = "RECLAIM"    # LOANED -> RECLAIMING: its workers are stopped by this same plan
    RETURN = "RETURN"      # RECLAIMING -> SERVING: the agent confirmed it runs no training


@dataclass(frozen=True, slots=True)
class ServerAction:
    """A step of the loan cycle for one inference server; ``kind`` says which (see ``LoanStep``)."""

    server_id: str
    kind: LoanStep
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
    """Applied in this order, so GPUs freed by one action can be used by a later one: ACTIVATE loan
    steps; preemptions; scales that release GPUs (``releases_gpus``); starts; the other scales; then
    the other loan steps."""

    starts: tuple[StartJob, ...] = ()
    scales: tuple[ScaleJob, ...] = ()
    preemptions: tuple[PreemptJob, ...] = ()
    server_actions: tuple[ServerAction, ...] = ()
    pending: tuple[KeepPending, ...] = ()

    @property
    def is_empty(self) -> bool:
        return not (self.starts or self.scales or self.preemptions or self.server_actions or self.pending)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What the applier committed, and what it refused (job or server id, why) after re-checking
    fresh state."""

    started: tuple[int, ...]
    rejected: tuple[tuple[int | str, str], ...]
    touched_servers: frozenset[str]
    scaled: tuple[int, ...] = ()
    preempted: tuple[int, ...] = ()
    server_steps: tuple[tuple[str, str], ...] = ()  # (server id, LoanStep)


Action = StartJob | ScaleJob | PreemptJob | ServerAction


def apply_order(plan: Plan, held: Mapping[int, Iterable[tuple[str, int]]]) -> tuple[Action, ...]:
    """The plan's actions in the order every applier (service and simulator) applies them, so GPUs
    freed by one action can serve a later one: ACTIVATE loan steps (a start may land on the newly
    loaned server); preemptions; scales that release GPUs (``held``: each job's (server, gpu) pairs
    now); starts; the other scales; the other loan steps."""
    releasing = {s.job_id for s in plan.scales if releases_gpus(held.get(s.job_id, ()), s)}
    activations = tuple(a for a in plan.server_actions if a.kind == LoanStep.ACTIVATE)
    return (
        *activations,
        *plan.preemptions,
        *(s for s in plan.scales if s.job_id in releasing),
        *plan.starts,
        *(s for s in plan.scales if s.job_id not in releasing),
        *(a for a in plan.server_actions if a.kind != LoanStep.ACTIVATE),
    )


@dataclass
class ApplyLog:
    """What an applier committed so far, action by action; ``result()`` freezes it."""

    started: list[int] = field(default_factory=list)
    scaled: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    server_steps: list[tuple[str, str]] = field(default_factory=list)
    rejected: list[tuple[int | str, str]] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)

    def applied(self, action: Action, servers: Iterable[str]) -> None:
        self.touched.update(servers)
        if isinstance(action, StartJob):
            self.started.append(action.job_id)
        elif isinstance(action, ScaleJob):
            self.scaled.append(action.job_id)
        elif isinstance(action, PreemptJob):
            self.preempted.append(action.job_id)
        else:
            self.server_steps.append((action.server_id, str(action.kind)))

    def refused(self, action: Action, why: str) -> None:
        self.rejected.append((action.server_id if isinstance(action, ServerAction) else action.job_id, why))

    @property
    def changed(self) -> bool:
        return bool(self.started or self.scaled or self.preempted or self.server_steps)

    def result(self) -> ApplyResult:
        return ApplyResult(
            tuple(self.started), tuple(self.rejected), frozenset(self.touched), scaled=tuple(self.scaled),
            preempted=tuple(self.preempted), server_steps=tuple(self.server_steps),
        )
