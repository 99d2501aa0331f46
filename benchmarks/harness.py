"""What every benchmark stands on: its sizes and context (``Sizes``, ``FULL``/``QUICK``, ``BenchContext``,
``Benchmark``), a scratch PostgreSQL database, the scheduler as a child process, waiting for it to be
idle, CPU accounting from ``/proc``, and percentiles.

Nouns: a *scratch database* is ``aryl_bench_<random>`` next to the admin URL, migrated on entry and
dropped on exit; the *scheduler process* is ``python -m scheduler_service.main`` (the
``aryl-scheduler`` entry point) on a free loopback port, so a load generator never shares its GIL; a
*CPU meter* reads the scheduler's, its database backends' and the machine's CPU time around a
measurement.
Never: import from ``tests/``, assert on timings, or touch a database it did not create.
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import Engine, make_url

from aryl_common.ports import free_loopback_port
from migrations import upgrade

log = logging.getLogger("aryl.bench")

SCHEDULER_READY_TIMEOUT_S = 60.0
RPC_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Sizes:
    submit_jobs: int                # jobs timed at each in-flight level (and inserted for the ceiling)
    in_flight: tuple[int, ...]      # concurrent SubmitJob calls kept open by the load generator
    stored_jobs: int                # jobs in the database while ListJobs is timed
    list_calls: int                 # sequential ListJobs calls timed per query
    deep_page: int                  # the page (0-based, of 100) the deep-paging query asks for


FULL = Sizes(submit_jobs=5000, in_flight=(1, 16, 64), stored_jobs=10_000, list_calls=200, deep_page=90)
QUICK = Sizes(submit_jobs=300, in_flight=(1, 16, 64), stored_jobs=1000, list_calls=30, deep_page=5)


@dataclass(frozen=True)
class BenchContext:
    admin_url: str   # a PostgreSQL URL allowed to CREATE and DROP DATABASE
    sizes: Sizes


@dataclass(frozen=True)
class Benchmark:
    name: str
    run: Callable[[BenchContext], None]
    summary: str


# ---------------------------------------------------------------------------------------------
# Scratch database and scheduler process


@contextmanager
def scratch_database(admin_url: str) -> Iterator[str]:
    """A new, migrated PostgreSQL database next to ``admin_url``; dropped on exit. Yields its URL."""
    admin_parsed = make_url(admin_url)
    if admin_parsed.get_backend_name() != "postgresql":
        raise ValueError(f"the benchmarks need PostgreSQL, not {admin_parsed.get_backend_name()!r}")
    admin = sa.create_engine(admin_parsed, isolation_level="AUTOCOMMIT")
    name = f"aryl_bench_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin_parsed.set(database=name).render_as_string(hide_password=False)
    log.info("created scratch database %s", name)
    try:
        upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        log.info("dropped scratch database %s", name)


class SchedulerProcess:
    """The scheduler service as a child process on a free loopback port, over ``database_url``."""

    def __init__(self, database_url: str, settings: dict[str, str] | None = None) -> None:
        self.database_url = database_url
        self.settings = settings or {}  # extra ARYL_* variables (e.g. policy tunables)
        self.address = ""
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def __enter__(self) -> SchedulerProcess:
        self.address = f"127.0.0.1:{free_loopback_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_BENCH_")}
        # The schema is already migrated; warnings only, so logging is not part of the measurement.
        # Plaintext unless the settings say otherwise: the figures here are the service's own cost;
        # benchmarks/bench_auth.py measures what TLS and tokens add.
        env.update({"ARYL_DATABASE__AUTO_MIGRATE": "false", "ARYL_LOGGING__LEVEL": "warning",
                    "ARYL_SECURITY__INSECURE": "true", **self.settings})
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "scheduler_service.main", "--listen", self.address,
             "--database-url", self.database_url],
            env=env, stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr,
        )
        try:
            self._wait_serving()
        except BaseException:
            self.__exit__()
            raise
        log.info("scheduler pid %d serving on %s", self.pid, self.address)
        return self

    def _health_channel(self) -> grpc.Channel:
        """Plaintext, or with TLS (``ARYL_SECURITY__INSECURE=false`` in the settings) mutual TLS presenting
        the scheduler's own certificate, as its container health check does (deploy/healthcheck.py)."""
        if self.settings.get("ARYL_SECURITY__INSECURE", "true") != "false":
            return grpc.insecure_channel(self.address)
        read = {key: Path(self.settings[f"ARYL_SECURITY__{key}"]).read_bytes()
                for key in ("TLS_CLIENT_CA", "TLS_KEY", "TLS_CERT")}
        credentials = grpc.ssl_channel_credentials(read["TLS_CLIENT_CA"], read["TLS_KEY"], read["TLS_CERT"])
        return grpc.secure_channel(self.address, credentials)

    def _wait_serving(self) -> None:
        deadline = time.monotonic() + SCHEDULER_READY_TIMEOUT_S
        with self._health_channel() as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(f"the scheduler exited with code {self._proc.returncode} before serving")
                try:
                    # The stubs (types-grpcio-health-checking) declare HealthStub without its methods.
                    reply = health.Check(  # type: ignore[attr-defined]
                        health_pb2.HealthCheckRequest(service=""), timeout=1.0)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass  # not listening yet
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the scheduler did not serve within {SCHEDULER_READY_TIMEOUT_S:.0f}s")
                time.sleep(0.1)

    def __exit__(self, *_exc: object) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.warning("scheduler pid %d ignored SIGTERM for 30s; killing it", self.pid)
            self._proc.kill()
            self._proc.wait()


def wait_until_idle(engine: Engine, *, quiet_s: float = 1.0, timeout_s: float = 600.0) -> float:
    """Wait until no other session on this database has run a statement or held a transaction for
    ``quiet_s`` (the scheduler has caught up: its cycles are done). Returns the seconds until the
    quiet stretch began."""
    busy_sql = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() AND state <> 'idle'"
    )
    start = time.monotonic()
    quiet_since: float | None = None
    with engine.connect() as conn:
        while True:
            now = time.monotonic()
            busy = conn.execute(busy_sql).scalar_one()
            conn.rollback()  # a fresh snapshot of pg_stat_activity each time
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= quiet_s:
                return quiet_since - start
            if now - start > timeout_s:
                log.warning("the scheduler was still busy after %.0fs; measuring anyway", timeout_s)
                return now - start
            time.sleep(0.02)


def truncate_jobs(engine: Engine) -> None:
    """Empty the job tables (and the event log), so each measurement starts from no stored jobs."""
    with engine.begin() as conn:
        # TRUNCATE does not fire the event log's row-level append-only triggers.
        conn.execute(sa.text("TRUNCATE jobs, allocations, events RESTART IDENTITY CASCADE"))


# ---------------------------------------------------------------------------------------------
# CPU accounting (Linux /proc; figures are left out where it cannot be read)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the command name: state is field 3, utime 14 and stime 15 (proc(5)).
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def _machine_cpu_s() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (``/proc/stat``)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(t) for t in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + ticks[4]  # idle and iowait
    return (sum(ticks) - idle) / _CLOCK_TICKS, sum(ticks) / _CLOCK_TICKS


class CpuMeter:
    """CPU seconds spent by the scheduler process, this process, the database's backends, and the
    whole machine (every process: what bounds a figure on a machine the three share)."""

    def __init__(self, engine: Engine, scheduler_pid: int) -> None:
        self._engine = engine
        self._scheduler_pid = scheduler_pid
        # Set on exit; None where /proc could not be read.
        self.scheduler_s: float | None = None
        self.postgres_s: float | None = None
        self.client_s: float | None = None
        self.machine_busy_s: float | None = None
        self.machine_share: float | None = None  # busy / (wall x cores): 1.0 is every core busy

    def _backend_pids(self) -> list[int]:
        with self._engine.connect() as conn:
            return list(conn.execute(sa.text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )).scalars())

    def _read(self) -> tuple[float | None, float, dict[int, float]]:
        backends = {pid: cpu for pid in self._backend_pids() if (cpu := process_cpu_s(pid)) is not None}
        return process_cpu_s(self._scheduler_pid), time.process_time(), backends

    def __enter__(self) -> CpuMeter:
        self._start = self._read()
        self._machine_start = _machine_cpu_s()
        return self

    def __exit__(self, *_exc: object) -> None:
        machine1 = _machine_cpu_s()
        if self._machine_start is not None and machine1 is not None:
            self.machine_busy_s = machine1[0] - self._machine_start[0]
            self.machine_share = self.machine_busy_s / max(machine1[1] - self._machine_start[1], 1e-9)
        scheduler0, client0, backends0 = self._start
        scheduler1, client1, backends1 = self._read()
        self.scheduler_s = None if scheduler0 is None or scheduler1 is None else scheduler1 - scheduler0
        self.client_s = client1 - client0
        # Backends that exited meanwhile are missed; new ones count from zero (they started inside).
        self.postgres_s = (
            sum(cpu - backends0.get(pid, 0.0) for pid, cpu in backends1.items()) if backends1 else None
        )

    def fields(self, per: int) -> dict[str, float | None]:
        def ms_per(value: float | None) -> float | None:
            return None if value is None else value * 1e3 / per

        return {
            "scheduler_cpu_ms_per_job": ms_per(self.scheduler_s),
            "postgres_cpu_ms_per_job": ms_per(self.postgres_s),
            "client_cpu_ms_per_job": ms_per(self.client_s),
            "machine_cpu_ms_per_job": ms_per(self.machine_busy_s),
            "machine_busy_share": self.machine_share,
        }

    def cores_bound(self, per: int) -> float | None:
        """Jobs/s at which this machine's every core would be busy, at the CPU per job measured here (all
        processes: scheduler, client, database and the rest): what no code change that keeps the cost
        per job can pass on this machine."""
        cores = os.cpu_count()
        if self.machine_busy_s is None or not self.machine_busy_s or cores is None:
            return None
        return cores * per / self.machine_busy_s


def percentile_ms(samples_s: Sequence[float], pct: int) -> float:
    return statistics.quantiles(samples_s, n=100, method="inclusive")[pct - 1] * 1e3

