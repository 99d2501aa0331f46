"""Faults are policy input: the eviction decision for jobs on LOST servers (``core.faults``), applied
first by every registered policy; the reclaim preview through the configured policy; the simulator's
injected failures and drain acknowledgements; and the service, whose liveness check only marks a
server LOST and whose next cycle evicts (on SQLite and PostgreSQL, and over gRPC)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import grpc
import pytest

from protos.aryl.v1 import scheduler_pb2
from scheduler_service.app import SchedulerApp
from scheduler_service.core.faults import Evictions, plan_evictions
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import (
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
    WorkerPlacement,
)
from scheduler_service.core.registry import PolicyRegistry, ReclaimPreviewUnsupported, policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, QueueView, ServerView
from scheduler_service.cycle import SchedulingCycle
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.policies import create_policy
from scheduler_service.policies.aryl import _running_jobs, choose_reclaim
from scheduler_service.records import GpuReport, GpuSample, JobSubmission, ServerRegistration, StatusReport
from scheduler_service.store.db import create_engine_for, session_factory
from simulator.cli import main as cli_main
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import SimulationResult, simulate
from simulator.failures import FailureSchedule, FailureTraceError, load_failure_trace
from simulator.model import ClusterSpec, DemandPoint, FailureRate, ServerFailure, TraceJob
from tests.harness import (
    NOW,
    ManualClock,
    details_of,
    inference_server,
    linear_job,
    pending_job,
    placed,
    running_job,
    scheduler_stub,
    snapshot_of,
    training_server,
)

LOST = ServerState.LOST


def server(sid: str, gpus: int = 4, *, state: ServerState = ServerState.TRAINING) -> ServerView:
    return dataclasses.replace(training_server(sid, gpus), state=state)


def job(jid: int, placement: list[tuple[str, tuple[int, ...]]], *, low: int, high: int | None = None,
        state: JobState = JobState.RUNNING) -> JobView:
    return running_job(jid, placement, low=low, high=high, state=state)


def snapshot(servers: list[ServerView], jobs: list[JobView], demand: int | None = None) -> ClusterSnapshot:
    return snapshot_of(servers, jobs, demand)


def placement(action: ScaleJob | StartJob) -> list[tuple[int, str, tuple[int, ...]]]:
    return [(w.rank, w.server_id, w.gpu_indices) for w in action.workers]


def evictions(snap: ClusterSnapshot) -> Evictions:
    found = plan_evictions(snap)
    assert found is not None
    return found


# -- the decision -----------------------------------------------------------------------------------


def test_a_running_job_that_keeps_min_workers_shrinks_to_its_survivors_ranks_renumbered_in_order() -> None:
    # Ranks 1 and 3 ran on the lost server: 0 and 2 survive and become 0 and 1, keeping their GPUs.
    elastic = job(1, [("a", (0,)), ("x", (0,)), ("b", (2,)), ("x", (1,))], low=2, high=4)
    found = evictions(snapshot([server("a"), server("b"), server("x", state=LOST)], [elastic]))
    [scale] = found.scales
    assert found.preemptions == ()
    assert placement(scale) == [(0, "a", (0,)), (1, "b", (2,))]
    assert scale.reason == Reason.SERVER_LOST
    assert scale.message == "server x lost (agent silent); continues with 2 worker(s)"


def test_a_job_left_below_min_workers_is_requeued() -> None:
    gang = job(1, [("a", (0,)), ("x", (0,)), ("x", (1,))], low=2, high=3)
    found = evictions(snapshot([server("a"), server("x", state=LOST)], [gang]))
    assert found.scales == ()
    assert found.preemptions == (PreemptJob(1, Reason.SERVER_LOST, "server x lost (agent silent)"),)


def test_a_job_with_every_worker_on_the_lost_server_is_requeued() -> None:
    alone = job(1, [("x", (0, 1)), ("x", (2, 3))], low=1, high=2)
    found = evictions(snapshot([server("x", state=LOST)], [alone]))
    assert [p.job_id for p in found.preemptions] == [1] and found.scales == ()


def test_a_job_not_running_is_requeued_even_when_enough_workers_survive() -> None:
    # SCALING: mid-restart, it cannot be resized (the appliers refuse a resize of a SCALING job).
    scaling = job(1, [("a", (0,)), ("a", (1,)), ("x", (0,))], low=1, high=4, state=JobState.SCALING)
    found = evictions(snapshot([server("a"), server("x", state=LOST)], [scaling]))
    assert [p.job_id for p in found.preemptions] == [1] and found.scales == ()


def test_two_lost_servers_give_one_action_per_job_naming_both() -> None:
    elastic = job(1, [("x", (0,)), ("a", (0,)), ("y", (0,)), ("a", (1,))], low=1, high=4)
    gang = job(2, [("x", (1,)), ("y", (1,))], low=2)
    untouched = job(3, [("a", (2,))], low=1)
    snap = snapshot([server("a"), server("x", state=LOST), server("y", state=LOST)], [elastic, gang, untouched])
    found = evictions(snap)
    [scale] = found.scales
    assert placement(scale) == [(0, "a", (0,)), (1, "a", (1,))]
    assert scale.message == "servers x, y lost (agent silent); continues with 2 worker(s)"
    assert found.preemptions == (PreemptJob(2, Reason.SERVER_LOST, "servers x, y lost (agent silent)"),)


def test_no_lost_server_or_an_empty_one_means_no_evictions() -> None:
    running = job(1, [("a", (0,))], low=1)
    assert plan_evictions(snapshot([server("a"), server("x")], [running])) is None
    assert plan_evictions(snapshot([server("a"), server("x", state=LOST)], [running])) is None


def test_the_policy_decides_on_the_snapshot_as_the_evictions_leave_it() -> None:
    elastic = job(1, [("a", (0,)), ("x", (0,)), ("a", (1,))], low=1, high=3)
    gang = job(2, [("a", (2,)), ("x", (1,))], low=2)
    waiting = pending_job(3, gpus=1)
    after = evictions(snapshot([server("a"), server("x", state=LOST)], [elastic, gang, waiting])).after
    assert [j.job_id for j in after.jobs] == [1, 3]  # the requeued job queues again from the next cycle
    shrunk = after.jobs[0]
    assert [(w.rank, w.server_id, w.gpu_indices) for w in shrunk.workers] == [(0, "a", (0,)), (1, "a", (1,))]
    assert shrunk.last_resized_at == NOW  # just resized: anti-thrashing leaves it be
    assert after.server("a").allocated == ((0, 1), (1, 1)) and after.server("a").free_gpus == (2, 3)
    assert after.server("x").allocated == ()


# -- every registered policy applies it first --------------------------------------------------------


@pytest.mark.parametrize("name", policies.names())
def test_every_registered_policy_evicts_first_and_places_on_the_freed_gpus(name: str) -> None:
    # Job 1 (a 2-worker gang) loses its worker on x and is requeued; job 3 fits only on the GPUs job 1
    # frees on a, and starts on them in the same plan.
    gang = job(1, [("a", (0, 1)), ("x", (0, 1))], low=2)
    other = job(2, [("a", (2, 3))], low=1)
    snap = snapshot([server("a"), server("x", state=LOST)], [gang, other, pending_job(3, gpus=2)])
    result = create_policy(name).schedule(snap)
    assert check_plan(snap, result) == []
    assert result.preemptions == (PreemptJob(1, Reason.SERVER_LOST, "server x lost (agent silent)"),)
    [start] = result.starts
    assert start.job_id == 3 and placement(start) == [(0, "a", (0, 1))]
    assert all(p.job_id != 1 for p in result.pending)


def test_the_registry_puts_the_evictions_before_any_policy() -> None:
    seen: list[ClusterSnapshot] = []

    @dataclasses.dataclass
    class Recorder:
        name: str = "recorder"

        def schedule(self, snap: ClusterSnapshot) -> Plan:
            seen.append(snap)
            return Plan()

    registry = PolicyRegistry()
    registry.register("recorder")(lambda params: Recorder())
    snap = snapshot([server("a"), server("x", state=LOST)], [job(1, [("x", (0,))], low=1)])
    result = registry.create("recorder").schedule(snap)
    assert [p.job_id for p in result.preemptions] == [1]
    assert [j.job_id for j in seen[0].jobs] == [] and seen[0].server("x").allocated == ()


def test_a_shrunk_job_the_policy_then_reclaims_is_acted_on_once() -> None:
    # Job 1 runs rank 0 on lost x and rank 1 on loaned i: it shrinks to its one worker on i. Inference
    # needs i back, and reclaiming i would leave the job no worker: the reclaim preempts it. One
    # PreemptJob, reason SERVER_LOST (the change that came first), both messages.
    loaned = inference_server("i", ServerState.LOANED, gpus=4)
    elastic = job(1, [("x", (0, 1, 2, 3)), ("i", (0, 1, 2, 3))], low=1, high=2)
    snap = snapshot([loaned, server("x", state=LOST)], [elastic], demand=1)
    result = create_policy("aryl").schedule(snap)
    assert check_plan(snap, result) == []
    assert result.scales == ()
    [preempt] = result.preemptions
    assert (preempt.job_id, preempt.reason) == (1, Reason.SERVER_LOST)
    assert preempt.message.startswith(
        "server x lost (agent silent); continues with 1 worker(s); its loaned server(s) i went back")
    assert [(a.server_id, a.kind) for a in result.server_actions] == [("i", LoanStep.RECLAIM)]


def test_merge_makes_one_action_per_job_with_the_fault_reason_and_both_messages() -> None:
    elastic = job(1, [("a", (0,)), ("x", (0,)), ("a", (1,))], low=1, high=4)
    other = job(2, [("a", (2,)), ("x", (1,))], low=1, high=2)
    found = evictions(snapshot([server("a"), server("x", state=LOST)], [elastic, other]))
    grown = ScaleJob(1, (WorkerPlacement(0, "a", (0,)), WorkerPlacement(1, "a", (1,)), WorkerPlacement(2, "a", (3,))),
                     Reason.SCALED_OUT, "grew")
    merged = found.merge(Plan(scales=(grown,), preemptions=(PreemptJob(2, Reason.PREEMPTED_FOR_RECLAIM, "reclaimed"),)))
    assert merged.scales == (ScaleJob(1, grown.workers, Reason.SERVER_LOST,
                                      "server x lost (agent silent); continues with 2 worker(s); grew"),)
    assert merged.preemptions == (PreemptJob(2, Reason.SERVER_LOST,
                                             "server x lost (agent silent); continues with 1 worker(s); reclaimed"),)


# -- the reclaim preview goes through the configured policy -------------------------------------------


def test_the_reclaim_preview_is_the_configured_policys_own_choice() -> None:
    # Old loan o (empty) and recent loan r (an inelastic job on it): the greedy returns o, the naive
    # ablation the most recently loaned r.
    old = inference_server("o", ServerState.LOANED, gpus=4)
    recent = inference_server("r", ServerState.LOANED, gpus=4, since=NOW - 1000)
    snap = snapshot([old, recent], [job(1, [("r", (0, 1, 2, 3))], low=1)])
    assert create_policy("aryl").preview_reclaim(snap, 1).servers == ("o",)
    naive = create_policy("aryl-naivereclaim").preview_reclaim(snap, 1)
    assert (naive.servers, naive.preempted) == (("r",), (1,))
    params = PolicyParams()
    loaned = [snap.server("o"), snap.server("r")]  # the reclaim considers the longest loaned first
    assert create_policy("aryl").preview_reclaim(snap, 1) == choose_reclaim(_running_jobs(snap), loaned, 1, params,
                                                                            NOW)
    for name in ("fifo", "aryl-noloan", "sjf"):
        with pytest.raises(ReclaimPreviewUnsupported, match=f"policy '{name}' does not loan"):
            create_policy(name).preview_reclaim(snap, 1)


# -- the simulator: failures and drain acknowledgements ------------------------------------------------


def synthetic_jobs(count: int, *, seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs = []
    for job_id, submit in enumerate(sorted(round(rng.uniform(0, 6 * 3600.0), 1) for _ in range(count)), start=1):
        gpw, low = rng.choice([1, 1, 2, 4]), rng.choice([1, 1, 2])
        high = low * 4 if rng.random() < 0.5 and gpw < 4 else low
        points = tuple((w, round((w / low) ** 0.8, 6)) for w in range(low, high + 1))
        jobs.append(TraceJob(job_id, f"job-{job_id}", submit, gpw, low, high,
                             round(min(rng.lognormvariate(7.5, 1.0), 20000.0), 1), points))
    return jobs


def test_injected_failures_are_reproducible_from_the_seed_and_evict_without_refusals() -> None:
    jobs = synthetic_jobs(40, seed=5)
    spec = ClusterSpec(training_servers=3, inference_servers=2, gpus_per_server=8)
    demand = [DemandPoint(3600.0 * h, [0, 1, 2, 1][h % 4]) for h in range(48)]
    rate = FailureRate(mtbf_s=4 * 3600.0, repair_s=1800.0)

    def run(seed: int) -> SimulationResult:
        # check_plans: every plan passes the invariants and is applied in full (a refusal raises).
        return simulate(jobs, demand, spec, "aryl", PolicyParams(loan_buffer_servers=0), seed=seed,
                        failures=rate, check_plans=True)

    first, again, other = run(0), run(0), run(1)
    assert first == again
    assert first.server_failures > 0 and first.fault_evictions > 0 and first.rejected_actions == 0
    assert first.stop_reason == "completed"
    assert (other.server_failures, other.jobs) != (first.server_failures, first.jobs)
    assert other.rejected_actions == 0
    assert simulate(jobs, demand, spec, "aryl", PolicyParams(loan_buffer_servers=0), seed=0).server_failures == 0


def test_a_lost_server_shrinks_an_elastic_job_which_falls_back_to_its_checkpoint() -> None:
    # 16 one-GPU workers on two servers from t=0 (1 unit/s each). t0001 fails at 1000 s for 500 s:
    # work 16 x 970 = 15520, last checkpoint at 600 s: 16 x 570 = 9120, so 6400 units (400 s x 16
    # GPUs) are lost and the job goes on with 8 workers from 9120. Back at 1500 s it grows to 16
    # again (a graceful resize at 9120 + 8 x 470 = 12880); the other 7120 units take 30 + 445 s.
    result = simulate([linear_job(1, 0.0, 1, 4, 16, 20000.0)], [], ClusterSpec(2, 0), "aryl", PolicyParams(),
                      seed=0, checkpoint_interval_s=600.0, failures=[ServerFailure(1000.0, "t0001", 500.0)],
                      check_plans=True)
    [outcome] = result.jobs
    assert (outcome.end, outcome.scale_ins, outcome.scale_outs, outcome.preemptions) == (1975.0, 1, 1, 0)
    assert outcome.lost_work_gpu_s == 400.0 * 16
    assert outcome.overhead_gpu_s == 30.0 * (16 + 8 + 16)
    assert (result.server_failures, result.fault_evictions, result.rejected_actions) == (1, 1, 0)


def test_a_requeued_job_restarts_elsewhere_in_the_cycle_right_after_its_eviction() -> None:
    # An 8-GPU job on t0000 (best fit: the first server); t0000 fails at 1000 s. Requeued from the
    # checkpoint at 600 s (570 units), it starts on t0001 in the follow-up cycle at 1000 s, not at the
    # next tick: done at 1000 + 30 + 1430.
    result = simulate([linear_job(1, 0.0, 8, 1, 1, 2000.0)], [], ClusterSpec(2, 0), "fifo", PolicyParams(),
                      seed=0, checkpoint_interval_s=600.0, failures=[ServerFailure(1000.0, "t0000", 5000.0)],
                      check_plans=True)
    [outcome] = result.jobs
    assert (outcome.end, outcome.preemptions, outcome.lost_work_gpu_s) == (2460.0, 1, 400.0 * 8)
    assert (result.server_failures, result.fault_evictions) == (1, 1)


def test_a_failed_loaned_server_ends_its_loan_and_comes_back_serving() -> None:
    clock = VirtualClock(0.0)
    state = SimulatedCluster(ClusterSpec(0, 1), clock)
    state.submit(linear_job(1, 0.0, 8, 1, 1, 1e6))
    step = lambda kind: ServerAction("i0000", kind, Reason.LOANED_IDLE_SERVER, "")  # noqa: E731
    state.apply(Plan(server_actions=(step(LoanStep.LOAN),)))
    clock.advance_to(1.0)
    state.apply(Plan(starts=(StartJob(1, (WorkerPlacement(0, "i0000", tuple(range(8))),), Reason.PLACED, ""),),
                     server_actions=(step(LoanStep.ACTIVATE),)))
    clock.advance_to(100.0)
    state.fail_server("i0000")
    view = state.snapshot().servers[0]
    assert (view.state, view.loan_started_at, len(view.allocated)) == (LOST, None, 8)  # held until a plan evicts
    state.apply(create_policy("aryl").schedule(state.snapshot()))
    assert state.snapshot().servers[0].allocated == () and state.snapshot().jobs[0].state == JobState.PENDING
    clock.advance_to(200.0)
    state.repair_server("i0000")
    assert state.snapshot().servers[0].state == ServerState.SERVING
    assert state.apply(Plan(server_actions=(step(LoanStep.LOAN),))).rejected == ()  # no loan left open


def test_the_simulated_applier_places_only_gpus_the_job_does_not_hold_yet() -> None:
    # The applier's rule (not a policy's choice): a (server, GPU) the job keeps is no new placement,
    # whatever rank it gets, so renumbering is not refused for where it runs (here: a LOST server);
    # a GPU the job does not hold there is.
    clock = VirtualClock(0.0)
    state = SimulatedCluster(ClusterSpec(2, 0), clock)
    state.submit(linear_job(1, 0.0, 1, 1, 3, 1e6))
    w = WorkerPlacement
    state.apply(Plan(starts=(StartJob(1, (w(0, "t0000", (0,)), w(1, "t0000", (1,)), w(2, "t0001", (0,))),
                                      Reason.PLACED, ""),)))
    state.fail_server("t0000")
    moved = ScaleJob(1, (w(0, "t0000", (2,)), w(1, "t0000", (0,))), Reason.SERVER_LOST, "")
    assert state.apply(Plan(scales=(moved,))).rejected == (
        (1, "STALE_PLAN: server t0000 is LOST: training cannot run on it"),)
    renumbered = ScaleJob(1, (w(0, "t0000", (1,)), w(1, "t0000", (0,))), Reason.SERVER_LOST, "")
    assert state.apply(Plan(scales=(renumbered,))).rejected == ()


def test_the_router_acknowledges_drains_so_loans_begin_without_the_timeout() -> None:
    # Loaned at 300 s (idle 300 s): acknowledged at 301 s, lent and used at once; with no router the
    # loan waits the drain timeout, and the job starts at the next tick (600 s).
    jobs, spec = [linear_job(1, 0.0, 8, 1, 1, 1000.0)], ClusterSpec(0, 1)
    params, demand = PolicyParams(loan_buffer_servers=0), [DemandPoint(0.0, 0)]
    acked = simulate(jobs, demand, spec, "aryl", params, seed=0, check_plans=True)
    assert acked.jobs[0].start == 301.0 and acked.settings["drain_ack_s"] == 1.0
    no_router = simulate(jobs, demand, spec, "aryl", params, seed=0, check_plans=True, drain_ack_s=None)
    assert no_router.jobs[0].start == 600.0 and no_router.settings["drain_ack_s"] == -1.0


def test_failure_schedules_repair_before_failing_again_and_ignore_failures_of_a_down_server() -> None:
    schedule = FailureSchedule([ServerFailure(10.0, "a", 5.0), ServerFailure(12.0, "a", 100.0),
                                ServerFailure(15.0, "a", 1.0)], ["a", "b"], seed=0)
    assert schedule.pop_due(10.0) == [("FAIL", "a")] and schedule.any_down
    assert schedule.pop_due(12.0) == []  # a is down already
    assert schedule.pop_due(15.0) == [("REPAIR", "a"), ("FAIL", "a")]
    assert schedule.pop_due(16.0) == [("REPAIR", "a")] and not schedule.any_down
    with pytest.raises(ValueError, match="no server 'zz'"):
        FailureSchedule([ServerFailure(1.0, "zz", 1.0)], ["a"], seed=0)


def test_the_cli_injects_failures_from_a_trace_or_a_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("name,submit_time,gpus_per_worker,min_workers,max_workers,duration_s\n"
                     "a,0,8,1,1,3000\nb,10,8,1,1,3000\n", encoding="utf-8")
    failures = tmp_path / "failures.csv"
    failures.write_text("time_s,server_id,down_s\n1000,t0000,600\n", encoding="utf-8")
    common = ["run", "--policy", "fifo", "--trace-format", "generic", "--trace", str(trace), "--no-progress",
              "--training-servers", "2", "--inference-servers", "0", "--check"]
    assert cli_main([*common, "--failure-trace", str(failures)]) == 0
    table = capsys.readouterr().out
    assert [line.split()[-1] for line in table.splitlines() if line.startswith(("server failures", "fault evic"))] \
        == ["1", "1"]
    assert cli_main([*common, "--server-mtbf-h", "0.5", "--server-repair-s", "60"]) == 0
    failed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("server failures"))
    assert int(failed.split()[-1]) > 0
    assert cli_main([*common, "--server-mtbf-h", "0"]) == 2
    assert "--server-mtbf-h must be > 0" in capsys.readouterr().err
    failures.write_text("time_s,server_id\n1,t0000\n", encoding="utf-8")
    with pytest.raises(FailureTraceError, match="missing column"):
        load_failure_trace(failures)


# -- the service: liveness only marks; the cycle's plan evicts ------------------------------------------


def test_the_service_marks_a_silent_server_lost_and_its_next_cycle_shrinks_the_job(database_url: str) -> None:
    # Ranks 0 and 2 on x, 1 and 3 on a; GPU 0 of a (rank 1's) has gone unhealthy meanwhile. x falls
    # silent: liveness only marks it; the cycle shrinks the job to ranks 1, 3 -> 0, 1 on a. Renumbered
    # workers keep their GPUs, so the unhealthy one is no new placement and the shrink is not refused.
    clock = ManualClock()
    engine = create_engine_for(database_url)
    try:
        app = SchedulerApp(session_factory(engine), clock)
        app.term.start("test")
        for name in ("a", "x"):
            app.agents.register(ServerRegistration(
                name, Pool.TRAINING, tuple(GpuReport(i, f"GPU-{name}-{i}", "m", 1) for i in range(2)), name, "t"))
        job_id = app.jobs.submit(JobSubmission("elastic", "alice", "default", ("train",), {}, 1, 1, 4)).id
        four = [("x", (0,)), ("a", (0,)), ("x", (1,)), ("a", (1,))]
        assert app.cluster.apply(Plan(starts=(StartJob(job_id, placed(*four), Reason.PLACED, ""),))).started
        clock.advance(31)
        sick = (GpuSample(0, 0.0, 0, 40.0, False, "ECC"), GpuSample(1, 0.0, 0, 40.0, True, ""))
        app.agents.report_status(StatusReport("a", app.term.epoch, sick, 0))

        assert app.liveness.sweep_lost(30.0) == ["x"]
        record, _ = app.jobs.get(job_id)
        assert (record.state, record.num_workers) == ("RUNNING", 4)  # marking touches no job

        report = SchedulingCycle(app.cluster, create_policy("aryl"), clock).run_once()
        assert report.result.rejected == () and report.result.scaled == (job_id,)
        record, events = app.jobs.get(job_id, include_events=True)
        assert (record.state, record.num_workers) == ("RUNNING", 2)
        assert sorted((a.rank, a.server_id, a.gpu_index) for a in record.allocations) == [(0, "a", 0), (1, "a", 1)]
        assert [(e.from_state, e.to_state, e.reason) for e in events if e.kind == "JOB_STATE_CHANGED"][-2:] == [
            ("RUNNING", "SCALING", "SERVER_LOST"), ("SCALING", "RUNNING", "SERVER_LOST")]
        assert app.cluster.snapshot().server("x").allocated == ()
    finally:
        engine.dispose()


def test_preview_reclaim_answers_failed_precondition_under_a_policy_that_does_not_loan(scheduler_factory) -> None:
    scheduler = scheduler_factory(scheduling={"policy": "fifo"})
    channel, stub = scheduler_stub(scheduler.address)
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.PreviewReclaim(scheduler_pb2.PreviewReclaimRequest(servers=1), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "policy 'fifo' does not loan" in details_of(err.value)
    finally:
        channel.close()


def test_the_evicting_cycle_keeps_the_queues_gpu_speeds_and_loan_note() -> None:
    # Queue "vision" has a quota of 2 GPUs and may not borrow. Job 1 (vision) holds 2 GPUs of server a; job 3
    # was on x, now LOST, so this cycle evicts it. Job 2 (vision, 2 GPUs) must still wait for its quota in this
    # cycle: the snapshot the policy sees after the evictions keeps the queues (it was rebuilt without them).
    vision = QueueView("vision", 2, borrow_limit_gpus=0)
    running = dataclasses.replace(job(1, [("a", (0,)), ("a", (1,))], low=2), queue="vision")
    lost = job(3, [("x", (0,))], low=1)
    waiting = dataclasses.replace(pending_job(2, 2), queue="vision")
    snap = dataclasses.replace(snapshot([server("a"), server("x", state=LOST)], [running, lost, waiting]),
                               queues=(vision,), gpu_speed=(("a100", 2.0),), loan_note="none loaned")
    found = evictions(snap)
    assert (found.after.queues, found.after.gpu_speed, found.after.loan_note) == (
        (vision,), (("a100", 2.0),), "none loaned")
    plan = create_policy("aryl", PolicyParams()).schedule(snap)
    assert [p.job_id for p in plan.preemptions] == [3]
    assert plan.starts == ()
    [held] = [p for p in plan.pending if p.job_id == 2]
    assert held.reason == Reason.QUOTA_BORROW_LIMIT  # at its quota, and it may not borrow
