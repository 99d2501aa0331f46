"""The scheduler service under load: SubmitJob throughput and ListJobs latency, through real gRPC
into a real PostgreSQL.

The scheduler runs as its own process (``benchmarks.harness.SchedulerProcess``) with its default
configuration, so the load generator here never shares its GIL. Each benchmark creates a scratch
database (``benchmarks.harness.scratch_database``) and drops it at the end. No server is registered,
so every submitted job stays PENDING and every scheduling cycle scans all of them: that cost is part
of what is measured, not hidden.

Never: import from ``tests/``, assert on timings, or touch a database it did not create.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from benchmarks import emit_figure
from benchmarks.harness import (
    FULL,
    RPC_TIMEOUT_S,
    SCHEDULER_READY_TIMEOUT_S,
    BenchContext,
    Benchmark,
    CpuMeter,
    SchedulerProcess,
    percentile_ms,
    process_cpu_s,
    scratch_database,
    truncate_jobs,
    wait_until_idle,
)
from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.api import job_validation
from scheduler_service.app.jobs import DEFAULT_PAGE_SIZE
from scheduler_service.core.plan import Reason
from scheduler_service.lifecycle import JobState
from scheduler_service.store import models as m

log = logging.getLogger("aryl.bench")

SUBMIT_TARGET_JOBS_PER_S = 1000
# Jobs are spread round-robin over this many users, so a by-user filter matches one job in ten.
USERS = 10
FILL_IN_FLIGHT = 64
CEILING_CHUNK = 1000


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



# ---------------------------------------------------------------------------------------------
# Benchmark: SubmitJob throughput


def insert_ceiling(engine: Engine, requests: Sequence[scheduler_pb2.SubmitJobRequest]) -> float:
    """Jobs/s for inserting the rows SubmitJob writes (one job + its JOB_SUBMITTED event) with
    SQLAlchemy Core executemany, ``CEILING_CHUNK`` jobs per transaction: the database's ceiling."""
    now = time.time()
    submissions = [job_validation.job_submission(r.spec, "", now=now) for r in requests]
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
    for first in range(0, len(job_rows), CEILING_CHUNK):
        chunk = job_rows[first:first + CEILING_CHUNK]
        with engine.begin() as conn:
            ids = conn.execute(jobs.insert().returning(jobs.c.id, sort_by_parameter_order=True), chunk).scalars().all()
            conn.execute(events.insert(), [
                dict(time=now, kind="JOB_SUBMITTED", job_id=job_id, server_id=None, from_state="",
                     to_state=JobState.PENDING.value, reason=Reason.SUBMITTED.value, details={},
                     message=f"{row['name']} by {row['user']} in queue {row['queue']}: 1..1 worker(s) x 1 GPU(s)")
                for job_id, row in zip(ids, chunk, strict=True)
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
                        reference_unit="jobs/s", reference_batch=CEILING_CHUNK,  # the name earlier results carry
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
    events_before, cpu_before = _events_stored(url), process_cpu_s(scheduler.pid)
    run = submit_jobs(scheduler.address, requests, 1)
    cpu_after = process_cpu_s(scheduler.pid)
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
