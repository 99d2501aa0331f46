"""A tiny CPU-only inference server for demos, tests and benchmarks (pure Python, aiohttp).

    python examples/inference_server.py --port 8001 [--host 127.0.0.1] [--service-time-ms 20]
                                        [--concurrency 8] [--server-id NAME]

- ``POST /v1/infer`` with ``{"input": ...}`` -> ``{"output": ..., "server_id": ..., "service_time_ms": ...}``
  after the simulated service time. At most ``--concurrency`` requests are served at once (a GPU
  has a fixed number of slots); the rest wait in line, so the server's throughput is about
  ``concurrency / service_time``. The "model" reverses a string input and echoes anything else.
- ``GET /healthz`` -> ``{"status": "ok", ...}`` (what the router's active health check asks).
- ``GET /stats`` -> requests served, in flight, and the most in flight at once.

It prints ``listening on http://HOST:PORT`` once it accepts connections (``--port 0``: any free port),
and stops on SIGTERM/SIGINT after finishing the requests it has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys

from aiohttp import web


class InferenceServer:
    def __init__(self, server_id: str, service_time_s: float, concurrency: int) -> None:
        self.server_id = server_id
        self.service_time_s = service_time_s
        self.slots = asyncio.Semaphore(concurrency)
        self.served = 0
        self.in_flight = 0
        self.max_in_flight = 0

    async def infer(self, request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": "invalid_json", "detail": "the body must be a JSON object"}, status=400)
        if not isinstance(payload, dict) or "input" not in payload:
            return web.json_response({"error": "missing_input", "detail": 'send {"input": ...}'}, status=400)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            async with self.slots:
                if self.service_time_s > 0:
                    await asyncio.sleep(self.service_time_s)
                value = payload["input"]
                output = value[::-1] if isinstance(value, str) else value
        finally:
            self.in_flight -= 1
        self.served += 1
        return web.json_response({"output": output, "server_id": self.server_id,
                                  "service_time_ms": self.service_time_s * 1000})

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "server_id": self.server_id})

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response({"server_id": self.server_id, "served": self.served, "in_flight": self.in_flight,
                                  "max_in_flight": self.max_in_flight})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/infer", self.infer)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/stats", self.stats)
        return app


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Tiny CPU-only inference server (simulated service time).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (printed at start)")
    parser.add_argument("--service-time-ms", type=float, default=20.0, help="simulated time per request")
    parser.add_argument("--concurrency", type=int, default=8, help="requests served at once; others queue")
    parser.add_argument("--server-id", default=f"{socket.gethostname()}:{os.getpid()}")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    server = InferenceServer(args.server_id, args.service_time_ms / 1000.0, max(1, args.concurrency))
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=10.0)
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    print(f"listening on http://{args.host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in ("SIGTERM", "SIGINT"):
        loop.add_signal_handler(getattr(__import__("signal"), sig), stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    asyncio.run(serve(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
