"""The goodput job contract (issue 17), both ways: a job's batch limits validated and stored; the
batch chosen for it (a policy's ``Plan.batches``, else the default split) in its workers' desired state
and environment, changed in place without a restart; rank 0's step times and gradient statistics of
the current incarnation stored and in the snapshot, older incarnations' ignored.

Store tests run through the application layer on SQLite and PostgreSQL (``database_url``), as
``tests/store/test_apply.py`` does; the agent tests run real worker processes under the real supervisor
(``tests/agent/test_agent_workers.py``'s way); one test runs a real scheduler and a real agent daemon.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from arylctl.cli import main as arylctl
from node_agent import contract
from node_agent.config import AgentSection
from node_agent.desired import DesiredStateTracker
from node_agent.supervisor import Supervisor
from node_agent.workers import Phase, WorkerId, load_state
from protos.aryl.v1 import types_pb2
from scheduler_service.api import convert, job_validation
from scheduler_service.app import SchedulerApp
from scheduler_service.core.batch import prediction_sizes
from scheduler_service.core.goodput import BatchSplit, GradParams, StepSample
from scheduler_service.core.plan import BatchSize, Plan
from scheduler_service.core.snapshot import BatchLimits
from scheduler_service.errors import InvalidArgument
from scheduler_service.lifecycle import Pool
from scheduler_service.records import (
    DesiredServerState,
    GpuReport,
    JobSubmission,
    ServerRegistration,
    StatusReport,
    WorkerReport,
)
from scheduler_service.server import serve_in_background
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.goodput import MAX_STEP_TIMES, goodput_info, with_report
from tests.fixtures.cluster import end_leftovers
from tests.harness import (
    AS_ITSELF,
    ManualClock,
    daemon_env,
    desired_state,
    desired_worker,
    job_spec,
    register_fake_server,
    scale,
    scheduler_config,
    start,
)
from tests.helpers import processes_mentioning, wait_for

T = types_pb2
LIMITS = BatchLimits(init_bsz=256, max_bsz=1024, max_atomic_bsz=64)
WAIT_S = 30.0

# --------------------------------------------------------------------------------------------------
# the contract module (what a training program imports)


def test_the_progress_file_carries_the_goodput_measures_and_stays_readable_without_them(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    contract.report_progress(12, 300.0, 10, path=path, step_time_s=0.5, pass_time_s=0.2, local_batch_size=43,
                             accum_steps=1, grad_sqr=0.01, grad_var=0.04, samples=3096)
    assert json.loads(path.read_text()) == {
        "progress": 12.0, "samples_per_second": 300.0, "checkpoint_progress": 10.0, "step_time_s": 0.5,
        "pass_time_s": 0.2, "local_batch_size": 43, "accum_steps": 1, "grad_sqr": 0.01, "grad_var": 0.04,
        "samples": 3096.0,
    }
    assert contract.read_progress(path) == contract.Progress(12.0, 300.0, 10.0, 0.5, 0.2, 43, 1, 0.01, 0.04, 3096.0)
    contract.report_progress(13, path=path)  # an older program: no goodput keys written, none read
    assert json.loads(path.read_text()).keys() == {"progress", "samples_per_second", "checkpoint_progress"}
    assert contract.read_progress(path) == contract.Progress(13.0)
    # A bad measure is dropped (0), the report's progress kept.
    assert contract.parse_progress('{"progress": 5, "step_time_s": "fast", "grad_var": -1, "samples": 1e999}') \
        == contract.Progress(5.0)


def test_the_batch_is_read_from_the_batch_file_else_the_environment(tmp_path: Path, monkeypatch) -> None:
    for name in (contract.LOCAL_BATCH_SIZE, contract.ACCUM_STEPS, contract.BATCH_FILE, contract.INIT_BATCH_SIZE,
                 contract.MAX_BATCH_SIZE, contract.MAX_LOCAL_BATCH_SIZE):
        monkeypatch.delenv(name, raising=False)
    assert contract.current_batch() is None and contract.batch_limits() is None  # a job without batch limits
    batch_file = tmp_path / "batch.json"
    monkeypatch.setenv(contract.LOCAL_BATCH_SIZE, "43")
    monkeypatch.setenv(contract.ACCUM_STEPS, "1")
    monkeypatch.setenv(contract.BATCH_FILE, str(batch_file))
    for name, value in ((contract.INIT_BATCH_SIZE, "256"), (contract.MAX_BATCH_SIZE, "1024"),
                        (contract.MAX_LOCAL_BATCH_SIZE, "64")):
        monkeypatch.setenv(name, value)
    assert contract.current_batch() == contract.Batch(43, 1) == contract.start_batch()  # no file yet
    assert contract.batch_limits() == contract.BatchLimits(256, 1024, 64)
    contract.write_batch(batch_file, contract.Batch(64, 0))
    assert contract.current_batch() == contract.Batch(64, 0) and contract.Batch(64, 0).total(3) == 192
    batch_file.write_text("{not json")  # whatever is there, the program keeps a batch
    assert contract.current_batch() == contract.Batch(43, 1)


def test_writing_the_batch_file_replaces_a_link_and_never_writes_through_it(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "batch.json"
    target.symlink_to(victim)
    Path(f"{target}.tmp.{os.getpid()}").symlink_to(victim)  # a link planted at the temporary name too
    contract.write_batch(target, contract.Batch(8, 2))
    assert victim.read_text() == "keep"
    assert not target.is_symlink() and contract.parse_batch(target.read_text()) == contract.Batch(8, 2)


# --------------------------------------------------------------------------------------------------
# validation


def batch_spec(init: int = 256, largest: int = 1024, local: int = 64, **fields) -> T.JobSpec:
    return job_spec("bs", batch=T.BatchHints(init_batch_size=init, max_batch_size=largest, max_local_batch_size=local),
                    **fields)


def test_batch_limits_are_validated_with_messages_that_say_what_to_fix() -> None:
    sub = job_validation.job_submission(batch_spec(workers=2, max_workers=4), "", now=0.0)
    assert sub.batch_limits == LIMITS
    assert job_validation.job_submission(job_spec("plain"), "", now=0.0).batch_limits is None
    refused = {
        "spec.batch.init_batch_size": (batch_spec(init=0), "between 1 and"),
        "spec.batch.max_batch_size": (batch_spec(largest=0), "is required"),
    }
    for field, (spec, words) in refused.items():
        with pytest.raises(InvalidArgument) as caught:
            job_validation.job_submission(spec, "", now=0.0)
        assert (caught.value.field, words in caught.value.reason) == (field, True), caught.value.reason
    with pytest.raises(InvalidArgument) as caught:
        job_validation.job_submission(batch_spec(largest=128), "", now=0.0)
    assert caught.value.field == "spec.batch.max_batch_size"
    assert "must be >= init_batch_size (256)" in caught.value.reason
    with pytest.raises(InvalidArgument) as caught:  # 8 workers x 4 GPUs: at least 32 samples a step
        job_validation.job_submission(batch_spec(init=16, largest=16, gpus=4, workers=1, max_workers=8), "", now=0.0)
    assert caught.value.field == "spec.batch.max_batch_size" and "must be >= 32" in caught.value.reason
    with pytest.raises(InvalidArgument) as caught:
        job_validation.job_submission(batch_spec(local=0), "", now=0.0)
    assert caught.value.field == "spec.batch.max_local_batch_size" and "is required" in caught.value.reason


# --------------------------------------------------------------------------------------------------
# the scheduler: stored, reported, applied, in the desired state (SQLite and PostgreSQL)


class RecordingNotifier:
    """The desired states each commit pushes (``tests/store/test_apply.py``'s notifier, reduced)."""

    def __init__(self) -> None:
        self.committed: list[dict[str, DesiredServerState]] = []

    def events_appended(self) -> None:
        pass

    def desired_state_changed(self, server_ids) -> None:
        pass

    def desired_states_committed(self, states) -> None:
        self.committed.append(dict(states))

    def cycle_requested(self) -> None:
        pass

    def jobs_queued(self) -> None:
        pass


@pytest.fixture
def notifier() -> RecordingNotifier:
    return RecordingNotifier()


@pytest.fixture
def app(database_url: str, notifier: RecordingNotifier) -> Iterator[SchedulerApp]:
    engine = create_engine_for(database_url)
    yield SchedulerApp(session_factory(engine), ManualClock(), notifier=notifier)
    engine.dispose()


def pushed_batches(notifier: RecordingNotifier, server_id: str) -> list[tuple[int, BatchSplit | None]]:
    """(rank, batch) of each worker in the last desired state pushed to ``server_id``."""
    state = next(states[server_id] for states in reversed(notifier.committed) if server_id in states)
    return [(w.rank, w.batch) for w in state.workers]


def rank_report(job_id: int, rank: int, incarnation: int, **measures) -> WorkerReport:
    return WorkerReport(job_id=job_id, rank=rank, incarnation=incarnation, phase="RUNNING", progress=1.0, **measures)


def test_batches_are_stored_chosen_reported_and_sent_to_the_workers(app: SchedulerApp,
                                                                    notifier: RecordingNotifier) -> None:
    app.agents.register(ServerRegistration(hostname="g1", pool=Pool.TRAINING, agent_address="g1:7000",
                                           agent_version="test",
                                           gpus=tuple(GpuReport(i, f"GPU-g1-{i}", "Fake", 80 << 30) for i in range(4))))
    job_id = app.jobs.submit(JobSubmission(name="bs", user="alice", queue="default", command=("python", "t.py"),
                                           env={}, gpus_per_worker=1, min_workers=1, max_workers=3,
                                           batch_limits=LIMITS)).id
    plain_id = app.jobs.submit(JobSubmission(name="plain", user="alice", queue="default", command=("python",),
                                             env={}, gpus_per_worker=1, min_workers=1, max_workers=1)).id
    assert app.jobs.get(job_id)[0].batch_limits == LIMITS and app.jobs.get(plain_id)[0].batch_limits is None
    (view,) = [j for j in app.cluster.snapshot().jobs if j.job_id == job_id]
    assert (view.batch_limits, view.step_samples, view.grad_stats) == (LIMITS, (), None)

    # Started at 3 GPUs with no batch chosen: the default, 256 over 3 GPUs in passes of at most 64.
    app.cluster.apply(Plan(starts=(start(job_id, ("g1", (0,)), ("g1", (1,)), ("g1", (2,))),
                                   start(plain_id, ("g1", (3,))))))
    default = BatchSplit(43, 1)
    assert pushed_batches(notifier, "g1") == [(0, default), (1, default), (2, default), (0, None)]
    shown = convert.job(app.jobs.get(job_id)[0])
    assert (shown.local_batch_size, shown.accum_steps, shown.batch_size) == (43, 1, 258)
    assert shown.spec.batch.init_batch_size == 256 and not convert.job(app.jobs.get(plain_id)[0]).batch_size

    # Rank 0's measures of the current incarnation count; rank 1's and an older incarnation's do not.
    incarnation = app.jobs.get(job_id)[0].incarnation
    generation = app.views.servers()[0].desired_generation
    app.agents.report_status(StatusReport("g1", app.term.epoch, (), generation, workers=(
        rank_report(job_id, 0, incarnation, step_time_s=0.5, pass_time_s=0.2, local_batch_size=43, accum_steps=1,
                    grad_sqr=0.01, grad_var=0.04, samples=2580),
        rank_report(job_id, 1, incarnation, step_time_s=9.0, pass_time_s=9.0, local_batch_size=43, grad_sqr=9.0),
        rank_report(job_id, 0, incarnation - 1, step_time_s=7.0, pass_time_s=7.0, local_batch_size=8, grad_sqr=7.0,
                    grad_var=7.0, samples=99),
    )))
    (view,) = [j for j in app.cluster.snapshot().jobs if j.job_id == job_id]
    # The step without its one accumulation pass (0.5 - 0.2), at 1 server x 3 GPUs.
    assert view.step_samples == (StepSample(nodes=1, replicas=3, atomic_bsz=43.0, pass_s=0.2, step_s=0.3),)
    assert view.grad_stats == GradParams(sqr=0.01, var=0.04)
    shown = convert.job(app.jobs.get(job_id)[0])
    assert [(t.nodes, t.replicas, t.local_batch_size, t.accum_steps, t.pass_time_s, t.step_time_s)
            for t in shown.step_times] == [(1, 3, 43, 1, 0.2, 0.5)]
    assert (shown.grad_sqr, shown.grad_var, shown.noise_scale, shown.samples) == (0.01, 0.04, 256 * 4.0, 2580.0)
    # Its fitted model predicts its speed at 1..3 workers over its 3, with the batch for each.
    assert [(p.workers, p.reference_workers, p.source) for p in shown.predicted_speedups] == [
        (1, 3, "fitted"), (2, 3, "fitted"), (3, 3, "fitted")]
    assert shown.predicted_speedups[2].speedup == pytest.approx(1.0)
    assert all(0 < p.speedup and p.batch_size <= 1024 for p in shown.predicted_speedups)
    # Alone, an older incarnation's report changes nothing either.
    before = app.jobs.get(job_id)[0].goodput
    app.agents.report_status(StatusReport("g1", app.term.epoch, (), generation, workers=(
        rank_report(job_id, 0, incarnation - 1, step_time_s=3.0, pass_time_s=1.0, local_batch_size=43,
                    grad_sqr=5.0, grad_var=5.0),)))
    assert app.jobs.get(job_id)[0].goodput == before

    # A policy's choice: stored for the 3 GPUs, sent to every worker (same incarnation: no restart), an event.
    app.cluster.apply(Plan(batches=(BatchSize(job_id, 64, 0), BatchSize(plain_id, 8, 0))))
    assert pushed_batches(notifier, "g1")[:3] == [(0, BatchSplit(64, 0)), (1, BatchSplit(64, 0)),
                                                  (2, BatchSplit(64, 0))]
    record, events = app.jobs.get(job_id, include_events=True)
    assert record.incarnation == incarnation and record.batch_chosen == BatchSplit(64, 0)
    assert [(e.reason, e.message) for e in events if e.kind == "JOB_BATCH_CHANGED"] == [
        ("BATCH_DEFAULT", "batch 258 = 3 GPU(s) x 43 per pass x 2 pass(es) per step (its init batch over its GPUs)"),
        ("BATCH_CHOSEN", "batch 192 = 3 GPU(s) x 64 per pass x 1 pass(es) per step (chosen by the policy)"),
    ]
    assert convert.job(record).batch_size == 192 and app.jobs.get(plain_id)[0].batch_chosen is None
    # Outside its limits (a pass above 64), or the same again: left out, no event.
    pushes = len(notifier.committed)
    app.cluster.apply(Plan(batches=(BatchSize(job_id, 65, 0), BatchSize(job_id, 64, 0))))
    assert len(notifier.committed) == pushes
    assert [e.kind for e in app.jobs.get(job_id, include_events=True)[1]].count("JOB_BATCH_CHANGED") == 2

    # Resized without a new choice: the choice was for 3 GPUs, so 2 GPUs get the default again.
    app.cluster.apply(Plan(scales=(scale(job_id, ("g1", (0,)), ("g1", (1,))),)))
    assert pushed_batches(notifier, "g1")[:2] == [(0, BatchSplit(64, 1)), (1, BatchSplit(64, 1))]
    last = [e for e in app.jobs.get(job_id, include_events=True)[1] if e.kind == "JOB_BATCH_CHANGED"][-1]
    assert (last.reason, last.details["batch_size"]) == ("BATCH_DEFAULT", "256")


def test_a_job_keeps_one_step_time_per_configuration_and_a_bounded_number() -> None:
    document = None
    for replicas in range(1, MAX_STEP_TIMES + 3):
        report = rank_report(1, 0, 1, step_time_s=1.0, pass_time_s=0.5, local_batch_size=32)
        document = with_report(document, report, nodes=1, replicas=replicas, now=float(replicas))
    newer = rank_report(1, 0, 1, step_time_s=2.0, pass_time_s=0.5, local_batch_size=32)
    document = with_report(document, newer, nodes=1, replicas=MAX_STEP_TIMES + 2, now=100.0)
    times = goodput_info(document).step_times
    assert len(times) == MAX_STEP_TIMES  # the two measured longest ago were dropped
    assert [t.replicas for t in times] == list(range(3, MAX_STEP_TIMES + 3))
    assert (times[-1].step_time_s, times[-1].measured_at) == (2.0, 100.0)  # the newest measure of its configuration
    assert with_report(document, rank_report(1, 0, 1), nodes=1, replicas=1, now=101.0) is None  # nothing new


# --------------------------------------------------------------------------------------------------
# the agent: environment at start, the batch file rewritten in place (real processes)

# A worker that writes its environment and, each time its batch file changes, the batch it reads.
BATCH_WORKER = """
import json, os, sys, time
from node_agent import contract
out = sys.argv[1]
json.dump(dict(os.environ), open(out + ".env", "w"))
seen = None
while True:
    batch = contract.current_batch()
    if batch != seen:
        seen = batch
        with open(out + ".batches", "a") as f:
            f.write(json.dumps([batch.local_batch_size, batch.accum_steps]) + "\\n")
    time.sleep(0.05)
"""


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[tuple[Supervisor, DesiredStateTracker]]:
    config = AgentSection(hostname="w-node", work_dir=str(tmp_path / "agent"), stop_grace_s=5.0,
                          reconcile_interval_s=0.05)
    tracker = DesiredStateTracker()
    sup = Supervisor(config, tracker, users=AS_ITSELF)
    sup.start()
    yield sup, tracker
    sup.close(stop_workers=True)
    wait_for(lambda: not processes_mentioning(str(tmp_path)), timeout=10, what="the test's processes to exit")


def batch_worker(out: Path, local: int, accum: int, *, incarnation: int = 1):
    worker = desired_worker([sys.executable, "-c", BATCH_WORKER, str(out)], job="job-b", incarnation=incarnation,
                            env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    worker.local_batch_size, worker.accum_steps = local, accum
    worker.init_batch_size, worker.max_batch_size, worker.max_local_batch_size = 256, 1024, 64
    return worker


def test_the_batch_reaches_the_worker_and_a_change_alone_does_not_restart_it(supervisor, tmp_path: Path) -> None:
    sup, tracker = supervisor
    out = tmp_path / "worker"
    tracker.offer(desired_state(1, batch_worker(out, 43, 1)))
    sup.wake()
    env = wait_for(lambda: out.with_suffix(".env").exists() and out.with_suffix(".env").stat().st_size
                   and json.loads(out.with_suffix(".env").read_text()), timeout=WAIT_S, what="the worker's env")
    assert {k: env[k] for k in ("ARYL_LOCAL_BATCH_SIZE", "ARYL_ACCUM_STEPS", "ARYL_INIT_BATCH_SIZE",
                                "ARYL_MAX_BATCH_SIZE", "ARYL_MAX_LOCAL_BATCH_SIZE")} == {
        "ARYL_LOCAL_BATCH_SIZE": "43", "ARYL_ACCUM_STEPS": "1", "ARYL_INIT_BATCH_SIZE": "256",
        "ARYL_MAX_BATCH_SIZE": "1024", "ARYL_MAX_LOCAL_BATCH_SIZE": "64"}
    assert env["ARYL_BATCH_FILE"] == str(sup.layout.batch_file(WorkerId("job-b", 0, 1)))
    pid = next(w.pid for w in load_state(sup.layout.state_file) if w.id == WorkerId("job-b", 0, 1))

    # Only the batch changes (same incarnation): the worker reads it at its next step, and keeps running.
    tracker.offer(desired_state(2, batch_worker(out, 64, 0)))
    sup.wake()
    batches = out.with_suffix(".batches")
    wait_for(lambda: batches.exists() and "[64, 0]" in batches.read_text(), timeout=WAIT_S, what="the new batch read")
    assert batches.read_text().split() == ["[43,", "1]", "[64,", "0]"]
    # The state file is written after the batch file the worker reads: wait for it (CI read it in between).
    record = wait_for(lambda: next((w for w in load_state(sup.layout.state_file) if w.id.job_id == "job-b"
                                    and w.spec.local_batch_size == 64), None),
                      timeout=WAIT_S, what="the new batch saved")
    assert (record.pid, record.phase, record.spec.local_batch_size) == (pid, Phase.RUNNING, 64)
    # A job without batch limits gets none of the variables.
    plain = desired_worker([sys.executable, "-c", BATCH_WORKER, str(tmp_path / "plain")], job="job-p",
                           gpus=(1,), env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    tracker.offer(desired_state(3, batch_worker(out, 64, 0), plain))
    sup.wake()
    plain_env = wait_for(lambda: (p := tmp_path / "plain.env").exists() and p.stat().st_size
                         and json.loads(p.read_text()), timeout=WAIT_S, what="the plain worker's env")
    assert not {k for k in plain_env if "BATCH" in k or k == "ARYL_ACCUM_STEPS"}


# --------------------------------------------------------------------------------------------------
# end to end: a real scheduler, a real agent daemon, a plain-Python worker reporting goodput measures

# Rank 0 of a job with batch limits, as the contract asks: the batch it got, measures in its progress file.
REPORTING_WORKER = """
import json, os, sys, time
from node_agent import contract
json.dump(dict(os.environ), open(sys.argv[1], "w"))
batch = contract.current_batch()
step = 0
while True:
    step += 1
    contract.report_progress(step, 100.0, step_time_s=0.25, pass_time_s=0.1, local_batch_size=batch.local_batch_size,
                             accum_steps=batch.accum_steps, grad_sqr=0.5, grad_var=1.5,
                             samples=step * batch.total(int(os.environ["WORLD_SIZE"])))
    time.sleep(0.1)
"""


@pytest.mark.postgres
def test_a_real_agent_passes_the_batch_down_and_the_measures_up(tmp_path: Path, postgres_url: str) -> None:
    scheduler = serve_in_background(scheduler_config(
        postgres_url, agents={"report_interval_s": 0.3, "lost_after_s": 5.0, "telemetry_write_s": 1.0},
        scheduling={"cycle_interval_s": 0.2, "default_grace_period_s": 5.0, "policy": "fifo"}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env.update(ARYL_AGENT__RECONCILE_INTERVAL_S="0.1", ARYL_AGENT__ADVERTISE_ADDRESS="127.0.0.1",
               ARYL_AGENT__LOGS_PORT="-1", ARYL_E2E_MARKER=str(tmp_path), **daemon_env("gp-1"))
    agent = subprocess.Popen(
        [sys.executable, "-m", "node_agent.main", "--scheduler", scheduler.address, "--hostname", "gp-1",
         "--fake-gpus", "2", "--work-dir", str(tmp_path / "agent")],
        cwd=Path(__file__).resolve().parents[2], env=env, stdout=(tmp_path / "agent.log").open("ab"),
        stderr=subprocess.STDOUT)
    from arylctl.client import ArylClient
    client = ArylClient(scheduler.address, timeout=10)
    try:
        dump = tmp_path / "env.json"
        spec = batch_spec(gpus=1, workers=2, init=100, largest=400, local=32,
                          env={"PYTHONPATH": str(Path(__file__).resolve().parents[2])})
        del spec.command[:]
        spec.command.extend([sys.executable, "-c", REPORTING_WORKER, str(dump)])
        spec.working_dir = str(tmp_path)
        job_id = client.submit_job(spec).job_id
        env_seen = wait_for(lambda: dump.exists() and dump.stat().st_size and json.loads(dump.read_text()),
                            timeout=60, what="the worker's environment")
        # 100 over 2 GPUs in passes of at most 32: 25 per pass, 2 passes.
        assert (env_seen["ARYL_LOCAL_BATCH_SIZE"], env_seen["ARYL_ACCUM_STEPS"]) == ("25", "1")
        job = wait_for(lambda: j if (j := client.get_job(job_id).job).step_times and j.grad_sqr else None,
                       timeout=60, what="the measures to reach the scheduler")
        assert [(t.nodes, t.replicas, t.local_batch_size, t.accum_steps, t.step_time_s, t.pass_time_s)
                for t in job.step_times] == [(1, 2, 25, 1, 0.25, 0.1)]
        assert (job.grad_sqr, job.grad_var, job.noise_scale) == (0.5, 1.5, 300.0)
        assert (job.local_batch_size, job.accum_steps, job.batch_size) == (25, 1, 100) and job.samples > 0
    finally:
        client.close()
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
        scheduler.stop()
        end_leftovers(tmp_path)


# --------------------------------------------------------------------------------------------------
# arylctl


def test_arylctl_submits_batch_limits_and_shows_the_batch_the_scheduler_chose(scheduler) -> None:
    register_fake_server(scheduler.address, "c-1", gpus=2, converge=True)

    def run(*args: str) -> str:
        out, err = io.StringIO(), io.StringIO()
        assert arylctl(["--server", scheduler.address, *args], stdout=out, stderr=err) == 0, err.getvalue()
        return out.getvalue()

    submitted = json.loads(run("-o", "json", "submit", "--name", "bs", "--gpus-per-worker", "2", "--min-workers", "1",
                               "--batch-size", "256", "--max-batch-size", "1024", "--", "python", "t.py"))
    # --max-local-batch-size left out: the init batch's share per GPU at min workers (256 / 2).
    assert submitted["spec"]["batch"] == {"init_batch_size": 256, "max_batch_size": 1024, "max_local_batch_size": 128}
    job_id = submitted["job_id"]
    shown = wait_for(lambda: "Batch:" in (text := run("job", job_id)) and "not running" not in text and text,
                     timeout=WAIT_S, what="the job to run with its batch")
    assert "Batch limits:" in shown and "init 256, max 1024, max per GPU per pass 128" in shown
    assert "256 = 128 per GPU per pass x 1 pass(es) per step" in shown
    assert "Predicted speed-up:" in shown and "1w 1.00x (batch 256); declared, over 1 worker(s)" in shown
    detail = json.loads(run("-o", "json", "job", job_id))["job"]
    assert (detail["local_batch_size"], detail["batch_size"]) == (128, 256)
    out, err = io.StringIO(), io.StringIO()
    assert arylctl(["--server", scheduler.address, "submit", "--name", "x", "--max-batch-size", "9", "--", "true"],
                   stdout=out, stderr=err) != 0
    assert "need batch_size" in err.getvalue()


def test_speed_ups_are_predicted_at_every_size_of_a_small_range_and_at_landmarks_of_a_large_one() -> None:
    assert prediction_sizes(2, 5, 0) == (2, 3, 4, 5)
    assert prediction_sizes(1, 100, 6) == (1, 2, 4, 5, 6, 7, 8, 16, 32, 64, 100)
    assert prediction_sizes(3, 3, 3) == (3,)
