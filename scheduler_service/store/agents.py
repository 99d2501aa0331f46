"""Agents in the store: a server's registration and GPU inventory, and what its status reports say
(heartbeat, GPU telemetry and health, its workers' progress and exits, the generation it applied).

Reports are the hot path (1,000s of agents, every few seconds): GPU telemetry is one statement on
PostgreSQL, progress columns are written without the row's optimistic version (a report must never make
a concurrent decision on the same server or job fail as stale), the heartbeat and the observed generation
go to a row of their own (``server_heartbeats``: a report never locks its server's row, which every
decision's generation bump takes), and a report that only says the agent converged is one UPDATE. A full
report locks the rows it may change under their versions before it reads them (``record_report``): it
waits for a rival, and never starves.

Never: commit, or decide more than a report forces: a worker's exit is judged by
``worker_outcomes.judge_exits``; where jobs run is the policy's business.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.core.snapshot import AdminState
from scheduler_service.errors import Aborted, FailedPrecondition, InvalidArgument, NotFound
from scheduler_service.lifecycle import JobState, ServerState, home_state
from scheduler_service.records import GpuReport, GpuSample, ServerRegistration, StatusReport, WorkerReport
from scheduler_service.store import models as m
from scheduler_service.store.changes import StateChanges, at_least, free_allocations
from scheduler_service.store.db import broke_unique_key
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.goodput import with_report
from scheduler_service.store.transactions import commit_without_flush_wait, is_postgresql
from scheduler_service.worker_outcomes import Verdict, describe_exit, judge_exits


@dataclass(frozen=True)
class RecordedReport:
    """What recording a full status report found and did."""

    desired_generation: int
    observed_generation: int  # after the report (a generation never goes back)
    state: str  # the server's state after the report
    touched: frozenset[str] = field(default_factory=frozenset)  # servers whose desired state changed
    cycle_needed: bool = False  # something the policy must look at changed


@dataclass(frozen=True)
class ReportedState:
    """What a server's reports have recorded (``AgentStore.reported_state``)."""

    observed_generation: int
    health: tuple[tuple[int, bool], ...]  # (GPU index, healthy), by index


@dataclass(frozen=True)
class Generations:
    """A server's state with its observed and desired generations."""

    state: str
    observed: int
    desired: int


class AgentStore:
    def __init__(self, changes: StateChanges, desired: DesiredStates, clock: Clock) -> None:
        self._changes = changes
        self._desired = desired
        self._clock = clock

    def register(self, session: Session, reg: ServerRegistration, now: float) -> set[str]:
        """Add the server, or update a known one (a LOST server comes back to its home state, and its
        desired state is sent again). Returns the servers whose desired generation was bumped by hand."""
        touched: set[str] = set()
        server = session.get(m.Server, reg.hostname)
        inserted = server is None and (server := self._insert_server(session, reg, now)) is not None
        if server is None:  # a concurrent registration of the same hostname inserted it first: update that row
            server = session.get(m.Server, reg.hostname, populate_existing=True)
            if server is None:
                raise Aborted(f"server {reg.hostname} was registered and removed by concurrent calls; retry")
        if inserted:
            self._changes.event(
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
            if server.state == ServerState.LOST:
                self._changes.set_server_state(
                    session, server, home_state(server.pool), "AGENT_RECONNECTED", "agent registered again"
                )
            if server.admin_state == AdminState.LEFT:  # its agent deregistered; it is back (a cordon stays)
                self._changes.event(session, "SERVER_ADMIN_CHANGED", server_id=server.id, from_state=AdminState.LEFT,
                                    to_state=AdminState.NONE, reason="REGISTERED", message="agent registered again")
                server.admin_state, server.admin_reason, server.admin_changed_at = AdminState.NONE, "", now
            server.desired_generation += 1  # resend desired state to the (re)started agent
            touched.add(server.id)
        self._beat(session, server.id, now, None)
        self._sync_gpus(session, server, reg.gpus)
        return touched

    @staticmethod
    def reported_state(session: Session, server_id: str) -> ReportedState:
        """What the server's reports have recorded: the generation its agent applied, and its GPUs' health
        in index order (as an agent reports them)."""
        h, g = m.HEARTBEATS.c, m.GPUS.c
        observed = session.scalar(sa.select(h.observed_generation).where(h.server_id == server_id))
        health = tuple((index, healthy) for index, healthy in session.execute(
            sa.select(g.index, g.healthy).where(g.server_id == server_id).order_by(g.index)))
        return ReportedState(observed_generation=observed or 0, health=health)

    def _insert_server(self, session: Session, reg: ServerRegistration, now: float) -> m.Server | None:
        """The new server's row, or None when a concurrent registration of the same hostname committed it
        first: on PostgreSQL this INSERT waits for that transaction, then breaks the primary key; the savepoint
        keeps this transaction going, so the registration updates that row instead (a registration is an
        upsert, and one that lost the race must not fail)."""
        server = m.Server(
            id=reg.hostname, hostname=reg.hostname, pool=reg.pool, state=home_state(reg.pool),
            state_reason="registered", agent_address=reg.agent_address, agent_version=reg.agent_version,
            registered_at=now, desired_generation=1, state_changed_at=now, logs_address=reg.logs_address,
            inference_endpoint=reg.inference_endpoint,
        )
        try:
            with session.begin_nested():
                session.add(server)
                session.flush()
        except IntegrityError as exc:
            if broke_unique_key(exc, m.SERVERS.primary_key):
                return None
            raise
        return server

    def _sync_gpus(self, session: Session, server: m.Server, reported: Sequence[GpuReport]) -> None:
        existing = {g.index: g for g in session.scalars(sa.select(m.Gpu).where(m.Gpu.server_id == server.id))}
        # GPUs may come back in another order after a reboot: park changed UUIDs first so swapping two
        # of this server's UUIDs never trips the unique key half-way.
        moved = [(existing[g.index], g) for g in reported if g.index in existing and existing[g.index].uuid != g.uuid]
        for parked, _ in moved:
            parked.uuid = f"~moving:{server.id}:{parked.index}"
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
                self._changes.event(session, "GPU_HEALTH_CHANGED", server_id=server.id, reason="GPU_MISSING",
                                    message=f"GPU {row.index} missing from inventory")
        session.flush()

    def record_report(self, session: Session, report: StatusReport, now: float, *, epoch: int) -> RecordedReport:
        """Everything ``report`` says, under the scheduler's ``epoch``: heartbeat, observed generation,
        GPU telemetry and health, the workers' progress and exits. A server that was LOST comes back
        to its home state."""
        touched: set[str] = set()
        cycle_needed = False
        # The rows this report may change under their versions are locked before they are read, so a
        # concurrent change makes the report wait, never lose its version check (each loss was one of
        # CONFLICT_RETRIES, and a multi-worker job's reports kept losing to each other and to the cycle's
        # applies: ABORTED to the agent). Jobs first (by id, as a cancel takes them), then the server where
        # the report changes it (a LOST server back): the order in which the applier and a cancel take them
        # too, so that none waits for another in a circle. (SQLite has no FOR UPDATE, nor needs it: its
        # writers run one at a time.) The server's row is otherwise only read: what a report writes about it
        # is in its heartbeat row, so a decision bumping the server's generation never waits for a report.
        job_ids = sorted({w.job_id for w in report.workers})
        if job_ids:
            j = m.JOBS.c
            session.execute(sa.select(j.id).where(j.id.in_(job_ids)).order_by(j.id).with_for_update())
        h = m.HEARTBEATS.c
        found = session.execute(
            sa.select(m.Server, sa.func.coalesce(h.observed_generation, 0))
            .outerjoin(m.HEARTBEATS, h.server_id == m.Server.id).where(m.Server.id == report.server_id)
        ).one_or_none()
        if found is None:
            raise NotFound(f"server {report.server_id} is not registered; register it first")
        server, observed_before = found
        if server.admin_state == AdminState.LEFT:
            raise FailedPrecondition(f"server {report.server_id}'s agent deregistered; register again")
        if report.scheduler_epoch != epoch:
            raise FailedPrecondition(
                f"stale scheduler epoch {report.scheduler_epoch} (current {epoch}); register again"
            )
        self._beat(session, server.id, now, report.observed_generation)
        if report.observed_generation > observed_before:
            # A reclaimed server waits for exactly this confirmation to serve again; routing too.
            cycle_needed = cycle_needed or server.state in (ServerState.RECLAIMING, ServerState.SERVING)
        if server.state == ServerState.LOST:
            session.refresh(server, with_for_update=True)  # changed under its version: locked, then read again
            if server.state == ServerState.LOST:
                self._changes.set_server_state(
                    session, server, home_state(server.pool), "AGENT_RECONNECTED", "agent reported again"
                )
                touched.add(server.id)  # new generation: what ran there before it was lost must stop
                cycle_needed = True
        if report.gpus and self._record_gpus(session, server.id, report.gpus):
            cycle_needed = True
        if report.workers and self._record_workers(session, server.id, report.workers, now, touched):
            cycle_needed = True
        self._desired.bump(session, touched)
        if not touched and not cycle_needed:
            commit_without_flush_wait(session)  # telemetry only
        return RecordedReport(
            state=server.state, observed_generation=max(observed_before, report.observed_generation),
            desired_generation=server.desired_generation, touched=frozenset(touched), cycle_needed=cycle_needed,
        )

    def record_telemetry(
        self, session: Session, reports: Sequence[tuple[StatusReport, float]], *, epoch: int
    ) -> dict[str, RecordedReport]:
        """Many servers' telemetry-only reports (each with the time it arrived), what ``record_report`` would
        write for each in their order, in one transaction and a fixed number of statements however many
        there are: the jobs' locks, three reads, and one batch each of heartbeats, GPU samples and progress.
        Returns what was recorded, by server. A report this path does not take is left out, nothing of it
        written, for the caller to record on its own (``record_report``): its server unknown, LEFT, LOST or
        without a heartbeat row; another epoch; a GPU not registered, named twice or whose health changed; a
        worker's exit the scheduler did not ask for or a stop's acknowledgement; a worker of a requeued job
        (its resume point) or of a job with goodput measures. One report per server."""
        reports = list(reports)
        server_ids = sorted({report.server_id for report, _ in reports})
        if len(server_ids) != len(reports):
            raise ValueError("record_telemetry takes one report per server")
        job_ids = sorted({w.job_id for report, _ in reports for w in report.workers})
        j, s, h, a, g = m.JOBS.c, m.SERVERS.c, m.HEARTBEATS.c, m.ALLOCATIONS.c, m.GPUS.c
        if job_ids:  # locked first, by id, as ``record_report`` (and the applier, and a cancel) takes them
            session.execute(sa.select(j.id).where(j.id.in_(job_ids)).order_by(j.id).with_for_update())
        servers = {row.id: row for row in session.execute(
            sa.select(s.id, s.state, s.admin_state, s.desired_generation, h.server_id.label("beats"),
                      sa.func.coalesce(h.observed_generation, 0).label("observed"))
            .outerjoin(m.HEARTBEATS, h.server_id == s.id).where(s.id.in_(server_ids))
        )}
        gpus: dict[str, dict[int, bool]] = {}
        for sid, index, healthy in session.execute(
            sa.select(g.server_id, g.index, g.healthy).where(g.server_id.in_(server_ids))
        ):
            gpus.setdefault(sid, {})[index] = healthy
        # A job's columns that ``progress_values`` reads, as read here, kept up to date with what earlier reports
        # of the batch changed.
        jobs: dict[int, SimpleNamespace] = {}
        placed: set[tuple[str, int, int]] = set()
        if job_ids:
            jobs = {row.id: SimpleNamespace(**row._mapping) for row in session.execute(
                sa.select(j.id, j.state, j.incarnation, j.num_workers, j.batch_init, *(j[c] for c in PROGRESS_COLUMNS))
                .where(j.id.in_(job_ids))
            )}
            placed = {(row.server_id, row.job_id, row.rank) for row in session.execute(
                sa.select(a.server_id, a.job_id, a.rank).where(a.server_id.in_(server_ids), a.job_id.in_(job_ids))
            )}
        recorded: dict[str, RecordedReport] = {}
        beats: list[dict[str, Any]] = []
        samples: list[dict[str, Any]] = []
        changed_jobs: set[int] = set()
        cycle_needed = False
        for report, now in reports:
            server = servers.get(report.server_id)
            if (server is None or server.beats is None or server.admin_state == AdminState.LEFT
                    or server.state == ServerState.LOST or report.scheduler_epoch != epoch
                    or not _samples_unchanged(report.gpus, gpus.get(report.server_id, {}))):
                continue
            progress = _telemetry_progress(report, jobs, placed, now)
            if progress is None:
                continue
            for job_id, values in progress:
                vars(jobs[job_id]).update(values)
                changed_jobs.add(job_id)
            beats.append({"sid": report.server_id, "at": now, "observed": report.observed_generation})
            samples.extend({"sid": report.server_id, "gidx": x.index, "utilization": x.utilization,
                            "memory_used_bytes": x.memory_used_bytes, "temperature_c": x.temperature_c}
                           for x in report.gpus)
            # A reclaimed server waits for its agent's confirmation to serve again; routing too.
            rose = report.observed_generation > server.observed and server.state in (
                ServerState.RECLAIMING, ServerState.SERVING)
            cycle_needed = cycle_needed or rose
            recorded[report.server_id] = RecordedReport(
                state=server.state, observed_generation=max(server.observed, report.observed_generation),
                desired_generation=server.desired_generation, cycle_needed=rose,
            )
        if not cycle_needed:
            commit_without_flush_wait(session)  # telemetry only
        if beats:
            session.execute(
                sa.update(m.HEARTBEATS).where(h.server_id == sa.bindparam("sid"))
                .values(last_seen_at=sa.bindparam("at"),
                        observed_generation=at_least(h.observed_generation, sa.bindparam("observed"))),
                beats,
            )
        if samples:
            session.execute(
                sa.update(m.GPUS).where(g.server_id == sa.bindparam("sid"), g.index == sa.bindparam("gidx"))
                .values(utilization=sa.bindparam("utilization"), memory_used_bytes=sa.bindparam("memory_used_bytes"),
                        temperature_c=sa.bindparam("temperature_c")),
                samples,
            )
        if changed_jobs:
            session.execute(
                sa.update(m.JOBS).where(j.id == sa.bindparam("jid"))
                .values({c: sa.bindparam(f"v_{c}") for c in PROGRESS_COLUMNS}),
                [{"jid": job_id, **{f"v_{c}": getattr(jobs[job_id], c) for c in PROGRESS_COLUMNS}}
                 for job_id in sorted(changed_jobs)],
            )
        return recorded

    def record_observed_generation(self, session: Session, report: StatusReport) -> Generations | None:
        """A report whose only news is a newer observed generation: one UPDATE of the server's heartbeat
        row, no telemetry (on SQLite, whose UPDATE cannot return another table's columns, a read first).
        None when the server is LOST or has no heartbeat row yet (the full path brings it back, or writes
        one)."""
        s, h = m.SERVERS.c, m.HEARTBEATS.c
        commit_without_flush_wait(session)  # as telemetry: see ``record_report``
        if is_postgresql(session):
            beat = {"last_seen_at": self._clock.now(),
                    "observed_generation": at_least(h.observed_generation, report.observed_generation)}
            row = session.execute(
                sa.update(m.HEARTBEATS)
                .where(h.server_id == report.server_id, s.id == h.server_id, s.state != ServerState.LOST)
                .values(beat).returning(s.state, h.observed_generation, s.desired_generation)
            ).one_or_none()
            return None if row is None else Generations(row.state, row.observed_generation, row.desired_generation)
        row = session.execute(
            sa.select(s.state, h.observed_generation, s.desired_generation).join(m.HEARTBEATS, h.server_id == s.id)
            .where(s.id == report.server_id, s.state != ServerState.LOST)
        ).one_or_none()
        if row is None:
            return None
        self._beat(session, report.server_id, self._clock.now(), report.observed_generation)
        return Generations(row.state, max(row.observed_generation, report.observed_generation), row.desired_generation)

    @staticmethod
    def _beat(session: Session, server_id: str, now: float, observed: int | None) -> None:
        """The server's heartbeat row says it was heard at ``now`` and, where ``observed`` is given, that its
        agent applied that generation (never going back); written without touching the server's row. The
        row is made at the first write (registration, or a report of a server made without one)."""
        h = m.HEARTBEATS.c
        beat: dict[str, Any] = {"last_seen_at": now}
        if observed is not None:
            beat["observed_generation"] = at_least(h.observed_generation, observed)
        update = sa.update(m.HEARTBEATS).where(h.server_id == server_id).values(beat)
        updated = cast(CursorResult[Any], session.execute(update))
        if updated.rowcount:
            return
        insert = (pg_insert if is_postgresql(session) else sqlite_insert)(m.HEARTBEATS).values(
            server_id=server_id, last_seen_at=now, observed_generation=observed or 0
        )
        session.execute(insert.on_conflict_do_update(index_elements=[h.server_id], set_=beat))

    def _record_gpus(self, session: Session, server_id: str, samples: Sequence[GpuSample]) -> bool:
        """GPU telemetry in one statement on PostgreSQL (``_record_gpus_at_once``; elsewhere, or for samples it
        does not take, a read of the GPUs' health and an executemany), the hot path of every report; a health
        change also gets an event. Returns True when a GPU's health changed (placement must be reconsidered)."""
        if is_postgresql(session):
            changed = self._record_gpus_at_once(session, server_id, samples)
            if changed is not None:
                return changed
        g = m.GPUS.c
        healthy = {
            index: ok for index, ok in session.execute(sa.select(g.index, g.healthy).where(g.server_id == server_id))
        }
        # One sample per registered GPU at most, all checked before anything is written: each
        # changed sample costs an event and an UPDATE under the server's row lock.
        if len(samples) > len(healthy):
            raise InvalidArgument(
                "gpus", f"{len(samples)} GPU samples, but server {server_id} registered {len(healthy)} GPU(s); "
                        "report at most one sample per registered GPU"
            )
        seen: set[int] = set()
        for position, sample in enumerate(samples):
            if sample.index not in healthy:
                raise InvalidArgument(f"gpus[{position}].index", f"GPU {sample.index} was not registered")
            if sample.index in seen:
                raise InvalidArgument(f"gpus[{position}].index", f"GPU {sample.index} is reported twice")
            seen.add(sample.index)
        rows, changed = [], False
        for sample in samples:
            row = {"sid": server_id, "gidx": sample.index, "utilization": sample.utilization,
                   "memory_used_bytes": sample.memory_used_bytes, "temperature_c": sample.temperature_c,
                   "healthy": healthy[sample.index], "health_reason": None}
            if healthy[sample.index] != sample.healthy:
                changed = True
                row["healthy"], row["health_reason"] = sample.healthy, sample.health_reason[:256]
                self._health_changed(session, server_id, sample)
            rows.append(row)
        session.execute(
            sa.update(m.GPUS)
            .where(g.server_id == sa.bindparam("sid"), g.index == sa.bindparam("gidx"))
            .values(utilization=sa.bindparam("utilization"), memory_used_bytes=sa.bindparam("memory_used_bytes"),
                    temperature_c=sa.bindparam("temperature_c"), healthy=sa.bindparam("healthy"),
                    health_reason=sa.func.coalesce(sa.bindparam("health_reason"), g.health_reason)),
            rows,
        )
        return changed

    def _health_changed(self, session: Session, server_id: str, sample: GpuSample) -> None:
        """The event of a GPU whose health the report's ``sample`` changed."""
        self._changes.event(
            session, "GPU_HEALTH_CHANGED", server_id=server_id,
            reason="GPU_HEALTHY" if sample.healthy else "GPU_UNHEALTHY",
            message=f"GPU {sample.index}: {sample.health_reason or 'healthy again'}",
        )

    def _record_gpus_at_once(self, session: Session, server_id: str, samples: Sequence[GpuSample]) -> bool | None:
        """On PostgreSQL: every sample written by one UPDATE from arrays of its fields, which returns each GPU's
        health before it (the joined row is read in the statement's snapshot), so no read comes first; at 1,000
        agents the read and the executemany were a tenth of the scheduler's interpreter. None when a sample names
        a GPU twice (nothing written) or one the server did not register: the caller's checks then say which, and
        the error they raise rolls the report's transaction back, this statement's writes with it."""
        indexes = [sample.index for sample in samples]
        if len(set(indexes)) != len(indexes):
            return None
        rows = session.execute(_GPU_SAMPLES, {
            "sid": server_id, "idx": indexes, "util": [x.utilization for x in samples],
            "mem": [x.memory_used_bytes for x in samples], "temp": [x.temperature_c for x in samples],
            "ok": [x.healthy for x in samples], "why": [x.health_reason[:256] for x in samples],
        }).all()
        if len(rows) != len(samples):  # a GPU it did not register: the caller's checks raise, and all is rolled back
            return None
        was = {row.gpu_index: row.was_healthy for row in rows}
        changed = False
        for sample in samples:
            if was[sample.index] != sample.healthy:
                changed = True
                self._health_changed(session, server_id, sample)
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
            if job is None:
                continue
            if not JobState(job.state).holds_gpus:
                if JobState(job.state) is JobState.PENDING:  # requeued: its stopped workers say where it resumes
                    stopped = [w for w in workers if w.job_id == job_id and w.incarnation == job.incarnation]
                    self._record_resume_point(session, job, stopped, now)
                    self._record_stop_acknowledgements(session, job, server_id, stopped)
                continue
            current = [
                w for w in workers
                if w.job_id == job_id and w.incarnation == job.incarnation and (job_id, w.rank) in placed
            ]
            if not current:
                continue
            self._record_progress(session, job, current, now)
            self._record_goodput(session, job, current, now)
            exits = {int(rank): code for rank, code in (job.worker_exits or {}).items()}
            new_exits = [
                w for w in current
                if w.phase == "EXITED" and not w.stop_requested and w.rank not in exits
            ]
            if not new_exits:
                continue
            for w in new_exits:
                exits[w.rank] = w.exit_code
                self._changes.event(
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
                cannot_start={w.rank: f"on server {server_id}: {w.message}" for w in new_exits if w.cannot_start},
                reasons={w.rank: w.message for w in new_exits},
            )
            if verdict is None:
                continue
            touched |= free_allocations(session, job.id)
            job.num_workers = 0
            if verdict is Verdict.COMPLETED:
                job.finished_at = now
                self._changes.set_job_state(session, job, JobState.COMPLETED, "WORKERS_SUCCEEDED", why)
            elif verdict is Verdict.FAILED:
                job.finished_at = now
                self._changes.set_job_state(session, job, JobState.FAILED, "WORKER_FAILED", why)
            else:
                job.restarts += 1
                job.pending_reason = f"RESTARTING: {why}"[:1024]
                self._changes.set_job_state(session, job, JobState.PENDING, "RESTARTING", why)
                self._record_resume_point(session, job, current, now)
            decided = True
        return decided

    @staticmethod
    def _record_goodput(session: Session, job: m.Job, current: Sequence[WorkerReport], now: float) -> None:
        """Rank 0's goodput measures of a job with batch limits (``store.goodput``), written as progress
        is (no version bump). The configuration's nodes and GPUs are the job's allocation now."""
        rank0 = next((w for w in current if w.rank == 0), None)
        if job.batch_init is None or rank0 is None:
            return
        replicas = nodes = 0
        gpu_type = ""
        if rank0.step_time_s > 0:  # the configuration only matters to a step time
            a, g = m.ALLOCATIONS.c, m.GPUS.c
            replicas, nodes, models, model = session.execute(
                sa.select(sa.func.count(), sa.func.count(sa.distinct(a.server_id)),
                          sa.func.count(sa.distinct(g.model)), sa.func.min(g.model))
                .select_from(m.ALLOCATIONS.outerjoin(m.GPUS, (g.server_id == a.server_id) & (g.index == a.gpu_index)))
                .where(a.job_id == job.id)
            ).one()
            gpu_type = (model or "") if models == 1 else ""  # a mix of models: no one type's speed
        document = with_report(job.goodput_reports, rank0, nodes=nodes, replicas=replicas, now=now,
                               gpu_type=gpu_type)
        if document is not None:
            session.execute(sa.update(m.JOBS).where(m.JOBS.c.id == job.id).values(goodput_reports=document))
            session.expire(job, ["goodput_reports"])

    @staticmethod
    def _record_progress(session: Session, job: m.Job, current: Sequence[WorkerReport], now: float) -> None:
        """Progress is telemetry, not a state change: written without the optimistic version bump, so
        a report never makes a concurrent plan's action on the same job fail as stale."""
        values = progress_values(job, current, now)
        if values:
            session.execute(sa.update(m.JOBS).where(m.JOBS.c.id == job.id).values(**values))
            session.expire(job, list(values))

    def _record_stop_acknowledgements(
        self, session: Session, job: m.Job, server_id: str, stopped: Sequence[WorkerReport]
    ) -> None:
        """An event per stopped worker whose stop its checkpoint acknowledgement ended early (an agent
        reports such an exit once), saying so in the job's history."""
        for w in stopped:
            if w.phase == "EXITED" and w.stop_acknowledged:
                self._changes.event(
                    session, "WORKER_STOP_ACKNOWLEDGED", job_id=job.id, server_id=server_id,
                    reason="CHECKPOINT_ACKNOWLEDGED",
                    message=(f"rank {w.rank} (incarnation {w.incarnation}) acknowledged its checkpoint at progress "
                             f"{w.ack_checkpoint_progress:g}" + (f": {w.message}" if w.message else ""))[:1024],
                    details={"rank": str(w.rank), "incarnation": str(w.incarnation),
                             "checkpoint_progress": f"{w.ack_checkpoint_progress:g}"},
                )

    @staticmethod
    def _record_resume_point(session: Session, job: m.Job, stopped: Sequence[WorkerReport], now: float) -> None:
        """A requeued job (preempted, or restarting after a failure) resumes from the last checkpoint
        its stopped workers report (acknowledged, or in their progress files): its progress goes back
        there, so its estimates count the work to redo. Telemetry, as ``_record_progress``."""
        values, checkpoint = checkpoint_values(job, stopped, now)
        if (checkpoint > 0 or any(w.checkpoint_acked for w in stopped)) and checkpoint != job.work_done:
            values.update(work_done=checkpoint, progress_at=now)
        if values:
            session.execute(sa.update(m.JOBS).where(m.JOBS.c.id == job.id).values(**values))
            session.expire(job, list(values))


def progress_values(job: Any, current: Sequence[WorkerReport], now: float) -> dict[str, Any]:
    """The job's progress and checkpoint columns (``PROGRESS_COLUMNS``) to change after the report of
    its ``current`` workers on one server (``job``: its row, an ORM object or any with those columns)."""
    # A worker that has not written progress yet reports 0: that says nothing about the job.
    progress = max((w.progress for w in current), default=0.0)
    values, _ = checkpoint_values(job, current, now)
    if progress > 0 and progress != job.work_done:
        values["work_done"] = progress  # may go down: a restart resumes from the last checkpoint
        values["progress_at"] = now
        # The progress window (``core.predict``): restarted at the first report of each incarnation
        # (size) and when progress went down (resumed from a checkpoint); else one more report.
        if job.window_incarnation != job.incarnation or job.window_at is None or progress < job.work_done:
            values.update(window_work=progress, window_at=now, window_incarnation=job.incarnation,
                          window_workers=job.num_workers, window_reports=0)
        else:
            values["window_reports"] = job.window_reports + 1
    return values


# What ``progress_values`` may change.
PROGRESS_COLUMNS = ("work_done", "progress_at", "window_work", "window_at", "window_incarnation", "window_workers",
                    "window_reports", "checkpoint_work", "last_checkpoint_at")


def _samples_unchanged(samples: Sequence[GpuSample], healthy: dict[int, bool]) -> bool:
    """Whether every sample names a registered GPU once, with the health recorded for it."""
    indexes = [x.index for x in samples]
    return len(set(indexes)) == len(indexes) and all(
        x.index in healthy and healthy[x.index] == x.healthy for x in samples)


def _telemetry_progress(
    report: StatusReport, jobs: dict[int, SimpleNamespace], placed: set[tuple[str, int, int]], now: float
) -> list[tuple[int, dict[str, Any]]] | None:
    """What ``report``'s workers change of their jobs' progress (``record_report``'s ``_record_workers``
    when they bring no exit), or None when the report needs the full path."""
    changes: list[tuple[int, dict[str, Any]]] = []
    for job_id in sorted({w.job_id for w in report.workers}):
        mine = [w for w in report.workers if w.job_id == job_id]
        if any((w.phase == "EXITED" and not w.stop_requested) or w.stop_acknowledged for w in mine):
            return None
        job = jobs.get(job_id)
        if job is None:
            continue
        state = JobState(job.state)
        if not state.holds_gpus:
            if state is JobState.PENDING and any(w.incarnation == job.incarnation for w in mine):
                return None  # requeued: its stopped workers say where it resumes
            continue
        current = [w for w in mine if w.incarnation == job.incarnation
                   and (report.server_id, job_id, w.rank) in placed]
        if not current:
            continue
        if job.batch_init is not None and any(w.rank == 0 for w in current):
            return None  # goodput measures (``_record_goodput``)
        values = progress_values(job, current, now)
        if values:
            changes.append((job_id, values))
    return changes


# An acknowledged checkpoint's save time is recomputed from its age at every report, so it moves by the
# report's latency: only an earlier time by more than this is news.
ACK_SLACK_S = 1.0


# ``AgentStore._record_gpus_at_once``: a GPU's health reason changes only with its health, as the executemany's.
_GPU_SAMPLES = sa.text("""
    UPDATE gpus AS g SET utilization = v.utilization, memory_used_bytes = v.memory_used_bytes,
        temperature_c = v.temperature_c, healthy = v.healthy,
        health_reason = CASE WHEN before.healthy = v.healthy THEN g.health_reason ELSE v.health_reason END
    FROM unnest(CAST(:idx AS integer[]), CAST(:util AS double precision[]), CAST(:mem AS bigint[]),
                CAST(:temp AS double precision[]), CAST(:ok AS boolean[]), CAST(:why AS varchar[]))
             AS v(gidx, utilization, memory_used_bytes, temperature_c, healthy, health_reason),
         gpus AS before
    WHERE g.server_id = :sid AND g.index = v.gidx AND before.server_id = g.server_id AND before.index = g.index
    RETURNING g.index AS gpu_index, before.healthy AS was_healthy
""")


def acknowledged_checkpoint(workers: Sequence[WorkerReport], now: float) -> tuple[float, float] | None:
    """``(progress, saved_at)`` of the newest checkpoint the workers acknowledged (``node_agent.contract``):
    the highest progress, saved at the earliest time any of them vouched for it (rank 0 saves; the
    others vouch after it); ``saved_at`` on the scheduler's clock (``now`` less the ack's age, so the
    clocks of agent and scheduler need not agree). None when no worker acknowledged one."""
    acks = [w for w in workers if w.checkpoint_acked]
    if not acks:
        return None
    progress = max(w.ack_checkpoint_progress for w in acks)
    return progress, now - max(w.ack_checkpoint_age_s for w in acks if w.ack_checkpoint_progress == progress)


def checkpoint_values(job: m.Job, workers: Sequence[WorkerReport], now: float) -> tuple[dict[str, Any], float]:
    """The job's checkpoint columns to change after ``workers``' reports, and the progress of the
    checkpoint they report (0: none). Work since ``last_checkpoint_at`` is what a preemption loses
    (reclaim's cost, ``policies.aryl``): an acknowledged checkpoint counts from when the worker saved
    it, one seen only in progress files from when the scheduler learnt of it (``now``)."""
    in_files = max((w.checkpoint_progress for w in workers), default=0.0)
    acked = acknowledged_checkpoint(workers, now)
    if acked is not None and acked[0] >= in_files:
        progress, saved_at = acked
        news = (progress != job.checkpoint_work or job.last_checkpoint_at is None
                or saved_at < job.last_checkpoint_at - ACK_SLACK_S)
        return ({"checkpoint_work": progress, "last_checkpoint_at": saved_at} if news else {}), progress
    if in_files > 0 and in_files != job.checkpoint_work:
        return {"checkpoint_work": in_files, "last_checkpoint_at": now}, in_files
    return {}, in_files
