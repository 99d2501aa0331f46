"""Plain values that cross the service's layers: what the API hands the use cases (requests it has
already validated) and what the store hands back (facts read from rows, built inside the store).

Nouns: a *submission* is a job as its user asks for it; a *registration* and a *status report* are
what an agent says about its server; ``JobInfo``, ``ServerInfo``, ``LoanInfo``, ``EventInfo`` and
``DemandInfo`` are one row's facts as they were read; a *desired state* is what one server's agent
must run (its workers, at a generation, under the scheduler's epoch).

Never: import SQLAlchemy, the ORM models or protobuf, or decide anything. These are values: frozen,
compared by content, safe to hand to any thread after their transaction has ended.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_service.core.goodput import BatchSplit, GradParams
from scheduler_service.core.snapshot import BatchLimits
from scheduler_service.lifecycle import JobState, Pool, ServerState

# ---------------------------------------------------------------------------------------------
# Inputs (already validated by the API layer)


@dataclass(frozen=True)
class JobSubmission:
    name: str
    user: str
    queue: str
    command: tuple[str, ...]
    env: dict[str, str]
    gpus_per_worker: int
    min_workers: int
    max_workers: int
    priority: int = 0
    deadline: float | None = None
    throughput: dict[str, Any] = field(default_factory=dict)
    max_runtime_s: float | None = None
    restart_policy: str = "ON_FAILURE"
    max_restarts: int = 0
    idempotency_key: str | None = None
    working_dir: str | None = None  # absolute path on the servers; None: the agent's per-job directory
    working_dir_if_exists: bool = False  # working_dir is a default, used only where it exists
    array_index: int | None = None  # an element of a job array (``Jobs.submit_all_or_none``): its index
    priority_class: str = ""  # its priority class's name ("" none) and value (``app.queues.Queues.admit``)
    priority_value: int = 0
    gpu_types: tuple[str, ...] = ()  # GPU types it may run on, preferred first; (): any
    submitted_by: str = ""  # the authenticated caller (role:name) who submitted it: the event's actor
    batch_limits: BatchLimits | None = None  # it adapts its batch size (issue 17); None: it does not


@dataclass(frozen=True)
class JobFilter:
    states: tuple[JobState, ...] = ()
    user: str = ""
    queue: str = ""

    def digest(self) -> str:
        raw = f"{sorted(self.states)}|{self.user}|{self.queue}".encode()
        return hashlib.sha256(raw).hexdigest()[:12]


@dataclass(frozen=True)
class GpuReport:
    index: int
    uuid: str
    model: str
    memory_total_bytes: int


@dataclass(frozen=True)
class ServerRegistration:
    hostname: str
    pool: Pool
    gpus: tuple[GpuReport, ...]
    agent_address: str
    agent_version: str
    logs_address: str = ""
    inference_endpoint: str = ""


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization: float
    memory_used_bytes: int
    temperature_c: float
    healthy: bool
    health_reason: str


@dataclass(frozen=True)
class WorkerReport:
    """One worker as its agent reports it; (job_id, rank, incarnation) identifies it."""

    job_id: int
    rank: int
    incarnation: int
    phase: str  # STARTING, RUNNING, STOPPING, EXITED
    exit_code: int = 0  # with EXITED; negative: killed by that signal
    progress: float = 0.0
    samples_per_second: float = 0.0
    checkpoint_progress: float = 0.0
    message: str = ""
    stop_requested: bool = False  # EXITED because the agent stopped it, not a crash
    cannot_start: bool = False  # EXITED without running, for a reason in the spec (no working_dir there)
    # Goodput measures (``node_agent.contract``, "Progress file"); 0: not reported.
    step_time_s: float = 0.0
    pass_time_s: float = 0.0
    local_batch_size: int = 0
    accum_steps: int = 0
    grad_sqr: float = 0.0
    grad_var: float = 0.0
    samples: float = 0.0
    # Its incarnation's last checkpoint acknowledgement (``node_agent.contract``): the checkpoint at
    # ``ack_checkpoint_progress`` was saved ``ack_checkpoint_age_s`` before this report; and whether
    # it acknowledged the stop the agent is making (which then ended early).
    checkpoint_acked: bool = False
    ack_checkpoint_progress: float = 0.0
    ack_checkpoint_age_s: float = 0.0
    stop_acknowledged: bool = False


@dataclass(frozen=True)
class StatusReport:
    server_id: str
    scheduler_epoch: int
    gpus: tuple[GpuSample, ...]
    observed_generation: int
    workers: tuple[WorkerReport, ...] = ()


# ---------------------------------------------------------------------------------------------
# Results (read from the store)


@dataclass(frozen=True)
class AllocationInfo:
    """One GPU held by one worker (rank) of a job."""

    rank: int
    server_id: str
    gpu_index: int
    allocated_at: float


@dataclass(frozen=True)
class StepTimeInfo:
    """One configuration a job ran at, as its rank 0 measured it last (``store.goodput``)."""

    nodes: int
    replicas: int
    local_batch_size: int
    accum_steps: int
    pass_time_s: float
    step_time_s: float
    measured_at: float
    gpu_type: str = ""  # the model of the GPUs it ran on; "": not known, or a mix of models


@dataclass(frozen=True)
class GoodputInfo:
    """What a job's rank 0 reported for goodput: step times per configuration (oldest measure first),
    its latest gradient statistics (None: none yet) and the samples it processed."""

    step_times: tuple[StepTimeInfo, ...] = ()
    grad: GradParams | None = None
    samples: float = 0.0


@dataclass(frozen=True)
class JobInfo:
    """A job as stored: its spec, its lifecycle state and, where the read asked for them, the GPUs
    its workers hold (in rank, then GPU order)."""

    id: int
    name: str
    user: str
    queue: str
    command: tuple[str, ...]
    env: dict[str, str]
    gpus_per_worker: int
    min_workers: int
    max_workers: int
    priority: int
    deadline: float | None
    throughput: dict[str, Any]
    max_runtime_s: float | None
    restart_policy: str
    max_restarts: int
    idempotency_key: str | None
    state: JobState
    state_reason: str
    state_message: str
    pending_reason: str
    num_workers: int
    restarts: int
    preemptions: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    version: int
    last_resized_at: float | None
    work_done: float
    last_checkpoint_at: float | None
    incarnation: int
    checkpoint_work: float | None
    worker_exits: dict[str, int] | None  # rank (as text) -> exit status, this incarnation's exited workers
    rank_servers: dict[str, str] | None  # rank (as text) -> server of its latest placement
    allocations: tuple[AllocationInfo, ...] = ()
    working_dir: str | None = None
    working_dir_if_exists: bool = False
    size_note: str = ""  # while RUNNING below max_workers: why the policy keeps its size ("REASON: message")
    disruptions: tuple[float, ...] = ()  # when its resizes/preemptions of the last hour were applied (migration 0018)
    # The progress window (``core.snapshot.ProgressWindow``, migration 0009): when progress last changed,
    # and the first report at the window's size (``window_work`` at ``window_at``, ``window_workers`` workers).
    progress_at: float | None = None
    window_work: float | None = None
    window_at: float | None = None
    window_workers: int = 0
    window_reports: int = 0
    array_job_id: int | None = None  # an element of a job array: the array's id (its first job's id) ...
    array_index: int | None = None  # ... and this job's index in it
    priority_class: str = ""  # its priority class (migration 0010) and the class's value at submission
    priority_value: int = 0
    gpu_types: tuple[str, ...] = ()  # GPU types it may run on, preferred first; (): any
    # Goodput (migration 0014): its batch limits, the batch it runs with (a policy's choice, else the
    # default) and for how many GPUs (``core.batch.job_batch``), and what its rank 0 reported.
    batch_limits: BatchLimits | None = None
    batch_chosen: BatchSplit | None = None
    batch_replicas: int | None = None
    goodput: GoodputInfo = field(default_factory=GoodputInfo)


@dataclass(frozen=True)
class EventInfo:
    """One entry of the event log: a state change or a decision, with its reason."""

    id: int
    time: float
    kind: str
    job_id: int | None
    server_id: str | None
    from_state: str
    to_state: str
    reason: str
    message: str
    details: dict[str, Any]


@dataclass(frozen=True)
class GpuInfo:
    """A GPU as its agent last reported it, and the job holding it (None: free)."""

    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    healthy: bool
    health_reason: str
    utilization: float
    memory_used_bytes: int
    temperature_c: float
    job_id: int | None


@dataclass(frozen=True)
class ServerInfo:
    id: str
    hostname: str
    pool: Pool
    state: ServerState
    state_reason: str
    state_before_fault: str | None
    agent_address: str
    agent_version: str
    registered_at: float
    last_seen_at: float
    desired_generation: int
    observed_generation: int
    state_changed_at: float
    logs_address: str | None
    inference_endpoint: str | None
    drained_at: float | None
    gpus: tuple[GpuInfo, ...]  # in index order
    # ``core.snapshot.AdminState`` ('' schedulable, CORDONED, DRAINING, LEFT, DELETING), why, and a
    # drain's deadline (None: none).
    admin_state: str = ""
    admin_reason: str = ""
    drain_deadline: float | None = None

    @property
    def gpus_used(self) -> int:
        return sum(1 for g in self.gpus if g.job_id is not None)

    @property
    def admin_shown(self) -> str:
        """The admin state as users see it: DRAINING becomes DRAINED once nothing runs there."""
        return "DRAINED" if self.admin_state == "DRAINING" and not self.gpus_used else self.admin_state


@dataclass(frozen=True)
class LoanInfo:
    """An inference server lent to training: ACTIVE until RECLAIM, RECLAIMING until RETURN, RETURNED."""

    id: int
    server_id: str
    state: str
    reason: str
    started_at: float
    ended_at: float | None
    hard_deadline: float | None


@dataclass(frozen=True)
class DemandInfo:
    """Inference demand as the router reported it (the newest report counts)."""

    time: float
    servers_needed: int
    observed_rps: float
    source: str


@dataclass(frozen=True)
class DesiredWorkerSpec:
    job_id: int
    rank: int
    world_size: int
    local_rank: int
    gpu_indices: tuple[int, ...]
    command: tuple[str, ...]
    env: dict[str, str]
    master_addr: str
    master_port: int
    incarnation: int = 0
    working_dir: str = ""
    working_dir_if_exists: bool = False
    user: str = ""  # the job's owner: a root agent runs the worker as its mapped uid (node_agent.identity)
    # A job with batch limits: the batch it runs with now (``core.batch.job_batch``) and its limits.
    batch: BatchSplit | None = None
    batch_limits: BatchLimits | None = None


@dataclass(frozen=True)
class DesiredServerState:
    server_id: str
    epoch: int
    generation: int
    server_state: str
    workers: tuple[DesiredWorkerSpec, ...]


@dataclass(frozen=True)
class PoolStats:
    pool: Pool
    servers: int = 0
    gpus_total: int = 0
    gpus_used: int = 0
    gpus_loaned: int = 0
    gpus_unavailable: int = 0


@dataclass(frozen=True)
class LoanNoteInfo:
    """Why the last scheduling cycle loaned no (further) server, and since when it says so."""

    reason: str
    message: str
    since: float

    @property
    def summary(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class ClusterSummary:
    pools: tuple[PoolStats, ...]
    jobs_by_state: dict[str, int]
    demand: DemandInfo | None
    active_loans: int
    not_loaned: LoanNoteInfo | None = None


@dataclass(frozen=True)
class Explanation:
    job: JobInfo
    summary: str
    decisions: tuple[EventInfo, ...]


# A list view's command: whole arguments while they fit in this many characters (the first one
# always, cut to it). Enough to recognise a job; GetJob has the whole command.
LIST_COMMAND_CHARS = 256


def command_preview(command: Sequence[str]) -> list[str]:
    """The command as a list of jobs shows it (stored with the job as ``command_preview``)."""
    kept: list[str] = []
    used = 0
    for arg in command:
        if kept and used + len(arg) > LIST_COMMAND_CHARS:
            break
        kept.append(arg[:LIST_COMMAND_CHARS])
        used += len(arg)
    return kept


@dataclass(frozen=True)
class AdminChange:
    """What an admin request did: ``message`` for the operator; ``deleted``: the row is gone;
    ``touched``: servers whose desired state changed (their agents are told)."""

    server_id: str
    message: str
    deleted: bool = False
    touched: frozenset[str] = frozenset()


@dataclass(frozen=True)
class QueueSettings:
    """A queue as an admin configures it (``core.quota``): validated by the API."""

    name: str
    quota_gpus: int
    borrow_limit_gpus: int | None = None
    cohort: str = ""
    fair_share: bool = True


@dataclass(frozen=True)
class QueueStatus:
    """A queue's settings and its usage now, as the policy's ledger counts it (``core.quota``)."""

    name: str
    cohort: str
    quota_gpus: int
    borrow_limit_gpus: int | None
    fair_share: bool
    used_gpus: int
    borrowed_gpus: int
    pending_jobs: int
    running_jobs: int
    configured: bool
    cohort_idle_gpus: int = 0
    quota_is_rest: bool = False  # "default": its quota is what the other queues leave
