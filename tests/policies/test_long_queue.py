"""A long queue of a few gang shapes: the policy explains each waiting job without walking every server
for it (``core.placement.FreeCapacity.explain_unplaceable`` and ``core.fit.never_fits`` are kept per
shape), a run of jobs of one kind waits for its first job's reason without the steps, and the
explanations still follow the free GPUs and the quotas as the plan takes them."""

from __future__ import annotations

import dataclasses

from scheduler_service.core import JobView
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import Reason
from scheduler_service.core.snapshot import QueueView
from scheduler_service.policies import create_policy
from tests.harness import NOW, pending_job, running_job, snapshot_of, training_server


def test_explanations_follow_the_free_gpus_as_they_are_taken_and_given_back() -> None:
    servers = [training_server("t1"), training_server("t2"), training_server("t3", 8)]
    capacity = FreeCapacity.of(snapshot_of(servers, []))
    gang = pending_job(1, 4, 5)  # 20 GPUs: more than the 16 there are
    asked = capacity.explain_unplaceable(gang, 5)
    assert asked == (Reason.WAITING_FOR_GANG,
                     "needs 5 worker(s) x 4 GPU(s) as a gang; free now: 16 GPU(s) on 3 server(s), largest block 8")
    twin = capacity.copy()
    capacity.take("t3", range(8))
    after_take = capacity.explain_unplaceable(gang, 5)
    assert after_take[1].endswith("free now: 8 GPU(s) on 2 server(s), largest block 4")
    assert twin.explain_unplaceable(gang, 5) == asked  # a copy's GPUs did not change
    capacity.release("t3", [0, 1])
    assert capacity.explain_unplaceable(gang, 5)[1].endswith("free now: 10 GPU(s) on 3 server(s), largest block 4")
    # Each answer is a fresh capacity's over the same free GPUs.
    fresh = FreeCapacity({"t1": [0, 1, 2, 3], "t2": [0, 1, 2, 3], "t3": [0, 1]}, capacity.servers)
    assert fresh.explain_unplaceable(gang, 5) == capacity.explain_unplaceable(gang, 5)
    typed = dataclasses.replace(gang, gpu_types=("H100",))
    assert capacity.explain_unplaceable(typed, 5)[0] == Reason.WAITING_FOR_GPU_TYPE  # the types are the shape's too


def test_jobs_of_one_shape_before_and_after_a_placement_are_told_the_free_gpus_of_their_turn() -> None:
    # t1 has 1 free GPU (job 9 holds 3), t2 has 4. In queue order: job 1 (2 x 4) waits; job 2 (1 x 4) is
    # backfilled onto t2; job 3, job 1's shape, then sees 1 free GPU, not job 1's 5. Jobs 4 and 5 (1 x 16)
    # can never fit 4-GPU servers: both say so.
    servers = [training_server("t1"), training_server("t2")]
    busy = running_job(9, [("t1", (0, 1, 2))], low=1)
    queue = [pending_job(1, 4, 2, priority=3), pending_job(2, 4, 1, priority=2), pending_job(3, 4, 2, priority=1),
             pending_job(4, 16, 1), pending_job(5, 16, 1)]
    plan = create_policy("aryl").schedule(snapshot_of(servers, [busy, *queue]))
    assert [(s.job_id, s.reason) for s in plan.starts] == [(2, Reason.BACKFILLED)]
    why = {p.job_id: (p.reason, p.message) for p in plan.pending}
    assert why[1] == (Reason.WAITING_FOR_GANG,
                      "needs 2 worker(s) x 4 GPU(s) as a gang; free now: 5 GPU(s) on 2 server(s), largest block 4")
    assert why[3] == (Reason.WAITING_FOR_GANG,
                      "needs 2 worker(s) x 4 GPU(s) as a gang; free now: 1 GPU(s) on 1 server(s), largest block 1")
    assert why[4][0] == why[5][0] == Reason.CANNOT_FIT
    assert why[4][1] == why[5][1] and "the largest server has 4" in why[4][1]


def _ranked(job: JobView) -> JobView:
    """``job`` ranked by its id (a higher priority for a lower id): the queue order is the id order."""
    return dataclasses.replace(job, priority=10_000 - job.job_id)


def _why(plan) -> dict[int, tuple[Reason, str]]:
    return {p.job_id: (p.reason, p.message) for p in plan.pending}


def test_a_run_of_one_kind_waits_for_the_reason_each_job_would_get_alone() -> None:
    # t1 has 1 free GPU. In queue order: jobs 1-200 want 2 GPUs, job 201 the same on a type no server
    # has, job 202 one GPU (it takes the free one), jobs 203-300 2 GPUs again. Each job's reason is the
    # one it gets alone in the queue on the GPUs left at its turn: the runs of one kind are told the
    # free GPUs of their turn, and the job of another kind in between is decided on its own.
    servers = [training_server("t1")]
    busy = running_job(900, [("t1", (0, 1, 2))], low=1)
    before = [_ranked(pending_job(j, 2, 1)) for j in range(1, 201)]
    typed = _ranked(dataclasses.replace(pending_job(201, 2, 1), gpu_types=("A100",)))
    small = _ranked(pending_job(202, 1, 1))
    after = [_ranked(pending_job(j, 2, 1)) for j in range(203, 301)]
    snapshot = snapshot_of(servers, [busy, *before, typed, small, *after])
    plan = create_policy("aryl").schedule(snapshot)
    check_plan(snapshot, plan)
    assert [(s.job_id, s.reason) for s in plan.starts] == [(202, Reason.BACKFILLED)]

    def alone(job: JobView, *running: JobView) -> tuple[Reason, str]:
        return _why(create_policy("aryl").schedule(snapshot_of(servers, [busy, *running, job])))[job.job_id]

    why = _why(plan)
    first, last = alone(before[0]), alone(after[0], running_job(202, [("t1", (3,))], low=1))
    assert first[0] == last[0] == Reason.WAITING_FOR_GANG and first[1] != last[1]
    assert all(why[j.job_id] == first for j in before)
    assert why[201] == alone(typed) and why[201][0] == Reason.WAITING_FOR_GPU_TYPE
    assert all(why[j.job_id] == last for j in after)


def test_a_run_of_one_shape_in_two_queues_is_told_each_queues_quota() -> None:
    # Two 4-GPU servers; queue `a` may hold none (quota 0, borrow limit 0), the default queue the 8 GPUs.
    # Jobs 1 and 2 (default) take both servers; jobs 3-5 (default) and 6-8 (`a`), all of job 1's shape,
    # wait: the default queue's at its quota, `a`'s at its borrow limit -- each queue's own reason.
    servers = [training_server("t1"), training_server("t2")]
    queue = [_ranked(pending_job(j, 4, 1)) for j in range(1, 6)]
    queue += [_ranked(dataclasses.replace(pending_job(j, 4, 1), queue="a")) for j in range(6, 9)]
    snapshot = dataclasses.replace(snapshot_of(servers, queue), queues=(QueueView("a", 0, 0),))
    plan = create_policy("aryl").schedule(snapshot)
    check_plan(snapshot, plan)
    assert sorted(s.job_id for s in plan.starts) == [1, 2]
    why = _why(plan)
    assert {why[j] for j in (3, 4, 5)} == {(Reason.WAITING_FOR_QUOTA,
                                            "queue `default` is at its quota of 8 GPUs and cannot borrow: "
                                            "cohort has 0 idle")}
    assert len({why[j] for j in (6, 7, 8)}) == 1 and why[6][0] == Reason.QUOTA_BORROW_LIMIT
    assert "queue `a` may hold at most 0 GPUs" in why[6][1]


# -- a burst of high-class jobs on a cluster of low-class ones (priority preemption) -----------------


def _cls(job: JobView, cls: int) -> JobView:
    return dataclasses.replace(job, priority_class=cls)


def test_a_waiting_job_names_the_first_protected_jobs_out_of_protection_and_counts_the_rest() -> None:
    # Five low-class jobs hold the five servers, started 10-50 s ago: the default protection window
    # (policy.min_resize_interval_s) covers them all. The high-class job names the three that leave
    # protection first (the oldest starts) and counts two more.
    servers = [training_server(f"t{k}") for k in range(5)]
    low = [_cls(running_job(k + 1, [(f"t{k}", (0, 1, 2, 3))], low=1, resized=NOW - 10 * (k + 1)), 0)
           for k in range(5)]
    high = _cls(pending_job(10, 4, 1), 100)
    plan = create_policy("aryl").schedule(snapshot_of(servers, [*low, high]))
    check_plan(snapshot_of(servers, [*low, high]), plan)
    [waiting] = plan.pending
    assert waiting.reason == Reason.WAITING_FOR_PROTECTED_JOBS
    named = [f"job {j} is protected" for j in (5, 4, 3)]
    assert all(n in waiting.message for n in named)
    assert waiting.message.index(named[0]) < waiting.message.index(named[1]) < waiting.message.index(named[2])
    assert "job 2 is" not in waiting.message and "job 1 is" not in waiting.message
    assert waiting.message.endswith("priority preemption leaves it be; 2 more protected job(s) likewise")


def test_each_queued_job_sees_the_running_jobs_as_the_plan_has_left_them() -> None:
    # Low-class job 1 (started long ago) and job 2 (protected) hold t1 and t2. High-class jobs 10 and 11
    # want 4 GPUs each: job 10 preempts job 1 and takes t1; job 11 finds only the protected job 2 and
    # waits, naming it -- not job 1, already preempted, and no second preemption of it.
    servers = [training_server("t1"), training_server("t2")]
    old = _cls(running_job(1, [("t1", (0, 1, 2, 3))], low=1, resized=NOW - 100_000), 0)
    fresh = _cls(running_job(2, [("t2", (0, 1, 2, 3))], low=1, resized=NOW - 100), 0)
    queue = [_cls(pending_job(10, 4, 1, submitted=NOW - 20), 100), _cls(pending_job(11, 4, 1), 100)]
    snapshot = snapshot_of(servers, [old, fresh, *queue])
    plan = create_policy("aryl").schedule(snapshot)
    check_plan(snapshot, plan)
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [(1, Reason.PREEMPTED_FOR_PRIORITY)]
    assert [s.job_id for s in plan.starts] == [10]
    [waiting] = plan.pending
    assert (waiting.job_id, waiting.reason) == (11, Reason.WAITING_FOR_PROTECTED_JOBS)
    assert "job 2 is protected" in waiting.message and "job 1" not in waiting.message
