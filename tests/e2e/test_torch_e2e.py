"""A real PyTorch job on a real cluster: the scheduler (PostgreSQL, real gRPC), ``aryl-agent`` daemons
with fake GPUs, and ``examples/ddp_train.py`` as the job (``torch.distributed`` over gloo on CPU, with
``aryl_train``). The job declares batch limits, so the scheduler chooses its batch for each allocation.

The cluster, not the database, resizes it: 2 workers on node-a's two GPUs; node-b (one GPU) joins and
it grows to 3; node-a is drained and it shrinks to 1 on node-b. Then, read from the workers' own logs
and from GetJob:
- each world resumes from the checkpoint its predecessor saved when stopped, with the same model state
  (the parameters' digest printed at the save equals the one printed after the load, on every rank);
- the batch the scheduler chose for each world reached its workers (rank 0 measured at it);
- the gradient statistics and step times the workers measured reached the scheduler.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from arylctl.client import ArylClient
from protos.aryl.v1 import types_pb2
from scheduler_service.server import serve_in_background
from tests.harness import daemon_env, job_spec, scheduler_config
from tests.helpers import processes_mentioning, wait_for

if os.environ.get("CI") != "true":  # torch is in the dev extra: under CI a missing torch fails, never skips
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[dev]' brings the CPU build)")

REPO = Path(__file__).resolve().parents[2]
DDP_TRAIN = str(REPO / "examples" / "ddp_train.py")
RUNNING = types_pb2.JOB_STATE_RUNNING
BATCH = types_pb2.BatchHints(init_batch_size=24, max_batch_size=192, max_local_batch_size=32)

pytestmark = pytest.mark.postgres


class Cluster:
    """A scheduler and agent daemons under one temporary directory (as tests/e2e/test_e2e_workers.py's)."""

    def __init__(self, tmp_path: Path, database_url: str) -> None:
        self.tmp = tmp_path
        self.scheduler = serve_in_background(scheduler_config(
            database_url, agents={"report_interval_s": 0.3, "lost_after_s": 5.0, "telemetry_write_s": 0.5},
            scheduling={"cycle_interval_s": 0.2, "default_grace_period_s": 10.0},
            policy={"min_resize_interval_s": 0, "restart_cost_s": 0}))
        self.client = ArylClient(self.scheduler.address, timeout=10)
        self.agents: list[subprocess.Popen[bytes]] = []

    def start_agent(self, hostname: str, gpus: int) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env.update(ARYL_AGENT__RECONCILE_INTERVAL_S="0.1", ARYL_AGENT__CHECKPOINT_ROOT=str(self.tmp / "checkpoints"),
                   ARYL_AGENT__LOGS_LISTEN_HOST="127.0.0.1", ARYL_AGENT__ADVERTISE_ADDRESS="127.0.0.1",
                   ARYL_E2E_MARKER=str(self.tmp), OMP_NUM_THREADS="1", **daemon_env(hostname))
        args = [sys.executable, "-m", "node_agent.main", "--scheduler", self.scheduler.address, "--hostname", hostname,
                "--fake-gpus", str(gpus), "--work-dir", str(self.tmp / f"agent-{hostname}")]
        with (self.tmp / f"{hostname}.log").open("ab") as log:
            self.agents.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))

    def job(self, job_id: str) -> types_pb2.Job:
        return self.client.get_job(job_id).job

    def wait_job(self, job_id: str, check, what: str, timeout: float = 60) -> types_pb2.Job:
        return wait_for(lambda: j if check(j := self.job(job_id)) else None, timeout=timeout, interval=0.2,
                        what=f"job {job_id}: {what}")

    def close(self) -> None:
        for agent in self.agents:
            agent.send_signal(signal.SIGTERM)
        for agent in self.agents:
            try:
                agent.wait(timeout=15)
            except subprocess.TimeoutExpired:
                agent.kill()
        self.client.close()
        self.scheduler.stop()


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    c = Cluster(tmp_path, postgres_url)
    yield c
    c.close()
    for pid in processes_mentioning(str(tmp_path)):  # the workers agents leave running on purpose
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    wait_for(lambda: not processes_mentioning(str(tmp_path)), timeout=10, what="no processes left")


@dataclass
class World:
    """One incarnation of the job as its workers' logs tell it."""

    incarnation: int
    size: int
    batches: set[tuple[int, int]] = field(default_factory=set)  # (local, accum) each rank started with
    loaded: set[tuple[int, str]] = field(default_factory=set)   # (step, digest) each rank resumed at
    saves: list[tuple[int, str]] = field(default_factory=list)  # rank 0's saves, in order


LINE = re.compile(r"^\[rank (\d+)/(\d+)\] (.*)$")


def worlds(tmp: Path, job_id: str) -> dict[int, World]:
    """Every incarnation's start, loads and saves, from every agent's log files of the job."""
    found: dict[int, World] = {}
    for log in sorted(tmp.glob(f"agent-*/logs/{job_id}/rank-*.log")):
        world: World | None = None
        for line in log.read_text(errors="replace").splitlines():
            if not (match := LINE.match(line)):
                continue
            rank, size, text = int(match[1]), int(match[2]), match[3]
            if started := re.match(r"incarnation (\d+): batch local (\d+) accum (\d+) \(from the scheduler\)", text):
                world = found.setdefault(int(started[1]), World(int(started[1]), size))
                world.batches.add((int(started[2]), int(started[3])))
            elif world is None:
                continue
            elif loaded := re.match(r"(?:resumed|no checkpoint: starting at) step (\d+) \(parameters (\w+)\)", text):
                world.loaded.add((int(loaded[1]), loaded[2]))
            elif (saved := re.match(r"saved step (\d+) \(parameters (\w+)\)", text)) and rank == 0:
                world.saves.append((int(saved[1]), saved[2]))
    return found


def test_a_ddp_job_resized_2_3_1_resumes_its_state_and_runs_the_scheduler_s_batch(cluster: Cluster) -> None:
    cluster.start_agent("node-a", gpus=2)
    spec = job_spec("ddp", workers=1, max_workers=3, batch=BATCH)
    del spec.command[:]
    spec.command.extend([sys.executable, DDP_TRAIN, "--total-steps", "1000000", "--checkpoint-every", "10",
                         "--sample-time", "0.001"])
    job_id = cluster.client.submit_job(spec).job_id
    seen: dict[int, types_pb2.Job] = {}  # world size -> the job once rank 0 reported measures at that size

    def measured_at(size: int, job: types_pb2.Job, since: float = 0.0) -> bool:
        """Running ``size`` workers, and rank 0 has reported a step time at the batch chosen for them (measured
        at ``since`` or later: an earlier world of the same size and batch left one too)."""
        ok = job.state == RUNNING and job.num_workers == size and job.grad_sqr > 0 and any(
            (t.replicas, t.local_batch_size, t.accum_steps) == (size, job.local_batch_size, job.accum_steps)
            and t.measured_at.ToNanoseconds() >= since * 1e9 for t in job.step_times)
        if ok:
            seen[size] = job
        return ok

    cluster.wait_job(job_id, lambda j: measured_at(2, j), "2 workers measuring", timeout=90)
    cluster.start_agent("node-b", gpus=1)
    cluster.wait_job(job_id, lambda j: measured_at(3, j), "grown to 3 workers, measuring", timeout=90)
    drained_at = time.time()
    cluster.client.drain_server("node-a", reason="test: shrink the job to node-b")
    job = cluster.wait_job(job_id, lambda j: measured_at(1, j, since=drained_at) and j.progress > seen[3].progress,
                           "shrunk to 1 worker on node-b", timeout=90)
    assert [w.server_id for w in job.workers] == ["node-b"]

    # Gradient statistics and step times reached the scheduler (rank 0's, per configuration).
    for size, at in seen.items():
        assert at.grad_sqr > 0 and at.grad_var > 0 and at.noise_scale > 0, (size, at)
        assert at.samples > 0 and at.batch_size == size * at.local_batch_size * (at.accum_steps + 1)
        times = [t for t in at.step_times if t.replicas == size]
        assert times and all(0 < t.pass_time_s <= t.step_time_s for t in times), times
    assert seen[1].samples > seen[3].samples > seen[2].samples

    # The workers' own account: a world of 2, later one of 3 (node-b joined), then one of 1 (node-a drained).
    # A first world of 1 may precede (the job starts at its minimum and may grow within the same cycles),
    # and with no restart cost or resize interval here the goodput policy may pass through another size on
    # its way to 3, as measured speeds move on a loaded machine (in two loaded full runs it went 2, 1, 3).
    by_incarnation = worlds(cluster.tmp, job_id)
    order = [by_incarnation[i] for i in sorted(by_incarnation)]
    sizes = [w.size for w in order]
    account = [(w.incarnation, w.size, w.batches, w.saves[-1:]) for w in order]
    assert 2 in sizes[:-2] and sizes[-2:] == [3, 1], account
    for world in (order[sizes.index(2)], *order[-2:]):  # every rank started with one batch, the scheduler's for
        # that world (rank 0 measured at it; a goodput policy may change it in place later: ``seen`` holds the latest)
        configurations = {(t.local_batch_size, t.accum_steps) for t in job.step_times if t.replicas == world.size}
        assert len(world.batches) == 1 and world.batches <= configurations, (world, configurations)
    for before, after in itertools.pairwise(order):
        # Every rank of the next world loaded exactly what the last save of the previous one held.
        assert before.saves, before
        assert after.loaded == {before.saves[-1]}, (before, after)
    assert {step for step, _ in order[0].loaded} == {0}  # the first one started afresh
