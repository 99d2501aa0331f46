"""Deadlines in the simulator: trace deadlines reach the policy's view, on the snapshot's clock."""

from __future__ import annotations

from dataclasses import replace

from scheduler_service.core.plan import Plan, Reason, StartJob
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.model import ClusterSpec
from tests.harness import linear_job, placed_on


def test_a_trace_deadline_reaches_the_job_view_pending_and_running() -> None:
    clock = VirtualClock(0.0)
    state = SimulatedCluster(ClusterSpec(1, 0), clock)
    state.submit(replace(linear_job(1, 0.0, 1, 1, 2, 100.0), deadline=500.0))
    state.submit(linear_job(2, 0.0, 1, 1, 1, 100.0))
    assert [j.deadline for j in state.snapshot().jobs] == [500.0, None]
    state.apply(Plan(starts=(StartJob(1, placed_on("t0000", (0,)), Reason.PLACED, ""),)))
    clock.advance_to(50.0)
    assert [j.deadline for j in state.snapshot().jobs] == [500.0, None]
