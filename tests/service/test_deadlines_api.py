"""Deadlines as a user meets them, over real gRPC on SQLite and PostgreSQL: bad deadlines refused with
INVALID_ARGUMENT; the predicted finish of a running job converging on its reported progress (the
scheduler on a hand-moved clock, so every figure is worked out by hand); ``arylctl explain`` saying
whether and why a job will miss its deadline; SubmitJob's admission feedback (warn) and refusal
(reject); ``arylctl submit --deadline`` in both forms, and refusing what it cannot read.

The agent is the test itself speaking the AgentService protocol, so each progress report is exactly
the one under test.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import time
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from arylctl.cli import describe_explanation
from arylctl.client import parse_deadline
from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.server import ServerHandle, serve_in_background
from tests.fixtures.cli import arylctl_executable
from tests.fixtures.workers import EXITED, Agent, get_job, running, worker
from tests.harness import T0, ManualClock, details_of, job_spec, register_fake_server, scheduler_config, scheduler_stub

J = types_pb2


def at(seconds: float) -> Timestamp:
    ts = Timestamp()
    ts.FromNanoseconds(round(seconds * 1e9))
    return ts


def linear_hints(total_work: float, per_worker: float) -> types_pb2.ThroughputHints:
    """speed(w) = per_worker x w (two points: the last segment's slope carries on)."""
    return types_pb2.ThroughputHints(total_work=total_work, points=[
        types_pb2.ThroughputPoint(workers=1, samples_per_second=per_worker),
        types_pb2.ThroughputPoint(workers=2, samples_per_second=2 * per_worker)])


def submit(stub, spec: types_pb2.JobSpec) -> scheduler_pb2.SubmitJobResponse:
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5)


def refusal(stub, spec: types_pb2.JobSpec) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        submit(stub, spec)
    return err.value


# --------------------------------------------------------------------------------------------------
# Refusing bad deadlines


def test_deadlines_in_the_past_are_refused_naming_both_times(scheduler) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        now = time.time()
        for deadline, ago in ((now - 3600, "60 min"), (now - 5, None), (0.0, None)):
            err = refusal(stub, job_spec("late", deadline=at(deadline)))
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "spec.deadline" in details_of(err) and "must be after the submission time" in details_of(err)
            assert ago is None or f"{ago} before it" in details_of(err)
            if deadline == 0.0:  # the last: an unset-looking zero timestamp is a time, in 1970
                assert "1970-01-01T00:00:00Z" in details_of(err)
        err = refusal(stub, job_spec("bad", deadline=Timestamp(seconds=1, nanos=-1)))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "spec.deadline" in details_of(err)
        # A deadline ahead is kept as given; without one the job says so.
        answer = submit(stub, job_spec("ok", deadline=at(now + 7200)))
        assert answer.job.spec.deadline.seconds == int(now + 7200)
        assert not submit(stub, job_spec("free")).job.spec.HasField("deadline")


def test_arylctl_reads_absolute_and_relative_deadlines_and_refuses_the_rest(scheduler) -> None:
    now = dt.datetime(2026, 11, 24, 12, 0, tzinfo=dt.UTC)
    assert parse_deadline("6h", now) == now + dt.timedelta(hours=6)
    assert parse_deadline("1h30m", now) == now + dt.timedelta(minutes=90)
    assert parse_deadline("+2d", now) == now + dt.timedelta(days=2)
    assert parse_deadline("2026-11-24T18:00Z") == dt.datetime(2026, 11, 24, 18, 0, tzinfo=dt.UTC)
    for text in ("tomorrow", "6", "0h", "-1h", "6 hours", ""):
        with pytest.raises(ValueError, match="ISO 8601 time like 2026-11-24T18:00Z or a time from now"):
            parse_deadline(text, now)
    base = [arylctl_executable(), "--server", scheduler.address, "submit", "--name", "cli", "--chdir", "/"]
    bad = subprocess.run([*base, "--deadline", "tomorrow", "--", "true"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 2 and "--deadline" in bad.stderr and "'tomorrow'" in bad.stderr
    ok = subprocess.run([*base, "--deadline", "6h", "-o", "json", "--", "true"], capture_output=True, text=True,
                        timeout=60, check=False)
    assert ok.returncode == 0, ok.stderr
    # No hints declared: the deadline is stored (6 h from the command, give or take its run time), not judged.
    assert "cannot judge its deadline" in ok.stderr
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        jobs = stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=5).jobs
    assert abs(jobs[0].spec.deadline.seconds - (time.time() + 6 * 3600)) < 60
    assert jobs[0].deadline_status == J.DEADLINE_STATUS_UNKNOWN


# --------------------------------------------------------------------------------------------------
# Predicted finish from reported progress, on a hand-moved clock


@pytest.fixture
def manual(database_url: str) -> Iterator[tuple[ServerHandle, ManualClock]]:
    clock = ManualClock()
    # Servers never go LOST here, nor does the leader lease lapse (on PostgreSQL): the clock jumps by tens of
    # seconds between reports, past ha.lease_s (8 s) before the lease thread's next renewal, whose round then
    # stepped down (a loaded CI run saw GetJob answered "this scheduler is a standby"). Every report is written
    # before it is answered (telemetry_write_s 0), so that the figures read right after it count it.
    agents = {"lost_after_s": 1e6, "telemetry_write_s": 0}
    handle = serve_in_background(scheduler_config(database_url, agents=agents, ha={"lease_s": 1e6}), clock=clock)
    yield handle, clock
    handle.stop()


def test_prediction_converges_on_steady_progress_and_explain_says_why(manual) -> None:
    """Two inelastic 2-worker jobs declare 10,000 samples at 40 samples/s per worker (80/s: 125 s), but truly
    do 10/s: they report 100 k samples at T0 + 10 k. Their true finish is T0 + 1,000. Job ``tight`` must
    finish by T0 + 900, job ``loose`` by T0 + 1,600."""
    scheduler, clock = manual
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "gpu-1", gpus=4).scheduler_epoch
    agent = Agent(scheduler.address, "gpu-1", epoch)
    try:
        hints = linear_hints(10_000.0, 40.0)
        tight = submit(stub, job_spec("tight", workers=2, throughput=hints, deadline=at(T0 + 900)))
        loose = submit(stub, job_spec("loose", workers=2, throughput=hints, deadline=at(T0 + 1600)))
        # Admission (warn): at its max 2 workers, declared 80/s: 125 s, so both look feasible.
        assert tight.deadline_status == J.DEADLINE_STATUS_ON_TRACK and tight.workers_needed == 2
        assert tight.predicted_finish.ToNanoseconds() == round((T0 + 125) * 1e9)
        ids = [tight.job.job_id, loose.job.job_id]
        for job_id in ids:
            running(stub, job_id, workers=2)
        # Before any progress: declared, 10,000 / 80 = 125 s from now, confidence 0.3.
        job = get_job(stub, ids[0])
        assert job.predicted_finish.ToSeconds() == int(T0 + 125) and job.prediction_confidence == pytest.approx(0.3)
        finishes, confidences = [], []
        for k in range(1, 6):
            clock.advance(10.0)
            agent.report(*(worker(job_id, 0, 1, progress=100.0 * k) for job_id in ids))
            job = get_job(stub, ids[0])
            assert job.progress == 100.0 * k
            finishes.append(job.predicted_finish.ToNanoseconds() / 1e9 - T0)
            confidences.append(job.prediction_confidence)
        # One report: still the declared rate, from the reported progress: 10 + 9,900 / 80 = 133.75.
        # From the second on, its own rate: 10 samples/s -> finishes at T0 + 1,000; confidence r / (r + 3).
        assert finishes == pytest.approx([133.75, 1000.0, 1000.0, 1000.0, 1000.0])
        assert confidences == pytest.approx([0.3, 1 / 4, 2 / 5, 3 / 6, 4 / 7])
        # At T0 + 50: tight is 100 s late at its max 2 workers; loose finishes 600 s (10 min) early.
        listed = {j.job_id: j for j in stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=5).jobs}
        assert listed[ids[0]].deadline_status == J.DEADLINE_STATUS_WILL_MISS
        assert listed[ids[1]].deadline_status == J.DEADLINE_STATUS_ON_TRACK
        late = stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=ids[0]), timeout=5)
        assert late.deadline == "will miss its deadline by ~2 min at 2 workers (its max 2)"
        on_time = stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=ids[1]), timeout=5)
        assert on_time.deadline == "on track: finishes 22:30 UTC, 10 min before its deadline"  # T0 + 1,000
        lines = describe_explanation(late).splitlines()
        assert any(line.startswith("Deadline ") and line.endswith(": " + late.deadline) for line in lines), lines
        # Done at T0 + 1,000 (the report says so; both ranks exit 0): tight missed by 100 s, loose met.
        clock.advance(950.0)
        for job_id in ids:
            agent.report(*(worker(job_id, rank, 1, EXITED, exit_code=0) for rank in range(2)))
        ended = {j: get_job(stub, j) for j in ids}
        assert ended[ids[0]].deadline_status == J.DEADLINE_STATUS_MISSED
        assert ended[ids[0]].deadline_note == "missed its deadline by 2 min"
        assert ended[ids[1]].deadline_status == J.DEADLINE_STATUS_MET
        assert not ended[ids[1]].HasField("predicted_finish")
    finally:
        agent.close()
        channel.close()


# --------------------------------------------------------------------------------------------------
# Admission feedback and refusal


@pytest.mark.parametrize("mode", ["warn", "reject"])
def test_admission_warns_by_default_and_reject_refuses_with_the_reason(scheduler_factory, mode: str) -> None:
    """36,000 samples at 1 sample/s per worker, max 8 workers, on a cluster of one 4-GPU server: at the
    4 workers it could have it needs 9,000 s (2.5 h)."""
    hints = linear_hints(36_000.0, 1.0)
    scheduler = scheduler_factory(scheduling={"deadline_admission": mode})
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        register_fake_server(scheduler.address, "gpu-1", gpus=4)
        now = time.time()
        # 4 h: feasible, with 3 workers at least (36,000 / 3 = 12,000 s <= 14,400).
        fits = submit(stub, job_spec("fits", max_workers=8, throughput=hints, deadline=at(now + 4 * 3600)))
        assert fits.deadline_status == J.DEADLINE_STATUS_ON_TRACK and fits.workers_needed == 3
        assert abs(fits.predicted_finish.ToSeconds() - (now + 9000)) < 30
        assert fits.admission_note.startswith("can meet its deadline: needs ~2.5 h at 4 workers (the most the "
                                              "cluster holds), the deadline is in 4.0 h")
        short = job_spec("short", max_workers=8, throughput=hints, deadline=at(now + 2 * 3600))
        if mode == "warn":
            answer = submit(stub, short)
            assert answer.job.job_id and answer.deadline_status == J.DEADLINE_STATUS_WILL_MISS
            assert answer.admission_note == ("cannot meet its deadline: needs ~2.5 h at 4 workers (the most the "
                                             "cluster holds); the deadline is in 2.0 h")
        else:
            err = refusal(stub, short)
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert err.details() == (
                "job 'short' cannot meet its deadline: needs ~2.5 h at 4 workers (the most the cluster holds); "
                "the deadline is in 2.0 h (scheduling.deadline_admission = reject); set a later deadline, or "
                "raise max_workers if the job scales further")
            names = [j.spec.name for j in stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=5).jobs]
            assert "short" not in names  # nothing queued
            # Without a deadline nothing is refused; the answer still says when it would finish.
            free = submit(stub, job_spec("free", max_workers=8, throughput=hints))
            assert free.deadline_status == J.DEADLINE_STATUS_NONE
            assert free.admission_note.startswith("finishes ~") and "at its max 8 workers" in free.admission_note
