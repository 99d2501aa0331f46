"""arylctl's two followers as a user runs them (the installed console script, a real process), against
real schedulers over real gRPC on loopback:

- ``arylctl logs ID -f`` prints what the worker writes and exits 0 once the job has finished and its
  log is read to the end (the job is finished by its agent's report, as a real agent sends it; the
  log is served by a real agent ``WorkerLogService``);
- ``arylctl events -f`` outlives a scheduler restart (a real ``aryl-scheduler`` process stopped and
  started again on the same port and database): one line on stderr, then the stream resumes after
  the last event printed, with no duplicates and no gaps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from node_agent.config import AgentSection
from node_agent.logs import serve_worker_logs
from node_agent.workers import WorkDir
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, types_pb2
from tests.fixtures.cli import Lines, arylctl, arylctl_executable
from tests.fixtures.daemons import BIN, serving
from tests.harness import daemon_security, job_spec, job_state, register_fake_server, scheduler_stub, secure_channel
from tests.helpers import free_port, wait_for

SERVER = "gpu-follow"


@pytest.fixture
def follower_processes() -> Iterator[list[subprocess.Popen]]:
    """Processes a test starts; killed at the end if a failed test left them running."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start(procs: list[subprocess.Popen], *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    procs.append(proc)
    return proc


# ---------------------------------------------------------------------------------------------
# logs -f


def test_logs_follow_exits_0_once_the_finished_jobs_log_is_read_to_the_end(
    scheduler, tmp_path: Path, follower_processes: list[subprocess.Popen]
) -> None:
    layout = WorkDir(tmp_path / "agent", tmp_path / "checkpoints")
    agent_logs, port = serve_worker_logs(layout, SERVER, "127.0.0.1", 0, tls=AgentSection(**daemon_security(SERVER)))
    channel, stub = scheduler_stub(scheduler.address)
    agent_channel = secure_channel(scheduler.address)
    try:
        epoch = register_fake_server(scheduler.address, SERVER, gpus=1,
                                     logs_address=f"127.0.0.1:{port}").scheduler_epoch
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("followed")), timeout=5).job.job_id
        wait_for(lambda: job_state(stub, job_id) == types_pb2.JOB_STATE_RUNNING, timeout=20, what="job running")
        log = layout.log_file(job_id, 0)
        log.parent.mkdir(parents=True)
        log.write_bytes(b"step 1\n")

        follower = start(follower_processes, arylctl_executable(), "--server", scheduler.address,
                         "logs", job_id, "-f", "--poll", "0.05")
        out = Lines(follower.stdout)
        wait_for(lambda: out.text() == "step 1\n", timeout=30, what="arylctl to print the log")
        with log.open("ab") as f:
            f.write(b"step 2\n")
        wait_for(lambda: out.text() == "step 1\nstep 2\n", timeout=10, what="arylctl to print new output")
        assert follower.poll() is None  # a running job is followed on

        # The worker's last words, then its exit as the agent reports it: the job completes.
        with log.open("ab") as f:
            f.write(b"done\n")
        agent_pb2_grpc.AgentServiceStub(agent_channel).ReportStatus(agent_pb2.ReportStatusRequest(
            server_id=SERVER, scheduler_epoch=epoch, workers=[agent_pb2.WorkerStatus(
                job_id=job_id, rank=0, incarnation=1, phase=agent_pb2.WORKER_PHASE_EXITED, exit_code=0)]),
            timeout=5)
        assert job_state(stub, job_id) == types_pb2.JOB_STATE_COMPLETED

        try:
            follower.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("arylctl logs -f kept following a completed job")
        out.join(5)
        assert follower.stderr is not None
        err = follower.stderr.read()
        assert follower.returncode == 0, err
        assert out.text() == "step 1\nstep 2\ndone\n"  # everything, once
        assert err == ""
    finally:
        agent_channel.close()
        channel.close()
        agent_logs.stop(grace=0)


# ---------------------------------------------------------------------------------------------
# events -f across a scheduler restart


def start_scheduler(procs: list[subprocess.Popen], address: str, db: Path) -> subprocess.Popen:
    proc = subprocess.Popen([str(BIN), "--listen", address, "--database-url", f"sqlite:///{db}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(proc)
    wait_for(lambda: serving(address), timeout=60, what="the scheduler to serve")
    return proc


def submit(address: str, name: str) -> str:
    done = arylctl("--server", address, "-o", "json", "submit", "--name", name, "--", "true")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["job_id"]


def printed_events(out: Lines) -> list[dict]:
    return [json.loads(line) for line in list(out.lines) if line.endswith("\n")]


def submitted(out: Lines, job_id: str) -> bool:
    return any(e["kind"] == "EVENT_KIND_JOB_SUBMITTED" and e["job_id"] == job_id for e in printed_events(out))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_events_follow_reconnects_across_a_scheduler_restart_without_duplicates_or_gaps(
    tmp_path: Path, follower_processes: list[subprocess.Popen], stop: signal.Signals
) -> None:
    address = f"127.0.0.1:{free_port()}"
    db = tmp_path / "aryl.db"
    first = start_scheduler(follower_processes, address, db)
    follower = start(follower_processes, arylctl_executable(), "--server", address, "-o", "json", "events", "-f")
    out, err = Lines(follower.stdout), Lines(follower.stderr)

    before = submit(address, "before")
    wait_for(lambda: submitted(out, before), timeout=20, what="the first job's event")
    first.send_signal(stop)
    first.wait(timeout=30)
    wait_for(lambda: "reconnecting" in err.text() or follower.poll() is not None, timeout=20,
             what="arylctl to notice the lost stream")
    assert follower.poll() is None, err.text()  # still following, not failed

    start_scheduler(follower_processes, address, db)  # same port, same database: a restart
    after = submit(address, "after")
    wait_for(lambda: submitted(out, after), timeout=30, what="the second job's event, after the restart")

    follower.send_signal(signal.SIGINT)
    follower.wait(timeout=15)
    out.join(5)
    err.join(5)
    assert follower.returncode == 0, err.text()
    notices = err.text().splitlines()
    assert len(notices) == 1, notices
    assert notices[0].startswith(f"arylctl: lost the event stream from {address}")
    assert "reconnecting, resuming after event " in notices[0] and "hint:" not in err.text()

    ids = [int(e["event_id"]) for e in printed_events(out)]
    assert ids == sorted(set(ids))  # in order, none twice
    replay = arylctl("--server", address, "-o", "json", "events")
    assert replay.returncode == 0, replay.stderr
    logged = [int(e["event_id"]) for e in json.loads(replay.stdout)]
    assert ids == logged[: len(ids)]  # none skipped: what was printed is the log up to the last one
    kinds = [e["kind"] for e in printed_events(out)]
    assert kinds.count("EVENT_KIND_SCHEDULER_STARTED") == 2  # both terms' starts, the restart's included


def test_events_follow_still_exits_3_when_no_scheduler_answers_at_the_start() -> None:
    done = arylctl("--server", f"127.0.0.1:{free_port()}", "--timeout", "5", "events", "-f")
    assert done.returncode == 3, done.stderr
    assert "hint: no scheduler answered" in done.stderr and "Traceback" not in done.stderr
