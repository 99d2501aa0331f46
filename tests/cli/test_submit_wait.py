"""``arylctl submit --wait`` as a user runs it: the installed ``arylctl`` (a real process, stopped with a
real SIGINT) against a real scheduler (on PostgreSQL) and a real ``aryl-agent`` daemon.

It prints the job's log (rank 0) as ``logs -f`` does, from when the job starts until it ends, then
the outcome on stderr, and exits 0 when the job COMPLETED, 1 when it FAILED or was CANCELLED; Ctrl-C
detaches (130) without cancelling, saying how to follow the job again and how to cancel it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from protos.aryl.v1 import types_pb2
from scheduler_service.server import serve_in_background
from tests.fixtures.cli import Lines, arylctl_executable, ctl
from tests.fixtures.cluster import Node
from tests.harness import scheduler_config
from tests.helpers import wait_for


@pytest.fixture
def node(postgres_url: str, tmp_path: Path) -> Iterator[Node]:
    scheduler = serve_in_background(scheduler_config(postgres_url))
    agent = Node(scheduler.address, tmp_path)
    yield agent
    agent.close()
    scheduler.stop()


def program(*lines: str) -> list[str]:
    return [sys.executable, "-c", "; ".join(lines)]


def waiting(node: Node, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [arylctl_executable(), "--server", node.address, "submit", "--wait", "--poll", "0.1", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err


def worker_output(out: str) -> list[str]:
    """The worker's lines of a log, without the agent's ``=====`` header."""
    return [line for line in out.splitlines() if not line.startswith("===== ")]


@pytest.mark.postgres
def test_wait_prints_the_log_and_exits_0_when_the_job_completes(node: Node) -> None:
    code, out, err = finish(waiting(node, "--name", "ok", "--", *program("print('step 1')", "print('done')")))
    assert code == 0, err
    assert worker_output(out) == ["step 1", "done"]
    assert out.startswith("===== ")  # the log as logs -f prints it, from its start
    first, *_, last = err.splitlines()
    assert first.startswith("job 1 (ok) submitted; its log (rank 0) follows until it ends")
    assert last == "job 1 COMPLETED: all 1 worker(s) exited 0"


@pytest.mark.postgres
def test_wait_exits_1_when_the_job_fails(node: Node) -> None:
    proc = waiting(node, "--name", "crash", "--restart-policy", "never",
                   "--", *program("print('about to fail')", "raise SystemExit(3)"))
    code, out, err = finish(proc)
    assert code == 1, err
    assert worker_output(out) == ["about to fail"]
    assert err.splitlines()[-1].startswith("job 1 FAILED: rank 0 failed (exited with status 3)")


@pytest.mark.postgres
def test_wait_exits_1_when_the_job_is_cancelled_before_it_starts(node: Node) -> None:
    # Job 1 holds both GPUs of the node: job 2 waits, and says so once.
    blocker = ctl(node.address, "submit", "--name", "blocker", "--gpus-per-worker", "2",
                  "--", *program("import time", "time.sleep(120)"), cwd=Path.cwd())
    assert blocker.returncode == 0, blocker.stderr
    wait_for(lambda: node.client.get_job("1").job.state == types_pb2.JOB_STATE_RUNNING, timeout=30,
             what="the blocker to run")
    proc = waiting(node, "--name", "waits", "--", "true")
    notes = Lines(proc.stderr)
    wait_for(lambda: "job 2 is PENDING" in notes.text(), timeout=30, what="the pending note")
    assert ctl(node.address, "cancel", "2", "--reason", "no room", cwd=Path.cwd()).returncode == 0
    try:
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    notes.join(5)
    assert proc.returncode == 1, notes.text()
    assert out == ""  # it never ran: no log
    assert notes.text().count("is PENDING") == 1
    assert notes.lines[-1] == "job 2 CANCELLED: no room\n"


@pytest.mark.postgres
def test_ctrl_c_detaches_without_cancelling_and_says_how_to_reattach_or_cancel(node: Node) -> None:
    proc = waiting(node, "--name", "long",
                   "--", *program("import time", "print('started', flush=True)", "time.sleep(120)"))
    out = Lines(proc.stdout)
    try:
        wait_for(lambda: "started\n" in out.text(), timeout=30, what=f"the worker's output; agent:\n{node.agent_log()}")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130, err
    assert err.splitlines()[-1] == (
        f"detached: job 1 keeps running. Follow it again: arylctl --server {node.address} logs -f 1; "
        f"cancel it: arylctl --server {node.address} cancel 1"
    )
    assert "Traceback" not in err
    assert node.client.get_job("1").job.state == types_pb2.JOB_STATE_RUNNING  # not cancelled


def test_wait_refuses_o_json_before_submitting(scheduler) -> None:
    result = subprocess.run(
        [arylctl_executable(), "--server", scheduler.address, "-o", "json", "submit", "--wait", "--name", "x",
         "--", "true"], capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: --wait prints the job's log")
    assert ctl(scheduler.address, "-o", "json", "jobs", cwd=Path.cwd()).stdout.strip() == "[]"
