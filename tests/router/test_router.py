"""The inference router: proxying, least-outstanding balancing, retries, health, drains, demand.

Everything runs over real loopback sockets (``tests/router_rig.py``): the router, in-process aiohttp
backends (or real ``examples/inference_server.py`` processes), and a small fake scheduler -- a real
grpc.aio ``InferenceService``. The tests of the router's contract with the scheduler (drains, removals,
the pool watch, demand reports) run on both data planes (``PLANES``: HAProxy, programmed by the router,
and the Python proxy); those of the Python proxy's own behaviour (headers, retries, its 502/503/504
bodies, its health checks) on it alone -- HAProxy's are in ``test_router_haproxy.py``. The demand
arithmetic is driven by made-up times. No test asserts on how long anything took; waits poll a condition
with a generous timeout.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web

from aryl_common.config import ConfigError
from inference_router.config import RouterSection, check_router_section, load_router_config
from inference_router.demand import DemandEstimator, LoadMeter, RateEwma, TimeOfDayProfile, percentile, servers_for
from inference_router.main import cli_overrides, parse_args
from inference_router.pool import BackendPool, PoolMember, PoolUpdate, RoutingState
from inference_router.proxy import request_headers
from tests.helpers import free_port
from tests.router_rig import (
    DRAINING,
    PLANES,
    SERVING,
    FakeScheduler,
    RouterLoad,
    require_haproxy,
    rig,
    router_section,
    run,
    served,
    start_example_server,
    stop_process,
    until,
)

# ---------------------------------------------------------------------------------------------
# Balancing


def picked(pool: BackendPool, now: float, **exclude: set[str]) -> str:
    """The server ``pool.pick`` chose (``exclude=``: passed on), which the test expects there to be."""
    backend = pool.pick(now, **exclude)
    assert backend is not None
    return backend.server_id


def test_pick_prefers_fewest_in_flight_and_breaks_ties_round_robin_by_id() -> None:
    async def scenario() -> None:
        pool = BackendPool(unhealthy_after_failures=3, unhealthy_cooldown_s=10)
        pool.apply(PoolUpdate(tuple(PoolMember(s, f"http://{s}", RoutingState.SERVING) for s in "cab"), 1))
        assert [picked(pool, 0) for _ in range(4)] == ["a", "b", "c", "a"]
        pool.begin(pool.backends["a"])
        pool.begin(pool.backends["b"])
        assert picked(pool, 0) == "c"          # the only idle one, whatever the rotation
        pool.begin(pool.backends["c"])
        pool.begin(pool.backends["c"])
        assert {picked(pool, 0), picked(pool, 0)} == {"a", "b"}
        assert picked(pool, 0, exclude={"a", "b"}) == "c"

    run(scenario())


def test_requests_go_to_the_backend_with_the_fewest_outstanding() -> None:
    async def scenario() -> None:
        async with rig("a", "b", "c") as r:
            a, b, c = r.backends.values()
            for backend in (a, b, c):
                backend.hold()
            held = [asyncio.create_task(r.infer()) for _ in range(6)]
            await until(lambda: a.in_flight + b.in_flight + c.in_flight == 6, what="6 requests in flight")
            assert [a.in_flight, b.in_flight, c.in_flight] == [2, 2, 2]
            a.release()                                # a finishes its two; b and c still hold two each
            await until(lambda: r.router.pool.backends[a.url].in_flight == 0, what="the router to see a idle")
            assert [body["backend"] for _, body in await r.infer_many(3)] == ["a", "a", "a"]
            b.release()
            c.release()
            assert all(status == 200 for status, _ in await asyncio.gather(*held))

    run(scenario())


# ---------------------------------------------------------------------------------------------
# Proxying


def test_headers_bodies_and_query_strings_pass_through() -> None:
    async def scenario() -> None:
        async with rig("a") as r:
            payload = os.urandom(3 << 20)    # streamed both ways, not buffered whole
            async with r.session.post(r.router.url + "/echo?x=1&y=%20z", data=payload,
                                      headers={"X-Request": "r", "Keep-Alive": "timeout=1",
                                               "X-Forwarded-For": "10.9.9.9"}) as response:
                assert response.status == 200
                assert await response.read() == payload
                assert response.headers["X-Custom"] == "kept" and response.headers["X-Backend"] == "a"
                assert "Keep-Alive" not in response.headers
            sent = r.backends["a"].last_headers
            assert sent["X-Request"] == "r" and "Keep-Alive" not in sent
            assert sent["X-Forwarded-For"] == "10.9.9.9, 127.0.0.1"
            assert sent["X-Forwarded-Host"] == r.router.url.removeprefix("http://")
            async with r.session.get(r.router.url + "/q?x=1&y=%20z") as response:
                assert (await response.json())["path"] == "/q?x=1&y=%20z"

    run(scenario())


def test_hop_by_hop_headers_named_by_connection_are_dropped() -> None:
    async def scenario() -> None:
        app = web.Application()

        async def capture(request: web.Request) -> web.Response:
            headers = request_headers(request)
            return web.json_response(sorted(k.lower() for k in headers))

        app.router.add_get("/", capture)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{runner.addresses[0][1]}/",
                                       headers={"Connection": "keep-alive, X-Secret", "X-Secret": "s",
                                                "Upgrade": "h2c", "X-Kept": "k"}) as response:
                    names = await response.json()
            assert "x-kept" in names and "x-forwarded-for" in names
            assert not {"x-secret", "upgrade", "connection", "host"} & set(names)
        finally:
            await runner.cleanup()

    run(scenario())


def test_a_dead_backend_is_retried_elsewhere_and_ejected_without_client_visible_failures() -> None:
    async def scenario() -> None:
        dead = f"http://127.0.0.1:{free_port()}"
        async with rig("live", extra_backends=(dead,), unhealthy_after_failures=2, unhealthy_cooldown_s=300) as r:
            assert await r.backends_used(10) == {"live"}         # every request answered 200
            stats: dict[str, Any] = r.router.stats()  # the JSON of GET /aryl/stats
            dead_stats = next(b for b in stats["backends"] if b["endpoint"] == dead)
            assert dead_stats["failures"] == 2 and not dead_stats["healthy"]    # ejected after 2, then skipped
            assert stats["retries"] == 2 and stats["responses_failed"] == 0
            assert r.backends["live"].arrivals == 10

    run(scenario())


def test_no_backend_gives_503_and_unreachable_backends_give_502_with_a_json_reason() -> None:
    async def scenario() -> None:
        dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
        async with rig(scheduled=True) as r:
            await r.publish()
            status, body = await r.infer()
            assert status == 503 and body["error"] == "no_backend_available" and "empty" in body["detail"]
            await r.publish(d1=(dead[0], SERVING), d2=(dead[1], SERVING))
            status, body = await r.infer()
            assert status == 502 and body["error"] == "backend_unreachable" and len(body["attempts"]) == 2
            await r.publish(d1=(dead[0], DRAINING), d2=(dead[1], DRAINING))
            status, body = await r.infer()
            assert status == 503 and body["error"] == "no_backend_available"
            assert r.router.stats()["responses_failed"] == 3

    run(scenario())


def test_a_backend_gone_silent_after_the_request_was_sent_gives_504_and_no_retry() -> None:
    async def scenario() -> None:
        async with rig("a", "b", request_timeout_s=0.3) as r:
            for backend in r.backends.values():
                backend.hold()
            status, body = await r.infer()
            assert status == 504 and body["error"] == "backend_timeout"
            assert sum(b.arrivals for b in r.backends.values()) == 1     # a POST that was sent is not retried
            for backend in r.backends.values():
                backend.release()

    run(scenario())


def test_active_health_checks_take_a_failing_backend_out_and_put_it_back() -> None:
    async def scenario() -> None:
        async with rig("a", "b", health_check_interval_s=0.05) as r:
            b = r.backends["b"]
            b.healthy = False
            await until(lambda: not r.router.pool.backends[b.url].active_ok, what="b's health check to fail")
            assert await r.backends_used(6) == {"a"}
            b.healthy = True
            await until(lambda: r.router.pool.backends[b.url].active_ok, what="b's health check to pass")
            assert await r.backends_used(6) == {"a", "b"}

    run(scenario())


def test_stop_finishes_in_flight_requests_and_refuses_new_connections() -> None:
    async def scenario() -> None:
        async with rig("a") as r:
            backend = r.backends["a"]
            backend.hold()
            pending = asyncio.create_task(r.infer())
            await until(lambda: backend.in_flight == 1, what="the request at the backend")
            stopping = asyncio.create_task(r.router.stop())
            await until(lambda: r.router._runner is not None and not r.router._runner.sites, what="listener closed")
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as fresh:
                    await fresh.get(r.router.url + "/v1/infer")
            backend.release()
            status, body = await pending
            assert status == 200 and body["backend"] == "a"
            await stopping

    run(scenario())


# ---------------------------------------------------------------------------------------------
# The serving pool from the scheduler: drains and removals


@pytest.mark.parametrize("plane", PLANES)
def test_draining_backend_finishes_in_flight_gets_nothing_new_and_is_reported_drained_once(plane: str) -> None:
    async def scenario() -> None:
        async with rig("a", "b", scheduled=True, plane=plane) as r:
            a, b, scheduler = r.backends["a"], r.backends["b"], r.scheduler
            assert scheduler is not None
            await r.publish(a=(a.url, SERVING), b=(b.url, SERVING))
            a.hold()
            b.hold()
            held = [asyncio.create_task(r.infer()) for _ in range(4)]
            await until(lambda: a.in_flight == 2 and b.in_flight == 2, what="two requests held at each backend")
            a.release()
            await r.change("b", DRAINING)
            b_arrivals = b.arrivals
            assert await r.backends_used(10) == {"a"}
            assert b.arrivals == b_arrivals == 2
            await r.chance_to_act()              # give a premature report every chance to happen
            assert scheduler.drained_calls == []
            b.release()
            assert [status for status, _ in await asyncio.gather(*held)] == [200] * 4  # b's in-flight finished
            await until(lambda: scheduler.drained_calls == ["b"], what="ReportDrained(b)")
            await until(lambda: "b" not in r.router.pool.backends, what="b loaned (gone from the pool)")
            assert await r.backends_used(5) == {"a"} and b.arrivals == b_arrivals
            await r.chance_to_act()
            assert scheduler.drained_calls == ["b"]             # exactly once
            assert r.router.stats()["responses_failed"] == 0

    run(scenario())


@pytest.mark.parametrize("plane", PLANES)
def test_drain_report_retries_while_unavailable_and_gives_up_on_failed_precondition(plane: str) -> None:
    async def scenario() -> None:
        async with rig("a", "b", scheduled=True, reconnect_max_backoff_s=0.2, plane=plane) as r:
            a, b, scheduler = r.backends["a"], r.backends["b"], r.scheduler
            assert scheduler is not None
            scheduler.drained_errors = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE]
            scheduler.set(a=(a.url, DRAINING), b=(b.url, SERVING))
            await until(lambda: scheduler.drained_calls == ["a", "a", "a"], what="two retries, then success")
            await until(lambda: "a" not in r.router.pool.backends, what="a loaned")
            # (the scheduler publishes the loan before its answer reaches the router; both count)
            await until(lambda: r.router.drains_reported == ["a"], what="the answer recorded")
            scheduler.drained_errors = [grpc.StatusCode.FAILED_PRECONDITION]
            await r.change("b", DRAINING)
            await until(lambda: len(scheduler.drained_calls) == 4, what="b's report")
            await r.chance_to_act(0.5)
            assert scheduler.drained_calls == ["a", "a", "a", "b"]    # refused: not retried
            assert r.router.drains_reported == ["a"] and not r.router._drain_tasks

    run(scenario())


@pytest.mark.parametrize("plane", PLANES)
def test_a_server_removed_from_the_pool_gets_nothing_and_a_returning_one_stops_draining(plane: str) -> None:
    async def scenario() -> None:
        async with rig("a", "b", scheduled=True, plane=plane) as r:
            a, b, scheduler = r.backends["a"], r.backends["b"], r.scheduler
            assert scheduler is not None
            await r.publish(a=(a.url, SERVING), b=(b.url, SERVING))
            assert await r.backends_used(4) == {"a", "b"}
            await r.change("b", None)
            b_arrivals = b.arrivals
            assert await r.backends_used(8) == {"a"} and b.arrivals == b_arrivals
            # DRAINING, then SERVING again before its report: the drain is called off.
            a.hold()
            held = asyncio.create_task(r.infer())
            await until(lambda: a.in_flight == 1, what="a request held at a")
            await r.change("b", SERVING, b.url)
            await r.change("a", DRAINING)
            await r.change("a", SERVING)
            a.release()
            assert (await held)[0] == 200
            await r.chance_to_act()
            assert scheduler.drained_calls == []

    run(scenario())


@pytest.mark.parametrize("plane", PLANES)
def test_the_router_keeps_its_pool_while_the_scheduler_is_away_and_resubscribes(plane: str) -> None:
    async def scenario() -> None:
        async with rig("a", scheduled=True, reconnect_max_backoff_s=0.3, plane=plane) as r:
            assert r.scheduler is not None
            await r.publish(a=(r.backends["a"].url, SERVING))
            port = int(r.scheduler.address.rsplit(":", 1)[1])
            await r.scheduler.stop()
            assert await r.backends_used(2) == {"a"}              # still routed to the last known pool
            replacement = await FakeScheduler().start(port)
            try:
                replacement.set(a=(r.backends["a"].url, DRAINING))
                await until(lambda: replacement.drained_calls == ["a"], timeout=30, what="the resubscribed watch")
            finally:
                await replacement.stop()

    run(scenario())


# ---------------------------------------------------------------------------------------------
# End to end: the real aryl-router and example inference servers, under continuous load



def test_no_request_fails_while_a_server_is_drained_and_another_added_under_load(tmp_path: Path) -> None:
    """The real aryl-router with its default data plane, HAProxy."""
    require_haproxy()
    servers = {name: start_example_server(5, name) for name in ("s1", "s2", "s3")}
    router_proc: subprocess.Popen | None = None

    async def scenario() -> None:
        nonlocal router_proc
        scheduler = await FakeScheduler().start()
        scheduler.set(s1=(servers["s1"][1], SERVING), s2=(servers["s2"][1], SERVING))
        # Picked once this test's own servers hold theirs: a port chosen before them could be handed to one
        # of them, and HAProxy then cannot bind it (seen in CI: "Address already in use").
        port = free_port()
        log = (tmp_path / "router.log").open("wb")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env["ARYL_ROUTER__INSECURE"] = "true"  # the FakeScheduler listens in plaintext
        # Started from a thread: fork and exec block, and this loop also serves the fake scheduler.
        router_proc = await asyncio.to_thread(
            subprocess.Popen,
            [str(Path(sys.executable).parent / "aryl-router"), "--listen", f"127.0.0.1:{port}",
             "--scheduler", scheduler.address, "--servers-needed", "2", "--interval", "0.5",
             "--source", "e2e-router"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        load = RouterLoad(f"http://127.0.0.1:{port}")
        statuses, stats = load.statuses, load.stats

        try:
            async with aiohttp.ClientSession() as session:
                async def ready() -> bool:
                    try:
                        return sum(1 for b in (await stats(session))["backends"] if b["routable"]) == 2
                    except aiohttp.ClientConnectionError:
                        return False

                for _ in range(600):
                    assert router_proc is not None and router_proc.poll() is None, (tmp_path / "router.log").read_text()
                    if await ready():
                        break
                    await asyncio.sleep(0.05)
                clients = [asyncio.create_task(load.client(session)) for _ in range(6)]
                await until(lambda: len(statuses) > 100, what="load flowing")
                scheduler.change("s1", DRAINING)              # drained: ReportDrained -> LOANED (gone)
                await until(lambda: scheduler.drained_calls == ["s1"], what="s1 reported drained")
                s1_served = await served(session, servers["s1"][1])
                mark = len(statuses)
                scheduler.change("s3", SERVING, servers["s3"][1])
                await until(lambda: len(statuses) > mark + 200, what="load after the change")
                await until(lambda: scheduler.demand_calls, what="a demand report")
                load.stop.set()
                await asyncio.gather(*clients)
                final = await stats(session)
                assert await served(session, servers["s1"][1]) == s1_served     # nothing after it was drained
                assert await served(session, servers["s3"][1]) > 0
            assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
            assert final["responses_failed"] == 0
            assert [b["server_id"] for b in final["backends"]] == ["s2", "s3"]
            assert scheduler.drained_calls == ["s1"]
            assert {(n, src) for n, _, src in scheduler.demand_calls} == {(2, "e2e-router")}
        finally:
            await scheduler.stop()

    try:
        run(scenario())
        assert router_proc is not None and stop_process(router_proc) == 0, (tmp_path / "router.log").read_text()
    finally:
        if router_proc is not None and router_proc.poll() is None:
            router_proc.kill()
        for proc, _ in servers.values():
            stop_process(proc)


# ---------------------------------------------------------------------------------------------
# Demand: the arithmetic, on made-up times


def measured(**values: object) -> RouterSection:
    base: dict[str, object] = {"server_capacity_rps": 10.0, "headroom": 0.0, "min_servers": 1,
                               "scale_down_delay_s": 60.0}
    base.update(values)
    return router_section(**base)


def test_rate_windows_count_whole_seconds_and_the_start_is_not_underestimated() -> None:
    meter = LoadMeter(10, 60, started_at=1000.0)
    for k in range(20):                 # 20 requests in [1000, 1002)
        meter.record_arrival(1000.0 + k * 0.1)
    assert meter.short_rate(1001.9) == pytest.approx(20 / 1.9)      # since the start, not / 10
    early = LoadMeter(10, 60, started_at=1000.0)
    for k in range(3):
        early.record_arrival(1000.0 + k * 0.1)
    assert early.short_rate(1000.2) == pytest.approx(3 / 1.0)       # never divided by less than 1 s
    for t in range(1002, 1100):         # then 5 requests/s for a long time
        for k in range(5):
            meter.record_arrival(t + k * 0.2)
    assert meter.short_rate(1099.9) == pytest.approx(5.0)
    assert meter.long_rate(1099.9) == pytest.approx(5.0)
    assert meter.short_rate(1105.5) == pytest.approx(4 * 5 / 10)    # 1096..1099 still in the 10 s window
    assert meter.long_rate(1200.0) == 0.0
    assert meter.total_arrivals == 20 + 98 * 5


def test_latency_percentiles_cover_the_short_window() -> None:
    meter = LoadMeter(10, 60, started_at=0.0)
    for k in range(100):
        meter.record_latency(5.0, (k + 1) / 1000)
    assert meter.latency_percentiles(5.5, 50, 99) == [pytest.approx(0.050), pytest.approx(0.099)]
    assert meter.latency_percentiles(30.0, 50) == [None]            # aged out
    assert percentile([], 50) is None and percentile([1.0], 99) == 1.0


def test_servers_for_applies_headroom_capacity_and_minimum() -> None:
    assert servers_for(0.0, headroom=0.2, capacity_rps=10, min_servers=1) == 1
    assert servers_for(0.0, headroom=0.2, capacity_rps=10, min_servers=0) == 0
    assert servers_for(50.0, headroom=0.0, capacity_rps=10, min_servers=1) == 5     # exactly full: no extra
    assert servers_for(50.0, headroom=0.2, capacity_rps=10, min_servers=1) == 6
    assert servers_for(50.1, headroom=0.0, capacity_rps=10, min_servers=1) == 6
    assert servers_for(30.0 * 1.1 / 1.1, headroom=0.1, capacity_rps=11, min_servers=1) == 3  # float noise
    assert servers_for(5.0, headroom=0.0, capacity_rps=10, min_servers=4) == 4


def test_hysteresis_scales_up_at_once_and_down_only_after_the_delay_to_the_windows_maximum() -> None:
    est = DemandEstimator(measured(scale_down_delay_s=60.0))
    need = lambda t, rate: est.evaluate(t, 0.0, rate, rate).servers_needed  # noqa: E731
    assert need(0, 45) == 5
    assert need(1, 95) == 10                      # up: immediately
    assert need(10, 35) == 10                     # lower need (4) starts the delay
    assert need(40, 55) == 10                     # still lower (6), inside the delay
    assert need(69, 25) == 10                     # 59 s below: not yet
    assert need(70, 25) == 6                      # 60 s below: down to the window's highest need (6), not 3
    assert need(71, 25) == 6                      # a new delay starts for 6 -> 3
    assert need(100, 75) == 8                     # a rise cancels the pending scale-down at once
    assert need(159, 5) == 8 and need(218, 5) == 8
    assert need(219, 5) == 1                      # min_servers
    assert need(300, 0) == 1


def test_a_starting_router_holds_what_serves_until_its_window_has_filled() -> None:
    est = DemandEstimator(measured(scale_down_delay_s=0.0, short_window_s=10.0))
    est.hold_at_least(100.0, 3)  # three servers serve when the first pool arrives
    need = lambda t, rate: est.evaluate(t, 0.0, rate, rate).servers_needed  # noqa: E731
    assert need(100.5, 0) == 3 and need(109.9, 5) == 3   # nothing measured yet: no scale-down
    assert need(105, 95) == 10                            # but a rise counts at once
    assert need(110, 5) == 1                              # window full: the load decides


def test_scale_down_delay_zero_follows_the_load() -> None:
    est = DemandEstimator(measured(scale_down_delay_s=0.0))
    assert [est.evaluate(t, 0, r, r).servers_needed for t, r in enumerate([30, 80, 20, 0])] == [3, 8, 2, 1]


def test_ewma_forecast_only_adds_capacity_and_decays_with_its_time_constant() -> None:
    ewma = RateEwma(tau_s=10.0)
    assert ewma.update(0.0, 100.0) == 100.0
    assert ewma.update(10.0, 0.0) == pytest.approx(100.0 * math.exp(-1))
    est = DemandEstimator(measured(forecast_ewma_tau_s=10.0, scale_down_delay_s=0.0))
    assert est.evaluate(0, 0, 100, 100).servers_needed == 10
    after_dip = est.evaluate(1, 0, 5, 5)
    assert after_dip.forecast_rate == pytest.approx(5 + 95 * math.exp(-0.1))
    assert after_dip.raw_need == after_dip.servers_needed == 10      # a 1 s dip releases nothing
    assert est.evaluate(100, 0, 5, 5).servers_needed == 1             # a lasting one does
    assert est.evaluate(101, 0, 200, 200).servers_needed == 20        # rises are never delayed


def test_time_of_day_profile_learns_day_over_day_and_asks_for_servers_before_the_daily_peak() -> None:
    profile = TimeOfDayProfile(buckets_per_hour=1, weight=0.5)
    day = 86_400.0
    hour = 3_600.0
    assert profile.forecast(0, hour) is None                 # nothing learned yet
    for t in range(24):                                   # day 1: 10 rps, except 100 rps at 12:00-13:00
        profile.observe(t * hour, 100.0 if t == 12 else 10.0)
    profile.observe(day, 10.0)                               # closes the last bucket
    assert profile.buckets[12] == 100.0 and profile.buckets[11] == 10.0
    assert profile.forecast(day + 11.5 * hour, 0) == 10.0
    assert profile.forecast(day + 11.5 * hour, hour) == 100.0  # 12:00 is within the look-ahead
    for t in range(1, 24):                                   # day 2: the peak was only 50 rps
        profile.observe(day + t * hour, 50.0 if t == 12 else 10.0)
    assert profile.buckets[12] == pytest.approx(75.0)        # blended, weight 0.5 for the new day

    est = DemandEstimator(measured(time_of_day_profile=True, forecast_horizon_s=hour, scale_down_delay_s=0.0))
    for t in range(25):
        est.evaluate(t * hour, t * hour, 10.0, 100.0 if t == 12 else 10.0)
    before_peak = est.evaluate(25 * hour, day + 11.25 * hour, 10.0, 10.0)
    assert before_peak.forecast_rate == 100.0 and before_peak.servers_needed == 10
    assert est.evaluate(26 * hour, day + 14 * hour, 10.0, 10.0).servers_needed == 1


@pytest.mark.parametrize("plane", PLANES)
def test_measured_demand_is_reported_when_it_changes_and_as_a_heartbeat(plane: str) -> None:
    async def scenario() -> None:
        now = [1000.0]
        async with rig("a", scheduled=True, servers_needed=None, server_capacity_rps=10.0, headroom=0.0,
                       min_servers=1, scale_down_delay_s=0.0, evaluate_interval_s=0.02, report_interval_s=0.2,
                       ports={"clock": lambda: now[0]}, plane=plane) as r:
            scheduler = r.scheduler
            assert scheduler is not None
            await r.publish(a=(r.backends["a"].url, SERVING))
            await until(lambda: scheduler.demand_calls, what="the first report")
            assert scheduler.demand_calls[0][0] == 1
            assert await r.backends_used(35) == {"a"}
            # Reported at once when the need changes (the rate may still have been rising then) ...
            await until(lambda: scheduler.demand_calls[-1][0] == 4, what="the new need reported")
            # The proxy's counters may lag its answers (HAProxy's stats are polled): all 35 counted first.
            await until(lambda: r.router.meter.short_rate(now[0]) == 35.0, what="the 35 requests metered")
            for _ in range(2):                                   # ... and, unchanged, re-sent every 0.2 s
                reports = len(scheduler.demand_calls)
                await asyncio.sleep(0.1)
                assert len(scheduler.demand_calls) == reports    # the injected clock stands still
                now[0] += 0.25
                def heartbeat(reports: int = reports) -> bool:
                    return len(scheduler.demand_calls) == reports + 1
                await until(heartbeat, what="a heartbeat")
                assert scheduler.demand_calls[-1][:2] == (4, 35.0)
            now[0] += 100.0                                     # the load is gone
            await until(lambda: scheduler.demand_calls[-1][0] == 1, what="the lower need reported")
            stats: dict[str, Any] = r.router.stats()  # the JSON of GET /aryl/stats
            assert stats["demand"]["mode"] == "measured" and stats["demand"]["servers_needed"] == 1

    run(scenario())


# ---------------------------------------------------------------------------------------------
# Configuration and command line


def test_config_requires_a_demand_mode_with_a_scheduler_and_backends_without_one(monkeypatch) -> None:
    for key in [k for k in os.environ if k.startswith("ARYL_")]:
        monkeypatch.delenv(key)
    with pytest.raises(ConfigError, match="servers_needed is required"):
        load_router_config(None, {})
    assert load_router_config(None, {"router": {"server_capacity_rps": 50.0}}).router.servers_needed is None
    with pytest.raises(ConfigError, match="static_backends is required"):
        load_router_config(None, {"router": {"scheduler_address": ""}})
    check_router_section(router_section(static_backends=["http://h:1"]))
    with pytest.raises(ConfigError, match="static_backends"):
        load_router_config(None, {"router": {"static_backends": ["h:1"], "servers_needed": 1}})
    with pytest.raises(ConfigError, match="listen"):
        load_router_config(None, {"router": {"listen": "nowhere", "servers_needed": 1}})
    monkeypatch.setenv("ARYL_ROUTER__STATIC_BACKENDS", '["http://10.0.0.7:8000", "http://10.0.0.8:8000"]')
    monkeypatch.setenv("ARYL_ROUTER__SERVER_CAPACITY_RPS", "25")
    config = load_router_config()
    assert config.router.static_backends == ["http://10.0.0.7:8000", "http://10.0.0.8:8000"]
    monkeypatch.setenv("ARYL_ROUTER__HEALTHPATH", "/x")
    with pytest.raises(ConfigError):
        load_router_config()


def test_cli_flags_map_to_config_keys() -> None:
    args = parse_args(["--listen", "0.0.0.0:9000", "--no-scheduler", "--backend", "http://a:1", "--backend",
                       "http://b:1", "--capacity-rps", "40", "--headroom", "0.5", "--min-servers", "2",
                       "--health-path", "/ready", "--data-plane", "python"])
    assert cli_overrides(args) == {"router": {
        "listen": "0.0.0.0:9000", "scheduler_address": "", "static_backends": ["http://a:1", "http://b:1"],
        "server_capacity_rps": 40.0, "headroom": 0.5, "min_servers": 2, "health_path": "/ready",
        "data_plane": "python"}}
    assert RouterSection().data_plane == "haproxy"            # the default: HAProxy carries the requests
    assert RouterSection().listen == "127.0.0.1:8080" and RouterSection().health_path == "/healthz"


def test_router_cli_refuses_bad_config_and_serves_static_backends_until_sigterm(tmp_path: Path) -> None:
    """The real aryl-router with its default data plane, HAProxy."""
    require_haproxy()
    aryl_router = str(Path(sys.executable).parent / "aryl-router")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    bad = subprocess.run([aryl_router, "--no-scheduler"], capture_output=True, text=True, env=env, timeout=60,
                         check=False)
    assert bad.returncode == 2 and "static_backends is required" in bad.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = subprocess.run([aryl_router, "--no-scheduler", "--backend", "http://127.0.0.1:1", "--listen",
                               f"127.0.0.1:{taken.getsockname()[1]}"], capture_output=True, text=True, env=env,
                              timeout=60, check=False)
    assert busy.returncode == 2 and "cannot serve on" in busy.stderr
    server, server_url = start_example_server(0, "solo")
    port = free_port()
    router = subprocess.Popen([aryl_router, "--no-scheduler", "--backend", server_url, "--listen",
                               f"127.0.0.1:{port}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        async def scenario() -> None:
            async with aiohttp.ClientSession() as session:
                for _ in range(600):
                    assert router.poll() is None
                    try:
                        async with session.get(f"http://127.0.0.1:{port}/aryl/healthz") as response:
                            if response.status == 200:
                                break
                    except aiohttp.ClientConnectionError:
                        await asyncio.sleep(0.05)
                async with session.post(f"http://127.0.0.1:{port}/v1/infer", json={"input": "ab"}) as response:
                    assert response.status == 200 and (await response.json())["output"] == "ba"
                async with session.post(f"http://127.0.0.1:{port}/v1/infer", data=b"{") as response:
                    assert response.status == 400      # the backend's answer, relayed as is
                async with session.get(f"http://127.0.0.1:{port}/aryl/stats") as response:
                    stats = json.loads(await response.text())
                assert stats["backends"][0]["requests"] == 2 and stats["demand"]["mode"] == "off"

        run(scenario())
        assert stop_process(router) == 0
    finally:
        if router.poll() is None:
            router.kill()
        stop_process(server)
