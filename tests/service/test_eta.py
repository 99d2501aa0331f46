"""The ETA (issue 22): each job's expected start and finish, from the configured policy run forward on
the cluster as it is (``simulator.forecast``), and what the service makes of it (``app.forecast``:
Job.eta_*, ExplainJob's line, the ETA column of ``arylctl jobs``).

The hand-computed queue: one training server with 2 GPUs; job 1 runs on both with 600 s of work left;
job 2 (1 GPU, 300 s) and job 3 (2 GPUs, 1200 s) wait, 2 submitted first. With a restart overhead of
R seconds per start: 1 finishes at +600; 2 starts then (1 GPU free... both are: 3 needs both, but 2
is first in line) and finishes at +600+R+300; 3 starts then, on the GPU 1 left and the one 2 left,
and finishes 1200+R later.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import os
import signal
from concurrent.futures.process import BrokenProcessPool

import pytest

from arylctl import cli
from protos.aryl.v1 import scheduler_pb2
from scheduler_service.app.forecast import ForecastProcess, eta_note
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ProgressWindow, ServerView, WorkerView
from scheduler_service.lifecycle import JobState, Pool, ServerState
from simulator.forecast import Forecast, ForecastSettings, SimulatorForecastEngine, forecast
from tests.harness import job_spec, register_fake_server, scheduler_stub
from tests.helpers import wait_for

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC


def hand_computed_queue(running: JobView | None = None) -> ClusterSnapshot:
    server = ServerView("t0", Pool.TRAINING, ServerState.TRAINING, (0, 1), allocated=((0, 1), (1, 1)))
    first = running or JobView(
        1, JobState.RUNNING, 2, 1, 1, 0, NOW - 1000, workers=(WorkerView(0, "t0", (0, 1)),),
        throughput_points=((1, 1.0),), total_work=1000, work_done=400, started_at=NOW - 400,
        last_resized_at=NOW - 400, last_checkpoint_at=NOW - 100)
    second = JobView(2, JobState.PENDING, 1, 1, 1, 0, NOW - 500, throughput_points=((1, 1.0),), total_work=300)
    third = JobView(3, JobState.PENDING, 2, 1, 1, 0, NOW - 400, throughput_points=((1, 1.0),), total_work=1200)
    return ClusterSnapshot(NOW, (server,), (first, second, third))


@pytest.mark.parametrize("policy", ["fifo", "aryl"])
@pytest.mark.parametrize("overhead", [0.0, 30.0])
def test_the_eta_of_a_hand_computed_queue(policy: str, overhead: float) -> None:
    made = forecast(hand_computed_queue(), policy, PolicyParams(), ForecastSettings(restart_overhead_s=overhead))
    assert made.stop_reason == "completed"
    one, two, three = (made.jobs[j] for j in (1, 2, 3))
    assert (one.start, one.finish) == (NOW - 400, NOW + 600)  # it runs on: only its remaining 600 s
    assert (two.start, two.finish) == (NOW + 600, NOW + 600 + overhead + 300)
    assert two.after == (1,) and two.after_finished
    assert (three.start, three.finish) == (NOW + 900 + overhead, NOW + 900 + 2 * overhead + 1200)
    assert three.after == (1, 2) and three.after_finished  # one GPU from each


def test_a_measured_rate_moves_the_eta() -> None:
    """Job 1 reported progress at half its declared speed: its 600 units left take 1200 s, and the
    queue behind it moves by as much."""
    slow = JobView(
        1, JobState.RUNNING, 2, 1, 1, 0, NOW - 1000, workers=(WorkerView(0, "t0", (0, 1)),),
        throughput_points=((1, 1.0),), total_work=1000, work_done=400, started_at=NOW - 800,
        last_resized_at=NOW - 800, last_checkpoint_at=NOW - 100,
        progress_window=ProgressWindow(workers=1, first_work=0.0, first_at=NOW - 800, last_work=400.0,
                                       last_at=NOW, reports=8))
    made = forecast(hand_computed_queue(slow), "fifo", PolicyParams(), ForecastSettings(restart_overhead_s=0))
    assert made.jobs[1].finish == NOW + 1200
    assert made.jobs[2].start == NOW + 1200
    assert made.jobs[3].start == NOW + 1500


def test_a_rate_measured_on_a_faster_gpu_type_is_not_sped_up_twice() -> None:
    """As above on GPUs of a type declared 2x as fast: the measured rate already includes that, so the
    600 units left still take 1200 s (the declared factor applies to declared speeds only)."""
    slow = JobView(
        1, JobState.RUNNING, 2, 1, 1, 0, NOW - 1000, workers=(WorkerView(0, "t0", (0, 1)),),
        throughput_points=((1, 1.0),), total_work=1000, work_done=400, started_at=NOW - 800,
        last_resized_at=NOW - 800, last_checkpoint_at=NOW - 100,
        progress_window=ProgressWindow(workers=1, first_work=0.0, first_at=NOW - 800, last_work=400.0,
                                       last_at=NOW, reports=8))
    base = hand_computed_queue(slow)
    typed = dataclasses.replace(base, servers=tuple(dataclasses.replace(v, gpu_type="fast") for v in base.servers),
                                gpu_speed=(("fast", 2.0),))
    made = forecast(typed, "fifo", PolicyParams(), ForecastSettings(restart_overhead_s=0))
    assert made.jobs[1].finish == NOW + 1200
    # Job 2 declared its speed (300 units at 1 per second): on the fast type it takes 150 s.
    assert made.jobs[2].start == NOW + 1200 and made.jobs[2].finish == NOW + 1350


def test_a_forecast_stops_at_its_budget_and_leaves_later_starts_unknown() -> None:
    events_only = ForecastSettings(restart_overhead_s=0, max_cycles=2, cycle_interval_s=86400)
    made = forecast(hand_computed_queue(), "fifo", PolicyParams(), events_only)
    assert made.stop_reason == "budget"
    assert made.jobs[2].start == NOW + 600  # the second cycle (at +600, job 1's completion) started it
    assert made.jobs[3].start is None and made.jobs[3].finish is None
    assert "not expected to start before" in eta_note(made.jobs[3], made, NOW)
    horizon = forecast(hand_computed_queue(), "fifo", PolicyParams(),
                       ForecastSettings(restart_overhead_s=0, horizon_s=700))
    assert horizon.stop_reason == "max_time" and horizon.jobs[3].start is None


def test_the_eta_line_names_the_jobs_it_waits_for() -> None:
    made = forecast(hand_computed_queue(), "fifo", PolicyParams(), ForecastSettings(restart_overhead_s=0))
    assert eta_note(made.jobs[2], made, NOW) == "expected to start around 08:10 UTC (after job 1 finishes)"
    assert eta_note(made.jobs[3], made, NOW) == "expected to start around 08:15 UTC (after jobs 1, 2 finish)"
    assert eta_note(None, made, NOW).startswith("no forecast for it yet")


def test_the_forecast_leaves_its_snapshot_as_it_was() -> None:
    snapshot = hand_computed_queue()
    before = repr(snapshot)
    forecast(snapshot, "aryl", PolicyParams())
    assert repr(snapshot) == before


def test_a_forecast_in_its_own_process_is_the_forecast_and_a_dead_process_is_replaced() -> None:
    """The service's forecasts run in a process of their own (``ForecastProcess``): the same forecast as on
    the calling thread; a process killed meanwhile fails that forecast alone, and the next one starts
    another process. A small queue is forecast on the calling thread, with no process started."""
    small = ForecastProcess(SimulatorForecastEngine(), min_jobs=4)
    job = small(hand_computed_queue(), "fifo", PolicyParams()).get(3)
    assert job is not None and job.start is not None
    assert small._pool is None
    settings = ForecastSettings(restart_overhead_s=30)
    run = ForecastProcess(SimulatorForecastEngine(settings), min_jobs=1)
    try:
        made = run(hand_computed_queue(), "aryl", PolicyParams())
        assert made == forecast(hand_computed_queue(), "aryl", PolicyParams(), settings)
        assert isinstance(made, Forecast) and made.jobs[3].start == NOW + 930
        assert run._pool is not None
        [child] = run._pool._processes.values()
        assert child.pid is not None and child.pid != os.getpid()
        assert os.getpriority(os.PRIO_PROCESS, child.pid) == os.getpriority(os.PRIO_PROCESS, 0) + 10  # it yields
        os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        with pytest.raises(BrokenProcessPool):
            run(hand_computed_queue(), "fifo", PolicyParams())
        again = run(hand_computed_queue(), "fifo", PolicyParams())
        assert isinstance(again, Forecast) and again.jobs[3].start == NOW + 930
        assert run._pool is not None
        [other] = run._pool._processes.values()
        assert other.pid != child.pid
    finally:
        run.close()
    assert run._pool is None


def runtime(seconds: int) -> dict:
    return {"throughput": {"estimated_runtime": {"seconds": seconds}}}


def test_the_service_serves_the_eta_after_a_cycle(scheduler_factory) -> None:
    """On a real scheduler: one 1-GPU server, job A runs (600 s declared), job B waits: B's ETA is
    about A's start + 600 s (+ the forecast's restart overhead), after A; explain says so, and the
    jobs table shows it."""
    scheduler = scheduler_factory(scheduling={"forecast_interval_s": 0})
    channel, stub = scheduler_stub(scheduler.address)
    register_fake_server(scheduler.address, "eta-1", gpus=1)
    a = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("a", **runtime(600))), timeout=5).job
    started = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(job_id=a.job_id), timeout=5).job)
                       .HasField("started_at") and j, timeout=20, what="job a to start")
    b = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("b", **runtime(300))), timeout=5).job
    waiting = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(job_id=b.job_id), timeout=5).job)
                       .HasField("eta_start") and j, timeout=30, what="job b's ETA")
    a_start = started.started_at.ToSeconds()
    assert a_start + 540 <= waiting.eta_start.ToSeconds() <= a_start + 660
    assert waiting.eta_finish.ToSeconds() - waiting.eta_start.ToSeconds() == pytest.approx(330, abs=1)
    assert list(waiting.eta_after_job_ids) == [a.job_id]
    assert waiting.eta_note.startswith("expected to start around ")
    assert waiting.eta_note.endswith(f"(after job {a.job_id} finishes)")

    explained = stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=b.job_id), timeout=5)
    assert explained.eta == explained.job.eta_note and explained.eta.startswith("expected to start around ")
    running = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=a.job_id), timeout=5).job
    assert running.HasField("eta_finish") and not running.HasField("eta_start") and running.eta_note == ""

    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["--server", scheduler.address, "explain", b.job_id], stdout=out, stderr=err) == 0, err.getvalue()
    assert "Expected to start around" in out.getvalue()
    out = io.StringIO()
    assert cli.main(["--server", scheduler.address, "job", b.job_id], stdout=out, stderr=err) == 0, err.getvalue()
    assert "Predicted start" in out.getvalue() and "(forecast of the cluster, confidence" in out.getvalue()
    assert "Expected finish" not in out.getvalue()  # one name for the predicted finish
    out = io.StringIO()
    assert cli.main(["--server", scheduler.address, "jobs"], stdout=out, stderr=err) == 0, err.getvalue()
    header, *rows = out.getvalue().splitlines()
    column = header.index("ETA")
    cells = {row.split()[1]: row[column:].split()[:2] for row in rows}
    local = dt.datetime.fromtimestamp(waiting.eta_start.ToSeconds(), dt.UTC).astimezone().strftime("%m-%d")
    assert cells["b"][0] == "starts" and cells["b"][1] == local
    assert cells["a"][0] == "ends"
    out = io.StringIO()
    assert cli.main(["--server", scheduler.address, "-o", "json", "job", b.job_id], stdout=out, stderr=err) == 0
    assert json.loads(out.getvalue())["job"]["eta_note"].startswith("expected to start around ")
    channel.close()


def test_a_restored_cluster_shows_the_snapshot_it_was_built_from() -> None:
    """``SimulatedCluster.from_snapshot``: servers (a loaned one included, with its loan's start, and a
    cordoned one), allocations and running jobs' workers read back as they were."""
    from scheduler_service.core.snapshot import AdminState, DemandView
    from simulator.clock import VirtualClock
    from simulator.cluster import SimulatedCluster
    from simulator.forecast import trace_jobs

    loaned = ServerView("i0", Pool.INFERENCE, ServerState.LOANED, (0, 1, 2, 3), allocated=((2, 7), (3, 7)),
                        state_since=NOW - 50, loan_started_at=NOW - 60)
    serving = ServerView("i1", Pool.INFERENCE, ServerState.SERVING, (0, 1, 2, 3), state_since=NOW - 900,
                         admin=AdminState.CORDONED)
    job = JobView(7, JobState.RUNNING, 2, 1, 2, 0, NOW - 500, workers=(WorkerView(0, "i0", (2, 3)),),
                  estimated_runtime_s=3600, started_at=NOW - 200, last_resized_at=NOW - 200)
    snapshot = ClusterSnapshot(NOW, (loaned, serving), (job,), demand=DemandView(1, 10.0, NOW - 5))
    traces, done = trace_jobs(snapshot, PolicyParams())
    assert done[7] == pytest.approx(200 * traces[7].throughput[0][1])  # no checkpoint since its start
    restored = SimulatedCluster.from_snapshot(snapshot, traces, VirtualClock(NOW), done_since_checkpoint=done)
    again = restored.snapshot()
    assert again.now == NOW and again.demand == snapshot.demand
    assert [(s.server_id, s.state, s.allocated, s.loan_started_at, s.admin) for s in again.servers] == [
        ("i0", ServerState.LOANED, ((2, 7), (3, 7)), NOW - 60, AdminState.NONE),
        ("i1", ServerState.SERVING, (), None, AdminState.CORDONED)]
    (shown,) = again.jobs
    assert (shown.state, shown.workers, shown.started_at, shown.last_resized_at) == (
        JobState.RUNNING, job.workers, NOW - 200, NOW - 200)
    # Its remaining time is the prediction's: 3600 s declared, 200 s of it run.
    assert restored.next_completion() == pytest.approx(NOW + 3400)


def test_forecasts_follow_cycles_at_most_at_their_interval_and_duty() -> None:
    """``app.forecast.Forecasts``: the first cycle gets a forecast; the next only ``min_gap_s`` later;
    one that took 2 s (the snapshot read here advances the clock) holds the next off 20 s (10% duty).
    The ETA of a job comes from the latest forecast, with its line."""
    from scheduler_service.app.forecast import Forecasts
    from tests.harness import ManualClock

    clock = ManualClock(NOW)
    cost = [0.0]

    def snapshot() -> ClusterSnapshot:
        clock.advance(cost[0])
        return dataclasses.replace(hand_computed_queue(), now=clock.now())

    forecasts = Forecasts(snapshot, clock, policy="fifo", params=PolicyParams(), min_gap_s=10.0,
                          engine=SimulatorForecastEngine(ForecastSettings(restart_overhead_s=0)))
    assert forecasts.eta(2, pending=True) is None  # no forecast yet
    assert forecasts.due() and forecasts.refresh() is not None
    eta = forecasts.eta(3, pending=True)
    assert eta is not None and eta.start == NOW + 900 and eta.after == (1, 2)
    assert eta.note == "expected to start around 08:15 UTC (after jobs 1, 2 finish)"
    running = forecasts.eta(1, pending=False)
    assert running is not None and running.start is None and running.finish == NOW + 600 and running.note == ""
    clock.advance(9.9)
    assert not forecasts.due()
    clock.advance(0.1)
    assert forecasts.due()
    cost[0] = 2.0
    assert forecasts.refresh() is not None
    clock.advance(17.9)
    assert not forecasts.due()
    clock.advance(0.1)
    assert forecasts.due()


def test_a_job_without_a_run_time_estimate_gets_no_eta_but_a_labelled_guess() -> None:
    """Issue 36: the forecast runs a job that declares no run time (and reported no progress) for the
    default hour, but serves no ETA that rests on that: the job itself gets no predicted finish, and a
    job waiting for it no predicted start or finish; its line gives the guess, labelled one."""
    from scheduler_service.app.forecast import Forecasts
    from tests.harness import ManualClock

    def unknown(job: JobView) -> JobView:
        return dataclasses.replace(job, throughput_points=(), total_work=0.0, work_done=0.0)

    queue = hand_computed_queue()
    first, second, third = queue.jobs
    snapshot = dataclasses.replace(queue, jobs=(unknown(first), second, unknown(third)))
    forecasts = Forecasts(lambda: snapshot, ManualClock(NOW), policy="fifo", params=PolicyParams(),
                          engine=SimulatorForecastEngine(ForecastSettings(restart_overhead_s=0)))
    assert forecasts.refresh() is not None
    running = forecasts.eta(1, pending=False)
    assert running is not None and (running.start, running.finish) == (None, None)  # no guessed finish
    waiting = forecasts.eta(2, pending=True)  # it waits for job 1, whose run time nobody knows
    assert waiting is not None and (waiting.start, waiting.finish, waiting.after) == (None, None, (1,))
    assert waiting.note.startswith("start unknown: it waits for job 1, whose run time is unknown")
    assert "a guess, if it runs the default 1 h: around " in waiting.note
    assert forecasts.latest is not None
    guess = forecasts.latest.get(2)
    assert guess is not None and guess.start is not None  # the forecast did guess


def test_the_service_serves_no_eta_for_a_job_without_an_estimate(scheduler_factory) -> None:
    """On a real scheduler: a running job that declares no run time has no eta_finish (the API) and
    ``arylctl job`` says why; ``arylctl jobs`` shows no ETA for it."""
    scheduler = scheduler_factory(scheduling={"forecast_interval_s": 0})
    channel, stub = scheduler_stub(scheduler.address)
    register_fake_server(scheduler.address, "eta-2", gpus=1)
    with channel:
        a = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("a")), timeout=5).job
        running = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(job_id=a.job_id), timeout=5).job)
                           .HasField("started_at") and j.HasField("eta_made_at")
                           and j.eta_made_at.ToSeconds() >= j.started_at.ToSeconds() and j, timeout=30,
                           what="a forecast after job a started")
        assert not running.HasField("eta_finish") and not running.HasField("predicted_finish")
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["--server", scheduler.address, "job", a.job_id], stdout=out, stderr=err) == 0, err.getvalue()
    assert "Predicted finish:   - (no run-time estimate: none declared, e.g. submit --estimated-runtime" in (
        out.getvalue()), out.getvalue()
    out = io.StringIO()
    assert cli.main(["--server", scheduler.address, "jobs"], stdout=out, stderr=err) == 0, err.getvalue()
    header, row = out.getvalue().splitlines()
    assert row[header.index("ETA"):].split()[0] == "-"
