"""What a policy decides: a Plan of actions, each carrying a reason code that ends up in the event
log and in ExplainJob. Planning never writes; the applier commits a plan and reports what it refused.
"""

from __future__ import annotations

import heapq
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
    CANNOT_FIT = "CANNOT_FIT"                      # too large for every server there is, all free (core.fit)
    WAITING_FOR_RESERVATION = "WAITING_FOR_RESERVATION"  # GPUs are held for a starving job
    WAITING_FOR_MASTER_PORT = "WAITING_FOR_MASTER_PORT"  # its master server has no free MASTER_PORT (service)
    # Queues (``core.quota``) and GPU types (``core.placement``):
    WAITING_FOR_QUOTA = "WAITING_FOR_QUOTA"        # beyond its queue's quota, and its cohort has too few idle GPUs
    QUOTA_BORROW_LIMIT = "QUOTA_BORROW_LIMIT"      # would take its queue past quota + borrow limit
    WAITING_FOR_GPU_TYPE = "WAITING_FOR_GPU_TYPE"  # not enough free GPUs of the type(s) it asks for
    # The running jobs it could take GPUs from (extras, or preemption by quota or priority) are in their
    # protection window (``core.protection``: the message names the rule and when it ends):
    WAITING_FOR_PROTECTED_JOBS = "WAITING_FOR_PROTECTED_JOBS"
    # Why a job started or changed size:
    BACKFILLED = "BACKFILLED"                      # started ahead of a waiting job it does not delay
    RESERVATION_HONOURED = "RESERVATION_HONOURED"  # a starving job got the GPUs held for it
    SCALED_OUT = "SCALED_OUT"                      # spare GPUs cut its completion time most
    SCALED_IN = "SCALED_IN"                        # its extra workers were worth more elsewhere
    SCALED_IN_FOR_BASE_DEMAND = "SCALED_IN_FOR_BASE_DEMAND"  # a queued job's minimum needed them
    SCALED_IN_FOR_RECLAIM = "SCALED_IN_FOR_RECLAIM"  # its loaned server went back to inference
    PREEMPTED_FOR_RECLAIM = "PREEMPTED_FOR_RECLAIM"  # reclaim left it below min_workers
    MOVED_FOR_RECLAIM = "MOVED_FOR_RECLAIM"  # reclaim left it below min_workers; restarted elsewhere instead
    # moved at its size so that a job a reclaim displaced fits whole where it ran (``policies.aryl.base``)
    MOVED_TO_MAKE_ROOM = "MOVED_TO_MAKE_ROOM"
    PREEMPTED_FOR_QUOTA = "PREEMPTED_FOR_QUOTA"    # its queue borrowed GPUs a queue within its quota needed back
    PREEMPTED_FOR_PRIORITY = "PREEMPTED_FOR_PRIORITY"  # a job of a higher priority class of its queue needed them
    # Its GPUs went to jobs the policy ranks first (tiresias, optimus; aryl's preempt-to-admit).
    PREEMPTED_BY_POLICY = "PREEMPTED_BY_POLICY"
    # stopped to move where this plan frees GPUs only as it applies (a swap with another job has no apply
    # order): it restarts there at the next cycle, which follows at once (``core.gpu_configs``)
    PREEMPTED_TO_MOVE = "PREEMPTED_TO_MOVE"
    # A server it ran on is LOST (its agent went silent): shrunk to its workers elsewhere when that
    # keeps min_workers, else requeued (core.faults decides, before any policy step).
    SERVER_LOST = "SERVER_LOST"
    # Its agent deregistered (stopped its workers and left the cluster): as SERVER_LOST, at once.
    SERVER_LEFT = "SERVER_LEFT"
    # An operator drains a server it runs on (``arylctl servers drain``): an elastic job shrinks off it
    # (requeued below min_workers); any job is requeued once the drain's deadline passes.
    SERVER_DRAINING = "SERVER_DRAINING"
    # Servers and loans:
    LOANED_IDLE_SERVER = "LOANED_IDLE_SERVER"      # inference had more servers than it needed
    LOAN_ACTIVE = "LOAN_ACTIVE"                    # drained: training may use it now
    LOAN_CANCELLED = "LOAN_CANCELLED"              # demand rose while it was still draining
    RECLAIMED_FOR_INFERENCE = "RECLAIMED_FOR_INFERENCE"  # inference demand rose
    RETURNED_TO_SERVING = "RETURNED_TO_SERVING"    # vacated by training: serving again
    # Why a running elastic job below max_workers keeps its size (a non-event, explained once per decision):
    HELD_RESIZE_INTERVAL = "HELD_RESIZE_INTERVAL"  # resized less than policy.min_resize_interval_s ago
    HELD_NO_GAIN = "HELD_NO_GAIN"                  # spare GPUs, but a worker more gains less than a restart costs
    HELD_NO_SPARE_GPUS = "HELD_NO_SPARE_GPUS"      # no free GPU, or the free ones cut other jobs' times more
    HELD_FRAGMENTED = "HELD_FRAGMENTED"            # spare GPUs, but no server has gpus_per_worker of them free
    HELD_FOR_RESERVATION = "HELD_FOR_RESERVATION"  # the spare GPUs are held for a starving queued job
    HELD_BY_QUOTA = "HELD_BY_QUOTA"                # its queue may not borrow more GPUs (quota, borrow limit, cohort)
    HELD_NOT_ELASTIC = "HELD_NOT_ELASTIC"          # the policy runs every job at min_workers
    # Its protection window's disruption cap (``core.protection``): resized/preempted
    # policy.max_disruptions_per_hour times in the last hour (the window's minimum runtime: HELD_RESIZE_INTERVAL)
    HELD_DISRUPTION_CAP = "HELD_DISRUPTION_CAP"
    # On a draining server, but in its protection window: it moves off when the window ends or the
    # drain's deadline passes, whichever comes first (``core.faults``)
    HELD_DRAIN_PROTECTED = "HELD_DRAIN_PROTECTED"
    # Why a cycle loaned no (further) inference server (a cluster-level non-event):
    NOT_LOANED_BY_POLICY = "NOT_LOANED_BY_POLICY"  # the policy never loans
    NOT_LOANED_NO_DEMAND = "NOT_LOANED_NO_DEMAND"  # no inference demand reported yet: never loan blind
    NOT_LOANED_NO_SURPLUS = "NOT_LOANED_NO_SURPLUS"  # inference needs every serving server (+ the buffer)
    NOT_LOANED_NO_TRAINING_DEMAND = "NOT_LOANED_NO_TRAINING_DEMAND"  # training needs no more GPUs than are free
    NOT_LOANED_NOT_IDLE = "NOT_LOANED_NOT_IDLE"    # the spare servers have not been idle long enough (or are unfit)
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
    come before the plan's starts in ``apply_order`` -- whatever their worker count -- since a start
    may have been planned onto exactly those GPUs."""
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
class KeepSize:
    """A running job keeps its size though it could run more workers; ``message`` says why. With
    ``reason`` None it clears the job's standing note (it changed size, reached max_workers, or nothing
    holds it back any more). Recorded, with an event, only when it differs from the job's note
    (``cycle.only_changed_reasons``): once per decision, not once per cycle."""

    job_id: int
    reason: Reason | None
    message: str = ""

    @property
    def summary(self) -> str:
        """The text stored as the job's size note (and shown by ExplainJob); '' for a clearing one."""
        return f"{self.reason}: {self.message}"[:1024] if self.reason is not None else ""


@dataclass(frozen=True, slots=True)
class LoanNote:
    """Why this cycle loaned no (further) inference server; with ``reason`` None, that it loaned one
    (the standing note is cleared). Recorded only when it changes, like ``KeepSize``."""

    reason: Reason | None
    message: str = ""

    @property
    def summary(self) -> str:
        return f"{self.reason}: {self.message}"[:1024] if self.reason is not None else ""


def clock_time(t: float) -> str:
    """A UNIX time as the UTC time of day (``14:02:10 UTC``), for messages that must read the same on
    every cycle of one decision (so no "N s ago"). Arithmetic only: the core reads no clock."""
    seconds = int(t) % 86400
    return f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d} UTC"


@dataclass(frozen=True, slots=True)
class BatchSize:
    """The batch a goodput-aware policy chose for a job at the allocation it gets this cycle (issue 17):
    ``atomic_bsz`` samples per GPU per pass and ``accum_steps`` extra accumulation passes per step. The
    agent passes them to every worker (``ARYL_LOCAL_BATCH_SIZE``, ``ARYL_ACCUM_STEPS``)."""

    job_id: int
    atomic_bsz: int
    accum_steps: int


@dataclass(frozen=True, slots=True)
class Plan:
    """Checked as a whole (``core.invariants.check_plan``), applied one action at a time in
    ``apply_order``: each action after those that free the GPUs it takes."""

    starts: tuple[StartJob, ...] = ()
    scales: tuple[ScaleJob, ...] = ()
    preemptions: tuple[PreemptJob, ...] = ()
    server_actions: tuple[ServerAction, ...] = ()
    pending: tuple[KeepPending, ...] = ()
    held: tuple[KeepSize, ...] = ()  # why running jobs keep their size (non-events)
    loan_note: LoanNote | None = None  # why no server was loaned (None: the policy says nothing)
    batches: tuple[BatchSize, ...] = ()  # batch sizes chosen for goodput-aware jobs (changed or new)

    @property
    def is_empty(self) -> bool:
        return not (self.starts or self.scales or self.preemptions or self.server_actions or self.pending
                    or self.held or self.loan_note is not None or self.batches)


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What the applier committed, and what it refused (job or server id, why) after re-checking
    fresh state; ``rejected_codes`` names the rule that refused each, in ``rejected``'s order
    (``core.apply_rules.RefusalCode``)."""

    started: tuple[int, ...]
    rejected: tuple[tuple[int | str, str], ...]
    touched_servers: frozenset[str]
    scaled: tuple[int, ...] = ()
    preempted: tuple[int, ...] = ()
    server_steps: tuple[tuple[str, str], ...] = ()  # (server id, LoanStep)
    rejected_codes: tuple[str, ...] = ()


Action = StartJob | ScaleJob | PreemptJob | ServerAction


def apply_order(plan: Plan, held: Mapping[int, Iterable[tuple[str, int]]]) -> tuple[Action, ...]:
    """The plan's actions in the order every applier (service and simulator) applies them, one by one,
    each re-checked against the state the earlier ones left (``held``: each scaled job's (server, gpu)
    pairs now; a preempted job's too, where the caller has them).

    Why a dependency order: a plan is checked as a whole (``core.invariants.check_plan``: no GPU
    double-booked *after* it), but applied action by action, and each applier deletes a job's dropped
    GPUs and inserts its new ones within that one action. So an action that takes a GPU must come
    after the action that frees it:

    - a preemption frees all its job's GPUs; a scale frees the GPUs it drops and takes the ones it adds
      (a GPU it keeps, even under another rank, is neither); a start only takes;
    - ACTIVATE steps come before every job action (a placement may land on the newly loaned server);
      RECLAIM and RETURN come after the job actions that free GPUs on their server (it must be vacated).

    The order is the plan's phases -- ACTIVATE steps; preemptions; scales that release GPUs
    (``releases_gpus``); starts; the other scales; the other loan steps -- reordered only where an
    action would otherwise come before one it depends on (Kahn's algorithm, always taking the
    earliest ready action in phase order, so it is deterministic and equals the phase order whenever
    that already works). Since only preemptions and releasing scales free GPUs, every start still comes
    after every action that frees one, and the starts stay together (the service applies them as one
    batch).

    A cycle -- scales that take each other's GPUs (a swap, or A from B from C from A) -- has no order:
    whichever applies first finds its GPU still held. ``check_plan`` reports such a plan as invalid
    (policies must not make one); should one reach an applier anyway, its cycle's actions and
    everything waiting on them come last, in phase order, where the applier refuses what it must, each
    refusal counted, never hidden (``unorderable``)."""
    ordered, blocked = _dependency_order(plan, held)
    return (*ordered, *blocked)


def unorderable(plan: Plan, held: Mapping[int, Iterable[tuple[str, int]]]) -> tuple[Action, ...]:
    """The plan's actions that no one-by-one order can apply: GPU moves in a cycle (each takes a GPU
    another frees), and the actions that wait on them. Empty for every plan an applier can apply in
    full; ``apply_order`` says why."""
    return _dependency_order(plan, held)[1]


def _phase_order(plan: Plan, held: Mapping[int, Iterable[tuple[str, int]]]) -> tuple[Action, ...]:
    """The plan's actions by phase (``apply_order``'s tie-break)."""
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


def _dependency_order(
    plan: Plan, held: Mapping[int, Iterable[tuple[str, int]]]
) -> tuple[tuple[Action, ...], tuple[Action, ...]]:
    """(the actions in dependency order, the actions left blocked by a cycle, in phase order)."""
    base = _phase_order(plan, held)
    # What each job action frees and takes, as (server, gpu) pairs.
    freed_by: dict[tuple[str, int], int] = {}
    takes: dict[int, set[tuple[str, int]]] = {}
    frees_on: dict[str, set[int]] = {}        # server -> the actions that free GPUs on it
    takes_on: dict[str, set[int]] = {}        # server -> the actions that take GPUs on it
    for i, action in enumerate(base):
        if isinstance(action, ServerAction):
            continue
        now = set(held.get(action.job_id, ()))
        freed, taken = now, set[tuple[str, int]]()  # a preemption frees all its job's GPUs
        if not isinstance(action, PreemptJob):
            planned = {(w.server_id, g) for w in action.workers for g in w.gpu_indices}
            freed, taken = (now - planned, planned - now) if isinstance(action, ScaleJob) else (set(), planned)
        for pair in freed:
            freed_by[pair] = i
        for server_id, _ in freed:
            frees_on.setdefault(server_id, set()).add(i)
        for server_id, _ in taken:
            takes_on.setdefault(server_id, set()).add(i)
        takes[i] = taken
    after: list[set[int]] = [set() for _ in base]   # i -> the actions that must come after it
    for i, taken in takes.items():
        for pair in taken:
            j = freed_by.get(pair)
            if j is not None and j != i:
                after[j].add(i)
    for i, action in enumerate(base):
        if isinstance(action, ServerAction) and action.kind == LoanStep.ACTIVATE:
            after[i].update(takes_on.get(action.server_id, ()))
        elif isinstance(action, ServerAction) and action.kind in (LoanStep.RECLAIM, LoanStep.RETURN):
            for j in frees_on.get(action.server_id, ()):
                after[j].add(i)
    waiting_on = [0] * len(base)
    for successors in after:
        for i in successors:
            waiting_on[i] += 1
    ready = [i for i, n in enumerate(waiting_on) if n == 0]
    heapq.heapify(ready)
    ordered: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        ordered.append(i)
        for k in after[i]:
            waiting_on[k] -= 1
            if waiting_on[k] == 0:
                heapq.heappush(ready, k)
    done = set(ordered)
    return tuple(base[i] for i in ordered), tuple(a for i, a in enumerate(base) if i not in done)


@dataclass
class ApplyLog:
    """What an applier committed so far, action by action; ``result()`` freezes it."""

    started: list[int] = field(default_factory=list)
    scaled: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    server_steps: list[tuple[str, str]] = field(default_factory=list)
    rejected: list[tuple[int | str, str]] = field(default_factory=list)
    rejected_codes: list[str] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)
    rebatched: list[int] = field(default_factory=list)  # jobs whose batch changed (``Plan.batches``)

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

    def refused(self, action: Action, why: str, *, code: str) -> None:
        self.rejected.append((action.server_id if isinstance(action, ServerAction) else action.job_id, why))
        self.rejected_codes.append(code)

    @property
    def changed(self) -> bool:
        return bool(self.started or self.scaled or self.preempted or self.server_steps or self.rebatched)

    def result(self) -> ApplyResult:
        return ApplyResult(
            tuple(self.started), tuple(self.rejected), frozenset(self.touched), scaled=tuple(self.scaled),
            preempted=tuple(self.preempted), server_steps=tuple(self.server_steps),
            rejected_codes=tuple(self.rejected_codes),
        )
