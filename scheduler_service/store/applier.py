"""The SQL applier: commits a scheduling ``Plan`` inside one transaction, re-checking every action
against fresh state and refusing alone the ones that state no longer allows.

The rules are not here: ``core.apply_rules`` holds them once for this applier and the simulator's
(a start's, a resize's, a preemption's preconditions, the loan cycle ``LOAN_STEPS``, the reclaim's
hard deadline). This module reads what they ask about and writes what an allowed action does.

Nouns: a *loan step* moves an inference server through the loan cycle (LOAN, ACTIVATE, CANCEL,
RECLAIM, RETURN) with its ``loans`` row (``LoanState``); the *facts* (``store.apply_facts.SessionFacts``)
are what the rules read -- the plan's jobs, and the servers, GPUs, allocations and open loans it touches --
loaded once per apply and kept up to date in memory as its actions apply; a *refusal*
(``core.apply_rules.Refused``) is an action fresh state no longer allows, reported in
``ApplyResult.rejected`` with its code. The database's unique keys and row versions stay the last
guard: a change another transaction made since the facts were read is refused there, alone. Pending
reasons are written in bulk by ``store.pending_reasons``.

Never: decide (the plan did; this only re-checks and writes), or commit: the caller's transaction
does, and agents hear of the changes only after it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from scheduler_service.core.apply_rules import (
    ApplySettings,
    LoanState,
    RefusalCode,
    RefusalLog,
    Refused,
    check_loan_step,
    check_preemption,
    check_scale,
    check_start,
)
from scheduler_service.core.batch import job_batch
from scheduler_service.core.clock import Clock
from scheduler_service.core.goodput import BatchSplit
from scheduler_service.core.plan import (
    ApplyLog,
    KeepPending,
    KeepSize,
    LoanNote,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
    WorkerPlacement,
    apply_order,
)
from scheduler_service.core.protection import record_disruption
from scheduler_service.lifecycle import IllegalTransition, JobState
from scheduler_service.store import models as m
from scheduler_service.store.apply_facts import SessionFacts
from scheduler_service.store.changes import (
    StateChanges,
    free_allocations,
    insert_allocations,
    new_incarnation,
)
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.pending_reasons import (
    NO_STAMPS,
    pending_reasons_in_bulk,
    pending_reasons_in_one_statement,
)
from scheduler_service.store.ports import MasterPorts
from scheduler_service.store.rows import batch_limits
from scheduler_service.store.transactions import is_postgresql

# A plan with at least this many starts applies them together (``_apply_starts_together``).
_STARTS_TOGETHER_FROM = 2


@dataclass
class SqlApplyLog(ApplyLog):
    """``ApplyLog`` and the jobs whose pending reason alone this applier wrote, on the row version a snapshot
    read, as (job, that version's stamp, the new version's, the reason) (``SnapshotReader.reasons_written``)."""

    restamped: list[tuple[int, str, str, str]] = field(default_factory=list)


class Applier:
    """``settings``: the parameters a plan is applied under, the simulator's as well
    (``core.apply_rules.ApplySettings``: the policy's reclaim deadline)."""

    def __init__(
        self, changes: StateChanges, desired: DesiredStates, clock: Clock, *, settings: ApplySettings,
        ports: MasterPorts | None = None,
    ) -> None:
        self._changes = changes
        self._desired = desired
        self._clock = clock
        self._settings = settings
        self._ports = ports or MasterPorts()

    def apply(self, session: Session, plan: Plan, stamps: Mapping[int, str] = NO_STAMPS) -> SqlApplyLog:
        """Apply ``plan`` in ``session``, in ``core.plan.apply_order`` (shared with the simulator):
        ACTIVATE steps, preemptions, scales that release GPUs, starts, other scales, other loan steps --
        so GPUs freed by one action serve a later one and loan steps see what the job actions left;
        then pending reasons.

        Each action is re-checked by ``core.apply_rules`` against the facts as the earlier actions left
        them, then written inside its own savepoint, and refused alone, with the reason in
        ``ApplyResult.rejected`` and the rule's code in ``ApplyResult.rejected_codes``, when that state
        no longer allows it; so is one the database refuses (a unique key or row version: a change
        another transaction made meanwhile).

        Every server whose allocations or state changed gets one desired-generation bump."""
        log = SqlApplyLog()  # per attempt: a retried transaction starts over
        now = self._clock.now()
        facts = SessionFacts.load(session, plan)
        held = facts.held_by(s.job_id for s in plan.scales)
        refusals = RefusalLog(log, plan, held)
        together: set[int] | None = None  # the starts applied together (_apply_starts_together)
        for action in apply_order(plan, held):
            if isinstance(action, StartJob):
                if together is None:
                    together = (self._apply_starts_together(session, plan.starts, facts, now, log)
                                if len(plan.starts) >= _STARTS_TOGETHER_FROM else set())
                if action.job_id in together:
                    continue
            loan: m.Loan | None = None  # a loan step's loan row, as the step left it
            try:
                with session.begin_nested():
                    if isinstance(action, ServerAction):
                        servers, loan = self._apply_server_step(session, facts, action, now)
                    elif isinstance(action, PreemptJob):
                        servers = self._apply_preemption(session, facts, action, now)
                    elif isinstance(action, ScaleJob):
                        servers = self._apply_scale(session, facts, action, now)
                    else:
                        servers = self._apply_start(session, facts, action, now)
                    session.flush()  # constraint and version checks fire here, inside the savepoint
            except (IntegrityError, StaleDataError, IllegalTransition, Refused) as exc:
                refusal = _refusal(exc, server_step=isinstance(action, ServerAction))
                refusals.refused(action, refusal)
                if refusal.code == RefusalCode.MASTER_PORT_RANGE_FULL and isinstance(action, StartJob):
                    # Not a stale plan: the job waits, and says why once (the next cycle plans it again).
                    waits = KeepPending(action.job_id, Reason.WAITING_FOR_MASTER_PORT, refusal.message)
                    if facts.row(action.job_id).pending_reason != waits.summary:
                        self._apply_pending(session, [waits])
                continue
            facts.applied(action, loan)
            log.applied(action, servers)
        self._apply_batches(session, plan, facts, log)
        self._desired.bump(session, log.touched)
        # The last write of a PENDING job in this transaction (the held notes are running jobs'): a stamp
        # in ``log.restamped`` is the committed version's.
        log.restamped = self._apply_pending(session, plan.pending, stamps)
        self._apply_held(session, plan.held)
        if plan.loan_note is not None:
            self._apply_loan_note(session, plan.loan_note)
        return log

    def _apply_batches(self, session: Session, plan: Plan, facts: SessionFacts, log: ApplyLog) -> None:
        """Record the batch each job with batch limits runs with once this plan applied, for the GPUs it
        holds now, with JOB_BATCH_CHANGED when it changed: the plan's choice (``Plan.batches``), else,
        for a job the plan started or resized, the default for its new size (``core.batch.job_batch``: a
        choice holds only for the GPU count it was made for). A start or resize restarts the workers
        with it; a choice alone reaches the running workers in place (``node_agent.contract``), through
        their servers' desired state.

        A choice is left out, as a policy's slip and not a state change, for a job without batch limits
        or holding no GPU, outside the job's limits (a pass above its largest per-GPU batch, a total
        above its largest), or for a job whose start or resize this plan saw refused (it was chosen for
        the size the job did not get). The plan's jobs the facts know have no batch limits are left out
        without a read: after the decision is recorded every round trip delays its push."""
        resized = set(log.started) | set(log.scaled)
        refused = ({a.job_id for a in plan.starts} | {a.job_id for a in plan.scales}) - resized
        chosen = {b.job_id: b for b in plan.batches if b.job_id not in refused}
        ids = sorted(job_id for job_id in resized | set(chosen) if facts.may_have_batch_limits(job_id))
        if not ids:
            return
        j, a = m.JOBS.c, m.ALLOCATIONS.c
        rows = {row.id: row for row in session.execute(
            sa.select(j.id, j.batch_init, j.batch_max, j.batch_max_local, j.batch_local, j.batch_accum,
                      j.batch_replicas).where(j.id.in_(ids), j.batch_init.is_not(None)))}
        servers: dict[int, list[str]] = defaultdict(list)
        for job_id, server_id in session.execute(
            sa.select(a.job_id, a.server_id).where(a.job_id.in_(sorted(rows)))
        ):
            servers[job_id].append(server_id)
        for job_id, row in sorted(rows.items()):
            held, limits = servers.get(job_id, []), batch_limits(row.batch_init, row.batch_max, row.batch_max_local)
            if not held or limits is None:
                continue
            gpus = len(held)
            stored = BatchSplit(row.batch_local, row.batch_accum or 0) if row.batch_local else None
            batch, reason = job_batch(limits, stored, row.batch_replicas, gpus), "BATCH_DEFAULT"
            choice = chosen.get(job_id)
            if choice is not None and 1 <= choice.atomic_bsz <= limits.max_atomic_bsz and choice.accum_steps >= 0 \
                    and gpus * choice.atomic_bsz * (choice.accum_steps + 1) <= limits.max_bsz:
                batch, reason = BatchSplit(choice.atomic_bsz, choice.accum_steps), "BATCH_CHOSEN"
            if batch is None or (row.batch_local, row.batch_accum, row.batch_replicas) == (
                    batch.atomic_bsz, batch.accum_steps, gpus):
                continue
            session.execute(sa.update(m.JOBS).where(j.id == job_id).values(
                batch_local=batch.atomic_bsz, batch_accum=batch.accum_steps, batch_replicas=gpus))
            why = "chosen by the policy" if reason == "BATCH_CHOSEN" else "its init batch over its GPUs"
            self._changes.event(
                session, "JOB_BATCH_CHANGED", job_id=job_id, reason=reason,
                message=f"batch {batch.total(gpus)} = {gpus} GPU(s) x {batch.atomic_bsz} per pass x "
                        f"{batch.accum_steps + 1} pass(es) per step ({why})",
                details={"local_batch_size": str(batch.atomic_bsz), "accum_steps": str(batch.accum_steps),
                         "batch_size": str(batch.total(gpus)), "gpus": str(gpus)},
            )
            log.rebatched.append(job_id)
            log.touched.update(held)

    def _apply_preemption(self, session: Session, facts: SessionFacts, action: PreemptJob,
                          now: float) -> set[str]:
        """Stop every worker and requeue: RUNNING -> PREEMPTED -> PENDING, both recorded with the
        action's reason; the reason also becomes the pending reason ExplainJob shows."""
        check_preemption(facts, action)
        job = facts.row(action.job_id)
        servers = free_allocations(session, job.id)
        job.num_workers = 0
        job.preemptions += 1
        job.disruptions = list(record_disruption(job.disruptions, now))  # core.protection's cap counts it
        job.pending_reason = f"{action.reason}: {action.message}"[:1024]
        job.size_note = ""  # it no longer runs: nothing holds its size
        self._changes.set_job_state(session, job, JobState.PREEMPTED, action.reason, action.message)
        self._changes.set_job_state(session, job, JobState.PENDING, action.reason, f"requeued: {action.message}")
        return servers

    def _apply_scale(self, session: Session, facts: SessionFacts, action: ScaleJob, now: float) -> set[str]:
        """Replace the job's allocations with exactly the planned placement (workers that stay keep
        their rows) and record RUNNING -> SCALING -> RUNNING. A resize is not a restart: ``restarts``
        counts failures only."""
        check_scale(facts, action)
        job = facts.row(action.job_id)
        a = m.ALLOCATIONS.c
        current = session.execute(
            sa.select(a.id, a.rank, a.server_id, a.gpu_index).where(a.job_id == job.id)
        ).all()
        planned = {(w.rank, w.server_id, index) for w in action.workers for index in w.gpu_indices}
        held = {(row.rank, row.server_id, row.gpu_index) for row in current}
        # Delete before insert: a GPU that changes rank within the job must be free again first.
        gone = [row.id for row in current if (row.rank, row.server_id, row.gpu_index) not in planned]
        if gone:
            session.execute(sa.delete(m.ALLOCATIONS).where(a.id.in_(gone)))
        insert_allocations(session, job.id, sorted(planned - held), now)
        self._ports.assign(session, [(job.id, _rank0_server(action.workers))], now)
        self._changes.set_job_state(session, job, JobState.SCALING, action.reason, action.message)
        new_incarnation(job, action.workers)
        job.num_workers = len(action.workers)
        job.last_resized_at = now
        job.disruptions = list(record_disruption(job.disruptions, now))  # core.protection's cap counts it
        self._changes.set_job_state(
            session, job, JobState.RUNNING, action.reason, f"{action.message} (now {len(action.workers)} worker(s))"
        )
        # Every worker restarts at the new world size, so every server it ran or runs on changes.
        return {row.server_id for row in current} | {w.server_id for w in action.workers}

    def _apply_start(self, session: Session, facts: SessionFacts, action: StartJob, now: float) -> set[str]:
        check_start(facts, action)
        job = facts.row(action.job_id)
        planned = [(w.rank, w.server_id, index) for w in action.workers for index in w.gpu_indices]
        insert_allocations(session, job.id, planned, now)  # the unique key: a GPU taken meanwhile
        self._ports.assign(session, [(job.id, _rank0_server(action.workers))], now)
        new_incarnation(job, action.workers)
        job.num_workers = len(action.workers)
        job.started_at = job.started_at or now
        job.last_resized_at = now
        job.pending_reason = ""
        self._changes.set_job_state(session, job, JobState.RUNNING, action.reason, action.message)
        return {w.server_id for w in action.workers}

    def _apply_starts_together(
        self, session: Session, starts: Sequence[StartJob], facts: SessionFacts, now: float, log: ApplyLog,
    ) -> set[int]:
        """Apply ``starts`` in one savepoint with a fixed number of statements, however many there are
        (one plan after a burst of submissions starts 100s of jobs); returns the ids applied.

        Does exactly what ``_apply_start`` does per start, and checks each with the same rule
        (``check_start``), in order, each against the facts with the earlier starts' GPUs taken -- as
        one start at a time sees them. Starts the rule refuses are left out here and refused by the
        one-by-one path, with their reasons. When the database refuses them (a GPU taken or a job
        changed by another transaction since the facts were read) the savepoint is rolled back and
        nothing is applied: the caller applies every start alone, so the culprit is refused alone."""
        ready: list[tuple[StartJob, m.Job]] = []
        for action in starts:
            try:
                check_start(facts, action)
            except Refused:
                continue
            facts.applied(action)  # the later starts of ``starts`` see these GPUs taken
            ready.append((action, facts.row(action.job_id)))
        if not ready:
            return set()
        j = m.JOBS
        try:
            with session.begin_nested():
                # The rows stay locked until commit, so the versions compared here are the ones written.
                current = {
                    row.id: row for row in session.execute(
                        sa.select(j.c.id, j.c.version, j.c.state)
                        .where(j.c.id.in_([job.id for _, job in ready])).with_for_update()
                    )
                }
                if any(
                    (row := current.get(job.id)) is None or row.version != job.version or row.state != job.state
                    for _, job in ready
                ):
                    raise Refused(RefusalCode.CHANGED_CONCURRENTLY, "a job changed since it was read")
                session.execute(sa.insert(m.ALLOCATIONS), [
                    dict(job_id=job.id, rank=w.rank, server_id=w.server_id, gpu_index=index, allocated_at=now)
                    for action, job in ready for w in action.workers for index in w.gpu_indices
                ])
                self._ports.assign(session, [(job.id, _rank0_server(action.workers)) for action, job in ready], now)
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
                        for action, job in ready
                    ],
                )
                recorded = self._clock.now()  # events are stamped when recorded, as one start at a time is
                session.execute(sa.insert(m.EVENTS), [
                    dict(time=recorded, kind="JOB_STATE_CHANGED", job_id=job.id, server_id=None, from_state=job.state,
                         to_state=JobState.RUNNING, reason=action.reason, message=action.message[:2048], details={})
                    for action, job in ready
                ])
        except (IntegrityError, Refused):
            for action, _ in ready:
                facts.undo_start(action)
            return set()
        for action, job in ready:
            session.expire(job)  # written above without the ORM: reloaded if a later action touches it
            log.applied(action, {w.server_id for w in action.workers})
        return {action.job_id for action, _ in ready}

    def _apply_server_step(
        self, session: Session, facts: SessionFacts, action: ServerAction, now: float
    ) -> tuple[set[str], m.Loan]:
        """One step of the loan cycle (``core.apply_rules.LOAN_STEPS``): the server's transition, its
        loan row (returned), and LOAN_STARTED / LOAN_ENDED events."""
        rule = check_loan_step(facts, action)
        server = facts.server_row(action.server_id)
        loan = facts.loan_row(action.server_id)
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
            if rule.starts_reclaim_deadline:
                loan.hard_deadline = self._settings.reclaim_deadline(now)
            if rule.loan_after == LoanState.RETURNED:
                loan.ended_at = now
                loan.reason = summary
                self._changes.event(
                    session, "LOAN_ENDED", server_id=server.id, reason=action.reason,
                    message=f"{action.message} (loaned for {now - loan.started_at:.0f}s)"[:2048],
                    details={"loan_id": str(loan.id)},
                )
        return {server.id}, loan

    def _apply_pending(self, session: Session, pending: Sequence[KeepPending],
                       stamps: Mapping[int, str] = NO_STAMPS) -> list[tuple[int, str, str, str]]:
        """Record new pending reasons in bulk, each with a JOB_PENDING_REASON event, for the jobs still
        PENDING: on PostgreSQL in one statement (a burst of submits brings thousands a cycle), elsewhere
        one SELECT, one UPDATE and one events INSERT for all of them. ``stamps``: the row versions (PostgreSQL
        ``xmin``) the plan's snapshot read; see ``pending_reasons_in_one_statement``."""
        if not pending:
            return []
        if is_postgresql(session):
            return pending_reasons_in_one_statement(session, pending, self._clock.now(), stamps)
        pending_reasons_in_bulk(session, pending, self._clock.now())
        return []

    def _apply_held(self, session: Session, held: Sequence[KeepSize]) -> None:
        """Record new size notes of running jobs in bulk (a JOB_SIZE_HELD event for each that says
        something; a clearing one writes none): the decision not to resize, once per decision."""
        jobs = m.JOBS
        running = set(session.scalars(
            sa.select(jobs.c.id).where(jobs.c.id.in_([h.job_id for h in held]),
                                       jobs.c.state.in_([JobState.RUNNING, JobState.SCALING]))
        )) if held else set()
        items = [h for h in held if h.job_id in running]
        if not items:
            return
        session.execute(
            sa.update(jobs).where(jobs.c.id == sa.bindparam("job_id"))
            .values(size_note=sa.bindparam("note"), version=jobs.c.version + 1),
            [{"job_id": h.job_id, "note": h.summary} for h in items],
        )
        now = self._clock.now()
        said = [h for h in items if h.reason is not None]
        if said:
            session.execute(sa.insert(m.EVENTS), [
                dict(time=now, kind="JOB_SIZE_HELD", job_id=h.job_id, server_id=None, from_state="", to_state="",
                     reason=h.reason, message=h.message[:2048], details={})
                for h in said
            ])

    def _apply_loan_note(self, session: Session, note: LoanNote) -> None:
        """Replace the standing loan note (a LOAN_DECISION event when it says something; a clearing
        one deletes it)."""
        n = m.SCHEDULER_NOTES
        session.execute(sa.delete(n).where(n.c.topic == m.LOANS_TOPIC))
        if note.reason is None:
            return
        now = self._clock.now()
        session.execute(sa.insert(n).values(topic=m.LOANS_TOPIC, reason=note.reason, message=note.message[:1024],
                                            since=now))
        self._changes.event(session, "LOAN_DECISION", reason=note.reason, message=note.message[:2048])


def _rank0_server(workers: Sequence[WorkerPlacement]) -> str:
    """Where the job's workers meet (MASTER_ADDR): the server of rank 0."""
    return next(w.server_id for w in workers if w.rank == 0)


def _refusal(exc: Exception, *, server_step: bool) -> Refused:
    """The refusal of an action the rules or the database refused (its code and user-facing message)."""
    if isinstance(exc, Refused):
        return exc
    if isinstance(exc, IllegalTransition):
        return Refused(RefusalCode.ILLEGAL_TRANSITION, str(exc))
    if isinstance(exc, IntegrityError):
        if server_step:  # the one-open-loan-per-server index: a concurrent LOAN won
            return Refused(RefusalCode.LOAN_MISMATCH, "the server's loan changed while the plan was made")
        return Refused(RefusalCode.GPU_HELD, "a planned GPU is already held by another worker")
    return Refused(RefusalCode.CHANGED_CONCURRENTLY, "the job or server changed while the plan was made")
