"""The inference router's cost per request: latency through ``aryl-router`` vs calling the backend directly.

One example inference server (``examples/inference_server.py``, service time 0) and one router
(``aryl-router --no-scheduler --backend URL``, default settings: keep-alive pooling, active health
checks) run as their own processes on loopback, so the load generator never shares their GIL. An
open-loop generator in this process sends ``POST /v1/infer`` at a fixed rate (1,000 requests/s) for
``duration_s`` (10 s; 2 s with ``--quick``): request *k* is started at ``t0 + k / rate`` whether or
not earlier ones have finished. The same generator first calls the backend directly (the reference),
then through the router; each phase is preceded by a 1 s warm-up that is not counted.

Figures: ``router_latency_p50`` / ``router_latency_p99`` (ms, through the router) with the direct
call's percentile as reference and ``added_ms`` = the difference. ``generator_lag_p99_ms`` says how
late the generator started its requests (if it is large, the machine was too busy to hold the rate
and the figures understate queueing). ``errors`` counts non-200 answers and failed connections.
``router_cpu_ms_per_request`` is the router process's CPU time per request (from ``/proc``), which a busy
machine moves far less than latency.

Never: assert on timings, or use a port it did not get from the OS.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from aryl_common.ports import free_loopback_port
from benchmarks import emit_figure
from benchmarks.bench_service import QUICK, BenchContext, Benchmark
from inference_router.demand import percentile

log = logging.getLogger("aryl.bench")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SERVER = ROOT / "examples" / "inference_server.py"
RATE_RPS = 1000
WARM_UP_S = 1.0
READY_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Phase:
    latencies_s: list[float]
    lags_s: list[float]
    errors: int


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux ``/proc``); None where it cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def _process(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.poll() is not None:
                program = proc.args[1] if isinstance(proc.args, list) else proc.args  # _process passes a list
                raise RuntimeError(f"{program!s} exited with {proc.returncode}: "
                                   f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not ready after {READY_TIMEOUT_S}s")
            await asyncio.sleep(0.05)


async def _open_loop(session: aiohttp.ClientSession, url: str, rate: float, duration_s: float) -> Phase:
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    lags: list[float] = []
    errors = 0
    body = b'{"input": "benchmark"}'
    headers = {"Content-Type": "application/json"}

    async def one(intended: float) -> None:
        nonlocal errors
        started = loop.time()
        lags.append(started - intended)
        try:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    errors += 1
                    return
        except aiohttp.ClientError:
            errors += 1
            return
        latencies.append(loop.time() - started)

    count = int(rate * duration_s)
    t0 = loop.time() + 0.05
    tasks = []
    for k in range(count):
        intended = t0 + k / rate
        delay = intended - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(intended)))
    await asyncio.gather(*tasks)
    return Phase(sorted(latencies), sorted(lags), errors)


async def _measure(url: str, duration_s: float) -> Phase:
    # A bounded pool like the router's own, so both paths reuse keep-alive connections the same way.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as session:
        await _open_loop(session, url, RATE_RPS, WARM_UP_S)
        return await _open_loop(session, url, RATE_RPS, duration_s)


def run_router_latency(ctx: BenchContext) -> None:
    duration_s = 2.0 if ctx.sizes is QUICK else 10.0
    backend_port, router_port = free_loopback_port(), free_loopback_port()
    backend = f"http://127.0.0.1:{backend_port}"
    router = f"http://127.0.0.1:{router_port}"
    aryl_router = str(Path(sys.executable).parent / "aryl-router")
    server_args = [sys.executable, str(EXAMPLE_SERVER), "--port", str(backend_port), "--service-time-ms", "0",
                   "--concurrency", "10000", "--server-id", "bench"]
    router_args = [aryl_router, "--no-scheduler", "--backend", backend, "--listen", f"127.0.0.1:{router_port}"]
    with _process(server_args) as server_proc, _process(router_args) as router_proc:
        asyncio.run(_wait_ready(backend + "/healthz", server_proc))
        asyncio.run(_wait_ready(router + "/aryl/healthz", router_proc))
        log.info("router_latency: %d requests/s for %.0f s, direct then through the router", RATE_RPS, duration_s)
        direct = asyncio.run(_measure(backend + "/v1/infer", duration_s))
        cpu_before = _cpu_s(router_proc.pid)
        routed = asyncio.run(_measure(router + "/v1/infer", duration_s))
        cpu_after = _cpu_s(router_proc.pid)
    # Includes the warm-up second's requests, which the router served too.
    router_cpu_ms = (None if cpu_before is None or cpu_after is None
                     else (cpu_after - cpu_before) * 1000 / (RATE_RPS * (duration_s + WARM_UP_S)))
    common = {"rate_rps": RATE_RPS, "duration_s": duration_s, "requests": int(RATE_RPS * duration_s),
              "service_time_ms": 0}
    for q in (50, 99):
        via, ref = percentile(routed.latencies_s, q), percentile(direct.latencies_s, q)
        if via is None or ref is None:
            raise RuntimeError(f"no successful requests (direct errors {direct.errors}, routed {routed.errors})")
        emit_figure(
            f"router_latency_p{q}", via * 1000, "ms",
            reference_name=f"direct_latency_p{q}", reference_value=ref * 1000, reference_unit="ms",
            added_ms=(via - ref) * 1000, errors=routed.errors, reference_errors=direct.errors,
            generator_lag_p99_ms=(percentile(routed.lags_s, 99) or 0.0) * 1000,
            router_cpu_ms_per_request=router_cpu_ms, load_average=os.getloadavg()[0], **common,
        )


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("router_latency", run_router_latency,
              "latency aryl-router adds per request at 1,000 requests/s (p50/p99), vs calling the backend directly"),
)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    from benchmarks.bench_service import FULL

    run_router_latency(BenchContext(admin_url="", sizes=QUICK if "--quick" in sys.argv[1:] else FULL))
