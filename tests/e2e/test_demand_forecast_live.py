"""Predictive reclaim, live (issue 31): a real scheduler service (aryl policy, short forecast bins), a real
``inference_router.Router`` in front of real HTTP model servers, and a steadily rising load sent through the
router (the demo's load generator, ``aryl_demo.traffic.Traffic``). The router measures the load and reports its
need over the real ReportDemand path, follows the serving pool over WatchServingPool and acknowledges drains
over ReportDrained; the scheduler's forecaster learns from those reports and the aryl policy reclaims ahead of
its forecast.

What is faked: the agents. Servers register and report status over the real AgentService, from this test
(a thread that reports every server's desired generation as applied, as a converged agent does), so a
reclaimed server returns once "its agent" confirmed, within a report interval; no worker process runs.

Asserted: the first reclaim (reason RECLAIMED_FOR_INFERENCE) gives the forecast as its reason and is
decided before the router's measured need first exceeds the servers it can route to, no request through the
router fails, and the router's shortfall counters and the scheduler's forecast (ListLoans, arylctl loans'
source) say so. Every wait polls a condition with a generous deadline (``tests.helpers``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from prometheus_client import generate_latest

from aryl_demo.traffic import Traffic
from arylctl.client import ArylClient
from inference_router.config import RouterSection
from inference_router.router import Router
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from tests.harness import daemon_security, job_spec, register_fake_server, scheduler_stub, secure_channel
from tests.helpers import scaled_timeout

INFERENCE = ("infer-1", "infer-2", "infer-3", "infer-4")
CAPACITY_RPS = 10.0  # what one model server serves, for the router's need: ceil(rate / 10)
LOW_RPS, TOP_RPS, RAMP_S = 5.0, 36.0, 75.0  # need 1, then one more server every ~24 s, up to 4
POLICY = {
    "loan_idle_s": 0, "min_loan_s": 0, "min_resize_interval_s": 0, "restart_cost_s": 1,
    "drain_timeout_s": 30,          # the router's drain acknowledgement comes first
    # One spare serving: the need is whole servers, so a rise shows in its history only as a step; with a spare,
    # the first step (1 -> 2) is met by what serves, and the forecast it starts reclaims the next server ahead.
    # Without one, any step exceeds the pool at once and no forecast can start the first reclaim sooner.
    "loan_buffer_servers": 1,
    "reclaim_deadline_s": 20,       # the lead before a reclaim is measured (core.demand_forecast)
}
FORECAST = {"bin_s": 1, "trend_window_s": 20}


class ModelServer:
    """An in-process HTTP model server: answers every request with its server id after ``service_s``."""

    def __init__(self, server_id: str, service_s: float = 0.005) -> None:
        self.server_id = server_id
        self.service_s = service_s
        self.answered = 0
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def _answer(self, request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(self.service_s)
        self.answered += 1
        return web.json_response({"server_id": self.server_id})

    async def start(self) -> ModelServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class ConvergedAgents:
    """Every registered server's agent, as far as the scheduler can tell: a thread that reports each server's
    desired generation as applied (its workers started or stopped) every ``interval_s``."""

    def __init__(self, address: str, epoch: int, interval_s: float = 0.2) -> None:
        self._address, self._epoch, self._interval_s = address, epoch, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="converged-agents", daemon=True)

    def __enter__(self) -> ConvergedAgents:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=scaled_timeout(10))

    def _run(self) -> None:
        with secure_channel(self._address) as channel:
            scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            agent = agent_pb2_grpc.AgentServiceStub(channel)
            while not self._stop.wait(self._interval_s):
                try:
                    servers = scheduler.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
                    for s in servers:
                        agent.ReportStatus(agent_pb2.ReportStatusRequest(
                            server_id=s.server_id, scheduler_epoch=self._epoch,
                            observed_generation=s.desired_generation,
                            gpus=[agent_pb2.GpuStatus(index=g.index, healthy=True) for g in s.gpus]), timeout=5)
                except Exception:  # noqa: BLE001 - a busy scheduler answers the next round
                    continue


@dataclass
class ShortWatch:
    """When the router's measured need first exceeded the servers it could route to (wall clock), sampled."""

    first_short_at: float | None = None
    samples: list[tuple[float, int | None, int]] = field(default_factory=list)

    async def run(self, router: Router, stop: asyncio.Event) -> None:
        while not stop.is_set():
            needed, serving = router.servers_needed_now(), router.pool.serving
            now = time.time()
            self.samples.append((now, needed, serving))
            if needed is not None and needed > serving and self.first_short_at is None:
                self.first_short_at = now
            await asyncio.sleep(0.05)


async def until(predicate: Callable[[], object], *, timeout: float, what: str) -> None:
    """Poll ``predicate`` (blocking calls run off the loop) until truthy, within ``timeout`` as scaled."""
    deadline = time.monotonic() + scaled_timeout(timeout)
    while not await asyncio.to_thread(predicate):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {scaled_timeout(timeout):g}s waiting for {what}")
        await asyncio.sleep(0.2)


def run(coro: Awaitable[None], timeout: float) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro, scaled_timeout(timeout))

    asyncio.run(bounded())


def states(stub) -> dict[str, int]:
    return {s.server_id: s.state for s in stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers}


def reclaims(address: str) -> list[types_pb2.Event]:
    with ArylClient(address, timeout=5) as client:
        return [e for e in client.watch_events(after_event_id=0, idle_timeout=0.5)
                if e.reason == "RECLAIMED_FOR_INFERENCE"]


@pytest.mark.timeout(900)
def test_a_rising_load_through_the_router_is_met_by_a_reclaim_on_the_forecast(scheduler_factory) -> None:
    scheduler = scheduler_factory(policy=POLICY, demand_forecast=FORECAST)
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "train-1", gpus=1).scheduler_epoch

    async def scenario() -> None:
        models = [await ModelServer(sid).start() for sid in INFERENCE]
        for model in models:
            await asyncio.to_thread(register_fake_server, scheduler.address, model.server_id, "inference", 1,
                                    inference_endpoint=model.url, converge=True)
        router = Router.from_config(RouterSection(
            listen="127.0.0.1:0", scheduler_address=scheduler.address, source="forecast-test",
            server_capacity_rps=CAPACITY_RPS, headroom=0.0, min_servers=1, short_window_s=2, long_window_s=60,
            scale_down_delay_s=2, evaluate_interval_s=0.2, report_interval_s=1, health_check_interval_s=0,
            shutdown_timeout_s=5, **daemon_security()))
        await router.start()
        await until(lambda: router.pool.serving == len(INFERENCE), timeout=30, what="the router to see the pool")
        stop = asyncio.Event()
        load = Traffic(router.url, rate=LOW_RPS)  # the demo's open-loop load generator, on a thread of its own
        load_thread = threading.Thread(target=load.run, name="load", daemon=True)
        load_thread.start()
        watch = ShortWatch()
        background = [asyncio.create_task(watch.run(router, stop))]
        try:
            # Low load: the router needs 1 server; with the spare, 2 serve and 2 are loaned to an elastic job.
            job = await asyncio.to_thread(lambda: stub.SubmitJob(scheduler_pb2.SubmitJobRequest(
                spec=job_spec("elastic", gpus=1, workers=1, max_workers=8)), timeout=5).job)
            await until(lambda: router.servers_needed_now() == 1 and router.demand_reported == 1, timeout=60,
                        what="the router to measure and report a need of 1")
            await until(lambda: list(states(stub).values()).count(types_pb2.SERVER_STATE_LOANED) == 2, timeout=90,
                        what="two inference servers loaned to training")
            await until(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id), timeout=5
                                            ).job.num_workers >= 3, timeout=60,
                        what="the elastic job to grow onto the loaned servers")
            assert not await asyncio.to_thread(reclaims, scheduler.address)
            # The forecast is shown (ListLoans, as arylctl loans prints it): the need now, flat.
            loans = await asyncio.to_thread(stub.ListLoans, scheduler_pb2.ListLoansRequest(), timeout=5)
            assert loans.HasField("demand_forecast") and loans.demand_forecast.servers_needed_now == 1
            assert loans.demand_forecast.quantile == pytest.approx(0.999)
            assert not loans.demand_forecast.HasField("reclaim_latency_s")  # no reclaim measured yet
            assert watch.first_short_at is None

            # A steady rise, through the router: from LOW_RPS to TOP_RPS over RAMP_S.
            began = time.monotonic()
            while (elapsed := time.monotonic() - began) < RAMP_S:
                load.rate = LOW_RPS + (TOP_RPS - LOW_RPS) * elapsed / RAMP_S
                await asyncio.sleep(0.25)
            load.rate = TOP_RPS
            await until(lambda: router.servers_needed_now() == 4 and router.pool.serving == 4, timeout=90,
                        what="all four servers serving the top of the load")
            first = (await asyncio.to_thread(reclaims, scheduler.address))[0]
            decided_at = first.time.ToNanoseconds() / 1e9
            assert first.message.startswith("the demand forecast says inference needs"), first.message
            short_at = watch.first_short_at
            if short_at is not None:
                assert decided_at < short_at, (
                    f"the first reclaim was decided {decided_at - short_at:.1f} s after the router's need "
                    f"first exceeded what served: {first.message}")
            # The forecast now knows a reclaim's latency, measured; the scheduler's metrics show it too.
            await until(lambda: stub.ListLoans(scheduler_pb2.ListLoansRequest(), timeout=5
                                               ).demand_forecast.HasField("reclaim_latency_s"),
                        timeout=30, what="the reclaim latency measured")
            scraped = generate_latest(scheduler.service.metrics.registry).decode()
            assert 'aryl_scheduler_demand_forecast_servers{kind="upper"}' in scraped
            assert "aryl_scheduler_reclaim_latency_seconds " in scraped
        finally:
            stop.set()
            load.stop.set()
            await asyncio.to_thread(load_thread.join, scaled_timeout(60))
            await asyncio.gather(*background, return_exceptions=True)
            await router.stop()
            for model in models:
                await model.stop()
        assert load.failed == [] and load.ok == load.sent > 0, load.failed[:5]
        assert router.responses_failed == 0
        assert router.requests_arrived == load.sent
        scraped = generate_latest(router.metrics.registry).decode()
        assert f"aryl_router_requests_arrived_total {float(load.sent)}" in scraped
        assert f"aryl_router_requests_short_total {float(router.requests_short)}" in scraped
        # The router's own shortfall counter agrees with the watch: requests arrived while short, if any,
        # only after the first reclaim was under way.
        if watch.first_short_at is None:
            assert router.requests_short == 0

    try:
        with ConvergedAgents(scheduler.address, epoch):
            run(scenario(), timeout=600)
    finally:
        channel.close()
