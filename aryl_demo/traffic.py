"""The demo's inference traffic: an open-loop load generator through the router, the periodic line that
reports it beside the router's measured demand, and what the router and model servers say about
themselves.

Nouns: the *rate* is the requests per second offered (the story sets it); a request is *ok* when the
router's model server answered 200, and every other outcome is a *failure*, kept for the summary;
*served_by* counts the answers per inference server. This module never changes the cluster.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import aiohttp

from aryl_demo.output import line
from arylctl.client import ArylClient
from protos.aryl.v1 import types_pb2


@dataclass
class Traffic:
    """An open-loop load generator: ``rate`` requests per second through the router, counted."""

    url: str
    rate: float = 0.0
    sent: int = 0
    ok: int = 0
    failed: list[str] = field(default_factory=list)
    served_by: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            tasks: set[asyncio.Task[None]] = set()
            next_at = time.monotonic()
            while not self.stop.is_set():
                if self.rate > 0:
                    task = asyncio.create_task(self._one(session))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    next_at += 1.0 / self.rate
                else:
                    next_at = time.monotonic() + 0.1
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            if tasks:
                await asyncio.gather(*tasks)

    async def _one(self, session: aiohttp.ClientSession) -> None:
        self.sent += 1
        try:
            async with session.post(f"{self.url}/v1/infer", json={"input": f"request {self.sent}"}) as response:
                body = await response.json(content_type=None)
                if response.status == 200:
                    self.ok += 1
                    server = str(body.get("server_id", "?"))
                    self.served_by[server] = self.served_by.get(server, 0) + 1
                else:
                    self.failed.append(f"HTTP {response.status}: {body}")
        except Exception as exc:  # noqa: BLE001 - every failure is counted and shown in the summary
            self.failed.append(f"{type(exc).__name__}: {exc}")


def traffic_reporter(traffic: Traffic, client: ArylClient, stop: threading.Event) -> None:
    while not stop.wait(5.0):
        try:
            demand = client.get_demand()
            serving = sum(s.state == types_pb2.SERVER_STATE_SERVING for s in client.list_servers(
                pool=types_pb2.POOL_INFERENCE))
            line(f"  load   {traffic.rate:4.0f} req/s offered, router measured {demand.observed_rps:.1f} req/s and "
                 f"asks for {demand.servers_needed} server(s), {serving} serving; requests ok {traffic.ok}, "
                 f"failed {len(traffic.failed)}")
        except Exception:  # noqa: BLE001 - the scheduler may be stopping
            return


def model_served(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=2) as response:
        return int(json.load(response)["served"])


def router_plane(port: int) -> str:
    """What carries the requests, from the router's /aryl/stats: e.g. "haproxy (pid 4242), 3 of 64 server slots"."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/aryl/stats", timeout=2) as response:
        stats = json.load(response)
    haproxy = stats.get("haproxy")
    if not haproxy:
        return str(stats.get("data_plane", "python"))
    return f"haproxy (pid {haproxy['pid']}), {haproxy['slots_used']} of {haproxy['slots']} server slots programmed"


def router_ready(port: int, servers: int) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/aryl/stats", timeout=2) as response:
        stats = json.load(response)
    backends = stats.get("backends", [])
    return sum(1 for b in backends if b.get("state") == "SERVING" and b.get("healthy", True)) >= servers

