"""Benchmark: reclaim latency, from the inference demand signal to the server serving again.

Real parts: the scheduler as a child process on PostgreSQL, two real ``aryl-agent`` daemons (one
training server, one inference server, fake GPUs) and ``examples/train.py`` as an elastic job whose
workers honour SIGTERM by taking ``CHECKPOINT_S`` to checkpoint, inside a 2 s grace period.

One iteration: demand 0 -> the inference server is drained and loaned, and the elastic job scales
out onto it (its workers there start); then demand 1 is reported and the clock starts. It stops
when the scheduler's serving-pool watch (what the router follows) lists the server SERVING again,
which the scheduler allows only after the agent confirmed the workers exited. Between the two:
the cycle picks the server and scales the job in, the agent gets the new desired state, SIGTERMs
the workers, they checkpoint and exit, the agent reports convergence, the next cycle returns the
server. Target: p99 <= grace + 1 s. Reference in the same run: the same reclaim with workers that
exit at once on SIGTERM, which is the protocol's own cost.

The protection window (``core.protection``) is off in the scheduler started here, and every figure
says so (``min_resize_interval_s``, ``max_disruptions_per_hour``: 0). Each iteration disrupts the job
twice within seconds (the scale-out onto the loan, the scale-in at the reclaim); the default cap of 6
disruptions an hour held the job at its size after the third reclaim, so the fourth scale-out never
came. The window decides whether a job may grow again, not how fast a reclaim completes: a reclaim
overrides it when it must, and with one loaned server there is no other choice to prefer.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory

import grpc

from benchmarks import emit_figure
from benchmarks.harness import BenchContext, Benchmark, SchedulerProcess, percentile_ms, scratch_database
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

log = logging.getLogger("aryl.bench")

REPO = Path(__file__).resolve().parent.parent
GRACE_S = 2.0
CHECKPOINT_S = 1.5
TARGET_S = GRACE_S + 1.0
SETTINGS = {
    "ARYL_POLICY__LOAN_IDLE_S": "0", "ARYL_POLICY__DRAIN_TIMEOUT_S": "0", "ARYL_POLICY__MIN_LOAN_S": "0",
    "ARYL_POLICY__LOAN_BUFFER_SERVERS": "0", "ARYL_POLICY__RESTART_COST_S": "0",
    # The protection window off (the module docstring says why); PROTECTION names it in the figures.
    "ARYL_POLICY__MIN_RESIZE_INTERVAL_S": "0", "ARYL_POLICY__MAX_DISRUPTIONS_PER_HOUR": "0",
    "ARYL_SCHEDULING__DEFAULT_GRACE_PERIOD_S": str(GRACE_S),
    "ARYL_SCHEDULING__CYCLE_INTERVAL_S": "1", "ARYL_AGENTS__REPORT_INTERVAL_S": "1",
}
# The protection window the scheduler runs with, as fields of every figure measured under SETTINGS.
PROTECTION = {"min_resize_interval_s": float(SETTINGS["ARYL_POLICY__MIN_RESIZE_INTERVAL_S"]),
              "max_disruptions_per_hour": int(SETTINGS["ARYL_POLICY__MAX_DISRUPTIONS_PER_HOUR"])}


def start_agent(scheduler: str, hostname: str, pool: str, gpus: int, work: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env.update(ARYL_AGENT__ADVERTISE_ADDRESS="127.0.0.1", ARYL_AGENT__LOGS_LISTEN_HOST="127.0.0.1",
               ARYL_AGENT__RECONCILE_INTERVAL_S="0.1", ARYL_AGENT__CHECKPOINT_ROOT=str(work / "checkpoints"),
               ARYL_LOGGING__LEVEL="warning", ARYL_AGENT__INSECURE="true",  # SchedulerProcess is plaintext
               # Workers as the agent's uid: a root agent's default maps owners to uids (docs/security.md).
               ARYL_USERS__RUN_AS="agent")
    if pool == "inference":
        env["ARYL_AGENT__INFERENCE_ENDPOINT"] = "http://127.0.0.1:9"  # listed by the pool; never called here
    args = [sys.executable, "-m", "node_agent.main", "--scheduler", scheduler, "--hostname", hostname,
            "--pool", pool, "--fake-gpus", str(gpus), "--work-dir", str(work / hostname)]
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=sys.stderr, stderr=sys.stderr, start_new_session=True)


class PoolWatch:
    """Follows WatchServingPool in a thread; ``wait_serving`` returns when a server is listed SERVING."""

    def __init__(self, address: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._call = inference_pb2_grpc.InferenceServiceStub(self._channel).WatchServingPool(
            inference_pb2.WatchServingPoolRequest(source="bench"))
        self._serving: set[str] = set()
        self._changed = threading.Condition()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for update in self._call:
                with self._changed:
                    self._serving = {s.server_id for s in update.servers if s.state == types_pb2.SERVER_STATE_SERVING}
                    self._changed.notify_all()
        except grpc.RpcError:
            pass

    def wait(self, server_id: str, serving: bool, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        with self._changed:
            while (server_id in self._serving) != serving:
                if not self._changed.wait(deadline - time.monotonic()):
                    raise TimeoutError(f"{server_id} did not become {'serving' if serving else 'unroutable'}")
            return time.monotonic()

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 60.0,
          why: Callable[[], str] | None = None) -> None:
    """Poll ``predicate`` until it holds; on timeout raise, with what ``why`` says about the wait."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}" + (f" ({why()})" if why else ""))
        time.sleep(0.05)


def _reclaim_latencies(address: str, iterations: int, checkpoint_s: float,
                       worker_args: Sequence[str] = ()) -> list[float]:
    """Run an elastic job whose workers take ``checkpoint_s`` to stop (``examples/train.py``, with
    ``worker_args`` too); loan, let it grow onto the loaned server, reclaim; the seconds from the
    signal to serving. Cancels the job at the end."""
    channel = grpc.insecure_channel(address)
    scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    inference = inference_pb2_grpc.InferenceServiceStub(channel)
    watch = PoolWatch(address)

    def demand(servers: int) -> None:
        inference.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=servers, source="bench"), timeout=10)

    def job() -> types_pb2.Job:
        return scheduler.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=10).job

    def state() -> int:
        servers = scheduler.ListServers(scheduler_pb2.ListServersRequest(), timeout=10).servers
        return next(s.state for s in servers if s.server_id == "bench-infer")

    def held(reclaims: int) -> str:  # why the job did not grow: the policy's note says (e.g. its protection)
        now = job()
        return f"job {job_id} after {reclaims} reclaims: {types_pb2.JobState.Name(now.state)}, {now.size_note!r}"

    def running(rank: int, incarnation: int) -> bool:
        return f"(incarnation {incarnation})" in _log_tail(scheduler, job_id, rank)

    spec = types_pb2.JobSpec(
        name=f"elastic-checkpoint-{checkpoint_s:g}s", user="bench", gpus_per_worker=1, min_workers=1, max_workers=3,
        command=[sys.executable, str(REPO / "examples" / "train.py"), "--total-steps", "10000000",
                 "--step-time", "0.2", "--log-every", "1000000", "--checkpoint-time", str(checkpoint_s), *worker_args],
    )
    latencies = []
    try:
        demand(1)
        watch.wait("bench-infer", serving=True)
        job_id = scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job.job_id
        for i in range(iterations):
            demand(0)
            _wait(lambda: state() == types_pb2.SERVER_STATE_LOANED, "the loan")
            _wait(lambda: any(w.server_id == "bench-infer" for w in job().workers), "the scale-out",
                  why=partial(held, i))
            incarnation = job().incarnation
            for rank in sorted(w.rank for w in job().workers if w.server_id == "bench-infer"):
                _wait(partial(running, rank, incarnation), f"rank {rank} running on the loaned server")
            started = time.monotonic()
            demand(1)
            latencies.append(watch.wait("bench-infer", serving=True) - started)
            log.info("reclaim %d/%d, workers checkpointing for %gs: %.2fs", i + 1, iterations, checkpoint_s,
                     latencies[-1])
        scheduler.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="benchmark done"), timeout=10)
    finally:
        watch.close()
        channel.close()
    return latencies


def _log_tail(scheduler: scheduler_pb2_grpc.SchedulerServiceStub, job_id: str, rank: int) -> str:
    try:
        return scheduler.GetJobLogs(scheduler_pb2.GetJobLogsRequest(job_id=job_id, rank=rank, offset=-4096),
                                    timeout=10).data.decode(errors="replace")
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.NOT_FOUND:  # the worker has not started yet
            return ""
        raise


@contextmanager
def reclaim_cluster(ctx: BenchContext, settings: dict[str, str]) -> Iterator[str]:
    """A scheduler process (``settings``) on a scratch database and two registered agents, a training
    server (1 GPU) and an inference server (2 GPUs); yields the scheduler's address. On exit the
    agents and every worker they started are stopped for good, and the database dropped."""
    with ExitStack() as stack:
        url = stack.enter_context(scratch_database(ctx.admin_url))
        scheduler = stack.enter_context(SchedulerProcess(url, settings))
        work = Path(stack.enter_context(TemporaryDirectory(prefix="aryl-bench-reclaim-")))
        agents = [start_agent(scheduler.address, "bench-train", "training", 1, work),
                  start_agent(scheduler.address, "bench-infer", "inference", 2, work)]
        stack.callback(_stop_all, agents)
        with grpc.insecure_channel(scheduler.address) as channel:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            _wait(lambda: len(stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=10).servers) == 2,
                  "both agents registered")
        yield scheduler.address


def reclaim_latency(ctx: BenchContext) -> None:
    iterations = 3 if ctx.sizes.submit_jobs < 1000 else 10  # quick: a smoke test
    with reclaim_cluster(ctx, SETTINGS) as address:
        instant = _reclaim_latencies(address, iterations, 0.0)
        busy = _reclaim_latencies(address, iterations, CHECKPOINT_S)
    for pct in (50, 99):
        emit_figure(
            f"reclaim_latency_p{pct}", percentile_ms(busy, pct) / 1e3, "s", iterations=iterations,
            grace_period_s=GRACE_S, worker_checkpoint_s=CHECKPOINT_S, target_s=TARGET_S, **PROTECTION,
            reference_name=f"reclaim_latency_instant_stop_p{pct}", reference_value=percentile_ms(instant, pct) / 1e3,
            reference_unit="s",
        )


def _stop_all(agents: list[subprocess.Popen[bytes]]) -> None:
    """Agents leave workers running by design; stop agents and their workers for good here."""
    for agent in agents:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=15)
        except subprocess.TimeoutExpired:
            agent.kill()
    # Workers run in their own process groups under the work directory; they are found by their
    # environment (ARYL_CHECKPOINT_DIR lies under it) and killed.
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if b"aryl-bench-reclaim-" in Path(f"/proc/{entry}/environ").read_bytes():
                    os.killpg(int(entry), signal.SIGKILL)
            except OSError:
                continue


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("reclaim_latency", reclaim_latency,
              "demand signal -> reclaimed server serving again, workers honouring a 2 s grace (vs an idle server)"),
)
