"""Fixtures of the fault-injection suite: a PostgreSQL database per test, the real ``aryl-scheduler``
process (killed with SIGKILL and started again on the same port and database), real ``aryl-agent``
daemons with fake GPUs, a seed per test, and the run's scale.

Scale: ``ARYL_CHAOS=full`` (``make chaos``) runs every case at its full counts (100 scheduler kill
points, 2,000 watch streams, ...); otherwise (``make test``, CI) each case runs a bounded form of a
few seconds. Seeds: ``ARYL_CHAOS_SEED`` (default 19) mixed with the test's name; the run's header and
every failure print it, and the same seed replays the same faults at the same points.

The policy keeps its default anti-thrashing settings (``min_resize_interval_s``, ``restart_cost_s``):
with both at 0, two elastic jobs were seen swapping a GPU every cycle, so no state ever settled.

Workers are ``sleep`` processes (cheap: the cases are about what runs where, not training); every
agent and hence every worker carries ``invariants.MARKER_ENV`` = the test's marker, so
``invariants.live_workers`` finds them and the teardown ends whatever a test left.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2

from arylctl.client import Aborted, ArylClient, DeadlineExceeded, FailedPrecondition, Unavailable
from migrations import upgrade
from protos.aryl.v1 import types_pb2
from scheduler_service.server import ServerHandle, serve_in_background
from tests.chaos.invariants import MARKER_ENV, SERVER_ENV
from tests.harness import (
    daemon_env,
    health_stub,
    job_spec,
    scheduler_config,
    scratch_postgres,
    secure_channel,
    security_env,
)
from tests.helpers import TIMEOUT_FACTOR, free_port, processes_mentioning, wait_for

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
SCHEDULER_BIN = Path(sys.executable).parent / "aryl-scheduler"
FULL = os.environ.get("ARYL_CHAOS", "").strip().lower() == "full"
BASE_SEED = int(os.environ.get("ARYL_CHAOS_SEED", "19"))
# The agents' report interval: "within one report interval after recovery" is counted in these.
REPORT_INTERVAL_S = 0.3
WORKER_COMMAND = ("sleep", "3600")
RETRYABLE = (Unavailable, DeadlineExceeded, Aborted)


def scaled(bounded: int, full: int) -> int:
    """A count for this run: ``full`` under ARYL_CHAOS=full, else ``bounded``."""
    return full if FULL else bounded


def pytest_report_header() -> str:
    return f"aryl chaos: {'full' if FULL else 'bounded'} run, ARYL_CHAOS_SEED={BASE_SEED}"


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """This test's seed (ARYL_CHAOS_SEED mixed with the test's id); printed, so a failure shows it."""
    seed = zlib.crc32(f"{BASE_SEED}:{request.node.nodeid}".encode())
    print(f"chaos seed {seed} (ARYL_CHAOS_SEED={BASE_SEED}, {'full' if FULL else 'bounded'} run)")
    request.node.user_properties.append(("chaos_seed", seed))
    return seed


@pytest.fixture
def rng(chaos_seed: int) -> random.Random:
    return random.Random(chaos_seed)


@pytest.fixture
def chaos_db() -> Iterator[str]:
    """A migrated PostgreSQL database of this test alone (dropped afterwards): its connections may be
    terminated and its rows locked without touching any other test's."""
    with scratch_postgres("aryl_chaos") as url:
        upgrade(url)
        yield url


def serving(address: str) -> bool:
    try:
        with secure_channel(address) as channel:
            reply = health_stub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.RpcError:
        return False


def chaos_job(name: str, *, workers: int = 1, max_workers: int = 0, gpus: int = 1) -> types_pb2.JobSpec:
    """A job of ``sleep`` workers (``WORKER_COMMAND``), stopped at once by SIGTERM."""
    spec = job_spec(name, user="chaos", gpus=gpus, workers=workers, max_workers=max_workers or workers)
    del spec.command[:]
    spec.command.extend(WORKER_COMMAND)
    return spec


class GaveUp(Exception):
    """A call stopped retrying (the scheduler it waited for is known to be dead)."""


class RetryingClient:
    """One user's client: every call retried until the scheduler answers, on a fresh channel after
    UNAVAILABLE (a channel's reconnect backoff would otherwise outlast the restart)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._client = ArylClient(address, timeout=5)

    def call(self, do: Callable[[ArylClient], T], *, give_up: Callable[[], bool] = lambda: False) -> T:
        """``do`` until it is answered; ``GaveUp`` as soon as ``give_up()`` holds after a failure."""
        for _ in range(round(600 * TIMEOUT_FACTOR)):  # ~a minute of refusals, longer on a loaded machine
            try:
                return do(self._client)
            except RETRYABLE as exc:
                if give_up():
                    raise GaveUp from exc
                if isinstance(exc, Unavailable):
                    self._client.close()
                    self._client = ArylClient(self.address, timeout=5)
                time.sleep(0.1)
        raise AssertionError("the scheduler did not answer for a minute (times ARYL_TEST_TIMEOUT_FACTOR)")

    def submit(self, spec: types_pb2.JobSpec, key: str, *, give_up: Callable[[], bool] = lambda: False) -> str:
        job = self.call(lambda c: c.submit_job(spec, idempotency_key=key, attempts=1), give_up=give_up)
        assert isinstance(job, types_pb2.Job)
        return job.job_id

    def cancel(self, job_id: str, *, give_up: Callable[[], bool] = lambda: False) -> None:
        def cancel(c: ArylClient) -> None:
            try:
                c.cancel_job(job_id, reason="chaos")
            except FailedPrecondition:
                pass  # already ended (or the answer to an earlier try was lost)
        self.call(cancel, give_up=give_up)

    def close(self) -> None:
        self._client.close()


class SchedulerProcess:
    """The real ``aryl-scheduler`` on PostgreSQL, always on one port so agents and clients find it again.
    Started with the test-only ``ARYL_FAULT_KILL_AT=@<kill_file>`` (``scheduler_service.kill_points``):
    ``arm`` makes the running process SIGKILL itself at a named point, ``disarm`` undoes it."""

    def __init__(self, database_url: str, logs: Path, kill_file: Path, **settings: str) -> None:
        self.url = database_url
        self.address = f"127.0.0.1:{free_port()}"
        self.logs = logs
        self.kill_file = kill_file
        self.settings = {
            "ARYL_SERVER__LISTEN": self.address,
            "ARYL_SERVER__SHUTDOWN_GRACE_S": "0.5",
            "ARYL_DATABASE__URL": database_url,
            "ARYL_DATABASE__AUTO_MIGRATE": "false",
            "ARYL_SCHEDULING__CYCLE_INTERVAL_S": "0.2",
            "ARYL_SCHEDULING__DEFAULT_GRACE_PERIOD_S": "2",
            "ARYL_AGENTS__REPORT_INTERVAL_S": str(REPORT_INTERVAL_S),
            "ARYL_AGENTS__LOST_AFTER_S": "10",
            "ARYL_AGENTS__TELEMETRY_WRITE_S": "1",
            "ARYL_LOGGING__LEVEL": "warning",
            "ARYL_FAULT_KILL_AT": f"@{kill_file}",
            **settings,
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.arms = 0

    def arm(self, point: str, nth: int = 1) -> None:
        """The running scheduler dies the ``nth`` time from now that it reaches ``point``."""
        self.arms += 1
        self.kill_file.write_text(f"{point}:{nth}\narm {self.arms}\n")

    def disarm(self) -> None:
        self.kill_file.write_text("")

    def start(self, *, wait: bool = True) -> None:
        assert self.proc is None or self.proc.poll() is not None, "the scheduler is running"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        # TLS and tokens, as by default (the session's dev CA, tests.harness); settings may override.
        env.update({k: v for k, v in security_env().items() if k.startswith("ARYL_SECURITY__")})
        env.update(self.settings)
        self.starts += 1
        with self.logs.open("ab") as log:
            log.write(f"--- start {self.starts}\n".encode())
            log.flush()
            self.proc = subprocess.Popen([str(SCHEDULER_BIN)], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_serving()

    def wait_serving(self, timeout: float = 90) -> None:
        def up() -> bool:
            assert self.proc is not None
            assert self.proc.poll() is None, f"the scheduler exited ({self.proc.returncode}); log: {self.logs}"
            return serving(self.address)
        wait_for(up, timeout=timeout, interval=0.1, what="the scheduler to serve")

    def kill9(self) -> None:
        """SIGKILL (no shutdown of any kind) and reap it."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def died_by_sigkill(self) -> bool:
        return self.proc is not None and self.proc.poll() == -signal.SIGKILL

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill9()


class Agents:
    """Real ``aryl-agent`` daemons (fake GPUs) for one scheduler address; each carries the test's
    marker and its server id in its environment, and its workers inherit both."""

    def __init__(self, tmp: Path, marker: str) -> None:
        self.tmp = tmp
        self.marker = marker
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, scheduler_address: str, hostname: str, gpus: int = 4) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env.update({
            "ARYL_AGENT__RECONCILE_INTERVAL_S": "0.1", "ARYL_AGENT__ADVERTISE_ADDRESS": "127.0.0.1",
            "ARYL_AGENT__LOGS_LISTEN_HOST": "127.0.0.1", "ARYL_AGENT__CHECKPOINT_ROOT": str(self.tmp / "checkpoints"),
            "ARYL_LOGGING__LEVEL": "warning", MARKER_ENV: self.marker, SERVER_ENV: hostname,
            # Workers get a clean environment ([users], node_agent.identity): these two are passed on.
            "ARYL_USERS__PASS_ENV": json.dumps([MARKER_ENV, SERVER_ENV]),
            **daemon_env(hostname),  # mutual TLS with a certificate naming its server id, and a token
        })
        args = [sys.executable, "-m", "node_agent.main", "--scheduler", scheduler_address, "--hostname", hostname,
                "--fake-gpus", str(gpus), "--work-dir", str(self.tmp / f"agent-{hostname}")]
        with (self.tmp / f"agent-{hostname}.log").open("ab") as log:
            self.procs[hostname] = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def kill9(self, hostname: str) -> None:
        proc = self.procs.pop(hostname)
        proc.kill()
        proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


class ChaosCluster:
    """A scheduler process and its agents on the test's own database."""

    def __init__(self, tmp: Path, database_url: str) -> None:
        self.tmp = tmp
        self.url = database_url
        self.marker = f"aryl-chaos-{tmp.name}-{os.getpid()}"
        self.scheduler = SchedulerProcess(database_url, tmp / "scheduler.log", tmp / "kill-at")
        self.agents = Agents(tmp, self.marker)

    def start(self, agents: int = 2, gpus: int = 4) -> None:
        self.scheduler.start()
        for i in range(agents):
            self.agents.start(self.scheduler.address, f"chaos-{i}", gpus)

    def close(self) -> None:
        self.agents.close()
        self.scheduler.stop()


@pytest.fixture
def chaos_cluster(tmp_path: Path, chaos_db: str) -> Iterator[ChaosCluster]:
    cluster = ChaosCluster(tmp_path, chaos_db)
    try:
        yield cluster
    finally:
        cluster.close()
        _end_processes(cluster.marker)


class InProcessCluster:
    """A scheduler served in this process (``serve_in_background``: cheaper to start than the
    executable, for the cases that never kill it) on the test's own database, with real agents."""

    def __init__(self, tmp: Path, database_url: str) -> None:
        self.tmp = tmp
        self.url = database_url
        self.marker = f"aryl-chaos-{tmp.name}-{os.getpid()}"
        self.handle: ServerHandle | None = None
        self.agents = Agents(tmp, self.marker)

    @property
    def address(self) -> str:
        assert self.handle is not None
        return self.handle.address

    def start(self, agents: int = 2, gpus: int = 4, **sections: dict) -> None:
        base: dict[str, dict] = {
            "agents": {"report_interval_s": REPORT_INTERVAL_S, "lost_after_s": 10.0, "telemetry_write_s": 1.0},
            "scheduling": {"cycle_interval_s": 0.2, "default_grace_period_s": 2.0},
        }
        for name, values in sections.items():
            base.setdefault(name, {}).update(values)
        self.handle = serve_in_background(scheduler_config(self.url, **base))
        for i in range(agents):
            self.agents.start(self.address, f"chaos-{i}", gpus)

    def close(self) -> None:
        self.agents.close()
        if self.handle is not None:
            self.handle.stop()


def _end_processes(marker: str) -> None:
    # Agents leave their workers running on purpose (an agent restart must not kill training).
    for pid in processes_mentioning(marker):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    wait_for(lambda: not processes_mentioning(marker), timeout=15, what="no processes left")


@pytest.fixture
def inprocess_cluster(tmp_path: Path, chaos_db: str) -> Iterator[InProcessCluster]:
    cluster = InProcessCluster(tmp_path, chaos_db)
    try:
        yield cluster
    finally:
        cluster.close()
        _end_processes(cluster.marker)
