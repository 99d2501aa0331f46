"""``aryl-demo`` (``make demo``): the whole Aryl story on one machine, with fake GPUs, in real processes.

Started here: the scheduler (Aryl policy, embedded SQLite), node agents for two training servers
and three inference servers, a tiny inference server behind each inference server's agent, and
``aryl-router`` in front of them: HAProxy carries the requests, the router programs it and reads the
load from it. A synthetic day of inference traffic goes through it (a load generator in this process),
and real training programs (``examples/train.py``) run as jobs.

The day: at midday traffic is high and every inference server serves; in the evening traffic
falls, the router's demand drops, idle inference servers are drained (the router stops sending
them requests and acknowledges) and loaned to training, where a waiting job starts and an elastic
job scales out (restarting from its checkpoint at the new size); next morning a spike comes, the
loaned servers are reclaimed ahead of it, on the scheduler's demand forecast (the elastic job scales in,
the inelastic one is preempted and requeued), and serve again once their agents confirm the workers
are gone. A timeline of the
scheduler's events and the traffic is printed throughout, then a summary: not one inference request
may fail. Everything stops by itself, well within three minutes. ``arylctl --server ADDRESS ...``
shows the state live meanwhile (the address is printed first).

Start-up says what it waits for (the scheduling kernels, compiled on the first run only and announced
then, loaded from numba's cache after; then each daemon), so no pause is silent. The database, logs
and checkpoints live in a fresh ``aryl-demo-*`` folder under the temporary directory, removed at the
end unless ``--keep`` is given (or ``--workdir``, or the demo failed: then they are what explains it);
the last line says where they are, or were.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from aryl_common.entry import FatalError, add_standard_flags, run_guarded
from aryl_common.ports import free_loopback_port as free_port
from aryl_common.security import ClientSecurity, token_from_file
from aryl_demo.output import CLI_ENV, CLOCK, Timeline, line, say, show, timeline
from aryl_demo.traffic import Traffic, model_served, router_plane, router_ready, traffic_reporter
from arylctl import certs
from arylctl.client import ArylClient, job_spec
from protos.aryl.v1 import types_pb2
from scheduler_service.solvers import warm_up as warm_up_solvers

T = TypeVar("T")
BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
TRAINING = (("train-1", 4), ("train-2", 4))
INFERENCE = (("infer-1", 4), ("infer-2", 4), ("infer-3", 4))
CAPACITY_RPS = 20.0  # what one inference server serves (the router's per-server capacity)
# The traffic of a compressed day, in requests per second through the router; the morning climbs from the
# evening's rate to its peak over MORNING_RAMP_S.
MIDDAY_RPS, EVENING_RPS, MORNING_SPIKE_RPS = 42.0, 12.0, 45.0
MORNING_RAMP_S = 20.0
JOBS = (
    # name, gpus per worker, min workers, max workers, steps (a step takes 1 s / world size)
    ("bert-large", 2, 2, 2, 600),
    ("resnet50", 1, 2, 8, 3000),
    ("vit-huge", 4, 1, 1, 600),  # the training pool is full: waits for a loan
)
# resnet50 declares batch limits (node_agent.contract): the scheduler chooses its batch for each allocation
# and the timeline shows it change as the job grows onto the loan and shrinks back.
# (init batch, largest batch, largest per GPU per pass)
BATCH_HINTS: dict[str, tuple[int, int, int]] = {"resnet50": (128, 1024, 64)}

# Production defaults wait minutes before loaning or resizing (anti-flapping); the demo compresses time.
DEMO_SETTINGS = {
    "ARYL_LOGGING__LEVEL": "info",
    "ARYL_AGENTS__REPORT_INTERVAL_S": "0.5",
    "ARYL_AGENTS__TELEMETRY_WRITE_S": "2",
    "ARYL_SCHEDULING__CYCLE_INTERVAL_S": "0.5",
    "ARYL_SCHEDULING__DEFAULT_GRACE_PERIOD_S": "5",
    "ARYL_POLICY__LOAN_BUFFER_SERVERS": "0",
    "ARYL_POLICY__LOAN_IDLE_S": "1",
    "ARYL_POLICY__DRAIN_TIMEOUT_S": "20",  # the router's acknowledgement comes first
    "ARYL_POLICY__MIN_LOAN_S": "0",
    "ARYL_POLICY__MIN_RESIZE_INTERVAL_S": "0",
    "ARYL_POLICY__RESTART_COST_S": "1",
    # The demand forecast (core.demand_forecast) in one-second bins, its trend over the last 20 s: the compressed
    # morning's climb is seen within seconds, and the reclaim starts on the forecast, ahead of the need.
    "ARYL_DEMAND_FORECAST__BIN_S": "1",
    "ARYL_DEMAND_FORECAST__TREND_WINDOW_S": "20",
    "ARYL_AGENT__ADVERTISE_ADDRESS": "127.0.0.1",
    "ARYL_AGENT__LOGS_LISTEN_HOST": "127.0.0.1",
    "ARYL_AGENT__RECONCILE_INTERVAL_S": "0.2",
    "ARYL_ROUTER__SHORT_WINDOW_S": "3",
    "ARYL_ROUTER__EVALUATE_INTERVAL_S": "0.5",
    "ARYL_ROUTER__HEALTH_CHECK_INTERVAL_S": "1",
}


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


# A warm numba cache loads the kernels in well under this; only a compile (a first run) takes longer.
KERNELS_PATIENCE_S = 2.0


def prepare_kernels(warm_up: Callable[[], None] = warm_up_solvers, patience_s: float = KERNELS_PATIENCE_S) -> None:
    """Compile the scheduling kernels, or load them from numba's cache. The compile (~20 s, first run only)
    is announced once they are not ready within ``patience_s``; a warm start says only that they are ready,
    never that it compiles."""
    began = time.monotonic()
    done = threading.Event()
    failed: list[BaseException] = []

    def work() -> None:
        try:
            warm_up()
        except BaseException as exc:  # noqa: BLE001 - handed to the demo's thread, raised there
            failed.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="aryl-demo-kernels", daemon=True).start()
    compiling = not done.wait(patience_s)
    if compiling:
        say("Compiling the scheduling kernels (numba; first run only, ~20 s, then loaded from its cache)...")
        done.wait()
    if failed:
        raise failed[0]
    how = "compiled" if compiling else "loaded from numba's cache"
    line(f"  scheduling kernels ready in {time.monotonic() - began:.1f}s ({how})")


def start(stack: ExitStack, name: str, argv: list[str], log_dir: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    log = (log_dir / f"{name}.log").open("wb")
    stack.callback(log.close)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=log_dir)
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


@dataclass
class DemoOutcome:
    """What the demo observed, for its summary and for tests/e2e/test_demo.py."""

    requests_sent: int = 0
    requests_ok: int = 0
    requests_failed: list[str] = field(default_factory=list)
    loans_made: int = 0
    servers_reclaimed: int = 0
    # Reclaims whose reason is the demand forecast (started ahead of the need), and the first one's reason.
    reclaims_on_forecast: int = 0
    forecast_reclaim_reason: str = ""
    # Requests each loaned server's model server answered while the server was on loan (must be 0).
    served_while_loaned: dict[str, int] = field(default_factory=dict)
    jobs: dict[str, types_pb2.Job] = field(default_factory=dict)
    resnet_scaled_out_to: int = 0
    resnet_progress_before_reclaim: float = 0.0


def metrics_settings(ports: dict[str, int], name: str) -> dict[str, str]:
    """The Prometheus ``[metrics]`` port of one demo process (a free loopback port), kept in ``ports``."""
    ports[name] = free_port()
    return {"ARYL_METRICS__PORT": str(ports[name])}


def demo_security(workdir: Path, *, insecure: bool) -> tuple[dict[str, str], dict[str, dict[str, str]], ClientSecurity]:
    """TLS and tokens for every demo process (``arylctl certs init`` into ``workdir/pki``): the common
    environment, each agent's own (its certificate names its server id), and the demo's own client (an
    admin). With ``insecure``: plaintext, no identities, all three saying so explicitly."""
    if insecure:
        off = {"ARYL_SECURITY__INSECURE": "true", "ARYL_AGENT__INSECURE": "true", "ARYL_ROUTER__INSECURE": "true",
               "ARYL_INSECURE": "1"}
        return off, {}, ClientSecurity(insecure=True)
    pki = workdir / "pki"
    hostnames = [hostname for hostname, _ in (*TRAINING, *INFERENCE)]
    certs.init(pki, certs.DevCluster(agents=tuple(hostnames), routers=("aryl-router",), users=("alice",),
                                     admins=("admin",)))
    env = {
        "ARYL_SECURITY__INSECURE": "false", "ARYL_SECURITY__TLS_CERT": str(pki / "scheduler.crt"),
        "ARYL_SECURITY__TLS_KEY": str(pki / "scheduler.key"), "ARYL_SECURITY__TLS_CLIENT_CA": str(pki / "ca.crt"),
        "ARYL_SECURITY__TOKENS_FILE": str(pki / "tokens"),
        "ARYL_ROUTER__INSECURE": "false", "ARYL_ROUTER__TLS_CA": str(pki / "ca.crt"),
        "ARYL_ROUTER__TLS_CERT": str(pki / "router-aryl-router.crt"),
        "ARYL_ROUTER__TLS_KEY": str(pki / "router-aryl-router.key"),
        "ARYL_ROUTER__TOKEN_FILE": str(pki / "token-aryl-router"),
        # arylctl, from another terminal, as the admin (export these)
        "ARYL_TLS_CA": str(pki / "ca.crt"), "ARYL_TLS_CERT": str(pki / "client.crt"),
        "ARYL_TLS_KEY": str(pki / "client.key"), "ARYL_TOKEN_FILE": str(pki / "token-admin"),
    }
    env.pop("ARYL_TOKEN", None)
    agents = {hostname: {
        "ARYL_AGENT__INSECURE": "false", "ARYL_AGENT__TLS_CA": str(pki / "ca.crt"),
        "ARYL_AGENT__TLS_CERT": str(pki / f"agent-{hostname}.crt"),
        "ARYL_AGENT__TLS_KEY": str(pki / f"agent-{hostname}.key"),
        "ARYL_AGENT__TOKEN_FILE": str(pki / f"token-{hostname}"),
    } for hostname in hostnames}
    client = ClientSecurity(ca_file=str(pki / "ca.crt"), cert_file=str(pki / "client.crt"),
                            key_file=str(pki / "client.key"), token=token_from_file(pki / "token-admin"))
    return env, agents, client


def run(workdir: Path, *, insecure: bool = False) -> DemoOutcome:
    workdir.mkdir(parents=True, exist_ok=True)
    metrics_ports: dict[str, int] = {}
    outcome = DemoOutcome()
    address = f"127.0.0.1:{free_port()}"
    router_port = free_port()
    # One checkpoint directory for all agents: what a shared filesystem is to a real cluster, so a
    # job resumes wherever its rank 0 lands.
    env = {**os.environ, **DEMO_SETTINGS, "ARYL_AGENT__CHECKPOINT_ROOT": str(workdir / "checkpoints")}
    env.pop("ARYL_CONFIG", None)
    env.pop("ARYL_TOKEN", None)  # the demo's own tokens, not the caller's
    security_env, agent_env, client_security = demo_security(workdir, insecure=insecure)
    env.update(security_env)
    CLI_ENV.clear()
    CLI_ENV.update({key: value for key, value in security_env.items() if not key.startswith(("ARYL_SECURITY__",
                                                                                               "ARYL_ROUTER__"))})
    db_url = f"sqlite:///{workdir / 'aryl.db'}"
    with ExitStack() as stack:
        # Registered first, so it runs last: after the scheduler and agents are down, nothing can
        # start a worker any more.
        stack.callback(_stop_workers, workdir)
        prepare_kernels()  # here, where a wait is announced: the scheduler then loads them from the cache
        say(f"Starting the scheduler on {address} (database {db_url}, policy aryl). Watch live from another "
            f"terminal: arylctl --server {address} jobs | servers | loans | events -f"
            + ("" if insecure else " (TLS and tokens: first export "
               + " ".join(f"{key}={value}" for key, value in CLI_ENV.items()) + ")"))
        start(stack, "scheduler", [str(BIN / "aryl-scheduler"), "--listen", address, "--database-url", db_url],
              workdir, {**env, **metrics_settings(metrics_ports, "scheduler")})
        client = stack.enter_context(ArylClient(address, timeout=5, security=client_security))
        wait_until(client.get_cluster, 60, "the scheduler to answer")
        line("  scheduler answering")
        stop_background = threading.Event()
        stack.callback(stop_background.set)
        names: dict[str, str] = {}
        shown = Timeline()
        threading.Thread(target=timeline, args=(client, names, stop_background, shown), daemon=True).start()

        say("Starting node agents with fake GPUs: 2 training servers, 3 inference servers, each inference "
            "server running a small model server")
        if os.geteuid() == 0:
            # A root agent runs each worker as its owner's mapped uid by default and refuses owners it cannot
            # map; the demo's programs lie in this checkout, which another uid may not be able to read.
            env["ARYL_USERS__RUN_AS"] = "agent"
            print("   (run as root: the demo's agents opt in to [users] run_as = \"agent\" and run their workers as "
                  "root, since an unprivileged uid may not read this checkout's programs; a production agent runs "
                  "each job as its owner's mapped uid, docs/security.md)", flush=True)
        for hostname, gpus in TRAINING:
            start(stack, hostname, [str(BIN / "aryl-agent"), "--scheduler", address, "--hostname", hostname,
                                    "--pool", "training", "--fake-gpus", str(gpus), "--work-dir",
                                    str(workdir / hostname)],
                  workdir, {**env, **agent_env.get(hostname, {}), **metrics_settings(metrics_ports, hostname)})
        model_ports: dict[str, int] = {}
        for hostname, gpus in INFERENCE:
            port = model_ports[hostname] = free_port()
            start(stack, f"{hostname}-model", [sys.executable, str(EXAMPLES / "inference_server.py"), "--port",
                                               str(port), "--server-id", hostname, "--service-time-ms", "30"],
                  workdir, env)
            start(stack, hostname, [str(BIN / "aryl-agent"), "--scheduler", address, "--hostname", hostname,
                                    "--pool", "inference", "--fake-gpus", str(gpus), "--work-dir",
                                    str(workdir / hostname)],
                  workdir, {**env, **agent_env.get(hostname, {}), "ARYL_AGENT__INFERENCE_ENDPOINT": f"http://127.0.0.1:{port}",
                            **metrics_settings(metrics_ports, hostname)})
        wait_until(lambda: len(client.list_servers()) == len(TRAINING) + len(INFERENCE), 60, "all agents")
        line(f"  {len(TRAINING) + len(INFERENCE)} agents registered")

        say(f"Starting aryl-router on http://127.0.0.1:{router_port}: HAProxy carries the requests; the router "
            f"programs it from the serving pool, reads the load from its statistics ({CAPACITY_RPS:g} req/s per "
            "server, 20% headroom) and turns it into demand (before it has measured any, it asks for the servers "
            "serving now)")
        start(stack, "router", [str(BIN / "aryl-router"), "--listen", f"127.0.0.1:{router_port}",
                                "--scheduler", address, "--capacity-rps", str(CAPACITY_RPS), "--headroom", "0.2",
                                "--min-servers", "1", "--scale-down-delay", "4", "--interval", "2"], workdir,
              {**env, **metrics_settings(metrics_ports, "router")})
        traffic = Traffic(f"http://127.0.0.1:{router_port}")
        wait_until(lambda: router_ready(router_port, len(INFERENCE)), 60, "the router to route to 3 servers")
        line(f"  data plane: {router_plane(router_port)}")
        wait_until(lambda: client.get_demand().source.startswith("aryl-router"), 30, "the router's first demand")
        say("Prometheus metrics (text format; docker-compose's monitoring profile scrapes them into Grafana):")
        for name, metrics_port in metrics_ports.items():
            line(f"  {name:<11} curl -s http://127.0.0.1:{metrics_port}/metrics")
        # Its first report (made before any traffic) is shown here, not under the midday traffic.
        wait_until(lambda: shown.caught_up(client), 30, "the timeline to catch up")
        threading.Thread(target=traffic.run, daemon=True).start()
        stack.callback(traffic.stop.set)
        threading.Thread(target=traffic_reporter, args=(traffic, client, stop_background), daemon=True).start()

        say(f"Midday: {MIDDAY_RPS:g} req/s -> all 3 inference servers needed. Submitting training jobs "
            "(examples/train.py, real processes)")
        traffic.rate = MIDDAY_RPS
        ids = {}
        for name, gpus, low, high, steps in JOBS:
            command = [sys.executable, str(EXAMPLES / "train.py"), "--total-steps", str(steps), "--step-time", "1",
                       "--checkpoint-every", "5", "--log-every", "20"]
            init, largest, per_gpu = BATCH_HINTS.get(name, (None, None, None))
            submitted = client.submit_job(job_spec(name=name, command=command, user="demo", gpus_per_worker=gpus,
                                                   min_workers=low, max_workers=high, batch_size=init,
                                                   max_batch_size=largest, max_local_batch_size=per_gpu))
            ids[name] = submitted.job_id
            names[submitted.job_id] = name
            if name == "bert-large":
                # Running before the others arrive: submitted in one cycle with them, the joint sizing would give
                # the training pool to resnet50 at 8 workers (it completes sooner: the cluster's completion rate),
                # bert-large would start later on a loan, and the story's reclaim would preempt it too.
                wait_until(lambda: client.get_job(ids["bert-large"]).job.state == types_pb2.JOB_STATE_RUNNING, 30,
                           "bert-large on the training pool")
        wait_until(lambda: client.get_job(ids["vit-huge"]).job.pending_reason, 30, "the first decisions")
        wait_until(lambda: client.get_demand().servers_needed == 3, 30, "the router to ask for 3 servers")
        time.sleep(4)  # a few seconds of midday traffic, measured by the router
        show(address, "jobs")

        def job(name: str) -> types_pb2.Job:
            return client.get_job(ids[name]).job

        def loaned() -> int:
            return sum(s.state == types_pb2.SERVER_STATE_LOANED for s in client.list_servers())

        say(f"Evening: traffic falls to {EVENING_RPS:g} req/s -> the router needs 1 server; 2 are drained "
            "(no new requests, in-flight ones finish), acknowledged, and loaned to training")
        traffic.rate = EVENING_RPS
        wait_until(lambda: loaned() == 2, 60, "two loaned servers")
        on_loan = sorted(s.server_id for s in client.list_servers() if s.state == types_pb2.SERVER_STATE_LOANED)
        served_at_loan = {sid: model_served(model_ports[sid]) for sid in on_loan}
        wait_until(lambda: job("vit-huge").state == types_pb2.JOB_STATE_RUNNING, 30, "vit-huge on a loan")
        wait_until(lambda: job("resnet50").num_workers > 4, 30, "resnet50 to scale out onto the loan")
        resized = job("resnet50")
        wait_until(lambda: job("resnet50").progress > 0 and job("resnet50").incarnation == resized.incarnation, 30,
                   "the resized resnet50 to report progress")
        time.sleep(3)
        show(address, "jobs")
        show(address, "loans")
        say("resnet50 restarted at its new size from its checkpoint (its log):")
        show(address, "logs", ids["resnet50"], "--tail", "4")
        outcome.resnet_scaled_out_to = job("resnet50").num_workers
        outcome.resnet_progress_before_reclaim = job("resnet50").progress
        outcome.served_while_loaned = {sid: model_served(model_ports[sid]) - served_at_loan[sid] for sid in on_loan}
        line(f"  while on loan, {', '.join(on_loan)} answered "
             f"{sum(outcome.served_while_loaned.values())} inference request(s): the router sent them none")

        say(f"Next morning: traffic climbs to {MORNING_SPIKE_RPS:g} req/s over {MORNING_RAMP_S:g} s -> 3 servers "
            "needed; the scheduler's demand forecast sees the climb and reclaims the loaned servers ahead of the need "
            "(the reclaim's reason says so): resnet50 scales in, vit-huge is preempted (checkpointed) and requeued")
        began = time.monotonic()
        while (elapsed := time.monotonic() - began) < MORNING_RAMP_S:
            traffic.rate = EVENING_RPS + (MORNING_SPIKE_RPS - EVENING_RPS) * elapsed / MORNING_RAMP_S
            time.sleep(0.25)
        traffic.rate = MORNING_SPIKE_RPS
        wait_until(lambda: loaned() == 0 and router_ready(router_port, len(INFERENCE)), 60,
                   "the reclaimed servers to serve again")
        time.sleep(3)
        show(address, "jobs")
        show(address, "explain", ids["vit-huge"])

        traffic.rate = 0
        time.sleep(1.5)
        outcome.jobs = {name: job(name) for name in ids}
        two_queues(client, address, ids, names)
        stop_background.set()
        loans = client.list_loans(include_returned=True)
        events = list(client.watch_events(after_event_id=0, idle_timeout=1.0))
        outcome.loans_made = len(loans)
        outcome.servers_reclaimed = sum(e.to_state == "RECLAIMING" for e in events)
        on_forecast = [e.message for e in events if e.to_state == "RECLAIMING"
                       and e.message.startswith("the demand forecast says")]
        outcome.reclaims_on_forecast = len(on_forecast)
        outcome.forecast_reclaim_reason = on_forecast[0] if on_forecast else ""
        outcome.requests_sent, outcome.requests_ok = traffic.sent, traffic.ok
        outcome.requests_failed = list(traffic.failed)
        summarize(outcome, workdir)
        say("Shutting down router, model servers, agents (their workers with them) and scheduler")
    return outcome


def two_queues(client: ArylClient, address: str, ids: dict[str, str], names: dict[str, str]) -> None:
    """Two teams share the training servers' 8 GPUs through queues with 4 GPUs guaranteed each, in one
    cohort: one borrows the other's idle quota and gives it back when the other submits."""
    say("Two teams share the 8 training GPUs through queues: `vision` and `nlp`, 4 GPUs guaranteed each, in "
        "one cohort (each may borrow what the other leaves idle). The jobs so far are cancelled first")
    ended = (types_pb2.JOB_STATE_COMPLETED, types_pb2.JOB_STATE_CANCELLED, types_pb2.JOB_STATE_FAILED)
    states = {job_id: client.get_job(job_id).job.state for job_id in ids.values()}
    # The waiting ones first, so none starts on GPUs a cancelled one leaves.
    for job_id in sorted(states, key=lambda j: states[j] != types_pb2.JOB_STATE_PENDING):
        if states[job_id] not in ended:
            client.cancel_job(job_id, reason="the demo moves on to queues")
    for queue in ("vision", "nlp"):
        client.create_queue(queue, 4, cohort="lab")
    command = [sys.executable, str(EXAMPLES / "train.py"), "--total-steps", "600", "--step-time", "1",
               "--checkpoint-every", "5", "--log-every", "100"]
    team: dict[str, str] = {}
    for name, queue in (("vision-a", "vision"), ("vision-b", "vision")):
        submitted = client.submit_job(job_spec(name=name, command=command, user="demo", queue=queue,
                                               gpus_per_worker=4, min_workers=1))
        team[name], names[submitted.job_id] = submitted.job_id, name

    def state(name: str) -> int:
        return client.get_job(team[name]).job.state

    wait_until(lambda: all(state(n) == types_pb2.JOB_STATE_RUNNING for n in team), 60, "vision's two jobs")
    line("  vision runs 8 GPUs: its own 4 and nlp's idle 4, borrowed")
    show(address, "queues")
    say("nlp submits a 4-GPU job: vision gives the borrowed GPUs back (its cheapest job to stop is preempted)")
    submitted = client.submit_job(job_spec(name="nlp-a", command=command, user="demo", queue="nlp",
                                           gpus_per_worker=4, min_workers=1))
    team["nlp-a"], names[submitted.job_id] = submitted.job_id, "nlp-a"
    wait_until(lambda: state("nlp-a") == types_pb2.JOB_STATE_RUNNING, 60, "nlp's job to start")
    time.sleep(1)
    show(address, "queues")
    waiting = next((n for n in ("vision-a", "vision-b") if state(n) == types_pb2.JOB_STATE_PENDING), None)
    if waiting is not None:
        show(address, "explain", team[waiting])
    for job_id in team.values():
        client.cancel_job(job_id, reason="the demo ends")


def summarize(outcome: DemoOutcome, workdir: Path) -> None:
    say("Summary")
    print(f"   inference requests: {outcome.requests_sent} sent through the router, {outcome.requests_ok} ok, "
          f"{len(outcome.requests_failed)} failed; answered by loaned servers while on loan: "
          f"{sum(outcome.served_while_loaned.values())}")
    for failure in outcome.requests_failed[:5]:
        print(f"     failed: {failure}")
    print(f"   loans: {outcome.loans_made} made; servers reclaimed: {outcome.servers_reclaimed}, "
          f"{outcome.reclaims_on_forecast} of them ahead of the need, on the demand forecast"
          + (f": {outcome.forecast_reclaim_reason}" if outcome.forecast_reclaim_reason else ""))
    print("   the first jobs as the loan segment ended (the queues segment then cancelled them):")
    for name, j in outcome.jobs.items():
        print(f"   {name:<11} {types_pb2.JobState.Name(j.state).removeprefix('JOB_STATE_'):<9} "
              f"workers {j.num_workers}, incarnation {j.incarnation}, preemptions {j.preemptions}, "
              f"progress {j.progress:g} steps")
    print(f"   resnet50 grew to {outcome.resnet_scaled_out_to} workers on the loans and kept its progress across "
          f"resizes: {outcome.resnet_progress_before_reclaim:g} steps before the reclaim, "
          f"{outcome.jobs['resnet50'].progress:g} at the end")
    print(f"   demo took {time.monotonic() - CLOCK.start:.0f}s", flush=True)


def _stop_workers(workdir: Path) -> None:
    """Agents leave training workers running when they stop (so an agent upgrade does not kill
    training); the demo is over, so its workers go too: every process group started under workdir."""
    needle = str(workdir).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes() and b"node_agent/shim.py" in \
                        Path(f"/proc/{entry}/cmdline").read_bytes():
                    os.killpg(int(entry), signal.SIGTERM)
            except OSError:
                continue


def _processes_under(workdir: Path) -> bool:
    """Is any live process (not a zombie) started with workdir in its environment? One could still
    write a checkpoint or log there."""
    needle = str(workdir).encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes() and \
                        Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    return True
            except OSError:
                continue
    return False


def _remove(workdir: Path) -> bool:
    """Remove the demo's folder once nothing writes there any more; False if something still does."""
    try:
        wait_until(lambda: not _processes_under(workdir), 20, "the demo's workers to exit")
    except TimeoutError:
        return False
    shutil.rmtree(workdir, ignore_errors=True)
    return not workdir.exists()


def main(argv: list[str] | None = None) -> int:
    """Exit status (``aryl_common.entry``): 0 when the demo saw what it shows, 1 when it did not (or
    timed out), with one line on stderr (``--debug`` or ``ARYL_DEBUG=1`` adds a traceback)."""
    parser = argparse.ArgumentParser(prog="aryl-demo", description=__doc__.splitlines()[0])
    add_standard_flags(parser)
    parser.add_argument("--keep", action="store_true",
                        help="keep the database, logs and checkpoints (default: removed at the end, unless the demo "
                             "failed); the last line says where they are")
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext and no identities (default: TLS and tokens from a development CA made in "
                             "the work folder, docs/security.md)")
    parser.add_argument("--workdir", type=Path,
                        help="use and keep this folder, emptied first (default: a fresh aryl-demo-* folder in the "
                             "temporary directory)")
    args = parser.parse_args(argv)
    return run_guarded("aryl-demo", lambda: _run_demo(args), debug=args.debug)


def _run_demo(args: argparse.Namespace) -> int:
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="aryl-demo-"))).resolve()
    if args.workdir and workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        outcome = run(workdir, insecure=args.insecure)
    except TimeoutError as exc:
        _stop_workers(workdir)
        raise FatalError(f"{exc}; see the logs in {workdir}") from exc  # kept: they explain the failure
    except BaseException:
        _stop_workers(workdir)
        print(f"logs and database kept in {workdir}", flush=True)
        raise
    ok = not outcome.requests_failed and not any(outcome.served_while_loaned.values())
    if args.keep or args.workdir or not ok:
        print(f"logs and database kept in {workdir}", flush=True)
    elif _remove(workdir):
        print(f"logs and database removed (they were in {workdir}); aryl-demo --keep keeps them", flush=True)
    else:
        print(f"logs and database left in {workdir}: a demo process still runs there", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
