"""What an inference reclaim makes of the protection window (``policy.reclaim_protection``,
``core.protection.reclaim_scale_in_penalty``): "strict" disrupts a protected job only when the loaned servers
without one do not suffice, even if that stops an unprotected job; "shrink" (the default) shrinks a protected
elastic job for one more restart of all its GPUs when that costs less than the other choices, and still stops
a protected job only as a last resort. Hand-built snapshots, each plan worked out in the comments and checked
by the plan invariants."""

from __future__ import annotations

import pytest

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import LoanStep, Plan, Reason
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.lifecycle import ServerState
from scheduler_service.policies import create_policy
from tests.harness import NOW, inference_server, running_job, snapshot_of, training_server

pytestmark = pytest.mark.timeout(60)


def plan(snapshot: ClusterSnapshot, protection: str | None) -> Plan:
    """``aryl``'s plan under ``policy.reclaim_protection = protection`` (``None``: the default)."""
    params = PolicyParams(loan_buffer_servers=0) if protection is None else PolicyParams(
        loan_buffer_servers=0, reclaim_protection=protection)
    result = create_policy("aryl", params).schedule(snapshot)
    check_plan(snapshot, result)
    return result


# Training servers t (8 GPUs, all job 4's) and t2 (4 GPUs, job 3's base worker): no room for a move. Inference
# servers: i0 serving, i1 and i2 lent two hours ago (4 GPUs each). Inference needs 2 serving: one lent server
# goes back.
# - i1 holds job 2, rigid (1 worker of 4 GPUs), started an hour ago and never checkpointed: unprotected; stopping
#   it loses 3,600 s x 4 GPUs of work and a restart of 60 s x 4 GPUs: 14,640 GPU-seconds.
# - i2 holds job 3's extra worker (elastic 1..2 workers of 4 GPUs, resized 100 s ago: protected, MIN_RUNTIME);
#   shrinking it costs a restart of the worker's GPUs (60 s x 4) and, under "shrink", one more restart of all
#   the job's GPUs (60 s x 8): 720 GPU-seconds.
SERVERS = [training_server("t", gpus=8), training_server("t2", gpus=4),
           inference_server("i0", ServerState.SERVING, gpus=4, since=NOW - 7200),
           inference_server("i1", ServerState.LOANED, gpus=4, since=NOW - 7200),
           inference_server("i2", ServerState.LOANED, gpus=4, since=NOW - 7200)]
FULL = running_job(4, [("t", tuple(range(8)))], low=1, resized=NOW - 3600)
RIGID = running_job(2, [("i1", (0, 1, 2, 3))], low=1, resized=NOW - 3600)
ELASTIC = running_job(3, [("t2", (0, 1, 2, 3)), ("i2", (0, 1, 2, 3))], low=1, high=2, resized=NOW - 100)


def reclaimed(result: Plan) -> list[str]:
    return [a.server_id for a in result.server_actions if a.kind == LoanStep.RECLAIM]


def test_strict_stops_the_unprotected_job_to_spare_the_protected_one() -> None:
    result = plan(snapshot_of(SERVERS, [FULL, RIGID, ELASTIC], demand=2), "strict")
    assert reclaimed(result) == ["i1"]
    assert [(p.job_id, p.reason) for p in result.preemptions] == [(2, Reason.PREEMPTED_FOR_RECLAIM)]
    assert not [s for s in result.scales if s.job_id == 3]


@pytest.mark.parametrize("protection", ["shrink", None])
def test_shrink_shrinks_the_protected_job_when_that_costs_less(protection: str | None) -> None:
    # 720 GPU-seconds against 14,640: i2 goes back, job 3 runs on at 1 worker on t2, job 2 keeps running. The
    # default setting does the same.
    result = plan(snapshot_of(SERVERS, [FULL, RIGID, ELASTIC], demand=2), protection)
    assert reclaimed(result) == ["i2"]
    assert result.preemptions == ()
    [shrunk] = result.scales
    assert (shrunk.job_id, shrunk.reason) == (3, Reason.SCALED_IN_FOR_RECLAIM)
    assert [(w.server_id, w.gpu_indices) for w in shrunk.workers] == [("t2", (0, 1, 2, 3))]
    assert "overrides its protection (MIN_RUNTIME" in shrunk.message
    assert "shrinking it costs less than the other choices (policy.reclaim_protection = shrink)" in shrunk.message


def test_shrink_still_stops_a_protected_job_only_as_a_last_resort() -> None:
    # i2 holds job 5 instead: rigid, started 100 s ago (protected). Stopping it is never weighed by cost: the
    # reclaim takes i1 and stops job 2, as under "strict".
    protected_rigid: JobView = running_job(5, [("i2", (0, 1, 2, 3))], low=1, resized=NOW - 100)
    busy_t2 = running_job(6, [("t2", (0, 1, 2, 3))], low=1, resized=NOW - 3600)
    result = plan(snapshot_of(SERVERS, [FULL, RIGID, protected_rigid, busy_t2], demand=2), "shrink")
    assert reclaimed(result) == ["i1"]
    assert [p.job_id for p in result.preemptions] == [2]


def test_an_unknown_setting_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"policy.reclaim_protection must be one of strict, shrink \(got 'loose'\)"):
        PolicyParams(reclaim_protection="loose")
