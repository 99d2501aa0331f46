"""The frozen view of the cluster a policy decides on (built by the service or the simulator)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from scheduler_service.core.demand_forecast import ForecastView
from scheduler_service.core.goodput import GradParams, StepSample
from scheduler_service.lifecycle import JobState, Pool, ServerState

# Servers on which training workers may run: training-owned ones, and inference servers on loan.
TRAINING_CAPABLE_STATES = frozenset({ServerState.TRAINING, ServerState.LOANED})


class AdminState(StrEnum):
    """What an operator (``arylctl servers cordon|drain|delete``) or a leaving agent asked of a server,
    beside its state (the service's ``servers.admin_state``). Any but NONE *cordons* it: no new worker
    is placed there and no loan begins there; the workers there keep running, except:
    - DRAINING: elastic jobs shrink off it (or requeue when they would fall below ``min_workers``);
      the other jobs are left to finish, and preempted once ``ServerView.drain_deadline`` passes;
      a loaned inference server is reclaimed. DRAINED is DRAINING with nothing left there.
    - LEFT: its agent deregistered (stopped its workers and left); the server is LOST as well.
    - DELETING: ``servers delete --force`` of a server still running workers: drained at once, and
      removed once nothing runs there."""

    NONE = ""
    CORDONED = "CORDONED"
    DRAINING = "DRAINING"
    LEFT = "LEFT"
    DELETING = "DELETING"


@dataclass(frozen=True, slots=True)
class ServerView:
    server_id: str
    pool: Pool
    state: ServerState
    gpu_indices: tuple[int, ...]
    unhealthy_gpus: frozenset[int] = frozenset()
    # gpu index -> job id holding it
    allocated: tuple[tuple[int, int], ...] = ()
    state_since: float = 0.0            # when it entered its current state
    loan_started_at: float | None = None  # while DRAINING/LOANED/RECLAIMING: when the loan began
    agent_converged: bool = True        # the agent has applied the newest desired state
    drained: bool = False               # DRAINING: the router reports nothing in flight there any more
    # RECLAIMING: when it goes back to inference without its agent's confirmation (set at the RECLAIM
    # step, ``core.apply_rules.ApplySettings.reclaim_deadline``; the service keeps it on the loan row).
    reclaim_deadline: float | None = None
    admin: AdminState = AdminState.NONE   # cordoned, draining, left (see ``AdminState``)
    # DRAINING/DELETING: from when the jobs that cannot shrink off are preempted (None: never; they finish)
    drain_deadline: float | None = None
    # The model of its GPUs as its agent reports them (NVML's name; "" unknown). Workers of one job stay
    # on one type (``core.placement``); a job may ask for some types only (``JobView.gpu_types``).
    gpu_type: str = ""
    # Derived from the fields above on first use (a view is immutable): a policy reads them every cycle.
    _healthy: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _free: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _allocated: frozenset[int] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def allocated_gpus(self) -> frozenset[int]:
        """Indices of the GPUs allocated to a job."""
        cached = self._allocated
        if cached is None:
            cached = frozenset(index for index, _ in self.allocated)
            object.__setattr__(self, "_allocated", cached)
        return cached

    @property
    def healthy_gpus(self) -> tuple[int, ...]:
        """Healthy GPU indices, in ``gpu_indices`` order."""
        cached = self._healthy
        if cached is None:
            unhealthy = self.unhealthy_gpus
            cached = tuple(i for i in self.gpu_indices if i not in unhealthy) if unhealthy else self.gpu_indices
            object.__setattr__(self, "_healthy", cached)
        return cached

    @property
    def free_gpus(self) -> tuple[int, ...]:
        """Healthy, unallocated GPU indices, ascending."""
        cached = self._free
        if cached is None:
            taken = {index for index, _ in self.allocated}
            cached = tuple(i for i in self.gpu_indices if i not in taken and i not in self.unhealthy_gpus)
            object.__setattr__(self, "_free", cached)
        return cached

    @property
    def runs_training(self) -> bool:
        return self.state in TRAINING_CAPABLE_STATES

    @property
    def cordoned(self) -> bool:
        """Nothing new may be placed or loaned here (``AdminState``)."""
        return self.admin != AdminState.NONE

    @property
    def draining(self) -> bool:
        """Its workers are to move off (``AdminState.DRAINING``/``DELETING``; LEFT ones are LOST)."""
        return self.admin in (AdminState.DRAINING, AdminState.DELETING)


@dataclass(frozen=True, slots=True)
class WorkerView:
    rank: int
    server_id: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProgressWindow:
    """Progress a job reported since its current incarnation (size) began, on the scheduler's clock:
    ``first_work`` at ``first_at`` (its first report at this size, so start-up time is left out) to
    ``last_work`` at ``last_at``, over ``reports`` reports after the first, at ``workers`` workers."""

    workers: int
    first_work: float
    first_at: float
    last_work: float
    last_at: float
    reports: int

    @property
    def rate(self) -> float | None:
        """Work per second at ``workers`` workers; None until progress grew over a measurable time."""
        span, done = self.last_at - self.first_at, self.last_work - self.first_work
        return done / span if self.reports > 0 and span > 0 and done > 0 else None


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """A job that adapts its batch size to its allocation (the job contract's batch fields, issue 17):
    the total batch size its hyper-parameters were tuned for (``init_bsz``, Pollux's B0), the largest
    total batch it accepts, and the largest per-GPU (atomic) batch one pass fits in a GPU's memory."""

    init_bsz: int
    max_bsz: int
    max_atomic_bsz: int


@dataclass(frozen=True, slots=True)
class JobView:
    job_id: int
    state: JobState
    gpus_per_worker: int
    min_workers: int
    max_workers: int
    priority: int
    submitted_at: float
    workers: tuple[WorkerView, ...] = ()
    estimated_runtime_s: float | None = None
    pending_reason: str = ""
    # Throughput hints as declared: ((workers, samples_per_second), ...) and total work (0: unknown).
    throughput_points: tuple[tuple[int, float], ...] = ()
    total_work: float = 0.0
    work_done: float = 0.0               # progress reported by the job, same unit as total_work
    started_at: float | None = None      # first start
    last_resized_at: float | None = None  # last start, restart or resize (anti-thrashing)
    last_checkpoint_at: float | None = None
    size_note: str = ""  # why it keeps its size, as last recorded (``core.plan.KeepSize.summary``)
    # When the job should be finished, on the snapshot's clock (``now``'s); None: no deadline.
    deadline: float | None = None
    # Progress measured at the job's current size (``core.predict``); None: no two reports at this size yet.
    progress_window: ProgressWindow | None = None

    # Queues, priority classes and GPU types (``core.quota``, ``core.placement``); keyword-only in practice.
    queue: str = "default"
    user: str = ""
    priority_class: int = 0              # its priority class's value, fixed at submission (higher first)
    gpu_types: tuple[str, ...] = ()      # GPU types it may run on, preferred first; (): any type

    # Goodput (``core.goodput``, issue 17): None / empty for a job that does not take part. Its declared
    # batch limits; what its workers measured, one sample per configuration it ran at (newest measure
    # of each); and its latest gradient statistics, normalised to ``batch_limits.init_bsz``.
    batch_limits: BatchLimits | None = None
    step_samples: tuple[StepSample, ...] = ()
    grad_stats: GradParams | None = None
    # The batch it runs now, as (atomic_bsz, accum_steps, GPUs it was chosen for); None: none chosen yet.
    batch_now: tuple[int, int, int] | None = None
    # One GPU's measured samples per second on each GPU model it ran on alone (``core.type_speed``).
    type_speeds: tuple[tuple[str, float], ...] = ()

    # Anti-thrashing (``core.protection``'s disruption cap): when its recent resizes and preemptions were
    # applied, oldest first (at least the last ``protection.DISRUPTION_WINDOW_S``; older ones are ignored).
    disruptions: tuple[float, ...] = ()

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def is_elastic(self) -> bool:
        return self.max_workers > self.min_workers

    def since_checkpoint(self, now: float) -> float:
        """Seconds of running since its last checkpoint -- a start or resize is one: it resumed from a checkpoint
        then -- what a preemption now would throw away; 0 for a job that never ran."""
        marks = [t for t in (self.last_checkpoint_at, self.last_resized_at) if t is not None]
        return max(now - max(marks), 0.0) if marks else 0.0


@dataclass(frozen=True, slots=True)
class DemandView:
    servers_needed: int
    observed_rps: float
    reported_at: float
    # The demand's forecast at this snapshot (``core.demand_forecast``), attached by the scheduling cycle that
    # feeds the forecaster; None where none runs (a what-if, a test's hand-built snapshot).
    forecast: ForecastView | None = None


@dataclass(frozen=True, slots=True)
class QueueView:
    """An admin-configured queue (``core.quota`` defines the nouns): a guaranteed GPU quota (None,
    "default" only: the rest, what the other queues leave), how far it may borrow beyond it (None: no
    limit) from idle quota of its cohort ("": a cohort of its own) and from loaned inference servers,
    and whether its users share it fairly."""

    name: str
    quota_gpus: int | None
    borrow_limit_gpus: int | None = None
    cohort: str = ""
    fair_share: bool = True


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    now: float
    servers: tuple[ServerView, ...]
    jobs: tuple[JobView, ...]
    demand: DemandView | None = None
    seed: int = 0
    loan_note: str = ""  # why no server is loaned, as last recorded (``core.plan.LoanNote.summary``)
    # The configured queues (``core.quota``); empty: every job shares one unlimited queue, as before queues.
    queues: tuple[QueueView, ...] = ()
    # Declared speed of each GPU type relative to 1.0 ((type, factor), ...); a type not named is 1.0.
    gpu_speed: tuple[tuple[str, float], ...] = ()
    _by_id: dict[str, ServerView] = field(default_factory=dict, compare=False, repr=False)

    def pending_jobs(self) -> tuple[JobView, ...]:
        return tuple(j for j in self.jobs if j.state == JobState.PENDING)

    def server(self, server_id: str) -> ServerView:
        if not self._by_id:
            self._by_id.update((s.server_id, s) for s in self.servers)
        return self._by_id[server_id]


def derived(snapshot: ClusterSnapshot, *, servers: tuple[ServerView, ...] | None = None,
            jobs: tuple[JobView, ...] | None = None) -> ClusterSnapshot:
    """``snapshot`` with its servers and/or jobs changed and every other field kept (time, demand, seed,
    queues, GPU speeds, the loan note): the one way to derive a snapshot. Its server index starts empty (a
    copied one would hand out the old servers)."""
    return replace(snapshot, servers=snapshot.servers if servers is None else servers,
                   jobs=snapshot.jobs if jobs is None else jobs, _by_id={})


def without_jobs(snapshot: ClusterSnapshot, preempted: set[int]) -> ClusterSnapshot:
    """The snapshot as preempting the jobs ``preempted`` leaves it: their GPUs free, the jobs PENDING with no
    workers. The snapshot itself when there are none."""
    if not preempted:
        return snapshot
    servers = tuple(replace(s, allocated=tuple(a for a in s.allocated if a[1] not in preempted))
                    for s in snapshot.servers)
    jobs = tuple(replace(j, state=JobState.PENDING, workers=()) if j.job_id in preempted else j
                 for j in snapshot.jobs)
    return derived(snapshot, servers=servers, jobs=jobs)
