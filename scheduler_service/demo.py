"""``aryl-demo`` (``make demo``): a local Aryl cluster on one machine, no GPU needed.

It starts real processes -- the scheduler (Aryl policy) on the embedded SQLite default, and node
agents with fake GPUs (two training servers, one inference server) -- submits a handful of demo jobs
through the Python client and shows them placed with ``arylctl``'s own tables. Then inference load
drops (a demand report): the idle inference server is loaned, a waiting job starts on it and an
elastic job scales out; load rises: the server is reclaimed (the elastic job shrinks, the inelastic
one is preempted and requeued) and serves again once its agent confirms. A cancellation lets the
requeued job back in; a summary follows, and everything shuts down by itself.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

from arylctl import cli
from arylctl.client import ArylClient, job_spec
from protos.aryl.v1 import types_pb2

T = TypeVar("T")
BIN = Path(sys.executable).parent
SERVERS = (("demo-train-1", "training", 4), ("demo-train-2", "training", 4), ("demo-infer-1", "inference", 8))
JOBS = (
    # name, gpus per worker, min workers, max workers
    ("bert-large", 2, 2, 2),
    ("resnet50", 1, 2, 4),
    ("gpt-small", 2, 1, 1),
    ("vit-huge", 4, 1, 1),  # the training pool is full by now: waits until bert-large is cancelled
)


# Production defaults wait minutes before loaning or resizing (anti-flapping); the demo compresses time.
DEMO_SETTINGS = {
    "ARYL_LOGGING__LEVEL": "info",
    "ARYL_AGENTS__REPORT_INTERVAL_S": "0.5",
    "ARYL_SCHEDULING__CYCLE_INTERVAL_S": "0.5",
    "ARYL_POLICY__LOAN_BUFFER_SERVERS": "0",
    "ARYL_POLICY__LOAN_IDLE_S": "1",
    "ARYL_POLICY__DRAIN_TIMEOUT_S": "1",
    "ARYL_POLICY__MIN_LOAN_S": "0",
    "ARYL_POLICY__MIN_RESIZE_INTERVAL_S": "0",
    "ARYL_POLICY__RESTART_COST_S": "1",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except Exception:  # noqa: BLE001 - not up yet; try again until the deadline
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def show(address: str, *args: str) -> None:
    print(f"$ arylctl {' '.join(args)}", flush=True)
    cli.main(["--server", address, *args])


def start(stack: ExitStack, name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = (log_dir / f"{name}.log").open("wb")
    stack.callback(log.close)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    stack.callback(stop_process, proc)
    return proc


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def timeline(client: ArylClient, stop: threading.Event) -> None:
    """Print every event as it is committed (the event log, streamed)."""
    try:
        for event in client.watch_events(after_event_id=0):
            if stop.is_set():
                return
            who = f"job {event.job_id}" if event.job_id else event.server_id or "scheduler"
            kind = types_pb2.EventKind.Name(event.kind).removeprefix("EVENT_KIND_").lower()
            print(f"   [event {event.event_id:>3}] {kind:<20} {who:<14} {event.reason:<22} {event.message}", flush=True)
    except Exception:  # noqa: BLE001 - the stream ends when the scheduler stops
        return


def run(workdir: Path) -> int:
    started = time.monotonic()
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, **DEMO_SETTINGS}
    env.pop("ARYL_CONFIG", None)
    db_url = f"sqlite:///{workdir / 'aryl.db'}"
    with ExitStack() as stack:
        say(f"Starting the scheduler on {address} (database {db_url}, policy aryl)")
        start(stack, "scheduler", [str(BIN / "aryl-scheduler"), "--listen", address, "--database-url", db_url],
              workdir, env)
        client = stack.enter_context(ArylClient(address, timeout=5))
        wait_until(client.get_cluster, 60, "the scheduler to answer")
        stop_timeline = threading.Event()
        stack.callback(stop_timeline.set)
        threading.Thread(target=timeline, args=(client, stop_timeline), daemon=True).start()

        say("Starting node agents with fake GPUs (real processes)")
        for hostname, pool, gpus in SERVERS:
            start(stack, hostname, [str(BIN / "aryl-agent"), "--scheduler", address, "--hostname", hostname,
                                    "--pool", pool, "--fake-gpus", str(gpus)], workdir, env)
        wait_until(lambda: len(client.list_servers()) == len(SERVERS), 60, "all agents to register")
        time.sleep(0.5)
        show(address, "servers")

        say("Submitting demo jobs through the Python client")
        ids = {}
        for name, gpus, low, high in JOBS:
            job = client.submit_job(job_spec(name=name, command=["python", "train.py", f"--model={name}"],
                                             user="demo", gpus_per_worker=gpus, min_workers=low, max_workers=high))
            ids[name] = job.job_id
        wait_until(lambda: client.get_job(ids["vit-huge"]).job.pending_reason, 30, "the first scheduling decisions")
        time.sleep(0.3)
        show(address, "jobs")
        say("Why is vit-huge waiting?")
        show(address, "explain", ids["vit-huge"])

        infer = SERVERS[2][0]

        def server_state(server_id: str) -> int:
            return next(s.state for s in client.list_servers() if s.server_id == server_id)

        say("Inference load drops: the router reports 0 servers needed -> the idle inference server is loaned")
        client.report_demand(0, observed_rps=3.0, source="aryl-demo")
        wait_until(lambda: server_state(infer) == types_pb2.SERVER_STATE_LOANED, 30, "the loan")
        wait_until(lambda: client.get_job(ids["vit-huge"]).job.state == types_pb2.JOB_STATE_RUNNING, 30,
                   "vit-huge to start on the loaned server")
        wait_until(lambda: client.get_job(ids["resnet50"]).job.num_workers > 2, 30, "resnet50 to scale out")
        time.sleep(0.5)
        show(address, "jobs")
        show(address, "loans")

        say("Inference load spikes: 1 server needed -> reclaim; elastic resnet50 shrinks, inelastic vit-huge "
            "is preempted and requeued")
        client.report_demand(1, observed_rps=250.0, source="aryl-demo")
        wait_until(lambda: server_state(infer) == types_pb2.SERVER_STATE_SERVING, 30,
                   "the agent to vacate the server and the server to serve again")
        time.sleep(0.5)
        show(address, "jobs")
        show(address, "explain", ids["vit-huge"])

        say("Cancelling bert-large: its GPUs free up and the requeued vit-huge runs again")
        client.cancel_job(ids["bert-large"], reason="demo: make room")
        wait_until(lambda: client.get_job(ids["vit-huge"]).job.state == types_pb2.JOB_STATE_RUNNING, 30,
                   "vit-huge to be placed")
        time.sleep(0.3)
        show(address, "jobs")
        show(address, "cluster")

        wait_until(
            lambda: all(s.observed_generation == s.desired_generation for s in client.list_servers()), 30,
            "every agent to acknowledge its desired state",
        )
        say("Summary")
        cluster = client.get_cluster()
        train = next(p for p in cluster.pools if p.pool == types_pb2.POOL_TRAINING)
        jobs = list(client.iter_jobs())
        running = [j for j in jobs if j.state == types_pb2.JOB_STATE_RUNNING]
        servers = client.list_servers()
        desired = {s.server_id: s.observed_generation for s in servers}
        print(f"   jobs submitted: {len(jobs)}, running: {len(running)}, "
              f"cancelled: {sum(j.state == types_pb2.JOB_STATE_CANCELLED for j in jobs)}, "
              f"pending: {sum(j.state == types_pb2.JOB_STATE_PENDING for j in jobs)}")
        loans = client.list_loans(include_returned=True)
        print(f"   training GPUs used: {train.gpus_used}/{train.gpus_total}; loans made: {len(loans)}, "
              f"returned: {sum(loan.state == types_pb2.LOAN_STATE_RETURNED for loan in loans)}; "
              f"preemptions: {sum(j.preemptions for j in jobs)}")
        print(f"   agents converged: desired == observed state generation on every server {desired}")
        print(f"   scheduler epoch {cluster.scheduler_epoch}; logs in {workdir}")
        print(f"   demo finished in {time.monotonic() - started:.1f}s", flush=True)
        stop_timeline.set()
        say("Shutting down agents and scheduler")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="aryl-demo", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, help="keep database and logs here (default: a fresh temp dir)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="aryl-demo-"))
    if args.workdir and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return run(workdir)
    except TimeoutError as exc:
        print(f"aryl-demo: {exc}; see the logs in {workdir}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
