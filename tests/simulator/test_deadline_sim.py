"""Deadlines in the simulator: trace deadlines reach the policy's view (on the snapshot's clock), the
deadline completion rate in the results, the seeded rule that assigns deadlines, and ``--deadlines``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan, Reason, StartJob
from simulator.cli import main as cli_main
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.deadlines import assign_deadlines
from simulator.engine import simulate
from simulator.model import ClusterSpec
from simulator.results import format_table, summarize
from simulator.traces import _keyed_uniform
from tests.harness import linear_job, placed_on


def test_a_trace_deadline_reaches_the_job_view_pending_and_running() -> None:
    clock = VirtualClock(0.0)
    state = SimulatedCluster(ClusterSpec(1, 0), clock)
    state.submit(replace(linear_job(1, 0.0, 1, 1, 2, 100.0), deadline=500.0))
    state.submit(linear_job(2, 0.0, 1, 1, 1, 100.0))
    assert [j.deadline for j in state.snapshot().jobs] == [500.0, None]
    state.apply(Plan(starts=(StartJob(1, placed_on("t0000", (0,)), Reason.PLACED, ""),)))
    clock.advance_to(50.0)
    assert [j.deadline for j in state.snapshot().jobs] == [500.0, None]


# -- the completion rate ------------------------------------------------------------------------------


def test_the_deadline_completion_rate_counts_met_over_jobs_with_a_deadline() -> None:
    # One 8-GPU server, fifo, one job at a time: job 1 ends at 30 + 1000 = 1030 s (deadline 1100: met),
    # job 2 at 1030 + 30 + 500 = 1560 s (deadline 1500: missed), job 3 at 2090 s (no deadline).
    jobs = [replace(linear_job(1, 0.0, 8, 1, 1, 1000.0), deadline=1100.0),
            replace(linear_job(2, 10.0, 8, 1, 1, 500.0), deadline=1500.0), linear_job(3, 20.0, 8, 1, 1, 500.0)]
    result = simulate(jobs, [], ClusterSpec(1, 0), "fifo", PolicyParams(), seed=0, check_plans=True)
    assert [(j.end, j.met_deadline) for j in result.jobs] == [(1030.0, True), (1560.0, False), (2090.0, None)]
    summary = summarize(result)
    assert (summary["jobs_with_deadline"], summary["deadlines_met"], summary["deadline_completion_rate"]) == (2, 1, 0.5)
    assert "deadlines met (rate)" in format_table({"fifo": summary})
    # A job still running when the run stops has missed its deadline.
    cut = simulate(jobs, [], ClusterSpec(1, 0), "fifo", PolicyParams(), seed=0, max_time_s=1200.0)
    assert summarize(cut)["deadline_completion_rate"] == 0.5 and cut.jobs[1].end is None
    # Without deadlines nothing is added: summaries and tables of such runs are as before.
    plain = summarize(simulate([replace(j, deadline=None) for j in jobs], [], ClusterSpec(1, 0), "fifo",
                               PolicyParams(), seed=0))
    assert "deadline_completion_rate" not in plain and "deadlines met" not in format_table({"fifo": plain})


# -- the seeded rule ----------------------------------------------------------------------------------


def test_assigned_deadlines_follow_the_keyed_rule_per_job() -> None:
    jobs = [linear_job(k, 10.0 * k, 1, 2, 4, 100.0 * k) for k in range(1, 21)]  # at 2 workers: 50 k s
    tight, loose = assign_deadlines(jobs, "tight", seed=3), assign_deadlines(jobs, "loose", seed=3)
    for job, t, lo in zip(jobs, tight, loose, strict=True):
        u, runtime = _keyed_uniform(3, "deadline", job.name), job.work / 2
        assert t.deadline == job.submit_time + (1.0 + u) * runtime  # U(1, 2) x the run time
        assert lo.deadline == job.submit_time + (2.0 + 2.0 * u) * runtime  # U(2, 4)
        assert runtime <= t.deadline - job.submit_time < 2 * runtime <= lo.deadline - job.submit_time < 4 * runtime
    # Keyed: a job's deadline does not depend on the other jobs, and another seed draws anew.
    assert assign_deadlines(jobs[5:], "tight", seed=3) == tight[5:]
    assert assign_deadlines(jobs, "tight", seed=4) != tight
    with pytest.raises(ValueError, match="unknown deadline setting"):
        assign_deadlines(jobs, "medium", seed=3)


def test_aryl_sim_deadlines_option_is_reproducible(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    rows = ["name,submit_time,gpus_per_worker,min_workers,max_workers,duration_s"]
    rows += [f"j{k},{60.0 * k},1,1,{1 + k % 3},{300.0 + 97.0 * (k % 7)}" for k in range(24)]
    trace.write_text("\n".join(rows) + "\n", encoding="utf-8")
    args = ["compare", "--policies", "sjf,qos,aryl", "--trace-format", "generic", "--trace", str(trace),
            "--training-servers", "1", "--inference-servers", "1", "--gpus-per-server", "4", "--seed", "5",
            "--deadlines", "tight", "--check", "--no-progress", "--no-plots"]
    assert cli_main([*args, "--out", str(tmp_path / "one")]) == 0
    table = capsys.readouterr().out
    assert cli_main([*args, "--out", str(tmp_path / "two")]) == 0
    assert capsys.readouterr().out == table and "deadlines met (rate)" in table
    one, two = ((tmp_path / d / "summary.json").read_text() for d in ("one", "two"))
    assert one == two
    summaries = json.loads(one)
    assert {s["jobs_with_deadline"] for s in summaries.values()} == {24}
    assert cli_main([*args[:-5], "--deadlines", "none", "--no-progress"]) == 0
    assert "deadlines met" not in capsys.readouterr().out
