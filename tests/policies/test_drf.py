"""The ``drf`` policy: progressive filling of GPUs between users, then jobs (``policies/drf.py``)."""

from __future__ import annotations

from dataclasses import replace

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.plan import Reason
from scheduler_service.policies import create_policy
from scheduler_service.policies.drf import DrfJob, drf_allocate
from tests.harness import pending_job, running_job, snapshot_of, training_server


def test_drf_fills_progressively_by_hand() -> None:
    # 16 GPUs. a: job 1 (1-GPU workers, 1..8) and job 2 (a 2 x 2-GPU gang); b: job 3 (1-GPU workers, 1..16);
    # c: job 4 (one 4-GPU worker). Rounds (user with fewest GPUs first; ties: earliest submission):
    #  a j1 +1 (a=1) | b j3 +1 (b=1) | c j4 +4 (c=4, done) | a j2 gang +4 (a=5) | b +1 +1 +1 (b=4)
    #  | b (4, ahead of c's 4: earlier) +1 (b=5) | c: nothing left to grow | a j1 +1 (a=6) | b +1 (b=6) | 0 free.
    jobs = [DrfJob(1, "a", 0.0, 1, 1, 8), DrfJob(2, "a", 1.0, 2, 2, 2), DrfJob(3, "b", 2.0, 1, 1, 16),
            DrfJob(4, "c", 3.0, 4, 1, 1)]
    assert drf_allocate(jobs, 16) == {1: 2, 2: 2, 3: 6, 4: 1}


def test_drf_skips_a_gang_that_does_not_fit_and_keeps_filling_others() -> None:
    # 6 GPUs: x's 8-GPU gang never fits; y's elastic job takes them all, one worker at a time.
    jobs = [DrfJob(1, "x", 0.0, 4, 2, 2), DrfJob(2, "y", 1.0, 1, 1, 10)]
    assert drf_allocate(jobs, 6) == {1: 0, 2: 6}
    # Equal users split evenly; the tie between them goes to the earlier submission.
    assert drf_allocate([DrfJob(1, "p", 5.0, 1, 1, 9), DrfJob(2, "q", 4.0, 1, 1, 9)], 5) == {1: 2, 2: 3}


def test_registered_drf_shrinks_a_hog_for_a_newcomer_with_a_valid_plan() -> None:
    # Job 1 holds all 8 GPUs (elastic 1..8); job 2 arrives wanting 1..4: each gets 4 (jobs are their own users).
    servers = [training_server("a"), training_server("b")]
    hog = running_job(1, [("a", (0,)), ("a", (1,)), ("a", (2,)), ("a", (3,)), ("b", (0,)), ("b", (1,)),
                          ("b", (2,)), ("b", (3,))], low=1, high=8, resized=0.0)
    snap = snapshot_of(servers, [hog, pending_job(2, gpus=1, workers=1, max_workers=4)])
    plan = create_policy("drf").schedule(snap)
    assert check_plan(snap, plan) == []
    assert [(s.job_id, len(s.workers), s.reason) for s in plan.scales] == [(1, 4, Reason.SCALED_IN)]
    assert [(s.job_id, len(s.workers)) for s in plan.starts] == [(2, 4)]


def test_registered_drf_shares_between_the_snapshot_s_users_not_their_jobs() -> None:
    # 8 GPUs, three elastic 1-GPU jobs waiting: alice has two, bob one. Between users, bob gets as many
    # GPUs as alice's two jobs together (4 and 2 + 2); with no users each job would get its own share.
    servers = [training_server("a"), training_server("b")]
    jobs = [replace(pending_job(1, gpus=1, workers=1, max_workers=8), user="alice"),
            replace(pending_job(2, gpus=1, workers=1, max_workers=8), user="alice"),
            replace(pending_job(3, gpus=1, workers=1, max_workers=8), user="bob")]
    snap = snapshot_of(servers, jobs)
    plan = create_policy("drf").schedule(snap)
    assert check_plan(snap, plan) == []
    assert sorted((s.job_id, len(s.workers)) for s in plan.starts) == [(1, 2), (2, 2), (3, 4)]
    anonymous = snapshot_of(servers, [replace(job, user="") for job in jobs])
    assert sorted(len(s.workers) for s in create_policy("drf").schedule(anonymous).starts) == [2, 3, 3]
