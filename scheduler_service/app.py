"""The application layer: every use case of the scheduler service, over the store, in transactions.

Servicers translate protobuf to the inputs here and call these methods (from worker threads); the
scheduling cycle uses ``snapshot`` and ``apply``. Each method is one transaction: it either commits
everything it changed (state + event log) or nothing. Notifications (agents' desired state, event
watchers, cycle triggers) go out through the ``Notifier`` port only after commit.

Never: decide placement here (the policy does), or talk gRPC (the api package does).
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from scheduler_service.core.clock import Clock
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import (
    ApplyLog,
    ApplyResult,
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
from scheduler_service.core.snapshot import (
    TRAINING_CAPABLE_STATES,
    ClusterSnapshot,
    DemandView,
    JobView,
    ServerView,
    WorkerView,
)
from scheduler_service.errors import Aborted, AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from scheduler_service.worker_outcomes import Verdict, describe_exit, judge_exits
from scheduler_service.lifecycle import (
    JOB_LIFECYCLE,
    SERVER_LIFECYCLE,
    IllegalTransition,
    JobState,
    Pool,
    ServerState,
    home_state,
)
from scheduler_service.policies.aryl import ReclaimDecision, preview_reclaim
from scheduler_service.store import models as m

T = TypeVar("T")

log = structlog.get_logger("aryl.app")

MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 100
ACTIVE_JOB_STATES = (JobState.PENDING, JobState.RUNNING, JobState.SCALING, JobState.PREEMPTED)
# Server states in which the server has an open loan (LOST/UNHEALTHY servers may too; they show none).
ON_LOAN_STATES = frozenset({ServerState.DRAINING, ServerState.LOANED, ServerState.RECLAIMING})


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


class Notifier(Protocol):
    """Where committed changes are announced. Implementations must be thread-safe and cheap."""

    def events_appended(self) -> None: ...
    def desired_state_changed(self, server_ids: Iterable[str]) -> None: ...
    def desired_states_committed(self, states: Mapping[str, DesiredServerState]) -> None: ...
    def cycle_requested(self) -> None: ...


class NullNotifier:
    def events_appended(self) -> None:
        pass

    def desired_state_changed(self, server_ids: Iterable[str]) -> None:
        pass

    def desired_states_committed(self, states: Mapping[str, DesiredServerState]) -> None:
        pass

    def cycle_requested(self) -> None:
        pass


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


@dataclass(frozen=True)
class StatusReport:
    server_id: str
    scheduler_epoch: int
    gpus: tuple[GpuSample, ...]
    observed_generation: int
    workers: tuple[WorkerReport, ...] = ()


# ---------------------------------------------------------------------------------------------
# Outputs


@dataclass(frozen=True)
class JobRecord:
    job: m.Job
    allocations: tuple[m.Allocation, ...]


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
class ClusterSummary:
    pools: tuple[PoolStats, ...]
    jobs_by_state: dict[str, int]
    demand: m.DemandReport | None
    active_loans: int


@dataclass(frozen=True)
class ServerRecord:
    server: m.Server
    gpus: tuple[m.Gpu, ...]
    holders: dict[int, int]  # gpu index -> job id


@dataclass(frozen=True)
class Explanation:
    record: JobRecord
    summary: str
    decisions: tuple[m.Event, ...]


# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ReportDigest:
    epoch: int
    observed_generation: int
    desired_generation: int
    health: tuple[tuple[int, bool], ...]
    written_at: float  # monotonic


def _health_of(report: StatusReport) -> tuple[tuple[int, bool], ...]:
    return tuple((g.index, g.healthy) for g in report.gpus)


class SchedulerApp:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        *,
        notifier: Notifier | None = None,
        worker_base_port: int = 29500,
        telemetry_write_s: float = 15.0,
        reclaim_deadline_s: float = PolicyParams.reclaim_deadline_s,
    ) -> None:
        self._sessions = sessions
        self._clock = clock
        self.notifier: Notifier = notifier or NullNotifier()
        self._worker_base_port = worker_base_port
        self.epoch = 0
        # Liveness, on this process's monotonic clock only (never the agents' clocks, never the
        # database's wall times): when each server was last heard from. A server not heard from since
        # this scheduler started counts from the start, so a restart gives every agent a full grace.
        self._heard_from: dict[str, float] = {}
        self._heard_lock = threading.Lock()
        self._started_mono = clock.monotonic()
        # What each server's last fully recorded report said (report_status's fast path).
        self._digests: dict[str, _ReportDigest] = {}
        # A report that says nothing new is still written at least this often (GPU load, progress).
        self._telemetry_write_s = telemetry_write_s
        self._reclaim_deadline_s = reclaim_deadline_s
        # The server views of the last snapshot with what each was built from (reused when unchanged).
        self._server_views: dict[str, tuple[tuple[Any, ...], ServerView]] = {}
        # Per thread: the servers whose desired state the last ``_tx`` on this thread pushed itself.
        self._local = threading.local()

    # -- plumbing -------------------------------------------------------------------------------

    def _tx(self, work: Callable[[Session], T], *, retries: int = 3) -> T:
        """Run ``work`` in one transaction; retry on an optimistic-concurrency conflict, and when
        PostgreSQL aborted it to break a deadlock with a concurrent transaction (which then went on:
        e.g. a status report locks a server, then a job; an apply or a cancel locks jobs, then their
        servers). The desired states ``_bump_generations`` read inside the transaction are handed to
        the notifier right after commit (and ``_after_commit`` does not ask for them again)."""
        self._local.published = frozenset()
        for attempt in range(retries):
            try:
                with self._sessions.begin() as session:
                    result = work(session)
                states = session.info.pop(_DESIRED_STATES, None)
                if states:
                    self.notifier.desired_states_committed(states)
                    self._local.published = frozenset(states)
                return result
            except StaleDataError:
                if attempt == retries - 1:
                    raise Aborted("a concurrent change modified the same object; retry") from None
            except DBAPIError as exc:
                if getattr(exc.orig, "pgcode", None) not in _LOST_TO_A_CONCURRENT_TRANSACTION:
                    raise
                log.info("transaction aborted by the database; retrying", attempt=attempt + 1,
                         reason=str(exc.orig).splitlines()[0])
                if attempt == retries - 1:
                    raise Aborted("the database aborted this change in favour of a concurrent one; retry") from None
        raise AssertionError("unreachable")

    def _read(self, work: Callable[[Session], T]) -> T:
        """A read-only unit of work on one consistent view (several queries, no torn reads)."""
        with self._sessions() as session:
            if session.get_bind().dialect.name == "postgresql":
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            return work(session)

    def _event(self, session: Session, kind: str, **fields: Any) -> None:
        session.add(m.Event(time=self._clock.now(), kind=kind, details=fields.pop("details", {}), **fields))

    def _set_job_state(self, session: Session, job: m.Job, target: JobState, reason: str, message: str) -> None:
        self._job_state_event(session, job, target, reason, message)
        job.state = target
        job.state_reason = reason
        job.state_message = message[:1024]

    def _job_state_event(self, session: Session, job: m.Job, target: JobState, reason: str, message: str) -> None:
        """The event of a job's state change, checked against the lifecycle (the change is the caller's)."""
        JOB_LIFECYCLE.check(job.state, target)
        self._event(
            session, "JOB_STATE_CHANGED", job_id=job.id, from_state=job.state, to_state=target,
            reason=reason, message=message[:2048],
        )

    def _set_server_state(
        self, session: Session, server: m.Server, target: ServerState, reason: str, message: str
    ) -> None:
        SERVER_LIFECYCLE.check(server.state, target)
        self._event(
            session, "SERVER_STATE_CHANGED", server_id=server.id, from_state=server.state,
            to_state=target, reason=reason, message=message[:2048],
        )
        server.state = target
        server.state_reason = message[:1024]
        server.state_changed_at = self._clock.now()
        server.drained_at = None  # a drain acknowledgement holds for one DRAINING spell only

    # -- scheduler term -------------------------------------------------------------------------

    def start_term(self, holder: str) -> int:
        """Begin a new scheduler term; its epoch fences agents against older schedulers."""

        def work(session: Session) -> int:
            term = m.SchedulerTerm(started_at=self._clock.now(), holder=holder)
            session.add(term)
            session.flush()
            self._event(session, "SCHEDULER_STARTED", reason="STARTED", message=f"epoch {term.epoch} by {holder}")
            return term.epoch

        self.epoch = self._tx(work)
        return self.epoch

    # -- jobs -----------------------------------------------------------------------------------

    def submit_job(self, sub: JobSubmission) -> JobRecord:
        [result] = self.submit_jobs([sub])
        if isinstance(result, Exception):
            raise result
        return result

    def submit_jobs(self, subs: Sequence[JobSubmission]) -> list[JobRecord | AlreadyExists]:
        """Queue several jobs in one transaction (group commit: the API batches concurrent
        SubmitJob calls). A duplicate idempotency key fails only its own submission."""
        now = self._clock.now()
        rows = [_job_row(sub, now) for sub in subs]
        try:
            ids = self._tx(lambda session: self._insert_jobs(session, rows))
        except IntegrityError as exc:
            if len(subs) == 1:
                return [self._duplicate_key_error(subs[0], exc)]
            # Some key collided: retry one by one so only the duplicates fail.
            return [r for sub in subs for r in self.submit_jobs([sub])]
        self.notifier.events_appended()
        self.notifier.cycle_requested()
        return [JobRecord(m.Job(id=job_id, version=1, **row), ()) for job_id, row in zip(ids, rows)]

    def _insert_jobs(self, session: Session, rows: list[dict[str, Any]]) -> list[int]:
        # Core INSERT ... RETURNING in one round trip for the whole batch ("insertmanyvalues").
        # Core tables, not ORM entities: the ORM's bulk path costs more than the database here.
        jobs, events = m.Job.__table__, m.Event.__table__
        ids = list(
            session.scalars(
                sa.insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True), [{**r, "version": 1} for r in rows]
            )
        )
        session.execute(
            sa.insert(events),
            [
                dict(time=row["submitted_at"], kind="JOB_SUBMITTED", job_id=job_id, server_id=None, from_state="",
                     to_state=JobState.PENDING, reason=Reason.SUBMITTED, details={},
                     message=f"{row['name']} by {row['user']} in queue {row['queue']}: {row['min_workers']}.."
                     f"{row['max_workers']} worker(s) x {row['gpus_per_worker']} GPU(s)")
                for job_id, row in zip(ids, rows)
            ],
        )
        return ids

    def _duplicate_key_error(self, sub: JobSubmission, exc: IntegrityError) -> AlreadyExists:
        existing = self._job_by_key(sub.idempotency_key) if sub.idempotency_key else None
        if existing is None:
            raise exc  # not a key collision: a real integrity problem, let it surface
        return AlreadyExists(f"idempotency_key {sub.idempotency_key!r} was already used by job {existing}")

    def _job_by_key(self, key: str) -> int | None:
        return self._read(lambda s: s.scalar(sa.select(m.Job.id).where(m.Job.idempotency_key == key)))

    def _load_job(self, session: Session, job_id: int, *, for_update: bool = False) -> m.Job:
        stmt = sa.select(m.Job).where(m.Job.id == job_id)
        if for_update:
            stmt = stmt.with_for_update()
        job = session.scalar(stmt)
        if job is None:
            raise NotFound(f"job {job_id} not found")
        return job

    @staticmethod
    def _allocations(session: Session, job_ids: Sequence[int]) -> dict[int, list[m.Allocation]]:
        by_job: dict[int, list[m.Allocation]] = defaultdict(list)
        if job_ids:
            rows = session.scalars(
                sa.select(m.Allocation)
                .where(m.Allocation.job_id.in_(job_ids))
                .order_by(m.Allocation.job_id, m.Allocation.rank, m.Allocation.gpu_index)
            )
            for row in rows:
                by_job[row.job_id].append(row)
        return by_job

    def get_job(self, job_id: int, *, include_events: bool = False) -> tuple[JobRecord, tuple[m.Event, ...]]:
        def work(session: Session) -> tuple[JobRecord, tuple[m.Event, ...]]:
            job = self._load_job(session, job_id)
            allocations = tuple(self._allocations(session, [job_id])[job_id])
            events: tuple[m.Event, ...] = ()
            if include_events:
                events = tuple(session.scalars(sa.select(m.Event).where(m.Event.job_id == job_id).order_by(m.Event.id)))
            return JobRecord(job, allocations), events

        return self._read(work)

    def list_jobs(
        self, flt: JobFilter, *, page_size: int = 0, page_token: str = ""
    ) -> tuple[list[JobRecord], str]:
        size = page_size or DEFAULT_PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be at most {MAX_PAGE_SIZE} (got {size})")
        before = _decode_page_token(page_token, flt) if page_token else None

        def work(session: Session) -> tuple[list[JobRecord], str]:
            stmt = sa.select(m.Job)
            if flt.states:
                stmt = stmt.where(m.Job.state.in_([str(s) for s in flt.states]))
            if flt.user:
                stmt = stmt.where(m.Job.user == flt.user)
            if flt.queue:
                stmt = stmt.where(m.Job.queue == flt.queue)
            if before is not None:
                stmt = stmt.where(m.Job.id < before)
            jobs = list(session.scalars(stmt.order_by(m.Job.id.desc()).limit(size + 1)))
            more = len(jobs) > size
            jobs = jobs[:size]
            allocations = self._allocations(session, [j.id for j in jobs])
            token = _encode_page_token(jobs[-1].id, flt) if more else ""
            return [JobRecord(j, tuple(allocations[j.id])) for j in jobs], token

        return self._read(work)

    def cancel_job(self, job_id: int, reason: str) -> JobRecord:
        result = self.cancel_jobs([(job_id, reason)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def cancel_jobs(self, requests: Sequence[tuple[int, str]]) -> list[JobRecord | NotFound | FailedPrecondition]:
        """Cancel several jobs, each ``(job id, reason)``, in one transaction (group commit: the API
        batches concurrent CancelJob calls). A job that does not exist or has already ended fails only
        its own request; the same job twice is cancelled once and the second request is refused."""
        touched: set[str] = set()

        def work(session: Session) -> list[m.Job | NotFound | FailedPrecondition]:
            touched.clear()
            now = self._clock.now()
            ids = sorted({job_id for job_id, _ in requests})
            # Locked in id order (as an apply locks them): the set-based UPDATE below then needs no
            # per-row version check, which would cost a round trip per job.
            jobs = {job.id: job for job in session.scalars(
                sa.select(m.Job).where(m.Job.id.in_(ids)).order_by(m.Job.id).with_for_update()
            )}
            results: list[int | NotFound | FailedPrecondition] = []
            messages: dict[int, str] = {}
            for job_id, reason in requests:
                job = jobs.get(job_id)
                if job is None:
                    results.append(NotFound(f"job {job_id} not found"))
                    continue
                state = JobState.CANCELLED if job_id in messages else JobState(job.state)
                if state.is_terminal:  # also the second request for a job this batch cancels
                    results.append(FailedPrecondition(
                        f"job {job_id} is already {state}; only active jobs can be cancelled"))
                    continue
                message = reason or "cancelled by user"
                self._job_state_event(session, job, JobState.CANCELLED, Reason.CANCELLED_BY_USER, message)
                messages[job_id] = message[:1024]
                results.append(job_id)
            if not messages:
                return [r for r in results if not isinstance(r, int)]
            session.flush()  # the events, in one statement
            # Every cancelled job in one statement, and every cancelled job's GPUs in another.
            j, a = m.Job.__table__.c, m.Allocation.__table__.c
            cancelled = sorted(messages)
            updated = {job.id: job for job in session.scalars(
                sa.update(m.Job).where(m.Job.id.in_(cancelled))
                .values(state=JobState.CANCELLED, state_reason=Reason.CANCELLED_BY_USER,
                        state_message=sa.case(messages, value=j.id), num_workers=0, finished_at=now,
                        pending_reason="", version=j.version + 1)
                .returning(m.Job),
                execution_options={"synchronize_session": False, "populate_existing": True},
            )}
            touched.update(session.scalars(
                sa.delete(m.Allocation.__table__).where(a.job_id.in_(cancelled)).returning(a.server_id)
            ))
            self._bump_generations(session, touched)
            return [updated[r] if isinstance(r, int) else r for r in results]

        results = self._tx(work)
        if any(isinstance(r, m.Job) for r in results):
            self._after_commit(touched)
        return [JobRecord(r, ()) if isinstance(r, m.Job) else r for r in results]

    @staticmethod
    def _free_allocations(session: Session, job_id: int) -> set[str]:
        """Delete a job's allocations; returns the servers they were on."""
        a = m.Allocation.__table__.c
        return set(session.scalars(sa.delete(m.Allocation.__table__).where(a.job_id == job_id).returning(a.server_id)))

    def _bump_generations(self, session: Session, server_ids: Iterable[str]) -> None:
        """One desired-generation bump per server, in one statement. The version moves too, so a
        concurrent writer that read a server before this commit fails its optimistic check."""
        ids = sorted(server_ids)
        if not ids:
            return
        s = m.Server.__table__
        session.flush()  # pending ORM changes to these rows first, with their own version checks
        # What the agents must be told is read now, in this transaction (bumping is a transaction's last
        # change to these servers), and pushed right after commit, so a push never waits for a second
        # read after commit; ``_tx`` hands it over. The bump returns the servers' part of it: each round
        # trip here is time every agent of the decision waits.
        bumped = session.execute(
            sa.update(s).where(s.c.id.in_(ids))
            .values(desired_generation=s.c.desired_generation + 1, version=s.c.version + 1)
            .returning(*_DESIRED_SERVER_COLUMNS)
        ).all()
        for server_id in ids:  # objects of these rows in this session are reloaded on next use
            server = session.identity_map.get(session.identity_key(m.Server, server_id))  # type: ignore[arg-type]
            if server is not None:
                session.expire(server)
        session.info.setdefault(_DESIRED_STATES, {}).update(self._desired_states_of(session, bumped))

    def _after_commit(self, touched_servers: Iterable[str]) -> None:
        touched = list(touched_servers)
        published = getattr(self._local, "published", frozenset())
        self._forget_digests(touched)
        unread = [server_id for server_id in touched if server_id not in published]
        if unread:
            self.notifier.desired_state_changed(unread)
        self.notifier.events_appended()
        self.notifier.cycle_requested()

    def explain_job(self, job_id: int) -> Explanation:
        record, events = self.get_job(job_id, include_events=True)
        job = record.job
        decisions = tuple(e for e in events if e.reason)
        return Explanation(record, _summarize(job, decisions), decisions)

    # -- events ---------------------------------------------------------------------------------

    def events_after(
        self, after_id: int, *, job_id: int | None = None, server_id: str = "", limit: int = 500
    ) -> list[m.Event]:
        def work(session: Session) -> list[m.Event]:
            stmt = sa.select(m.Event).where(m.Event.id > after_id)
            if job_id is not None:
                stmt = stmt.where(m.Event.job_id == job_id)
            if server_id:
                stmt = stmt.where(m.Event.server_id == server_id)
            return list(session.scalars(stmt.order_by(m.Event.id).limit(limit)))

        return self._read(work)

    def last_event_id(self) -> int:
        return self._read(lambda s: s.scalar(sa.select(sa.func.max(m.Event.id))) or 0)

    # -- cluster views --------------------------------------------------------------------------

    def list_servers(self, pool: Pool | None = None) -> list[ServerRecord]:
        def work(session: Session) -> list[ServerRecord]:
            stmt = sa.select(m.Server).order_by(m.Server.pool.desc(), m.Server.id)
            if pool is not None:
                stmt = stmt.where(m.Server.pool == pool)
            servers = list(session.scalars(stmt))
            gpus: dict[str, list[m.Gpu]] = defaultdict(list)
            for gpu in session.scalars(sa.select(m.Gpu).order_by(m.Gpu.server_id, m.Gpu.index)):
                gpus[gpu.server_id].append(gpu)
            holders: dict[str, dict[int, int]] = defaultdict(dict)
            for sid, index, jid in session.execute(
                sa.select(m.Allocation.server_id, m.Allocation.gpu_index, m.Allocation.job_id)
            ):
                holders[sid][index] = jid
            return [ServerRecord(s, tuple(gpus[s.id]), holders[s.id]) for s in servers]

        return self._read(work)

    def list_loans(self, include_returned: bool) -> list[m.Loan]:
        def work(session: Session) -> list[m.Loan]:
            stmt = sa.select(m.Loan).order_by(m.Loan.id.desc())
            if not include_returned:
                stmt = stmt.where(m.Loan.state != "RETURNED")
            return list(session.scalars(stmt))

        return self._read(work)

    def cluster_summary(self) -> ClusterSummary:
        records = self.list_servers()

        def work(session: Session) -> tuple[dict[str, int], m.DemandReport | None, int]:
            counts = dict(session.execute(sa.select(m.Job.state, sa.func.count()).group_by(m.Job.state)).all())
            demand = session.scalar(sa.select(m.DemandReport).order_by(m.DemandReport.id.desc()).limit(1))
            loans = session.scalar(sa.select(sa.func.count()).where(m.Loan.state != "RETURNED")) or 0
            return counts, demand, loans

        counts, demand, loans = self._read(work)
        pools = {p: dict(servers=0, gpus_total=0, gpus_used=0, gpus_loaned=0, gpus_unavailable=0) for p in Pool}
        for rec in records:
            stats = pools[Pool(rec.server.pool)]
            stats["servers"] += 1
            stats["gpus_total"] += len(rec.gpus)
            stats["gpus_used"] += len(rec.holders)
            if rec.server.state in (ServerState.LOANED, ServerState.RECLAIMING):
                stats["gpus_loaned"] += len(rec.gpus)
            down = rec.server.state in (ServerState.LOST, ServerState.UNHEALTHY)
            stats["gpus_unavailable"] += sum(1 for g in rec.gpus if down or not g.healthy)
        return ClusterSummary(
            pools=tuple(PoolStats(pool=p, **v) for p, v in pools.items()),
            jobs_by_state=counts,
            demand=demand,
            active_loans=loans,
        )

    # -- agents ---------------------------------------------------------------------------------

    def register_server(self, reg: ServerRegistration) -> DesiredServerState:
        now = self._clock.now()
        touched: set[str] = set()

        def work(session: Session) -> None:
            server = session.get(m.Server, reg.hostname)
            if server is None:
                server = m.Server(
                    id=reg.hostname, hostname=reg.hostname, pool=reg.pool, state=home_state(reg.pool),
                    state_reason="registered", agent_address=reg.agent_address, agent_version=reg.agent_version,
                    registered_at=now, last_seen_at=now, desired_generation=1, observed_generation=0,
                    state_changed_at=now, logs_address=reg.logs_address, inference_endpoint=reg.inference_endpoint,
                )
                session.add(server)
                session.flush()
                self._event(
                    session, "SERVER_REGISTERED", server_id=server.id, to_state=server.state, reason="REGISTERED",
                    message=f"{reg.pool.lower()} server with {len(reg.gpus)} GPU(s), agent {reg.agent_version}",
                )
            else:
                if server.pool != reg.pool:
                    raise FailedPrecondition(
                        f"server {reg.hostname} is registered in pool {server.pool}, not {reg.pool}; "
                        "a server cannot change pools"
                    )
                server.agent_address = reg.agent_address
                server.agent_version = reg.agent_version
                server.logs_address = reg.logs_address
                server.inference_endpoint = reg.inference_endpoint
                server.last_seen_at = now
                if server.state == ServerState.LOST:
                    self._set_server_state(
                        session, server, home_state(server.pool), "AGENT_RECONNECTED", "agent registered again"
                    )
                server.desired_generation += 1  # resend desired state to the (re)started agent
                touched.add(server.id)
            self._sync_gpus(session, server, reg.gpus)

        try:
            self._tx(work)
        except IntegrityError as exc:
            raise AlreadyExists(
                f"a GPU UUID reported by {reg.hostname} is already registered to another server"
            ) from exc
        self._heard(reg.hostname)
        self._forget_digests([reg.hostname])
        self._after_commit(touched)
        return self.desired_state(reg.hostname)

    def _sync_gpus(self, session: Session, server: m.Server, reported: Sequence[GpuReport]) -> None:
        existing = {g.index: g for g in session.scalars(sa.select(m.Gpu).where(m.Gpu.server_id == server.id))}
        # GPUs may come back in another order after a reboot: park changed UUIDs first so swapping two
        # of this server's UUIDs never trips the unique key half-way.
        moved = [(existing[g.index], g) for g in reported if g.index in existing and existing[g.index].uuid != g.uuid]
        for row, _ in moved:
            row.uuid = f"~moving:{server.id}:{row.index}"
        if moved:
            session.flush()
        for gpu in reported:
            row = existing.pop(gpu.index, None)
            if row is None:
                session.add(
                    m.Gpu(server_id=server.id, index=gpu.index, uuid=gpu.uuid, model=gpu.model,
                          memory_total_bytes=gpu.memory_total_bytes, healthy=True, health_reason="")
                )
            else:
                row.uuid, row.model, row.memory_total_bytes = gpu.uuid, gpu.model, gpu.memory_total_bytes
        for row in existing.values():  # GPUs the agent no longer sees stay listed but unusable
            if row.healthy:
                row.healthy = False
                row.health_reason = "missing from the agent's inventory"
                self._event(session, "GPU_HEALTH_CHANGED", server_id=server.id, reason="GPU_MISSING",
                            message=f"GPU {row.index} missing from inventory")
        session.flush()

    def report_status(self, report: StatusReport) -> int:
        """Record an agent's report (GPU telemetry and health, what its workers do); returns the
        server's desired generation. A server that was LOST comes back to its home state.

        Most reports say nothing new: the same generation, the same GPU health, no worker exit. Those
        are answered from memory (``_ReportDigest``) and their telemetry (GPU load, progress, last
        seen) is written at most every ``telemetry_write_s``; liveness is in memory anyway. So a
        fleet of 1,000s of agents costs the database little. A report whose only news is a newer
        observed generation writes just that (one statement). Anything else that may need a decision
        (a health change, an exit, a LOST server reporting again) goes through the full path at once."""
        answer = self.answer_from_memory(report)
        if answer is not None:
            return answer
        digest = self._unchanged_since_digest(report)
        if digest is not None:
            answer = self._record_observed_generation(report, digest)
            if answer is not None:
                return answer
        now = self._clock.now()
        cycle_needed = False
        touched: set[str] = set()
        seen: dict[str, Any] = {}

        def work(session: Session) -> int:
            nonlocal cycle_needed
            touched.clear()
            cycle_needed = False
            server = session.get(m.Server, report.server_id)
            if server is None:
                raise NotFound(f"server {report.server_id} is not registered; register it first")
            if report.scheduler_epoch != self.epoch:
                raise FailedPrecondition(
                    f"stale scheduler epoch {report.scheduler_epoch} (current {self.epoch}); register again"
                )
            # The heartbeat columns bypass the row's version: a report must never fail the optimistic
            # check of the scheduler's own commits (desired generation, state), with 1,000s of agents
            # reporting every few seconds.
            servers = m.Server.__table__
            session.execute(
                sa.update(servers).where(servers.c.id == server.id).values(
                    last_seen_at=now,
                    observed_generation=_at_least(servers.c.observed_generation, report.observed_generation),
                )
            )
            if report.observed_generation > server.observed_generation:
                # A reclaimed server waits for exactly this confirmation to serve again; routing too.
                cycle_needed = cycle_needed or server.state in (ServerState.RECLAIMING, ServerState.SERVING)
            if server.state == ServerState.LOST:
                self._set_server_state(
                    session, server, home_state(server.pool), "AGENT_RECONNECTED", "agent reported again"
                )
                touched.add(server.id)  # new generation: what ran there before it was lost must stop
                cycle_needed = True
            if report.gpus and self._record_gpus(session, server.id, report.gpus):
                cycle_needed = True
            if report.workers and self._record_workers(session, server.id, report.workers, now, touched):
                cycle_needed = True
            self._bump_generations(session, touched)
            if not touched and not cycle_needed and session.get_bind().dialect.name == "postgresql":
                # Telemetry only: losing the last few hundred ms of it in a crash is harmless, and
                # not waiting for the WAL flush makes 1,000s of reports a second affordable.
                session.execute(sa.text("SET LOCAL synchronous_commit TO OFF"))
            seen.update(state=server.state, observed=max(server.observed_generation, report.observed_generation),
                        desired=server.desired_generation)
            return server.desired_generation

        generation = self._tx(work)
        self._heard(report.server_id)
        if not touched and seen.get("state") != ServerState.LOST:
            with self._heard_lock:
                self._digests[report.server_id] = _ReportDigest(
                    epoch=self.epoch, observed_generation=seen["observed"], desired_generation=seen["desired"],
                    health=_health_of(report), written_at=self._clock.monotonic(),
                )
        if touched:
            self._after_commit(touched)  # also requests a cycle
        elif cycle_needed:
            self.notifier.events_appended()
            self.notifier.cycle_requested()
        return generation

    def answer_from_memory(self, report: StatusReport) -> int | None:
        """``report_status``'s fast path, safe on any thread and touching no database: when ``report``
        carries nothing that needs the database now, record that the server was heard from and return
        the desired generation to answer with; otherwise None (call ``report_status``)."""
        digest = self._unchanged_since_digest(report)
        if digest is None or report.observed_generation > digest.observed_generation:
            return None
        self._heard(report.server_id)
        return digest.desired_generation

    def _unchanged_since_digest(self, report: StatusReport) -> _ReportDigest | None:
        """The server's digest when ``report`` says nothing new but (perhaps) a newer observed
        generation: same epoch, same GPU health, no exit the scheduler did not ask for, and telemetry
        written recently. None when it must take the full path."""
        with self._heard_lock:
            digest = self._digests.get(report.server_id)
        if (
            digest is None
            or digest.epoch != self.epoch
            or report.scheduler_epoch != self.epoch
            or self._clock.monotonic() - digest.written_at >= self._telemetry_write_s
            or _health_of(report) != digest.health
            or any(w.phase == "EXITED" and not w.stop_requested for w in report.workers)
        ):
            return None
        return digest

    def _record_observed_generation(self, report: StatusReport, digest: _ReportDigest) -> int | None:
        """A report whose only news is a newer observed generation (the agent converged after a push:
        100s of them follow a burst of decisions): one UPDATE of the server's heartbeat columns, no
        telemetry (written on its own schedule). Returns the desired generation, or None when the
        server turned out to be LOST (the full path brings it back)."""
        s = m.Server.__table__

        def work(session: Session) -> Any:
            if session.get_bind().dialect.name == "postgresql":
                session.execute(sa.text("SET LOCAL synchronous_commit TO OFF"))  # as telemetry: see report_status
            return session.execute(
                sa.update(s).where(s.c.id == report.server_id, s.c.state != ServerState.LOST)
                .values(last_seen_at=self._clock.now(),
                        observed_generation=_at_least(s.c.observed_generation, report.observed_generation))
                .returning(s.c.state, s.c.observed_generation, s.c.desired_generation)
            ).one_or_none()

        row = self._tx(work)
        if row is None:
            return None
        self._heard(report.server_id)
        with self._heard_lock:
            if self._digests.get(report.server_id) is digest:  # not forgotten by a commit meanwhile
                self._digests[report.server_id] = dataclasses.replace(
                    digest, observed_generation=row.observed_generation, desired_generation=row.desired_generation
                )
        if row.state in (ServerState.RECLAIMING, ServerState.SERVING):
            # A reclaimed server waits for exactly this confirmation to serve again; routing too.
            self.notifier.events_appended()
            self.notifier.cycle_requested()
        return int(row.desired_generation)

    def _forget_digests(self, server_ids: Iterable[str]) -> None:
        """Their state or desired generation changed: the next report of each takes the full path."""
        with self._heard_lock:
            for server_id in server_ids:
                self._digests.pop(server_id, None)

    def _record_gpus(self, session: Session, server_id: str, samples: Sequence[GpuSample]) -> bool:
        """GPU telemetry in one executemany (the hot path of every report); a health change also gets
        an event. Returns True when a GPU's health changed (placement must be reconsidered)."""
        g = m.Gpu.__table__.c
        healthy = {r.index: r.healthy for r in session.execute(sa.select(g.index, g.healthy).where(g.server_id == server_id))}
        rows, changed = [], False
        for position, sample in enumerate(samples):
            if sample.index not in healthy:
                raise InvalidArgument(f"gpus[{position}].index", f"GPU {sample.index} was not registered")
            row = {"sid": server_id, "gidx": sample.index, "utilization": sample.utilization,
                   "memory_used_bytes": sample.memory_used_bytes, "temperature_c": sample.temperature_c,
                   "healthy": healthy[sample.index], "health_reason": None}
            if healthy[sample.index] != sample.healthy:
                changed = True
                row["healthy"], row["health_reason"] = sample.healthy, sample.health_reason[:256]
                self._event(
                    session, "GPU_HEALTH_CHANGED", server_id=server_id,
                    reason="GPU_HEALTHY" if sample.healthy else "GPU_UNHEALTHY",
                    message=f"GPU {sample.index}: {sample.health_reason or 'healthy again'}",
                )
            rows.append(row)
        session.execute(
            sa.update(m.Gpu.__table__)
            .where(g.server_id == sa.bindparam("sid"), g.index == sa.bindparam("gidx"))
            .values(utilization=sa.bindparam("utilization"), memory_used_bytes=sa.bindparam("memory_used_bytes"),
                    temperature_c=sa.bindparam("temperature_c"), healthy=sa.bindparam("healthy"),
                    health_reason=sa.func.coalesce(sa.bindparam("health_reason"), g.health_reason)),
            rows,
        )
        return changed

    def _record_workers(
        self, session: Session, server_id: str, workers: Sequence[WorkerReport], now: float, touched: set[str]
    ) -> bool:
        """Progress, checkpoints and exits of the workers this server runs for the jobs' current
        incarnations (reports about older incarnations or ranks placed elsewhere are history and
        ignored). Returns True when a job ended or was requeued (GPUs freed: a cycle is due)."""
        job_ids = sorted({w.job_id for w in workers})
        jobs = {job.id: job for job in session.scalars(sa.select(m.Job).where(m.Job.id.in_(job_ids)))}
        placed = {
            (row.job_id, row.rank)
            for row in session.execute(
                sa.select(m.Allocation.job_id, m.Allocation.rank)
                .where(m.Allocation.server_id == server_id, m.Allocation.job_id.in_(job_ids))
            )
        }
        decided = False
        for job_id in job_ids:
            job = jobs.get(job_id)
            if job is None or not JobState(job.state).holds_gpus:
                continue
            current = [
                w for w in workers
                if w.job_id == job_id and w.incarnation == job.incarnation and (job_id, w.rank) in placed
            ]
            if not current:
                continue
            self._record_progress(session, job, current, now)
            exits = {int(rank): code for rank, code in (job.worker_exits or {}).items()}
            new_exits = [
                w for w in current
                if w.phase == "EXITED" and not w.stop_requested and w.rank not in exits
            ]
            if not new_exits:
                continue
            for w in new_exits:
                exits[w.rank] = w.exit_code
                self._event(
                    session, "WORKER_EXITED", job_id=job.id, server_id=server_id,
                    reason="WORKER_SUCCEEDED" if w.exit_code == 0 else "WORKER_FAILED",
                    message=f"rank {w.rank} (incarnation {w.incarnation}) {describe_exit(w.exit_code)}"
                            + (f": {w.message}" if w.message else ""),
                    details={"rank": str(w.rank), "exit_code": str(w.exit_code), "incarnation": str(w.incarnation)},
                )
            job.worker_exits = {str(rank): code for rank, code in sorted(exits.items())}
            verdict, why = judge_exits(
                exits, num_workers=job.num_workers, restart_policy=job.restart_policy,
                restarts=job.restarts, max_restarts=job.max_restarts,
            )
            if verdict is None:
                continue
            touched |= self._free_allocations(session, job.id)
            job.num_workers = 0
            if verdict is Verdict.COMPLETED:
                job.finished_at = now
                self._set_job_state(session, job, JobState.COMPLETED, "WORKERS_SUCCEEDED", why)
            elif verdict is Verdict.FAILED:
                job.finished_at = now
                self._set_job_state(session, job, JobState.FAILED, "WORKER_FAILED", why)
            else:
                job.restarts += 1
                job.pending_reason = f"RESTARTING: {why}"[:1024]
                self._set_job_state(session, job, JobState.PENDING, "RESTARTING", why)
            decided = True
        return decided

    @staticmethod
    def _record_progress(session: Session, job: m.Job, current: Sequence[WorkerReport], now: float) -> None:
        """Progress is telemetry, not a state change: written without the optimistic version bump, so
        a report never makes a concurrent plan's action on the same job fail as stale."""
        # A worker that has not written progress yet reports 0: that says nothing about the job.
        progress = max((w.progress for w in current), default=0.0)
        checkpoint = max((w.checkpoint_progress for w in current), default=0.0)
        values: dict[str, Any] = {}
        if progress > 0 and progress != job.work_done:
            values["work_done"] = progress  # may go down: a restart resumes from the last checkpoint
        if checkpoint > 0 and checkpoint != job.checkpoint_work:
            values["checkpoint_work"] = checkpoint
            values["last_checkpoint_at"] = now  # the scheduler's clock: when it learnt of the checkpoint
        if values:
            session.execute(sa.update(m.Job.__table__).where(m.Job.__table__.c.id == job.id).values(**values))
            session.expire(job, list(values))

    def desired_state(self, server_id: str) -> DesiredServerState:
        state = self.desired_states([server_id]).get(server_id)
        if state is None:
            raise NotFound(f"server {server_id} is not registered")
        return state

    def desired_states(self, server_ids: Sequence[str]) -> dict[str, DesiredServerState]:
        """The desired state of each registered server among ``server_ids``, from one consistent
        read: three queries however many servers (the agent streams' fan-out after a commit)."""
        ids = sorted(set(server_ids))
        return self._read(lambda session: self._desired_states_in(session, ids))

    def _desired_states_in(self, session: Session, ids: Sequence[str]) -> dict[str, DesiredServerState]:
        """``desired_states`` inside ``session``. Core rows with only the columns an agent needs."""
        s = m.Server.__table__.c
        return self._desired_states_of(
            session, session.execute(sa.select(*_DESIRED_SERVER_COLUMNS).where(s.id.in_(ids))).all()
        )

    def _desired_states_of(self, session: Session, servers: Sequence[Any]) -> dict[str, DesiredServerState]:
        """The desired state of each server row (``_DESIRED_SERVER_COLUMNS``), with its workers read in one
        query (also inside a writing transaction, before its commit: this runs for every decision)."""
        if not servers:
            return {}
        a, j = (t.__table__.c for t in (m.Allocation, m.Job))
        a0, s0 = m.Allocation.__table__.alias("rank0"), m.Server.__table__.alias("rank0_server")
        # MASTER_ADDR: the server of rank 0 of each job.
        master = (
            sa.select(s0.c.agent_address).join(a0, s0.c.id == a0.c.server_id)
            .where(a0.c.job_id == a.job_id, a0.c.rank == 0).limit(1).scalar_subquery()
        )
        # One row per worker (its GPUs aggregated): a job's command and environment are decoded once
        # per worker, not once per GPU.
        here = session.execute(
            sa.select(a.server_id, a.job_id, a.rank,
                      sa.func.aggregate_strings(sa.cast(a.gpu_index, sa.String), ",").label("gpus"),
                      j.num_workers, j.command, j.env, j.incarnation, master.label("master_addr"))
            .join(m.Job.__table__, j.id == a.job_id)
            .where(a.server_id.in_(sorted(row.id for row in servers)))
            .group_by(a.server_id, a.job_id, a.rank, j.id)
            .order_by(a.server_id, a.job_id, a.rank)
        ).all()
        workers: dict[str, list[Any]] = defaultdict(list)
        for row in here:
            workers[row.server_id].append(row)
        states = {}
        for server in sorted(servers, key=lambda row: row.id):
            specs = []
            local_rank: dict[int, int] = defaultdict(int)
            for w in workers[server.id]:
                specs.append(
                    DesiredWorkerSpec(
                        job_id=w.job_id, rank=w.rank, world_size=w.num_workers, local_rank=local_rank[w.job_id],
                        gpu_indices=_index_list(w.gpus), command=tuple(w.command),
                        env=dict(w.env), master_addr=w.master_addr or server.agent_address,
                        master_port=self._worker_base_port + w.job_id % 10000, incarnation=w.incarnation,
                    )
                )
                local_rank[w.job_id] += 1
            states[server.id] = DesiredServerState(
                server.id, self.epoch, server.desired_generation, server.state, tuple(specs)
            )
        return states

    # -- liveness -------------------------------------------------------------------------------

    def _heard(self, server_id: str) -> None:
        with self._heard_lock:
            self._heard_from[server_id] = self._clock.monotonic()

    def _silence(self, server_id: str) -> float:
        """Seconds since this scheduler last heard from the server (or since it started)."""
        with self._heard_lock:
            heard = self._heard_from.get(server_id, self._started_mono)
        return self._clock.monotonic() - heard

    def sweep_lost(self, lost_after_s: float) -> list[str]:
        """Mark LOST every server whose agent has been silent for more than ``lost_after_s`` on this
        scheduler's monotonic clock; requeue or shrink the jobs that ran there. Returns their ids."""
        candidates = self._read(
            lambda session: list(session.scalars(sa.select(m.Server.id).where(m.Server.state != ServerState.LOST)))
        )
        lost: list[str] = []
        for server_id in candidates:
            silence = self._silence(server_id)
            if silence <= lost_after_s:
                continue
            touched: set[str] = set()

            def work(session: Session, server_id: str = server_id, silence: float = silence) -> bool:
                touched.clear()
                server = session.get(m.Server, server_id)
                # Re-checked inside the transaction: a report may have arrived meanwhile.
                if server is None or server.state == ServerState.LOST or self._silence(server_id) <= lost_after_s:
                    return False
                touched.update(self._mark_lost(session, server, silence, lost_after_s))
                self._bump_generations(session, touched)
                return True

            if self._tx(work):
                lost.append(server_id)
                self._after_commit(touched)
        if lost:
            self.notifier.cycle_requested()
        return lost

    def _mark_lost(self, session: Session, server: m.Server, silence: float, lost_after_s: float) -> set[str]:
        now = self._clock.now()
        server.state_before_fault = server.state
        self._set_server_state(
            session, server, ServerState.LOST, "AGENT_SILENT",
            f"no report from the agent for {silence:.0f}s (lost after {lost_after_s:g}s)",
        )
        loan = session.scalar(
            sa.select(m.Loan).where(m.Loan.server_id == server.id, m.Loan.state != LoanState.RETURNED)
        )
        if loan is not None:  # a lost server is no use to training; inference gets it back when it returns
            loan.state, loan.ended_at, loan.reason = LoanState.RETURNED, now, "SERVER_LOST: agent silent"
            self._event(session, "LOAN_ENDED", server_id=server.id, reason="SERVER_LOST",
                        message=f"server lost while on loan (loaned for {now - loan.started_at:.0f}s)",
                        details={"loan_id": str(loan.id)})
        touched = {server.id}
        job_ids = sorted(set(session.scalars(
            sa.select(m.Allocation.job_id).where(m.Allocation.server_id == server.id)
        )))
        for job in session.scalars(sa.select(m.Job).where(m.Job.id.in_(job_ids)).order_by(m.Job.id)):
            touched |= self._evict_from_lost_server(session, job, server.id, now)
        return touched

    def _evict_from_lost_server(self, session: Session, job: m.Job, server_id: str, now: float) -> set[str]:
        """A job with workers on a lost server: shrink it to the workers it has elsewhere when that is
        still at least ``min_workers`` (ranks renumbered densely, a new incarnation), else requeue it."""
        allocations = list(session.scalars(sa.select(m.Allocation).where(m.Allocation.job_id == job.id)))
        servers = {a.server_id for a in allocations}
        remaining = sorted({a.rank for a in allocations if a.server_id != server_id}
                           - {a.rank for a in allocations if a.server_id == server_id})
        message = f"server {server_id} lost (agent silent)"
        if job.state == JobState.RUNNING and len(remaining) >= job.min_workers:
            renumber = {old: new for new, old in enumerate(remaining)}
            workers = []
            for a in allocations:
                if a.server_id == server_id or a.rank not in renumber:
                    session.delete(a)
                else:
                    a.rank = renumber[a.rank]
                    workers.append(a)
            session.flush()
            self._set_job_state(session, job, JobState.SCALING, "SERVER_LOST", message)
            self._new_incarnation(job, workers)
            job.num_workers = len(remaining)
            job.last_resized_at = now
            self._set_job_state(session, job, JobState.RUNNING, "SERVER_LOST",
                                f"{message}; continues with {len(remaining)} worker(s)")
            return servers
        self._free_allocations(session, job.id)
        job.num_workers = 0
        job.preemptions += 1
        job.pending_reason = f"SERVER_LOST: {message}"[:1024]
        self._set_job_state(session, job, JobState.PREEMPTED, "SERVER_LOST", message)
        self._set_job_state(session, job, JobState.PENDING, "SERVER_LOST", f"requeued: {message}")
        return servers

    # -- worker logs ----------------------------------------------------------------------------

    def job_log_source(self, job_id: int, rank: int) -> tuple[str, str]:
        """(server id, agent logs address) of where ``rank`` of the job ran most recently."""

        def work(session: Session) -> tuple[str, str]:
            job = self._load_job(session, job_id)
            server_id = (job.rank_servers or {}).get(str(rank))
            if server_id is None:
                ran = sorted(int(r) for r in (job.rank_servers or {}))
                raise NotFound(
                    f"job {job_id} has no rank {rank} that ever ran"
                    + (f" (ranks that ran: {', '.join(map(str, ran))})" if ran else f" (it is {job.state})")
                )
            server = session.get(m.Server, server_id)
            if server is None or not server.logs_address:
                raise FailedPrecondition(
                    f"the agent of server {server_id} does not serve worker logs (agent.logs_port = -1, "
                    "or an agent version without log serving); read them on the server"
                )
            return server_id, server.logs_address

        return self._read(work)

    # -- inference demand -----------------------------------------------------------------------

    def report_demand(self, servers_needed: int, observed_rps: float, source: str) -> tuple[m.DemandReport, int, int]:
        def work(session: Session) -> tuple[m.DemandReport, int, int]:
            previous = session.scalar(sa.select(m.DemandReport).order_by(m.DemandReport.id.desc()).limit(1))
            report = m.DemandReport(
                time=self._clock.now(), servers_needed=servers_needed, observed_rps=observed_rps, source=source
            )
            session.add(report)
            if previous is None or previous.servers_needed != servers_needed:
                self._event(
                    session, "DEMAND_CHANGED", reason="DEMAND_REPORTED",
                    message=f"inference needs {servers_needed} server(s) ({observed_rps:.1f} req/s, from {source})",
                    details={"servers_needed": str(servers_needed), "previous": str(previous.servers_needed if previous else "")},
                )
            counts = dict(
                session.execute(
                    sa.select(m.Server.state, sa.func.count())
                    .where(m.Server.pool == Pool.INFERENCE)
                    .group_by(m.Server.state)
                ).all()
            )
            return report, counts.get(ServerState.SERVING, 0), counts.get(ServerState.LOANED, 0)

        result = self._tx(work)
        self.notifier.events_appended()
        self.notifier.cycle_requested()
        return result

    def serving_pool(self) -> tuple[int, list[tuple[str, str, str]]]:
        """The inference servers a router may know: (server id, endpoint, state) of SERVING and
        DRAINING servers that registered an endpoint and whose agent has applied the newest desired
        state, and a version that grows with every change."""

        def work(session: Session) -> tuple[int, list[tuple[str, str, str]]]:
            s = m.Server.__table__.c
            rows = session.execute(
                sa.select(s.id, s.inference_endpoint, s.state)
                .where(s.pool == Pool.INFERENCE, s.state.in_([ServerState.SERVING, ServerState.DRAINING]),
                       s.inference_endpoint.is_not(None), s.inference_endpoint != "",
                       # SERVING: routable only once its agent confirmed the newest desired state, so a
                       # server that ran training (a returned loan, a lost server back) has no workers left.
                       # DRAINING: listed regardless, so the router stops routing there and acknowledges.
                       sa.or_(s.state == ServerState.DRAINING, s.observed_generation >= s.desired_generation))
                .order_by(s.id)
            ).all()
            version = session.scalar(sa.select(sa.func.coalesce(sa.func.max(m.Event.id), 0)))
            return int(version or 0), [(r.id, r.inference_endpoint, r.state) for r in rows]

        return self._read(work)

    def report_drained(self, server_id: str, source: str) -> str:
        """The router routes nothing to this DRAINING server any more and nothing is in flight there:
        the policy may loan it now instead of waiting for the drain timeout. Idempotent."""

        def work(session: Session) -> str:
            server = session.get(m.Server, server_id)
            if server is None:
                raise NotFound(f"server {server_id} is not registered")
            if server.state != ServerState.DRAINING:
                raise FailedPrecondition(
                    f"server {server_id} is {server.state}, not DRAINING: there is no drain to acknowledge"
                )
            if server.drained_at is None:
                server.drained_at = self._clock.now()
                self._event(session, "SERVER_DRAINED", server_id=server.id, reason="DRAINED",
                            message=f"no inference requests in flight (reported by {source})")
            return server.state

        state = self._tx(work)
        self.notifier.events_appended()
        self.notifier.cycle_requested()
        return state

    def latest_demand(self) -> m.DemandReport | None:
        return self._read(
            lambda s: s.scalar(sa.select(m.DemandReport).order_by(m.DemandReport.id.desc()).limit(1))
        )

    def preview_reclaim(self, servers: int, params: PolicyParams) -> tuple[ReclaimDecision, int]:
        """Dry run of a reclaim of ``servers`` loaned servers on the current state; writes nothing."""
        snapshot = self.snapshot()
        loaned = sum(1 for s in snapshot.servers if s.state == ServerState.LOANED)
        return preview_reclaim(snapshot, servers, params), loaned

    # -- the scheduling cycle's ports -----------------------------------------------------------

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        """The frozen view the policy decides on: schedulable state only, read in one transaction.

        Core rows with only the columns the policy needs (no ORM identity map, no command/env): this
        runs every cycle over every active job."""

        def work(session: Session) -> ClusterSnapshot:
            g, a, s, ln, j = (t.__table__.c for t in (m.Gpu, m.Allocation, m.Server, m.Loan, m.Job))
            by_server: dict[str, list[tuple[int, int]]] = defaultdict(list)
            # job id -> rank -> (server id, [gpu index, ...])
            by_job: dict[int, dict[int, tuple[str, list[int]]]] = defaultdict(dict)
            for job_id, rank, server_id, gpu_index in session.execute(
                sa.select(a.job_id, a.rank, a.server_id, a.gpu_index)
            ):
                by_server[server_id].append((gpu_index, job_id))
                by_job[job_id].setdefault(rank, (server_id, []))[1].append(gpu_index)
            loan_started = dict(
                session.execute(sa.select(ln.server_id, ln.started_at).where(ln.state != LoanState.RETURNED)).all()
            )
            # A server's GPUs come aggregated with its row (one row per server, not per GPU), and a view
            # whose inputs are what they were last cycle is reused as it is, with what it has derived.
            gpus = (
                sa.select(g.server_id,
                          sa.func.aggregate_strings(sa.cast(g.index, sa.String), ",").label("indices"),
                          sa.func.aggregate_strings(
                              sa.case((g.healthy, None), else_=sa.cast(g.index, sa.String)), ",").label("unhealthy"))
                .group_by(g.server_id).subquery()
            )
            views: dict[str, tuple[tuple[Any, ...], ServerView]] = {}
            for row in session.execute(
                sa.select(s.id, s.pool, s.state, s.state_changed_at, s.observed_generation, s.desired_generation,
                          s.drained_at, gpus.c.indices, gpus.c.unhealthy)
                .outerjoin(gpus, gpus.c.server_id == s.id).order_by(s.id)
            ):
                allocated = tuple(sorted(by_server[row.id])) if row.id in by_server else ()
                key = (*row, allocated, loan_started.get(row.id))
                cached = self._server_views.get(row.id)
                views[row.id] = cached if cached is not None and cached[0] == key else (key, ServerView(
                    server_id=row.id, pool=Pool(row.pool), state=ServerState(row.state),
                    gpu_indices=_index_list(row.indices), unhealthy_gpus=frozenset(_index_list(row.unhealthy)),
                    allocated=allocated, state_since=row.state_changed_at,
                    loan_started_at=loan_started.get(row.id) if row.state in ON_LOAN_STATES else None,
                    agent_converged=row.observed_generation >= row.desired_generation,
                    drained=row.drained_at is not None,
                ))
            self._server_views = views  # only this cycle's servers: a removed server is forgotten
            servers = tuple(view for _, view in views.values())
            active = session.execute(
                sa.select(j.id, j.state, j.gpus_per_worker, j.min_workers, j.max_workers, j.priority,
                          j.submitted_at, j.throughput, j.pending_reason, j.work_done, j.started_at,
                          j.last_resized_at, j.last_checkpoint_at)
                .where(j.state.in_([str(s) for s in ACTIVE_JOB_STATES]))
                .order_by(j.id)
            )
            jobs = tuple(
                JobView(
                    job_id=row.id, state=JobState(row.state), gpus_per_worker=row.gpus_per_worker,
                    min_workers=row.min_workers, max_workers=row.max_workers, priority=row.priority,
                    submitted_at=row.submitted_at,
                    workers=tuple(
                        WorkerView(rank, server_id, tuple(sorted(indices)))
                        for rank, (server_id, indices) in sorted(by_job[row.id].items())
                    ) if row.id in by_job else (),
                    estimated_runtime_s=(row.throughput or {}).get("estimated_runtime_s"),
                    pending_reason=row.pending_reason,
                    throughput_points=tuple(
                        (int(workers), float(speed)) for workers, speed in (row.throughput or {}).get("points", ())
                    ),
                    total_work=float((row.throughput or {}).get("total_work", 0.0)),
                    work_done=row.work_done,
                    started_at=row.started_at,
                    last_resized_at=row.last_resized_at,
                    last_checkpoint_at=row.last_checkpoint_at,
                )
                for row in active
            )
            demand = session.scalar(sa.select(m.DemandReport).order_by(m.DemandReport.id.desc()).limit(1))
            return ClusterSnapshot(
                now=self._clock.now(), servers=servers, jobs=jobs, seed=seed,
                demand=DemandView(demand.servers_needed, demand.observed_rps, demand.time) if demand else None,
            )

        return self._read(work)

    def apply(self, plan: Plan) -> ApplyResult:
        """Commit ``plan`` in one transaction, in ``core.plan.apply_order`` (shared with the simulator):
        ACTIVATE steps, preemptions, scales that release GPUs, starts, other scales, other loan steps --
        so GPUs freed by one action serve a later one and loan steps see what the job actions left;
        then pending reasons.

        Each action is re-checked against fresh state inside its own savepoint and refused alone, with
        the reason in ``ApplyResult.rejected``, when that state no longer allows it: the job or server is
        not in the state the action expects (the lifecycle tables refuse the move), a planned GPU is held
        by another worker (the unique key), missing or unhealthy, a new worker's server cannot run
        training, or a server to reclaim or return still holds workers.

        Every server whose allocations or state changed gets one desired-generation bump; its agent
        hears of it only after commit."""
        if plan.is_empty:
            return ApplyResult((), (), frozenset())

        def work(session: Session) -> ApplyLog:
            log = ApplyLog()  # per attempt: a retried transaction starts over
            now = self._clock.now()
            job_ids = sorted({a.job_id for a in (*plan.preemptions, *plan.scales, *plan.starts)})
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
                if isinstance(action, StartJob) and together is None:
                    assert placement is not None
                    together = (self._apply_starts_together(session, plan.starts, jobs, placement, now, log)
                                if len(plan.starts) >= _BATCH_STARTS_FROM else set())
                if isinstance(action, StartJob) and action.job_id in together:
                    continue
                try:
                    with session.begin_nested():
                        if isinstance(action, ServerAction):
                            servers = self._apply_server_step(session, action, now)
                        elif isinstance(action, PreemptJob):
                            servers = self._apply_preemption(session, jobs.get(action.job_id), action)
                        elif isinstance(action, ScaleJob):
                            servers = self._apply_scale(session, jobs.get(action.job_id), action, placement, now)
                        else:
                            servers = self._apply_start(session, jobs.get(action.job_id), action, placement, now)
                        session.flush()  # constraint and version checks fire here, inside the savepoint
                except (IntegrityError, StaleDataError, IllegalTransition, _Refused) as exc:
                    log.refused(action, _refusal_message(exc, server_step=isinstance(action, ServerAction)))
                    continue
                log.applied(action, servers)
            self._bump_generations(session, log.touched)
            self._apply_pending(session, plan.pending)
            return log

        log = self._tx(work)
        if log.changed:
            self._after_commit(log.touched)
        elif plan.pending:
            self.notifier.events_appended()
        return log.result()

    def _apply_preemption(self, session: Session, job: m.Job | None, action: PreemptJob) -> set[str]:
        """Stop every worker and requeue: RUNNING -> PREEMPTED -> PENDING, both recorded with the
        action's reason; the reason also becomes the pending reason ExplainJob shows."""
        if job is None or not JobState(job.state).holds_gpus:
            raise _Refused(f"job {action.job_id} is {_state_of(job)}, not running: there is nothing to preempt")
        servers = self._free_allocations(session, job.id)
        job.num_workers = 0
        job.preemptions += 1
        job.pending_reason = f"{action.reason}: {action.message}"[:1024]
        self._set_job_state(session, job, JobState.PREEMPTED, action.reason, action.message)
        self._set_job_state(session, job, JobState.PENDING, action.reason, f"requeued: {action.message}")
        return servers

    def _apply_scale(
        self, session: Session, job: m.Job | None, action: ScaleJob, placement: _PlacementCheck, now: float
    ) -> set[str]:
        """Replace the job's allocations with exactly the planned placement (workers that stay keep
        their rows) and record RUNNING -> SCALING -> RUNNING. A resize is not a restart: ``restarts``
        counts failures only."""
        if job is None or job.state != JobState.RUNNING:
            raise _Refused(f"job {action.job_id} is {_state_of(job)}, not running: it cannot be resized")
        a = m.Allocation.__table__.c
        current = session.execute(
            sa.select(a.id, a.rank, a.server_id, a.gpu_index).where(a.job_id == job.id)
        ).all()
        planned = {(w.rank, w.server_id, index) for w in action.workers for index in w.gpu_indices}
        held = {(row.rank, row.server_id, row.gpu_index) for row in current}
        placement.check(job, action.workers, new_gpus={(s, index) for _, s, index in planned - held})
        # Delete before insert: a GPU that changes rank within the job must be free again first.
        gone = [row.id for row in current if (row.rank, row.server_id, row.gpu_index) not in planned]
        if gone:
            session.execute(sa.delete(m.Allocation.__table__).where(a.id.in_(gone)))
        self._insert_allocations(session, job.id, sorted(planned - held), now)
        self._set_job_state(session, job, JobState.SCALING, action.reason, action.message)
        self._new_incarnation(job, action.workers)
        job.num_workers = len(action.workers)
        job.last_resized_at = now
        self._set_job_state(
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
        self._insert_allocations(session, job.id, planned, now)  # the unique key refuses a GPU already held
        self._new_incarnation(job, action.workers)
        job.num_workers = len(action.workers)
        job.started_at = job.started_at or now
        job.last_resized_at = now
        job.pending_reason = ""
        self._set_job_state(session, job, JobState.RUNNING, action.reason, action.message)
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
        j = m.Job.__table__
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
                session.execute(sa.insert(m.Allocation.__table__), [
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
                session.execute(sa.insert(m.Event.__table__), [
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

    @staticmethod
    def _new_incarnation(job: m.Job, workers: Iterable[Any]) -> None:
        """Every worker of the job (re)starts: a new incarnation, no exits yet, and where each rank
        now runs (merged into the history, so logs of ranks a shrink removed stay findable)."""
        job.incarnation = (job.incarnation or 0) + 1
        job.worker_exits = None
        job.rank_servers = {**(job.rank_servers or {}), **{str(w.rank): w.server_id for w in workers}}

    @staticmethod
    def _insert_allocations(
        session: Session, job_id: int, gpus: Sequence[tuple[int, str, int]], now: float
    ) -> None:
        """One INSERT for all (rank, server id, gpu index) rows of a job."""
        if gpus:
            session.execute(
                sa.insert(m.Allocation.__table__),
                [dict(job_id=job_id, rank=rank, server_id=server_id, gpu_index=index, allocated_at=now)
                 for rank, server_id, index in gpus],
            )

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
        self._set_server_state(session, server, rule.target, action.reason, action.message)
        summary = f"{action.reason}: {action.message}"[:1024]
        if loan is None:
            loan = m.Loan(server_id=server.id, state=rule.loan_after, reason=summary, started_at=now, ended_at=None)
            session.add(loan)
            session.flush()  # the loan's id, for the event; the one-open-loan index checks here
            self._event(session, "LOAN_STARTED", server_id=server.id, reason=action.reason,
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
                self._event(
                    session, "LOAN_ENDED", server_id=server.id, reason=action.reason,
                    message=f"{action.message} (loaned for {now - loan.started_at:.0f}s)"[:2048],
                    details={"loan_id": str(loan.id)},
                )
        return {server.id}

    def _apply_pending(self, session: Session, pending: Sequence[KeepPending]) -> None:
        """Record new pending reasons in bulk: one UPDATE and one events INSERT for all of them."""
        if not pending:
            return
        jobs = m.Job.__table__
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
            sa.insert(m.Event.__table__),
            [
                dict(time=now, kind="JOB_PENDING_REASON", job_id=p.job_id, server_id=None, from_state="",
                     to_state="", reason=p.reason, message=p.message[:2048], details={})
                for p in items
            ],
        )


# PostgreSQL's serialization_failure and deadlock_detected: the transaction lost to a concurrent one,
# and running it again is safe.
_LOST_TO_A_CONCURRENT_TRANSACTION = frozenset({"40001", "40P01"})
# session.info key: desired states read inside a transaction, pushed after its commit (see ``_tx``).
_DESIRED_STATES = "aryl.desired_states"
# A server's part of its desired state (``_desired_states_of``).
_DESIRED_SERVER_COLUMNS = tuple(
    m.Server.__table__.c[name] for name in ("id", "agent_address", "desired_generation", "state")
)

# A plan with at least this many starts applies them as one batch (``_apply_starts_together``).
_BATCH_STARTS_FROM = 2


class _Refused(Exception):
    """A plan action that fresh state no longer allows; ``str()`` says why, for ``ApplyResult.rejected``."""


@dataclass
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
        s, g = m.Server.__table__.c, m.Gpu.__table__.c
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


@functools.lru_cache(maxsize=1024)
def _index_list(aggregated: str | None) -> tuple[int, ...]:
    """GPU indices aggregated as text (``"3,0,1"``), ascending; most servers share a few such lists."""
    return tuple(sorted(int(i) for i in aggregated.split(","))) if aggregated else ()


def _at_least(column: Any, value: int) -> Any:
    """SQL for ``max(column, value)`` on both databases (a generation never goes back)."""
    return sa.case((column < value, value), else_=column)


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


def _encode_page_token(last_id: int, flt: JobFilter) -> str:
    return base64.urlsafe_b64encode(f"v1:{last_id}:{flt.digest()}".encode()).decode()


def _decode_page_token(token: str, flt: JobFilter) -> int:
    try:
        version, last_id, digest = base64.urlsafe_b64decode(token.encode()).decode().split(":")
        before = int(last_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token", "is not a token returned by ListJobs") from None
    if version != "v1" or digest != flt.digest():
        raise InvalidArgument("page_token", "was issued for a different filter; start again without it")
    if not 0 < before <= 2**63 - 1:
        raise InvalidArgument("page_token", "is not a token returned by ListJobs")
    return before


def _summarize(job: m.Job, decisions: Sequence[m.Event]) -> str:
    state = JobState(job.state)
    if state == JobState.PENDING:
        why = job.pending_reason or "waiting for the next scheduling cycle"
        preempted = [e for e in decisions if e.to_state == JobState.PREEMPTED]
        if preempted:
            return f"Pending (requeued after preemption: {preempted[-1].message}); {why}"
        return f"Pending: {why}"
    if state in (JobState.RUNNING, JobState.SCALING):
        return f"{state.title()} with {job.num_workers} worker(s): {job.state_reason}: {job.state_message}"
    if state == JobState.PREEMPTED:
        return f"Preempted: {job.state_reason}: {job.state_message}"
    return f"{state.title()}: {job.state_reason}: {job.state_message}"


def _job_row(sub: JobSubmission, now: float) -> dict[str, Any]:
    return dict(
        name=sub.name, user=sub.user, queue=sub.queue, command=list(sub.command), env=dict(sub.env),
        gpus_per_worker=sub.gpus_per_worker, min_workers=sub.min_workers, max_workers=sub.max_workers,
        priority=sub.priority, deadline=sub.deadline, throughput=sub.throughput, max_runtime_s=sub.max_runtime_s,
        restart_policy=sub.restart_policy, max_restarts=sub.max_restarts, idempotency_key=sub.idempotency_key,
        state=JobState.PENDING, state_reason=Reason.SUBMITTED, state_message="queued", pending_reason="",
        num_workers=0, restarts=0, preemptions=0, submitted_at=now, started_at=None, finished_at=None,
    )
