"""The snapshot reader: the frozen view (``core.snapshot.ClusterSnapshot``) a policy decides on,
read from the store in one transaction.

It runs every cycle over every server and active job, so it reads Core rows with only the columns the
policy needs (no ORM identity map, no command or environment), a server's GPUs aggregated into its
row, and keeps the server views of the last snapshot with what each was built from: a view whose
inputs did not change is reused as it is, with what it has derived.

Never: write, or decide anything.
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict, namedtuple
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from scheduler_service.core.apply_rules import LoanState
from scheduler_service.core.clock import Clock
from scheduler_service.core.snapshot import (
    AdminState,
    ClusterSnapshot,
    DemandView,
    JobView,
    ProgressWindow,
    ServerView,
    WorkerView,
)
from scheduler_service.core.type_speed import measured_speeds
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.store import models as m
from scheduler_service.store.changes import index_list
from scheduler_service.store.goodput import goodput_info, step_samples
from scheduler_service.store.inference import DemandRules, fresh_demand
from scheduler_service.store.queues import queue_views
from scheduler_service.store.rows import batch_limits
from scheduler_service.store.transactions import is_postgresql

ACTIVE_JOB_STATES = (JobState.PENDING, JobState.RUNNING, JobState.SCALING, JobState.PREEMPTED)
# Server states in which the server has an open loan (LOST/UNHEALTHY servers may too; they show none).
ON_LOAN_STATES = frozenset({ServerState.DRAINING, ServerState.LOANED, ServerState.RECLAIMING})


class SnapshotReader:
    def __init__(self, clock: Clock, demand_rules: DemandRules | None = None, *,
                 gpu_speeds: Mapping[str, float] | None = None) -> None:
        self._clock = clock
        self._demand_rules = demand_rules or DemandRules()
        # The declared speed of each GPU model (scheduling.gpu_speeds): ClusterSnapshot.gpu_speed.
        self._gpu_speed = tuple(sorted((gpu_speeds or {}).items()))
        # The server views of the last snapshot with what each was built from (reused when unchanged).
        self._server_views: dict[str, tuple[tuple[Any, ...], ServerView]] = {}
        # The active jobs' views of the last snapshot, likewise (most pending jobs' rows do not change).
        self._job_views: dict[int, tuple[tuple[Any, ...], JobView]] = {}
        self._stamped = False  # whether the last read keyed its views by row version (PostgreSQL)

    def read(self, session: Session, seed: int = 0) -> ClusterSnapshot:
        """The schedulable state: servers, active jobs, the latest inference demand, ``now``."""
        g, a, s, ln = (t.c for t in (m.GPUS, m.ALLOCATIONS, m.SERVERS, m.LOANS))
        by_server: dict[str, list[tuple[int, int]]] = defaultdict(list)
        # job id -> rank -> (server id, [gpu index, ...])
        by_job: dict[int, dict[int, tuple[str, list[int]]]] = defaultdict(dict)
        for job_id, rank, server_id, gpu_index in session.execute(
            sa.select(a.job_id, a.rank, a.server_id, a.gpu_index)
        ):
            by_server[server_id].append((gpu_index, job_id))
            by_job[job_id].setdefault(rank, (server_id, []))[1].append(gpu_index)
        # Open loans: when each began, and a reclaimed one's hard deadline.
        open_loans: dict[str, tuple[float, float | None]] = {
            server_id: (started_at, hard_deadline) for server_id, started_at, hard_deadline in session.execute(
                sa.select(ln.server_id, ln.started_at, ln.hard_deadline).where(ln.state != LoanState.RETURNED))
        }
        # A server's GPUs come aggregated with its row (one row per server, not per GPU), and a view
        # whose inputs are what they were last cycle is reused as it is, with what it has derived.
        gpus = (
            sa.select(g.server_id,
                      sa.func.aggregate_strings(sa.cast(g.index, sa.String), ",").label("indices"),
                      sa.func.aggregate_strings(
                          sa.case((g.healthy, None), else_=sa.cast(g.index, sa.String)), ",").label("unhealthy"),
                      sa.func.min(g.model).label("gpu_type"))  # its GPUs' model (mixed: the first by name)
            .group_by(g.server_id).subquery()
        )
        views: dict[str, tuple[tuple[Any, ...], ServerView]] = {}
        for row in session.execute(
            sa.select(s.id, s.pool, s.state, s.state_changed_at, m.OBSERVED_GENERATION.label("observed_generation"),
                      s.desired_generation, s.drained_at, s.admin_state, s.drain_deadline, gpus.c.indices,
                      gpus.c.unhealthy, gpus.c.gpu_type)
            .select_from(m.SERVERS_WITH_HEARTBEATS).outerjoin(gpus, gpus.c.server_id == s.id).order_by(s.id)
        ):
            allocated = tuple(sorted(by_server[row.id])) if row.id in by_server else ()
            loan = open_loans.get(row.id)
            key = (*row, allocated, loan)
            cached = self._server_views.get(row.id)
            views[row.id] = cached if cached is not None and cached[0] == key else (key, ServerView(
                server_id=row.id, pool=Pool(row.pool), state=ServerState(row.state),
                gpu_indices=index_list(row.indices), unhealthy_gpus=frozenset(index_list(row.unhealthy)),
                allocated=allocated, state_since=row.state_changed_at,
                loan_started_at=loan[0] if loan is not None and row.state in ON_LOAN_STATES else None,
                agent_converged=row.observed_generation >= row.desired_generation,
                drained=row.drained_at is not None,
                reclaim_deadline=loan[1] if loan is not None and row.state == ServerState.RECLAIMING else None,
                admin=AdminState(row.admin_state), drain_deadline=row.drain_deadline,
                gpu_type=row.gpu_type or "",
            ))
        self._server_views = views  # only this cycle's servers: a removed server is forgotten
        servers = tuple(view for _, view in views.values())
        jobs = self._read_jobs(session, by_job)
        # The fresh routers' reports combined (store.inference): a router gone quiet stops counting.
        demand = fresh_demand(session, self._clock.now(), self._demand_rules)
        n = m.SCHEDULER_NOTES.c
        loan_note = session.execute(sa.select(n.reason, n.message).where(n.topic == m.LOANS_TOPIC)).first()
        return ClusterSnapshot(
            now=self._clock.now(), servers=servers, jobs=jobs, seed=seed, queues=queue_views(session),
            loan_note=f"{loan_note.reason}: {loan_note.message}"[:1024] if loan_note is not None else "",
            demand=DemandView(demand.servers_needed, demand.observed_rps, demand.time) if demand else None,
            gpu_speed=self._gpu_speed,
        )

    def stamps(self, job_ids: Iterable[int]) -> dict[int, str]:
        """On PostgreSQL, the row versions (``xmin``) of ``job_ids`` as the last read saw them (those it
        saw); elsewhere none."""
        cache = self._job_views
        if not self._stamped:
            return {}
        return {job_id: entry[0][0] for job_id in job_ids if (entry := cache.get(job_id)) is not None}

    def reasons_written(self, written: Iterable[tuple[int, str, str, str]]) -> None:
        """After a commit: each (job, seen, stamp, reason) had its pending reason alone written on row version
        ``seen`` (``store.applier``), now version ``stamp``. A view this reader holds of version ``seen`` is
        kept with the new reason as version ``stamp``, so the next read does not read the row again (a
        burst of submits: every new job's row gets its first reason). A view of another version is left:
        its stamp tells the next read whether to read the row."""
        cache = self._job_views
        for job_id, seen, stamp, reason in written:
            entry = cache.get(job_id)
            if entry is not None and entry[0][0] == seen:
                cache[job_id] = ((stamp, entry[0][1]), _with_reason(entry[1], reason))

    def _read_jobs(self, session: Session, by_job: dict[int, dict[int, tuple[str, list[int]]]]) -> tuple[JobView, ...]:
        """The active jobs' views in id order. A view is reused while its row and its allocations are what
        they were last cycle. On PostgreSQL a row's ``xmin`` (the transaction that wrote this version of
        it: any UPDATE writes a new one) tells an unchanged row without reading it, so a cycle reads whole
        rows only for the jobs that changed since the last: with 10,000s of jobs waiting, most cycles read
        a few. Elsewhere every active row is read and compared."""
        j = m.JOBS.c
        active = j.state.in_([str(s) for s in ACTIVE_JOB_STATES])
        cache = self._job_views
        stamps: dict[int, str] | None = None
        where: sa.ColumnElement[bool] | None = active
        if is_postgresql(session):
            raw = session.connection().connection.dbapi_connection
            assert raw is not None
            cursor = raw.cursor()  # 10,000s of two-column rows: the driver's tuples, no Core rows
            try:
                cursor.execute("SELECT id, xmin::text FROM jobs WHERE state = ANY(%s)",
                               ([str(s) for s in ACTIVE_JOB_STATES],))
                stamps = dict(cursor.fetchall())
            finally:
                cursor.close()
            changed = [job_id for job_id, stamp in stamps.items()
                       if (last := cache.get(job_id)) is None or last[0] != (stamp, by_job.get(job_id))]
            if not changed:  # an idle cycle: nothing to read
                where = None
            elif len(changed) * 2 < len(stamps):  # else one scan of the active jobs beats a long id list
                ids = sa.bindparam("changed", changed, type_=postgresql.ARRAY(sa.BigInteger))
                where = sa.and_(active, j.id == sa.any_(ids))
        job_views: dict[int, tuple[tuple[Any, ...], JobView]] = {}
        # The JSON columns as their text, each distinct text decoded once (``_Decoded``): most jobs share theirs.
        decoded = _Decoded()
        rows = () if where is None else session.execute(sa.select(*_JOB_COLUMNS).where(where))
        row: Any  # a _JobRow
        for row in map(_JobRow._make, rows):
            allocations = by_job.get(row.id)
            job_key: tuple[Any, ...] = (stamps[row.id], allocations) if stamps is not None else (*row, allocations)
            last = cache.get(row.id)
            job_views[row.id] = last if last is not None and last[0] == job_key else (job_key, job_view(
                row, allocations, decoded))
        self._stamped = stamps is not None
        if stamps is not None:  # the unchanged rest, as last cycle
            for job_id in stamps.keys() - job_views.keys():
                job_views[job_id] = cache[job_id]
        ordered = sorted(job_views)
        self._job_views = {job_id: job_views[job_id] for job_id in ordered}  # an ended job is forgotten
        return tuple(job_views[job_id][1] for job_id in ordered)


# What a cycle reads of each active job (``job_view``), the JSON columns as their text. Read into
# ``_JobRow``s: a named tuple's fields read in a tenth of the time a Core row's do (10,000s a burst).
_JOB_COLUMNS = (
    *(m.JOBS.c[name] for name in (
        "id", "state", "gpus_per_worker", "min_workers", "max_workers", "priority", "submitted_at", "pending_reason",
        "work_done", "started_at", "last_resized_at", "last_checkpoint_at", "size_note", "deadline",
        "progress_at", "window_work", "window_at", "window_workers", "window_reports",
        "queue", "user", "priority_value",  # queues and GPU types (core.quota)
        "batch_init", "batch_max", "batch_max_local", "batch_local", "batch_accum", "batch_replicas",  # goodput
    )),
    *(sa.cast(m.JOBS.c[name], sa.Text).label(name)
      for name in ("throughput", "gpu_types", "disruptions", "goodput_reports")),
)
_JobRow = namedtuple("_JobRow", [c.name for c in _JOB_COLUMNS])  # type: ignore[misc]


_VIEW_FIELDS = attrgetter(*(f.name for f in dataclasses.fields(JobView)))
_REASON_AT = [f.name for f in dataclasses.fields(JobView)].index("pending_reason")


def _with_reason(view: JobView, reason: str) -> JobView:
    """``dataclasses.replace(view, pending_reason=reason)`` in half the time (10,000s a burst)."""
    values = _VIEW_FIELDS(view)
    return JobView(*values[:_REASON_AT], reason, *values[_REASON_AT + 1:])  # type: ignore[call-arg]


class _Decoded:
    """JSON texts decoded, each distinct text once (the values are only read, never changed)."""

    def __init__(self) -> None:
        self._values: dict[str | None, Any] = {None: None}

    def __call__(self, text: str | None) -> Any:
        try:
            return self._values[text]
        except KeyError:
            value = self._values[text] = json.loads(text)  # type: ignore[arg-type]
            return value


def job_view(row: Any, allocations: dict[int, tuple[str, list[int]]] | None, decoded: _Decoded) -> JobView:
    """An active job's view (``core.snapshot.JobView``) from its jobs row and its allocations by rank."""
    return JobView(
        job_id=row.id, state=JobState(row.state), gpus_per_worker=row.gpus_per_worker,
        min_workers=row.min_workers, max_workers=row.max_workers, priority=row.priority,
        submitted_at=row.submitted_at,
        workers=tuple(
            WorkerView(rank, server_id, tuple(sorted(indices)))
            for rank, (server_id, indices) in sorted(allocations.items())
        ) if allocations else (),
        estimated_runtime_s=(decoded(row.throughput) or {}).get("estimated_runtime_s"),
        pending_reason=row.pending_reason,
        throughput_points=tuple(
            (int(workers), float(speed))
            for workers, speed in (decoded(row.throughput) or {}).get("points", ())
        ),
        total_work=float((decoded(row.throughput) or {}).get("total_work", 0.0)),
        work_done=row.work_done,
        queue=row.queue, user=row.user, priority_class=row.priority_value,
        gpu_types=tuple(decoded(row.gpu_types) or ()),
        started_at=row.started_at,
        last_resized_at=row.last_resized_at,
        last_checkpoint_at=row.last_checkpoint_at,
        disruptions=tuple(decoded(row.disruptions) or ()),
        size_note=row.size_note,
        deadline=row.deadline,
        progress_window=progress_window(row),
        **goodput_fields(row, decoded),
    )


def goodput_fields(row: Any, decoded: _Decoded) -> dict[str, Any]:
    """A job view's goodput fields (``core.snapshot.JobView``) from a jobs row with the 0014 columns."""
    limits = batch_limits(row.batch_init, row.batch_max, row.batch_max_local)
    if limits is None:
        return {}
    info = goodput_info(decoded(row.goodput_reports))
    now = (row.batch_local, row.batch_accum, row.batch_replicas)
    return dict(batch_limits=limits, step_samples=step_samples(info), grad_stats=info.grad,
                batch_now=None if None in now else now,
                type_speeds=tuple(sorted((t, speed) for t, (speed, _) in measured_speeds(info.step_times).items())))


def progress_window(row: Any) -> ProgressWindow | None:
    """The job's progress window (``core.snapshot.ProgressWindow``) from a jobs row with the 0009 columns:
    kept while the job waits (preempted: its rate at its last size still says how fast it goes), restarted
    by the first report of its next incarnation. None before any progress report."""
    if row.window_at is None or row.progress_at is None or row.window_workers <= 0:
        return None
    return ProgressWindow(workers=row.window_workers, first_work=row.window_work, first_at=row.window_at,
                          last_work=row.work_done, last_at=row.progress_at, reports=row.window_reports)
