"""Jobs in the store: submitting (many at once), reading and listing, cancelling (many at once), and
where a rank's logs are.

Submissions and cancellations come many at once (the API's group commit, SubmitJobs) and are written
with a fixed number of statements however many there are: on PostgreSQL the jobs with one COPY and
their events with one INSERT ... SELECT (elsewhere multi-row INSERTs), one UPDATE and one DELETE for
every cancelled job.

Never: commit, or decide anything about a job but what its request asks.
"""

from __future__ import annotations

import functools
import io
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.audit import ACTOR, current_actor
from scheduler_service.core.clock import Clock
from scheduler_service.core.plan import Reason
from scheduler_service.errors import FailedPrecondition, NotFound
from scheduler_service.lifecycle import JobState
from scheduler_service.records import EventInfo, JobFilter, JobInfo, JobSubmission, command_preview
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges, load_job
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.rows import Values, event_info, job_info


class JobStore:
    def __init__(self, changes: StateChanges, desired: DesiredStates, clock: Clock) -> None:
        self._changes = changes
        self._desired = desired
        self._clock = clock

    def insert(
        self, session: Session, subs: Sequence[JobSubmission], now: float, *, array: bool = False
    ) -> list[JobInfo]:
        """Queue ``subs`` as PENDING jobs submitted at ``now``, each with its JOB_SUBMITTED event.
        With ``array`` they form one job array whose id is the first one's job id. On PostgreSQL the rows
        go in with COPY (``_copy_in``), elsewhere with multi-row INSERTs.
        Raises IntegrityError when a user's idempotency key was used before (by that user); the use
        cases see it as ``KeyTaken`` (``Transactions.write``)."""
        rows = [_job_row(sub, now) for sub in subs]
        if session.get_bind().dialect.name == "postgresql":
            return _copy_in(session, subs, rows, array=array)
        return _insert_values(session, subs, rows, array=array)

    @staticmethod
    def by_keys(session: Session, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], JobInfo]:
        """The jobs holding any of ``keys`` ((user, idempotency key) pairs), by key, as they are now."""
        if not keys:
            return {}
        j = m.JOBS.c
        found = {}
        # Chunked: an IN list of (user, key) pairs per statement, bounded for the database's parameter limit.
        for start in range(0, len(keys), 2000):
            chunk = keys[start:start + 2000]
            rows = session.execute(  # every column: a retry is told apart by its whole spec
                sa.select(m.JOBS).where(sa.tuple_(j.user, j.idempotency_key).in_(chunk))
            ).all()
            found.update({(row.user, row.idempotency_key): job_info(row._mapping) for row in rows})
        return found

    @staticmethod
    def active_in_array(session: Session, array_job_id: int) -> tuple[list[int], bool]:
        """The ids of the array's jobs that have not ended, and whether the array has any job at all."""
        j = m.JOBS.c
        rows = session.execute(sa.select(j.id, j.state).where(j.array_job_id == array_job_id).order_by(j.id)).all()
        return [row.id for row in rows if not JobState(row.state).is_terminal], bool(rows)

    @staticmethod
    def by_key(session: Session, user: str, key: str) -> JobInfo | None:
        """The job ``user`` submitted with idempotency key ``key``, as it is now (keys are per user)."""
        j = m.JOBS.c
        job = session.execute(
            sa.select(m.JOBS).where(j.user == user, j.idempotency_key == key)
        ).one_or_none()
        if job is None:
            return None
        return job_info(job._mapping, _allocations(session, [job.id])[job.id])

    @staticmethod
    def get(session: Session, job_id: int, *, include_events: bool) -> tuple[JobInfo, tuple[EventInfo, ...]]:
        job = session.execute(sa.select(m.JOBS).where(m.JOBS.c.id == job_id)).one_or_none()
        if job is None:
            raise NotFound(f"job {job_id} not found")
        allocations = _allocations(session, [job_id])[job_id]
        events: tuple[EventInfo, ...] = ()
        if include_events:
            e = m.EVENTS.c
            events = tuple(
                event_info(row._mapping)
                for row in session.execute(sa.select(m.EVENTS).where(e.job_id == job_id).order_by(e.id))
            )
        return job_info(job._mapping, allocations), events

    @staticmethod
    def page(session: Session, flt: JobFilter, *, size: int, before: int | None) -> tuple[list[JobInfo], bool]:
        """Up to ``size`` jobs matching ``flt`` with ids below ``before``, newest first, and whether
        more follow."""
        j = m.JOBS.c
        stmt = sa.select(*_LIST_COLUMNS)
        if flt.states:
            stmt = stmt.where(j.state.in_([str(s) for s in flt.states]))
        if flt.user:
            stmt = stmt.where(j.user == flt.user)
        if flt.queue:
            stmt = stmt.where(j.queue == flt.queue)
        if before is not None:
            stmt = stmt.where(j.id < before)
        # Core rows, not ORM entities: a page is read-only, and a 1,000-job page costs half as much.
        jobs = [row._mapping for row in session.execute(stmt.order_by(j.id.desc()).limit(size + 1))]
        more = len(jobs) > size
        jobs = jobs[:size]
        allocations = _allocations(session, [job["id"] for job in jobs])
        return [job_info(job, allocations[job["id"]]) for job in jobs], more

    @staticmethod
    def server_gpu_counts(session: Session) -> list[int]:
        """How many GPUs each registered server has (any pool, any state): the largest shape a job may
        take (``core.fit``)."""
        # Plain SQL on the session's connection: read in every SubmitJob group commit, where the ORM's
        # statement handling cost more than the query.
        return list(session.connection().exec_driver_sql(_GPU_COUNTS_SQL).scalars())

    def cancel(
        self, session: Session, requests: Sequence[tuple[int, str, str]]
    ) -> tuple[list[JobInfo | NotFound | FailedPrecondition], set[str]]:
        """Cancel each ``(job id, reason, actor)``: one answer per request, and the servers whose workers
        stopped. A job that does not exist or has already ended fails only its own request; the same
        job twice is cancelled once and the second request is refused. ``actor``: who asked, recorded on
        the job's event (requests of several callers share one transaction: the API's group commit);
        "" for the actor of the calling context."""
        now = self._clock.now()
        ids = sorted({job_id for job_id, _, _ in requests})
        # Locked in id order (as an apply locks them): the set-based UPDATE below then needs no
        # per-row version check, which would cost a round trip per job.
        jobs = {job.id: job for job in session.scalars(
            sa.select(m.Job).where(m.Job.id.in_(ids)).order_by(m.Job.id).with_for_update()
        )}
        results: list[int | NotFound | FailedPrecondition] = []
        messages: dict[int, str] = {}
        for job_id, reason, actor in requests:
            job = jobs.get(job_id)
            if job is None:
                results.append(NotFound(f"job {job_id} not found"))
                continue
            state = JobState.CANCELLED if job_id in messages else JobState(job.state)
            if state.is_terminal:  # also the second request for a job these requests cancel
                results.append(FailedPrecondition(
                    f"job {job_id} is already {state}; only active jobs can be cancelled"))
                continue
            message = reason or "cancelled by user"
            acting = ACTOR.set(actor) if actor else None
            try:
                self._changes.job_state_event(session, job, JobState.CANCELLED, Reason.CANCELLED_BY_USER, message)
            finally:
                if acting is not None:
                    ACTOR.reset(acting)
            messages[job_id] = message[:1024]
            results.append(job_id)
        if not messages:
            return [r for r in results if not isinstance(r, int)], set()
        session.flush()  # the events, in one statement
        # Every cancelled job in one statement, and every cancelled job's GPUs in another.
        j, a = m.JOBS.c, m.ALLOCATIONS.c
        cancelled = sorted(messages)
        updated = {row.id: job_info(row._mapping) for row in session.execute(
            sa.update(m.JOBS).where(j.id.in_(cancelled))
            .values(state=JobState.CANCELLED, state_reason=Reason.CANCELLED_BY_USER,
                    state_message=sa.case(messages, value=j.id), num_workers=0, finished_at=now,
                    pending_reason="", version=j.version + 1)
            .returning(*m.JOBS.c)
        )}
        touched = set(session.scalars(
            sa.delete(m.ALLOCATIONS).where(a.job_id.in_(cancelled)).returning(a.server_id)
        ))
        self._desired.bump(session, touched)
        return [updated[r] if isinstance(r, int) else r for r in results], touched

    @staticmethod
    def log_source(session: Session, job_id: int, rank: int) -> tuple[str, str]:
        """(server id, agent logs address) of where ``rank`` of the job ran most recently."""
        job = load_job(session, job_id)
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


# ``JobStore.server_gpu_counts``' query.
_GPU_COUNTS_SQL = f"SELECT count(*) FROM {m.GPUS.name} GROUP BY {m.GPUS.c.server_id.name}"


def _allocations(session: Session, job_ids: Sequence[int]) -> dict[int, list[Values]]:
    """Each job's allocations, in rank then GPU order."""
    by_job: dict[int, list[Values]] = defaultdict(list)
    if job_ids:
        a = m.ALLOCATIONS.c
        rows = session.execute(
            sa.select(a.job_id, a.rank, a.server_id, a.gpu_index, a.allocated_at)
            .where(a.job_id.in_(job_ids))
            .order_by(a.job_id, a.rank, a.gpu_index)
        )
        for row in rows:
            values = row._mapping
            by_job[values["job_id"]].append(values)
    return by_job


# What a list page reads of each job: every column but the bulky spec ones (command and env, up to
# 256 KiB a job): the command's preview stands in for the command (``records.command_preview``) and
# the environment is left out (``rows.job_info`` reads it as empty), as ``api.convert.job_summary`` shows them.
_LIST_COLUMNS = (
    *(c for c in m.JOBS.c if c.name not in ("command", "env", "command_preview")),
    m.JOBS.c.command_preview.label("command"),
)

# The columns of a job that its INSERT leaves to the database's defaults, as the database fills them in.
_NOT_WRITTEN_YET: dict[str, Any] = dict(
    last_resized_at=None, work_done=0.0, last_checkpoint_at=None, incarnation=0, checkpoint_work=None,
    worker_exits=None, rank_servers=None, size_note="", batch_local=None, batch_accum=None, batch_replicas=None,
    goodput_reports=None,
)


def _job_row(sub: JobSubmission, now: float) -> dict[str, Any]:
    return dict(
        name=sub.name, user=sub.user, queue=sub.queue, command=list(sub.command), env=dict(sub.env),
        command_preview=command_preview(sub.command),
        gpus_per_worker=sub.gpus_per_worker, min_workers=sub.min_workers, max_workers=sub.max_workers,
        priority=sub.priority, deadline=sub.deadline, throughput=sub.throughput, max_runtime_s=sub.max_runtime_s,
        restart_policy=sub.restart_policy, max_restarts=sub.max_restarts, idempotency_key=sub.idempotency_key,
        working_dir=sub.working_dir, working_dir_if_exists=sub.working_dir_if_exists, array_index=sub.array_index,
        priority_class=sub.priority_class, priority_value=sub.priority_value, gpu_types=list(sub.gpu_types) or None,
        **_batch_columns(sub),
        state=JobState.PENDING, state_reason=Reason.SUBMITTED, state_message="queued", pending_reason="",
        num_workers=0, restarts=0, preemptions=0, submitted_at=now, started_at=None, finished_at=None,
    )


def _batch_columns(sub: JobSubmission) -> dict[str, Any]:
    """The batch limits' columns (migration 0014): NULL for a job without."""
    limits = sub.batch_limits
    if limits is None:
        return dict(batch_init=None, batch_max=None, batch_max_local=None)
    return dict(batch_init=limits.init_bsz, batch_max=limits.max_bsz, batch_max_local=limits.max_atomic_bsz)


def _submitted_event(row: dict[str, Any], sub: JobSubmission, job_id: int) -> dict[str, Any]:
    return dict(time=row["submitted_at"], kind="JOB_SUBMITTED", job_id=job_id, server_id=None, from_state="",
                to_state=JobState.PENDING, reason=Reason.SUBMITTED, details={},
                message=f"{row['name']} by {row['user']} in queue {row['queue']}: {row['min_workers']}.."
                f"{row['max_workers']} worker(s) x {row['gpus_per_worker']} GPU(s)",
                actor=sub.submitted_by or current_actor())


def _insert_values(session: Session, subs: Sequence[JobSubmission], rows: list[dict[str, Any]], *,
                   array: bool) -> list[JobInfo]:
    """Any database: the jobs and their JOB_SUBMITTED events with multi-row INSERTs."""
    # Core INSERT ... RETURNING in one round trip for all of them ("insertmanyvalues").
    # Core tables, not ORM entities: the ORM's bulk path costs more than the database here.
    jobs, events = m.JOBS, m.EVENTS
    ids = list(
        session.scalars(
            sa.insert(jobs).returning(jobs.c.id, sort_by_parameter_order=True), [{**r, "version": 1} for r in rows]
        )
    )
    session.execute(
        sa.insert(events),
        [_submitted_event(row, sub, job_id) for job_id, row, sub in zip(ids, rows, subs, strict=True)],
    )
    array_job_id = None
    if array and ids:
        # The ids are only known now (RETURNING): one statement marks the whole array.
        array_job_id = ids[0]
        session.execute(sa.update(jobs).where(jobs.c.id.in_(ids)).values(array_job_id=array_job_id))
    return [job_info({**row, **_NOT_WRITTEN_YET, "id": job_id, "version": 1, "array_job_id": array_job_id})
            for job_id, row in zip(ids, rows, strict=True)]


def _copy_in(session: Session, subs: Sequence[JobSubmission], rows: list[dict[str, Any]], *,
             array: bool) -> list[JobInfo]:
    """PostgreSQL: the jobs written with COPY and their JOB_SUBMITTED events with one INSERT ... SELECT
    from them, in the session's transaction, ids drawn from the jobs' sequence first (one statement).
    Per job this costs a fraction of multi-row INSERTs (``benchmarks/bench_submit``). The rows are the
    INSERT path's: each value as its column type binds it (JSON as the INSERT stores it, None as JSON
    null), every Python-side column default written, the events' messages the same text."""
    connection = session.connection()
    dialect = connection.dialect
    raw = connection.connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor()
    try:
        try:
            cursor.execute("SELECT nextval(pg_get_serial_sequence('jobs', 'id')) FROM generate_series(1, %s)",
                           (len(rows),))
            ids = sorted(job_id for (job_id,) in cursor.fetchall())  # ascending, as RETURNING's in order
            array_job_id = ids[0] if array and ids else None
            jobs = [{**_JOB_DEFAULTS, **row, "id": job_id, "array_job_id": array_job_id}
                    for job_id, row in zip(ids, rows, strict=True)]
            columns = list(jobs[0])
            quoted = ", ".join(dialect.identifier_preparer.quote(c) for c in columns)
            cursor.copy_expert(f"COPY jobs ({quoted}) FROM STDIN", _CopySource(_copy_lines(columns, jobs, dialect)))
            cursor.execute(_EVENTS_FROM_JOBS, dict(
                ids=ids, actors=[sub.submitted_by or current_actor() for sub in subs],
                to_state=str.__str__(JobState.PENDING), reason=str.__str__(Reason.SUBMITTED),
            ))
        finally:
            cursor.close()
    except dialect.loaded_dbapi.Error as exc:
        # As SQLAlchemy raises a statement's error (IntegrityError for a used idempotency key, ...).
        invalidated = dialect.is_disconnect(exc, raw, None)
        if invalidated:
            connection.invalidate(exc)
        raise sa.exc.DBAPIError.instance("COPY jobs; INSERT INTO events", None, exc, dialect.loaded_dbapi.Error,
                                         connection_invalidated=invalidated, dialect=dialect) from exc
    return [job_info({**job, **_NOT_WRITTEN_YET}) for job in jobs]


# The JOB_SUBMITTED event of each job just copied in, in job id order: ``_submitted_event``'s row.
_EVENTS_FROM_JOBS = """
INSERT INTO events (time, kind, job_id, server_id, from_state, to_state, reason, details, message, actor)
SELECT j.submitted_at, 'JOB_SUBMITTED', j.id, NULL, '', %(to_state)s, %(reason)s, '{}'::json,
       format('%%s by %%s in queue %%s: %%s..%%s worker(s) x %%s GPU(s)',
              j.name, j."user", j.queue, j.min_workers, j.max_workers, j.gpus_per_worker),
       t.actor
FROM unnest(%(ids)s::bigint[], %(actors)s::text[]) AS t(id, actor) JOIN jobs j ON j.id = t.id
ORDER BY j.id
"""

# Every column of a new job that ``_job_row`` leaves out and the model gives a Python-side default (an
# INSERT writes those; COPY writes what it is given).
_JOB_DEFAULTS: dict[str, Any] = {
    c.name: c.default.arg for c in m.JOBS.c if c.default is not None and c.default.is_scalar  # type: ignore[attr-defined]
}

_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _copy_string(value: str) -> str:
    """A string in COPY's text format: its backslashes, tabs and line breaks escaped. Most strings have
    none of them, and four scans for them cost a tenth of ``str.translate``."""
    value = value if type(value) is str else str.__str__(value)  # a StrEnum's value, not its name
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        return value.translate(_COPY_ESCAPES)
    return value


def _copy_text(value: Any) -> str:
    """One value in COPY's text format, as psycopg2 would send it in an INSERT."""
    if value is None:
        return "\\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return int.__repr__(value)  # an IntEnum's number, not its name
    return _copy_string(value)


@functools.lru_cache(maxsize=16)
def _column_texts(columns: tuple[str, ...], dialect: sa.Dialect) -> tuple[Callable[[Any], str], ...]:
    """Each of ``columns``' ``_column_text``, looked up once per dialect and column list, not once per COPY
    (a group commit of a dozen SubmitJobs paid more for the look-ups than for its rows)."""
    return tuple(_column_text(m.JOBS.c[c], dialect) for c in columns)


def _column_text(column: sa.Column[Any], dialect: sa.Dialect) -> Callable[[Any], str]:
    """``column``'s values in COPY's text format: bound as the column type binds them, then ``_copy_text``;
    plain strings (the most columns) directly."""
    process = column.type.dialect_impl(dialect).bind_processor(dialect)
    if process is not None:
        return lambda value: _copy_text(process(value))
    if isinstance(column.type, sa.String):
        return lambda value: "\\N" if value is None else _copy_string(value)
    return _copy_text


# Rows rendered per piece of COPY's input: the text of a piece is held in memory at once, not the table's.
_COPY_PIECE_ROWS = 256


def _copy_lines(columns: Sequence[str], values: Sequence[dict[str, Any]], dialect: sa.Dialect) -> Iterator[str]:
    """COPY's input for ``values``, in pieces of up to ``_COPY_PIECE_ROWS`` lines, rendered column by column.

    Most columns hold the same object in every row (a state, "", 0, None, the submission time): its text
    is rendered once for the piece. A list of strings (a command, GPU types) or an empty mapping is a new
    object in every row but mostly the same value: its text is kept by value."""
    texts = _column_texts(tuple(columns), dialect)
    for first in range(0, len(values), _COPY_PIECE_ROWS):
        piece = values[first:first + _COPY_PIECE_ROWS]
        rendered = [_column_piece(text, [row[c] for row in piece]) for c, text in zip(columns, texts, strict=True)]
        yield "".join(["\t".join(fields) + "\n" for fields in zip(*rendered, strict=True)])


def _column_piece(text: Callable[[Any], str], values: list[Any]) -> list[str]:
    """The texts of one column's ``values`` (a piece of COPY's rows)."""
    if len(set(map(id, values))) == 1:  # one object in every row
        return [text(values[0])] * len(values)
    by_value: dict[Any, str] = {}
    out = []
    for value in values:
        key = _value_key(value)
        if key is None:
            out.append(text(value))
            continue
        rendered = by_value.get(key)
        if rendered is None:
            rendered = by_value[key] = text(value)
        out.append(rendered)
    return out


def _value_key(value: Any) -> tuple[Any, ...] | None:
    """A hashable stand-in for a JSON value whose rendering ``_copy_lines`` keeps by value: a list of
    strings or an empty dict; None for any other value (rendered as it comes)."""
    kind = type(value)
    if kind is list and all(type(item) is str for item in value):
        return (list, *value)
    if kind is dict and not value:
        return (dict,)
    return None


class _CopySource(io.TextIOBase):
    """COPY's input, produced as psycopg2 reads it (no whole copy of the table text in memory). Each read
    copies only the text it returns: a piece of 256 rows is read in 8 KiB reads, never copied again per read."""

    def __init__(self, pieces: Iterator[str]) -> None:
        self._pieces = pieces
        self._piece = ""
        self._at = 0  # how much of ``_piece`` was read

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> str:
        if size is None or size < 0:
            text = self._piece[self._at:] + "".join(self._pieces)
            self._piece, self._at = "", 0
            return text
        parts = []
        want = size
        while want > 0:
            if self._at >= len(self._piece):
                following = next(self._pieces, None)
                if following is None:
                    break
                self._piece, self._at = following, 0
            part = self._piece[self._at:self._at + want]
            self._at += len(part)
            want -= len(part)
            parts.append(part)
        return "".join(parts)
