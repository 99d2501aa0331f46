"""The aryl policy's preempt-to-admit (``policies.aryl.sizing``: ``_suspension_candidates``, ``_kept_options``,
``settle_suspensions``): hand-computed cases of its rules -- a long job just past a checkpoint gives its GPUs to
short queued jobs; one that would lose more than a restart's worth of work, one whose length nothing declared,
one in its protection window, one of a tier other than the queue's and one whose GPUs no queued gang can use
keep running; ``aryl-nopreempt`` never preempts.

The arithmetic in the comments: jobs declare no throughput points (Amdahl, alpha 0.05: a 1-worker job runs at
speed 1); ``restart_cost_s`` is 60 s; a queued job's start is worth 1 / (its run + 60) x its response ratio.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scheduler_service.core.plan import Reason
from scheduler_service.core.snapshot import JobView
from tests.fixtures.policies import plan
from tests.harness import NOW, pending_job, running_job, snapshot_of, training_server


def long_job(checkpointed: float | None, resized: float = NOW - 3000, **fields: Any) -> JobView:
    """Job 1: one worker of 4 GPUs on server t (all its GPUs), estimated at 36,000 s, running since ``resized``:
    33,000 s left, a completion rate of 1 / 33,000 = 0.0000303 a second, last checkpointed at ``checkpointed``."""
    job = running_job(1, [("t", (0, 1, 2, 3))], low=1, resized=resized, runtime=36000)
    return dataclasses.replace(job, last_checkpoint_at=checkpointed, **fields)


def short_jobs(count: int = 4, **fields: Any) -> list[JobView]:
    """Jobs 2.. : 1 GPU, estimated at 600 s, queued 10 s: each start is worth 1 / 660 x (1 + 10 / 660) =
    0.00154 a second, 50 times job 1's rate."""
    return [dataclasses.replace(pending_job(2 + i, runtime=600), **fields) for i in range(count)]


def test_a_long_job_just_past_its_checkpoint_gives_its_gpus_to_short_queued_jobs() -> None:
    # Keeping job 1 is worth its rate times its response ratio (submitted at 0: 1 + 100,000 / 33,060 = 4.025)
    # plus what a preemption costs it (30 s of work since the checkpoint and a 60 s restart, d = 90 s,
    # d r^2 / (1 + d r) = 8.3e-8): 0.000122 a second, against the four starts' 0.00615: it is preempted, and
    # the four start on its GPUs.
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [long_job(NOW - 30), *short_jobs()]))
    [preempted] = result.preemptions
    assert (preempted.job_id, preempted.reason) == (1, Reason.PREEMPTED_BY_POLICY)
    assert preempted.message.startswith("preempted to admit jobs 2, 3, 4 and 1 more: the joint sizing found")
    assert "an estimated 33000s left at 1 worker(s)" in preempted.message
    assert sorted(s.job_id for s in result.starts) == [2, 3, 4, 5]
    assert {g for s in result.starts for w in s.workers for g in w.gpu_indices} == {0, 1, 2, 3}


def test_a_queued_job_as_long_does_not_take_turns_with_it() -> None:
    # Job 2 (4 GPUs, estimated 36,000 s, submitted at 0 like job 1, so it has waited 100,000 s): its start is
    # worth 1 / 36,060 x (1 + 100,000 / 36,060) = 0.000105 a second; keeping job 1, 0.000122 with its own age
    # counted (without it, 0.0000304: job 1 would go, then, queued and older, preempt job 2 back).
    snap = snapshot_of([training_server("t")], [long_job(NOW - 30), pending_job(2, 4, runtime=36000, submitted=0.0)])
    result = plan("aryl-noloan", snap)
    assert result.preemptions == () and result.starts == ()


def test_a_job_that_would_lose_more_than_a_restart_keeps_running() -> None:
    # Checkpointed 120 s ago: a preemption would throw away 120 s of its work, more than restart_cost_s (60 s),
    # GPU-time the cluster would pay for again, so it is not a candidate; the short jobs wait.
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [long_job(NOW - 120), *short_jobs()]))
    assert result.preemptions == () and result.starts == ()
    assert {p.job_id for p in result.pending} == {2, 3, 4, 5}


def test_a_job_that_never_checkpointed_is_never_preempted_to_admit() -> None:
    # No checkpoint: everything since its start (3,000 s) would be lost.
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [long_job(None), *short_jobs()]))
    assert result.preemptions == () and result.starts == ()


def test_a_job_whose_length_nothing_declared_is_never_preempted_to_admit() -> None:
    # No run-time estimate: its time left would be policy.default_runtime_s, a guess, for it and for any other.
    result = plan("aryl-noloan", snapshot_of([training_server("t")],
                                             [long_job(NOW - 30, estimated_runtime_s=None), *short_jobs()]))
    assert result.preemptions == () and result.starts == ()


def test_a_job_in_its_protection_window_keeps_running() -> None:
    # Started 200 s ago, checkpointed 30 s ago: inside min_resize_interval_s (300 s).
    snap = snapshot_of([training_server("t")], [long_job(NOW - 30, resized=NOW - 200), *short_jobs()])
    result = plan("aryl-noloan", snap)
    assert result.preemptions == () and result.starts == ()


def test_the_ablation_never_preempts_to_admit() -> None:
    result = plan("aryl-nopreempt", snapshot_of([training_server("t")], [long_job(NOW - 30), *short_jobs()]))
    assert result.preemptions == () and result.starts == ()


def test_a_job_a_tier_above_the_queue_is_never_preempted_for_it() -> None:
    # Job 1 has priority 1, the queued jobs 0: a tier below it, whatever their completion rates.
    snap = snapshot_of([training_server("t")], [long_job(NOW - 30, priority=1), *short_jobs()])
    result = plan("aryl-noloan", snap)
    assert result.preemptions == () and result.starts == ()


def test_it_never_crosses_tiers() -> None:
    # Queued jobs of priority 1 against job 1 of priority 0: preempt-to-admit takes only jobs of the queue's own
    # tier (a priority class preempts lower classes of its queue by step 1's own rule, not by this one).
    snap = snapshot_of([training_server("t")], [long_job(NOW - 30), *short_jobs(priority=1)])
    assert plan("aryl-noloan", snap).preemptions == ()
    # A queue of two tiers (one job of priority 1 beside four of 0, job 1 of 0): nothing is preempted either.
    snap = snapshot_of([training_server("t")], [long_job(NOW - 30), *short_jobs(),
                                                 dataclasses.replace(pending_job(9, runtime=600), priority=1)])
    assert plan("aryl-noloan", snap).preemptions == ()


def test_a_job_whose_gpus_no_queued_gang_can_use_is_put_back() -> None:
    # Server t: job 1 on GPUs 0-1 (2 GPUs, 33,000 s left) and job 3 on 2-3 (in its protection window); server
    # u: 2 GPUs free. Job 2 needs 4 GPUs on one server. The sizing counts 2 free + job 1's 2 = 4 GPUs and
    # takes job 1 out for it, but no server then holds 4 free GPUs: job 2 waits and job 1 runs on untouched.
    one = dataclasses.replace(running_job(1, [("t", (0, 1))], low=1, resized=NOW - 3000, runtime=36000),
                              last_checkpoint_at=NOW - 30)
    three = running_job(3, [("t", (2, 3))], low=1, resized=NOW - 100, runtime=600)
    snap = snapshot_of([training_server("t"), training_server("u", 2)], [one, three, pending_job(2, 4, runtime=600)])
    result = plan("aryl-noloan", snap)
    assert result.preemptions == () and result.starts == ()
    assert [p.job_id for p in result.pending] == [2]
