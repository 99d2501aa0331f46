"""Goodput in the live policies (issue 17): ``aryl`` values jobs with a fitted goodput model by it and sends
their batch (``Plan.batches``); ``aryl-nogoodput`` and jobs without goodput data decide exactly as before;
``pollux`` sends batches for jobs with batch limits; and the evaluation section's code on a tiny trace."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from scheduler_service.core.goodput import GradParams, PerfParams, StepSample, pass_time, step_time
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.snapshot import BatchLimits, JobView
from scheduler_service.policies import create_policy
from scheduler_service.policies.aryl import _goodput_scale_in_cost, _Job
from simulator.engine import simulate
from simulator.model import ClusterSpec
from tests.fixtures.traces import traces_dir
from tests.harness import (
    NOW,
    inference_server,
    linear_job,
    pending_job,
    running_job,
    snapshot_of,
    training_server,
)

PERF = PerfParams(alpha_c=0.05, beta_c=0.002, alpha_n=0.2, beta_n=0.01, alpha_r=0.05, beta_r=0.005, gamma=1.5)
LIMITS = BatchLimits(init_bsz=64, max_bsz=8192, max_atomic_bsz=256)


def measured(*configs: tuple[int, int, int]) -> tuple[StepSample, ...]:
    return tuple(StepSample(n, r, b, pass_time(PERF, b), step_time(PERF, n, r, b, 0)) for n, r, b in configs)


SAMPLES = measured((1, 1, 64), (1, 2, 64), (1, 4, 32), (1, 4, 128))


def goodput_job(jid: int, server: str, gpu: int, grad: GradParams | None, *, high: int = 8) -> JobView:
    """A running 1-GPU elastic job (1..high workers) with a linear declared curve and, if ``grad``, goodput
    data: batch limits, step samples and gradient statistics."""
    view = running_job(jid, [(server, (gpu,))], low=1, high=high, runtime=36_000.0)
    view = dataclasses.replace(view, throughput_points=tuple((w, float(w)) for w in range(1, high + 1)),
                               total_work=36_000.0)
    if grad is None:
        return view
    return dataclasses.replace(view, batch_limits=LIMITS, step_samples=SAMPLES, grad_stats=grad)


def sizes(plan, jobs: tuple[JobView, ...]) -> dict[int, int]:
    after = {j.job_id: j.num_workers for j in jobs}
    for s in (*plan.starts, *plan.scales):
        after[s.job_id] = len(s.workers)
    return after


def two_jobs(grad_a: GradParams | None, grad_b: GradParams | None):
    servers = [training_server("a", gpus=8)]
    jobs = (goodput_job(1, "a", 0, grad_a), goodput_job(2, "a", 1, grad_b))
    return snapshot_of(servers, jobs), jobs


def test_aryl_gives_more_workers_to_the_job_whose_goodput_gains_more() -> None:
    # Same declared curves; job 1's gradients are noisy (a larger batch keeps its statistical efficiency,
    # so more GPUs pay off), job 2's are clean (a larger batch is worth nothing: scaling out only splits
    # the initial batch). 6 spare GPUs: aryl gives job 1 more of them.
    snap, jobs = two_jobs(GradParams(1.0, 500.0), GradParams(1.0, 0.0))
    plan = create_policy("aryl").schedule(snap)
    assert check_plan(snap, plan) == []
    got = sizes(plan, jobs)
    assert got[1] > got[2]
    # the declared-only variant sees two equal jobs: job 2 is not given fewer than job 1
    flat = sizes(create_policy("aryl-nogoodput").schedule(snap), jobs)
    assert flat[2] >= flat[1]


def test_aryl_sends_batches_for_jobs_with_limits_only() -> None:
    snap, _ = two_jobs(GradParams(1.0, 50.0), None)
    plan = create_policy("aryl").schedule(snap)
    assert [b.job_id for b in plan.batches] == [1]
    batch = plan.batches[0]
    assert 1 <= batch.atomic_bsz <= LIMITS.max_atomic_bsz and batch.accum_steps >= 0
    assert create_policy("aryl-nogoodput").schedule(snap).batches == ()
    assert create_policy("sjf").schedule(snap).batches == ()


def test_a_job_with_limits_but_no_fit_gets_its_tuned_batch() -> None:
    view = dataclasses.replace(goodput_job(1, "a", 0, None), batch_limits=LIMITS)
    snap = snapshot_of([training_server("a", gpus=1)], [view])
    plan = create_policy("aryl").schedule(snap)
    assert [(b.job_id, b.atomic_bsz, b.accum_steps) for b in plan.batches] == [(1, 64, 0)]


def test_without_goodput_data_aryl_and_aryl_nogoodput_decide_alike() -> None:
    snap, _ = two_jobs(None, None)
    busy = snapshot_of([training_server("a", gpus=8), inference_server("i1"), inference_server("i2")],
                       [goodput_job(1, "a", 0, None), goodput_job(2, "a", 1, None, high=2)], demand=0)
    for s in (snap, busy):
        assert create_policy("aryl").schedule(s) == create_policy("aryl-nogoodput").schedule(s)
    jobs = [linear_job(1, 0.0, 1, 1, 4, 4000.0), linear_job(2, 0.0, 2, 1, 2, 3000.0),
            linear_job(3, 100.0, 1, 2, 6, 2000.0), linear_job(4, 200.0, 4, 1, 1, 1000.0)]
    runs = [simulate(jobs, [], ClusterSpec(2, 1, gpus_per_server=4), p, PolicyParams(), seed=0,
                     cycle_interval_s=60.0, check_plans=True) for p in ("aryl", "aryl-nogoodput")]
    assert [(j.start, j.end, j.scale_outs) for j in runs[0].jobs] == [(j.start, j.end, j.scale_outs)
                                                                    for j in runs[1].jobs]


def test_the_reclaim_cost_of_a_worker_follows_the_goodput_model() -> None:
    params = PolicyParams()
    two = running_job(1, [("i1", (0,)), ("i1", (1,))], low=1, high=8, runtime=36_000.0)
    two = dataclasses.replace(two, throughput_points=tuple((w, float(w)) for w in range(1, 9)), total_work=36_000.0)
    fitted = dataclasses.replace(two, batch_limits=LIMITS, step_samples=SAMPLES, grad_stats=GradParams(1.0, 500.0))
    clean = dataclasses.replace(fitted, grad_stats=GradParams(1.0, 0.0))
    cost = {name: _goodput_scale_in_cost(_Job(v, list(v.workers)), NOW, params, 8)
            for name, v in (("declared", two), ("noisy", fitted), ("clean", clean))}
    assert cost["declared"] == 0.0
    assert cost["noisy"] > cost["clean"] > 0.0
    assert _goodput_scale_in_cost(_Job(fitted, list(fitted.workers)), NOW, params, 0) == 0.0  # nogoodput


def test_pollux_sends_batches_for_jobs_with_limits_and_uses_the_fit() -> None:
    snap, _ = two_jobs(GradParams(1.0, 500.0), None)
    plan = create_policy("pollux").schedule(snap)
    assert check_plan(snap, plan) == []
    assert [b.job_id for b in plan.batches] == [1]


# -- the evaluation section's code ----------------------------------------------------------------


def test_the_goodput_section_runs_on_a_tiny_trace() -> None:
    from evaluation.goodput import figures, goodput_jobs, render, run_goodput, text_of
    from simulator.traces import JobMapping

    data = traces_dir()
    mapping = JobMapping(seed=0, throughput_model="pollux-gputime")
    trace = [dataclasses.replace(linear_job(i, 60.0 * i, 1, 1, 4, 1800.0 * (1 + i % 3)),
                                 throughput=tuple((w, 1.0 if w == 1 else 1.0 + 0.5 * (w - 1)) for w in range(1, 5)))
             for i in range(1, 7)]
    jobs, truths = goodput_jobs(trace, Path(data), mapping)
    assert set(truths) == {j.job_id for j in jobs}
    for j in jobs:  # work in the model's units: the traced time at the requested size with its own batch
        assert j.work / dict(j.throughput)[j.min_workers] == pytest.approx(1800.0 * (1 + j.job_id % 3))
    spec = ClusterSpec(1, 1, gpus_per_server=8)
    policies = ("sjf", "pollux", "aryl-nogoodput", "aryl-nojoint", "aryl-noshrink", "aryl")
    runs = {p: {0: figures(run_goodput(jobs, truths, [], p, seed=0, spec=spec, estimates="lognormal:0.8"),
                           "lognormal:0.8")} for p in policies}
    assert all(r[0]["completed"] == len(jobs) for r in runs.values())
    assert all(r[0]["rejected_actions"] == 0 and r[0]["estimates"] == "lognormal:0.8" for r in runs.values())
    assert runs["aryl"][0]["p95_jct_s"] >= runs["aryl"][0]["avg_jct_s"] * 0.5
    sizes = {0: (len(jobs), len(truths))}
    exact = {0: figures(run_goodput(jobs, truths, [], "aryl", seed=0, spec=spec), "exact")}
    text = render([(1.0, runs, sizes, spec)], exact, 1.0)
    assert "| aryl |" in text and "`aryl` vs `pollux`" in text and "Clairvoyant row" in text
    assert "(what the joint sizing adds)" in text and "(what shrink-to-admit adds)" in text
    # the report is regenerated from summaries.json's raw figures (JSON keys are strings) to the same text
    raw = {"runs": runs, "jobs": sizes, "training_servers": 1, "inference_servers": 1, "wall_s": 1.0,
           "windows": {"1": {"days": 1.0, "jobs": sizes, "training_servers": 1, "inference_servers": 1,
                             "runs": runs}}, "exact": exact}
    assert text_of(json.loads(json.dumps(raw))) == text


def test_the_goodput_cluster_shows_what_a_job_measured() -> None:
    from evaluation.goodput import GoodputCluster, goodput_jobs
    from simulator.clock import VirtualClock
    from simulator.traces import JobMapping

    trace = [linear_job(1, 0.0, 1, 1, 2, 600.0)]
    jobs, truths = goodput_jobs(trace, Path(traces_dir()), JobMapping(seed=0, throughput_model="pollux-gputime"))
    clock = VirtualClock(0.0)
    cluster = GoodputCluster(ClusterSpec(1, 0, gpus_per_server=8), clock, truths)
    cluster.submit(jobs[0])
    before = cluster.snapshot().jobs[0]
    assert before.batch_limits == truths[1].limits and before.step_samples == () and before.grad_stats is None
    plan = create_policy("aryl").schedule(cluster.snapshot())
    cluster.apply(plan)
    after = cluster.snapshot().jobs[0]
    assert len(after.step_samples) == 1 and after.grad_stats is not None
    assert after.step_samples[0].replicas == after.num_workers


def test_pollux_counts_gpus_so_small_jobs_share_a_server_with_a_wide_one() -> None:
    # One 8-GPU worker runs on server a; four 1-GPU jobs wait. Counted in workers of the widest size, server
    # b held one "unit" and only one of them could start; counted in GPUs, all four fit on b.
    servers = [training_server("a", gpus=8), training_server("b", gpus=8)]
    wide = running_job(1, [("a", tuple(range(8)))], low=1, high=1, resized=0.0)
    small = [pending_job(j, gpus=1, workers=1, max_workers=1) for j in (2, 3, 4, 5)]
    snap = snapshot_of(servers, [wide, *small])
    plan = create_policy("pollux").schedule(snap)
    assert check_plan(snap, plan) == []
    assert {s.job_id for s in plan.starts} == {2, 3, 4, 5} and not plan.preemptions
