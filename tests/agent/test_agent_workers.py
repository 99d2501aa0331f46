"""The node agent's worker execution, with real processes: the supervisor driven directly with
desired states (no scheduler), the worker-log service, the job contract, and the real agent daemon
surviving its own kill -9 against the in-process fake AgentService.

Every test checks at the end that no process it started is left (any process whose environment
mentions the test's tmp_path: shims, commands and what those started).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from node_agent import contract
from node_agent.config import AgentSection
from node_agent.desired import DesiredStateTracker
from node_agent.logs import MAX_CHUNK_BYTES, OffsetPastEnd, read_chunk, serve_worker_logs
from node_agent.supervisor import Supervisor
from node_agent.workers import Phase, WorkDir, WorkerId, WorkerView, load_state, path_component
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc
from tests.harness import AGENT_RUNS_AS_ITSELF, AS_ITSELF, FakeScheduler, desired_state, desired_worker, details_of
from tests.helpers import processes_mentioning, wait_for

REPO = Path(__file__).resolve().parents[2]
TRAIN = str(REPO / "examples" / "train.py")
WAIT_S = 30.0  # generous: the test machine is small and shared


# --------------------------------------------------------------------------------------------------
# builders and probes


def train(*args: str) -> list[str]:
    return [sys.executable, TRAIN, "--step-time", "0.05", "--total-steps", "100000", "--log-every", "1000", *args]


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


@pytest.fixture
def no_orphans(tmp_path: Path) -> Iterator[None]:
    """Fails the test if a process started under tmp_path outlives it (and kills it)."""
    yield
    marker = str(tmp_path)
    try:
        wait_for(lambda: not processes_mentioning(marker), timeout=10, what="the test's processes to exit")
    except AssertionError:
        left = processes_mentioning(marker)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        pytest.fail(f"processes left behind: {left}")


class Node:
    """A supervisor and its desired-state tracker, as the agent wires them."""

    def __init__(self, work_dir: Path, **config: object) -> None:
        settings = {"hostname": "w-node", "work_dir": str(work_dir), "stop_grace_s": 5.0, "reconcile_interval_s": 0.05}
        self.config = AgentSection(**{**settings, **config})
        self.tracker = DesiredStateTracker()
        self.supervisor = Supervisor(self.config, self.tracker, users=AS_ITSELF)
        self.supervisor.start()
        self.closed = False

    def offer(self, state: agent_pb2.DesiredState) -> None:
        if self.tracker.offer(state).accepted:
            self.supervisor.wake()

    def status(self, job: str = "job-a", rank: int = 0, incarnation: int = 1) -> WorkerView | None:
        wanted = WorkerId(job, rank, incarnation)
        return next((v for v in self.supervisor.statuses() if v.id == wanted), None)

    def wait_phase(self, phase: Phase, **identity: Any) -> WorkerView:
        return wait_for(
            lambda: (view := self.status(**identity)) is not None and view.phase is phase and view,
            timeout=WAIT_S,
            what=f"{identity or 'the worker'} to be {phase}",
        )

    def pid(self, job: str = "job-a", rank: int = 0, incarnation: int = 1) -> int:
        wanted = WorkerId(job, rank, incarnation)
        (worker,) = [w for w in load_state(self.supervisor.layout.state_file) if w.id == wanted]
        return worker.pid

    def close(self, *, stop_workers: bool) -> None:
        if not self.closed:
            self.closed = True
            self.supervisor.close(stop_workers=stop_workers)


@pytest.fixture
def nodes(tmp_path: Path, no_orphans: None) -> Iterator[Callable[..., Node]]:
    """Make supervisors on ``tmp_path/agent``; every one still open is closed, stopping its workers."""
    made: list[Node] = []

    def make(**config: object) -> Node:
        made.append(Node(tmp_path / "agent", **config))
        return made[-1]

    yield make
    for node in reversed(made):
        node.close(stop_workers=True)


def log_headers(node: Node, job: str = "job-a", rank: int = 0) -> list[str]:
    path = node.supervisor.layout.log_file(job, rank)
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if line.startswith("===== ")]


def assert_group_gone(pgid: int) -> None:
    """No live process is left in group ``pgid`` (zombies of a killed agent count as gone: whoever
    adopted them reaps them, and this machine's init may be slow to)."""
    wait_for(lambda: not live_group_members(pgid), timeout=10, what=f"process group {pgid} to be gone")


def live_group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def reap(node: Node) -> None:
    """Wait for the shims a closed in-process supervisor started: a killed agent's children are
    reaped by init, but these are still this test process's children."""
    for popen in node.supervisor._popens.values():
        popen.wait(timeout=WAIT_S)


# --------------------------------------------------------------------------------------------------
# starting workers


DUMP_ENV = "import json, os, sys, time; json.dump(dict(os.environ), open(sys.argv[1], 'w')); time.sleep(600)"


def test_a_worker_starts_with_the_job_contract_environment(nodes, tmp_path: Path) -> None:
    node = nodes()
    dump = tmp_path / "env.json"
    worker = desired_worker(
        python(DUMP_ENV, str(dump)), job="job-env", rank=1, world_size=4, gpus=(2, 3), incarnation=7,
        env={"LEARNING_RATE": "0.1", "RANK": "99"},  # the job cannot override the contract
    )
    node.offer(desired_state(1, worker))
    view = node.wait_phase(Phase.RUNNING, job="job-env", rank=1, incarnation=7)
    env = wait_for(lambda: dump.exists() and dump.stat().st_size and json.loads(dump.read_text()), what="env dump")

    work = tmp_path / "agent"
    assert {k: env[k] for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
    }
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["ARYL_JOB_ID"] == "job-env" and env["ARYL_INCARNATION"] == "7"
    assert env["ARYL_CHECKPOINT_DIR"] == str(work / "checkpoints" / "job-env")
    assert Path(env["ARYL_CHECKPOINT_DIR"]).is_dir()
    assert env["ARYL_PROGRESS_FILE"].startswith(str(work / "run"))
    assert env["LEARNING_RATE"] == "0.1" and env["PATH"] == "/usr/local/bin:/usr/bin:/bin"  # a minimal base
    assert not {"VIRTUAL_ENV", "PYTEST_CURRENT_TEST"} & env.keys()  # none of the agent's environment
    assert view.exit_code == 0 and not view.stop_requested
    assert node.supervisor.observed_generation == 1
    (header,) = log_headers(node, "job-env", 1)
    assert "incarnation 7, rank 1 of world size 4, GPUs [2,3]" in header and "env.json" in header


def test_the_checkpoint_root_is_configurable(nodes, tmp_path: Path) -> None:
    node = nodes(checkpoint_root=str(tmp_path / "shared-fs"))
    dump = tmp_path / "env.json"
    node.offer(desired_state(1, desired_worker(python(DUMP_ENV, str(dump)))))
    env = wait_for(lambda: dump.exists() and dump.stat().st_size and json.loads(dump.read_text()), what="env dump")
    assert env["ARYL_CHECKPOINT_DIR"] == str(tmp_path / "shared-fs" / "job-a")


def test_a_command_that_cannot_start_is_reported_not_fatal(nodes) -> None:
    node = nodes()
    node.offer(desired_state(1, desired_worker(["/no/such/command"]), desired_worker([], job="job-b"),
                             desired_worker(["true"], job="", gpus=(1,))))
    missing = node.wait_phase(Phase.EXITED)
    assert missing.exit_code == 127 and "command not found: /no/such/command" in missing.message
    empty = node.wait_phase(Phase.EXITED, job="job-b")
    assert empty.exit_code == 127 and empty.message == "cannot start the worker: the desired state gives no command"
    assert node.wait_phase(Phase.EXITED, job="").message == "cannot start the worker: the desired state gives no job id"
    time.sleep(0.3)  # several reconcile passes: none is retried
    assert len(log_headers(node)) == 1


# --------------------------------------------------------------------------------------------------
# stopping workers


def test_sigterm_makes_the_worker_checkpoint_and_exit(nodes, tmp_path: Path) -> None:
    node = nodes()
    node.offer(desired_state(1, desired_worker(train())))
    wait_for(lambda: (v := node.status()) and v.progress.progress >= 5, timeout=WAIT_S, what="5 steps of progress")
    pgid = node.pid()
    node.offer(desired_state(2))  # the job is no longer desired here
    view = node.wait_phase(Phase.EXITED)
    assert view.exit_code == 0 and view.stop_requested
    assert "stopped by the agent (SIGTERM): exited with status 0" in view.message
    checkpoint = json.loads((tmp_path / "agent" / "checkpoints" / "job-a" / "checkpoint.json").read_text())
    assert checkpoint["step"] >= 5 and view.progress.checkpoint_progress == checkpoint["step"]
    assert_group_gone(pgid)
    # Reported once as EXITED (just above), then forgotten.
    wait_for(lambda: not node.supervisor.statuses(), what="the stopped worker to be dropped from reports")
    assert node.supervisor.observed_generation == 2


def test_a_worker_ignoring_sigterm_is_killed_after_its_grace_period(nodes) -> None:
    node = nodes()
    node.offer(desired_state(1, desired_worker(train("--ignore-sigterm"), grace_s=0.8)))
    node.wait_phase(Phase.RUNNING)
    wait_for(lambda: node.status().progress.progress >= 1, timeout=WAIT_S, what="the worker to run")
    stopped_at = time.monotonic()
    node.offer(desired_state(2))
    node.wait_phase(Phase.STOPPING)
    # Reports go on during the grace period: statuses() does not wait for the process.
    started = time.monotonic()
    assert node.status().phase is Phase.STOPPING
    assert time.monotonic() - started < 0.2
    view = node.wait_phase(Phase.EXITED)
    assert time.monotonic() - stopped_at >= 0.8
    assert view.exit_code == -signal.SIGKILL and view.stop_requested
    assert view.message == "killed with SIGKILL after the 0.8 s grace period"


def test_a_crash_is_reported_with_its_exit_status_and_not_restarted(nodes) -> None:
    node = nodes()
    state = desired_state(1, desired_worker(train("--fail-at-step", "3")))
    node.offer(state)
    view = node.wait_phase(Phase.EXITED)
    assert (view.exit_code, view.message, view.stop_requested) == (3, "exited with status 3", False)
    time.sleep(0.3)  # several reconcile passes, and the same state again
    node.supervisor.reconcile()
    node.offer(state)
    assert node.status().phase is Phase.EXITED  # still desired: still reported
    assert len(log_headers(node)) == 1  # started once


def test_a_new_incarnation_starts_only_after_the_old_one_exited(nodes) -> None:
    node = nodes()
    node.offer(desired_state(1, desired_worker(train("--ignore-sigterm"), incarnation=1, grace_s=1.0)))
    wait_for(lambda: (v := node.status()) and v.progress.progress >= 1, timeout=WAIT_S, what="SIGTERM ignored")
    node.offer(desired_state(2, desired_worker(train(), incarnation=2, world_size=2)))  # e.g. a resize
    node.wait_phase(Phase.STOPPING, incarnation=1)
    waiting = node.status(incarnation=2)
    assert waiting.phase is Phase.STARTING and "waiting for worker job-a/rank-0/inc-1" in waiting.message
    old = node.wait_phase(Phase.EXITED, incarnation=1)
    assert old.stop_requested and old.exit_code == -signal.SIGKILL
    node.wait_phase(Phase.RUNNING, incarnation=2)
    headers = log_headers(node)
    assert len(headers) == 2 and "incarnation 2, rank 0 of world size 2" in headers[1]


def test_another_job_waits_for_the_gpus_it_shares_with_a_stopping_worker(nodes) -> None:
    node = nodes()
    node.offer(desired_state(1, desired_worker(train("--ignore-sigterm"), job="victim", gpus=(0, 1), grace_s=1.0)))
    wait_for(lambda: (v := node.status(job="victim")) and v.progress.progress >= 1, timeout=WAIT_S, what="victim")
    node.offer(desired_state(2, desired_worker(train(), job="winner", gpus=(1,))))  # preemption
    assert node.wait_phase(Phase.STARTING, job="winner").message.startswith("waiting for worker victim/")
    node.wait_phase(Phase.RUNNING, job="winner")
    assert node.status(job="victim") is None or node.status(job="victim").phase is Phase.EXITED


def test_duplicated_and_reordered_desired_states_have_exactly_one_effect(nodes) -> None:
    node = nodes()
    one = desired_state(1, desired_worker(train()))
    two = desired_state(2, desired_worker(train()), desired_worker(train(), rank=1, gpus=(1,)))
    for state in (one, one, two, one, two, desired_state(1), two):  # duplicates and late deliveries
        node.offer(state)
        node.supervisor.reconcile()  # as if the reconciler ran between deliveries
    node.wait_phase(Phase.RUNNING, rank=0)
    node.wait_phase(Phase.RUNNING, rank=1)
    time.sleep(0.3)
    assert len(log_headers(node, rank=0)) == 1 and len(log_headers(node, rank=1)) == 1
    assert node.supervisor.observed_generation == 2


def test_closing_with_stop_workers_stops_them_and_leaves_no_process_group(nodes) -> None:
    node = nodes()
    node.offer(desired_state(1, desired_worker(train()), desired_worker(train("--ignore-sigterm"), rank=1,
                                                                       gpus=(1,), grace_s=0.5)))
    node.wait_phase(Phase.RUNNING, rank=0)
    node.wait_phase(Phase.RUNNING, rank=1)
    pgids = [node.pid(rank=0), node.pid(rank=1)]
    node.close(stop_workers=True)
    for pgid in pgids:  # the worker killed after its grace may linger as a zombie until init reaps it
        assert_group_gone(pgid)


def test_a_worker_leaves_no_processes_behind_when_it_exits(nodes, tmp_path: Path) -> None:
    # The command starts a grandchild and exits; the shim kills the grandchild.
    spawn = "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])"
    node = nodes()
    node.offer(desired_state(1, desired_worker(python(spawn))))
    assert node.wait_phase(Phase.EXITED).exit_code == 0
    assert_group_gone(node.pid())


# --------------------------------------------------------------------------------------------------
# agent restart: adoption through the state file and the shim's exit record


def test_a_restarted_supervisor_adopts_running_workers_and_can_stop_them(nodes, tmp_path: Path) -> None:
    first = nodes()
    state = desired_state(1, desired_worker(train()))
    first.offer(state)
    first.wait_phase(Phase.RUNNING)
    pid = first.pid()
    first.close(stop_workers=False)  # the agent goes away; its workers do not

    second = nodes()
    assert second.status().phase is Phase.RUNNING and second.pid() == pid
    time.sleep(0.3)  # no desired state yet: nothing is stopped meanwhile
    assert second.status().phase is Phase.RUNNING
    wait_for(lambda: second.status().progress.progress >= 2, timeout=WAIT_S, what="progress of the adopted worker")
    second.offer(state)  # the same state again: no second start
    second.supervisor.reconcile()
    assert len(log_headers(second)) == 1
    second.offer(desired_state(2))
    view = second.wait_phase(Phase.EXITED)
    assert view.stop_requested and view.exit_code == 0  # recorded by the shim, not the agent's child
    reap(first)
    assert_group_gone(pid)


def test_exit_statuses_of_workers_that_ended_while_no_agent_ran_are_recovered(nodes) -> None:
    first = nodes()
    state = desired_state(1, desired_worker(train("--fail-at-step", "20")))
    first.offer(state)
    first.wait_phase(Phase.RUNNING)
    pid = first.pid()
    first.close(stop_workers=False)
    reap(first)  # the worker fails at step 20, while no supervisor runs

    second = nodes()
    view = second.wait_phase(Phase.EXITED)
    assert (view.exit_code, view.message, view.stop_requested) == (3, "exited with status 3", False)
    second.offer(state)  # still desired: reported, not restarted
    second.supervisor.reconcile()
    assert second.status().phase is Phase.EXITED and len(log_headers(second)) == 1
    assert_group_gone(pid)


def test_an_unreadable_state_file_is_moved_aside(nodes, tmp_path: Path) -> None:
    run = tmp_path / "agent" / "run"
    run.mkdir(parents=True)
    (run / "workers.json").write_text("{not json")
    node = nodes()
    assert node.supervisor.statuses() == []
    assert [p.name.startswith("workers.unreadable-") for p in run.iterdir()].count(True) == 1


# --------------------------------------------------------------------------------------------------
# the real agent daemon: kill -9, restart, adopt, stop, logs


def start_agent(scheduler_port: int, work_dir: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env.update(ARYL_AGENT__RECONCILE_INTERVAL_S="0.1", ARYL_AGENT__STOP_GRACE_S="10", ARYL_LOGGING__LEVEL="info",
               ARYL_AGENT__INSECURE="true", **AGENT_RUNS_AS_ITSELF)  # the FakeScheduler listens in plaintext
    args = [sys.executable, "-m", "node_agent.main", "--scheduler", f"127.0.0.1:{scheduler_port}",
            "--hostname", "w-agent", "--fake-gpus", "2", "--work-dir", str(work_dir)]
    with log_path.open("ab") as log:
        return subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def reported_worker(
    scheduler: FakeScheduler, check: Callable[[agent_pb2.WorkerStatus], bool], *, since: int | None = None
) -> agent_pb2.WorkerStatus | None:
    """A worker status that passes ``check`` in the last report, or in any report from ``since`` on."""
    reports = list(scheduler.service.reports)
    recent = reports[-1:] if since is None else reports[since:]
    return next((w for report in recent for w in report.workers if check(w)), None)


def test_the_agent_daemon_survives_kill_9_and_adopts_its_workers(tmp_path: Path, no_orphans: None) -> None:
    scheduler = FakeScheduler(epoch=5)
    work_dir, log_path = tmp_path / "agent", tmp_path / "agent.log"
    agents: list[subprocess.Popen[bytes]] = []
    try:
        agents.append(start_agent(scheduler.port, work_dir, log_path))
        scheduler.service.push(desired_state(1, desired_worker(train()), epoch=5))
        running = wait_for(
            lambda: reported_worker(scheduler, lambda w: w.phase == agent_pb2.WORKER_PHASE_RUNNING and w.progress >= 2),
            timeout=WAIT_S, what=f"a running worker in the reports; agent log:\n{log_path.read_text()[-2000:]}",
        )
        assert (running.job_id, running.rank, running.incarnation) == ("job-a", 0, 1)
        registration = scheduler.service.registrations[0]
        assert registration.logs_address.startswith("w-agent:")
        check_log_service(int(registration.logs_address.rsplit(":", 1)[1]))

        agents[0].kill()  # kill -9: no cleanup at all
        agents[0].wait()
        (worker,) = load_state(work_dir / "run" / "workers.json")
        assert live_group_members(worker.pid), "the worker must outlive the agent"

        reports_before = len(scheduler.service.reports)
        agents.append(start_agent(scheduler.port, work_dir, log_path))
        wait_for(lambda: len(scheduler.service.registrations) == 2, timeout=WAIT_S, what="re-registration")
        wait_for(lambda: len(scheduler.service.reports) > reports_before + 2, timeout=WAIT_S, what="new reports")
        adopted = reported_worker(scheduler, lambda w: w.job_id == "job-a")
        assert adopted is not None
        assert adopted.phase == agent_pb2.WORKER_PHASE_RUNNING and adopted.progress >= running.progress

        def stopped() -> agent_pb2.WorkerStatus | None:
            scheduler.service.push(desired_state(2, epoch=5))  # duplicates are harmless; one may be lost
            return reported_worker(scheduler, lambda w: w.phase == agent_pb2.WORKER_PHASE_EXITED, since=0)

        exited = wait_for(stopped, timeout=WAIT_S, interval=0.3, what="the adopted worker to be stopped")
        assert exited.stop_requested and exited.exit_code == 0 and exited.checkpoint_progress >= 2
        assert_group_gone(worker.pid)
        wait_for(lambda: not scheduler.service.reports[-1].workers, what="the stopped worker to leave the reports")
        assert scheduler.service.reports[-1].observed_generation == 2
        assert len([line for line in (work_dir / "logs" / "job-a" / "rank-0.log").read_text().splitlines()
                    if line.startswith("===== ")]) == 1

        agents[1].send_signal(signal.SIGTERM)
        assert agents[1].wait(timeout=15) == 0
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        scheduler.stop()


def check_log_service(port: int) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = agent_pb2_grpc.WorkerLogServiceStub(channel)
        chunk = stub.ReadWorkerLog(agent_pb2.ReadWorkerLogRequest(job_id="job-a", rank=0), timeout=5)
        assert chunk.data.startswith(b"===== ") and chunk.offset == 0 and chunk.next_offset == len(chunk.data)
        with pytest.raises(grpc.RpcError) as missing:
            stub.ReadWorkerLog(agent_pb2.ReadWorkerLogRequest(job_id="job-zz", rank=0), timeout=5)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND and "job-zz" in details_of(missing.value)


# --------------------------------------------------------------------------------------------------
# the worker-log service and the on-disk layout


def test_log_chunks_from_offsets_tails_and_limits(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    path.write_bytes(b"0123456789")
    assert read_chunk(path, 0, 4).data == b"0123"
    chunk = read_chunk(path, 4, 0)
    assert (chunk.data, chunk.offset, chunk.next_offset, chunk.size) == (b"456789", 4, 10, 10)
    assert read_chunk(path, -3, 0).data == b"789"
    assert read_chunk(path, -100, 0).data == b"0123456789"  # clamped to the start
    assert read_chunk(path, 10, 0).data == b""  # at the end: nothing new yet
    with pytest.raises(OffsetPastEnd, match="past the end"):
        read_chunk(path, 11, 0)
    path.write_bytes(b"x" * (MAX_CHUNK_BYTES + 10))
    assert len(read_chunk(path, 0, 1 << 30).data) == MAX_CHUNK_BYTES


def test_the_log_service_answers_with_typed_errors(tmp_path: Path) -> None:
    layout = WorkDir(tmp_path, tmp_path / "checkpoints")
    log = layout.log_file("job/../x", 2)
    log.parent.mkdir(parents=True)
    log.write_bytes(b"hello\n")
    server, port = serve_worker_logs(layout, "w-node", "127.0.0.1", 0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = agent_pb2_grpc.WorkerLogServiceStub(channel)
            read = lambda **kw: stub.ReadWorkerLog(agent_pb2.ReadWorkerLogRequest(**kw), timeout=5)  # noqa: E731
            assert read(job_id="job/../x", rank=2, offset=-3).data == b"lo\n"
            for request, code in (
                ({"job_id": "job/../x", "rank": 1}, grpc.StatusCode.NOT_FOUND),
                ({"job_id": "", "rank": 0}, grpc.StatusCode.INVALID_ARGUMENT),
                ({"job_id": "job/../x", "rank": 2, "offset": 99}, grpc.StatusCode.OUT_OF_RANGE),  # may grow
            ):
                with pytest.raises(grpc.RpcError) as error:
                    read(**request)
                assert error.value.code() == code, request
    finally:
        server.stop(grace=0)


def test_job_ids_cannot_escape_their_directory() -> None:
    assert path_component("job-1_a.b") == "job-1_a.b"
    assert "/" not in path_component("../../etc/passwd")
    assert path_component("..") == "%2E."
    assert path_component("") == "%"


def test_report_progress_writes_what_the_agent_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "progress.json"
    monkeypatch.setenv(contract.PROGRESS_FILE, str(target))
    contract.report_progress(12, samples_per_second=3.5, checkpoint_progress=10)
    assert contract.read_progress(target) == contract.Progress(12.0, 3.5, 10.0)
    assert list(tmp_path.iterdir()) == [target]  # no temporary file left
    target.write_text("{half")
    assert contract.read_progress(target) is None
    monkeypatch.delenv(contract.PROGRESS_FILE)
    contract.report_progress(1)  # outside Aryl: nowhere to write, no error


def test_the_work_directory_defaults_per_hostname_and_is_set_by_flag_or_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from node_agent.config import load_agent_config
    from node_agent.main import cli_overrides, parse_args

    for name in [n for n in os.environ if n.startswith("ARYL_")]:
        monkeypatch.delenv(name)
    default = load_agent_config(overrides={"agent": {"hostname": "gpu-07"}}).agent
    assert default.work_path == Path(".aryl/agent-gpu-07").resolve()
    assert default.checkpoint_path == default.work_path / "checkpoints"
    assert (default.stop_grace_s, default.stop_workers_on_exit, default.logs_port) == (30.0, False, 0)
    monkeypatch.setenv("ARYL_AGENT__CHECKPOINT_ROOT", str(tmp_path / "shared"))
    flagged = load_agent_config(overrides=cli_overrides(parse_args(["--work-dir", str(tmp_path / "w")]))).agent
    assert flagged.work_path == tmp_path / "w" and flagged.checkpoint_path == tmp_path / "shared"
