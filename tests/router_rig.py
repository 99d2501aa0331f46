"""The inference router's test rig: in-process HTTP backends and a fake scheduler over real sockets, a
started router over them, and the example inference server as a process. Shared by the router's tests
(``test_router.py``, ``test_router_haproxy.py``) and ``test_metrics.py``.

- ``FakeBackend``: an aiohttp backend; ``hold()`` parks requests until ``release()``.
- ``FakeScheduler``: a real grpc.aio ``InferenceService`` that implements WatchServingPool / ReportDrained /
  ReportDemand the way the contract in ``inference.proto`` says.
- ``rig(...)``: backends, a router over them (static, or over the fake scheduler's pool), a client session;
  ``plane`` picks the data plane (``haproxy``: a real HAProxy process the router starts and programs).
- ``require_haproxy()``: the HAProxy executable, or a failure that says how to install it -- never a skip:
  HAProxy is the router's default data plane, and ``make test`` installs it.

Waits poll a condition (``until``) within a timeout that ``ARYL_TEST_TIMEOUT_FACTOR`` stretches.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web

from inference_router.config import RouterSection
from inference_router.haproxy import HaproxyError, find_haproxy
from inference_router.router import Router
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, types_pb2
from tests.helpers import scaled_timeout

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SERVER = ROOT / "examples" / "inference_server.py"
SERVING, DRAINING, LOANED = (types_pb2.SERVER_STATE_SERVING, types_pb2.SERVER_STATE_DRAINING,
                             types_pb2.SERVER_STATE_LOANED)
PLANES = ("haproxy", "python")


def require_haproxy() -> str:
    """The haproxy executable; the test fails (never skips) when there is none."""
    try:
        return find_haproxy("haproxy")
    except HaproxyError as exc:
        pytest.fail(f"HAProxy is the router's data plane and these tests run it: {exc}")


def run(coro: Awaitable[None], timeout: float = 120.0) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(coro, scaled_timeout(timeout))

    asyncio.run(bounded())


async def until(predicate: Callable[[], object], *, timeout: float = 15.0, what: str = "condition") -> None:
    """``tests.helpers.wait_for`` for a coroutine: poll without blocking the loop, within ``timeout`` as
    ARYL_TEST_TIMEOUT_FACTOR stretches it."""
    timeout = scaled_timeout(timeout)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.01)


def router_section(**values: object) -> RouterSection:
    """Test settings: any free port, no scheduler, no active health checks, the python data plane unless
    ``data_plane`` says otherwise."""
    base: dict[str, object] = {
        "listen": "127.0.0.1:0", "scheduler_address": "", "health_check_interval_s": 0,
        "shutdown_timeout_s": 5, "connect_timeout_s": 2, "source": "test-router",
        "insecure": True,  # its schedulers are the in-process FakeScheduler, which listens in plaintext
        "data_plane": "python",
    }
    base.update(values)
    return RouterSection(**base)


# ---------------------------------------------------------------------------------------------
# Fakes over real sockets


class FakeBackend:
    """An in-process HTTP backend; ``hold()`` parks requests until ``release()``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrivals = 0
        self.in_flight = 0
        self.healthy = True
        self.last_headers: dict[str, str] = {}
        self._gate: asyncio.Event | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    def hold(self) -> None:
        self._gate = asyncio.Event()

    def release(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self._gate = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.arrivals += 1
        self.in_flight += 1
        self.last_headers = dict(request.headers)
        try:
            body = await request.read()
            if self._gate is not None:
                await self._gate.wait()
            if request.path == "/echo":
                return web.Response(body=body, headers={"X-Backend": self.name, "Connection": "keep-alive",
                                                        "Keep-Alive": "timeout=5", "X-Custom": "kept"})
            return web.json_response({"backend": self.name, "path": request.path_qs, "body_len": len(body)})
        finally:
            self.in_flight -= 1

    async def _health(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": self.healthy}, status=200 if self.healthy else 503)

    async def start(self) -> FakeBackend:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/healthz", self._health)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def stop(self) -> None:
        self.release()
        if self._runner is not None:
            await self._runner.cleanup()


class FakeScheduler(inference_pb2_grpc.InferenceServiceServicer):
    """The scheduler's side of the router contract, in memory, behind a real grpc.aio server.

    ReportDrained moves a DRAINING server to LOANED (it leaves the pool) and answers
    FAILED_PRECONDITION otherwise; ``drained_errors`` scripts failures to answer first.
    """

    def __init__(self) -> None:
        self.servers: dict[str, tuple[str, types_pb2.ServerState]] = {}
        self.version = 0
        self.drained_calls: list[str] = []
        self.drained_errors: list[grpc.StatusCode] = []
        self.demand_calls: list[tuple[int, float, str]] = []
        self.watchers = 0
        self._changed: asyncio.Condition | None = None
        self._server: grpc.aio.Server | None = None
        self.address = ""

    def set(self, **states: tuple[str, types_pb2.ServerState]) -> None:
        """Replace the pool: ``set(a=(url, SERVING), ...)`` and push it to watchers."""
        self.servers = dict(states)
        self._bump()

    def change(self, server_id: str, state: types_pb2.ServerState | None, endpoint: str | None = None) -> None:
        if state is None:
            self.servers.pop(server_id, None)
        else:
            self.servers[server_id] = (endpoint or self.servers[server_id][0], state)
        self._bump()

    def _bump(self) -> None:
        self.version += 1
        assert self._changed is not None
        changed = self._changed

        async def notify() -> None:
            async with changed:
                changed.notify_all()

        asyncio.get_running_loop().create_task(notify())

    def _message(self) -> inference_pb2.ServingPool:
        return inference_pb2.ServingPool(
            servers=[inference_pb2.RoutableServer(server_id=sid, endpoint=url, state=state)
                     for sid, (url, state) in sorted(self.servers.items()) if state in (SERVING, DRAINING)],
            version=self.version,
        )

    async def WatchServingPool(self, request, context):
        assert self._changed is not None
        self.watchers += 1
        sent = -1
        while True:
            async with self._changed:
                def changed(sent: int = sent) -> bool:
                    return self.version != sent
                await self._changed.wait_for(changed)
                sent, message = self.version, self._message()
            yield message

    async def ReportDrained(self, request, context):
        self.drained_calls.append(request.server_id)
        if self.drained_errors:
            await context.abort(self.drained_errors.pop(0), "scripted failure")
        _, state = self.servers.get(request.server_id, ("", LOANED))
        if state != DRAINING:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{request.server_id} is not DRAINING")
        self.change(request.server_id, LOANED)
        return inference_pb2.ReportDrainedResponse(state=LOANED)

    async def ReportDemand(self, request, context):
        self.demand_calls.append((request.servers_needed, request.observed_rps, request.source))
        return inference_pb2.ReportDemandResponse(
            demand=types_pb2.InferenceDemand(servers_needed=request.servers_needed, source=request.source),
            servers_serving=sum(1 for _, s in self.servers.values() if s == SERVING),
        )

    async def start(self, port: int = 0) -> FakeScheduler:
        self._changed = asyncio.Condition()
        self._server = grpc.aio.server()
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)


async def started_router(config: RouterSection, **ports: object) -> Router:
    if config.data_plane == "haproxy":
        require_haproxy()
    router = Router.from_config(config, **ports)
    await router.start()
    await until(lambda: len(router.pool.backends) == len(config.static_backends), what="the static pool")
    await until(lambda: router.programmed_version >= router.pool.version, what="the static pool in the data plane")
    return router


@dataclass
class Rig:
    """A started router over in-process backends, with a client session; the fake scheduler if any."""

    router: Router
    backends: dict[str, FakeBackend]
    scheduler: FakeScheduler | None
    session: aiohttp.ClientSession

    async def infer(self, path: str = "/v1/infer") -> tuple[int, dict]:
        async with self.session.post(self.router.url + path, json={"input": "x"}) as response:
            return response.status, await response.json()

    async def infer_many(self, n: int) -> list[tuple[int, dict]]:
        return [await self.infer() for _ in range(n)]

    async def backends_used(self, n: int) -> set[str]:
        results = await self.infer_many(n)
        assert {status for status, _ in results} == {200}, results
        return {body["backend"] for _, body in results}

    async def publish(self, **states: tuple[str, types_pb2.ServerState]) -> None:
        """Set the fake scheduler's pool and wait until the router has it."""
        assert self.scheduler is not None
        self.scheduler.set(**states)
        version = self.scheduler.version
        await until(lambda: self.router.programmed_version >= version, what=f"pool version {version} routed by")

    async def chance_to_act(self, seconds: float = 0.2) -> None:
        """Give the router every chance to do what a test says it must not (a premature report): ``seconds``,
        and with HAProxy also two statistics samples taken after now, which is what its drains wait on."""
        await asyncio.sleep(seconds)
        plane = self.router.plane
        if plane is not None:
            since = asyncio.get_running_loop().time()
            for _ in range(2):
                def sampled(since: float = since) -> bool:
                    return plane.last_sample is not None and plane.last_sample.taken_at > since
                await until(sampled, what="a haproxy statistics sample")
                assert plane.last_sample is not None
                since = plane.last_sample.taken_at

    async def change(self, server_id: str, state: types_pb2.ServerState | None, endpoint: str | None = None) -> None:
        assert self.scheduler is not None
        self.scheduler.change(server_id, state, endpoint)
        version = self.scheduler.version
        await until(lambda: self.router.programmed_version >= version, what=f"pool version {version} routed by")


@contextlib.asynccontextmanager
async def rig(*names: str, scheduled: bool = False, extra_backends: tuple[str, ...] = (),
              ports: dict[str, object] | None = None, plane: str = "python", **config: object) -> AsyncIterator[Rig]:
    """Backends named ``names``; a router over them (static), or over a fake scheduler's pool
    (``scheduled``: the pool starts empty, fill it with ``Rig.publish``)."""
    scheduler = await FakeScheduler().start() if scheduled else None
    backends = {name: await FakeBackend(name).start() for name in names}
    if scheduler is not None:
        config = {"scheduler_address": scheduler.address, "servers_needed": 1, **config}
    else:
        config = {"static_backends": [*extra_backends, *(b.url for b in backends.values())], **config}
    router = await started_router(router_section(data_plane=plane, **config), **(ports or {}))
    try:
        async with aiohttp.ClientSession() as session:
            yield Rig(router, backends, scheduler, session)
    finally:
        await router.stop()
        if scheduler is not None:
            await scheduler.stop()
        for backend in backends.values():
            await backend.stop()



@dataclass
class RouterLoad:
    """Clients that POST ``/v1/infer`` through the router at ``url`` back to back until ``stop`` is set, each
    answer checked against the example server's (the input reversed) and its status kept."""

    url: str
    statuses: list[int] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, session: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            async with session.post(self.url + "/v1/infer", json={"input": "abc"}) as response:
                body = await response.json()
                self.statuses.append(response.status)
                assert response.status != 200 or body["output"] == "cba", body

    async def stats(self, session: aiohttp.ClientSession) -> dict:
        """The router's /aryl/stats."""
        async with session.get(self.url + "/aryl/stats") as response:
            return await response.json()


async def served(session: aiohttp.ClientSession, server_url: str) -> int:
    """Requests an example inference server has answered (its /stats)."""
    async with session.get(server_url + "/stats") as response:
        return (await response.json())["served"]


def start_example_server(service_time_ms: float, server_id: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLE_SERVER), "--port", "0", "--service-time-ms", str(service_time_ms),
         "--concurrency", "4", "--server-id", server_id],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    return proc, line.split()[-1]


def stop_process(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise

