"""The Aryl policy and its variants: hand-computed scenarios, and invariants on random snapshots."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_service.core import ClusterSnapshot, JobView, Reason, ServerView, WorkerView
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import LoanStep, Plan
from scheduler_service.lifecycle import JobState, ServerState
from scheduler_service.policies import create_policy
from scheduler_service.policies.aryl import ArylPolicy
from tests.fixtures.policies import plan
from tests.harness import (
    NOW,
    first_fit_workers,
    inference_server,
    pending_job,
    running_job,
    snapshot_of,
    training_server,
)

VARIANTS = ("aryl", "aryl-noloan", "aryl-noelastic", "sjf", "fifo", "aryl-naivereclaim")


def steps(result: Plan) -> list[tuple[str, LoanStep]]:
    return [(a.server_id, a.kind) for a in result.server_actions]


# -- phase 1: base demands ---------------------------------------------------------------------


def test_shortest_job_first_with_arrival_breaking_ties() -> None:
    jobs = [pending_job(1, runtime=7200, submitted=NOW - 30), pending_job(2, runtime=600, submitted=NOW - 20),
            pending_job(3, runtime=600, submitted=NOW - 25)]
    result = plan("sjf", snapshot_of([training_server("t", gpus=2)], jobs))
    assert [s.job_id for s in result.starts] == [3, 2]
    assert [(p.job_id, p.reason) for p in result.pending] == [(1, Reason.WAITING_FOR_GANG)]


def test_a_queued_jobs_estimate_is_kept_while_its_view_is_the_same_object() -> None:
    """The policy keeps a queued job's estimate from one cycle to the next while the snapshot hands it
    the same view (the reader reuses a view while its row is unchanged), not across a change, and not a
    running job's (it depends on the clock); the plans are the fresh policy's, cycle after cycle."""
    waiting = [pending_job(1, gpus=4, runtime=7200), pending_job(2, gpus=4, runtime=600),
               pending_job(3, gpus=2, runtime=60)]
    busy = running_job(9, [("t", (0, 1))], low=1)
    servers = [training_server("t", gpus=4)]
    policy = create_policy("aryl", PolicyParams())
    first = policy.schedule(snapshot_of(servers, [busy, *waiting]))
    aryl = policy.policy
    assert isinstance(aryl, ArylPolicy)
    carried = dict(aryl._carried)
    assert sorted(carried) == [1, 2, 3]  # the queued ones (3 starts now: its next view is another); 9 runs
    changed = JobView(2, JobState.PENDING, 4, 1, 1, 0, NOW - 10, estimated_runtime_s=9000)  # a new row version
    later = snapshot_of(servers, [busy, waiting[0], changed], now=NOW + 60)
    again = policy.schedule(later)
    assert aryl._carried[1][2] is carried[1][2]  # the same view: the same estimate object
    assert aryl._carried[2][0] is changed and aryl._carried[2][2] is not carried[2][2]
    assert again == create_policy("aryl", PolicyParams()).schedule(later)
    # Shortest first: 2 (600 s) before 1 (7,200 s), then 1 before 2 once 2 says 9,000 s (a kept estimate would not).
    assert [p.job_id for p in first.pending] == [2, 1] and [p.job_id for p in again.pending] == [1, 2]


def test_small_jobs_backfill_around_a_waiting_gang() -> None:
    jobs = [pending_job(1, gpus=4, workers=2, runtime=60), pending_job(2, gpus=1, runtime=7200)]
    result = plan("sjf", snapshot_of([training_server("a"), training_server("b", gpus=2)], jobs))
    [start] = result.starts
    assert (start.job_id, start.reason) == (2, Reason.BACKFILLED)
    assert "backfilled ahead of job 1" in start.message


def test_a_starving_job_gets_a_reservation_that_backfill_respects() -> None:
    busy = running_job(9, [("a", (0, 1))], low=1)
    starving = pending_job(1, gpus=4, submitted=NOW - 7200, runtime=600)
    small = pending_job(2, gpus=1, runtime=60)
    servers = [training_server("a"), training_server("b", gpus=1)]
    result = plan("sjf", snapshot_of(servers, [busy, starving, small]), starvation_s=3600)
    reasons = {p.job_id: p for p in result.pending}
    assert "reserved for it" in reasons[1].message
    # The small job may not take the reserved server's free GPUs; it goes to the other server.
    [start] = result.starts
    assert [w.server_id for w in start.workers] == ["b"]


def test_inelastic_jobs_prefer_training_owned_servers() -> None:
    servers = [training_server("t", gpus=4), inference_server("i", ServerState.LOANED, gpus=4, since=NOW - 3600)]
    result = plan("aryl", snapshot_of(servers, [pending_job(1, gpus=2)], demand=0))
    assert [w.server_id for w in result.starts[0].workers] == ["t"]


# -- phase 2: elastic extras -------------------------------------------------------------------


def test_spare_gpus_go_to_the_job_they_help_most_and_extras_prefer_loaned_servers() -> None:
    # Job 1 scales almost linearly; job 2 barely gains from more workers.
    linear = running_job(1, [("t", (0,))], low=1, high=4)
    flat = JobView(2, JobState.RUNNING, 1, 1, 4, 0, 0.0, workers=(WorkerView(0, "t", (1,)),),
                   estimated_runtime_s=3600, throughput_points=((1, 100.0), (2, 101.0)), total_work=360000.0,
                   last_resized_at=0.0)
    servers = [training_server("t", gpus=2), inference_server("i", ServerState.LOANED, gpus=2, since=NOW - 3600)]
    result = plan("aryl", snapshot_of(servers, [linear, flat], demand=0))
    [scale] = result.scales
    assert scale.job_id == 1 and scale.reason == Reason.SCALED_OUT
    assert sorted(w.server_id for w in scale.workers[1:]) == ["i", "i"]
    assert "estimated completion" in scale.message


def test_a_job_started_and_grown_at_once_is_told_the_size_it_starts_with() -> None:
    """Issue 21: "placed 1 worker(s) on t; 4 worker(s) with elastic extras" read as two sizes. The start
    names the size it starts with, then how it splits into the job's minimum and this cycle's extras."""
    servers = [training_server("t", gpus=2), inference_server("i", ServerState.LOANED, gpus=2, since=NOW - 3600)]
    result = plan("aryl", snapshot_of(servers, [pending_job(1, workers=1, max_workers=4)], demand=0))
    [start] = result.starts
    assert len(start.workers) == 4
    assert start.message == ("placed 4 worker(s) on i, t: its minimum of 1 and 3 elastic extra(s) "
                             "from this cycle's spare GPUs")


def test_recently_resized_jobs_are_left_alone() -> None:
    job = running_job(1, [("t", (0,))], low=1, high=4, resized=NOW - 10)
    assert plan("aryl", snapshot_of([training_server("t")], [job]), min_resize_interval_s=300).scales == ()
    assert plan("aryl", snapshot_of([training_server("t")], [job]), min_resize_interval_s=5).scales != ()


def test_a_queued_gang_takes_gpus_from_extra_workers() -> None:
    # Resized 600 s ago: outside its protection window (300 s; tests/unit/test_protection.py for inside it).
    # A long job (10 h): its second worker completes less of it than the queued job's start
    # (tests/policies/test_joint_sizing.py).
    elastic = running_job(1, [("t", (0, 1)), ("t", (2, 3))], low=1, high=2, resized=NOW - 600, runtime=36000)
    result = plan("aryl-noloan", snapshot_of([training_server("t")], [elastic, pending_job(2, gpus=2)]))
    [scale] = result.scales
    assert (scale.job_id, len(scale.workers), scale.reason) == (1, 1, Reason.SCALED_IN_FOR_BASE_DEMAND)
    assert [s.job_id for s in result.starts] == [2]


def test_jobs_scaled_in_for_gangs_grow_back_without_swapping_gpus() -> None:
    # Jobs 1 and 2 (2-GPU workers, 1..2) each have their extra on the server the other's does not: job 1 on y's
    # GPUs 1 and 3, job 2 on x's. Jobs 3 and 4 (long, not worth growing) have extras beside them; x and y have GPU 4
    # free. Gangs 7 and 8 (3 GPUs) fit only over the extras: 7 takes x's GPUs 0-2, 8 takes y's, each scaling in two
    # jobs. Each server is left GPUs 3 (job 1's on y, job 2's on x) and 4 free, and jobs 1 and 2 grow back: each
    # onto its own GPU 3. Before, job 1 grew first onto x's (job 2's) and job 2 then onto y's (job 1's): each took
    # what the other freed, a swap no applier orders (the headline's exact run, seed 1, refused 4 such actions).
    old = NOW - 7200
    jobs = [running_job(1, [("z", (0, 1)), ("y", (1, 3))], low=1, high=2, resized=old, runtime=7200),
            running_job(2, [("z", (2, 3)), ("x", (1, 3))], low=1, high=2, resized=old, runtime=7200),
            running_job(3, [("z", (4, 5)), ("x", (0, 2))], low=1, high=2, resized=old, runtime=1e6),
            running_job(4, [("z", (6, 7)), ("y", (0, 2))], low=1, high=2, resized=old, runtime=1e6),
            running_job(5, [("x", (5, 6, 7))], low=1, resized=old, runtime=1e5),
            running_job(6, [("y", (5, 6, 7))], low=1, resized=old, runtime=1e5),
            pending_job(7, gpus=3), pending_job(8, gpus=3)]
    result = plan("aryl", snapshot_of([training_server(s, gpus=8) for s in ("x", "y", "z")], jobs))
    assert {s.job_id: s.workers[0].server_id for s in result.starts} == {7: "x", 8: "y"}
    scales = {s.job_id: [(w.server_id, w.gpu_indices) for w in s.workers] for s in result.scales}
    assert scales == {1: [("z", (0, 1)), ("y", (3, 4))], 2: [("z", (2, 3)), ("x", (3, 4))],
                      3: [("z", (4, 5))], 4: [("z", (6, 7))]}


@pytest.mark.parametrize(("loaned", "queued", "message"), [
    # One gang takes two extras at once.
    (False, [pending_job(2, gpus=2)], "scaled in to 2 worker(s) so job 2 can start"),
    # Two gangs take one extra each: scaled in for a base demand, and then again.
    (False, [pending_job(2), pending_job(3)], "scaled in to 2 worker(s) so jobs 2, 3 can start"),
    # Scaled in off a reclaimed server, and then for a base demand.
    (True, [pending_job(2)],
     "scaled in to 3 worker(s): loaned server(s) went back to inference, and so job 2 can start"),
])
def test_a_job_scaled_in_more_than_once_is_told_its_final_size(loaned: bool, queued: list[JobView],
                                                                message: str) -> None:
    """The applier appends "(now N worker(s))" to the scale's message: the message names that N too."""
    lent = [inference_server("i", ServerState.LOANED, gpus=2, since=NOW - 7200)] if loaned else []
    servers = [training_server("t"), *lent]
    placement: list[tuple[str, tuple[int, ...]]] = [("t", (g,)) for g in range(4)]
    placement += [("i", (0,)), ("i", (1,))] if loaned else []
    elastic = running_job(1, placement, low=1, high=len(placement), resized=NOW - 7200, runtime=72000)
    result = plan("aryl", snapshot_of(servers, [elastic, *queued], demand=1 if loaned else 0))
    assert sorted(s.job_id for s in result.starts) == [j.job_id for j in queued]
    [scale] = result.scales
    assert (scale.job_id, len(scale.workers), scale.message) == (1, int(message.split()[3]), message)


def test_a_restart_must_pay_for_itself() -> None:
    # Estimated at 30 s and 25 s run: 5 s left, not worth a restart.
    job = running_job(1, [("t", (0,))], low=1, high=2, runtime=30, resized=NOW - 25)
    assert plan("aryl-noloan", snapshot_of([training_server("t")], [job]), restart_cost_s=60).scales == ()


# -- loans and reclaims ------------------------------------------------------------------------


def test_idle_inference_servers_beyond_demand_and_buffer_are_loaned_when_training_waits() -> None:
    servers = [training_server("t", gpus=1)] + [inference_server(f"i{k}", since=NOW - 3600) for k in range(4)]
    jobs = [pending_job(1, gpus=8, workers=2)]
    result = plan("aryl", snapshot_of(servers, jobs, demand=1), loan_buffer_servers=1)
    assert steps(result) == [("i0", LoanStep.LOAN), ("i1", LoanStep.LOAN)]  # 4 - 1 needed - 1 buffer
    assert result.server_actions[0].reason == Reason.LOANED_IDLE_SERVER


def test_no_loans_without_training_demand_recent_activity_or_a_demand_signal() -> None:
    idle = [inference_server(f"i{k}", since=NOW - 3600) for k in range(3)]
    assert steps(plan("aryl", snapshot_of(idle, [], demand=0))) == []
    assert steps(plan("aryl", snapshot_of(idle, [pending_job(1, gpus=8)], demand=None))) == []
    fresh = [inference_server(f"i{k}", since=NOW - 10) for k in range(3)]
    assert steps(plan("aryl", snapshot_of(fresh, [pending_job(1, gpus=8)], demand=0), loan_idle_s=300)) == []
    for name in ("sjf", "aryl-noloan"):
        assert steps(plan(name, snapshot_of(idle, [pending_job(1, gpus=8)], demand=0))) == []


def test_a_drained_loan_becomes_active_and_is_used() -> None:
    servers = [inference_server("i", ServerState.DRAINING, since=NOW - 60)]
    result = plan("aryl", snapshot_of(servers, [pending_job(1, gpus=8)], demand=0), drain_timeout_s=30)
    assert steps(result) == [("i", LoanStep.ACTIVATE)]
    assert [w.server_id for w in result.starts[0].workers] == ["i"]


def test_reclaim_shrinks_elastic_jobs_instead_of_killing_inelastic_ones() -> None:
    servers = [training_server("t", gpus=4), inference_server("i1", ServerState.LOANED, gpus=4, since=NOW - 7200),
               inference_server("i2", ServerState.LOANED, gpus=4, since=NOW - 7200)]
    elastic = running_job(1, [("t", (0, 1)), ("i1", (0, 1)), ("i1", (2, 3))], low=1, high=3, resized=NOW - 7200)
    inelastic = running_job(2, [("i2", (0, 1, 2, 3))], low=1, resized=NOW - 7200)
    result = plan("aryl", snapshot_of(servers, [elastic, inelastic], demand=1))
    assert steps(result) == [("i1", LoanStep.RECLAIM)]
    assert result.preemptions == ()
    [scale] = result.scales
    # Off the reclaimed server; the training server's spare GPUs may take a worker back.
    assert (scale.job_id, {w.server_id for w in scale.workers}, scale.reason) == (
        1, {"t"}, Reason.SCALED_IN_FOR_RECLAIM)


def test_reclaim_preempts_when_it_must_and_cancels_draining_loans_first() -> None:
    servers = [inference_server("d", ServerState.DRAINING, since=NOW - 5),
               inference_server("l", ServerState.LOANED, gpus=4, since=NOW - 7200)]
    inelastic = running_job(2, [("l", (0, 1, 2, 3))], low=1, resized=NOW - 7200)
    result = plan("aryl", snapshot_of(servers, [inelastic], demand=2))
    assert steps(result) == [("d", LoanStep.CANCEL), ("l", LoanStep.RECLAIM)]
    [preempt] = result.preemptions
    assert (preempt.job_id, preempt.reason) == (2, Reason.PREEMPTED_FOR_RECLAIM)


def test_vacated_reclaimed_servers_return_to_serving_once_the_agent_confirms() -> None:
    done = inference_server("r", ServerState.RECLAIMING, since=NOW - 5)
    waiting = inference_server("w", ServerState.RECLAIMING, since=NOW - 5, agent_converged=False)
    assert steps(plan("aryl", snapshot_of([done, waiting], [], demand=2))) == [("r", LoanStep.RETURN)]


def test_a_reclaimed_server_goes_back_at_its_hard_deadline_without_the_agents_confirmation() -> None:
    # The deadline is the one the RECLAIM step set (ServerView.reclaim_deadline), not a time the policy
    # works out again: long past the state change, before the deadline, the server still waits.
    def reclaiming(sid: str, deadline: float | None) -> ServerView:
        return inference_server(sid, ServerState.RECLAIMING, since=NOW - 7200, agent_converged=False,
                                reclaim_deadline=deadline)

    servers = [reclaiming("due", NOW), reclaiming("later", NOW + 1), reclaiming("none", None)]
    result = plan("aryl", snapshot_of(servers, [], demand=3))
    assert steps(result) == [("due", LoanStep.RETURN)]
    assert "returned to inference by force" in result.server_actions[0].message
    assert "reclaim deadline of 7200s passed" in result.server_actions[0].message  # the stored one


def test_hysteresis_band_neither_loans_nor_reclaims() -> None:
    servers = [inference_server("s1", since=NOW - 3600), inference_server("s2", since=NOW - 3600),
               inference_server("l", ServerState.LOANED, since=NOW - 3600)]
    assert steps(plan("aryl", snapshot_of(servers, [pending_job(1, gpus=8)], demand=1), loan_buffer_servers=1)) == []


def test_variants_isolate_their_mechanism() -> None:
    servers = [training_server("t", gpus=2)] + [inference_server(f"i{k}", since=NOW - 3600) for k in range(3)]
    jobs = [running_job(1, [("t", (0,))], low=1, high=4), pending_job(2, gpus=8)]
    snap = snapshot_of(servers, jobs, demand=0)
    assert plan("sjf", snap).scales == () and steps(plan("sjf", snap)) == []
    assert steps(plan("aryl-noloan", snap)) == [] and plan("aryl-noloan", snap).scales != ()
    assert steps(plan("aryl-noelastic", snap)) != [] and plan("aryl-noelastic", snap).scales == ()


# -- invariants on random clusters -------------------------------------------------------------


@st.composite
def clusters(draw) -> ClusterSnapshot:
    servers: list[ServerView] = []
    for k in range(draw(st.integers(0, 4))):
        bad = frozenset(draw(st.sets(st.integers(0, 3), max_size=1)))
        servers.append(training_server(f"t{k}", gpus=4, unhealthy_gpus=bad))
    states = [ServerState.SERVING, ServerState.LOANED, ServerState.DRAINING, ServerState.RECLAIMING]
    for k in range(draw(st.integers(0, 4))):
        state = draw(st.sampled_from(states))
        servers.append(inference_server(f"i{k}", state, gpus=draw(st.sampled_from([4, 8])),
                                        since=NOW - draw(st.sampled_from([5, 4000])),
                                        agent_converged=draw(st.booleans())))
    free = {s.server_id: [g for g in s.gpu_indices if g not in s.unhealthy_gpus]
            for s in servers if s.state in (ServerState.TRAINING, ServerState.LOANED)}
    jobs: list[JobView] = []
    for jid in range(1, draw(st.integers(0, 10)) + 1):
        gpus = draw(st.sampled_from([1, 2, 4]))
        low = draw(st.integers(1, 3))
        high = low + draw(st.integers(0, 3))
        runtime = draw(st.sampled_from([60.0, 600.0, 7200.0]))
        placement = first_fit_workers(free, gpus, draw(st.integers(0, high)), least=low)
        if placement:
            jobs.append(running_job(jid, placement, low=low, high=high, runtime=runtime,
                                resized=NOW - draw(st.sampled_from([10, 4000]))))
        else:
            jobs.append(pending_job(jid, gpus, low, high, runtime=runtime,
                                submitted=NOW - draw(st.sampled_from([10, 5000]))))
    demand = draw(st.one_of(st.none(), st.integers(0, 5)))
    return snapshot_of(servers, jobs, demand)


@pytest.mark.parametrize("name", VARIANTS)
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters())
def test_every_plan_keeps_the_invariants_and_is_deterministic(name: str, snap: ClusterSnapshot) -> None:
    params = PolicyParams(starvation_s=3600, min_resize_interval_s=300, loan_idle_s=300)
    first = plan(name, snap, **vars(params))
    assert first == create_policy(name, params).schedule(snap)
    # Every job that stays pending is explained.
    placed = {s.job_id for s in first.starts}
    assert {j.job_id for j in snap.pending_jobs()} - placed == {p.job_id for p in first.pending}


def test_naive_reclaim_takes_the_latest_loan_even_when_that_preempts() -> None:
    servers = [training_server("t", gpus=4), inference_server("old", ServerState.LOANED, gpus=4, since=NOW - 9000),
               inference_server("new", ServerState.LOANED, gpus=4, since=NOW - 7200)]
    elastic = running_job(1, [("t", (0, 1)), ("old", (0, 1)), ("old", (2, 3))], low=1, high=3, resized=NOW - 7200)
    inelastic = running_job(2, [("new", (0, 1, 2, 3))], low=1, resized=NOW - 7200)
    snap = snapshot_of(servers, [elastic, inelastic], demand=1)
    assert steps(plan("aryl", snap)) == [("old", LoanStep.RECLAIM)] and plan("aryl", snap).preemptions == ()
    naive = plan("aryl-naivereclaim", snap)
    assert steps(naive) == [("new", LoanStep.RECLAIM)]
    assert [p.job_id for p in naive.preemptions] == [2]
