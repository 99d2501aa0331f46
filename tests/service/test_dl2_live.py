"""``dl2`` with online learning in the live service, over real gRPC (TLS + tokens) on SQLite and PostgreSQL:
jobs are submitted, the test plays the agent (reports every worker of each placed job as exited 0), and the
learner, fed by the cycles alone, takes learning steps in its thread while cycles go on; every plan passes
the invariants checker and the applier refuses nothing. With online learning off the weights never change.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, types_pb2
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.plan import Plan
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.policies.dl2 import Dl2Policy, Greedy
from tests.harness import job_spec, register_fake_server, scheduler_stub, secure_channel
from tests.helpers import wait_for

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ModuleNotFoundError:
    HAVE_TORCH = False
needs_torch = pytest.mark.skipif(not HAVE_TORCH and os.environ.get("CI") != "true",
                                 reason="PyTorch is not installed (pip install -e '.[dev]' brings the CPU build)")

JOBS = 12
SERVER = "gpu-1"
COMPLETED = types_pb2.JOB_STATE_COMPLETED


@dataclass
class Checked:
    """The service's dl2 policy, each plan checked against its snapshot (``check_plan``) as it leaves."""

    inner: Dl2Policy
    problems: list[str] = field(default_factory=list)
    acting_plans: int = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        plan = self.inner.schedule(snapshot)
        self.problems.extend(check_plan(snapshot, plan))
        self.acting_plans += bool(plan.starts or plan.scales or plan.preemptions)
        return plan

    def close(self) -> None:
        self.inner.close()


def checked_dl2(handle: Any) -> tuple[Dl2Policy, Checked]:
    """The running service's dl2 policy, from now on behind ``Checked`` (the cycle calls it through
    ``FaultsFirst``, which the service built once)."""
    outer = handle.service.policy
    dl2 = outer.policy
    assert isinstance(dl2, Dl2Policy)
    checked = Checked(dl2)
    outer.policy = checked
    return dl2, checked


def sample(handle: Any, name: str) -> float:
    return handle.service.metrics.registry.get_sample_value(name) or 0.0


def cycles(handle: Any) -> float:
    return sample(handle, "aryl_scheduler_cycle_duration_seconds_count")


class Agent:
    """The test as the agent of ``SERVER``: finishes every worker the scheduler placed there."""

    def __init__(self, address: str, epoch: int) -> None:
        self._channel = secure_channel(address)
        self.stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        self.epoch = epoch

    def finish_placed(self) -> int:
        """Report every desired worker exited 0 (a job resized meanwhile just waits for the next call)."""
        stream = self.stub.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=SERVER), timeout=5)
        try:
            desired = next(iter(stream))
        finally:
            stream.cancel()
        exits = [agent_pb2.WorkerStatus(job_id=w.job_id, rank=w.rank, incarnation=w.incarnation,
                                        phase=agent_pb2.WORKER_PHASE_EXITED, exit_code=0) for w in desired.workers]
        if exits:
            self.stub.ReportStatus(agent_pb2.ReportStatusRequest(server_id=SERVER, scheduler_epoch=self.epoch,
                                                                 workers=exits), timeout=5)
        return len(exits)

    def close(self) -> None:
        self._channel.close()


def run_jobs_to_completion(handle: Any, stub: Any, agent: Agent, *, on_round: Any = None) -> None:
    """Submit ``JOBS`` elastic jobs (1..2 workers of 1 GPU: more than the 4 GPUs hold, so the network
    chooses who starts and who grows), then finish whatever is placed until every job has completed."""
    ids = [stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec(f"j{i}", workers=1, max_workers=2)),
                          timeout=5).job.job_id for i in range(JOBS)]

    def all_done() -> bool:
        agent.finish_placed()
        if on_round is not None:
            on_round()
        return all(stub.GetJob(scheduler_pb2.GetJobRequest(job_id=j), timeout=5).job.state == COMPLETED
                   for j in ids)

    wait_for(all_done, timeout=60, interval=0.1, what=f"all {JOBS} jobs to complete")


@needs_torch
def test_online_learning_in_the_service_learns_from_completed_jobs_without_holding_cycles(scheduler_factory) -> None:
    handle = scheduler_factory(scheduling={"policy": "dl2"},
                               policy={"dl2_online_learning": True, "dl2_online_batch_jobs": 2})
    dl2, checked = checked_dl2(handle)
    learner: Any = dl2.chooser
    assert not isinstance(learner, Greedy)
    first = dl2.current()

    # The first learning step is held inside the learning thread until the test has seen cycles go on.
    release, holding = threading.Event(), threading.Event()
    step = learner._step

    def held_step(*args: Any) -> None:
        holding.set()
        release.wait(30)
        step(*args)

    learner._step = held_step
    held: dict[str, float] = {}

    def watch() -> None:  # between rounds: once a step is held, note the cycle count, release after 3 more
        if holding.is_set() and "from" not in held:
            held["from"] = cycles(handle)
        if "from" in held and not release.is_set() and cycles(handle) >= held["from"] + 3:
            held["updates_while_held"] = learner.updates
            release.set()

    channel, stub = scheduler_stub(handle.address)
    epoch = register_fake_server(handle.address, SERVER, gpus=4).scheduler_epoch
    agent = Agent(handle.address, epoch)
    try:
        run_jobs_to_completion(handle, stub, agent, on_round=watch)
        def watched() -> bool:
            watch()
            return release.is_set()
        wait_for(watched, timeout=20, what="3 cycles while a learning step is held")
        assert held["updates_while_held"] == 0  # the cycles ran while the thread was inside its first step
        assert learner.wait_idle(30.0)
    finally:
        release.set()
        agent.close()
        channel.close()

    assert learner.handed >= 2 and learner.updates >= 1, (learner.handed, learner.updates, learner.dropped_batches)
    assert learner.failed_steps == 0
    now = dl2.current()
    assert now.meta.get("made_by") == "online"
    assert not np.array_equal(now.wp, first.wp) and not np.array_equal(now.w1, first.w1)
    assert checked.acting_plans >= JOBS // 4 and checked.problems == []  # 4 GPUs: 4 starts a plan at most
    assert sample(handle, "aryl_scheduler_plan_rejections_total") == 0
    handle.stop()  # the service stops the learning thread with it
    assert not learner._thread.is_alive()


def test_without_online_learning_the_service_keeps_its_weights(scheduler_factory) -> None:
    handle = scheduler_factory(scheduling={"policy": "dl2"}, policy={"dl2_online_batch_jobs": 2})
    dl2, checked = checked_dl2(handle)
    assert isinstance(dl2.chooser, Greedy)
    first = dl2.current()
    weights = {k: v.copy() for k, v in first.arrays().items()}
    channel, stub = scheduler_stub(handle.address)
    agent = Agent(handle.address, register_fake_server(handle.address, SERVER, gpus=4).scheduler_epoch)
    try:
        run_jobs_to_completion(handle, stub, agent)
    finally:
        agent.close()
        channel.close()
    assert dl2.current() is first
    assert all(np.array_equal(weights[k], v) for k, v in dl2.current().arrays().items())
    assert checked.acting_plans >= JOBS // 4 and checked.problems == []  # 4 GPUs: 4 starts a plan at most
    assert sample(handle, "aryl_scheduler_plan_rejections_total") == 0
