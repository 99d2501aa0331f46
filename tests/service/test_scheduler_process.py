"""``aryl-scheduler`` as a real process: migrates on start, serves, and shuts down gracefully."""

from __future__ import annotations

import os
import re
import subprocess
from functools import partial
from pathlib import Path

from grpc_health.v1 import health_pb2

from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.fixtures.daemons import BIN, serving
from tests.harness import health_stub, secure_channel
from tests.helpers import free_port, terminating, wait_for


def test_starts_on_an_empty_database_and_stops_on_sigterm(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "ARYL_LOGGING__FORMAT": "json"}
    proc = subprocess.Popen(
        [str(BIN), "--listen", address, "--database-url", f"sqlite:///{tmp_path / 'db' / 'aryl.db'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
    )
    with terminating(proc) as stop:
        wait_for(lambda: serving(address), timeout=60, what="the scheduler to serve")
        output = stop()
    assert proc.returncode == 0
    log = output.decode()
    assert '"event": "scheduler started"' in log
    assert '"event": "scheduler stopped"' in log


def test_unknown_policy_is_refused_at_start_up(tmp_path: Path) -> None:
    result = subprocess.run(
        [str(BIN), "--policy", "nope", "--database-url", f"sqlite:///{tmp_path / 'aryl.db'}"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 2
    registered = ("aryl, aryl-naivereclaim, aryl-noelastic, aryl-nogoodput, aryl-nojoint, aryl-noloan, "
                  "aryl-nopreempt, aryl-noshrink, aryl-reactive, aryl-risk, dl2, drf, fifo, gavel, optimus, pollux, "
                  "qos, sia, sjf, tiresias")
    assert f"unknown policy 'nope'; registered: {registered}" in result.stderr


def test_migrate_command_creates_the_schema(tmp_path: Path) -> None:
    db = tmp_path / "aryl.db"
    result = subprocess.run([str(BIN), "migrate", "--database-url", f"sqlite:///{db}"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    import sqlite3

    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"jobs", "servers", "gpus", "allocations", "loans", "events"} <= tables


def _without_security(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(("ARYL_SECURITY__", "ARYL_INSECURE"))}


def test_a_start_without_certificates_names_a_flag_that_exists(tmp_path: Path) -> None:
    """Issue 36: the refusal names ``aryl-scheduler --insecure``, which then starts a plaintext scheduler;
    neither start's log names an internal issue number (the migrations' summaries are logged too)."""
    db = f"sqlite:///{tmp_path / 'aryl.db'}"
    env = _without_security(dict(os.environ))
    refused = subprocess.run([str(BIN), "--database-url", db], capture_output=True, text=True, timeout=60,
                             check=False, env=env)
    assert refused.returncode == 2
    assert "aryl-scheduler --insecure (or ARYL_SECURITY__INSECURE=true" in refused.stderr, refused.stderr
    address = f"127.0.0.1:{free_port()}"
    proc = subprocess.Popen([str(BIN), "--insecure", "--listen", address, "--database-url", db],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    with terminating(proc) as stop:
        wait_for(lambda: serving(address, plaintext=True), timeout=60,
                 what="the --insecure scheduler to serve plaintext")
        output = stop()
    log = output.decode()
    assert "scheduler started" in log and "Running upgrade" in log
    assert re.search(r"issue \d", log + refused.stderr, re.IGNORECASE) is None, log


def _listening_sockets(pid: int, port: int) -> int:
    """How many TCP sockets of process ``pid`` listen on ``port`` (IPv4 or IPv6), read from /proc."""
    fd_dir = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == "0A" and local_port == port and fields[9] in inodes:  # 0A: LISTEN
                count += 1
    return count


def test_the_port_is_shared_by_accept_loops_servers_each_serving_every_service(tmp_path: Path) -> None:
    """``server.accept_loops`` gRPC servers listen on ``server.listen``'s one port (SO_REUSEPORT), each with
    every service: calls over many connections (the kernel spreads them over the servers' sockets) are all
    answered, health and a real RPC alike. A second scheduler on that port is still refused (its probe binds
    without SO_REUSEPORT), and ``accept_loops = 1`` listens on one socket, as before the setting."""
    for loops in (3, 1):
        port = free_port()
        address = f"127.0.0.1:{port}"
        env = {**os.environ, "ARYL_SERVER__ACCEPT_LOOPS": str(loops)}
        db = f"sqlite:///{tmp_path / f'aryl-{loops}.db'}"
        proc = subprocess.Popen([str(BIN), "--listen", address, "--database-url", db],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        with terminating(proc) as stop:
            wait_for(partial(serving, address), timeout=60, what="the scheduler to serve")
            assert _listening_sockets(proc.pid, port) == loops
            for i in range(30):  # each channel its own connection
                with secure_channel(address, [("grpc.use_local_subchannel_pool", 1), ("test.conn", i)]) as channel:
                    reply = health_stub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
                    assert reply.status == health_pb2.HealthCheckResponse.SERVING
                    jobs = scheduler_pb2_grpc.SchedulerServiceStub(channel).ListJobs(
                        scheduler_pb2.ListJobsRequest(), timeout=30)
                    assert list(jobs.jobs) == []
            if loops > 1:
                second = subprocess.run([str(BIN), "--listen", address, "--database-url", db], env=env,
                                        capture_output=True, text=True, timeout=120, check=False)
                assert second.returncode == 2, second.stderr
                assert f"cannot listen on {address}: Address already in use" in second.stderr
            output = stop()
        assert proc.returncode == 0, output
