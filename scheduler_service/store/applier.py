"""The SQL applier: commits a scheduling ``Plan`` inside one transaction, re-checking every action
against fresh state and refusing alone the ones that state no longer allows.

Nouns: a *loan step* moves an inference server through the loan cycle (``_LOAN_STEPS``: LOAN,
ACTIVATE, CANCEL, RECLAIM, RETURN) with its ``loans`` row (``LoanState``); a *placement check*
(``_PlacementCheck``) holds the facts about the servers a plan places workers on; a *refusal*
(``_Refused``) is an action fresh state no longer allows, reported in ``ApplyResult.rejected``.

Never: decide (the plan did; this only re-checks and writes), or commit: the caller's transaction
does, and agents hear of the changes only after it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from scheduler_service.core.clock import Clock
from scheduler_service.core.plan import (
    ApplyLog,
    KeepPending,
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
    WorkerPlacement,
    apply_order,
)
from scheduler_service.core.snapshot import TRAINING_CAPABLE_STATES
from scheduler_service.lifecycle import JOB_LIFECYCLE, SERVER_LIFECYCLE, IllegalTransition, JobState, ServerState
from scheduler_service.store import models as m
from scheduler_service.store.changes import (
    StateChanges,
    free_allocations,
    insert_allocations,
    new_incarnation,
)
from scheduler_service.store.desired import DesiredStates


class LoanState(StrEnum):
    """``loans.state``: ACTIVE from LOAN until RECLAIM, RECLAIMING until RETURN, then RETURNED."""

    ACTIVE = "ACTIVE"
    RECLAIMING = "RECLAIMING"
    RETURNED = "RETURNED"


@dataclass(frozen=True)
class _LoanStepRule:
    target: ServerState                # the server's state after the step
    loan_before: LoanState | None      # the open loan the step needs (None: there must be none)
    loan_after: LoanState              # what that loan becomes (LOAN: the new loan's state)
    must_be_vacated: bool = False      # the server may hold no allocations (after the plan's job actions)


# The loan cycle as data; the server side of each step is checked by SERVER_LIFECYCLE as well.
_LOAN_STEPS = {
    LoanStep.LOAN: _LoanStepRule(ServerState.DRAINING, None, LoanState.ACTIVE),
    LoanStep.ACTIVATE: _LoanStepRule(ServerState.LOANED, LoanState.ACTIVE, LoanState.ACTIVE),
    LoanStep.CANCEL: _LoanStepRule(ServerState.SERVING, LoanState.ACTIVE, LoanState.RETURNED),
    LoanStep.RECLAIM: _LoanStepRule(ServerState.RECLAIMING, LoanState.ACTIVE, LoanState.RECLAIMING, True),
    LoanStep.RETURN: _LoanStepRule(ServerState.SERVING, LoanState.RECLAIMING, LoanState.RETURNED, True),
}

# A plan with at least this many starts applies them as one batch (``_apply_starts_together``).
_BATCH_STARTS_FROM = 2


class Applier:
    """``reclaim_deadline_s``: how long after a RECLAIM the server goes back to inference even
    without its agent's confirmation (the policy's ``reclaim_deadline_s``)."""

    def __init__(
        self, changes: StateChanges, desired: DesiredStates, clock: Clock, *, reclaim_deadline_s: float
    ) -> None:
        self._changes = changes
        self._desired = desired
        self._clock = clock
        self._reclaim_deadline_s = reclaim_deadline_s

    def apply(self, session: Session, plan: Plan) -> ApplyLog:
        """Apply ``plan`` in ``session``, in ``core.plan.apply_order`` (shared with the simulator):
        ACTIVATE steps, preemptions, scales that release GPUs, starts, other scales, other loan steps --
        so GPUs freed by one action serve a later one and loan steps see what the job actions left;
        then pending reasons.

        Each action is re-checked against fresh state inside its own savepoint and refused alone, with
        the reason in ``ApplyResult.rejected``, when that state no longer allows it: the job or server is
        not in the state the action expects (the lifecycle tables refuse the move), a planned GPU is held
        by another worker (the unique key), missing or unhealthy, a new worker's server cannot run
        training, or a server to reclaim or return still holds workers.

        Every server whose allocations or state changed gets one desired-generation bump."""
        log = ApplyLog()  # per attempt: a retried transaction starts over
        now = self._clock.now()
        job_ids = sorted({p.job_id for p in plan.preemptions} | {s.job_id for s in plan.scales}
                         | {s.job_id for s in plan.starts})
        # One query for every job the plan names; the dict keeps them alive (the identity map is weak).
        jobs: dict[int, m.Job] = {}
        if job_ids:
            jobs = {job.id: job for job in session.scalars(sa.select(m.Job).where(m.Job.id.in_(job_ids)))}
        placement: _PlacementCheck | None = None  # read after the ACTIVATE steps, which come first
        held: dict[int, list[tuple[str, int]]] = defaultdict(list)
        for alloc in session.execute(
            sa.select(m.Allocation.job_id, m.Allocation.server_id, m.Allocation.gpu_index)
            .where(m.Allocation.job_id.in_([s.job_id for s in plan.scales]))
        ):
            held[alloc.job_id].append((alloc.server_id, alloc.gpu_index))

        together: set[int] | None = None  # the starts applied as one batch (_apply_starts_together)
        for action in apply_order(plan, held):
            if not isinstance(action, ServerAction) and placement is None:
                placement = _PlacementCheck.load(session, (*plan.starts, *plan.scales))
            if isinstance(action, StartJob):
                if together is None:
                    assert placement is not None
                    together = (self._apply_starts_together(session, plan.starts, jobs, placement, now, log)
                                if len(plan.starts) >= _BATCH_STARTS_FROM else set())
                if action.job_id in together:
                    continue
            try:
                with session.begin_nested():
                    if isinstance(action, ServerAction):
                        servers = self._apply_server_step(session, action, now)
                    elif isinstance(action, PreemptJob):
                        servers = self._apply_preemption(session, jobs.get(action.job_id), action)
                    elif isinstance(action, ScaleJob):
                        assert placement is not None
                        servers = self._apply_scale(session, jobs.get(action.job_id), action, placement, now)
                    else:
                        assert placement is not None
                        servers = self._apply_start(session, jobs.get(action.job_id), action, placement, now)
                    session.flush()  # constraint and version checks fire here, inside the savepoint
            except (IntegrityError, StaleDataError, IllegalTransition, _Refused) as exc:
                log.refused(action, _refusal_message(exc, server_step=isinstance(action, ServerAction)))
                continue
            log.applied(action, servers)
        self._desired.bump(session, log.touched)
        self._apply_pending(session, plan.pending)
        return log

    def _apply_preemption(self, session: Session, job: m.Job | None, action: PreemptJob) -> set[str]:
        """Stop every worker and requeue: RUNNING -> PREEMPTED -> PENDING, both recorded with the
        action's reason; the reason also becomes the pending reason ExplainJob shows."""
        if job is None or not JobState(job.state).holds_gpus:
            raise _Refused(f"job {action.job_id} is {_state_of(job)}, not running: there is nothing to preempt")
        servers = free_allocations(session, job.id)
        job.num_workers = 0
        job.preemptions += 1
        job.pending_reason = f"{action.reason}: {action.message}"[:1024]
        self._changes.set_job_state(session, job, JobState.PREEMPTED, action.reason, action.message)
        self._changes.set_job_state(session, job, JobState.PENDING, action.reason, f"requeued: {action.message}")
        return servers

    def _apply_scale(
        self, session: Session, job: m.Job | None, action: ScaleJob, placement: _PlacementCheck, now: float
    ) -> set[str]:
        """Replace the job's allocations with exactly the planned placement (workers that stay keep
        their rows) and record RUNNING -> SCALING -> RUNNING. A resize is not a restart: ``restarts``
        counts failures only."""
        if job is None or job.state != JobState.RUNNING:
            raise _Refused(f"job {action.job_id} is {_state_of(job)}, not running: it cannot be resized")
        a = m.ALLOCATIONS.c
        current = session.execute(
            sa.select(a.id, a.rank, a.server_id, a.gpu_index).where(a.job_id == job.id)
        ).all()
        planned = {(w.rank, w.server_id, index) for w in action.workers for index in w.gpu_indices}
        held = {(row.rank, row.server_id, row.gpu_index) for row in current}
        # New GPUs are the (server, GPU) pairs the job does not hold yet: a worker that stays but is
        # renumbered (a shrink off a lost server) keeps its GPUs and is not placed again.
        placement.check(job, action.workers, new_gpus={(s, index) for _, s, index in planned}
                        - {(s, index) for _, s, index in held})
        # Delete before insert: a GPU that changes rank within the job must be free again first.
        gone = [row.id for row in current if (row.rank, row.server_id, row.gpu_index) not in planned]
        if gone:
            session.execute(sa.delete(m.ALLOCATIONS).where(a.id.in_(gone)))
        insert_allocations(session, job.id, sorted(planned - held), now)
        self._changes.set_job_state(session, job, JobState.SCALING, action.reason, action.message)
        new_incarnation(job, action.workers)
        job.num_workers = len(action.workers)
        job.last_resized_at = now
        self._changes.set_job_state(
            session, job, JobState.RUNNING, action.reason, f"{action.message} (now {len(action.workers)} worker(s))"
        )
        # Every worker restarts at the new world size, so every server it ran or runs on changes.
        return {row.server_id for row in current} | {w.server_id for w in action.workers}

    def _apply_start(
        self, session: Session, job: m.Job | None, action: StartJob, placement: _PlacementCheck, now: float
    ) -> set[str]:
        if job is None or job.state != JobState.PENDING:
            raise _Refused(f"job {action.job_id} is no longer pending (it is {_state_of(job)})")
        planned = [(w.rank, w.server_id, index) for w in action.workers for index in w.gpu_indices]
        placement.check(job, action.workers, new_gpus={(s, index) for _, s, index in planned})
        insert_allocations(session, job.id, planned, now)  # the unique key refuses a GPU already held
        new_incarnation(job, action.workers)
        job.num_workers = len(action.workers)
        job.started_at = job.started_at or now
        job.last_resized_at = now
        job.pending_reason = ""
        self._changes.set_job_state(session, job, JobState.RUNNING, action.reason, action.message)
        return {w.server_id for w in action.workers}

    def _apply_starts_together(
        self, session: Session, starts: Sequence[StartJob], jobs: dict[int, m.Job], placement: _PlacementCheck,
        now: float, log: ApplyLog,
    ) -> set[int]:
        """Apply ``starts`` in one savepoint with a fixed number of statements, however many there are
        (one plan after a burst of submissions starts 100s of jobs); returns the ids applied.

        Does exactly what ``_apply_start`` does per start, and re-checks the same things: starts refused
        in Python (job no longer pending, bad shape, server or GPU unusable) are left out here and
        refused by the one-by-one path. When the database refuses the batch (a GPU already held, a job
        changed since it was read) the savepoint is rolled back and nothing is applied: the caller
        applies every start alone, so the culprit is refused alone, with its reason."""
        ready: list[tuple[StartJob, m.Job, list[tuple[int, str, int]]]] = []
        for action in starts:
            job = jobs.get(action.job_id)
            if job is None or job.state != JobState.PENDING:
                continue
            planned = [(w.rank, w.server_id, index) for w in action.workers for index in w.gpu_indices]
            try:
                placement.check(job, action.workers, new_gpus={(s, index) for _, s, index in planned})
                JOB_LIFECYCLE.check(job.state, JobState.RUNNING)
            except (_Refused, IllegalTransition):
                continue
            ready.append((action, job, planned))
        if not ready:
            return set()
        j = m.JOBS
        try:
            with session.begin_nested():
                # The rows stay locked until commit, so the versions compared here are the ones written.
                current = {
                    row.id: row for row in session.execute(
                        sa.select(j.c.id, j.c.version, j.c.state)
                        .where(j.c.id.in_([job.id for _, job, _ in ready])).with_for_update()
                    )
                }
                if any(
                    (row := current.get(job.id)) is None or row.version != job.version or row.state != job.state
                    for _, job, _ in ready
                ):
                    raise _Refused("a job changed since it was read")
                session.execute(sa.insert(m.ALLOCATIONS), [
                    dict(job_id=job.id, rank=rank, server_id=server_id, gpu_index=index, allocated_at=now)
                    for _, job, planned in ready for rank, server_id, index in planned
                ])
                session.execute(
                    sa.update(j).where(j.c.id == sa.bindparam("b_id")).values(
                        state=JobState.RUNNING, state_reason=sa.bindparam("b_reason"),
                        state_message=sa.bindparam("b_message"), pending_reason="",
                        num_workers=sa.bindparam("b_workers"), incarnation=sa.bindparam("b_incarnation"),
                        worker_exits=None, rank_servers=sa.bindparam("b_rank_servers"),
                        started_at=sa.func.coalesce(j.c.started_at, now), last_resized_at=now,
                        version=j.c.version + 1,
                    ),
                    [
                        dict(b_id=job.id, b_reason=action.reason, b_message=action.message[:1024],
                             b_workers=len(action.workers), b_incarnation=(job.incarnation or 0) + 1,
                             b_rank_servers={**(job.rank_servers or {}),
                                             **{str(w.rank): w.server_id for w in action.workers}})
                        for action, job, _ in ready
                    ],
                )
                recorded = self._clock.now()  # events are stamped when recorded, as one start at a time is
                session.execute(sa.insert(m.EVENTS), [
                    dict(time=recorded, kind="JOB_STATE_CHANGED", job_id=job.id, server_id=None, from_state=job.state,
                         to_state=JobState.RUNNING, reason=action.reason, message=action.message[:2048], details={})
                    for action, job, _ in ready
                ])
        except (IntegrityError, _Refused):
            return set()
        for action, job, _ in ready:
            session.expire(job)  # written above without the ORM: reloaded if a later action touches it
            log.applied(action, {w.server_id for w in action.workers})
        return {action.job_id for action, _, _ in ready}

    def _apply_server_step(self, session: Session, action: ServerAction, now: float) -> set[str]:
        """One step of the loan cycle (see ``_LOAN_STEPS``): the server's transition, its loan row, and
        LOAN_STARTED / LOAN_ENDED events."""
        rule = _LOAN_STEPS[action.kind]
        server = session.get(m.Server, action.server_id)
        if server is None:
            raise _Refused(f"server {action.server_id} is not registered")
        SERVER_LIFECYCLE.check(server.state, rule.target)  # an illegal move is the first thing to report
        loan = session.scalar(
            sa.select(m.Loan).where(m.Loan.server_id == server.id, m.Loan.state != LoanState.RETURNED)
        )
        if (loan.state if loan else None) != rule.loan_before:
            raise _Refused(
                f"server {server.id} has an open {loan.state} loan" if loan and rule.loan_before is None
                else f"server {server.id} has no {rule.loan_before} loan (found: {loan.state if loan else 'none'})"
            )
        if rule.must_be_vacated:
            holders = sorted(set(session.scalars(
                sa.select(m.Allocation.job_id).where(m.Allocation.server_id == server.id)
            )))
            if holders:
                raise _Refused(
                    f"server {server.id} still runs workers of job(s) {', '.join(map(str, holders))} "
                    f"after this plan's job actions; {action.kind} needs it vacated"
                )
        self._changes.set_server_state(session, server, rule.target, action.reason, action.message)
        summary = f"{action.reason}: {action.message}"[:1024]
        if loan is None:
            loan = m.Loan(server_id=server.id, state=rule.loan_after, reason=summary, started_at=now, ended_at=None)
            session.add(loan)
            session.flush()  # the loan's id, for the event; the one-open-loan index checks here
            self._changes.event(session, "LOAN_STARTED", server_id=server.id, reason=action.reason,
                                message=action.message[:2048], details={"loan_id": str(loan.id)})
        elif rule.loan_after != loan.state:
            loan.state = rule.loan_after
            if action.kind == LoanStep.RECLAIM:
                # The reclaim's hard deadline: past it the server goes back to inference even without
                # the agent's confirmation (the policy's ``reclaim_deadline_s``).
                loan.hard_deadline = now + self._reclaim_deadline_s
            if rule.loan_after == LoanState.RETURNED:
                loan.ended_at = now
                loan.reason = summary
                self._changes.event(
                    session, "LOAN_ENDED", server_id=server.id, reason=action.reason,
                    message=f"{action.message} (loaned for {now - loan.started_at:.0f}s)"[:2048],
                    details={"loan_id": str(loan.id)},
                )
        return {server.id}

    def _apply_pending(self, session: Session, pending: Sequence[KeepPending]) -> None:
        """Record new pending reasons in bulk: one UPDATE and one events INSERT for all of them."""
        if not pending:
            return
        jobs = m.JOBS
        still_pending = set(
            session.scalars(
                sa.select(jobs.c.id)
                .where(jobs.c.id.in_([p.job_id for p in pending]), jobs.c.state == JobState.PENDING)
                .with_for_update()
            )
        )
        items = [p for p in pending if p.job_id in still_pending]
        if not items:
            return
        session.execute(
            sa.update(jobs)
            .where(jobs.c.id == sa.bindparam("job_id"))
            .values(pending_reason=sa.bindparam("why"), version=jobs.c.version + 1),
            [{"job_id": p.job_id, "why": p.summary} for p in items],
        )
        now = self._clock.now()
        session.execute(
            sa.insert(m.EVENTS),
            [
                dict(time=now, kind="JOB_PENDING_REASON", job_id=p.job_id, server_id=None, from_state="",
                     to_state="", reason=p.reason, message=p.message[:2048], details={})
                for p in items
            ],
        )


class _Refused(Exception):
    """A plan action that fresh state no longer allows; ``str()`` says why, for ``ApplyResult.rejected``."""


@dataclass(frozen=True)
class _PlacementCheck:
    """Fresh facts about the servers a plan places workers on, read once per ``apply``: which can run
    training, and which of their GPUs exist and are healthy. Server states do not change during the job
    actions (loan steps other than ACTIVATE come after them), so one read serves every action."""

    server_states: dict[str, str]
    healthy_gpus: frozenset[tuple[str, int]]

    @classmethod
    def load(cls, session: Session, actions: Sequence[StartJob | ScaleJob]) -> _PlacementCheck:
        server_ids = sorted({w.server_id for action in actions for w in action.workers})
        if not server_ids:
            return cls({}, frozenset())
        s, g = m.SERVERS.c, m.GPUS.c
        states = dict(session.execute(sa.select(s.id, s.state).where(s.id.in_(server_ids))).all())
        healthy = session.execute(
            sa.select(g.server_id, g.index).where(g.server_id.in_(server_ids), g.healthy)
        )
        return cls(states, frozenset((server_id, index) for server_id, index in healthy))

    def check(self, job: m.Job, workers: Sequence[WorkerPlacement], new_gpus: set[tuple[str, int]]) -> None:
        """Refuse a placement that breaks the job's shape, or puts a new worker where training cannot
        run. ``new_gpus``: the (server, GPU) pairs the job does not hold yet (kept workers stay put)."""
        if sorted(w.rank for w in workers) != list(range(len(workers))):
            raise _Refused(f"job {job.id}: planned ranks {sorted(w.rank for w in workers)} are not 0..n-1")
        if not job.min_workers <= len(workers) <= job.max_workers:
            raise _Refused(
                f"job {job.id}: {len(workers)} worker(s) planned, outside {job.min_workers}..{job.max_workers}"
            )
        for w in workers:
            if len(set(w.gpu_indices)) != job.gpus_per_worker:
                raise _Refused(f"job {job.id}: rank {w.rank} has {len(set(w.gpu_indices))} GPU(s), "
                               f"needs {job.gpus_per_worker}")
        for server_id, index in sorted(new_gpus):
            state = self.server_states.get(server_id)
            if state not in TRAINING_CAPABLE_STATES:
                raise _Refused(f"server {server_id} is {state or 'not registered'}: training cannot run on it")
            if (server_id, index) not in self.healthy_gpus:
                raise _Refused(f"GPU {index} of server {server_id} is unhealthy or missing")


def _state_of(job: m.Job | None) -> str:
    return job.state if job is not None else "not found"


def _refusal_message(exc: Exception, *, server_step: bool = False) -> str:
    if isinstance(exc, IntegrityError):
        if server_step:  # the one-open-loan-per-server index: a concurrent LOAN won
            return f"{Reason.STALE_PLAN}: the server's loan changed while the plan was made"
        return f"{Reason.STALE_PLAN}: a planned GPU is already held by another worker"
    if isinstance(exc, StaleDataError):
        return f"{Reason.STALE_PLAN}: the job or server changed while the plan was made"
    return f"{Reason.STALE_PLAN}: {exc}"
