"""Faults on the agent's side (issue 19): real ``aryl-agent`` processes with fake GPUs, real worker
processes, a real scheduler (in this process, real gRPC) on PostgreSQL, and after every fault the
invariants of ``tests/chaos/invariants.py`` (no acknowledged job lost, no duplicate, no GPU
double-booked, workers match the database) plus what each fault must not do:

- **partition**: an agent in a network namespace of the test's own (``tests/chaos/netns.py``) cut off
  for 30 s (and 120 s under ``ARYL_CHAOS=full``): its server goes LOST after ``agents.lost_after_s``,
  the job shrinks to its workers elsewhere, the stale worker keeps running meanwhile (the agent hears
  nothing), and once the agent is back the desired state of its first registration stops the stale
  worker, in that session; then the processes are what the database says;
- **kill -9** of the agent with workers running: restarted within the grace, it re-adopts them (same
  processes, same incarnation); killed the moment it spawned a worker's shim, its successor adopts
  that shim (full run: also at random moments); restarted after its server was LOST, it stops them
  and runs the new incarnation; never two processes of one worker;
- **disk full**: the agent's work directory is a 1 MiB tmpfs filled up: the agent keeps reporting
  (never LOST), a job that cannot start fails with the reason (``No space left on device``), the
  job already running keeps running, and once there is room again jobs run;
- **clock jumps** of minutes, forward and back: on the scheduler (an injected ``Clock``, its wall time
  moved) liveness neither marks healthy servers LOST nor keeps a dead one alive; on the agent (its
  wall clock moved, by a wrapper the test starts the agent with: no package needed) a worker
  being stopped still gets its whole grace period and is still killed when the grace is over.

Bounded by default (``make test``); ``ARYL_CHAOS=full`` adds the 120 s partition and more kill points.
Liveness settings are shortened so that each fault outlasts the grace (said at each test). Every
test removes its processes, namespace and mount in ``finally`` blocks.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import NoReturn, overload

import pytest
import sqlalchemy as sa

from arylctl.client import ArylClient
from protos.aryl.v1 import types_pb2
from scheduler_service.clock import SystemClock
from scheduler_service.server import ServerHandle, serve_in_background
from tests.chaos import netns
from tests.chaos.invariants import MARKER_ENV, SERVER_ENV, check_invariants, live_workers, wait_workers_match
from tests.harness import IN_CI, daemon_env, job_spec, scheduler_config
from tests.helpers import processes_mentioning, wait_for

J = types_pb2
REPO = Path(__file__).resolve().parents[2]
FULL = os.environ.get("ARYL_CHAOS", "").lower() == "full"
full_only = pytest.mark.skipif(not FULL, reason="ARYL_CHAOS=full only (make chaos)")

pytestmark = pytest.mark.postgres

# The job every case runs: sleeps until SIGTERM; leaves a file per event in its marker directory, named
# <job>.<rank>.<incarnation>.<event> (started, sigterm, checkpointed). On SIGTERM: "exit" exits 0 at
# once; "checkpoint:S" takes S seconds to checkpoint, then exits 0; "ignore" carries on.
WORKER = """\
import os, signal, sys, time
markers, on_term = sys.argv[1], sys.argv[2]
name = ".".join(os.environ[k] for k in ("ARYL_JOB_ID", "RANK", "ARYL_INCARNATION"))
def mark(event):
    open(os.path.join(markers, name + "." + event), "w").close()
def stop(signum, frame):
    mark("sigterm")
    if on_term == "ignore":
        return
    if on_term.startswith("checkpoint:"):
        time.sleep(float(on_term.split(":")[1]))
        mark("checkpointed")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
mark("started")
while True:
    time.sleep(0.1)
"""

# Starts the agent with its wall clock offset by the number of seconds in a file the test rewrites: a
# clock jump without libfaketime. What is offset is the agent's own wall clock, the supervisor's clock
# port (``Supervisor(clock=)``, time.time by default, the one place node_agent reads wall time), patched
# before the agent starts. gRPC's deadline arithmetic (time.time() + timeout, handed to its C core,
# which reads the real clock) is left alone: a real jump moves both together.
SKEWED_AGENT = """\
import runpy, sys, time
from node_agent import supervisor
real_time, offset_file = time.time, sys.argv.pop(1)
def skewed_time():
    try:
        with open(offset_file) as file:
            return real_time() + float(file.read() or 0)
    except (OSError, ValueError):
        return real_time()
supervisor.Supervisor.__init__.__kwdefaults__["clock"] = skewed_time
sys.argv[0] = "aryl-agent"
runpy.run_module("node_agent.main", run_name="__main__", alter_sys=True)
"""


class JumpingClock(SystemClock):
    """The scheduler's clock with its wall time moved by hand (``jump``); the monotonic clock is the
    system's, as in a real jump (NTP stepping the clock, a VM resumed)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def now(self) -> float:
        return super().now() + self.offset

    def jump(self, seconds: float) -> None:
        self.offset += seconds


class Cluster:
    """A scheduler and ``aryl-agent`` processes of one test, marked for ``invariants.live_workers``."""

    def __init__(self, tmp: Path, url: str) -> None:
        self.tmp, self.url = tmp, url
        self.marker = f"agent-faults-{tmp.name}-{os.getpid()}"
        self.markers = tmp / "markers"
        self.markers.mkdir()
        (tmp / "worker.py").write_text(WORKER)
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._scheduler: ServerHandle | None = None
        self._client: ArylClient | None = None
        self.acknowledged: list[str] = []
        self.names: list[str] = []

    @property
    def scheduler(self) -> ServerHandle:
        assert self._scheduler is not None, "start_scheduler first"
        return self._scheduler

    @property
    def client(self) -> ArylClient:
        assert self._client is not None, "start_scheduler first"
        return self._client

    # -- daemons -----------------------------------------------------------------------------------

    def start_scheduler(self, *, host: str = "127.0.0.1", clock=None, lost_after_s: float = 3.0,
                        grace_s: float = 5.0) -> None:
        config = scheduler_config(
            self.url, server={"listen": f"{host}:0"},
            agents={"report_interval_s": 0.5, "lost_after_s": lost_after_s, "telemetry_write_s": 1.0},
            scheduling={"cycle_interval_s": 0.2, "default_grace_period_s": grace_s},
            policy={"min_resize_interval_s": 0, "restart_cost_s": 0})
        self._scheduler = serve_in_background(config, clock=clock)
        self._client = ArylClient(self._scheduler.address, timeout=10)

    def start_agent(self, hostname: str, *, gpus: int = 1, ns: netns.NetNamespace | None = None,
                    work_dir: Path | None = None, clock_offset_file: Path | None = None) -> None:
        """``ns``: run it in that namespace (it reaches the scheduler only if that listens on the
        namespace's host address); ``clock_offset_file``: its wall clock is offset by the file's seconds."""
        address = ns.inside_address if ns is not None else "127.0.0.1"
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env.update({MARKER_ENV: self.marker, SERVER_ENV: hostname, "PYTHONPATH": str(REPO),
                    "ARYL_AGENT__RECONCILE_INTERVAL_S": "0.1", "ARYL_AGENT__RECONNECT_MAX_BACKOFF_S": "1",
                    "ARYL_AGENT__RPC_TIMEOUT_S": "2", "ARYL_AGENT__CHECKPOINT_ROOT": str(self.tmp / "checkpoints"),
                    "ARYL_AGENT__LOGS_LISTEN_HOST": address, "ARYL_AGENT__ADVERTISE_ADDRESS": address,
                    "ARYL_LOGGING__LEVEL": "info", "ARYL_LOGGING__FORMAT": "json",
                    # workers get a clean environment: these two let the test find them (invariants.py)
                    "ARYL_USERS__PASS_ENV": json.dumps([MARKER_ENV, SERVER_ENV]),
                    **daemon_env(hostname)})  # mutual TLS with a certificate naming its server id, and a token
        program = [sys.executable, "-m", "node_agent.main"]
        if clock_offset_file is not None:
            (self.tmp / "skewed_agent.py").write_text(SKEWED_AGENT)
            program = [sys.executable, str(self.tmp / "skewed_agent.py"), str(clock_offset_file)]
        args = [*program, "--scheduler", self.scheduler.address, "--hostname", hostname,
                "--fake-gpus", str(gpus), "--work-dir", str(work_dir or self.tmp / f"agent-{hostname}")]
        if ns is not None:
            args = ns.run_args(args)
        with self.agent_log(hostname).open("ab") as log:
            self.agents[hostname] = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def restart_agent(self, hostname: str, **options) -> None:
        """kill -9, start again with the same work directory, and wait until it registered."""
        registered = self.registrations(hostname)
        self.kill_agent(hostname)
        self.start_agent(hostname, **options)
        wait_for(lambda: self.registrations(hostname) > registered, what=f"{hostname} registered again")

    def registrations(self, hostname: str) -> int:
        return sum(e.get("event") == "registered with the scheduler" for e in self.agent_events(hostname))

    def agent_log(self, hostname: str) -> Path:
        return self.tmp / f"agent-{hostname}.log"

    def agent_events(self, hostname: str) -> list[dict]:
        """The agent's JSON log lines, in order (every run of it under this hostname)."""
        events = []
        for line in self.agent_log(hostname).read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return events

    def kill_agent(self, hostname: str) -> None:
        """kill -9: no shutdown, no state saved beyond what was saved already."""
        agent = self.agents.pop(hostname)
        agent.kill()
        agent.wait(timeout=10)

    def close(self) -> None:
        for agent in self.agents.values():
            agent.kill()
        for agent in self.agents.values():
            agent.wait(timeout=10)
        self.agents.clear()
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._scheduler is not None:
            self._scheduler.stop()
            self._scheduler = None
        # Workers outlive their agents by design: end them (each leads its process group).
        for pid in processes_mentioning(self.marker):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        wait_for(lambda: not processes_mentioning(self.marker), timeout=10, what="no process of the test left")

    # -- jobs and servers ----------------------------------------------------------------------------

    def submit(self, name: str, *, on_term: str = "exit", **fields) -> str:
        spec = job_spec(name, **fields)
        del spec.command[:]
        spec.command.extend([sys.executable, str(self.tmp / "worker.py"), str(self.markers), on_term])
        self.names.append(name)
        job_id = self.client.submit_job(spec).job_id
        self.acknowledged.append(job_id)
        return job_id

    def job(self, job_id: str) -> types_pb2.Job:
        return self.client.get_job(job_id).job

    def wait_job(self, job_id: str, check, what: str, timeout: float = 60) -> types_pb2.Job:
        return wait_for(lambda: j if check(j := self.job(job_id)) else None, timeout=timeout, interval=0.1,
                        what=f"job {job_id}: {what}")

    def servers(self) -> dict[str, types_pb2.Server]:
        return {s.server_id: s for s in self.client.list_servers()}

    def wait_server(self, server_id: str, state: int, timeout: float = 60) -> None:
        wait_for(lambda: (s := self.servers().get(server_id)) is not None and s.state == state, timeout=timeout,
                 interval=0.1, what=f"server {server_id} {J.ServerState.Name(state)}")

    def lost_events(self, server_id: str) -> int:
        """How often the event log says ``server_id`` went LOST."""
        engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT count(*) FROM events WHERE server_id = :s AND to_state = 'LOST'"),
                                    {"s": server_id}).scalar_one()
        finally:
            engine.dispose()

    def worker_pids(self) -> list[int]:
        """The test's processes but its agents: shims and workers."""
        agents = {agent.pid for agent in self.agents.values()}
        return sorted(set(processes_mentioning(self.marker)) - agents)

    def marked(self, job_id: str, rank: int, incarnation: int, event: str) -> bool:
        return (self.markers / f"{job_id}.{rank}.{incarnation}.{event}").exists()

    def settled(self, servers=None) -> set:
        """After recovery: the processes are the database's, and every invariant holds."""
        workers = wait_workers_match(self.url, self.marker, servers=servers, timeout=30)
        check_invariants(self.url, self.acknowledged, submitted_names=self.names)
        assert not duplicated_workers(self.marker), duplicated_workers(self.marker)
        return workers


def duplicated_workers(marker: str) -> dict:
    """Workers (server, job, rank, incarnation) with more than one live process: a worker started twice.
    (``live_workers`` is a set, so it cannot see them.)"""
    counts: Counter = Counter()
    for pid in processes_mentioning(marker):
        try:
            raw = Path("/proc", str(pid), "environ").read_bytes()
            if b"shim.py" in Path("/proc", str(pid), "cmdline").read_bytes():
                continue
        except OSError:
            continue
        env = dict(i.split("=", 1) for i in raw.decode(errors="replace").split("\0") if "=" in i)
        if "ARYL_JOB_ID" in env:
            counts[(env.get(SERVER_ENV), env["ARYL_JOB_ID"], env.get("RANK"), env.get("ARYL_INCARNATION"))] += 1
    return {worker: n for worker, n in counts.items() if n > 1}


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    c = Cluster(tmp_path, postgres_url)
    try:
        yield c
    finally:
        c.close()


@overload
def require(reason: None) -> None: ...
@overload
def require(reason: str) -> NoReturn: ...
def require(reason: str | None) -> None:
    """Skip a case the machine cannot run; under CI=true that is a failure (CI runs as root with iproute2)."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


# -- partition ---------------------------------------------------------------------------------------

# partition length -> the scheduler's agents.lost_after_s for it: the bounded 30 s partition uses a
# 5 s grace (the default 30 s would not be exceeded), the 120 s one the default.
PARTITIONS = [pytest.param(30.0, 5.0, id="30s"), pytest.param(120.0, 30.0, id="120s", marks=full_only)]


@pytest.mark.parametrize(("partition_s", "lost_after_s"), PARTITIONS)
def test_a_partitioned_agent_loses_its_server_and_stops_its_stale_worker_on_rejoin(
        cluster: Cluster, partition_s: float, lost_after_s: float) -> None:
    require(netns.unavailable())
    with ExitStack() as stack:
        try:
            ns = stack.enter_context(netns.network_namespace())
        except netns.NamespaceUnavailable as exc:
            require(str(exc))
        try:
            cluster.start_scheduler(host=ns.host_address, lost_after_s=lost_after_s)
            cluster.start_agent("inside", ns=ns)
            cluster.start_agent("outside")  # on the host, reaching the scheduler at the host address
            wait_for(lambda: len(cluster.servers()) == 2, what="both agents registered")
            job_id = cluster.submit("spread", workers=1, max_workers=2)
            job = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_RUNNING and j.num_workers == 2,
                                   "running on both servers")
            before = cluster.settled()
            [stale] = [w for w in before if w.server_id == "inside"]

            partitioned_at = time.monotonic()
            ns.partition()
            try:
                cluster.wait_server("inside", J.SERVER_STATE_LOST, timeout=partition_s)
                shrunk = cluster.wait_job(
                    job_id, lambda j: j.state == J.JOB_STATE_RUNNING and j.incarnation > job.incarnation,
                    "shrunk to its worker outside", timeout=partition_s)
                assert [w.server_id for w in shrunk.workers] == ["outside"] and shrunk.num_workers == 1
                # Nothing reaches the agent: its worker of the old incarnation runs on (a stale worker).
                assert stale in live_workers(cluster.marker, servers={"inside"})
                assert not cluster.marked(job_id, stale.rank, stale.incarnation, "sigterm")
                time.sleep(max(0.0, partition_s - (time.monotonic() - partitioned_at)))
                assert stale in live_workers(cluster.marker, servers={"inside"})
            finally:
                ns.heal()
            rejoin_from = len(cluster.agent_events("inside"))

            cluster.wait_server("inside", J.SERVER_STATE_TRAINING)
            cluster.settled()
            assert cluster.marked(job_id, stale.rank, stale.incarnation, "sigterm")  # stopped gracefully
            # The desired state its first registration after the partition returned stopped it, in
            # that session: not a later resynchronisation, nor the next report.
            after = cluster.agent_events("inside")[rejoin_from:]
            rejoined = next(i for i, e in enumerate(after) if e.get("source") == "registration")
            stopped = next(i for i, e in enumerate(after) if e.get("event") == "stopping worker (SIGTERM)"
                           and e.get("worker") == f"{job_id}/rank-{stale.rank}/inc-{stale.incarnation}")
            ended = [i for i, e in enumerate(after)
                     if e.get("event") == "no session with the scheduler, registering again"]
            assert rejoined < stopped and not [i for i in ended if rejoined < i < stopped], after
            assert cluster.lost_events("outside") == 0
        finally:
            cluster.close()  # its processes live in the namespace: end them before it goes


# -- kill -9 of the agent --------------------------------------------------------------------------


def test_an_agent_killed_with_workers_running_readopts_them_and_never_runs_one_twice(cluster: Cluster) -> None:
    # lost_after_s 60 s, far longer than a restart takes: the server is never LOST, no job moves.
    cluster.start_scheduler(lost_after_s=60.0)
    cluster.start_agent("a", gpus=4)
    job_id = cluster.submit("adopted", workers=2)
    job = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_RUNNING, "running")
    before = cluster.settled()
    pids = cluster.worker_pids()

    # Killed with its workers running, restarted at once: it adopts them, the same processes.
    cluster.restart_agent("a", gpus=4)
    assert cluster.settled() == before
    assert cluster.worker_pids() == pids
    after = cluster.job(job_id)
    assert (after.incarnation, after.restarts, after.preemptions) == (job.incarnation, 0, 0)

    # Killed the moment it spawned a worker's shim, before it can have done anything after the
    # spawn: its successor finds that shim instead of starting the worker a second time.
    running = [job_id]
    for round_ in range(2):
        known = set(cluster.worker_pids())
        running.append(cluster.submit(f"spawned-{round_}", workers=1))
        def spawned(known: set[int] = known) -> int | None:
            return new_shim(cluster, known)
        wait_for(spawned, interval=0.0005, what="the worker's shim spawned")
        cluster.restart_agent("a", gpus=4)
        cluster.settled()

    # ARYL_CHAOS=full: killed at random moments while a job is cancelled and another started.
    rng = random.Random(19)
    for round_ in range(12 if FULL else 0):
        cluster.client.cancel_job(running.pop(rng.randrange(len(running))), reason="chaos")
        running.append(cluster.submit(f"random-{round_}", workers=1))
        time.sleep(rng.uniform(0.0, 0.6))
        cluster.restart_agent("a", gpus=4)
        cluster.settled()
    assert cluster.lost_events("a") == 0


def test_an_agent_back_after_its_server_was_lost_replaces_its_workers_never_runs_two(cluster: Cluster) -> None:
    # lost_after_s 2 s: the agent stays down until its server is LOST and the job requeued.
    cluster.start_scheduler(lost_after_s=2.0)
    cluster.start_agent("a", gpus=2)
    job_id = cluster.submit("replaced", workers=2)
    job = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_RUNNING, "running")
    cluster.settled()

    cluster.kill_agent("a")
    cluster.wait_server("a", J.SERVER_STATE_LOST)
    cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_PENDING, "requeued")
    cluster.start_agent("a", gpus=2)
    restarted = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_RUNNING and j.incarnation > job.incarnation,
                                 "running again")
    workers = cluster.settled()
    assert {w.incarnation for w in workers} == {restarted.incarnation} and len(workers) == 2
    for rank in (0, 1):
        assert cluster.marked(job_id, rank, job.incarnation, "sigterm")  # the old ones stopped, gracefully


def new_shim(cluster: Cluster, known: set[int]) -> int | None:
    """A shim process of the test's that is not in ``known``."""
    for pid in set(cluster.worker_pids()) - known:
        try:
            if b"shim.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


# -- disk full ---------------------------------------------------------------------------------------


@contextmanager
def small_tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    path.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=30, check=False)
    if mounted.returncode != 0:
        require(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True, timeout=30)


def fill(directory: Path) -> Path:
    """Write a file in ``directory`` until the filesystem is full; returns it."""
    filler = directory / "filler"
    with filler.open("wb") as file:
        try:
            while True:
                file.write(b"\0" * 65536)
                file.flush()
        except OSError:
            pass
    try:
        while True:  # the last few bytes too
            with filler.open("ab") as file:
                file.write(b"\0")
    except OSError:
        pass
    return filler


def test_a_full_work_directory_fails_the_job_with_the_reason_and_the_agent_keeps_reporting(
        cluster: Cluster, tmp_path: Path) -> None:
    require(None if os.geteuid() == 0 else "mounting a tmpfs needs root")
    with ExitStack() as stack:
        work = stack.enter_context(small_tmpfs(tmp_path / "small-disk"))
        stack.callback(cluster.close)  # before the unmount
        cluster.start_scheduler(lost_after_s=3.0)
        cluster.start_agent("full", gpus=2, work_dir=work)
        before = cluster.submit("before", workers=1)
        cluster.wait_job(before, lambda j: j.state == J.JOB_STATE_RUNNING, "running")
        cluster.settled()

        filler = fill(work)
        blocked = cluster.submit("blocked", workers=1, restart_policy=J.RESTART_POLICY_NEVER)
        failed = cluster.wait_job(blocked, lambda j: j.state == J.JOB_STATE_FAILED, "failed")
        # The reason is the agent's: it could not record the worker, so it did not start it. The job
        # says so, as does the worker's exit event.
        assert "cannot start the worker" in failed.message and "No space left on device" in failed.message, (
            failed.message)
        exits = [e.message for e in cluster.client.get_job(blocked, include_events=True).events
                 if e.kind == J.EVENT_KIND_WORKER_EXITED]
        assert len(exits) == 1 and "cannot start the worker" in exits[0], exits
        assert "No space left on device" in exits[0], exits
        # The agent still reports and converges: its server's generation is caught up, the job that
        # ran before runs on, and the server was never LOST.
        cluster.settled()
        assert cluster.job(before).state == J.JOB_STATE_RUNNING
        assert cluster.servers()["full"].state == J.SERVER_STATE_TRAINING and cluster.lost_events("full") == 0

        filler.unlink()
        after = cluster.submit("after", workers=1)
        cluster.wait_job(after, lambda j: j.state == J.JOB_STATE_RUNNING, "running once there is room")
        cluster.settled()
        assert cluster.lost_events("full") == 0
        # Said once per stretch of failed saves (not a traceback per pass), and when it saved again.
        said = [e["event"] for e in cluster.agent_events("full")]
        assert "reconciling workers failed; retrying at the next tick" not in said
        failing, again = "cannot save the state file; retrying at every pass", "state file saved again"
        saves = [e for e in said if e in (failing, again)]
        assert saves[:1] == [failing] and saves[-1:] == [again], saves
        assert all(a != b for a, b in itertools.pairwise(saves)), saves


# -- clock jumps -------------------------------------------------------------------------------------


def test_scheduler_clock_jumps_neither_lose_healthy_servers_nor_keep_a_dead_one(cluster: Cluster) -> None:
    # lost_after_s 2 s; each jump is 10 minutes, far beyond it, and held for a grace.
    clock = JumpingClock()
    lost_after_s = 2.0
    cluster.start_scheduler(clock=clock, lost_after_s=lost_after_s)
    cluster.start_agent("a")
    cluster.start_agent("b")
    job_id = cluster.submit("steady", workers=1)
    job = cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_RUNNING, "running")
    cluster.settled()

    for jump in (+600.0, -1200.0):
        clock.jump(jump)
        # A liveness that read the wall clock would act at its first sweep after the jump (it sweeps
        # 4 times per grace): one grace of sweeps is enough to see it.
        time.sleep(lost_after_s)
        assert cluster.lost_events("a") == 0 and cluster.lost_events("b") == 0, f"after a jump of {jump:+.0f} s"
    after = cluster.job(job_id)
    assert (after.state, after.incarnation) == (J.JOB_STATE_RUNNING, job.incarnation)

    # A dead agent is LOST after its grace, the wall clock set back or not.
    [idle] = {"a", "b"} - {w.server_id for w in after.workers}
    cluster.kill_agent(idle)
    clock.jump(-600.0)
    cluster.wait_server(idle, J.SERVER_STATE_LOST, timeout=30)
    cluster.settled()


def test_agent_clock_jumps_neither_cut_a_workers_grace_short_nor_stretch_it(cluster: Cluster) -> None:
    # A 4 s grace; the agent's wall clock jumps 10 minutes while a worker is in it.
    offset = cluster.tmp / "agent-clock-offset"
    offset.write_text("0")
    cluster.start_scheduler(lost_after_s=3.0, grace_s=4.0)
    cluster.start_agent("a", gpus=2, clock_offset_file=offset)

    # Forward: a worker that needs 1.5 s to checkpoint after SIGTERM must get them, not SIGKILL at once.
    careful = cluster.submit("careful", workers=1, on_term="checkpoint:1.5")
    job = cluster.wait_job(careful, lambda j: j.state == J.JOB_STATE_RUNNING, "running")
    cluster.settled()
    wait_for(lambda: cluster.marked(careful, 0, job.incarnation, "started"), what="its SIGTERM handler set")
    cluster.client.cancel_job(careful, reason="clock test")
    wait_for(lambda: cluster.marked(careful, 0, job.incarnation, "sigterm"), what="the worker told to stop")
    offset.write_text("600")
    wait_for(lambda: not live_workers(cluster.marker), timeout=30, what="the worker gone")
    assert cluster.marked(careful, 0, job.incarnation, "checkpointed"), "SIGKILLed before its grace was over"

    # Back: a worker that ignores SIGTERM is still killed once its grace is over, not 10 minutes later.
    stubborn = cluster.submit("stubborn", workers=1, on_term="ignore")
    job = cluster.wait_job(stubborn, lambda j: j.state == J.JOB_STATE_RUNNING, "running")
    cluster.settled()
    wait_for(lambda: cluster.marked(stubborn, 0, job.incarnation, "started"), what="its SIGTERM handler set")
    cluster.client.cancel_job(stubborn, reason="clock test")
    wait_for(lambda: cluster.marked(stubborn, 0, job.incarnation, "sigterm"), what="the worker told to stop")
    offset.write_text("-600")
    wait_for(lambda: not live_workers(cluster.marker), timeout=30, what="the worker killed after its grace")
    cluster.settled()
    assert cluster.lost_events("a") == 0  # the agent's clock is nothing to the scheduler's liveness

