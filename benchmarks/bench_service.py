"""The scheduler service under load: SubmitJob throughput and ListJobs latency, through real gRPC
into a real PostgreSQL.

The scheduler runs as its own process (``python -m scheduler_service.main``, the ``aryl-scheduler``
entry point) with its default configuration, so the load generator here never shares its GIL.
Each benchmark creates a scratch database ``aryl_bench_<random>`` next to the admin URL, migrates it
and drops it at the end. No server is registered, so every submitted job stays PENDING and every
scheduling cycle scans all of them: that cost is part of what is measured, not hidden.

Never: import from ``tests/``, assert on timings, or touch a database it did not create.
"""

from __future__ import annotations

import asyncio
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
from typing import Any

import grpc
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import Engine, make_url

from aryl_common.ports import free_loopback_port
from benchmarks import emit_figure
from migrations import upgrade
from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.api import validation
from scheduler_service.app.jobs import DEFAULT_PAGE_SIZE
from scheduler_service.core.plan import Reason
from scheduler_service.lifecycle import JobState
from scheduler_service.store import models as m

log = logging.getLogger("aryl.bench")

SUBMIT_TARGET_JOBS_PER_S = 1000
# Jobs are spread round-robin over this many users, so a by-user filter matches one job in ten.
USERS = 10
FILL_IN_FLIGHT = 64
CEILING_BATCH = 1000
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


def _process_cpu_s(pid: int) -> float | None:
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
        backends = {pid: cpu for pid in self._backend_pids() if (cpu := _process_cpu_s(pid)) is not None}
        return _process_cpu_s(self._scheduler_pid), time.process_time(), backends

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


# ---------------------------------------------------------------------------------------------
# Load generation


def job_requests(count: int, *, tag: str) -> list[scheduler_pb2.SubmitJobRequest]:
    return [
        scheduler_pb2.SubmitJobRequest(spec=types_pb2.JobSpec(
            name=f"bench-{tag}-{i}", user=f"user-{i % USERS}", command=["python", "train.py"],
            gpus_per_worker=1, min_workers=1,
        ))
        for i in range(count)
    ]


@dataclass(frozen=True)
class SubmitRun:
    elapsed_s: float
    latencies_s: tuple[float, ...]

    @property
    def jobs_per_s(self) -> float:
        return len(self.latencies_s) / self.elapsed_s


async def _submit_all(address: str, requests: Sequence[scheduler_pb2.SubmitJobRequest], in_flight: int) -> SubmitRun:
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), RPC_TIMEOUT_S)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        queue = iter(requests)  # shared by the callers: each request is sent exactly once

        async def caller() -> None:
            for request in queue:
                sent = time.perf_counter()
                await stub.SubmitJob(request, timeout=RPC_TIMEOUT_S)
                latencies.append(time.perf_counter() - sent)

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        elapsed = time.perf_counter() - start
    return SubmitRun(elapsed, tuple(latencies))


def submit_jobs(address: str, requests: Sequence[scheduler_pb2.SubmitJobRequest], in_flight: int) -> SubmitRun:
    """Send every request through one grpc.aio channel, keeping ``in_flight`` calls open at once."""
    return asyncio.run(_submit_all(address, requests, in_flight))


def percentile_ms(samples_s: Sequence[float], pct: int) -> float:
    return statistics.quantiles(samples_s, n=100, method="inclusive")[pct - 1] * 1e3


# ---------------------------------------------------------------------------------------------
# Benchmark: SubmitJob throughput


def insert_ceiling(engine: Engine, requests: Sequence[scheduler_pb2.SubmitJobRequest]) -> float:
    """Jobs/s for inserting the rows SubmitJob writes (one job + its JOB_SUBMITTED event) with
    SQLAlchemy Core executemany, ``CEILING_BATCH`` jobs per transaction: the database's ceiling."""
    now = time.time()
    submissions = [validation.job_submission(r.spec, "", now=now) for r in requests]
    job_rows = [
        dict(
            name=s.name, user=s.user, queue=s.queue, command=list(s.command), env=dict(s.env),
            gpus_per_worker=s.gpus_per_worker, min_workers=s.min_workers, max_workers=s.max_workers,
            priority=s.priority, deadline=s.deadline, throughput=s.throughput, max_runtime_s=s.max_runtime_s,
            restart_policy=s.restart_policy, max_restarts=s.max_restarts, idempotency_key=s.idempotency_key,
            state=JobState.PENDING.value, state_reason=Reason.SUBMITTED.value, state_message="queued",
            pending_reason="", num_workers=0, restarts=0, preemptions=0, submitted_at=now, version=1,
        )
        for s in submissions
    ]
    jobs, events = (m.Base.metadata.tables[model.__tablename__] for model in (m.Job, m.Event))
    start = time.perf_counter()
    for first in range(0, len(job_rows), CEILING_BATCH):
        batch = job_rows[first:first + CEILING_BATCH]
        with engine.begin() as conn:
            ids = conn.execute(jobs.insert().returning(jobs.c.id, sort_by_parameter_order=True), batch).scalars().all()
            conn.execute(events.insert(), [
                dict(time=now, kind="JOB_SUBMITTED", job_id=job_id, server_id=None, from_state="",
                     to_state=JobState.PENDING.value, reason=Reason.SUBMITTED.value, details={},
                     message=f"{row['name']} by {row['user']} in queue {row['queue']}: 1..1 worker(s) x 1 GPU(s)")
                for job_id, row in zip(ids, batch, strict=True)
            ])
    return len(job_rows) / (time.perf_counter() - start)


def submit_throughput(ctx: BenchContext) -> None:
    """SubmitJob calls per second at each in-flight level, from an empty jobs table each time."""
    n = ctx.sizes.submit_jobs
    with scratch_database(ctx.admin_url) as url:
        engine = sa.create_engine(url, pool_size=1, max_overflow=1)
        try:
            insert_ceiling(engine, job_requests(100, tag="warmup"))  # connect, compile, warm caches
            truncate_jobs(engine)
            ceiling = insert_ceiling(engine, job_requests(n, tag="ceiling"))
            log.info("core executemany ceiling: %.0f jobs/s (%d jobs)", ceiling, n)
            truncate_jobs(engine)
            with SchedulerProcess(url) as scheduler:
                for in_flight in ctx.sizes.in_flight:
                    # Warm the channel, the server's threads and its connection pool at this level.
                    submit_jobs(scheduler.address, job_requests(max(100, 4 * in_flight), tag="warmup"), in_flight)
                    wait_until_idle(engine)
                    truncate_jobs(engine)
                    with CpuMeter(engine, scheduler.pid) as cpu:
                        run = submit_jobs(scheduler.address, job_requests(n, tag=f"c{in_flight}"), in_flight)
                        # The cycles triggered by the submits finish after the last reply: wait and count them.
                        settle_s = wait_until_idle(engine)
                    log.info("in_flight=%d: %.0f jobs/s, scheduler busy %.2fs after the last reply",
                             in_flight, run.jobs_per_s, settle_s)
                    emit_figure(
                        "submit_job_throughput", run.jobs_per_s, "jobs/s",
                        in_flight=in_flight, jobs=n, target=SUBMIT_TARGET_JOBS_PER_S,
                        latency_p50_ms=percentile_ms(run.latencies_s, 50),
                        latency_p99_ms=percentile_ms(run.latencies_s, 99),
                        settle_s=settle_s, **cpu.fields(per=n),
                        reference_name="core_executemany_insert", reference_value=ceiling,
                        reference_unit="jobs/s", reference_batch=CEILING_BATCH,
                    )
        finally:
            engine.dispose()


# ---------------------------------------------------------------------------------------------
# Benchmark: ListJobs latency


@dataclass(frozen=True)
class ListQuery:
    name: str
    request: scheduler_pb2.ListJobsRequest
    sql: str               # the page's jobs query, as the reference runs it
    params: dict[str, object]


def _page_sql(where: str = "") -> str:
    # What the application asks for: one page plus one row to know whether there is a next page.
    return f"SELECT * FROM jobs {where} ORDER BY id DESC LIMIT %(limit)s"


def _list_queries(stub: scheduler_pb2_grpc.SchedulerServiceStub, deep_page: int) -> list[ListQuery]:
    limit = DEFAULT_PAGE_SIZE + 1
    request = scheduler_pb2.ListJobsRequest()
    before = 0
    for _ in range(deep_page):  # follow next_page_token down to the deep page, untimed
        reply = stub.ListJobs(request, timeout=RPC_TIMEOUT_S)
        if not reply.next_page_token:
            raise RuntimeError(f"fewer than {deep_page + 1} pages stored; cannot time page {deep_page}")
        before = int(reply.jobs[-1].job_id)
        request = scheduler_pb2.ListJobsRequest(page_token=reply.next_page_token)
    return [
        ListQuery("default_page", scheduler_pb2.ListJobsRequest(), _page_sql(), {"limit": limit}),
        ListQuery("by_user", scheduler_pb2.ListJobsRequest(user="user-3"),
                  _page_sql('WHERE "user" = %(user)s'), {"user": "user-3", "limit": limit}),
        ListQuery(f"page_{deep_page}", request, _page_sql("WHERE id < %(before)s"),
                  {"before": before, "limit": limit}),
    ]


def _time_calls(call: Callable[[], object], count: int, *, warmup: int = 5) -> list[float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(count):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def list_jobs_latency(ctx: BenchContext) -> None:
    """Sequential ListJobs calls from one client with ``stored_jobs`` jobs stored: p50 and p99."""
    sizes = ctx.sizes
    with scratch_database(ctx.admin_url) as url:
        engine = sa.create_engine(url, pool_size=1, max_overflow=1)
        try:
            with SchedulerProcess(url) as scheduler:
                fill = submit_jobs(scheduler.address, job_requests(sizes.stored_jobs, tag="stored"), FILL_IN_FLIGHT)
                log.info("stored %d jobs through SubmitJob (%d in flight) at %.0f jobs/s",
                         sizes.stored_jobs, FILL_IN_FLIGHT, fill.jobs_per_s)
                wait_until_idle(engine)
                raw = engine.raw_connection()
                assert raw.driver_connection is not None  # a connection checked out of the pool is open
                raw.driver_connection.autocommit = True
                cursor = raw.cursor()
                with grpc.insecure_channel(scheduler.address) as channel:
                    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
                    for query in _list_queries(stub, sizes.deep_page):
                        def grpc_call(q: ListQuery = query) -> object:
                            return stub.ListJobs(q.request, timeout=RPC_TIMEOUT_S)

                        def sql_call(q: ListQuery = query) -> object:
                            cursor.execute(q.sql, q.params)
                            return cursor.fetchall()

                        served = _time_calls(grpc_call, sizes.list_calls)
                        reference = _time_calls(sql_call, sizes.list_calls)
                        for pct in (50, 99):
                            emit_figure(
                                f"list_jobs_latency_p{pct}", percentile_ms(served, pct), "ms",
                                query=query.name, page_size=DEFAULT_PAGE_SIZE,
                                jobs=sizes.stored_jobs, calls=sizes.list_calls,
                                reference_name=f"raw_sql_page_query_p{pct}",
                                reference_value=percentile_ms(reference, pct), reference_unit="ms",
                            )
                cursor.close()
                raw.close()
        finally:
            engine.dispose()


# ---------------------------------------------------------------------------------------------
# Benchmark: SubmitJob latency beside many unfiltered event streams

WATCHERS = 2000
WATCHED_SUBMITS = 300
DRAIN_TIMEOUT_S = 300.0  # how long the streams may take to receive every event after the last answer
WATCHER_PROCESSES = 4  # the streams are read by processes of their own: their decoding is not the scheduler's


def _watch_events(address: str, streams: int, opened: Any, stop: Any, received: Any) -> None:
    """In a child process: hold ``streams`` unfiltered WatchEvents streams open and read everything,
    counting what every stream received in ``received`` (a shared counter)."""

    async def main() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            calls = [stub.WatchEvents(scheduler_pb2.WatchEventsRequest()) for _ in range(streams)]

            async def drain(call: Any) -> None:
                try:
                    async for _ in call:
                        with received.get_lock():
                            received.value += 1
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.CANCELLED:
                        log.warning("a watch stream ended: %s %s", exc.code(), exc.details())

            readers = [asyncio.create_task(drain(call)) for call in calls]
            await asyncio.sleep(1.0)  # the streams are open once their calls started; the scheduler counts them
            opened.set()
            await asyncio.to_thread(stop.wait)
            for call in calls:
                call.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    asyncio.run(main())


def _events_stored(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM events")).scalar_one())
    finally:
        engine.dispose()


@dataclass(frozen=True)
class _Phase:
    """One phase of ``submit_beside_watchers``: its submits, the events they wrote, and the scheduler's CPU."""

    run: SubmitRun
    events: int
    scheduler_cpu_s: float | None
    load_avg: float


def _timed_phase(url: str, scheduler: SchedulerProcess, requests: Sequence[scheduler_pb2.SubmitJobRequest]) -> _Phase:
    events_before, cpu_before = _events_stored(url), _process_cpu_s(scheduler.pid)
    run = submit_jobs(scheduler.address, requests, 1)
    cpu_after = _process_cpu_s(scheduler.pid)
    cpu = cpu_after - cpu_before if cpu_before is not None and cpu_after is not None else None
    return _Phase(run, _events_stored(url) - events_before, cpu, round(os.getloadavg()[0], 2))


def submit_beside_watchers(ctx: BenchContext) -> None:
    """SubmitJob latency (one in flight) with no event stream, then with WATCHERS unfiltered ones (every
    stream receives every event): the fan-out's cost to submissions. Issue 37 aims at most 2x.

    Beside the medians: the events the submits wrote (each one sent to every stream), the scheduler's CPU
    per submit in each phase (read from /proc until the last answer: fan-out still under way then is not
    counted), and from them its CPU per event sent to one stream; the share of the events due to the streams
    that they had received at the last answer, and how long after it they all had (the fan-out lags
    rather than slowing submits)."""
    import multiprocessing

    watchers = int(os.environ.get("ARYL_BENCH_WATCHERS", WATCHERS))
    n = WATCHED_SUBMITS if ctx.sizes is FULL else 60
    settings = {"ARYL_SERVER__MAX_WATCH_STREAMS": str(watchers + 64),
                "ARYL_SERVER__MAX_WATCH_STREAMS_PER_CLIENT": str(watchers + 64)}
    with scratch_database(ctx.admin_url) as url, SchedulerProcess(url, settings) as scheduler:
        submit_jobs(scheduler.address, job_requests(50, tag="warmup"), 1)
        alone = _timed_phase(url, scheduler, job_requests(n, tag="alone"))
        spawn = multiprocessing.get_context("spawn")
        opened = [spawn.Event() for _ in range(WATCHER_PROCESSES)]
        stop = spawn.Event()
        received = spawn.Value("q", 0)
        per_process = watchers // WATCHER_PROCESSES
        children = [spawn.Process(target=_watch_events, args=(scheduler.address, per_process, opened[i], stop,
                                                              received)) for i in range(WATCHER_PROCESSES)]
        for child in children:
            child.start()
        try:
            for event in opened:
                event.wait(SCHEDULER_READY_TIMEOUT_S)
            before = received.value
            watched = _timed_phase(url, scheduler, job_requests(n, tag="watched"))
            answered = time.monotonic()
            due = watched.events * per_process * WATCHER_PROCESSES  # (events of the cycles still running: a few)
            delivered_at_last_answer = (received.value - before) / due if due else 1.0
            while received.value - before < due and time.monotonic() - answered < DRAIN_TIMEOUT_S:
                time.sleep(0.1)
            drained_s = time.monotonic() - answered
        finally:
            stop.set()
            for child in children:
                child.join(30)
        median_alone = statistics.median(alone.run.latencies_s) * 1e3
        cpu: dict[str, float] = {}
        if alone.scheduler_cpu_s is not None and watched.scheduler_cpu_s is not None:
            cpu = dict(scheduler_cpu_ms_per_submit=round(watched.scheduler_cpu_s / n * 1e3, 2),
                       reference_scheduler_cpu_ms_per_submit=round(alone.scheduler_cpu_s / n * 1e3, 2))
            if watched.events:
                extra_s = watched.scheduler_cpu_s - alone.scheduler_cpu_s * watched.events / max(alone.events, 1)
                cpu["scheduler_cpu_us_per_event_sent"] = round(extra_s / (watched.events * watchers) * 1e6, 1)
        emit_figure("submit_job_median_beside_watchers", statistics.median(watched.run.latencies_s) * 1e3, "ms",
                    watchers=watchers, jobs=n, latency_p99_ms=percentile_ms(watched.run.latencies_s, 99),
                    events_per_submit=round(watched.events / n, 2), load_avg=watched.load_avg, **cpu,
                    delivered_at_last_answer=round(delivered_at_last_answer, 3),
                    streams_caught_up_s=round(drained_s, 1),
                    reference_name="submit_job_median_without_watchers", reference_value=median_alone,
                    reference_unit="ms", reference_load_avg=alone.load_avg, target=2 * median_alone)


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("submit_throughput", submit_throughput,
              "SubmitJob jobs/s over gRPC into PostgreSQL at several in-flight levels, vs Core executemany"),
    Benchmark("submit_beside_watchers", submit_beside_watchers,
              "SubmitJob median with 2,000 unfiltered WatchEvents streams open vs none (ARYL_BENCH_WATCHERS)"),
    Benchmark("list_jobs_latency", list_jobs_latency,
              "ListJobs p50/p99 with many jobs stored (first page, by user, deep page), vs the raw SQL page query"),
)
