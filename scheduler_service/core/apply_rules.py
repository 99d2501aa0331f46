"""The applier's rules, written once: what fresh state must hold for each plan action to apply, and the
effects of a loan step that both appliers share.

Both appliers -- the service's SQL applier (``store.applier``) and the simulator's cluster
(``simulator.cluster``) -- apply a plan one action at a time in ``core.plan.apply_order`` and ask
these functions, over the state the earlier actions left, whether the next one may apply. Each
applier only reads its own state for them (``ApplyFacts``) and writes what an allowed action does;
``tests/contract/test_apply_contract.py`` holds the two to the same results, refusals included.

Nouns:
- *Facts* (``ApplyFacts``): the narrow read interface an applier implements over its state: a job's
  state and shape (``JobFacts``), a server's state and open loan, whether a GPU exists and is healthy,
  which job holds it, and the jobs holding a server's GPUs.
- *Refusal* (``Refused``): an action fresh state does not allow. Its ``code`` (``RefusalCode``) names
  the rule, for tools; its ``message`` tells the user what changed, in the words the appliers have
  always used. Appliers report it under ``Reason.STALE_PLAN`` (``ApplyResult.rejected``), the code
  beside it (``ApplyResult.rejected_codes``).
- *Loan step rule* (``LOAN_STEPS``): the loan cycle as data -- what a step (LOAN, ACTIVATE, CANCEL,
  RECLAIM, RETURN) moves the server to, the open loan it needs (``LoanState``) and what that loan
  becomes, whether the server must be vacated first, and whether the step starts the reclaim's hard
  deadline (``reclaim_deadline``: one definition, stored by the service on its loan row and by the
  simulator on its loan, shown to the policy as ``ServerView.reclaim_deadline``).

Never: write, read a clock, or decide (the plan did). Pure: no I/O, no SQLAlchemy.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import (
    Action,
    ApplyLog,
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
    WorkerPlacement,
    unorderable,
)
from scheduler_service.core.snapshot import TRAINING_CAPABLE_STATES
from scheduler_service.lifecycle import JOB_LIFECYCLE, SERVER_LIFECYCLE, IllegalTransition, JobState, ServerState


class LoanState(StrEnum):
    """A loan's state (the service's ``loans.state``): ACTIVE from LOAN until RECLAIM, RECLAIMING until
    RETURN, then RETURNED (closed: a server has at most one loan that is not)."""

    ACTIVE = "ACTIVE"
    RECLAIMING = "RECLAIMING"
    RETURNED = "RETURNED"


class RefusalCode(StrEnum):
    """Which rule refused a plan action (stable: tools match on them, as on ``Reason``)."""

    JOB_NOT_PENDING = "JOB_NOT_PENDING"            # a start of a job that is not (or no longer) pending
    JOB_NOT_RUNNING = "JOB_NOT_RUNNING"            # a resize or preemption of a job that does not run
    RANKS_NOT_DENSE = "RANKS_NOT_DENSE"            # planned ranks are not 0..n-1
    WORKERS_OUT_OF_RANGE = "WORKERS_OUT_OF_RANGE"  # worker count outside min_workers..max_workers
    WRONG_GPU_COUNT = "WRONG_GPU_COUNT"            # a worker without exactly gpus_per_worker GPUs
    SERVER_CANNOT_TRAIN = "SERVER_CANNOT_TRAIN"    # a new GPU on a server that is not TRAINING/LOANED
    SERVER_CORDONED = "SERVER_CORDONED"            # a new GPU on, or a LOAN of, a cordoned server
    GPU_UNUSABLE = "GPU_UNUSABLE"                  # a new GPU that is unhealthy or does not exist
    GPU_HELD = "GPU_HELD"                          # a planned GPU held by another job, or planned twice
    SERVER_NOT_REGISTERED = "SERVER_NOT_REGISTERED"  # a loan step for an unknown server
    ILLEGAL_TRANSITION = "ILLEGAL_TRANSITION"      # the lifecycle table refuses the move
    LOAN_MISMATCH = "LOAN_MISMATCH"                # the server's open loan is not the one the step needs
    SERVER_NOT_VACATED = "SERVER_NOT_VACATED"      # RECLAIM/RETURN of a server still running workers
    # Refused because the plan's GPU moves form a cycle no one-by-one order applies (``core.plan.unorderable``):
    # what caught it was a GPU still held or a server not vacated, but the plan is at fault.
    UNORDERABLE = "UNORDERABLE"
    # The service only: the database's versions or keys refused a write another transaction raced (the
    # last guard, behind these rules).
    CHANGED_CONCURRENTLY = "CHANGED_CONCURRENTLY"
    # The service only: every MASTER_PORT of the configured range is held on the master server (``store.ports``).
    MASTER_PORT_RANGE_FULL = "MASTER_PORT_RANGE_FULL"


class Refused(Exception):
    """A plan action fresh state does not allow: ``code`` says which rule, ``message`` why, for the user."""

    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def summary(self) -> str:
        """The text of ``ApplyResult.rejected``: ``STALE_PLAN: <message>``."""
        return f"{Reason.STALE_PLAN}: {self.message}"


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What the rules read of a job: its state and its shape."""

    job_id: int
    state: JobState
    gpus_per_worker: int
    min_workers: int
    max_workers: int


class ApplyFacts(Protocol):
    """Contract: the applier's current state -- as the actions applied so far in this plan left it --
    read without side effects. A server or GPU an applier does not know reads as not registered /
    unusable / unheld."""

    def job(self, job_id: int) -> JobFacts | None: ...  # None: no such job

    def server_state(self, server_id: str) -> ServerState | None: ...  # None: not registered

    def server_cordoned(self, server_id: str) -> bool: ...  # an operator or its agent took it out (AdminState)

    def open_loan(self, server_id: str) -> LoanState | None: ...  # None: no loan that is not RETURNED

    def gpu_usable(self, server_id: str, index: int) -> bool: ...  # the GPU exists and is healthy

    def gpu_holder(self, server_id: str, index: int) -> int | None: ...  # the job holding it, if any

    def jobs_on(self, server_id: str) -> Collection[int]: ...  # the jobs holding any of its GPUs


# -- job actions -----------------------------------------------------------------------------------


def check_start(facts: ApplyFacts, action: StartJob) -> JobFacts:
    """A start places a pending job's whole gang (``check_placement``). Returns the job's facts."""
    job = facts.job(action.job_id)
    if job is None or job.state != JobState.PENDING:
        raise Refused(RefusalCode.JOB_NOT_PENDING,
                      f"job {action.job_id} is no longer pending (it is {_state_of(job)})")
    _check_moves(job, JobState.RUNNING)
    check_placement(facts, job, action.workers)
    return job


def check_scale(facts: ApplyFacts, action: ScaleJob) -> JobFacts:
    """A resize restarts a RUNNING job at its complete new placement (``check_placement``; a worker
    that keeps its GPUs, even under another rank, is not placed again). Returns the job's facts."""
    job = facts.job(action.job_id)
    if job is None or job.state != JobState.RUNNING:
        raise Refused(RefusalCode.JOB_NOT_RUNNING,
                      f"job {action.job_id} is {_state_of(job)}, not running: it cannot be resized")
    _check_moves(job, JobState.SCALING, JobState.RUNNING)
    check_placement(facts, job, action.workers)
    return job


def check_preemption(facts: ApplyFacts, action: PreemptJob) -> JobFacts:
    """A preemption stops a job that holds GPUs and requeues it. Returns the job's facts."""
    job = facts.job(action.job_id)
    if job is None or not job.state.holds_gpus:
        raise Refused(RefusalCode.JOB_NOT_RUNNING,
                      f"job {action.job_id} is {_state_of(job)}, not running: there is nothing to preempt")
    _check_moves(job, JobState.PREEMPTED, JobState.PENDING)
    return job


def check_placement(facts: ApplyFacts, job: JobFacts, workers: Sequence[WorkerPlacement]) -> None:
    """The job's complete placement after the action, in this order (the first broken rule refuses):
    its shape (ranks 0..n-1, min..max workers, ``gpus_per_worker`` distinct GPUs each); each *new* GPU
    -- a (server, GPU) pair the job does not hold yet -- on a server where training may run, not
    cordoned, and usable; and every planned GPU free or the job's own, and planned once."""
    ranks = sorted(w.rank for w in workers)
    if ranks != list(range(len(workers))):
        raise Refused(RefusalCode.RANKS_NOT_DENSE, f"job {job.job_id}: planned ranks {ranks} are not 0..n-1")
    if not job.min_workers <= len(workers) <= job.max_workers:
        raise Refused(RefusalCode.WORKERS_OUT_OF_RANGE, f"job {job.job_id}: {len(workers)} worker(s) planned, "
                                                        f"outside {job.min_workers}..{job.max_workers}")
    for w in workers:
        if len(set(w.gpu_indices)) != job.gpus_per_worker:
            raise Refused(RefusalCode.WRONG_GPU_COUNT, f"job {job.job_id}: rank {w.rank} has "
                                                       f"{len(set(w.gpu_indices))} GPU(s), needs {job.gpus_per_worker}")
    planned = [(w.server_id, index) for w in workers for index in w.gpu_indices]
    for server_id, index in sorted({pair for pair in planned if facts.gpu_holder(*pair) != job.job_id}):
        state = facts.server_state(server_id)
        if state not in TRAINING_CAPABLE_STATES:
            raise Refused(RefusalCode.SERVER_CANNOT_TRAIN,
                          f"server {server_id} is {state or 'not registered'}: training cannot run on it")
        if facts.server_cordoned(server_id):
            raise Refused(RefusalCode.SERVER_CORDONED,
                          f"server {server_id} is cordoned: no new worker may be placed there")
        if not facts.gpu_usable(server_id, index):
            raise Refused(RefusalCode.GPU_UNUSABLE, f"GPU {index} of server {server_id} is unhealthy or missing")
    # One GPU, at most one worker (the service's unique key is the last guard behind this).
    seen: set[tuple[str, int]] = set()
    for pair in planned:
        if pair in seen or facts.gpu_holder(*pair) not in (None, job.job_id):
            raise Refused(RefusalCode.GPU_HELD, "a planned GPU is already held by another worker")
        seen.add(pair)


def _check_moves(job: JobFacts, *targets: JobState) -> None:
    """The job's state changes the action records, one after the other, through the lifecycle table."""
    current: str = job.state
    for target in targets:
        if not JOB_LIFECYCLE.allows(current, target):
            raise Refused(RefusalCode.ILLEGAL_TRANSITION, str(IllegalTransition(JOB_LIFECYCLE.kind, current, target)))
        current = target


def _state_of(job: JobFacts | None) -> str:
    return str(job.state) if job is not None else "not found"


# -- loan steps ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoanStepRule:
    target: ServerState                 # the server's state after the step
    loan_before: LoanState | None       # the open loan the step needs (None: there must be none)
    loan_after: LoanState               # what that loan becomes (LOAN: the new loan's state)
    must_be_vacated: bool = False       # the server may hold no allocations (after the plan's job actions)
    starts_reclaim_deadline: bool = False  # the loan's hard deadline is set (``reclaim_deadline``)


# The loan cycle as data; the server side of each step is checked by SERVER_LIFECYCLE as well.
LOAN_STEPS: Mapping[LoanStep, LoanStepRule] = {
    LoanStep.LOAN: LoanStepRule(ServerState.DRAINING, None, LoanState.ACTIVE),
    LoanStep.ACTIVATE: LoanStepRule(ServerState.LOANED, LoanState.ACTIVE, LoanState.ACTIVE),
    LoanStep.CANCEL: LoanStepRule(ServerState.SERVING, LoanState.ACTIVE, LoanState.RETURNED),
    LoanStep.RECLAIM: LoanStepRule(ServerState.RECLAIMING, LoanState.ACTIVE, LoanState.RECLAIMING,
                                   must_be_vacated=True, starts_reclaim_deadline=True),
    LoanStep.RETURN: LoanStepRule(ServerState.SERVING, LoanState.RECLAIMING, LoanState.RETURNED, must_be_vacated=True),
}


def check_loan_step(facts: ApplyFacts, action: ServerAction) -> LoanStepRule:
    """One step of the loan cycle, checked in this order: the server is registered; the lifecycle
    allows the move (an illegal move is the first thing to report); its open loan is the one the step
    needs; a LOAN is of a server not cordoned; a RECLAIM or RETURN finds no workers left on it (after
    the plan's job actions, which ``apply_order`` puts first). Returns the step's rule."""
    rule = LOAN_STEPS[action.kind]
    server_id = action.server_id
    state = facts.server_state(server_id)
    if state is None:
        raise Refused(RefusalCode.SERVER_NOT_REGISTERED, f"server {server_id} is not registered")
    if not SERVER_LIFECYCLE.allows(state, rule.target):
        raise Refused(RefusalCode.ILLEGAL_TRANSITION, str(IllegalTransition(SERVER_LIFECYCLE.kind, state, rule.target)))
    loan = facts.open_loan(server_id)
    if loan != rule.loan_before:
        raise Refused(
            RefusalCode.LOAN_MISMATCH,
            f"server {server_id} has an open {loan} loan" if loan and rule.loan_before is None
            else f"server {server_id} has no {rule.loan_before} loan (found: {loan or 'none'})",
        )
    if action.kind == LoanStep.LOAN and facts.server_cordoned(server_id):
        raise Refused(RefusalCode.SERVER_CORDONED, f"server {server_id} is cordoned: it may not be loaned")
    if rule.must_be_vacated:
        holders = sorted(set(facts.jobs_on(server_id)))
        if holders:
            raise Refused(
                RefusalCode.SERVER_NOT_VACATED,
                f"server {server_id} still runs workers of job(s) {', '.join(map(str, holders))} "
                f"after this plan's job actions; {action.kind} needs it vacated",
            )
    return rule


@dataclass(frozen=True, slots=True)
class ApplySettings:
    """The parameters every applier applies a plan under, one value for both sides (the service's
    ``store.applier.Applier``, the simulator's ``SimulatedCluster``), built from the policy's (``of``) so
    that the two cannot drift apart. ``reclaim_deadline_s``: how long after a RECLAIM step the server goes
    back to inference even without its agent's confirmation (``reclaim_deadline``)."""

    reclaim_deadline_s: float = PolicyParams.reclaim_deadline_s

    @classmethod
    def of(cls, params: PolicyParams) -> ApplySettings:
        return cls(reclaim_deadline_s=params.reclaim_deadline_s)

    def reclaim_deadline(self, reclaimed_at: float) -> float:
        """The reclaim's hard deadline, set at the RECLAIM step: past it the server goes back to inference
        even without its agent's confirmation that the training workers stopped (routing still waits for
        the confirmation)."""
        return reclaimed_at + self.reclaim_deadline_s


DEFAULT_APPLY_SETTINGS = ApplySettings()  # under the default policy parameters


# -- reporting refusals ----------------------------------------------------------------------------

# What a GPU move the plan's order could not apply leaves behind: the GPU it would have freed still
# held, or the server it would have vacated still occupied.
_CAUSED_BY_A_CYCLE = frozenset({RefusalCode.GPU_HELD, RefusalCode.SERVER_NOT_VACATED})


class RefusalLog:
    """Records an applier's refusals in its ``ApplyLog`` with their codes. An action ``core.plan
    .unorderable`` names (a GPU move in a cycle, or one waiting on it), refused because a GPU was still
    held or a server not vacated, is refused as UNORDERABLE: the plan is at fault, not fresh state.
    ``unorderable`` is worked out on the first refusal only (valid plans have none); ``held`` is what
    the applier passed to ``apply_order``."""

    def __init__(self, log: ApplyLog, plan: Plan, held: Mapping[int, Iterable[tuple[str, int]]]) -> None:
        self._log = log
        self._plan = plan
        self._held = held
        self._blocked: frozenset[Action] | None = None

    def refused(self, action: Action, refusal: Refused) -> None:
        if refusal.code in _CAUSED_BY_A_CYCLE:
            if self._blocked is None:
                self._blocked = frozenset(unorderable(self._plan, self._held))
            if action in self._blocked:
                refusal = Refused(RefusalCode.UNORDERABLE, f"{refusal.message} (the plan moves GPUs in a cycle: "
                                                           "no order applies its actions one by one)")
        self._log.refused(action, refusal.summary, code=refusal.code)
