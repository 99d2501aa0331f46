"""A reclaim that leaves a job below ``min_workers`` restarts it elsewhere (``policies.aryl.base.relocate_displaced``):
on free GPUs, else over other jobs' unprotected elastic extras; only a job that fits nowhere is preempted. The
naive reclaim (``aryl-naivereclaim``, the baseline) preempts. Hand-built snapshots, each plan worked out in the
comments and checked by the plan invariants."""

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


def plan(policy: str, snapshot: ClusterSnapshot) -> Plan:
    # No queued job, no elastic growth to speak of: min_resize_interval_s 300 keeps job 3 (resized long ago)
    # unprotected unless a test says otherwise.
    result = create_policy(policy, PolicyParams(loan_buffer_servers=0)).schedule(snapshot)
    assert check_plan(snapshot, result) == []
    return result


LOANED = inference_server("i1", ServerState.LOANED, gpus=4, since=NOW - 7200)
# Job 2: rigid, one 4-GPU worker on the loaned server, running for an hour (its checkpoint 30 min ago would be
# lost by a preemption). Job 3: elastic 1..2 workers of 4 GPUs on training server t (8 GPUs): one base, one extra.
RIGID = running_job(2, [("i1", (0, 1, 2, 3))], low=1, resized=NOW - 3600)


def elastic(resized: float) -> JobView:
    return running_job(3, [("t", (0, 1, 2, 3)), ("t", (4, 5, 6, 7))], low=1, high=2, resized=resized)


def test_the_job_moves_over_an_elastic_extra_instead_of_being_preempted():
    # Inference needs its one server back (demand 1, none serving): i1 is reclaimed. Job 2 would fall to 0
    # workers; t has no free GPU, but job 3's extra (GPUs 4-7) is unprotected: job 3 scales in to 1 worker and
    # job 2 restarts on t's GPUs 4-7.
    snap = snapshot_of([training_server("t", gpus=8), LOANED], [RIGID, elastic(NOW - 3600)], demand=1)
    result = plan("aryl", snap)
    assert [(a.server_id, a.kind) for a in result.server_actions] == [("i1", LoanStep.RECLAIM)]
    assert result.preemptions == ()
    by_job = {s.job_id: s for s in result.scales}
    moved, shrunk = by_job[2], by_job[3]
    assert moved.reason == Reason.MOVED_FOR_RECLAIM
    assert [(w.server_id, w.gpu_indices) for w in moved.workers] == [("t", (4, 5, 6, 7))]
    assert moved.message.startswith("moved: its server(s) i1 went back to inference and left it below "
                                    "min_workers=1; restarted at 1 worker(s) on t instead of being requeued")
    assert (shrunk.reason, [w.gpu_indices for w in shrunk.workers]) == (Reason.SCALED_IN_FOR_BASE_DEMAND,
                                                                        [(0, 1, 2, 3)])


def test_a_protected_extra_is_not_taken_and_the_job_is_preempted():
    # Job 3 was resized 100 s ago: in its protection window (300 s), its extra stays; job 2 fits nowhere else.
    snap = snapshot_of([training_server("t", gpus=8), LOANED], [RIGID, elastic(NOW - 100)], demand=1)
    result = plan("aryl", snap)
    assert [(p.job_id, p.reason) for p in result.preemptions] == [(2, Reason.PREEMPTED_FOR_RECLAIM)]
    assert result.scales == ()


def test_the_naive_reclaim_preempts_even_with_room_elsewhere():
    # A free training server t2 could hold job 2; the naive baseline preempts it all the same, the full policy
    # moves it there (free GPUs first: job 3 keeps its extra).
    servers = [training_server("t", gpus=8), training_server("t2", gpus=4), LOANED]
    snap = snapshot_of(servers, [RIGID, elastic(NOW - 3600)], demand=1)
    assert [p.job_id for p in plan("aryl-naivereclaim", snap).preemptions] == [2]
    result = plan("aryl", snap)
    assert result.preemptions == ()
    [moved] = [s for s in result.scales if s.job_id == 2]
    assert {w.server_id for w in moved.workers} == {"t2"}
    assert not [s for s in result.scales if s.job_id == 3]


# Job 4: rigid, one whole-server worker (8 GPUs) on the loaned server i8, running for an hour. Job 5: rigid, one
# 2-GPU worker on t1; job 6: rigid, one 4-GPU worker on t2. Free: t1 6 GPUs, t2 4: 10 in all, 8 on no server.
LOANED_8 = inference_server("i8", ServerState.LOANED, gpus=8, since=NOW - 7200)
WHOLE = running_job(4, [("i8", tuple(range(8)))], low=1, resized=NOW - 3600)
FRAGMENTED = [training_server("t1", gpus=8), training_server("t2", gpus=8), LOANED_8]


def small(job_id: int, server: str, gpus: tuple[int, ...], resized: float = NOW - 3600) -> JobView:
    return running_job(job_id, [(server, gpus)], low=1, resized=resized)


def test_a_small_job_moves_so_that_a_whole_server_worker_fits_instead_of_being_preempted():
    # i8 goes back; job 4 needs a whole server. Clearing t1 moves job 5 (2 GPUs, within job 4's 8) to t2's free
    # GPUs 4-5; clearing t2 would move job 6 (4 GPUs): t1 moves fewer. Job 4 restarts on t1's GPUs 0-7.
    snap = snapshot_of(FRAGMENTED, [WHOLE, small(5, "t1", (0, 1)), small(6, "t2", (0, 1, 2, 3))], demand=1)
    result = plan("aryl", snap)
    assert [(a.server_id, a.kind) for a in result.server_actions] == [("i8", LoanStep.RECLAIM)]
    assert result.preemptions == ()
    by_job = {s.job_id: s for s in result.scales}
    assert sorted(by_job) == [4, 5]
    assert (by_job[4].reason, [(w.server_id, w.gpu_indices) for w in by_job[4].workers]) == (
        Reason.MOVED_FOR_RECLAIM, [("t1", tuple(range(8)))])
    assert (by_job[5].reason, [(w.server_id, w.gpu_indices) for w in by_job[5].workers]) == (
        Reason.MOVED_TO_MAKE_ROOM, [("t2", (4, 5))])
    assert by_job[5].message == ("moved off t1 at its size (1 worker(s)) so that job 4, whose loaned server went "
                                 "back to inference, restarts there instead of being requeued")


def test_a_protected_job_is_not_moved_and_the_whole_server_job_is_preempted():
    # Both small jobs started 100 s ago: in their protection window (min_resize_interval_s 300), they stay.
    snap = snapshot_of(FRAGMENTED, [WHOLE, small(5, "t1", (0, 1), NOW - 100), small(6, "t2", (0, 1, 2, 3), NOW - 100)],
                       demand=1)
    result = plan("aryl", snap)
    assert [(p.job_id, p.reason) for p in result.preemptions] == [(4, Reason.PREEMPTED_FOR_RECLAIM)]
    assert result.scales == ()


def test_moves_that_would_restart_more_gpus_than_the_displaced_job_holds_are_not_made():
    # The displaced job is one 4-GPU worker; t1 and t2 each hold a 6-GPU job (2 free on each, 4 in all). Clearing
    # either server moves 6 GPUs, more than job 4's 4, so it is preempted.
    displaced = running_job(4, [("i8", (0, 1, 2, 3))], low=1, resized=NOW - 3600)
    jobs = [displaced, small(5, "t1", tuple(range(6))), small(6, "t2", tuple(range(6)))]
    result = plan("aryl", snapshot_of(FRAGMENTED, jobs, demand=1))
    assert [(p.job_id, p.reason) for p in result.preemptions] == [(4, Reason.PREEMPTED_FOR_RECLAIM)]
    assert result.scales == ()


def test_the_server_that_moves_the_fewest_gpus_is_cleared():
    # t1 holds a 1-GPU and a 4-GPU job (3 free: clearing it moves 5 GPUs), t2 a 6-GPU job (2 free: 6), t3 a 1-GPU
    # job (7 free: 1). t3 is cleared: its job 8 moves to t2's 2 free GPUs (best fit), and job 4 restarts on t3.
    servers = [*FRAGMENTED, training_server("t3", gpus=8)]
    jobs = [WHOLE, small(5, "t1", (0,)), small(7, "t1", (1, 2, 3, 4)), small(6, "t2", tuple(range(6))),
            small(8, "t3", (0,))]
    result = plan("aryl", snapshot_of(servers, jobs, demand=1))
    assert result.preemptions == ()
    by_job = {s.job_id: s for s in result.scales}
    assert sorted(by_job) == [4, 8]
    assert [(w.server_id, w.gpu_indices) for w in by_job[4].workers] == [("t3", tuple(range(8)))]
    assert [(w.server_id, w.gpu_indices) for w in by_job[8].workers] == [("t2", (6,))]
