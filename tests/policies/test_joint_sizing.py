"""The aryl policy's joint sizing (``policies.aryl.sizing.joint_sizing``): hand-computed cases of its rules --
completion rates, the response ratio, shrink-to-admit, the protection window, gangs and quota tiers.

The arithmetic in the comments: jobs declare no throughput points, so their speed-up is Amdahl's with alpha
0.05 (``PolicyParams.amdahl_alpha``): s(1) = 1, s(2) = 1 / (0.05 + 0.95 / 2) = 1.9048. A running job that
reports no progress is assumed to have run at its size since its last resize; what it has left is
``max(total - done, done - 0.8 total)`` in 1-worker seconds (``core.throughput.work_left``: at least 10% of the
estimate, growing again past it); ``restart_cost_s`` is 60 s.
"""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Reason
from scheduler_service.core.snapshot import QueueView
from scheduler_service.core.throughput import JobEstimate, ThroughputModel, work_left
from scheduler_service.policies.aryl import completion_rates, response_ratio
from tests.fixtures.policies import plan
from tests.harness import NOW, pending_job, running_job, snapshot_of, training_server

S2 = 1 / (0.05 + 0.95 / 2)


def elastic_on_four_gpus(runtime: float, resized: float = NOW - 3000):
    """Job 1: 1..2 workers of 2 GPUs, running at 2 on server t's 4 GPUs since ``resized``."""
    return running_job(1, [("t", (0, 1)), ("t", (2, 3))], low=1, high=2, resized=resized, runtime=runtime)


def test_completion_rates_charge_a_restart_to_every_size_but_the_current_one() -> None:
    est = JobEstimate(ThroughputModel((), 0.05), 1000.0)
    rates = completion_rates(est, 1, 1, 2, 60.0)
    assert rates == pytest.approx([1 / (1000 + 60), 1 / (1000 / S2)])
    assert completion_rates(est, 1, 1, 0, 60.0) == pytest.approx([1 / 1060, 1 / (1000 / S2 + 60)])
    assert completion_rates(est, 1, 1, -1, 60.0) == pytest.approx([1 / 1000, 1 / (1000 / S2)])


def test_the_response_ratio_is_wait_plus_run_over_run() -> None:
    job = pending_job(2, runtime=3600, submitted=NOW - 7320)
    est = JobEstimate(ThroughputModel((), 0.05), 3600.0)
    assert response_ratio(job, est, NOW, 60.0) == pytest.approx(1 + 7320 / 3660)


def test_a_job_almost_done_keeps_its_extra_worker_over_a_long_queued_job() -> None:
    # Job 1: 6,350 s estimated at 1 worker, 3000 s run at 2 (5,714.3 s done at 1): 635.7 s left, about the
    # least it can have (10% of the estimate). Its second worker is worth 1.9048/635.7 - 1/(635.7 + 60) =
    # 0.001559 a second; job 2's start 1/(3600 + 60) x its response ratio (1 + 10/3660) = 0.000274. Job 2
    # waits, saying why.
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [elastic_on_four_gpus(6350), pending_job(2, 2)]))
    assert result.starts == () and result.scales == ()
    [waiting] = result.pending
    assert waiting.job_id == 2 and waiting.reason == Reason.WAITING_FOR_GANG
    assert "joint sizing" in waiting.message and "cut the estimated average completion time more" in waiting.message


def test_shrink_to_admit_when_the_queued_job_completes_more() -> None:
    # Job 1 estimated at 36,000 s: 36,000 - 3000 x 1.9048 = 30,286 s left; its second worker is worth
    # 1/15,900 - 1/30,346 = 0.00003 a second, job 2's start 0.00027: job 1 gives its extra worker up for job 2.
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [elastic_on_four_gpus(36000), pending_job(2, 2)]))
    [start] = result.starts
    assert start.job_id == 2 and start.workers[0].gpu_indices == (2, 3)
    [scale] = result.scales
    assert (scale.job_id, len(scale.workers), scale.reason) == (1, 1, Reason.SCALED_IN_FOR_BASE_DEMAND)
    assert scale.message == "scaled in to 1 worker(s) so job 2 can start"


@pytest.mark.parametrize(("waited", "admitted"), [(15000, False), (20000, True)])
def test_a_queued_job_rises_as_it_waits(waited: float, admitted: bool) -> None:
    # As the first case, but job 2 has waited: its start is worth 0.000273 x (1 + waited / 3660), above the
    # extra worker's 0.001559 once the ratio passes 5.71: at 15,000 s it is 5.10 (waits), at 20,000 s 6.46.
    job = pending_job(2, 2, submitted=NOW - waited)
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [elastic_on_four_gpus(6350), job]))
    assert [s.job_id for s in result.starts] == ([2] if admitted else [])
    assert [s.job_id for s in result.scales] == ([1] if admitted else [])


def test_a_job_past_its_estimate_is_not_taken_to_be_nearly_done() -> None:
    # Job 1 estimated at 3,600 s has run 3000 s at 2 workers (5,714.3 s done at 1): it outlived its estimate,
    # so it has 5,714.3 - 2,880 = 2,834.3 s left (not the 10% floor's 360 s). Its second worker is worth
    # 1.9048/2,834.3 - 1/(2,834.3 + 60) = 0.000327 a second; job 2's start, having waited 1,000 s,
    # 0.000273 x (1 + 1000/3660) = 0.000348: job 1 gives its extra worker up.
    result = plan("aryl-noloan", snapshot_of([training_server("t")],
                                             [elastic_on_four_gpus(3600), pending_job(2, 2, submitted=NOW - 1000)]))
    assert [s.job_id for s in result.starts] == [2]
    assert [(s.job_id, len(s.workers)) for s in result.scales] == [(1, 1)]


def test_work_left_never_drops_below_a_tenth_of_the_estimate_and_grows_past_it() -> None:
    assert work_left(1000.0, 0.0) == 1000.0
    assert work_left(1000.0, 900.0) == pytest.approx(100.0)   # the least: 10%
    assert work_left(1000.0, 1000.0) == pytest.approx(200.0)  # at the estimate: 20%
    assert work_left(1000.0, 2000.0) == pytest.approx(1200.0)
    assert work_left(1000.0, 950.0) == pytest.approx(150.0)   # continuous through the turn


def test_a_job_in_its_protection_window_keeps_its_extra_worker() -> None:
    # Job 1 is the long job of the shrink-to-admit case, but resized 100 s ago (window: 300 s): outside the
    # sizing; job 2 waits for the window, which its reason names.
    job = elastic_on_four_gpus(36000, resized=NOW - 100)
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [job, pending_job(2, 2)]))
    assert result.starts == () and result.scales == ()
    [waiting] = result.pending
    assert waiting.reason == Reason.WAITING_FOR_PROTECTED_JOBS


def test_a_gang_is_admitted_whole_or_not_at_all() -> None:
    # Two free GPUs. Job 2 needs 2 workers x 2 GPUs: beyond what the sizing shares out, it waits for the gang
    # (step 1's reason); job 3 (one 2-GPU worker, longer) takes the two GPUs.
    servers = [training_server("t")]
    busy = running_job(1, [("t", (0, 1))], low=1, runtime=36000, resized=NOW - 3000)
    result = plan("aryl-noloan", snapshot_of(servers, [busy, pending_job(2, 2, workers=2, runtime=60),
                                                       pending_job(3, 2, runtime=7200)]))
    assert [s.job_id for s in result.starts] == [3]
    assert [(p.job_id, p.reason) for p in result.pending] == [(2, Reason.WAITING_FOR_GANG)]


def test_an_elastic_queued_job_starts_at_the_size_the_sizing_gave_it() -> None:
    # An idle 4-GPU server and one queued job of 1..4 one-GPU workers: every worker adds to its rate, so it
    # starts at 4 at once (1/(3600/s(4) + 60) > 1/(3600/s(3) + 60) > ...).
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [pending_job(1, 1, workers=1, max_workers=4)]))
    [start] = result.starts
    assert len(start.workers) == 4


def test_a_queue_within_its_quota_goes_before_a_shorter_job_that_borrows() -> None:
    # Two free GPUs; vision (quota 2) already holds 2, so its queued job would borrow; nlp's is within its quota.
    # The borrowing job is shorter (60 s against 7200 s) but the quota tier comes first.
    servers = [training_server("t")]
    running = dataclasses.replace(running_job(1, [("t", (0, 1))], low=1, runtime=36000, resized=NOW - 3000),
                                  queue="vision")
    short = dataclasses.replace(pending_job(2, 2, runtime=60), queue="vision")
    long = dataclasses.replace(pending_job(3, 2, runtime=7200), queue="nlp")
    snap = dataclasses.replace(snapshot_of(servers, [running, short, long]),
                               queues=(QueueView("vision", 2, cohort="lab"), QueueView("nlp", 2, cohort="lab")))
    result = plan("aryl-noloan", snap)
    assert [s.job_id for s in result.starts] == [3]


def test_the_no_shrink_ablation_leaves_running_jobs_their_extras() -> None:
    # The shrink-to-admit case, under aryl-noshrink: job 2 finds no free GPUs and waits; job 1 keeps 2 workers.
    jobs = [elastic_on_four_gpus(36000), pending_job(2, 2)]
    result = plan("aryl-noshrink", snapshot_of([training_server("t")], jobs))
    assert result.starts == () and result.scales == ()
    assert [p.job_id for p in result.pending] == [2]


def test_the_two_step_ablation_starts_every_gang_it_can_first() -> None:
    # aryl-nojoint (the earlier policy): queued gangs first, over other jobs' extras, whatever they are worth.
    result = plan("aryl-nojoint", snapshot_of([training_server("t")], [elastic_on_four_gpus(6350), pending_job(2, 2)]))
    assert [s.job_id for s in result.starts] == [2]
    assert PolicyParams().restart_cost_s == 60.0  # the arithmetic above
