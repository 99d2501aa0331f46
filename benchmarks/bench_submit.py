"""Submit throughput against its ceilings: the batch RPC (SubmitJobs) and single SubmitJob at 64 in
flight, each beside, measured in the same run on the same machine, two database insert ceilings of
the same rows in transactions of the same size -- SQLAlchemy Core executemany (which on psycopg2 is
already multi-row: ``insertmanyvalues`` sends 1,000 rows a statement) and the store's COPY path
(``store.jobs._copy_in``, what SubmitJobs itself uses on PostgreSQL, called directly) -- and the rate
of bare gRPC health checks at the same concurrency (what the RPC layer alone allows).

Every figure carries the one-minute load average when it was taken: the machine is shared, and the
figures move with it. The targets (``target`` field) are the issue's; a figure below its target is
reported as it is.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence

import grpc
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.orm import Session

from benchmarks import emit_figure
from benchmarks.bench_service import insert_ceiling, job_requests, submit_jobs
from benchmarks.harness import (
    RPC_TIMEOUT_S,
    BenchContext,
    Benchmark,
    CpuMeter,
    SchedulerProcess,
    percentile_ms,
    scratch_database,
    truncate_jobs,
    wait_until_idle,
)
from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.api import job_validation
from scheduler_service.store import jobs as store_jobs

log = logging.getLogger("aryl.bench")

BATCH_TARGET_JOBS_PER_S = 10_000
SINGLE_TARGET_JOBS_PER_S = 1_500
# SubmitJob's rate over the bare health checks' of the same run (issue 35 item 3): what the scheduler's
# own work per job leaves of the RPC layer's ceiling, on whatever machine it runs.
SINGLE_TARGET_HEALTH_RATIO = 0.5
BATCH_SIZE = 1000          # jobs per SubmitJobs call (the per-call cap is 10,000)
SINGLE_IN_FLIGHT = 64
LIST, IDS = scheduler_pb2.SUBMITTED_JOBS_VIEW_LIST, scheduler_pb2.SUBMITTED_JOBS_VIEW_IDS  # SubmitJobs answers


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


async def _batches(address: str, requests: Sequence[scheduler_pb2.SubmitJobRequest], batch: int,
                   in_flight: int, view: scheduler_pb2.SubmittedJobsView = LIST) -> tuple[float, list[float]]:
    """Send ``requests`` as SubmitJobs calls of ``batch`` jobs, ``in_flight`` calls at once, answered in
    ``view``; (elapsed seconds, each call's latency)."""
    calls = [scheduler_pb2.SubmitJobsRequest(jobs=requests[i:i + batch], view=view)
             for i in range(0, len(requests), batch)]
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(address, options=[("grpc.max_send_message_length", 64 << 20),
                                                           ("grpc.max_receive_message_length", 64 << 20)]) as ch:
        await asyncio.wait_for(ch.channel_ready(), RPC_TIMEOUT_S)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        queue = iter(calls)

        async def caller() -> None:
            for call in queue:
                sent = time.perf_counter()
                reply = await stub.SubmitJobs(call, timeout=RPC_TIMEOUT_S)
                latencies.append(time.perf_counter() - sent)
                assert len(reply.jobs) == len(call.jobs)

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        return time.perf_counter() - start, latencies


async def _health_checks(address: str, calls: int, in_flight: int) -> float:
    """Bare gRPC health checks per second at ``in_flight`` concurrent calls: the RPC layer's ceiling."""
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), RPC_TIMEOUT_S)
        stub = health_pb2_grpc.HealthStub(channel)
        left = iter(range(calls))
        request = health_pb2.HealthCheckRequest(service="")

        async def caller() -> None:
            for _ in left:
                await stub.Check(request, timeout=RPC_TIMEOUT_S)  # type: ignore[attr-defined]

        start = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(in_flight)))
        return calls / (time.perf_counter() - start)


def copy_ceiling(engine: sa.Engine, requests: Sequence[scheduler_pb2.SubmitJobRequest]) -> float:
    """Jobs/s of the store's COPY path alone (``store.jobs._copy_in``: ids, one COPY of the jobs, one
    INSERT ... SELECT of their events), ``BATCH_SIZE`` jobs per committed transaction, no RPC, no
    validation: the database and its driver, with the rows' rendering as COPY text."""
    now = time.time()
    subs = [job_validation.job_submission(r.spec, "", now=now) for r in requests]
    start = time.perf_counter()
    for first in range(0, len(subs), BATCH_SIZE):
        batch = subs[first:first + BATCH_SIZE]
        with Session(engine) as session, session.begin():
            store_jobs._copy_in(session, batch, [store_jobs._job_row(sub, now) for sub in batch], array=False)
    return len(subs) / (time.perf_counter() - start)


def submit_batch_throughput(ctx: BenchContext) -> None:
    """SubmitJobs (1,000 jobs a call, 1 and 2 calls in flight answered with the list view, 2 with the ids
    view) and SubmitJob (64 in flight) jobs/s, beside the executemany ceiling and the bare health-check
    rate; SubmitJob's figure carries its ratio to that rate (``health_check_ratio``)."""
    quick = ctx.sizes.submit_jobs < 1000
    batch_jobs = 5_000 if quick else 50_000
    single_jobs = ctx.sizes.submit_jobs
    with scratch_database(ctx.admin_url) as url:
        engine = sa.create_engine(url, pool_size=1, max_overflow=1)
        try:
            insert_ceiling(engine, job_requests(200, tag="warmup"))
            truncate_jobs(engine)
            ceiling_load = load_average()
            ceiling = insert_ceiling(engine, job_requests(batch_jobs, tag="ceiling"))
            log.info("executemany ceiling: %.0f jobs/s (load %.2f)", ceiling, ceiling_load)
            truncate_jobs(engine)
            copy_ceiling(engine, job_requests(200, tag="warmup-copy"))
            truncate_jobs(engine)
            copy_load = load_average()
            copy_rate = copy_ceiling(engine, job_requests(batch_jobs, tag="copy"))
            log.info("COPY ceiling: %.0f jobs/s (load %.2f)", copy_rate, copy_load)
            emit_figure("db_insert_ceiling", ceiling, "jobs/s", method="core_executemany_insert (insertmanyvalues)",
                        batch=BATCH_SIZE, jobs=batch_jobs, load_avg=ceiling_load)
            emit_figure("db_insert_ceiling", copy_rate, "jobs/s", method="store_copy_path", batch=BATCH_SIZE,
                        jobs=batch_jobs, load_avg=copy_load)
            truncate_jobs(engine)
            # Plaintext on loopback, as bench_service's: the figures are the scheduler's, not TLS's.
            with SchedulerProcess(url, settings={"ARYL_SECURITY__INSECURE": "true"}) as scheduler:
                health_load = load_average()
                checks = 300 if quick else 5000
                with CpuMeter(engine, scheduler.pid) as cpu:
                    health_rate = asyncio.run(_health_checks(scheduler.address, checks, SINGLE_IN_FLIGHT))
                log.info("bare health checks at %d in flight: %.0f calls/s", SINGLE_IN_FLIGHT, health_rate)
                # The fields say "per job" for one call here: the RPC layer's own cost, scheduler and client.
                emit_figure("grpc_health_check_rate", health_rate, "calls/s", in_flight=SINGLE_IN_FLIGHT,
                            load_avg=health_load, **cpu.fields(per=checks),
                            cores_bound_jobs_per_s=cpu.cores_bound(checks))
                asyncio.run(_batches(scheduler.address, job_requests(2 * BATCH_SIZE, tag="warm"), BATCH_SIZE, 1))
                wait_until_idle(engine)
                truncate_jobs(engine)
                for in_flight, view in ((1, LIST), (2, LIST), (2, IDS)):
                    load = load_average()
                    requests = job_requests(batch_jobs, tag=f"b{in_flight}-{view}")
                    with CpuMeter(engine, scheduler.pid) as cpu:
                        elapsed, latencies = asyncio.run(_batches(scheduler.address, requests, BATCH_SIZE,
                                                                  in_flight, view))
                        settle_s = wait_until_idle(engine)  # the cycles the burst woke are its cost too
                    rate = batch_jobs / elapsed
                    stored = wait_count(engine, batch_jobs)
                    view_name = scheduler_pb2.SubmittedJobsView.Name(view).removeprefix("SUBMITTED_JOBS_VIEW_").lower()
                    log.info("SubmitJobs x%d in flight, %s view: %.0f jobs/s (load %.2f)", in_flight, view_name, rate,
                             load)
                    emit_figure(
                        "submit_jobs_batch_throughput", rate, "jobs/s", batch=BATCH_SIZE, calls_in_flight=in_flight,
                        view=view_name, jobs=batch_jobs, stored=stored, target=BATCH_TARGET_JOBS_PER_S,
                        call_p50_ms=percentile_ms(latencies, 50) if len(latencies) > 1 else latencies[0] * 1e3,
                        load_avg=load, reference_name="core_executemany_insert", reference_value=ceiling,
                        reference_batch=BATCH_SIZE, reference_load_avg=ceiling_load,
                        ceiling_copy=copy_rate, ceiling_copy_load_avg=copy_load, health_check_rate=health_rate,
                        settle_s=settle_s, **cpu.fields(per=batch_jobs),
                        cores_bound_jobs_per_s=cpu.cores_bound(per=batch_jobs),
                    )
                    truncate_jobs(engine)
                submit_jobs(scheduler.address, job_requests(4 * SINGLE_IN_FLIGHT, tag="warm1"), SINGLE_IN_FLIGHT)
                wait_until_idle(engine)
                truncate_jobs(engine)
                load = load_average()
                with CpuMeter(engine, scheduler.pid) as cpu:
                    run = submit_jobs(scheduler.address, job_requests(single_jobs, tag="single"), SINGLE_IN_FLIGHT)
                    settle_s = wait_until_idle(engine)
                ratio = run.jobs_per_s / health_rate
                log.info("SubmitJob at %d in flight: %.0f jobs/s, %.0f%% of the health-check rate (load %.2f)",
                         SINGLE_IN_FLIGHT, run.jobs_per_s, ratio * 100, load)
                emit_figure(
                    "submit_job_single_throughput", run.jobs_per_s, "jobs/s", in_flight=SINGLE_IN_FLIGHT,
                    jobs=single_jobs, target=SINGLE_TARGET_JOBS_PER_S, health_check_ratio=round(ratio, 3),
                    health_check_ratio_target=SINGLE_TARGET_HEALTH_RATIO, health_check_load_avg=health_load,
                    latency_p50_ms=percentile_ms(run.latencies_s, 50),
                    latency_p99_ms=percentile_ms(run.latencies_s, 99),
                    load_avg=load, reference_name="grpc_health_check_rate", reference_value=health_rate,
                    reference_unit="calls/s", ceiling_executemany=ceiling, ceiling_copy=copy_rate,
                    settle_s=settle_s, **cpu.fields(per=single_jobs),
                    cores_bound_jobs_per_s=cpu.cores_bound(per=single_jobs),
                )
        finally:
            engine.dispose()


def wait_count(engine: sa.Engine, expected: int) -> int:
    """The jobs stored (every answered job must be there: the answer comes after the commit)."""
    with engine.connect() as conn:
        stored = int(conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one())
    if stored != expected:
        raise RuntimeError(f"{expected} jobs answered but {stored} stored")
    return stored


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("submit_batch_throughput", submit_batch_throughput,
              "SubmitJobs (1,000 a call) and SubmitJob (64 in flight) jobs/s into PostgreSQL, vs Core executemany "
              "and the store's COPY path of the same rows and bare gRPC health checks, with the load average"),
)
