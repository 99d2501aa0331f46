"""The pure core: lifecycles, the policy registry, placement and the FIFO policy."""

from __future__ import annotations

from itertools import pairwise

import pytest

from scheduler_service.core import PolicyRegistry, Reason, UnknownPolicy
from scheduler_service.lifecycle import (
    JOB_LIFECYCLE,
    SERVER_LIFECYCLE,
    IllegalTransition,
    JobState,
    ServerState,
)
from scheduler_service.policies import create_policy
from tests.harness import inference_server, pending_job, snapshot_of, training_server


def plan(servers, jobs):
    return create_policy("fifo").schedule(snapshot_of(servers, jobs))


def test_job_lifecycle_refuses_illegal_moves() -> None:
    JOB_LIFECYCLE.check(JobState.PENDING, JobState.RUNNING)
    JOB_LIFECYCLE.check(JobState.PREEMPTED, JobState.PENDING)
    for current, target in [(JobState.COMPLETED, JobState.RUNNING), (JobState.CANCELLED, JobState.PENDING),
                            (JobState.PENDING, JobState.COMPLETED), (JobState.PENDING, JobState.PREEMPTED)]:
        with pytest.raises(IllegalTransition, match=f"from {current} to {target}"):
            JOB_LIFECYCLE.check(current, target)


def test_server_lifecycle_follows_the_loan_cycle() -> None:
    cycle = [ServerState.SERVING, ServerState.DRAINING, ServerState.LOANED, ServerState.RECLAIMING, ServerState.SERVING]
    for current, target in pairwise(cycle):
        SERVER_LIFECYCLE.check(current, target)
    with pytest.raises(IllegalTransition):
        SERVER_LIFECYCLE.check(ServerState.SERVING, ServerState.LOANED)  # must drain first
    with pytest.raises(IllegalTransition):
        SERVER_LIFECYCLE.check(ServerState.TRAINING, ServerState.SERVING)


def test_registry_refuses_duplicates_and_names_the_known_policies() -> None:
    registry = PolicyRegistry()
    # Stand-ins, not policies: the registry only keeps them by name (never calls them here).
    registry.register("a")(lambda params: object())  # type: ignore[arg-type, return-value]
    with pytest.raises(ValueError, match="already registered"):
        registry.register("a")(lambda params: object())  # type: ignore[arg-type, return-value]
    with pytest.raises(UnknownPolicy, match=r"registered: a$"):
        registry.create("b")


def test_best_fit_packs_the_fullest_server_that_fits() -> None:
    servers = [training_server("big", 8), training_server("small", 2, allocated=((0, 99),))]
    result = plan(servers, [pending_job(1, gpus=1)])
    [start] = result.starts
    assert [(w.server_id, w.gpu_indices) for w in start.workers] == [("small", (1,))]


def test_gang_is_all_or_nothing() -> None:
    result = plan([training_server("a", 2), training_server("b", 2)], [pending_job(1, gpus=2, workers=3)])
    assert result.starts == ()
    [pending] = result.pending
    assert pending.reason == Reason.WAITING_FOR_GANG
    assert "needs 3 worker(s) x 2 GPU(s)" in pending.message


def test_workers_never_span_servers_and_ranks_are_dense() -> None:
    result = plan([training_server("a", 3), training_server("b", 3)], [pending_job(1, gpus=2, workers=2)])
    [start] = result.starts
    assert [w.rank for w in start.workers] == [0, 1]
    assert {w.server_id for w in start.workers} == {"a", "b"}
    assert all(len(w.gpu_indices) == 2 for w in start.workers)


def test_unhealthy_gpus_and_serving_inference_servers_are_not_used() -> None:
    servers = [training_server("t", 2, unhealthy_gpus=frozenset({0})), inference_server("i", gpus=8)]
    result = plan(servers, [pending_job(1, gpus=2)])
    assert result.starts == ()
    assert result.pending[0].reason == Reason.WORKER_TOO_LARGE


def test_loaned_inference_servers_run_training() -> None:
    result = plan([inference_server("i", ServerState.LOANED, gpus=8)], [pending_job(1, gpus=8)])
    assert [w.server_id for w in result.starts[0].workers] == ["i"]


def test_no_training_capacity_is_explained() -> None:
    result = plan([], [pending_job(1)])
    assert result.pending[0].reason == Reason.NO_TRAINING_CAPACITY


def test_fifo_orders_by_priority_then_arrival_and_blocks_behind_the_head() -> None:
    jobs = [pending_job(1, gpus=4, submitted=1), pending_job(2, gpus=1, submitted=2),
            pending_job(3, gpus=1, priority=5, submitted=3)]
    result = plan([training_server("a", 4)], jobs)
    assert [s.job_id for s in result.starts] == [3]
    reasons = {p.job_id: p.reason for p in result.pending}
    assert reasons == {1: Reason.WAITING_FOR_GANG, 2: Reason.BLOCKED_BY_EARLIER_JOB}


def test_plans_never_double_book_and_are_deterministic() -> None:
    servers = [training_server(f"s{i}", 4, allocated=((0, 100 + i),)) for i in range(5)]
    jobs = [pending_job(i, gpus=1 + i % 3, workers=1 + i % 2) for i in range(1, 12)]
    first, second = plan(servers, jobs), plan(servers, jobs)
    assert first == second
    used = [(w.server_id, g) for s in first.starts for w in s.workers for g in w.gpu_indices]
    assert len(used) == len(set(used))
    assert not {(f"s{i}", 0) for i in range(5)} & set(used)
