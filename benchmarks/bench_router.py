"""The inference router's cost per request and its ceiling: through ``aryl-router`` vs calling the backend directly.

Both data planes are measured in the same run: ``haproxy`` (the default: HAProxy carries the requests, the
router programs it) and ``python`` (the router's own aiohttp proxy, opt-in; what every request went
through before HAProxy), so the two sit beside each other at the same load average.

``router_latency``: one example inference server (``examples/inference_server.py``, service time 0) and
one router per plane (``aryl-router --no-scheduler --backend URL --data-plane P``, default settings:
keep-alive, active health checks) run as their own processes on loopback, so the load generator never
shares their GIL. An open-loop generator in this process sends ``POST /v1/infer`` at a fixed rate
(1,000 requests/s) for ``duration_s`` (10 s; 2 s with ``--quick``): request *k* is started at
``t0 + k / rate`` whether or not earlier ones have finished. The same generator first calls the backend
directly (the reference), then through each router; each phase is preceded by a 1 s warm-up that is not
counted. Figures: ``router_latency_p50`` / ``router_latency_p99`` (ms, one line per ``data_plane``) with
the direct call's percentile as reference and ``added_ms`` = the difference. ``generator_lag_p99_ms`` says
how late the generator started its requests (if it is large, the machine was too busy to hold the rate and
the figures understate queueing). ``errors`` counts non-200 answers and failed connections.
``router_cpu_ms_per_request`` is the CPU time per request of the router process and, for haproxy, of
HAProxy (from ``/proc``), which a busy machine moves far less than latency.

``router_throughput``: how many requests/s the router carries, against the 10,000 requests/s target.
Python cannot generate that load on this machine, so ``wrk`` (Debian's package, C) does it: closed loop,
2 threads, 64 connections, ``duration_s``, ``POST /v1/infer``. The backend must not be the ceiling either,
so it is a null model server: a HAProxy that answers every request itself with a fixed 200 JSON body.
Figures: ``router_throughput`` (requests/s through each plane, with ``target`` 10,000 and ``holds_target``)
and its reference ``direct_throughput`` (the null server called directly by the same wrk), with wrk's own
p50/p99 latency and ``errors`` (non-2xx answers and socket errors).

Never: assert on timings, or use a port it did not get from the OS.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from aryl_common.ports import free_loopback_port
from benchmarks import emit_figure
from benchmarks.harness import QUICK, BenchContext, Benchmark
from inference_router.demand import percentile
from inference_router.haproxy import find_haproxy

log = logging.getLogger("aryl.bench")

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SERVER = ROOT / "examples" / "inference_server.py"
RATE_RPS = 1000
WARM_UP_S = 1.0
READY_TIMEOUT_S = 60.0
PLANES = ("haproxy", "python")   # the default first; python: the opt-in proxy every request went through before
THROUGHPUT_TARGET_RPS = 10_000
ADDED_TARGET_MS = {50: 1.0, 99: 5.0}  # what the router may add over calling the backend directly (issue 35)
WRK_THREADS, WRK_CONNECTIONS = 2, 64
NULL_BODY = '{"output": "kramhcneb"}'


@dataclass(frozen=True)
class Phase:
    latencies_s: list[float]
    lags_s: list[float]
    errors: int


def _children(pid: int) -> list[int]:
    """The direct children of a process (Linux ``/proc``): the router's HAProxy."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of a process and its direct children (the router and its HAProxy)."""
    own = _cpu_s(pid)
    if own is None:
        return None
    return own + sum(_cpu_s(child) or 0.0 for child in _children(pid))


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


async def _wait_routable(router: str, proc: subprocess.Popen[bytes]) -> None:
    """The router is up and routes to its backend (its data plane has it: HAProxy's slot is programmed)."""
    await _wait_ready(router + "/aryl/healthz", proc)
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(router + "/aryl/stats") as response:
                backends = (await response.json())["backends"]
            if backends and all(b["routable"] for b in backends):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{router} does not route to its backend after {READY_TIMEOUT_S}s: {backends}")
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


def _router_args(backend: str, port: int, plane: str) -> list[str]:
    return [str(Path(sys.executable).parent / "aryl-router"), "--no-scheduler", "--backend", backend, "--listen",
            f"127.0.0.1:{port}", "--data-plane", plane]


def run_router_latency(ctx: BenchContext) -> None:
    duration_s = 2.0 if ctx.sizes is QUICK else 10.0
    backend_port = free_loopback_port()
    backend = f"http://127.0.0.1:{backend_port}"
    server_args = [sys.executable, str(EXAMPLE_SERVER), "--port", str(backend_port), "--service-time-ms", "0",
                   "--concurrency", "10000", "--server-id", "bench"]
    common = {"rate_rps": RATE_RPS, "duration_s": duration_s, "requests": int(RATE_RPS * duration_s),
              "service_time_ms": 0}
    with _process(server_args) as server_proc:
        asyncio.run(_wait_ready(backend + "/healthz", server_proc))
        log.info("router_latency: %d requests/s for %.0f s, through each data plane (%s), each right after the "
                 "same load sent directly (its reference)", RATE_RPS, duration_s, ", ".join(PLANES))
        for plane in PLANES:
            # The reference of each plane is measured right before it: one measured once for both planes let a
            # moment's stall on the machine (a direct p99 of 67 ms against 1.6 ms through HAProxy) stand for both.
            direct = asyncio.run(_measure(backend + "/v1/infer", duration_s))
            router_port = free_loopback_port()
            router = f"http://127.0.0.1:{router_port}"
            with _process(_router_args(backend, router_port, plane)) as router_proc:
                asyncio.run(_wait_routable(router, router_proc))
                cpu_before = _tree_cpu_s(router_proc.pid)
                routed = asyncio.run(_measure(router + "/v1/infer", duration_s))
                cpu_after = _tree_cpu_s(router_proc.pid)
            # Includes the warm-up second's requests, which the router served too.
            router_cpu_ms = (None if cpu_before is None or cpu_after is None
                             else (cpu_after - cpu_before) * 1000 / (RATE_RPS * (duration_s + WARM_UP_S)))
            for q in (50, 99):
                via, ref = percentile(routed.latencies_s, q), percentile(direct.latencies_s, q)
                if via is None or ref is None:
                    raise RuntimeError(f"no successful requests through {plane} (direct errors {direct.errors}, "
                                       f"routed {routed.errors})")
                emit_figure(
                    f"router_latency_p{q}", via * 1000, "ms", data_plane=plane,
                    reference_name=f"direct_latency_p{q}", reference_value=ref * 1000, reference_unit="ms",
                    added_ms=(via - ref) * 1000, added_target_ms=ADDED_TARGET_MS[q],
                    errors=routed.errors, reference_errors=direct.errors,
                    generator_lag_p99_ms=(percentile(routed.lags_s, 99) or 0.0) * 1000,
                    router_cpu_ms_per_request=router_cpu_ms, **common,
                )


@dataclass(frozen=True)
class WrkRun:
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    requests: int


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def parse_wrk(text: str) -> WrkRun:
    """wrk's report (``--latency``): requests/s, the 50% and 99% latencies, non-2xx/3xx answers and socket errors."""
    def latency(q: int) -> float:
        found = re.search(rf"^\s*{q}%\s+([\d.]+)(us|ms|s)\s*$", text, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"wrk printed no {q}% latency: {text[-500:]}")
        return float(found.group(1)) * _UNITS_MS[found.group(2)]

    rps = re.search(r"^Requests/sec:\s+([\d.]+)", text, re.MULTILINE)
    total = re.search(r"^\s*(\d+) requests in", text, re.MULTILINE)
    if rps is None or total is None:
        raise RuntimeError(f"wrk printed no rate: {text[-500:]}")
    errors = 0
    if bad := re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text):
        errors += int(bad.group(1))
    if sock := re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text):
        errors += sum(int(n) for n in sock.groups())
    return WrkRun(float(rps.group(1)), latency(50), latency(99), errors, int(total.group(1)))


def _wrk(url: str, duration_s: float, script: Path) -> WrkRun:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("router_throughput needs wrk (Debian: apt-get install wrk; `make bench` installs it)")
    done = subprocess.run([wrk, f"-t{WRK_THREADS}", f"-c{WRK_CONNECTIONS}", f"-d{max(1, round(duration_s))}s",
                           "--latency", "-s", str(script), url], capture_output=True, text=True, check=False,
                          timeout=duration_s + 60)
    if done.returncode != 0:
        raise RuntimeError(f"wrk exited with {done.returncode}: {done.stderr[-1000:]}")
    return parse_wrk(done.stdout)


def run_router_throughput(ctx: BenchContext) -> None:
    duration_s = 2.0 if ctx.sizes is QUICK else 10.0
    with tempfile.TemporaryDirectory(prefix="aryl-bench-router-") as scratch:
        work = Path(scratch)
        script = work / "post.lua"
        script.write_text('wrk.method = "POST"\nwrk.body = \'{"input": "benchmark"}\'\n'
                          'wrk.headers["Content-Type"] = "application/json"\n')
        null_port = free_loopback_port()
        null_cfg = work / "null.cfg"
        body = NULL_BODY.replace('"', '\\"')
        null_cfg.write_text(
            "global\n    nbthread 1\ndefaults\n    mode http\n    timeout connect 2s\n    timeout client 30s\n"
            f"    timeout server 30s\nfrontend null\n    bind 127.0.0.1:{null_port}\n"
            f'    http-request return status 200 content-type application/json string "{body}"\n')
        backend = f"http://127.0.0.1:{null_port}"
        with _process([find_haproxy("haproxy"), "-f", str(null_cfg), "-db"]) as null_proc:
            asyncio.run(_wait_ready(backend + "/healthz", null_proc))
            log.info("router_throughput: wrk, %d connections, %.0f s, direct then through each data plane",
                     WRK_CONNECTIONS, duration_s)
            direct = _wrk(backend + "/v1/infer", duration_s, script)
            for plane in PLANES:
                router_port = free_loopback_port()
                router = f"http://127.0.0.1:{router_port}"
                with _process(_router_args(backend, router_port, plane)) as router_proc:
                    asyncio.run(_wait_routable(router, router_proc))
                    routed = _wrk(router + "/v1/infer", duration_s, script)
                holds = routed.rps >= THROUGHPUT_TARGET_RPS and not routed.errors
                emit_figure(
                    "router_throughput", routed.rps, "requests/s", data_plane=plane,
                    reference_name="direct_throughput", reference_value=direct.rps, reference_unit="requests/s",
                    target=THROUGHPUT_TARGET_RPS, holds_target=holds,
                    errors=routed.errors, reference_errors=direct.errors, latency_p50_ms=routed.p50_ms,
                    latency_p99_ms=routed.p99_ms, reference_latency_p50_ms=direct.p50_ms,
                    reference_latency_p99_ms=direct.p99_ms, requests=routed.requests, duration_s=duration_s,
                    connections=WRK_CONNECTIONS, generator="wrk (closed loop)", backend="null (HAProxy answers)",
                )


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("router_latency", run_router_latency,
              "latency aryl-router adds per request at 1,000 requests/s (p50/p99), each data plane (HAProxy, "
              "Python), vs calling the backend directly"),
    Benchmark("router_throughput", run_router_throughput,
              "requests/s aryl-router carries (wrk, closed loop, a null backend), each data plane, vs the backend "
              "directly; target 10,000"),
)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    from benchmarks.harness import FULL

    context = BenchContext(admin_url="", sizes=QUICK if "--quick" in sys.argv[1:] else FULL)
    run_router_latency(context)
    run_router_throughput(context)
