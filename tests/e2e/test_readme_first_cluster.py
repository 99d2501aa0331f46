"""The README's "first cluster by hand" runs as written (issue 36): the block between its
``first-cluster:begin`` and ``first-cluster:end`` comments, taken from README.md and run verbatim by
``bash -e`` from the clone, must end with a COMPLETED job and its log.

It runs as the current user (root on CI: then the agent runs the job as alice's uid from the
``pki/users`` that ``arylctl certs init`` wrote, never as root) and, when this test runs as root and
the machine allows it, once more as an unprivileged user (``nobody``), whose agent cannot switch and
runs the job as itself. What the block needs from outside is only what a user's shell has: ``TMPDIR``
(where ``mktemp -d`` makes the cluster's folder: a scratch directory here), ``XDG_CONFIG_HOME``
(where ``arylctl login`` keeps the token, so the test never writes to a real home) and ``ARYL_PORT``
(a free port instead of 50051). Waits are the block's own (it polls until the agent registered);
the test bounds the whole run, stretched by ARYL_TEST_TIMEOUT_FACTOR, and pytest-timeout dumps every
thread's stack if it hangs.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from node_agent.identity import closed_directory
from tests.helpers import free_port, processes_mentioning, scaled_timeout, wait_for

REPO = Path(__file__).resolve().parents[2]
BEGIN, END = "<!-- first-cluster:begin", "<!-- first-cluster:end -->"
RUN_LIMIT_S = 300.0  # the whole block on an idle machine takes ~10-20 s; scaled_timeout stretches it


def first_cluster_block(readme: str) -> str:
    """The shell text of the marked block: the one fenced ``sh`` block between the two comments."""
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, "README.md marks one first-cluster block"
    marked = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    fences = re.findall(r"^```sh\n(.*?)^```$", marked, flags=re.S | re.M)
    assert len(fences) == 1, "the first-cluster markers enclose one ```sh block"
    return fences[0]


def unprivileged_account() -> tuple[pwd.struct_passwd | None, str]:
    """The account the second run uses, or None and why it cannot run here."""
    if os.geteuid() != 0:
        return None, "the unprivileged run needs a root test to switch to another user"
    try:
        account = pwd.getpwnam("nobody")
    except KeyError:
        return None, "this machine has no user 'nobody'"
    python = Path(os.path.realpath(REPO / ".venv" / "bin" / "python"))
    for needed in (REPO / ".venv" / "bin", python.parent):
        if (closed := closed_directory(needed)) is not None:
            return None, (f"user nobody cannot run this checkout's commands: {needed} lies under {closed}, "
                          "which only its owner may enter (a clone or an interpreter in root's home)")
    return account, ""


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory every uid can reach (pytest's tmp_path is under a 0700 directory of root's); the
    cluster's processes are stopped and the directory removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="aryl-readme-"))
    path.chmod(0o711)
    yield path
    stop_processes_of(path)
    shutil.rmtree(path, ignore_errors=True)


def stop_processes_of(path: Path) -> None:
    """SIGTERM to what the block left running (agent, scheduler: their environment names ``path``),
    as ``kill %2 %1`` would; SIGKILL to what is still there after the wait."""
    for pid in processes_mentioning(str(path)):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        wait_for(lambda: not processes_mentioning(str(path)), timeout=30, what="the cluster's processes to exit")
    except AssertionError:
        for pid in processes_mentioning(str(path)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        raise


def run_block(scratch: Path, account: pwd.struct_passwd | None = None) -> tuple[subprocess.CompletedProcess[str],
                                                                                 Path]:
    """Run the README's block from the clone with ``bash -e``; returns the run and the cluster's folder."""
    script = scratch / "first-cluster.sh"
    script.write_text(first_cluster_block((REPO / "README.md").read_text(encoding="utf-8")), encoding="utf-8")
    tmp = scratch / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ARYL_", "VIRTUAL_ENV", "PYTHON")) or k == "ARYL_TEST_TIMEOUT_FACTOR"}
    env.update(TMPDIR=str(tmp), XDG_CONFIG_HOME=str(scratch / "config"), ARYL_PORT=str(free_port()))
    switch: dict[str, Any] = {}  # subprocess.run's user, group and extra_groups
    if account is not None:
        for path in (scratch, tmp, script):
            os.chown(path, account.pw_uid, account.pw_gid)
        env.update(HOME=str(scratch), USER=account.pw_name, LOGNAME=account.pw_name)
        switch = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
    try:
        done = subprocess.run(["bash", "-e", str(script)], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=scaled_timeout(RUN_LIMIT_S), check=False, **switch)
    except subprocess.TimeoutExpired as exc:
        output = "\n".join(o.decode(errors="replace") if isinstance(o, bytes) else o or ""
                           for o in (exc.stdout, exc.stderr))
        raise AssertionError(f"the README's block did not finish:\n{output}\n{cluster_logs(tmp)}") from exc
    [folder] = tmp.iterdir()
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{cluster_logs(tmp)}"
    return done, folder


def cluster_logs(tmp: Path) -> str:
    return "\n".join(f"--- {log}:\n{log.read_text(errors='replace')[-3000:]}" for log in sorted(tmp.glob("*/*.log")))


def check_completed_with_its_log(done: subprocess.CompletedProcess[str], uid: int) -> None:
    out = done.stdout
    hello = f"hello from rank 0 as uid {uid}"
    # submit --wait: the log as it runs, then the outcome; `arylctl jobs`; `arylctl logs 1`.
    assert "job 1 COMPLETED" in done.stderr, done.stderr
    assert re.search(r"^1\s+hello\s+alice\s+default\s+COMPLETED\s", out, flags=re.M), out
    assert out.count(hello) == 2, out  # the log under --wait, and again from `arylctl logs 1`
    assert "aryl-agent: incarnation 1, rank 0 of world size 1" in out.rsplit("COMPLETED", 1)[1], out


@pytest.mark.timeout(int(scaled_timeout(600)))
def test_the_readme_first_cluster_runs_as_written(scratch: Path) -> None:
    done, folder = run_block(scratch)
    if os.geteuid() == 0:  # the agent ran as root: the job ran as alice's uid from pki/users, not as root
        line = next(ln for ln in (folder / "pki" / "users").read_text().splitlines() if ln.startswith("alice:"))
        uid = int(line.split(":")[1])
        assert uid != 0
    else:
        uid = os.geteuid()
    check_completed_with_its_log(done, uid)


@pytest.mark.timeout(int(scaled_timeout(600)))
def test_the_readme_first_cluster_runs_as_an_unprivileged_user(scratch: Path) -> None:
    account, why = unprivileged_account()
    if account is None:
        pytest.skip(why)
    done, _ = run_block(scratch, account)
    check_completed_with_its_log(done, account.pw_uid)
