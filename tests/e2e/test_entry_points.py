"""Every Aryl executable, run as a user runs it: how it ends when it cannot go on (one line on
stderr, exit 2 for bad input or configuration, 3 for an unreachable dependency; ``aryl_common.entry``),
``--version``, and daemon settings that a client's ``ARYL_SERVER`` in the same shell cannot break.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from inference_router.config import load_router_config
from node_agent.config import load_agent_config
from scheduler_service.config import load_config
from tests.fixtures.daemons import serving
from tests.harness import postgres_admin_url, security_env
from tests.helpers import free_port, terminating, wait_for

BIN = Path(sys.executable).parent
EXECUTABLES = ("aryl-scheduler", "aryl-agent", "aryl-router", "arylctl", "aryl-sim", "aryl-demo")


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without any ARYL_ variable (a developer's shell may export some), but with
    the test session's TLS files and token (``tests.harness.security_env``): security is on by default."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}, **security_env(), **extra}


def run(name: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # check=False: each test asserts the exit status itself.
    return subprocess.run([str(BIN / name), *argv], capture_output=True, text=True, timeout=120,
                          env=env if env is not None else clean_env(), check=False)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed run, after checking there is exactly one and no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port something else listens on for the test's duration."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def scheduler_started_events(db: Path) -> list[str]:
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("SELECT message FROM events WHERE kind = 'SCHEDULER_STARTED'")]


# ---------------------------------------------------------------------------------------------
# ARYL_SERVER: the client's variable, never a daemon setting


def test_scheduler_starts_with_the_clients_aryl_server_exported_and_arylctl_reads_it(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    # As docs/configuration.md has it: ARYL_SERVER exported in the shell that starts the scheduler; the
    # scheduler's own [server] keys still come from ARYL_SERVER__<KEY>.
    env = clean_env(ARYL_SERVER=address, ARYL_SERVER__LISTEN=address,
                    ARYL_DATABASE__URL=f"sqlite:///{tmp_path / 'aryl.db'}")
    proc = subprocess.Popen([str(BIN / "aryl-scheduler")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, text=True)
    with terminating(proc) as stop:
        wait_for(lambda: proc.poll() is not None or serving(address), timeout=60, what="the scheduler to serve")
        assert proc.poll() is None, proc.communicate()[0]
        cluster = run("arylctl", "cluster", env=env)  # no --server: the address comes from ARYL_SERVER
        assert cluster.returncode == 0, cluster.stderr
        output = stop()
    assert proc.returncode == 0, output
    assert "scheduler started" in output


def test_daemon_settings_ignore_variables_that_name_a_whole_section(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ARYL_"):
            monkeypatch.delenv(name)
    # Every section of every daemon, named whole, as a client or a user might export it.
    for section in ("SERVER", "DATABASE", "SCHEDULING", "POLICY", "AGENTS", "LOGGING", "AGENT", "GPUS", "ROUTER"):
        monkeypatch.setenv(f"ARYL_{section}", "127.0.0.1:50051")
    monkeypatch.setenv("ARYL_SERVER__LISTEN", "127.0.0.1:6000")
    monkeypatch.setenv("ARYL_AGENT__HOSTNAME", "gpu-7")
    monkeypatch.setenv("ARYL_ROUTER__SERVERS_NEEDED", "2")
    monkeypatch.setenv("ARYL_ROUTER__STATIC_BACKENDS", '["http://127.0.0.1:1"]')
    monkeypatch.setenv("ARYL_ROUTER__SCHEDULER_ADDRESS", "")
    assert load_config().server.listen == "127.0.0.1:6000"
    assert load_agent_config().agent.hostname == "gpu-7"
    router = load_router_config().router
    assert router.servers_needed == 2 and router.static_backends == ["http://127.0.0.1:1"]


# ---------------------------------------------------------------------------------------------
# One line and an exit status instead of a traceback


def test_arylctl_refuses_a_negative_reclaim_count_as_a_usage_error() -> None:
    result = run("arylctl", "--server", f"127.0.0.1:{free_port()}", "reclaim-preview", "-1")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # argparse's usual invalid-input message: the usage, then the argument and what it expects.
    assert result.stderr.strip().splitlines()[-1] == (
        "arylctl reclaim-preview: error: argument N: expected an integer >= 0, got '-1'"
    )


def test_scheduler_pointed_at_a_missing_database_exits_3_in_one_line(tmp_path: Path) -> None:
    missing = make_url(postgres_admin_url()).set(database=f"aryl_missing_{uuid.uuid4().hex[:8]}")
    result = run("aryl-scheduler", "--listen", f"127.0.0.1:{free_port()}",
                 "--database-url", missing.render_as_string(hide_password=False))
    assert result.returncode == 3
    line = one_line_error(result)
    assert line.startswith(f"aryl-scheduler: cannot reach the database {missing.render_as_string()}: ")
    assert "--database-url" in line


def test_scheduler_whose_port_is_taken_exits_2_and_writes_no_event(tmp_path: Path, taken_port: int) -> None:
    db = tmp_path / "aryl.db"
    url = f"sqlite:///{db}"
    assert run("aryl-scheduler", "migrate", "--database-url", url).returncode == 0
    result = run("aryl-scheduler", "--listen", f"127.0.0.1:{taken_port}", "--database-url", url)
    assert result.returncode == 2
    assert one_line_error(result) == (
        f"aryl-scheduler: cannot listen on 127.0.0.1:{taken_port}: Address already in use; choose another "
        "address with --listen or server.listen (ARYL_SERVER__LISTEN)"
    )
    assert scheduler_started_events(db) == []


def test_debug_adds_the_traceback_and_keeps_the_exit_status(tmp_path: Path, taken_port: int) -> None:
    url = f"sqlite:///{tmp_path / 'aryl.db'}"
    argv = ("--listen", f"127.0.0.1:{taken_port}", "--database-url", url)
    asked = (run("aryl-scheduler", "--debug", *argv), run("aryl-scheduler", *argv, env=clean_env(ARYL_DEBUG="1")))
    for result in asked:
        assert result.returncode == 2
        assert "Traceback (most recent call last)" in result.stderr and "ListenError" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("aryl-scheduler: cannot listen on")


def nvml_starts() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - whatever the reason, there is no usable driver
        return False
    pynvml.nvmlShutdown()
    return True


def test_agent_without_a_gpu_driver_exits_3_in_one_line() -> None:
    if nvml_starts():
        pytest.skip("this machine has an NVIDIA driver: the NVML backend starts")
    result = run("aryl-agent", "--gpu-backend", "nvml", "--hostname", "t1", "--scheduler", f"127.0.0.1:{free_port()}")
    assert result.returncode == 3
    assert one_line_error(result).startswith("aryl-agent: cannot start the GPU backend 'nvml': ")


def test_router_whose_port_is_taken_exits_2_in_one_line(taken_port: int) -> None:
    result = run("aryl-router", "--no-scheduler", "--backend", "http://127.0.0.1:1",
                 "--listen", f"127.0.0.1:{taken_port}")
    assert result.returncode == 2
    # Its log says "router stopped" first (inference_router.router.serve stops what it started).
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"aryl-router: cannot serve on 127.0.0.1:{taken_port}: ")


def test_simulator_given_a_missing_trace_exits_2_in_one_line(tmp_path: Path) -> None:
    result = run("aryl-sim", "run", "--trace-format", "generic", "--trace", str(tmp_path / "none.csv"),
                 "--no-progress")
    assert result.returncode == 2
    assert "none.csv" in one_line_error(result)


# ---------------------------------------------------------------------------------------------
# --version


@pytest.mark.parametrize("name", EXECUTABLES)
def test_version_prints_the_package_version(name: str) -> None:
    result = run(name, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{name} {importlib.metadata.version('aryl')}"
