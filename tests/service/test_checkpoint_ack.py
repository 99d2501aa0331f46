"""Checkpoint acknowledgements (issue 22): a worker that has saved ends its stop before the grace period.

With real processes: the ``aryl-agent`` daemon against the in-process fake AgentService, and real
workers (``examples/train.py``, or a few lines of Python using ``node_agent.contract``). Stops here
have grace periods far longer than any test runs (600 s), so a test that finishes proves the stop
was ended early; the assertions are on what the agent reports (its message, ``stop_acknowledged``),
never on wall-clock time. Then the scheduler's side: what an acknowledgement does to a job's
checkpoint, its resume point after a preemption, and the cost reclaim gives its preemption.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node_agent import contract
from protos.aryl.v1 import agent_pb2, scheduler_pb2, types_pb2
from scheduler_service.core.params import PolicyParams
from scheduler_service.lifecycle import ServerState
from scheduler_service.policies import aryl, create_policy
from scheduler_service.solvers.reclaim import ReclaimInstance, ReclaimOutcome, reclaim_solve
from tests.fixtures.workers import Agent, _app, get_job, submit, worker
from tests.fixtures.workers import running as running_job_in  # the job RUNNING with n workers
from tests.harness import (
    AGENT_RUNS_AS_ITSELF,
    NOW,
    FakeScheduler,
    desired_state,
    desired_worker,
    inference_server,
    job_spec,
    register_fake_server,
    running_job,
    scheduler_stub,
    snapshot_of,
)
from tests.helpers import processes_mentioning, wait_for

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
WAIT_S = 120.0  # a guard only: the machine is small and shared (an agent may take long to start)
LONG_GRACE_S = 600.0  # no test waits this out: finishing at all shows the stop ended early
EPOCH = 3


def train(*args: str) -> list[str]:
    return [sys.executable, TRAIN, "--step-time", "0.05", "--total-steps", "100000", "--log-every", "1000", *args]


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture
def no_orphans(tmp_path: Path) -> Iterator[None]:
    """Fails the test if a process started under tmp_path outlives it (and kills it)."""
    yield
    try:
        wait_for(lambda: not processes_mentioning(str(tmp_path)), timeout=15, what="the test's processes to exit")
    except AssertionError:
        left = processes_mentioning(str(tmp_path))
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"processes left behind: {left}")


class AgentUnderTest:
    """A real ``aryl-agent`` process and the fake scheduler it reports to."""

    def __init__(self, tmp_path: Path) -> None:
        self.scheduler = FakeScheduler(epoch=EPOCH)
        self.work_dir, self.log_path = tmp_path / "agent", tmp_path / "agent.log"
        self.generation = 0
        self.process = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env.update(ARYL_AGENT__RECONCILE_INTERVAL_S="0.2", ARYL_LOGGING__LEVEL="info", ARYL_AGENT__INSECURE="true",
                   **AGENT_RUNS_AS_ITSELF)
        args = [sys.executable, "-m", "node_agent.main", "--scheduler", f"127.0.0.1:{self.scheduler.port}",
                "--hostname", "w-ack", "--fake-gpus", "2", "--work-dir", str(self.work_dir)]
        with self.log_path.open("ab") as log:
            return subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)

    def restart(self, *workers: agent_pb2.DesiredWorker) -> None:
        """A new agent process on the same work directory (it adopts the workers); once it registered,
        the scheduler pushes it the desired state (``workers``), as a real one does."""
        registrations = len(self.scheduler.service.registrations)
        self.process = self._start()
        wait_for(lambda: len(self.scheduler.service.registrations) > registrations, timeout=WAIT_S,
                 what="the new agent's registration")
        self.generation += 1
        self.scheduler.service.push(desired_state(self.generation, *workers, epoch=EPOCH, server_id="w-ack"))

    def reports_now(self) -> int:
        return len(self.scheduler.service.reports)

    def push(self, *workers: agent_pb2.DesiredWorker) -> int:
        self.generation += 1
        self.scheduler.service.push(desired_state(self.generation, *workers, epoch=EPOCH, server_id="w-ack"))
        return len(self.scheduler.service.reports)

    def reported(
        self, check: Callable[[agent_pb2.WorkerStatus], bool], since: int = 0
    ) -> agent_pb2.WorkerStatus | None:
        reports = list(self.scheduler.service.reports)[since:]
        return next((w for report in reports for w in report.workers if check(w)), None)

    def wait_reported(self, check: Callable[[agent_pb2.WorkerStatus], bool], what: str,
                      since: int = 0) -> agent_pb2.WorkerStatus:
        return wait_for(lambda: self.reported(check, since), timeout=WAIT_S,
                        what=f"{what}; agent log:\n{self.log_path.read_text()[-3000:]}")

    def stop_worker(self, worker: agent_pb2.DesiredWorker) -> agent_pb2.WorkerStatus:
        """No longer desire ``worker``; its EXITED report (the agent reports it once)."""
        since = self.push()
        return self.wait_reported(
            lambda w: w.job_id == worker.job_id and w.phase == agent_pb2.WORKER_PHASE_EXITED,
            "the stopped worker's exit", since)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # deregisters and stops the workers left
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.scheduler.stop()


@pytest.fixture
def agent(tmp_path: Path, no_orphans: None) -> Iterator[AgentUnderTest]:
    made = AgentUnderTest(tmp_path)
    try:
        yield made
    finally:
        made.close()


def running(agent: AgentUnderTest, job: str, progress: float = 0.0) -> agent_pb2.WorkerStatus:
    return agent.wait_reported(
        lambda w: w.job_id == job and w.phase == agent_pb2.WORKER_PHASE_RUNNING and w.progress >= progress,
        f"{job} running with progress >= {progress}")


# --------------------------------------------------------------------------------------------------
# the agent


def test_an_acknowledging_worker_is_stopped_at_its_ack_not_at_the_end_of_its_grace_period(
    agent: AgentUnderTest, tmp_path: Path
) -> None:
    # On SIGTERM it saves, acknowledges, then hangs in its teardown for longer than any test runs.
    worker = desired_worker(train("--linger", "3600"), job="acks", grace_s=LONG_GRACE_S)
    agent.push(worker)
    running(agent, "acks", progress=3)
    exited = agent.stop_worker(worker)
    saved = json.loads((agent.work_dir / "checkpoints" / "acks" / "checkpoint.json").read_text())["step"]
    assert exited.stop_requested and exited.stop_acknowledged
    assert exited.exit_code == -signal.SIGKILL  # it hung after its ack: the exit window's SIGKILL ended it
    assert exited.message == (f"stopped by the agent (SIGTERM): it acknowledged its checkpoint at progress {saved}, "
                              f"then SIGKILL 1 s later (before its {LONG_GRACE_S:g} s grace period ended)")
    assert exited.checkpoint_acked and exited.ack_checkpoint_progress == saved >= 3
    log = agent.log_path.read_text()
    assert "worker acknowledged its stop" in log and "ignored SIGTERM for its grace period" not in log


def test_a_worker_that_acknowledges_and_exits_keeps_its_own_exit_status(agent: AgentUnderTest) -> None:
    # Rank 1 vouches for the checkpoint on disk; ranks exit by themselves right after their acks.
    workers = [desired_worker(train(), job="clean", rank=r, world_size=2, gpus=(r,), grace_s=LONG_GRACE_S)
               for r in (0, 1)]
    agent.push(*workers)
    # Both ranks past their first steps (their SIGTERM handlers set): one rank's progress says nothing of the
    # other's, and on a busy machine a rank still starting dies of the SIGTERM (exit -15).
    for rank in (0, 1):
        def running(w: agent_pb2.WorkerStatus, r: int = rank) -> bool:
            return w.job_id == "clean" and w.rank == r and w.phase == agent_pb2.WORKER_PHASE_RUNNING and w.progress >= 2
        agent.wait_reported(running, f"rank {rank} running with progress >= 2")
    since = agent.push()
    for rank in (0, 1):
        def exited_rank(w: agent_pb2.WorkerStatus, r: int = rank) -> bool:
            return w.job_id == "clean" and w.rank == r and w.phase == agent_pb2.WORKER_PHASE_EXITED
        exited = agent.wait_reported(exited_rank, f"rank {rank}'s exit", since)
        assert exited.exit_code == 0 and exited.stop_acknowledged
        assert exited.message.startswith("stopped by the agent (SIGTERM): exited with status 0; it acknowledged")


def test_a_worker_that_does_not_acknowledge_gets_its_whole_grace_period_then_sigkill(agent: AgentUnderTest) -> None:
    worker = desired_worker(train("--no-ack", "--linger", "3600"), job="silent", grace_s=1.5)
    agent.push(worker)
    running(agent, "silent", progress=2)
    since = agent.push()
    # Reported as stopping (SIGTERM sent, saved, lingering) before the grace period's SIGKILL.
    agent.wait_reported(lambda w: w.job_id == "silent" and w.phase == agent_pb2.WORKER_PHASE_STOPPING,
                        "the worker stopping", since)
    exited = agent.wait_reported(lambda w: w.job_id == "silent" and w.phase == agent_pb2.WORKER_PHASE_EXITED,
                                 "the worker's exit", since)
    assert exited.exit_code == -signal.SIGKILL and not exited.stop_acknowledged and not exited.checkpoint_acked
    assert exited.message == "killed with SIGKILL after the 1.5 s grace period"


# A worker that acknowledged a checkpoint while running, then ignores SIGTERM and never acks again.
ACK_BEFORE_THE_STOP = """
import signal, time
from node_agent import contract
assert not contract.acknowledge_checkpoint(7)  # no stop notice yet: a checkpoint report only
signal.signal(signal.SIGTERM, signal.SIG_IGN)
contract.report_progress(8, checkpoint_progress=7)
time.sleep(3600)
"""

# On SIGTERM it answers the stop notice's id, but as another incarnation (or another stop).
FORGED_ACK = """
import json, os, signal, time
from node_agent import contract

def forge(_signum, _frame):
    notice = contract.stop_notice()
    assert notice is not None, "the stop notice must exist when SIGTERM arrives"
    ack = {"checkpoint_progress": 5, "saved_at": time.time(), "incarnation": contract.incarnation() + INC_DELTA,
           "stop_id": notice.stop_id + STOP_SUFFIX}
    with open(os.environ[contract.CHECKPOINT_ACK_FILE] + ".tmp", "w") as file:
        json.dump(ack, file)
    os.replace(os.environ[contract.CHECKPOINT_ACK_FILE] + ".tmp", os.environ[contract.CHECKPOINT_ACK_FILE])

signal.signal(signal.SIGTERM, forge)
contract.report_progress(6, checkpoint_progress=5)
while True:
    time.sleep(1)
"""


def test_an_ack_written_before_the_sigterm_does_not_shorten_the_stop(agent: AgentUnderTest) -> None:
    worker = desired_worker(python(ACK_BEFORE_THE_STOP), job="early", grace_s=1.5)
    agent.push(worker)
    before = agent.wait_reported(lambda w: w.job_id == "early" and w.checkpoint_acked, "the checkpoint report")
    assert before.ack_checkpoint_progress == 7 and not before.stop_acknowledged
    exited = agent.stop_worker(worker)
    assert exited.exit_code == -signal.SIGKILL and not exited.stop_acknowledged
    assert exited.message == "killed with SIGKILL after the 1.5 s grace period"


@pytest.mark.parametrize(("inc_delta", "stop_suffix"), [(-1, ""), (0, "-an-earlier-stop")],
                         ids=["older-incarnation", "another-stop"])
def test_an_ack_of_another_incarnation_or_stop_does_not_shorten_the_stop(
    agent: AgentUnderTest, inc_delta: int, stop_suffix: str
) -> None:
    code = FORGED_ACK.replace("INC_DELTA", str(inc_delta)).replace("STOP_SUFFIX", repr(stop_suffix))
    worker = desired_worker(python(code), job="forged", incarnation=4, grace_s=1.5)
    agent.push(worker)
    running(agent, "forged", progress=6)
    exited = agent.stop_worker(worker)
    assert exited.exit_code == -signal.SIGKILL and not exited.stop_acknowledged
    assert exited.message == "killed with SIGKILL after the 1.5 s grace period"
    # The forged file was there (the other incarnation's is never reported as this one's checkpoint).
    assert "stopping worker (SIGTERM)" in agent.log_path.read_text()
    if inc_delta:
        assert not exited.checkpoint_acked
    else:
        assert exited.checkpoint_acked and exited.ack_checkpoint_progress == 5


# On SIGTERM it saves nothing until the test says so (a file appears), then acknowledges and hangs.
ACK_WHEN_TOLD = """
import os, signal, sys, time
from node_agent import contract
go = sys.argv[1]

def on_sigterm(_signum, _frame):
    while not os.path.exists(go):
        time.sleep(0.05)
    contract.acknowledge_checkpoint(12)
    while True:
        time.sleep(1)

signal.signal(signal.SIGTERM, on_sigterm)
contract.report_progress(13, checkpoint_progress=12)
while True:
    time.sleep(1)
"""


def test_a_restarted_agent_honours_an_ack_of_the_stop_its_predecessor_began(
    agent: AgentUnderTest, tmp_path: Path
) -> None:
    go = tmp_path / "go"
    worker = desired_worker([*python(ACK_WHEN_TOLD), str(go)], job="adopted", grace_s=LONG_GRACE_S)
    agent.push(worker)
    running(agent, "adopted", progress=13)
    since = agent.push()
    agent.wait_reported(lambda w: w.job_id == "adopted" and w.phase == agent_pb2.WORKER_PHASE_STOPPING,
                        "the worker stopping", since)
    agent.process.kill()  # kill -9 mid-stop: the stop's id is in the state file
    agent.process.wait()
    agent.restart()
    go.touch()
    exited = agent.wait_reported(lambda w: w.job_id == "adopted" and w.phase == agent_pb2.WORKER_PHASE_EXITED,
                                 "the adopted worker's exit", agent.reports_now())
    assert exited.stop_acknowledged and exited.exit_code == -signal.SIGKILL
    assert "it acknowledged its checkpoint at progress 12, then SIGKILL 1 s later" in exited.message


def test_the_contract_reads_its_stop_notice_and_answers_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ack, notice = tmp_path / "ack.json", tmp_path / "stop.json"
    monkeypatch.setenv(contract.CHECKPOINT_ACK_FILE, str(ack))
    monkeypatch.setenv(contract.STOP_NOTICE_FILE, str(notice))
    monkeypatch.setenv(contract.INCARNATION, "9")
    assert contract.stop_notice() is None and not contract.acknowledge_checkpoint(3, saved_at=100.0)
    assert contract.parse_checkpoint_ack(ack.read_text()) == contract.CheckpointAck(3.0, 100.0, 9, "")
    notice.write_text('{"stop_id": "s1", "grace_s": 30, "deadline": 1234.5}')
    assert contract.stop_notice() == contract.StopNotice("s1", 30.0, 1234.5)
    assert contract.acknowledge_checkpoint(4)
    written = contract.parse_checkpoint_ack(ack.read_text())
    assert written is not None and written.answers(9, "s1")
    assert not written.answers(8, "s1") and not written.answers(9, "s2") and not written.answers(9, "")
    for bad in ("", "[]", '{"checkpoint_progress": "x"}',
                '{"checkpoint_progress": -1, "saved_at": 1, "incarnation": 1}',
                '{"checkpoint_progress": NaN, "saved_at": 1, "incarnation": 1}'):
        assert contract.parse_checkpoint_ack(bad) is None
    monkeypatch.delenv(contract.CHECKPOINT_ACK_FILE)
    assert not contract.acknowledge_checkpoint(5)  # outside Aryl: nothing to do


# --------------------------------------------------------------------------------------------------
# the scheduler: the acknowledged checkpoint, where a requeued job resumes, what reclaim counts


@pytest.fixture
def cluster(scheduler_factory):
    """A scheduler (SQLite and PostgreSQL) that writes every report (a running worker's ack is telemetry,
    written at most every ``telemetry_write_s`` otherwise), its API, and a fake agent of one 4-GPU server."""
    scheduler = scheduler_factory(agents={"telemetry_write_s": 0})
    channel, stub = scheduler_stub(scheduler.address)
    agent = Agent(scheduler.address, "gpu-1", register_fake_server(scheduler.address, "gpu-1", gpus=4).scheduler_epoch)
    yield scheduler, stub, agent
    agent.close()
    channel.close()


def acked(job_id: str, incarnation: int, checkpoint: float, age_s: float, phase=agent_pb2.WORKER_PHASE_RUNNING,
          **fields):
    """Rank 0's status carrying its acknowledgement of the checkpoint at ``checkpoint``, saved ``age_s``
    before the report."""
    status = worker(job_id, 0, incarnation, phase, checkpoint_acked=True, ack_checkpoint_progress=checkpoint, **fields)
    status.ack_checkpoint_age.FromMilliseconds(int(age_s * 1000))
    return status


def test_an_acknowledged_checkpoint_counts_from_when_the_worker_saved_it(cluster) -> None:
    scheduler, stub, agent = cluster
    job_id = submit(stub, job_spec("acked"))
    running_job_in(stub, job_id)
    app = _app(scheduler)
    agent.report(worker(job_id, 0, 1, progress=40.0, checkpoint_progress=30.0))
    learnt, _ = app.jobs.get(int(job_id))
    assert learnt.checkpoint_work == 30.0  # from the progress file: counted from when the scheduler learnt of it

    before = time.time()
    agent.report(acked(job_id, 1, 30.0, age_s=600, progress=41.0, checkpoint_progress=30.0))
    record, _ = app.jobs.get(int(job_id))
    assert record.checkpoint_work == 30.0
    assert record.last_checkpoint_at is not None
    assert before - 601 <= record.last_checkpoint_at <= time.time() - 599  # saved 600 s before the report

    agent.report(acked(job_id, 1, 30.0, age_s=600.2, progress=42.0))  # the same ack again: no news
    again, _ = app.jobs.get(int(job_id))
    assert again.last_checkpoint_at == record.last_checkpoint_at
    agent.report(acked(job_id, 1, 35.0, age_s=2, progress=43.0))
    newer, _ = app.jobs.get(int(job_id))
    assert newer.checkpoint_work == 35.0 and newer.last_checkpoint_at is not None \
        and newer.last_checkpoint_at >= before - 3
    agent.report(acked(job_id, 7, 99.0, age_s=0, progress=99.0))  # another incarnation's: history
    assert app.jobs.get(int(job_id))[0].checkpoint_work == 35.0


def test_a_job_requeued_by_a_failure_resumes_from_the_acknowledged_checkpoint(cluster) -> None:
    scheduler, stub, agent = cluster
    job_id = submit(stub, job_spec("resumes", workers=2, restart_policy=types_pb2.RESTART_POLICY_ON_FAILURE,
                                   max_restarts=3))
    running_job_in(stub, job_id, 2)
    agent.report(worker(job_id, 0, 1, progress=80.0), worker(job_id, 1, 1, progress=80.0))
    assert get_job(stub, job_id).progress == 80.0
    # Rank 1 crashes; rank 0 had acknowledged its checkpoint at 50: the job goes back to 50.
    agent.report(acked(job_id, 1, 50.0, age_s=30, progress=81.0),
                 worker(job_id, 1, 1, agent_pb2.WORKER_PHASE_EXITED, exit_code=1, progress=81.0))
    record, _ = _app(scheduler).jobs.get(int(job_id))
    assert record.work_done == 50.0 and record.checkpoint_work == 50.0


def test_a_preempted_job_resumes_from_what_its_stopped_workers_acknowledge(scheduler_factory) -> None:
    # The only server goes silent: the job is requeued (PENDING, same incarnation) and cannot restart
    # until the server reports again -- with the worker that acknowledged its stop.
    # Silent for 3 s: long enough that a loaded machine places the job before the server is lost (at 0.5 s
    # a CI run lost it first), short against the 20 s the requeue is waited for.
    scheduler = scheduler_factory(agents={"lost_after_s": 3.0})
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "only", gpus=2).scheduler_epoch
    agent = Agent(scheduler.address, "only", epoch)
    try:
        job_id = submit(stub, job_spec("gang", gpus=1, workers=2))
        running_job_in(stub, job_id, 2)
        agent.report(worker(job_id, 0, 1, progress=70.0), worker(job_id, 1, 1, progress=70.0))
        wait_for(lambda: get_job(stub, job_id).state == types_pb2.JOB_STATE_PENDING, timeout=20,
                 what="the job requeued")
        agent.report(acked(job_id, 1, 64.0, age_s=3, phase=agent_pb2.WORKER_PHASE_EXITED, stop_requested=True,
                           stop_acknowledged=True, progress=70.0, checkpoint_progress=60.0))
        record, _ = _app(scheduler).jobs.get(int(job_id))
        assert record.work_done == 64.0 and record.checkpoint_work == 64.0  # the acknowledged one, not the file's
        events = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id, include_events=True), timeout=5).events
        [event] = [e for e in events if e.kind == types_pb2.EVENT_KIND_WORKER_STOP_ACKNOWLEDGED]
        assert event.reason == "CHECKPOINT_ACKNOWLEDGED"
        assert event.message.startswith("rank 0 (incarnation 1) acknowledged its checkpoint at progress 64")
    finally:
        agent.close()
        channel.close()


def test_reclaim_counts_the_work_since_the_acknowledged_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two loaned servers, each running one inelastic job started two hours ago; inference needs one
    # back. Job 1 acknowledged a checkpoint 60 s ago, job 2 one 3,000 s ago: preempting job 1 loses
    # less, and the solver's job_cost says exactly how much.
    servers = [inference_server(sid, ServerState.LOANED, gpus=4, since=NOW - 9000) for sid in ("l1", "l2")]
    jobs = [dataclasses.replace(running_job(jid, [(sid, (0, 1, 2, 3))], low=1, resized=NOW - 7200),
                                last_checkpoint_at=NOW - age)
            for jid, sid, age in ((1, "l1", 60.0), (2, "l2", 3000.0))]
    instances: list[ReclaimInstance] = []
    real = reclaim_solve  # what aryl.loans calls, imported from the solvers

    def recorded(instance: ReclaimInstance, count: int) -> ReclaimOutcome:
        instances.append(instance)
        return real(instance, count)
    monkeypatch.setattr(aryl.loans, "reclaim_solve", recorded)
    params = PolicyParams(restart_cost_s=10.0)
    decision = create_policy("aryl", params).preview_reclaim(snapshot_of(servers, jobs, demand=1), 1)
    [instance] = instances
    restart = params.restart_cost_s * 4
    assert list(instance.job_cost) == [pytest.approx(60.0 * 4 + restart), pytest.approx(3000.0 * 4 + restart)]
    assert decision.servers == ("l1",) and decision.preempted == (1,)
    assert decision.cost_gpu_s == pytest.approx(60.0 * 4 + restart)
