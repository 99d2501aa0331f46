"""The router as HAProxy's controller: a real HAProxy process (started by the router), real sockets, no mocks.

- The router programs HAProxy's slots over its runtime API as the serving pool changes (read back with
  ``show servers state``) and takes the load from its statistics (every request sent is counted once).
- Traffic through HAProxy during a loan (drain, ReportDrained, the model server stops) and a reclaim (a
  new model server, SERVING again; published before it listens) finds no failed request.
- HAProxy's own answers (503 with a JSON body), retries of a dead backend, health checks, a soft stop,
  a dead HAProxy restarted and reprogrammed, and a missing HAProxy named with how to install it.

HAProxy missing is a failure that says how to install it, never a skip (``require_haproxy``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import generate_latest

from inference_router.haproxy import MAX_SOCKET_PATH, POOL_BACKEND, RuntimeApi
from tests.helpers import free_port, scaled_timeout
from tests.router_rig import (
    DRAINING,
    SERVING,
    FakeScheduler,
    RouterLoad,
    require_haproxy,
    rig,
    run,
    served,
    start_example_server,
    stop_process,
    until,
)

ARYL_ROUTER = str(Path(sys.executable).parent / "aryl-router")
EXAMPLE_SERVER = str(Path(__file__).resolve().parents[2] / "examples" / "inference_server.py")


FORCED_MAINT, FORCED_DRAIN = 0x1, 0x8   # srv_admin_state bits the runtime API's "set server ... state" sets


async def slot_states(api: RuntimeApi) -> dict[str, tuple[str, int, int]]:
    """``show servers state``: slot -> (address, port, forced admin state: 0 ready, FORCED_DRAIN) for the
    slots not in forced maintenance."""
    text = await api.command(f"show servers state {POOL_BACKEND}")
    rows = [line.split() for line in text.splitlines()[1:] if line and not line.startswith("#")]
    # columns: be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state ... srv_port (index 18)
    forced = {r[3]: int(r[6]) & (FORCED_MAINT | FORCED_DRAIN) for r in rows}
    return {r[3]: (r[4], int(r[18]), forced[r[3]]) for r in rows if not forced[r[3]] & FORCED_MAINT}


def test_the_router_programs_haproxy_and_reads_the_load_from_its_statistics() -> None:
    require_haproxy()

    async def scenario() -> None:
        async with rig("a", "b", scheduled=True, plane="haproxy") as r:
            assert r.router.plane is not None and r.scheduler is not None
            api = r.router.plane.api
            a, b = r.backends["a"], r.backends["b"]
            assert await slot_states(api) == {}
            await r.publish(a=(a.url, SERVING), b=(b.url, SERVING))
            ports = {int(url.rsplit(":", 1)[1]) for url in (a.url, b.url)}
            programmed = await slot_states(api)
            assert {port for _, port, _ in programmed.values()} == ports
            assert {admin for _, _, admin in programmed.values()} == {0}          # ready
            assert await r.backends_used(20) == {"a", "b"}
            await r.router.refresh_stats()
            assert r.router.requests_arrived == 20 and r.router.meter.total_arrivals == 20
            stats: dict[str, Any] = r.router.stats()  # the JSON of GET /aryl/stats
            backends = {x["server_id"]: x for x in stats["backends"]}
            assert backends["a"]["requests"] == a.arrivals and backends["b"]["requests"] == b.arrivals
            assert a.arrivals + b.arrivals == 20

            await r.change("b", DRAINING)
            slot_b = r.router.plane.slot_of("b")
            assert slot_b is not None
            assert (await slot_states(api))[slot_b.name][2] == FORCED_DRAIN
            await until(lambda: r.scheduler is not None and r.scheduler.drained_calls == ["b"], what="b drained")
            await until(lambda: "b" not in r.router.pool.backends, what="b loaned")
            await until(lambda: r.router.programmed_version >= r.router.pool.version, what="b out of haproxy")
            assert slot_b.name not in await slot_states(api)                      # back in maintenance
            assert await r.backends_used(10) == {"a"}

            scraped = generate_latest(r.router.metrics.registry).decode()
            await r.router.refresh_stats()
            assert r.router.requests_arrived == 30
            assert 'aryl_router_requests_total{code="2xx"}' in scraped
            assert r.router.stats()["responses_failed"] == 0

    run(scenario())


def test_haproxy_answers_503_in_json_when_nothing_is_routable_and_retries_a_dead_backend_elsewhere() -> None:
    require_haproxy()

    async def scenario() -> None:
        dead = f"http://127.0.0.1:{free_port()}"
        async with rig("live", scheduled=True, plane="haproxy", max_attempts=3) as r:
            await r.publish()
            status, body = await r.infer()
            assert status == 503 and body["error"] == "no_backend_available"
            await r.publish(dead=(dead, SERVING), live=(r.backends["live"].url, SERVING))
            assert await r.backends_used(10) == {"live"}                          # every one answered 200
            await r.router.refresh_stats()
            assert r.router.responses_failed == 1 and r.router.requests_arrived == 11  # the 503 counts as load
            assert r.router.retries >= 1                                          # HAProxy's, read back

    run(scenario())


def test_haproxy_health_checks_take_a_failing_backend_out_and_put_it_back() -> None:
    require_haproxy()

    async def scenario() -> None:
        async with rig("a", "b", plane="haproxy", health_check_interval_s=0.1) as r:
            b = r.backends["b"]
            router = r.router

            async def healthy(url: str) -> bool:
                await router.refresh_stats()
                return router.healthy(router.pool.backends[url], 0.0)

            async def turns(want: bool) -> None:
                while await healthy(b.url) != want:  # noqa: ASYNC110 - HAProxy's checks are read by polling
                    await asyncio.sleep(0.05)

            assert await r.backends_used(6) == {"a", "b"}
            b.healthy = False
            await asyncio.wait_for(turns(False), scaled_timeout(15))
            assert await r.backends_used(6) == {"a"}
            b.healthy = True
            await asyncio.wait_for(turns(True), scaled_timeout(15))
            assert await r.backends_used(6) == {"a", "b"}

    run(scenario())


def test_stopping_the_router_lets_haproxy_finish_requests_in_flight() -> None:
    require_haproxy()

    async def scenario() -> None:
        async with rig("a", plane="haproxy") as r:
            backend = r.backends["a"]
            backend.hold()
            pending = asyncio.create_task(r.infer())
            await until(lambda: backend.in_flight == 1, what="the request at the backend")
            stopping = asyncio.create_task(r.router.stop())
            plane = r.router.plane
            assert plane is not None
            await until(lambda: plane.soft_stop_sent, what="HAProxy told to stop (SIGUSR1)")
            assert not pending.done()
            backend.release()
            status, body = await pending
            assert status == 200 and body["backend"] == "a"
            await stopping

    run(scenario())


def test_a_dead_haproxy_is_restarted_and_given_the_pool_again() -> None:
    require_haproxy()

    async def scenario() -> None:
        async with rig("a", "b", scheduled=True, plane="haproxy", reconnect_max_backoff_s=0.5) as r:
            plane = r.router.plane
            assert plane is not None
            await r.publish(a=(r.backends["a"].url, SERVING), b=(r.backends["b"].url, SERVING))
            first = plane.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)            # the HAProxy this test's router started
            await until(lambda: plane.restarts == 1 and plane.pid != first, timeout=30, what="haproxy restarted")
            await until(lambda: len(plane.by_server) == 2, timeout=30, what="the pool given to the new haproxy")
            assert await r.backends_used(10) == {"a", "b"}
            await r.change("b", DRAINING)             # and the new one is programmed as before
            assert await r.backends_used(6) == {"a"}


def test_without_haproxy_the_router_exits_2_and_says_how_to_install_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env["ARYL_ROUTER__HAPROXY_BINARY"] = str(tmp_path / "no-haproxy-here")
    done = subprocess.run([ARYL_ROUTER, "--no-scheduler", "--backend", "http://127.0.0.1:1", "--listen",
                           f"127.0.0.1:{free_port()}"], capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    assert done.returncode == 2, done.stderr
    assert "apt-get install haproxy" in done.stderr and 'data_plane = "python"' in done.stderr


def test_no_request_fails_through_haproxy_during_a_loan_and_a_reclaim(tmp_path: Path) -> None:
    """Three model servers behind the real aryl-router (HAProxy) and a fake scheduler, under a steady load of
    concurrent POSTs. Loan: s3 DRAINING -> the router reports it drained only once nothing is in flight
    there -> LOANED (out of the pool) -> its model server stops (training takes the GPUs). Reclaim: s3
    SERVING again at a new model server's address, published before that server listens (connections
    refused meanwhile are retried on another server). Not one request may fail."""
    require_haproxy()
    servers = {name: start_example_server(5, name) for name in ("s1", "s2", "s3")}
    router_proc: subprocess.Popen | None = None
    port = free_port()
    reclaimed_port = free_port()
    reclaimed: subprocess.Popen | None = None

    async def scenario() -> None:
        nonlocal router_proc, reclaimed
        scheduler = await FakeScheduler().start()
        scheduler.set(**{name: (url, SERVING) for name, (_, url) in servers.items()})
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env.update(ARYL_ROUTER__INSECURE="true", ARYL_ROUTER__HEALTH_CHECK_INTERVAL_S="0.5")
        log = (tmp_path / "router.log").open("wb")
        router_proc = await asyncio.to_thread(
            subprocess.Popen,
            [ARYL_ROUTER, "--listen", f"127.0.0.1:{port}", "--scheduler", scheduler.address, "--servers-needed",
             "2", "--interval", "0.5", "--source", "loan-test"],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )
        load = RouterLoad(f"http://127.0.0.1:{port}")
        statuses, stats = load.statuses, load.stats

        try:
            async with aiohttp.ClientSession() as session:
                async def routing_to(count: int) -> bool:
                    try:
                        found = await stats(session)
                    except aiohttp.ClientConnectionError:
                        return False
                    return sum(1 for b in found["backends"] if b["routable"]) == count

                async def ready() -> None:
                    while not await routing_to(3):
                        assert router_proc is not None and router_proc.poll() is None, \
                            (tmp_path / "router.log").read_text()
                        await asyncio.sleep(0.05)

                await asyncio.wait_for(ready(), scaled_timeout(60))
                clients = [asyncio.create_task(load.client(session)) for _ in range(8)]
                await until(lambda: len(statuses) > 200, timeout=30, what="load flowing")

                # The loan.
                scheduler.change("s3", DRAINING)
                await until(lambda: scheduler.drained_calls == ["s3"], timeout=30, what="s3 reported drained")
                s3_url = servers["s3"][1]
                s3_served = await served(session, s3_url)
                mark = len(statuses)
                await until(lambda: len(statuses) > mark + 200, timeout=30, what="load while s3 is loaned")
                assert await served(session, s3_url) == s3_served          # nothing after its drain was reported
                assert stop_process(servers["s3"][0]) == 0                 # training takes the server

                # The reclaim: a new model server, published SERVING before it listens.
                scheduler.change("s3", SERVING, f"http://127.0.0.1:{reclaimed_port}")
                mark = len(statuses)
                await until(lambda: len(statuses) > mark + 100, timeout=30, what="load after the reclaim")
                reclaimed = await asyncio.to_thread(
                    subprocess.Popen,
                    [sys.executable, EXAMPLE_SERVER,
                     "--port", str(reclaimed_port), "--service-time-ms", "5", "--concurrency", "4",
                     "--server-id", "s3-again"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                new_s3 = f"http://127.0.0.1:{reclaimed_port}"

                async def s3_serves_again() -> bool:
                    try:
                        return await served(session, new_s3) > 20
                    except aiohttp.ClientConnectionError:
                        return False

                async def serving_again() -> None:
                    while not await s3_serves_again():  # noqa: ASYNC110 - another process's counter, polled
                        await asyncio.sleep(0.05)

                await asyncio.wait_for(serving_again(), scaled_timeout(60))
                load.stop.set()
                await asyncio.gather(*clients)
                final = await stats(session)
            sent = len(statuses)
            assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
            assert final["responses_failed"] == 0
            assert final["requests"] == sent          # HAProxy counted every request: the load signal is whole
            assert sorted(b["server_id"] for b in final["backends"] if b["routable"]) == ["s1", "s2", "s3"]
            assert scheduler.drained_calls == ["s3"]
        finally:
            await scheduler.stop()

    try:
        run(scenario(), timeout=240)
        assert router_proc is not None and stop_process(router_proc) == 0, (tmp_path / "router.log").read_text()
    finally:
        if router_proc is not None and router_proc.poll() is None:
            router_proc.kill()
        for proc, _ in servers.values():
            if proc.poll() is None:
                stop_process(proc)
        if reclaimed is not None:
            stop_process(reclaimed)


def test_haproxy_starts_under_a_temporary_directory_too_long_for_a_unix_socket(tmp_path: Path, monkeypatch) -> None:
    """HAProxy refuses a stats socket path over 97 bytes; a long TMPDIR (pytest's, a CI job's) must not stop it."""
    require_haproxy()
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))

    async def scenario() -> None:
        async with rig("a", plane="haproxy") as r:
            assert r.router.plane is not None and len(str(r.router.plane.socket_path)) <= MAX_SOCKET_PATH
            assert await r.backends_used(2) == {"a"}

    run(scenario())


def test_an_endpoint_haproxy_cannot_take_is_named_and_its_drain_is_reported_at_once() -> None:
    """An https:// endpoint (the Python data plane's business) never gets a slot: /aryl/stats says why, the
    rest of the pool is routed to, and its drain is acknowledged at once (nothing can be in flight there)."""
    require_haproxy()

    async def scenario() -> None:
        async with rig("a", scheduled=True, plane="haproxy") as r:
            assert r.scheduler is not None
            await r.publish(a=(r.backends["a"].url, SERVING), x=("https://127.0.0.1:1", SERVING))
            stats: dict[str, Any] = r.router.stats()  # the JSON of GET /aryl/stats
            x = next(b for b in stats["backends"] if b["server_id"] == "x")
            assert not x["routable"] and "http:// endpoints only" in x["unroutable_because"]
            assert await r.backends_used(4) == {"a"}
            await r.change("x", DRAINING)
            await until(lambda: r.scheduler is not None and r.scheduler.drained_calls == ["x"], what="x drained")

    run(scenario())
