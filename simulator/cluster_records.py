"""The simulated cluster's in-memory records (``simulator.cluster``): a server (``ServerRecord``) and an
active job with its current segment (``JobRecord``), and ``RecordFacts``, the applier rules' read
interface (``core.apply_rules.ApplyFacts``) over them. The nouns (segment, checkpoint, reference cost)
are ``simulator.cluster``'s. What this module must never do: change a record (the cluster does, by the
rules) or decide anything.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from scheduler_service.core.apply_rules import JobFacts, LoanState
from scheduler_service.core.plan import WorkerPlacement
from scheduler_service.core.protection import record_disruption
from scheduler_service.core.snapshot import AdminState, JobView, ServerView, WorkerView
from scheduler_service.core.throughput import ThroughputModel
from scheduler_service.lifecycle import JobState, Pool, ServerState
from simulator.model import TraceJob
from simulator.outcomes import JobOutcome

ON_LOAN_STATES = frozenset({ServerState.DRAINING, ServerState.LOANED, ServerState.RECLAIMING})


@dataclass(slots=True)
class ServerRecord:
    """A server as the cluster holds it: its state, open loan, health, operator's mark, allocations."""

    server_id: str
    pool: Pool
    gpu_indices: tuple[int, ...]
    state: ServerState
    state_since: float = 0.0
    loan: LoanState | None = None        # the open loan's state (ACTIVE, RECLAIMING); None: no open loan
    loan_started_at: float | None = None
    reclaim_deadline: float | None = None  # the open loan's, from its RECLAIM step on
    unhealthy: frozenset[int] = frozenset()
    allocated: dict[int, int] = field(default_factory=dict)  # gpu index -> job id
    drained: bool = False                # DRAINING: the router acknowledged the drain
    admin: AdminState = AdminState.NONE  # an operator's cordon or drain (``set_admin``)
    drain_deadline: float | None = None
    gpu_type: str = ""                   # the model of its GPUs (``ClusterSpec.training_gpu_types``)
    view: ServerView | None = None       # cached; None when stale

    def build_view(self) -> ServerView:
        if self.view is None:
            self.view = ServerView(
                server_id=self.server_id, pool=self.pool, state=self.state, gpu_indices=self.gpu_indices,
                unhealthy_gpus=self.unhealthy, allocated=tuple(sorted(self.allocated.items())),
                state_since=self.state_since,
                loan_started_at=self.loan_started_at if self.state in ON_LOAN_STATES else None,
                agent_converged=True,  # simulated agents apply every desired state at once
                drained=self.drained,
                reclaim_deadline=self.reclaim_deadline if self.state == ServerState.RECLAIMING else None,
                admin=self.admin, drain_deadline=self.drain_deadline, gpu_type=self.gpu_type,
            )
        return self.view


@dataclass(slots=True)
class JobRecord:
    """An active job as the cluster holds it: its lifecycle state, workers, times, last checkpoint and
    current segment."""

    trace: TraceJob
    outcome: JobOutcome
    model: ThroughputModel
    state: JobState = JobState.PENDING
    workers: tuple[WorkerView, ...] = ()
    pending_reason: str = ""
    started_at: float | None = None
    last_resized_at: float | None = None
    disruptions: tuple[float, ...] = ()  # its resizes and preemptions of the last hour (core.protection)
    # The last checkpoint before the current segment (or the one it resumed from): time and work.
    checkpoint_at: float | None = None
    checkpoint_work: float = 0.0
    # The current segment (meaningful while running): it began at ``seg_start`` with ``seg_work``
    # done, progresses at ``seg_speed`` from ``seg_start + overhead``, on ``seg_gpus`` GPUs.
    seg_start: float = 0.0
    seg_work: float = 0.0
    seg_speed: float = 0.0
    seg_gpus: int = 0
    seg_version: int = 0                 # bumped whenever the segment ends (invalidates its completion)
    reference_cost: float = 0.0          # GPU-seconds per unit of work at min_workers (useful spans)
    shown_work: float = 0.0              # the total work its view shows (declared, else the truth)
    view: JobView | None = None          # cached view of a job that is not running; None when stale

    @property
    def running(self) -> bool:
        return self.state.holds_gpus


class RecordFacts:
    """``core.apply_rules.ApplyFacts`` over the simulated cluster's dicts, read as the actions applied
    so far left them. A finished job reads as COMPLETED (the service keeps its row; no other final
    state happens here)."""

    __slots__ = ("_active", "_outcomes", "_servers")

    def __init__(self, servers: dict[str, ServerRecord], active: dict[int, JobRecord],
                 outcomes: dict[int, JobOutcome]) -> None:
        self._servers = servers
        self._active = active
        self._outcomes = outcomes

    def job(self, job_id: int) -> JobFacts | None:
        job = self._active.get(job_id)
        if job is not None:
            t = job.trace
            return JobFacts(job_id, job.state, t.gpus_per_worker, t.min_workers, t.max_workers)
        done = self._outcomes.get(job_id)
        if done is None or done.end is None:
            return None
        return JobFacts(job_id, JobState.COMPLETED, done.gpus_per_worker, done.min_workers, done.max_workers)

    def server_state(self, server_id: str) -> ServerState | None:
        server = self._servers.get(server_id)
        return server.state if server is not None else None

    def server_cordoned(self, server_id: str) -> bool:
        server = self._servers.get(server_id)
        return server is not None and server.admin != AdminState.NONE

    def open_loan(self, server_id: str) -> LoanState | None:
        server = self._servers.get(server_id)
        return server.loan if server is not None else None

    def gpu_usable(self, server_id: str, index: int) -> bool:
        server = self._servers.get(server_id)
        return server is not None and index in server.gpu_indices and index not in server.unhealthy

    def gpu_holder(self, server_id: str, index: int) -> int | None:
        server = self._servers.get(server_id)
        return server.allocated.get(index) if server is not None else None

    def jobs_on(self, server_id: str) -> Collection[int]:
        server = self._servers.get(server_id)
        return server.allocated.values() if server is not None else ()


def disrupted(job: JobRecord, now: float) -> None:
    """Record a resize or preemption at ``now`` (``JobView.disruptions``: the last hour's are kept)."""
    job.disruptions = record_disruption(job.disruptions, now)
    job.view = None


def worker_views(workers: tuple[WorkerPlacement, ...]) -> tuple[WorkerView, ...]:
    """The placement as the service's snapshot shows it: by rank, each worker's GPUs ascending."""
    return tuple(WorkerView(w.rank, w.server_id, tuple(sorted(w.gpu_indices)))
                 for w in sorted(workers, key=lambda w: w.rank))
