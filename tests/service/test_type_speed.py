"""A job's speed per GPU type (issue 33, item 4): the fit (``core.type_speed``) on hand-computed cases, and
the live path -- rank 0's step times stored with the model of the GPUs they were measured on, shown by GetJob's
conversion and ``arylctl job`` with the types a declared factor reaches bootstrapped. Store tests run on SQLite
and PostgreSQL (``database_url``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from arylctl.commands.jobs import describe_job
from protos.aryl.v1 import scheduler_pb2
from scheduler_service.api import convert
from scheduler_service.app import SchedulerApp
from scheduler_service.config import SchedulingConfig
from scheduler_service.core.plan import Plan
from scheduler_service.core.snapshot import BatchLimits
from scheduler_service.core.type_speed import BOOTSTRAPPED, MEASURED, TypeSpeed, type_speeds
from scheduler_service.lifecycle import Pool
from scheduler_service.records import (
    GpuReport,
    JobSubmission,
    ServerRegistration,
    StatusReport,
    StepTimeInfo,
    WorkerReport,
)
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.goodput import goodput_info, step_samples, with_report
from tests.harness import ManualClock, scale, start


def step(gpu_type: str, local: int, pass_s: float) -> StepTimeInfo:
    return StepTimeInfo(nodes=1, replicas=2, local_batch_size=local, accum_steps=0, pass_time_s=pass_s,
                        step_time_s=pass_s * 1.5, measured_at=0.0, gpu_type=gpu_type)


def test_measured_types_take_their_largest_batch_and_unseen_ones_are_bootstrapped_from_declared_factors() -> None:
    steps = [step("A", 32, 0.5), step("A", 64, 0.8),   # A: 64 / 0.8 = 80 samples/s (its largest batch)
             step("B", 64, 3.2),                       # B: 20 samples/s
             step("", 64, 0.1)]                        # a mix of models: no type's speed
    declared = {"A": 1.0, "B": 0.5, "C": 0.1, "D": 2.0}
    got = type_speeds(steps, declared, types=("A", "B", "C", "E"))
    # C from A: 80 x 0.1 / 1.0 = 8; from B: 20 x 0.1 / 0.5 = 4 -> 6. D: (160 + 80) / 2 = 120. E: no factor.
    assert got == (
        TypeSpeed("D", 120.0, 64, BOOTSTRAPPED, 1.0),
        TypeSpeed("A", 80.0, 64, MEASURED, pytest.approx(80 / 120)),  # type: ignore[arg-type]  # approx: equal to the float
        TypeSpeed("B", 20.0, 64, MEASURED, pytest.approx(20 / 120)),  # type: ignore[arg-type]  # approx: equal to the float
        TypeSpeed("C", 6.0, 64, BOOTSTRAPPED, pytest.approx(6 / 120)),  # type: ignore[arg-type]  # approx: equal to the float
    )
    # Without factors only what was measured; without measures nothing (never a guess).
    assert [s.gpu_type for s in type_speeds(steps, {})] == ["A", "B"]
    assert type_speeds([step("", 64, 0.1)], declared) == ()
    # A measured type without a declared factor anchors nothing.
    assert [(s.gpu_type, s.source) for s in type_speeds([step("Z", 10, 1.0)], {"C": 1.0})] == [("Z", MEASURED)]


def test_step_times_written_before_the_gpu_type_was_kept_read_as_of_no_known_type() -> None:
    old = {"step_times": [[1, 2, 32, 0, 0.5, 0.7, 10.0]]}
    (entry,) = goodput_info(old).step_times
    assert (entry.local_batch_size, entry.gpu_type) == (32, "")
    report = WorkerReport(job_id=1, rank=0, incarnation=1, phase="RUNNING", progress=1.0, step_time_s=0.6,
                          pass_time_s=0.4, local_batch_size=32)
    # The same nodes, GPUs and batch on a known model: a configuration of its own, kept beside the old one.
    document = with_report(old, report, nodes=1, replicas=2, now=20.0, gpu_type="A")
    assert [(t.gpu_type, t.pass_time_s) for t in goodput_info(document).step_times] == [("", 0.5), ("A", 0.4)]
    again = with_report(document, report, nodes=1, replicas=2, now=30.0, gpu_type="A")
    assert [(t.gpu_type, t.measured_at) for t in goodput_info(again).step_times] == [("", 10.0), ("A", 30.0)]


def test_the_goodput_fit_reads_the_step_times_of_the_gpu_type_measured_last_only() -> None:
    # Two configurations on type A, then one on B: the fit is B's alone; back on A, A's two (the one it kept too).
    document = {"step_times": [[1, 1, 32, 0, 0.5, 0.6, 10.0, "A"], [1, 2, 32, 0, 0.5, 0.7, 20.0, "A"],
                               [1, 1, 32, 0, 0.2, 0.25, 30.0, "B"]]}
    assert [(s.replicas, s.pass_s) for s in step_samples(goodput_info(document))] == [(1, 0.2)]
    report = WorkerReport(job_id=1, rank=0, incarnation=2, phase="RUNNING", progress=1.0, step_time_s=0.9,
                          pass_time_s=0.5, local_batch_size=32)
    back = with_report(document, report, nodes=1, replicas=4, now=40.0, gpu_type="A")
    assert sorted((s.replicas, s.pass_s) for s in step_samples(goodput_info(back))) == [(1, 0.5), (2, 0.5), (4, 0.5)]
    assert step_samples(goodput_info(None)) == ()


def test_gpu_speeds_are_validated_with_the_setting_named() -> None:
    assert SchedulingConfig(gpu_speeds={"A": 1.0}).gpu_speeds == {"A": 1.0}
    for bad in ({"A": 0.0}, {"A": float("nan")}, {"": 1.0}):
        with pytest.raises(ValueError, match=r"scheduling\.gpu_speeds"):
            SchedulingConfig(gpu_speeds=bad)


@pytest.fixture
def app(database_url: str) -> Iterator[SchedulerApp]:
    engine = create_engine_for(database_url)
    yield SchedulerApp(session_factory(engine), ManualClock(), gpu_speeds={"FastGPU": 1.0, "SlowGPU": 0.4,
                                                                           "NewGPU": 2.0})
    engine.dispose()


def register(app: SchedulerApp, host: str, model: str) -> None:
    app.agents.register(ServerRegistration(hostname=host, pool=Pool.TRAINING, agent_address=f"{host}:7000",
                                           agent_version="test",
                                           gpus=tuple(GpuReport(i, f"GPU-{host}-{i}", model, 80 << 30)
                                                      for i in range(2))))


def report_step(app: SchedulerApp, host: str, job_id: int, pass_s: float) -> None:
    record = app.jobs.get(job_id)[0]
    generation = next(s for s in app.views.servers() if s.hostname == host).desired_generation
    app.agents.report_status(StatusReport(host, app.term.epoch, (), generation, workers=(
        WorkerReport(job_id=job_id, rank=0, incarnation=record.incarnation, phase="RUNNING", progress=1.0,
                     step_time_s=pass_s * 1.2, pass_time_s=pass_s, local_batch_size=32),)))


def test_a_job_that_ran_on_two_gpu_models_shows_both_measured_and_a_third_bootstrapped(app: SchedulerApp) -> None:
    register(app, "fast", "FastGPU")
    register(app, "slow", "SlowGPU")
    job_id = app.jobs.submit(JobSubmission(name="t", user="alice", queue="default", command=("python", "t.py"),
                                           env={}, gpus_per_worker=1, min_workers=1, max_workers=2,
                                           batch_limits=BatchLimits(init_bsz=64, max_bsz=512, max_atomic_bsz=64))).id
    app.cluster.apply(Plan(starts=(start(job_id, ("fast", (0,)), ("fast", (1,))),)))
    report_step(app, "fast", job_id, 0.1)   # 320 samples/s per FastGPU
    app.cluster.apply(Plan(scales=(scale(job_id, ("slow", (0,)), ("slow", (1,))),)))
    report_step(app, "slow", job_id, 0.4)   # 80 samples/s per SlowGPU: measured at 0.25x, declared 0.4x
    record = app.jobs.get(job_id)[0]
    assert [(t.gpu_type, t.pass_time_s) for t in record.goodput.step_times] == [("FastGPU", 0.1), ("SlowGPU", 0.4)]

    shown = convert.job(record, gpu_speeds={"FastGPU": 1.0, "SlowGPU": 0.4, "NewGPU": 2.0})
    assert [(t.gpu_type, t.pass_time_s) for t in shown.step_times] == [("FastGPU", 0.1), ("SlowGPU", 0.4)]
    # NewGPU from both: (320 x 2 + 80 x 2 / 0.4) / 2 = 520.
    assert [(s.gpu_type, round(s.samples_per_gpu_s), s.source, round(s.relative, 3)) for s in shown.type_speeds] == [
        ("NewGPU", 520, "bootstrapped", 1.0), ("FastGPU", 320, "measured", 0.615),
        ("SlowGPU", 80, "measured", 0.154)]
    text = describe_job(scheduler_pb2.GetJobResponse(job=shown))
    assert ("Speed by GPU type: NewGPU 520 samples/s per GPU (x1.00, bootstrapped); FastGPU 320 samples/s per GPU "
            "(x0.62, measured); SlowGPU 80 samples/s per GPU (x0.15, measured)") in " ".join(text.split())
    # The declared factors reach the policies too (sia and gavel weigh GPU types by them).
    assert dict(app.cluster.snapshot().gpu_speed) == {"FastGPU": 1.0, "SlowGPU": 0.4, "NewGPU": 2.0}


def test_sia_live_weighs_a_type_by_the_jobs_own_measured_speed_over_the_declared_one() -> None:
    """Declared, 'fast' is 4x 'slow'; this job measured itself 3x faster on 'slow' (a model that suits it).
    One GPU of each is free: Sia puts it where it runs fastest for it, not where the declaration says."""
    from scheduler_service.core.params import PolicyParams
    from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView
    from scheduler_service.core.type_speed import job_type_speeds
    from scheduler_service.lifecycle import JobState, ServerState
    from scheduler_service.policies import create_policy

    servers = (ServerView("f", Pool.TRAINING, ServerState.TRAINING, (0,), gpu_type="fast"),
               ServerView("s", Pool.TRAINING, ServerState.TRAINING, (0,), gpu_type="slow"))
    declared = (("fast", 4.0), ("slow", 1.0))
    plain = JobView(1, JobState.PENDING, 1, 1, 1, 0, 0.0, estimated_runtime_s=600.0)
    measured = dataclasses.replace(plain, type_speeds=(("fast", 10.0), ("slow", 30.0)))
    assert job_type_speeds(plain, dict(declared), ["fast", "slow"]) == {"fast": 4.0, "slow": 1.0}
    assert job_type_speeds(measured, dict(declared), ["fast", "slow", "other"]) == {
        "fast": pytest.approx(1 / 3), "slow": 1.0, "other": pytest.approx(2 / 3)}  # other: the mean of the known
    for job, where in ((plain, "f"), (measured, "s")):
        plan = create_policy("sia", PolicyParams()).schedule(
            ClusterSnapshot(now=0.0, servers=servers, jobs=(job,), gpu_speed=declared))
        assert [w.server_id for s in plan.starts for w in s.workers] == [where]
