"""Queues with quotas and borrowing, and priority classes, in the policies (``core.quota``): quota
enforcement, borrowing idle quota of the cohort (and loaned servers), the borrow limit, giving borrowed
GPUs back (elastic extras shrink first, then the cheapest borrowing jobs are preempted), and preemption
limited to lower priority classes of one queue. Hand-built snapshots; each expected plan worked out
in the comments."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Reason
from scheduler_service.core.quota import QuotaLedger
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, QueueView
from scheduler_service.lifecycle import ServerState
from scheduler_service.policies import create_policy
from simulator.engine import simulate
from simulator.model import ClusterSpec
from tests.harness import NOW, inference_server, linear_job, pending_job, running_job, snapshot_of, training_server


def queued(jid: int, queue: str, gpus: int = 2, workers: int = 1, *, cls: int = 0, user: str = "u",
           submitted: float = NOW - 10) -> JobView:
    return dataclasses.replace(pending_job(jid, gpus, workers, submitted=submitted), queue=queue,
                               priority_class=cls, user=user)


def running(jid: int, queue: str, placement: list[tuple[str, tuple[int, ...]]], *, low: int | None = None,
            high: int | None = None, resized: float = NOW - 1000, cls: int = 0, runtime: float = 3600.0) -> JobView:
    # Resized 1000 s ago by default: outside its protection window (policy.min_resize_interval_s = 300 s;
    # tests/unit/test_protection.py shows the window honoured by queue reclaim and priority preemption).
    job = running_job(jid, placement, low=low or len(placement), high=high, resized=resized, runtime=runtime)
    return dataclasses.replace(job, queue=queue, priority_class=cls)


LAB = (QueueView("vision", 4, cohort="lab"), QueueView("nlp", 4, cohort="lab"))


def plan_of(snapshot: ClusterSnapshot, policy: str = "aryl"):
    plan = create_policy(policy).schedule(snapshot)
    check_plan(snapshot, plan)
    return plan


def with_queues(snapshot: ClusterSnapshot, queues: tuple[QueueView, ...]) -> ClusterSnapshot:
    return dataclasses.replace(snapshot, queues=queues)


def test_a_queue_borrows_idle_quota_of_its_cohort() -> None:
    # 8 GPUs; vision (quota 4) queues four 2-GPU jobs, nlp (quota 4, same cohort) is idle: two run within
    # vision's quota, two borrow nlp's idle 4.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [queued(i, "vision") for i in (1, 2, 3, 4)]
    for policy in ("aryl", "fifo", "sjf"):
        plan = plan_of(with_queues(snapshot_of(servers, jobs), LAB), policy)
        assert sorted(s.job_id for s in plan.starts) == [1, 2, 3, 4], policy


def test_quota_is_enforced_when_the_cohort_has_nothing_idle() -> None:
    # The same, but nlp is in another cohort: vision stops at its 4 GPUs, the other two wait, and say why.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [queued(i, "vision") for i in (1, 2, 3, 4)]
    queues = (QueueView("vision", 4, cohort="lab"), QueueView("nlp", 4, cohort="other"))
    for policy in ("aryl", "fifo"):
        plan = plan_of(with_queues(snapshot_of(servers, jobs), queues), policy)
        assert sorted(s.job_id for s in plan.starts) == [1, 2], policy
        why = {p.job_id: p for p in plan.pending}
        assert {why[3].reason, why[4].reason} == {Reason.WAITING_FOR_QUOTA}
        assert why[3].message == "queue `vision` is at its quota of 4 GPUs and cannot borrow: cohort `lab` has 0 idle"


def test_the_borrow_limit_caps_borrowing() -> None:
    # vision may borrow at most 2 GPUs beyond its quota of 4: three 2-GPU jobs run, the fourth waits.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [queued(i, "vision") for i in (1, 2, 3, 4)]
    queues = (QueueView("vision", 4, borrow_limit_gpus=2, cohort="lab"), QueueView("nlp", 4, cohort="lab"))
    plan = plan_of(with_queues(snapshot_of(servers, jobs), queues))
    assert sorted(s.job_id for s in plan.starts) == [1, 2, 3]
    [held] = plan.pending
    assert held.reason == Reason.QUOTA_BORROW_LIMIT
    assert "at most 6 GPUs (quota 4 + borrow limit 2); it holds 6 and this needs 2" in held.message


def test_loaned_inference_servers_are_borrowable_by_every_cohort() -> None:
    # vision alone in its cohort, at its quota of 4 on t1; a loaned 8-GPU inference server is borrowable.
    servers = [training_server("t1"), inference_server("i1", ServerState.LOANED, since=NOW - 3600)]
    jobs = [running(1, "vision", [("t1", (0, 1, 2, 3))]), queued(2, "vision", 4)]
    queues = (QueueView("vision", 4, cohort="lab"),)
    plan = plan_of(with_queues(snapshot_of(servers, jobs, demand=0), queues))
    assert [(s.job_id, s.workers[0].server_id) for s in plan.starts] == [(2, "i1")]


def test_jobs_within_quota_go_before_borrowing_ones() -> None:
    # 4 GPUs free; vision already borrows (holds 4 of its quota 2), nlp holds nothing. Vision's job was
    # queued first but would borrow more: nlp's job, within its quota, is placed first; vision's waits
    # (its cohort has 0 idle once nlp's job runs).
    servers = [training_server("t1"), training_server("t2")]
    jobs = [running(1, "vision", [("t1", (0, 1, 2, 3))]), queued(2, "vision", 4, submitted=NOW - 500),
            queued(3, "nlp", 4, submitted=NOW - 10)]
    queues = (QueueView("vision", 2, cohort="lab"), QueueView("nlp", 6, cohort="lab"))
    plan = plan_of(with_queues(snapshot_of(servers, jobs), queues))
    assert [s.job_id for s in plan.starts] == [3]
    assert [(p.job_id, p.reason) for p in plan.pending] == [(2, Reason.WAITING_FOR_QUOTA)]


def test_borrowed_gpus_come_back_by_shrinking_elastic_extras_first() -> None:
    # vision (quota 4) holds all 8 GPUs: elastic job 1 (1..2 workers x 2 GPUs) at 2 workers on t1, and two
    # 2-GPU jobs on t2. nlp (quota 4) queues a 2-GPU job: job 1's extra worker is scaled in for it, nothing
    # is preempted.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [running(1, "vision", [("t1", (0, 1)), ("t1", (2, 3))], low=1, high=2),
            running(2, "vision", [("t2", (0, 1))]), running(3, "vision", [("t2", (2, 3))]),
            queued(10, "nlp", 2)]
    plan = plan_of(with_queues(snapshot_of(servers, jobs), LAB))
    assert [(s.job_id, s.workers[0].server_id, s.workers[0].gpu_indices) for s in plan.starts] == [(10, "t1", (2, 3))]
    assert [(s.job_id, len(s.workers), s.reason) for s in plan.scales] == [(1, 1, Reason.SCALED_IN_FOR_BASE_DEMAND)]
    assert plan.preemptions == ()


def test_borrowed_gpus_come_back_by_preempting_the_cheapest_borrowers() -> None:
    # As above, but nlp's job is one 4-GPU worker: the extra alone frees no 4-GPU block, so borrowing jobs
    # are preempted, cheapest first by work lost per GPU: job 2 (resized 400 s ago), then job 3 (5000 s ago),
    # which frees t2. Vision is then back at its quota of 4: job 1 (10000 s) is not a victim any more.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [running(1, "vision", [("t1", (0, 1)), ("t1", (2, 3))], low=1, high=2, resized=NOW - 10000),
            running(2, "vision", [("t2", (0, 1))], resized=NOW - 400),
            running(3, "vision", [("t2", (2, 3))], resized=NOW - 5000),
            queued(10, "nlp", 4)]
    plan = plan_of(with_queues(snapshot_of(servers, jobs), LAB))
    assert [(s.job_id, s.workers[0].server_id) for s in plan.starts] == [(10, "t2")]
    assert sorted((p.job_id, p.reason) for p in plan.preemptions) == [
        (2, Reason.PREEMPTED_FOR_QUOTA), (3, Reason.PREEMPTED_FOR_QUOTA)]
    assert "queue `vision` borrowed GPUs beyond its quota of 4; job 10 of queue `nlp`" in plan.preemptions[0].message


def test_a_queue_within_its_quota_is_never_preempted_for_another() -> None:
    # vision holds exactly its quota: nlp's job waits although nlp is within its own quota.
    servers = [training_server("t1")]
    jobs = [running(1, "vision", [("t1", (0, 1, 2, 3))]), queued(10, "nlp", 4)]
    queues = (QueueView("vision", 4, cohort="lab"), QueueView("nlp", 4, cohort="lab"))
    plan = plan_of(with_queues(snapshot_of(servers, jobs), queues))
    assert plan.starts == () and plan.preemptions == ()
    assert plan.pending[0].reason == Reason.WAITING_FOR_GANG


def test_priority_classes_preempt_only_lower_classes_of_their_own_queue() -> None:
    servers = [training_server("t1")]
    low = running(1, "default", [("t1", (0, 1, 2, 3))], cls=0)
    # A higher class of the same queue preempts it (no queue configured: classes still order and preempt).
    plan = plan_of(snapshot_of(servers, [low, queued(2, "default", 4, cls=100)]))
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [(1, Reason.PREEMPTED_FOR_PRIORITY)]
    assert [s.job_id for s in plan.starts] == [2]
    assert "higher priority class (100 > 0) in queue `default`" in plan.preemptions[0].message
    # An equal class does not, nor does a higher class of another queue (vision is within its quota).
    for job, queues in ((queued(2, "default", 4, cls=0), ()),
                        (queued(2, "nlp", 4, cls=100), (QueueView("default", 4), QueueView("nlp", 4)))):
        plan = plan_of(with_queues(snapshot_of(servers, [low, job]), queues))
        assert plan.preemptions == () and plan.starts == ()
    # A lower class never preempts a higher one.
    high = running(1, "default", [("t1", (0, 1, 2, 3))], cls=100)
    plan = plan_of(snapshot_of(servers, [high, queued(2, "default", 4, cls=0)]))
    assert plan.preemptions == ()


def test_a_higher_class_preempts_a_lower_one_of_its_queue_at_its_quota() -> None:
    # vision holds its whole quota (4) with a class-0 job; nothing idle in the cohort, 4 GPUs free on t2 that
    # the quota does not let it use. Its class-100 job takes the class-0 job's GPUs: the queue stays at 4.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [running(1, "vision", [("t1", (0, 1, 2, 3))], cls=0), queued(2, "vision", 4, cls=100)]
    queues = (QueueView("vision", 4, cohort="lab"), QueueView("nlp", 4, cohort="other"))
    plan = plan_of(with_queues(snapshot_of(servers, jobs), queues))
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [(1, Reason.PREEMPTED_FOR_PRIORITY)]
    assert [(s.job_id, s.workers[0].server_id) for s in plan.starts] == [(2, "t1")]
    # The same with the low job on t2: the gang lands on t1 (best fit, then id), yet the low job is still
    # preempted -- not for its GPUs but for the quota they count against.
    low_on_t2 = running(1, "vision", [("t2", (0, 1, 2, 3))], cls=0)
    plan = plan_of(with_queues(snapshot_of(servers, [low_on_t2, jobs[1]]), queues))
    assert [p.job_id for p in plan.preemptions] == [1] and [s.workers[0].server_id for s in plan.starts] == ["t1"]
    # An equal class waits, with the quota's reason.
    plan = plan_of(with_queues(snapshot_of(servers, [jobs[0], queued(2, "vision", 4, cls=0)]), queues))
    assert plan.preemptions == () and plan.pending[0].reason == Reason.WAITING_FOR_QUOTA


def test_higher_classes_are_considered_first_within_a_queue() -> None:
    servers = [training_server("t1")]
    jobs = [queued(1, "default", 4, submitted=NOW - 500), queued(2, "default", 4, cls=10)]
    assert [s.job_id for s in plan_of(snapshot_of(servers, jobs)).starts] == [2]


def test_elastic_growth_stops_at_the_queue_limit() -> None:
    # vision (quota 2, borrow limit 2) runs an elastic 1..8 x 1-GPU job on an 8-GPU server: it may grow to
    # 4 GPUs only, and says why it is held there.
    servers = [training_server("t1", 8)]
    job = running(1, "vision", [("t1", (0,))], low=1, high=8, resized=NOW - 10000, runtime=1e6)
    queues = (QueueView("vision", 2, borrow_limit_gpus=2, cohort="lab"), QueueView("nlp", 6, cohort="lab"))
    snap = with_queues(snapshot_of(servers, [job]), queues)
    plan = plan_of(snap)
    assert [len(s.workers) for s in plan.scales] == [4]
    # At 4, the next cycle holds it with the quota's reason.
    grown = running(1, "vision", [("t1", (g,)) for g in range(4)], low=1, high=8, resized=NOW - 10000, runtime=1e6)
    plan = plan_of(with_queues(snapshot_of(servers, [grown]), queues))
    assert plan.scales == ()
    [note] = plan.held
    assert note.reason == Reason.HELD_BY_QUOTA
    assert "queue `vision` holds 4 GPUs (quota 2, borrow limit 2)" in note.message


def test_without_queues_nothing_is_enforced() -> None:
    servers = [training_server("t1")]
    ledger = QuotaLedger.of(snapshot_of(servers, [running(1, "x", [("t1", (0, 1, 2, 3))])]))
    assert not ledger.enforced
    assert ledger.check(queued(2, "x", 64), 64).allowed
    assert ledger.headroom(queued(2, "x")) is None
    # Reports count usage all the same (arylctl queues, explain): job 1's 4 GPUs, in queue x.
    counted = QuotaLedger.of(snapshot_of(servers, [running(1, "x", [("t1", (0, 1, 2, 3))])]), count_usage=True)
    assert counted.queues["x"].used_gpus == 4 and counted.queues["default"].quota_gpus == 4


def test_the_unconfigured_default_queue_gets_what_the_quotas_leave() -> None:
    # 8 training GPUs, vision's quota 6: default's quota is 2, and it may borrow only loaned servers' GPUs
    # (its own cohort): 2 of its 2-GPU jobs... one runs, the other waits.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [queued(1, "default"), queued(2, "default")]
    plan = plan_of(with_queues(snapshot_of(servers, jobs), (QueueView("vision", 6, cohort="lab"),)))
    assert [s.job_id for s in plan.starts] == [1]
    assert plan.pending[0].message == "queue `default` is at its quota of 2 GPUs and cannot borrow: cohort has 0 idle"


def test_in_the_simulator_a_lender_gets_its_quota_back_at_once() -> None:
    # 8 GPUs; queue a (quota 4) queues four 4-GPU jobs of 1000 s at t=0 and borrows b's idle 4 GPUs; b's one
    # 4-GPU job arrives at t=100: a's borrowing job is preempted for it once its protection window ends
    # (started at t=0, policy.min_resize_interval_s = 300 s: core.protection), so it starts at the first
    # cycle after t=300, the 300 s tick at t=400 (the cycle at its arrival was at t=100). In one shared
    # queue it waits behind a's queued jobs 3 and 4 (which start at t=1030, when 1 and 2 end: 1000 s of work
    # + 30 s restart overhead) until t=2060.
    def team(job, queue):
        return dataclasses.replace(job, queue=queue)

    jobs = [team(linear_job(i, 0.0, 4, 1, 1, 1000.0), "a") for i in (1, 2, 3, 4)]
    jobs.append(team(linear_job(5, 100.0, 4, 1, 1, 1000.0), "b"))
    queues = (QueueView("a", 4, cohort="lab"), QueueView("b", 4, cohort="lab"))
    with_quota = simulate(jobs, [], ClusterSpec(2, 0, 4, queues=queues), "aryl", PolicyParams(), seed=0,
                          check_plans=True)
    shared = simulate(jobs, [], ClusterSpec(2, 0, 4), "aryl", PolicyParams(), seed=0, check_plans=True)
    b = {r: next(o for o in result.jobs if o.job_id == 5) for r, result in (("quota", with_quota), ("shared", shared))}
    assert b["quota"].start == pytest.approx(400.0)
    assert b["shared"].start == pytest.approx(2060.0)
    assert sum(o.preemptions for o in with_quota.jobs) == 1 and sum(o.preemptions for o in shared.jobs) == 0
    assert with_quota.stop_reason == "completed"
