"""Telemetry-only status reports written many at a time (``AgentStore.record_telemetry``, the writer thread's
batch: one transaction and a fixed number of statements for up to ``TELEMETRY_BATCH`` servers' reports).

Each test runs on SQLite and PostgreSQL. The batch must write exactly what ``record_report`` writes for the
same reports one after another (heartbeats, GPU samples, progress and its window, checkpoints, a job whose
workers several of the batch's servers report), and leave out, with nothing of it written, every report that
needs the full path.
"""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.app import SchedulerApp
from scheduler_service.app.agents import BehindReport
from scheduler_service.clock import SystemClock
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.records import GpuReport, GpuSample, ServerRegistration, StatusReport, WorkerReport
from scheduler_service.store import models as m
from scheduler_service.store.agents import PROGRESS_COLUMNS, AgentStore
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.transactions import Transactions
from tests.harness import T0, ManualClock

EPOCH = 3
NOW = 1_700_000_000.0
GPUS = 4


def _cluster(session: Session, prefix: str, *, states: dict[str, str] | None = None) -> dict[str, int]:
    """Servers ``{prefix}s0..s3`` of 4 GPUs with heartbeat rows; jobs (by name) ``wide`` (ranks 0 and 1 on s0,
    rank 2 on s1), ``narrow`` (s2), ``requeued`` (PENDING, incarnation 2, placed nowhere) and ``goodput`` (s3,
    with batch limits). Returns the jobs' ids."""
    for i in range(4):
        sid = f"{prefix}s{i}"
        state = (states or {}).get(sid, "TRAINING")
        pool = "INFERENCE" if state in (ServerState.RECLAIMING, ServerState.SERVING) else "TRAINING"
        session.add(m.Server(id=sid, hostname=sid, pool=pool, state=state, registered_at=NOW, desired_generation=5))
    session.flush()
    for i in range(4):
        sid = f"{prefix}s{i}"
        session.add(m.ServerHeartbeat(server_id=sid, last_seen_at=NOW, observed_generation=4))
        session.add_all(m.Gpu(server_id=sid, index=g, uuid=f"GPU-{sid}-{g}", health_reason="") for g in range(GPUS))
    ids = {}
    for name, state, incarnation, extra in (("wide", JobState.RUNNING, 1, {}), ("narrow", JobState.RUNNING, 1, {}),
                                            ("requeued", JobState.PENDING, 2, {}),
                                            ("goodput", JobState.RUNNING, 1, {"batch_init": 64, "batch_max": 512})):
        job = m.Job(name=f"{prefix}{name}", user="alice", queue="default", command=["python", "train.py"], env={},
                    gpus_per_worker=1, min_workers=1, max_workers=4, throughput={}, restart_policy="NEVER",
                    state=state, submitted_at=NOW, num_workers=3 if name == "wide" else 1, incarnation=incarnation,
                    **extra)
        session.add(job)
        session.flush()
        ids[name] = job.id
    placements = [("wide", 0, "s0", 0), ("wide", 1, "s0", 1), ("wide", 2, "s1", 0), ("narrow", 0, "s2", 0),
                  ("goodput", 0, "s3", 0)]
    session.add_all(m.Allocation(job_id=ids[name], rank=rank, server_id=f"{prefix}{server}", gpu_index=gpu,
                                 allocated_at=NOW) for name, rank, server, gpu in placements)
    return ids


def _samples(base: float, *, healthy: bool = True, indexes: range | list[int] = range(GPUS)) -> tuple[GpuSample, ...]:
    return tuple(GpuSample(index=i, utilization=base + i / 10, memory_used_bytes=int(base * 1000) + i,
                           temperature_c=40.0 + base + i, healthy=healthy, health_reason="" if healthy else "XID 79")
                 for i in indexes)


def _worker(job_id: int, rank: int, progress: float, **kw: Any) -> WorkerReport:
    return WorkerReport(job_id=job_id, rank=rank, incarnation=kw.pop("incarnation", 1),
                        phase=kw.pop("phase", "RUNNING"), progress=progress, **kw)


def _rounds(prefix: str, ids: dict[str, int]) -> list[list[tuple[StatusReport, float]]]:
    """Three rounds of every server's report: progress going up (the window counting), a checkpoint seen in
    the progress files, then one acknowledged, and progress going down (a resume: the window restarts);
    the wide job's ranks reported by two servers of each round, with different progress."""
    rounds = []
    for r, (wide0, wide2, narrow) in enumerate(((10.0, 12.0, 5.0), (20.0, 21.0, 9.0), (15.0, 14.0, 9.0))):
        at = NOW + 10 * (r + 1)
        extra: dict[str, Any] = {}
        if r == 1:
            extra = {"checkpoint_progress": 8.0}
        if r == 2:
            extra = {"checkpoint_acked": True, "ack_checkpoint_progress": 14.0, "ack_checkpoint_age_s": 3.0}
        w = ids["wide"]
        rounds.append([
            (StatusReport(f"{prefix}s0", EPOCH, _samples(r + 0.25), observed_generation=4 + r,
                          workers=(_worker(w, 0, wide0, **extra), _worker(w, 1, wide0 - 1))), at),
            (StatusReport(f"{prefix}s1", EPOCH, _samples(r + 0.5), observed_generation=3,  # older: never back
                          workers=(_worker(w, 2, wide2),)), at + 1),
            (StatusReport(f"{prefix}s2", EPOCH, _samples(r + 0.75)[:2], observed_generation=5,
                          workers=(_worker(ids["narrow"], 0, narrow),
                                   _worker(ids["narrow"], 1, 99.0),  # a rank placed elsewhere: history
                                   _worker(ids["narrow"], 0, 99.0, incarnation=0))), at + 2),  # an older incarnation
        ])
    return rounds


def _written(engine: sa.Engine, prefix: str) -> dict[str, Any]:
    """What the reports wrote, by names without the prefix."""
    j, h, g = m.JOBS.c, m.HEARTBEATS.c, m.GPUS.c
    with engine.connect() as conn:
        jobs = {row.name.removeprefix(prefix): tuple(row[1:]) for row in conn.execute(
            sa.select(j.name, *(j[c] for c in PROGRESS_COLUMNS)).where(j.name.startswith(prefix)))}
        beats = {row.server_id.removeprefix(prefix): (row.last_seen_at, row.observed_generation)
                 for row in conn.execute(sa.select(h.server_id, h.last_seen_at, h.observed_generation)
                                         .where(h.server_id.startswith(prefix)))}
        gpus = sorted((row.server_id.removeprefix(prefix), *row[1:]) for row in conn.execute(
            sa.select(g.server_id, g.index, g.utilization, g.memory_used_bytes, g.temperature_c, g.healthy)
            .where(g.server_id.startswith(prefix))))
        events = conn.scalar(sa.select(sa.func.count()).select_from(m.EVENTS))
    return {"jobs": jobs, "beats": beats, "gpus": gpus, "events": events}


def _stores(database_url: str) -> tuple[sa.Engine, Transactions, AgentStore]:
    engine = create_engine_for(database_url)
    clock = SystemClock()
    store = AgentStore(StateChanges(clock), DesiredStates(epoch=lambda: EPOCH), clock)
    return engine, Transactions(session_factory(engine), publish=lambda _states: None), store


def test_a_batch_writes_what_the_reports_one_by_one_write(database_url: str) -> None:
    engine, db, store = _stores(database_url)
    try:
        one_ids = db.write(lambda session: _cluster(session, "one-"))
        many_ids = db.write(lambda session: _cluster(session, "many-"))
        before = _written(engine, "one-")
        for reports in _rounds("one-", one_ids):
            for report, at in reports:
                done = db.write(functools.partial(store.record_report, report=report, now=at, epoch=EPOCH))
                assert not done.touched and not done.cycle_needed
        for reports in _rounds("many-", many_ids):
            recorded = db.write(functools.partial(store.record_telemetry, reports=reports, epoch=EPOCH))
            assert sorted(recorded) == ["many-s0", "many-s1", "many-s2"]
            assert recorded["many-s1"].observed_generation == 4  # the heartbeat's, not the report's older 3
            assert {r.desired_generation for r in recorded.values()} == {5}
            assert not any(r.cycle_needed or r.touched for r in recorded.values())
        one, many = _written(engine, "one-"), _written(engine, "many-")
        assert one["jobs"] != before["jobs"] and one["gpus"] != before["gpus"]  # the reports did write
        assert many["jobs"] == one["jobs"]
        assert many["beats"] == one["beats"]
        assert many["gpus"] == one["gpus"]
        assert many["events"] == one["events"] == before["events"]  # telemetry writes no event
        wide = dict(zip(PROGRESS_COLUMNS, many["jobs"]["wide"], strict=True))
        # Rounds 1 and 2 went up (the window counting both servers' reports), round 3 went down: it restarted.
        assert wide["work_done"] == 14.0 and wide["window_reports"] == 0 and wide["window_at"] == NOW + 31
        assert wide["checkpoint_work"] == 14.0 and wide["last_checkpoint_at"] == NOW + 30 - 3.0
    finally:
        engine.dispose()


def test_reports_needing_the_full_path_are_left_out_with_nothing_of_them_written(database_url: str) -> None:
    engine, db, store = _stores(database_url)
    try:
        ids = db.write(lambda session: _cluster(session, "x-", states={"x-s1": ServerState.LOST}))
        before = _written(engine, "x-")
        at = NOW + 60
        w, n = ids["wide"], ids["narrow"]
        good = StatusReport("x-s2", EPOCH, _samples(0.5), observed_generation=5, workers=(_worker(n, 0, 3.0),))
        left = {
            "lost server": StatusReport("x-s1", EPOCH, _samples(0.5), observed_generation=4),
            "another epoch": StatusReport("x-s0", EPOCH - 1, _samples(0.5), observed_generation=4),
            "health changed": StatusReport("x-s0", EPOCH, _samples(0.5, healthy=False), observed_generation=4),
            "GPU not registered": StatusReport("x-s0", EPOCH, _samples(0.5, indexes=[0, 7]), observed_generation=4),
            "GPU named twice": StatusReport("x-s0", EPOCH, _samples(0.5, indexes=[1, 1]), observed_generation=4),
            "a worker's exit": StatusReport("x-s0", EPOCH, _samples(0.5), observed_generation=4,
                                            workers=(_worker(w, 0, 5.0, phase="EXITED", exit_code=1),)),
            "a stop's acknowledgement": StatusReport(
                "x-s0", EPOCH, _samples(0.5), observed_generation=4,
                workers=(_worker(w, 0, 5.0, phase="EXITED", stop_requested=True, stop_acknowledged=True),)),
            "a requeued job's worker": StatusReport(
                "x-s0", EPOCH, _samples(0.5), observed_generation=4,
                workers=(_worker(ids["requeued"], 0, 5.0, incarnation=2, phase="EXITED", stop_requested=True,
                                 checkpoint_progress=4.0),)),
            "goodput measures": StatusReport("x-s3", EPOCH, _samples(0.5), observed_generation=4,
                                             workers=(_worker(ids["goodput"], 0, 5.0, step_time_s=0.5),)),
            "unknown server": StatusReport("x-s9", EPOCH, _samples(0.5), observed_generation=4),
        }
        for why, report in left.items():
            recorded = db.write(functools.partial(store.record_telemetry, reports=[(report, at), (good, at)],
                                                  epoch=EPOCH))
            assert sorted(recorded) == ["x-s2"], why
            after = _written(engine, "x-")
            for server in ("s0", "s1", "s3"):
                assert after["beats"][server] == before["beats"][server], why
                assert [g for g in after["gpus"] if g[0] == server] == [g for g in before["gpus"] if g[0] == server], \
                    why
            for job in ("wide", "requeued", "goodput"):
                assert after["jobs"][job] == before["jobs"][job], why
            assert after["events"] == before["events"], why
        assert _written(engine, "x-")["jobs"]["narrow"][0] == 3.0  # the good report's, every time
    finally:
        engine.dispose()


def test_a_newer_generation_on_a_reclaimed_server_asks_for_a_cycle(database_url: str) -> None:
    engine, db, store = _stores(database_url)
    try:
        db.write(lambda session: _cluster(session, "r-", states={"r-s0": ServerState.RECLAIMING,
                                                                 "r-s1": ServerState.SERVING}))
        reports = [(StatusReport("r-s0", EPOCH, (), observed_generation=5), NOW + 1),
                   (StatusReport("r-s1", EPOCH, (), observed_generation=4), NOW + 1),  # nothing new
                   (StatusReport("r-s2", EPOCH, (), observed_generation=5), NOW + 1)]  # new, but training
        recorded = db.write(lambda session: store.record_telemetry(session, reports, epoch=EPOCH))
        assert {sid: r.cycle_needed for sid, r in recorded.items()} == {"r-s0": True, "r-s1": False, "r-s2": False}
        assert recorded["r-s0"].observed_generation == 5 and recorded["r-s0"].state == ServerState.RECLAIMING
        assert _written(engine, "r-")["beats"]["s0"] == (NOW + 1, 5)
    finally:
        engine.dispose()


def test_the_writer_threads_batch_records_each_report_and_sends_the_rest_down_the_full_path(database_url: str) -> None:
    """``Agents.write_behind_many`` on the service's use cases: a server that went LOST after its report was
    answered from memory is left by the batch and recorded on its own, which brings it back; the other's
    telemetry is written in the batch; and a report older than one recorded since is skipped."""
    engine = create_engine_for(database_url)
    try:
        clock = ManualClock(T0)
        app = SchedulerApp(session_factory(engine), clock)
        app.term.start("test")
        epoch = app.term.epoch
        for sid in ("a", "b", "c"):
            app.agents.register(ServerRegistration(
                sid, Pool.TRAINING, tuple(GpuReport(i, f"GPU-{sid}-{i}", "Fake-GPU", 80 << 30) for i in range(2)),
                f"{sid}:7000", "test"))

        def report(sid: str, utilization: float, *, unhealthy: bool = False) -> StatusReport:
            return StatusReport(sid, epoch, tuple(GpuSample(i, utilization, 0, 40.0, not (unhealthy and i == 1),
                                                            "XID 79" if unhealthy and i == 1 else "")
                                                  for i in range(2)), 0)

        def telemetry(sid: str) -> tuple[Any, Any]:
            g, h = m.GPUS.c, m.HEARTBEATS.c
            with engine.connect() as conn:
                return (conn.scalar(sa.select(g.utilization).where(g.server_id == sid, g.index == 0)),
                        conn.scalar(sa.select(h.last_seen_at).where(h.server_id == sid)))

        for sid in ("a", "b", "c"):
            app.agents.report_status(report(sid, 0.1, unhealthy=True))  # the full path (news): written
            app.agents.report_status(report(sid, 0.1))  # healthy again: the full path, and each server's digest
        clock.advance(60)
        items = [BehindReport(app.agents._order.ticket(), clock.now(), report(sid, 0.5)) for sid in ("a", "b", "c")]
        with engine.begin() as conn:
            conn.execute(sa.update(m.SERVERS).where(m.SERVERS.c.id == "b").values(state=ServerState.LOST))
        newer = BehindReport(app.agents._order.ticket(), clock.now(), report("c", 0.7))
        with app.agents._order.recording("c", newer.ticket, behind=False):
            pass  # as a full-path report of c, arrived after the batch's, recorded before it
        app.agents.write_behind_many(items)
        assert telemetry("a") == (0.5, T0 + 60)  # in the batch
        assert telemetry("b") == (0.5, T0 + 60)  # on its own: the full path
        with engine.connect() as conn:
            assert conn.scalar(sa.select(m.SERVERS.c.state).where(m.SERVERS.c.id == "b")) == ServerState.TRAINING
        assert telemetry("c")[0] == 0.1  # skipped: older than what c's newer report recorded
    finally:
        engine.dispose()
