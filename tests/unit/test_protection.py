"""Anti-thrashing (``core.protection``): one protection window -- a minimum runtime after a start or
resize (``policy.min_resize_interval_s``, 300 s) and a cap on disruptions per hour
(``policy.max_disruptions_per_hour``, 6) -- honoured by every mechanism that takes GPUs from a running
job or changes its size: elastic scaling, a queued gang or a starving job taking elastic extras, queue
reclaim and priority preemption, inference reclaim (which prefers unprotected jobs and overrides the
window only when it must, saying so) and server drains (until their deadline). Hand-built snapshots
through the registered policies (``tests.harness``; each expected plan worked out in the comments), the
store's record of disruptions on SQLite and PostgreSQL, and the simulator's thrash metrics."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from protos.aryl.v1 import scheduler_pb2
from scheduler_service.app import SchedulerApp
from scheduler_service.core.faults import plan_evictions
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan, PreemptJob, Reason
from scheduler_service.core.protection import (
    DISRUPTION_WINDOW_S,
    ProtectionRule,
    protection,
    record_disruption,
)
from scheduler_service.core.snapshot import AdminState, ClusterSnapshot, JobView, QueueView, ServerView
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.policies import create_policy
from scheduler_service.records import GpuReport, JobSubmission, ServerRegistration
from scheduler_service.store.db import create_engine_for, session_factory
from simulator.cluster import JobOutcome
from simulator.engine import simulate
from simulator.model import ClusterSpec
from simulator.results import summarize
from simulator.thrash import thrash_metrics
from tests.fixtures.cli import run
from tests.harness import (
    NOW,
    ManualClock,
    inference_server,
    job_spec,
    linear_job,
    pending_job,
    register_fake_server,
    running_job,
    scale,
    scheduler_stub,
    snapshot_of,
    start,
    training_server,
)
from tests.helpers import wait_for

# Six disruptions within the last hour (the oldest at NOW - 3000), one older; last resized 900 s ago, so
# only the cap protects it, until NOW - 3000 + 3600 = NOW + 600.
CAPPED = (NOW - 5000, NOW - 3000, NOW - 2500, NOW - 2000, NOW - 1500, NOW - 1000, NOW - 900)


def plan(policy: str, snapshot: ClusterSnapshot, **params: Any) -> Plan:
    result = create_policy(policy, PolicyParams(**params)).schedule(snapshot)
    check_plan(snapshot, result)
    return result


def in_queue(job: JobView, queue: str = "default", cls: int = 0) -> JobView:
    return dataclasses.replace(job, queue=queue, priority_class=cls)


def draining(server: ServerView, deadline: float | None) -> ServerView:
    return dataclasses.replace(server, admin=AdminState.DRAINING, drain_deadline=deadline)


# -- the rule ---------------------------------------------------------------------------------------


def test_the_window_is_a_minimum_runtime_after_a_start_or_resize_and_a_cap_per_hour() -> None:
    params = PolicyParams()
    job = running_job(1, [("t", (0,))], low=1, high=4, resized=NOW - 100)
    shield = protection(job, NOW, params)
    assert shield is not None and (shield.rule, shield.until) == (ProtectionRule.MIN_RUNTIME, NOW + 200)
    assert protection(dataclasses.replace(job, last_resized_at=NOW - 300), NOW, params) is None
    assert protection(dataclasses.replace(job, state=JobState.PENDING, workers=()), NOW, params) is None

    capped = dataclasses.replace(job, last_resized_at=NOW - 900, disruptions=CAPPED)
    shield = protection(capped, NOW, params)
    assert shield is not None and (shield.rule, shield.until) == (ProtectionRule.DISRUPTION_CAP, NOW + 600)
    assert "6 resizes/preemptions in the last hour; at most 6 (policy.max_disruptions_per_hour)" in shield.summary
    assert protection(capped, NOW, PolicyParams(max_disruptions_per_hour=7)) is None
    assert protection(capped, NOW, PolicyParams(max_disruptions_per_hour=0)) is None  # 0: no cap
    # Both rules: the one that lasts longer is the one reported.
    both = dataclasses.replace(capped, last_resized_at=NOW - 100)
    both_rules = protection(both, NOW, params)
    assert both_rules is not None and both_rules.rule == ProtectionRule.DISRUPTION_CAP
    # Recording one keeps the last hour's only.
    assert record_disruption(CAPPED, NOW) == (*CAPPED[1:], NOW)
    assert record_disruption(None, NOW) == (NOW,)
    assert all(NOW - t < DISRUPTION_WINDOW_S for t in record_disruption(CAPPED, NOW))


# -- elastic scaling ---------------------------------------------------------------------------------


def test_elastic_scaling_leaves_a_protected_job_at_its_size_and_names_the_rule() -> None:
    # One 4-GPU server, a 1-worker job (up to 4) on it: 3 spare GPUs it would take at once, unprotected.
    servers = [training_server("t", gpus=4)]
    fresh = running_job(1, [("t", (0,))], low=1, high=4, resized=NOW - 100)
    result = plan("aryl-noloan", snapshot_of(servers, [fresh]))
    assert result.scales == ()
    [held] = result.held
    assert held.reason == Reason.HELD_RESIZE_INTERVAL and "next possible at" in held.message

    capped = dataclasses.replace(fresh, last_resized_at=NOW - 900, disruptions=CAPPED)
    result = plan("aryl-noloan", snapshot_of(servers, [capped]))
    assert result.scales == ()
    [held] = result.held
    assert held.reason == Reason.HELD_DISRUPTION_CAP
    assert "protected (DISRUPTION_CAP) until" in held.message and "policy.max_disruptions_per_hour" in held.message

    [grown] = plan("aryl-noloan", snapshot_of(servers, [capped]), max_disruptions_per_hour=0).scales
    assert (grown.job_id, len(grown.workers), grown.reason) == (1, 4, Reason.SCALED_OUT)


# -- a queued gang, and a starving job, taking elastic extras -----------------------------------------


def test_a_queued_gang_does_not_take_a_protected_jobs_extras() -> None:
    # Job 1 holds the whole server (its minimum of 1 worker + 1 extra); job 2 needs 2 GPUs: only the
    # extra's would do, but job 1 resized 100 s ago.
    servers = [training_server("t")]
    elastic = running_job(1, [("t", (0, 1)), ("t", (2, 3))], low=1, high=2, resized=NOW - 100)
    result = plan("aryl-noloan", snapshot_of(servers, [elastic, pending_job(2, gpus=2)]))
    assert (result.starts, result.scales) == ((), ())
    [waiting] = result.pending
    assert waiting.reason == Reason.WAITING_FOR_PROTECTED_JOBS
    assert "job 1 is protected (MIN_RUNTIME) until" in waiting.message
    assert "a queued job's gang leaves it be" in waiting.message


def test_a_starving_jobs_reservation_waits_for_the_window_then_takes_the_extras() -> None:
    # Job 2 has waited 7200 s (> starvation_s 3600): it reserves the server, but job 1's extra stays
    # there while job 1 is protected; once the window ends job 1 shrinks for it.
    servers = [training_server("t")]
    starving = pending_job(2, gpus=2, submitted=NOW - 7200)
    fresh = running_job(1, [("t", (0, 1)), ("t", (2, 3))], low=1, high=2, resized=NOW - 100)
    result = plan("aryl-noloan", snapshot_of(servers, [fresh, starving]))
    assert (result.starts, result.scales) == ((), ())
    [waiting] = result.pending
    assert waiting.reason == Reason.WAITING_FOR_PROTECTED_JOBS
    assert "reserved for it" in waiting.message
    assert "job 1 is protected (MIN_RUNTIME)" in waiting.message and "a starving job's reservation" in waiting.message

    settled = dataclasses.replace(fresh, last_resized_at=NOW - 600)
    result = plan("aryl-noloan", snapshot_of(servers, [settled, starving]))
    assert [s.job_id for s in result.starts] == [2]
    assert [(s.job_id, len(s.workers), s.reason) for s in result.scales] == [(1, 1, Reason.SCALED_IN_FOR_BASE_DEMAND)]


# -- queue reclaim and priority preemption -------------------------------------------------------------


def test_queue_reclaim_does_not_preempt_protected_borrowers() -> None:
    # vision (quota 4) runs 8 GPUs: job 1 (4 GPUs on t1, started 200 s ago), jobs 2 and 3 (2 GPUs each on
    # t2; 100 s and 5000 s ago). nlp's 4-GPU job is within nlp's quota: it may preempt vision's borrowers,
    # but only job 3 is outside its window, and its 2 GPUs are not a 4-GPU block: nothing is preempted.
    servers = [training_server("t1"), training_server("t2")]
    jobs = [in_queue(running_job(1, [("t1", (0, 1, 2, 3))], low=1, resized=NOW - 200), "vision"),
            in_queue(running_job(2, [("t2", (0, 1))], low=1, resized=NOW - 100), "vision"),
            in_queue(running_job(3, [("t2", (2, 3))], low=1, resized=NOW - 5000), "vision"),
            in_queue(pending_job(10, gpus=4), "nlp")]
    lab = (QueueView("vision", 4, cohort="lab"), QueueView("nlp", 4, cohort="lab"))
    snapshot = dataclasses.replace(snapshot_of(servers, jobs), queues=lab)
    result = plan("aryl", snapshot)
    assert (result.starts, result.preemptions) == ((), ())
    [waiting] = result.pending
    assert waiting.reason == Reason.WAITING_FOR_PROTECTED_JOBS
    assert "job 1 is protected (MIN_RUNTIME)" in waiting.message and "job 2 is protected" in waiting.message
    assert "queue reclaim leaves it be" in waiting.message

    # Outside the window (job 1 resized 1000 s ago): job 3 then job 1 are taken, cheapest first; job 3
    # is spared again, since the gang lands on t1 and vision is back within its quota.
    older = [dataclasses.replace(jobs[0], last_resized_at=NOW - 1000), *jobs[1:]]
    result = plan("aryl", dataclasses.replace(snapshot_of(servers, older), queues=lab))
    assert [(p.job_id, p.reason) for p in result.preemptions] == [(1, Reason.PREEMPTED_FOR_QUOTA)]
    assert [s.job_id for s in result.starts] == [10]


def test_priority_preemption_waits_for_the_window() -> None:
    servers = [training_server("t1")]
    low = in_queue(running_job(1, [("t1", (0, 1, 2, 3))], low=1, resized=NOW - 100), cls=0)
    high = in_queue(pending_job(2, gpus=4), cls=100)
    result = plan("aryl", snapshot_of(servers, [low, high]))
    assert result.preemptions == ()
    [waiting] = result.pending
    assert waiting.reason == Reason.WAITING_FOR_PROTECTED_JOBS
    assert "job 1 is protected (MIN_RUNTIME)" in waiting.message and "priority preemption" in waiting.message

    older = dataclasses.replace(low, last_resized_at=NOW - 1000)
    result = plan("aryl", snapshot_of(servers, [older, high]))
    assert [(p.job_id, p.reason) for p in result.preemptions] == [(1, Reason.PREEMPTED_FOR_PRIORITY)]


# -- inference reclaim: prefers unprotected jobs, overrides only when it must ---------------------------


def reclaim_setup(resized: float) -> tuple[list[ServerView], list[JobView]]:
    """Loaned i1 holds the extra of elastic job 1 (its minimum is on t); loaned i2 holds inelastic job 2,
    running for 7200 s. Shrinking job 1 is far cheaper than preempting job 2 (a restart, vs 2 hours of
    work since its start on 4 GPUs), so the greedy alone takes i1."""
    servers = [training_server("t"), inference_server("i1", ServerState.LOANED, gpus=4, since=NOW - 7200),
               inference_server("i2", ServerState.LOANED, gpus=4, since=NOW - 7200)]
    jobs = [running_job(1, [("t", (0, 1, 2, 3)), ("i1", (0, 1, 2, 3))], low=1, high=2, resized=resized),
            running_job(2, [("i2", (0, 1, 2, 3))], low=1, resized=NOW - 7200)]
    return servers, jobs


def test_reclaim_prefers_servers_without_protected_jobs() -> None:
    servers, jobs = reclaim_setup(resized=NOW - 1000)
    result = plan("aryl", snapshot_of(servers, jobs, demand=1))
    assert [(a.server_id, a.reason) for a in result.server_actions] == [("i1", Reason.RECLAIMED_FOR_INFERENCE)]
    assert [(s.job_id, s.reason) for s in result.scales] == [(1, Reason.SCALED_IN_FOR_RECLAIM)]

    # Job 1 in its window: under policy.reclaim_protection = "strict" i2 goes back instead.
    servers, jobs = reclaim_setup(resized=NOW - 100)
    result = plan("aryl", snapshot_of(servers, jobs, demand=1), reclaim_protection="strict")
    assert [a.server_id for a in result.server_actions] == ["i2"]
    [preempted] = result.preemptions
    assert (preempted.job_id, preempted.reason) == (2, Reason.PREEMPTED_FOR_RECLAIM)
    assert "overrides" not in preempted.message and result.scales == ()
    # The preview answers as the reclaim decides (same rule), without the penalty in its cost.
    strict = create_policy("aryl", PolicyParams(reclaim_protection="strict"))
    decision = strict.preview_reclaim(snapshot_of(servers, jobs, demand=1), 1)
    assert decision.servers == ("i2",) and decision.preempted == (2,) and decision.cost_gpu_s < 1e6
    # Under the default ("shrink") shrinking job 1 costs one more restart of its 8 GPUs, still far less than
    # job 2's two hours: i1 goes back and nothing stops.
    result = plan("aryl", snapshot_of(servers, jobs, demand=1))
    assert [a.server_id for a in result.server_actions] == ["i1"] and result.preemptions == ()
    [shrunk] = result.scales
    assert (shrunk.job_id, shrunk.reason) == (1, Reason.SCALED_IN_FOR_RECLAIM)
    assert "overrides its protection (MIN_RUNTIME" in shrunk.message


def test_reclaim_overrides_the_window_when_nothing_else_frees_enough_and_says_so() -> None:
    servers, jobs = reclaim_setup(resized=NOW - 100)
    result = plan("aryl", snapshot_of(servers, jobs, demand=2))  # both loaned servers are needed back
    assert sorted(a.server_id for a in result.server_actions) == ["i1", "i2"]
    assert [p.job_id for p in result.preemptions] == [2]
    [shrunk] = result.scales
    assert (shrunk.job_id, len(shrunk.workers), shrunk.reason) == (1, 1, Reason.SCALED_IN_FOR_RECLAIM)
    assert "overrides its protection (MIN_RUNTIME, until" in shrunk.message
    assert "inference reclaim needs 2 loaned server(s) back and those without protected jobs do not suffice" \
        in shrunk.message


# -- drains ---------------------------------------------------------------------------------------------


def test_a_drain_waits_for_the_window_until_its_deadline_then_overrides_it() -> None:
    # Elastic job 1 (1-2 workers) has a worker on draining server a and one on b.
    job = running_job(1, [("a", (0,)), ("b", (0,))], low=1, high=2, resized=NOW - 100)
    servers = [draining(training_server("a"), NOW + 3600), training_server("b")]
    result = plan("aryl-noloan", snapshot_of(servers, [job]))
    assert result.scales == () and result.preemptions == ()
    [held] = [k for k in result.held if k.job_id == 1]
    assert held.reason == Reason.HELD_DRAIN_PROTECTED
    assert "protected (MIN_RUNTIME)" in held.message and "stays there until" in held.message

    overdue = [draining(training_server("a"), NOW - 1), training_server("b")]
    [moved] = plan("aryl-noloan", snapshot_of(overdue, [job])).scales
    assert ({w.server_id for w in moved.workers}, moved.reason) == ({"b"}, Reason.SERVER_DRAINING)
    assert "overrides its protection (MIN_RUNTIME" in moved.message
    assert "server drain must meet the operator's deadline" in moved.message

    # Outside the window, or with no params given (the rule as before), it moves off at once.
    settled = dataclasses.replace(job, last_resized_at=NOW - 1000)
    [moved] = plan("aryl-noloan", snapshot_of(servers, [settled])).scales
    assert {w.server_id for w in moved.workers} == {"b"}
    evictions = plan_evictions(snapshot_of(servers, [job]))
    assert evictions is not None and [s.job_id for s in evictions.scales] == [1]


def test_a_drained_loaned_server_waits_for_its_jobs_window_too() -> None:
    # Loaned i1, drained by an operator (deadline in an hour), runs inelastic job 2, started 100 s ago.
    job = running_job(2, [("i1", (0, 1, 2, 3))], low=1, resized=NOW - 100)
    loaned = draining(inference_server("i1", ServerState.LOANED, gpus=4, since=NOW - 7200), NOW + 3600)
    result = plan("aryl", snapshot_of([training_server("t"), loaned], [job]))
    assert (result.server_actions, result.preemptions) == ((), ())
    # Outside its window the loan ends at once, as before the window existed.
    settled = dataclasses.replace(job, last_resized_at=NOW - 1000)
    result = plan("aryl", snapshot_of([training_server("t"), loaned], [settled]))
    assert [a.server_id for a in result.server_actions] == ["i1"]
    # Its job restarts on the training server's free GPUs instead of being requeued (``base.relocate_displaced``).
    [moved] = result.scales
    assert (moved.job_id, {w.server_id for w in moved.workers}, moved.reason) == (2, {"t"}, Reason.MOVED_FOR_RECLAIM)
    assert result.preemptions == ()


def test_a_lost_server_is_never_protected() -> None:
    job = running_job(1, [("a", (0,)), ("b", (0,))], low=1, high=2, resized=NOW - 10)
    servers = [dataclasses.replace(training_server("a"), state=ServerState.LOST), training_server("b")]
    [moved] = plan("aryl-noloan", snapshot_of(servers, [job])).scales
    assert (moved.reason, {w.server_id for w in moved.workers}) == (Reason.SERVER_LOST, {"b"})
    assert "overrides" not in moved.message


# -- the store records disruptions; the simulator reports thrash ----------------------------------------


@pytest.fixture
def app(database_url: str) -> Iterator[tuple[SchedulerApp, ManualClock]]:
    engine = create_engine_for(database_url)
    clock = ManualClock()
    yield SchedulerApp(session_factory(engine), clock), clock
    engine.dispose()


def test_the_store_records_each_resize_and_preemption_for_the_cap(app: tuple[SchedulerApp, ManualClock]) -> None:
    scheduler, clock = app
    scheduler.agents.register(ServerRegistration(
        hostname="s1", pool=Pool.TRAINING, agent_address="s1:7000", agent_version="test",
        gpus=tuple(GpuReport(i, f"GPU-s1-{i}", "Fake-GPU", 80 << 30) for i in range(2))))
    job = scheduler.jobs.submit(JobSubmission(
        name="job", user="alice", queue="default", command=("python", "train.py"), env={},
        gpus_per_worker=1, min_workers=1, max_workers=2, throughput={})).id
    scheduler.cluster.apply(Plan(starts=(start(job, ("s1", (0,))),)))
    view = next(j for j in scheduler.cluster.snapshot().jobs if j.job_id == job)
    assert view.disruptions == ()  # a start is not a disruption
    out_at = clock.advance(100)
    scheduler.cluster.apply(Plan(scales=(scale(job, ("s1", (0,)), ("s1", (1,))),)))
    preempted_at = clock.advance(100)
    scheduler.cluster.apply(Plan(preemptions=(PreemptJob(job, Reason.PREEMPTED_BY_POLICY, "test"),)))
    view = next(j for j in scheduler.cluster.snapshot().jobs if j.job_id == job)
    assert view.disruptions == (out_at, preempted_at)
    # One more, an hour later: the older ones drop out.
    clock.advance(DISRUPTION_WINDOW_S)
    scheduler.cluster.apply(Plan(starts=(start(job, ("s1", (0,))),)))
    again = clock.advance(10)
    scheduler.cluster.apply(Plan(scales=(scale(job, ("s1", (0,)), ("s1", (1,))),)))
    view = next(j for j in scheduler.cluster.snapshot().jobs if j.job_id == job)
    assert view.disruptions == (again,)


def test_thrash_metrics_count_resizes_and_preemptions_per_job_hour() -> None:
    # Job 1: started at 0, done at 7200 (2 h), 2 scale-outs, 1 scale-in, 1 move, 1 preemption; job 2:
    # started at 3600, still running at the end (10800: 2 h), no disruption; job 3 never started.
    jobs = [JobOutcome(1, "a", 0.0, 1, 1, 4, start=0.0, end=7200.0, preemptions=1, scale_outs=2, scale_ins=1,
                       moves=1),
            JobOutcome(2, "b", 0.0, 1, 1, 1, start=3600.0),
            JobOutcome(3, "c", 0.0, 1, 1, 1)]
    assert thrash_metrics(jobs, end_time=10800.0) == {
        "resizes_per_job_hour": 1.0, "preemptions_per_job_hour": 0.25, "disruptions_per_job_hour": 1.25,
        "max_disruptions_per_job": 5}
    assert thrash_metrics([JobOutcome(3, "c", 0.0, 1, 1, 1)], end_time=1.0)["disruptions_per_job_hour"] is None


def test_the_window_cuts_thrash_in_the_simulator() -> None:
    # Elastic 1-GPU jobs (1-4 workers) arriving every 200 s on one 8-GPU server: spare GPUs come and go
    # with each arrival and completion, so without a window the elastic jobs resize at almost every one.
    # The two-step policy (``aryl-nojoint``) thrashes without the window. The joint sizing charges each resize
    # its restart in the completion rates, so here it resizes no more without the window than with it.
    jobs = [linear_job(i, 200.0 * i, 1, 1, 4, 3000.0) for i in range(12)]
    spec = ClusterSpec(1, 0, 8)
    for policy in ("aryl-nojoint", "aryl"):
        protected = summarize(simulate(jobs, [], spec, policy, PolicyParams(), seed=0, check_plans=True))
        unprotected = summarize(simulate(jobs, [], spec, policy,
                                         PolicyParams(min_resize_interval_s=0, max_disruptions_per_hour=0),
                                         seed=0, check_plans=True))
        assert protected["stop_reason"] == unprotected["stop_reason"] == "completed"
        cut, free = protected["disruptions_per_job_hour"], unprotected["disruptions_per_job_hour"]
        assert cut is not None and free is not None
        assert cut < free if policy == "aryl-nojoint" else cut <= free, policy
        assert protected["max_disruptions_per_job"] <= unprotected["max_disruptions_per_job"]


def test_a_live_scheduler_explains_the_window_and_who_waits_for_it(scheduler_factory, capsys) -> None:
    # One 4-GPU server; job A (2-GPU workers, 1-2 of them) starts at its full size; job B (one 2-GPU
    # worker) could only have A's extra worker, but A is in its window (3600 s here): B waits, saying why.
    scheduler = scheduler_factory(policy={"min_resize_interval_s": 3600, "restart_cost_s": 1})
    channel, stub = scheduler_stub(scheduler.address)
    try:
        register_fake_server(scheduler.address, "t1", gpus=4)
        a = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("a", gpus=2, workers=1, max_workers=2)),
                           timeout=5).job
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=a.job_id), timeout=5).job.num_workers == 2,
                 what="job a at its full size")
        b = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("b", gpus=2)), timeout=5).job
        summary = wait_for(lambda: "WAITING_FOR_PROTECTED_JOBS" in (s := explain(stub, b.job_id).summary) and s,
                           what="b waiting for a's window")
        assert "is protected (MIN_RUNTIME) until" in summary and "a queued job's gang leaves it be" in summary
        answer = explain(stub, a.job_id)
        assert answer.protection.startswith("protected (MIN_RUNTIME) until ")
        assert "policy.min_resize_interval_s" in answer.protection and answer.disruptions_last_hour == 0
        code, out, _ = run(capsys, "--server", scheduler.address, "explain", a.job_id)
        assert code == 0 and "Protection: protected (MIN_RUNTIME) until" in out
        assert "(0 resize(s)/preemption(s) in the last hour)" in out
    finally:
        channel.close()


def explain(stub, job_id: str) -> scheduler_pb2.ExplainJobResponse:
    return stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=job_id), timeout=5)
