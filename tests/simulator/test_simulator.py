"""The simulator: the service's own cycle over an in-memory cluster with a virtual clock.

Layers: the in-memory applier against hand-made plans (the service's apply semantics); hand-computed
tiny scenarios that must match to the last digit; determinism (byte-identical files, PNGs included);
a golden regression on a small synthetic trace; and the rule that the simulator imports the service's
cycle and policies and branches on nothing.

Golden files live in ``tests/golden/``. After an intended change of behaviour, regenerate them with
``ARYL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/simulator/test_simulator.py -k golden`` and review the diff.
"""

from __future__ import annotations

import ast
import os
import random
import re
from pathlib import Path

import pytest

import scheduler_service.cycle
import scheduler_service.policies
import simulator.engine
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import (
    KeepPending,
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
)
from scheduler_service.core.snapshot import JobView, WorkerView
from scheduler_service.lifecycle import JobState, ServerState
from simulator.cli import main as cli_main
from simulator.cli import parse_params
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import SimulationResult, simulate
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.results import format_table, jobs_csv, summarize, summary_json, write_outputs
from tests.harness import linear_job, placed_on

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
UPDATE_GOLDEN = os.environ.get("ARYL_UPDATE_GOLDEN", "") not in ("", "0")


# -- builders ---------------------------------------------------------------------------------------


def run(jobs: list[TraceJob], spec: ClusterSpec, policy: str, *, demand: list[DemandPoint] | None = None,
        params: PolicyParams | None = None, **settings) -> SimulationResult:
    """Every plan of these runs is checked against the core's invariants (check_plans=True)."""
    return simulate(jobs, demand or [], spec, policy, params or PolicyParams(), seed=0, check_plans=True,
                    **settings)


def synthetic_jobs(count: int, *, seed: int, span_s: float) -> list[TraceJob]:
    """Philly-like shapes (mostly 1-GPU workers, some 2..8), half of them elastic with a sub-linear
    speed-up, log-normal run times."""
    rng = random.Random(seed)
    jobs = []
    for job_id, submit in enumerate(sorted(round(rng.uniform(0, span_s), 1) for _ in range(count)), start=1):
        gpw = rng.choice([1, 1, 1, 2, 4, 8])
        low = rng.choice([1, 1, 1, 2])
        high = low * 4 if rng.random() < 0.5 and gpw < 8 else low
        runtime = round(min(rng.lognormvariate(7.5, 1.2), 40000.0), 1)
        points = tuple((w, round((w / low) ** 0.8, 6)) for w in range(low, high + 1))
        jobs.append(TraceJob(job_id, f"job-{job_id}", submit, gpw, low, high, runtime, points))
    return jobs


def step_demand(hours: int, servers: int) -> list[DemandPoint]:
    """A hand-made daily pattern: low at night, high in the afternoon; one point per hour."""
    pattern = [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0]
    return [DemandPoint(3600.0 * h, min(pattern[h % 24], servers), 10.0 * pattern[h % 24]) for h in range(hours)]


# -- the rule: one engine, two drivers --------------------------------------------------------------


def test_simulator_runs_the_service_cycle_and_policies() -> None:
    assert simulator.engine.SchedulingCycle is scheduler_service.cycle.SchedulingCycle
    assert simulator.engine.create_policy is scheduler_service.policies.create_policy


def test_no_simulation_branches_anywhere() -> None:
    """No name or attribute that says "simulat..." is ever tested by a condition (``if simulate``,
    ``self._simulate``, ``x if simulating else y``) in the simulator or the service. Code only:
    docstrings may say that there is none."""
    files = sorted((REPO / "simulator").glob("*.py")) + sorted((REPO / "scheduler_service").rglob("*.py"))
    assert len(files) > 20
    offenders = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert, ast.comprehension, ast.BoolOp)):
                tests = node.ifs if isinstance(node, ast.comprehension) else \
                    node.values if isinstance(node, ast.BoolOp) else [node.test]
                names = [n.id if isinstance(n, ast.Name) else n.attr for t in tests for n in ast.walk(t)
                         if isinstance(n, (ast.Name, ast.Attribute))]
                # A comprehension has no line of its own (its target has).
                line = node.target.lineno if isinstance(node, ast.comprehension) else node.lineno
                offenders += [f"{path.relative_to(REPO)}:{line}: {name}" for name in names
                              if "simulat" in name.lower()]
            if isinstance(node, ast.Attribute) and re.fullmatch(r"_?(is_)?simulat\w*", node.attr):
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
    assert offenders == []


# -- the in-memory applier has the service's semantics ----------------------------------------------


def cluster(spec: ClusterSpec, *jobs: TraceJob, now: float = 0.0) -> tuple[SimulatedCluster, VirtualClock]:
    clock = VirtualClock(now)
    state = SimulatedCluster(spec, clock)
    for job in jobs:
        state.submit(job)
    return state, clock


def test_a_start_on_a_held_gpu_is_refused_alone() -> None:
    state, _ = cluster(ClusterSpec(1, 0), linear_job(1, 0, 4, 1, 1, 100.0), linear_job(2, 0, 4, 1, 1, 100.0),
                       linear_job(3, 0, 4, 1, 1, 100.0))
    result = state.apply(Plan(starts=(
        StartJob(1, placed_on("t0000", (0, 1, 2, 3)), Reason.PLACED, ""),
        StartJob(2, placed_on("t0000", (2, 3, 4, 5)), Reason.PLACED, ""),  # GPUs 2, 3 are job 1's now
        StartJob(3, placed_on("t0000", (4, 5, 6, 7)), Reason.PLACED, ""),
    )))
    assert result.started == (1, 3)
    assert result.rejected == ((2, "STALE_PLAN: a planned GPU is already held by another worker"),)
    assert result.touched_servers == frozenset({"t0000"})
    by_id = {j.job_id: j for j in state.snapshot().jobs}
    assert by_id[2].state == JobState.PENDING and by_id[1].state == by_id[3].state == JobState.RUNNING


def test_shrinks_free_gpus_before_starts_and_grows_take_them_after() -> None:
    state, clock = cluster(ClusterSpec(1, 0), linear_job(1, 0, 1, 1, 8, 1e6), linear_job(2, 0, 4, 1, 1, 100.0))
    state.apply(Plan(starts=(StartJob(1, placed_on("t0000", *[(g,) for g in range(8)]), Reason.PLACED, ""),)))
    clock.advance_to(100.0)
    # Listed start-first, but applied shrink -> start, as the service applies them.
    result = state.apply(Plan(
        starts=(StartJob(2, placed_on("t0000", (4, 5, 6, 7)), Reason.PLACED, ""),),
        scales=(ScaleJob(1, placed_on("t0000", (0,), (1,), (2,), (3,)), Reason.SCALED_IN_FOR_BASE_DEMAND, ""),),
    ))
    assert result.rejected == ()
    assert result.started == (2,) and result.scaled == (1,)
    snapshot = state.snapshot()
    assert [len(j.workers) for j in snapshot.jobs] == [4, 1]
    assert snapshot.jobs[0].last_resized_at == 100.0 and snapshot.jobs[0].last_checkpoint_at == 100.0


def test_loan_steps_follow_the_loan_cycle_and_reclaim_needs_a_vacated_server() -> None:
    state, clock = cluster(ClusterSpec(0, 1), linear_job(1, 0, 8, 1, 1, 1e6))
    step = lambda kind: ServerAction("i0000", kind, Reason.LOANED_IDLE_SERVER, "")  # noqa: E731
    assert state.apply(Plan(server_actions=(step(LoanStep.ACTIVATE),))).rejected == (
        ("i0000", "STALE_PLAN: server cannot go from SERVING to LOANED"),)
    clock.advance_to(10.0)
    # ACTIVATE goes first, so a plan may lend a server and place workers on it at once.
    result = state.apply(Plan(starts=(StartJob(1, placed_on("i0000", tuple(range(8))), Reason.PLACED, ""),),
                              server_actions=(step(LoanStep.LOAN),)))
    assert result.rejected == ((1, "STALE_PLAN: server i0000 is SERVING: training cannot run on it"),)
    clock.advance_to(20.0)
    result = state.apply(Plan(starts=(StartJob(1, placed_on("i0000", tuple(range(8))), Reason.PLACED, ""),),
                              server_actions=(step(LoanStep.ACTIVATE),)))
    assert result.rejected == () and result.started == (1,)
    server = state.snapshot().servers[0]
    assert (server.state, server.state_since, server.loan_started_at) == (ServerState.LOANED, 20.0, 10.0)
    clock.advance_to(30.0)
    refused = state.apply(Plan(server_actions=(step(LoanStep.RECLAIM),)))
    assert refused.rejected == (("i0000", "STALE_PLAN: server i0000 still runs workers of job(s) 1 after this "
                                          "plan's job actions; RECLAIM needs it vacated"),)
    result = state.apply(Plan(preemptions=(PreemptJob(1, Reason.PREEMPTED_FOR_RECLAIM, "back to inference"),),
                              server_actions=(step(LoanStep.RECLAIM),)))
    assert result.rejected == () and result.preempted == (1,)
    assert result.server_steps == (("i0000", "RECLAIM"),)
    job = state.snapshot().jobs[0]
    assert job.state == JobState.PENDING
    assert job.pending_reason == "PREEMPTED_FOR_RECLAIM: back to inference"
    assert state.apply(Plan(server_actions=(step(LoanStep.RETURN),))).rejected == ()
    server = state.snapshot().servers[0]
    assert (server.state, server.loan_started_at) == (ServerState.SERVING, None)
    assert (state.server_outcomes["i0000"].loans, state.server_outcomes["i0000"].reclaims) == (1, 1)


def test_pending_reasons_are_recorded_for_pending_jobs_only_and_cleared_on_start() -> None:
    state, _ = cluster(ClusterSpec(1, 0), linear_job(1, 0, 8, 1, 1, 10.0), linear_job(2, 0, 8, 1, 1, 10.0))
    state.apply(Plan(starts=(StartJob(1, placed_on("t0000", tuple(range(8))), Reason.PLACED, ""),),
                     pending=(KeepPending(1, Reason.WAITING_FOR_GANG, "stale"),
                              KeepPending(2, Reason.WAITING_FOR_GANG, "needs 8 GPU(s)"))))
    reasons = {j.job_id: j.pending_reason for j in state.snapshot().jobs}
    assert reasons == {1: "", 2: "WAITING_FOR_GANG: needs 8 GPU(s)"}


def test_a_pending_job_cannot_be_scaled_or_preempted() -> None:
    state, _ = cluster(ClusterSpec(1, 0), linear_job(1, 0, 1, 1, 2, 10.0))
    result = state.apply(Plan(scales=(ScaleJob(1, placed_on("t0000", (0,), (1,)), Reason.SCALED_OUT, ""),),
                              preemptions=(PreemptJob(1, Reason.PREEMPTED_FOR_RECLAIM, ""),)))
    assert result.rejected == (
        (1, "STALE_PLAN: job 1 is PENDING, not running: there is nothing to preempt"),
        (1, "STALE_PLAN: job 1 is PENDING, not running: it cannot be resized"),
    )


def test_running_jobs_report_exact_progress_and_checkpoints() -> None:
    state, clock = cluster(ClusterSpec(1, 0), linear_job(1, 0, 2, 1, 4, 1e6))
    state.apply(Plan(starts=(StartJob(1, placed_on("t0000", (0, 1), (2, 3)), Reason.PLACED, ""),)))
    clock.advance_to(4000.0)  # 30 s restart, then 2 units/s; checkpoints at 1800 and 3600
    view = state.snapshot().jobs[0]
    expected = JobView(
        job_id=1, state=JobState.RUNNING, gpus_per_worker=2, min_workers=1, max_workers=4, priority=0,
        submitted_at=0.0, workers=(WorkerView(0, "t0000", (0, 1)), WorkerView(1, "t0000", (2, 3))),
        estimated_runtime_s=None, pending_reason="", throughput_points=((1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)),
        total_work=1e6, work_done=2 * (4000.0 - 30.0), started_at=0.0, last_resized_at=0.0,
        last_checkpoint_at=3600.0,
    )
    assert view == expected
    # A preemption now loses the work since 3600 s: 400 s x 4 GPUs; the job resumes from 3600 s's work.
    state.apply(Plan(preemptions=(PreemptJob(1, Reason.PREEMPTED_FOR_RECLAIM, ""),)))
    view = state.snapshot().jobs[0]
    assert (view.state, view.work_done, view.last_checkpoint_at) == (JobState.PENDING, 2 * 3570.0, 3600.0)
    outcome = state.outcomes[1]
    assert (outcome.lost_work_gpu_s, outcome.overhead_gpu_s, outcome.preemptions) == (400.0 * 4, 30.0 * 4, 1)


# -- hand-computed scenarios ------------------------------------------------------------------------


def test_fifo_runs_two_jobs_back_to_back_on_one_server() -> None:
    # Job 1 starts at 0 and runs 30 s restart + 1000 s; job 2 (arrived at 10) waits for it.
    result = run([linear_job(1, 0.0, 8, 1, 1, 1000.0), linear_job(2, 10.0, 8, 1, 1, 500.0)], ClusterSpec(1, 0), "fifo")
    one, two = result.jobs
    assert (one.start, one.end, one.queue_s, one.jct_s) == (0.0, 1030.0, 0.0, 1030.0)
    assert (two.start, two.end, two.queue_s, two.jct_s) == (1030.0, 1560.0, 1020.0, 1550.0)
    assert (one.gpu_seconds_lost, two.gpu_seconds_lost) == (240.0, 240.0)
    assert result.stop_reason == "completed" and result.end_time == 1560.0 and result.rejected_actions == 0
    summary = summarize(result)
    assert summary["avg_jct_s"] == 1290.0 and summary["avg_queue_s"] == 510.0
    assert summary["gpu_utilization"]["training"] == 1.0  # busy from 0 to the end
    assert summary["jobs_completed"] == 2 and summary["makespan_s"] == 1560.0


def test_an_elastic_job_scales_out_at_the_first_cycle_after_gpus_free_up() -> None:
    # One 8-GPU server. At t=0 (SJF order) a 4-GPU job (done at 1030), a 3-GPU job (done at 2030)
    # and an elastic 1..8 x 1-GPU job with linear speed (8000 units) fill it exactly.
    # The elastic job: 0..1030 at 1 worker -> 1000 units; scale-out to 5 at 1030 (the first cycle
    # after GPUs free up) -> 5 x (2030 - 1060) = 4850; scale-out to 8 at 2030 -> the last 2150 units
    # take 30 + 268.75 s: done at 2328.75.
    result = run([linear_job(1, 0.0, 4, 1, 1, 1000.0), linear_job(2, 0.0, 3, 1, 1, 2000.0),
                  linear_job(3, 0.0, 1, 1, 8, 8000.0)], ClusterSpec(1, 0), "aryl")
    elastic = result.jobs[2]
    assert [j.end for j in result.jobs] == [1030.0, 2030.0, 2328.75]
    assert (elastic.start, elastic.scale_outs, elastic.scale_ins) == (0.0, 2, 0)
    assert elastic.gpu_seconds_lost == 30.0 * (1 + 5 + 8)
    assert result.rejected_actions == 0


def test_an_elastic_job_alone_starts_at_its_full_size() -> None:
    # 8 workers from its first cycle: 30 s restart + 8000 units / 8 units/s.
    result = run([linear_job(1, 0.0, 1, 1, 8, 8000.0)], ClusterSpec(1, 0), "aryl")
    assert (result.jobs[0].end, result.jobs[0].scale_outs) == (1030.0, 0)


def test_loan_then_reclaim_preempts_an_inelastic_job_which_resumes_from_its_checkpoint() -> None:
    # One inference server, demand 0 -> 1 at 2000 s -> 0 at 5000 s; no loan buffer; checkpoints every
    # 1000 s. Loaned at 300 s (idle 300 s), active at 301 s (the router acknowledges the drain after
    # 1 s), when the job starts. Reclaimed at 2000 s: preempted, loses 1669 - 970 = 699 units, i.e.
    # 699 s x 8 GPUs (the checkpoint at 1301 s); serving again at once (the agent reports the server vacated,
    # which calls for a cycle; no cycle gap here). Loaned again at
    # 5000 s, active at 5001 s: resumes from the checkpoint's 970 units, done at 5001 + 30 + 19030.
    # ``aryl-reactive``: loans follow the need now (``aryl``'s forecast would keep the server serving for the
    # hour after the rise it saw: tests/policies/test_demand_forecast.py).
    result = run([linear_job(1, 0.0, 8, 1, 1, 20000.0)], ClusterSpec(0, 1), "aryl-reactive",
                 demand=[DemandPoint(0.0, 0), DemandPoint(2000.0, 1), DemandPoint(5000.0, 0)],
                 params=PolicyParams(loan_buffer_servers=0), checkpoint_interval_s=1000.0)
    job = result.jobs[0]
    assert (job.start, job.end, job.preemptions) == (301.0, 24061.0, 1)
    assert (job.lost_work_gpu_s, job.overhead_gpu_s) == (699.0 * 8, 480.0)
    (server,) = result.servers
    assert (server.loans, server.reclaims) == (2, 1)
    loaned = [(s.time, s.loaned_servers, s.loaned_training_gpus, s.inference_gpus) for s in result.utilisation]
    assert loaned == [(0.0, 0, 0, 0), (301.0, 1, 8, 0), (2000.0, 0, 0, 8), (5000.0, 0, 0, 0), (5001.0, 1, 8, 0),
                      (24061.0, 1, 0, 0)]
    summary = summarize(result)
    assert (summary["loans"], summary["reclaims"], summary["preemptions"]) == (2, 1, 1)


def test_loan_then_reclaim_scales_in_an_elastic_job_without_losing_work() -> None:
    # A training server holds the job's 8 base workers; the loaned inference server (active at 301 s,
    # drain acknowledged) takes 8 extras; the reclaim at 2000 s scales the job back in to 8 (a graceful
    # resize: nothing lost). Work: 8 x 271 + 16 x 1669 = 28872 by 2000 s; the other 131128 at 8/s
    # after 30 s.
    result = run([linear_job(1, 0.0, 1, 8, 16, 160000.0)], ClusterSpec(1, 1), "aryl",
                 demand=[DemandPoint(0.0, 0), DemandPoint(2000.0, 1)], params=PolicyParams(loan_buffer_servers=0))
    job = result.jobs[0]
    assert (job.start, job.end, job.preemptions, job.scale_outs, job.scale_ins) == (0.0, 18421.0, 0, 1, 1)
    assert (job.lost_work_gpu_s, job.overhead_gpu_s) == (0.0, 30.0 * (8 + 16 + 8))
    assert [(s.server_id, s.loans, s.reclaims) for s in result.servers] == [("i0000", 1, 1), ("t0000", 0, 0)]


def test_a_reclaimed_server_serves_again_one_cycle_gap_after_its_reclaim() -> None:
    # As above, with cycles at least 60 s apart and no other event after the demand's rise at 2000 s: the cycle
    # that reclaims (the first the gap allows, 2000 s or after) shrinks the job off the loaned server, whose
    # simulated agent reports it vacated at once; the service's report requests a cycle, so the server serves
    # again 60 s later (the gap), not at the next 300 s tick.
    result = run([linear_job(1, 0.0, 1, 8, 16, 160000.0)], ClusterSpec(1, 1), "aryl-reactive",
                 demand=[DemandPoint(0.0, 0), DemandPoint(2000.0, 1)], params=PolicyParams(loan_buffer_servers=0),
                 min_cycle_gap_s=60.0)
    after = [s for s in result.utilisation if s.time >= 2000.0]
    reclaimed = next(s.time for s in after if s.loaned_training_gpus == 0)
    serving = next(s.time for s in after if s.inference_gpus == 8)
    assert 2000.0 <= reclaimed < 2060.0
    assert serving - reclaimed == 60.0
    assert summarize(result)["inference_shortfall"]["time_s"] == serving - 2000.0


def test_jobs_that_can_never_be_placed_stop_the_run_as_stalled() -> None:
    result = run([linear_job(1, 0.0, 16, 1, 1, 10.0), linear_job(2, 5.0, 1, 1, 1, 10.0)], ClusterSpec(1, 0), "aryl")
    assert result.stop_reason == "stalled"
    assert [j.end for j in result.jobs] == [None, 45.0]
    assert summarize(result)["jobs_completed"] == 1


def test_max_time_stops_the_run_and_reports_unfinished_jobs() -> None:
    result = run([linear_job(1, 0.0, 8, 1, 1, 1000.0), linear_job(2, 5000.0, 8, 1, 1, 10.0)], ClusterSpec(1, 0),
                 "fifo", max_time_s=2000.0)
    assert result.stop_reason == "max_time" and result.end_time == 2000.0
    assert [(j.start, j.end) for j in result.jobs] == [(0.0, 1030.0), (None, None)]


def test_min_cycle_gap_batches_events_into_one_cycle() -> None:
    jobs = [linear_job(i, float(i), 1, 1, 1, 100.0) for i in range(1, 6)]
    eager = run(jobs, ClusterSpec(1, 0), "fifo")
    batched = run(jobs, ClusterSpec(1, 0), "fifo", min_cycle_gap_s=60.0)
    assert [j.start for j in eager.jobs] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [j.start for j in batched.jobs] == [1.0, 61.0, 61.0, 61.0, 61.0]
    assert batched.cycles < eager.cycles


@pytest.mark.parametrize("policy", ["aryl", "aryl-noloan"])
def test_valid_plans_are_applied_in_full_on_traces_with_many_resizes(policy: str) -> None:
    """Every plan passes check_plan and then loses no action to the applier (``run`` checks plans:
    a refusal raises PlanRefusedError), though the policy moves and shrinks elastic jobs onto each
    other's GPUs. On these traces the old job-id order of resizes refused actions in both policies."""
    spec = ClusterSpec(training_servers=2, inference_servers=2, gpus_per_server=8)
    moves = 0
    for seed in (16, 17, 18, 29, 31, 32, 36):
        result = run(synthetic_jobs(60, seed=seed, span_s=8 * 3600.0), spec, policy,
                     demand=step_demand(48, spec.inference_servers), params=PolicyParams(loan_buffer_servers=0))
        assert result.rejected_actions == 0
        moves += sum(j.moves for j in result.jobs)
    assert moves > 0  # resizes to the same size elsewhere: the moves that take GPUs others free


# -- determinism and golden regression --------------------------------------------------------------


def write_generic_trace(path: Path, jobs: list[TraceJob]) -> None:
    lines = ["name,submit_time,gpus_per_worker,min_workers,max_workers,duration_s"]
    lines += [f"{j.name},{j.submit_time},{j.gpus_per_worker},{j.min_workers},{j.max_workers},{j.work}" for j in jobs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_same_inputs_and_seed_give_byte_identical_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    write_generic_trace(trace, synthetic_jobs(40, seed=3, span_s=6 * 3600.0))
    args = ["compare", "--policies", "fifo,aryl", "--trace-format", "generic", "--trace", str(trace),
            "--diurnal", "--training-servers", "3", "--inference-servers", "2", "--seed", "7", "--check",
            "--no-progress"]
    assert cli_main([*args, "--out", str(tmp_path / "one")]) == 0
    first_table = capsys.readouterr().out
    assert cli_main([*args, "--out", str(tmp_path / "two")]) == 0
    assert capsys.readouterr().out == first_table
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == ["jct_cdf.png", "jobs-aryl.csv", "jobs-fifo.csv", "loans.png", "summary.json",
                     "utilization-aryl.csv", "utilization-fifo.csv", "utilization.png"]
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == names
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name


def golden_results() -> list[SimulationResult]:
    jobs = synthetic_jobs(50, seed=11, span_s=12 * 3600.0)
    spec = ClusterSpec(training_servers=3, inference_servers=2, gpus_per_server=8)
    demand = step_demand(72, spec.inference_servers)
    return [run(jobs, spec, policy, demand=demand, params=PolicyParams(loan_buffer_servers=0))
            for policy in ("fifo", "aryl")]


def test_golden_trace_regression(tmp_path: Path) -> None:
    results = golden_results()
    files = {"summary.json": summary_json({r.policy: summarize(r) for r in results})}
    files.update({f"jobs-{r.policy}.csv": jobs_csv(r) for r in results})
    if UPDATE_GOLDEN:
        GOLDEN.mkdir(exist_ok=True)
        for name, text in files.items():
            (GOLDEN / name).write_text(text, encoding="utf-8")
    for name, text in files.items():
        assert (GOLDEN / name).read_text(encoding="utf-8") == text, (
            f"{name} differs from tests/golden/{name}; if the change is intended, regenerate with "
            "ARYL_UPDATE_GOLDEN=1 and review the diff")
    assert all(r.stop_reason == "completed" for r in results)
    assert [r.rejected_actions for r in results] == [0, 0]  # valid plans are applied in full
    aryl = summarize(results[1])
    assert aryl["loans"] > 0 and aryl["scale_outs"] > 0  # the trace exercises loaning and elasticity
    write_outputs(results, tmp_path)  # and the plots render


# -- results and the command line -------------------------------------------------------------------


def test_table_puts_policies_side_by_side_with_ratios_to_the_first() -> None:
    table = format_table({"fifo": {"avg_jct_s": 7200.0, "loans": 0}, "aryl": {"avg_jct_s": 3600.0, "loans": 4}})
    header, _rule, *rows = table.splitlines()
    assert header.split() == ["metric", "fifo", "aryl"]
    assert "avg JCT (h)" in rows[1] and rows[1].split()[-3:] == ["2.00", "1.00", "(x0.50)"]
    assert rows[-6].split()[-2:] == ["0", "4"]  # loans: no ratio to a zero


def test_policy_params_are_validated() -> None:
    params = parse_params(["loan_buffer_servers=2", "starvation-s=60"])
    assert (params.loan_buffer_servers, params.starvation_s) == (2, 60.0)
    for bad, message in [(["nope=1"], "unknown policy parameter"), (["loan_idle_s"], "expected KEY=VALUE"),
                         (["loan_buffer_servers=1.5"], "expected int"), (["min_loan_s=-1"], "must be >= 0")]:
        with pytest.raises(Exception, match=message):
            parse_params(bad)


def test_cli_refuses_unknown_policies_and_params(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    write_generic_trace(trace, [linear_job(1, 0.0, 1, 1, 1, 10.0)])
    common = ["--trace-format", "generic", "--trace", str(trace), "--no-progress"]
    assert cli_main(["run", "--policy", "nope", *common]) == 2
    assert "unknown policy 'nope'" in capsys.readouterr().err
    assert cli_main(["run", *common, "--param", "bogus=1"]) == 2
    assert "unknown policy parameter" in capsys.readouterr().err
    assert cli_main(["run", "--policy", "fifo", *common, "--no-inference-load"]) == 0
    assert "jobs completed" in capsys.readouterr().out


def test_cli_runs_on_a_request_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The Alibaba GenAI trace's shape: a request at 00:05 and two at 00:15 of day 0: 10-minute bins of 1 and 2
    # requests; the larger needs the whole 2-server inference cluster.
    trace, requests = tmp_path / "trace.csv", tmp_path / "requests.csv"
    write_generic_trace(trace, [linear_job(1, 0.0, 1, 1, 1, 10.0)])
    requests.write_text("gmt_create,predict_status\n2024-11-15 00:05:00,SUCCEED\n2024-11-15 00:15:00,SUCCEED\n"
                        "2024-11-15 00:15:30,FAILED\n", encoding="utf-8")
    out = tmp_path / "out"
    assert cli_main(["run", "--policy", "aryl", "--trace-format", "generic", "--trace", str(trace), "--no-progress",
                     "--request-trace", str(requests), "--inference-servers", "2", "--training-servers", "1",
                     "--out", str(out)]) == 0
    assert "jobs completed" in capsys.readouterr().out
    utilisation = (out / "utilization-aryl.csv").read_text(encoding="utf-8").splitlines()
    assert utilisation[1].split(",")[5] == "1"  # servers needed at t = 0: ceil(1 / 2 x 2) = 1
