"""The simulator's evaluation metrics (``simulator.results``) and estimate modes (``simulator.estimates``).

Each metric on a small case computed by hand in the comments: the arrival window, useful work against
allocated GPU time, inference shortfall and the requests met short, preemptions per reclaimed server,
queueing and JCT percentiles. Then the non-clairvoyant runs: the policy sees the declared estimate,
the truth drives completion, and the same seed gives the same output.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from scheduler_service.core.params import PolicyParams
from simulator.cli import main as cli_main
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import SimulationResult, simulate
from simulator.estimates import Estimates, EstimatesError
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.results import format_table, inference_shortfall, summarize, summary_json, useful_work
from tests.harness import linear_job


def run(jobs: list[TraceJob], spec: ClusterSpec, policy: str, *, demand: list[DemandPoint] | None = None,
        params: PolicyParams | None = None, seed: int = 0, **settings) -> SimulationResult:
    return simulate(jobs, demand or [], spec, policy, params or PolicyParams(), seed=seed, check_plans=True,
                    **settings)


# -- the arrival window --------------------------------------------------------------------------------


def test_utilisation_over_the_arrival_window_and_to_the_end() -> None:
    # One 8-GPU server, fifo. Job 1 (1 GPU, 1000 units at 1/s) arrives at 0 and runs 0..1030 (30 s
    # restart); job 2, the same, arrives at 2000 and runs 2000..3030. Arrival window [0, 2000]:
    # 1030 GPU-s of 8 x 2000 = 0.064375. To the end [0, 3030]: 2060 of 8 x 3030 = 0.0849835.
    result = run([linear_job(1, 0.0, 1, 1, 1, 1000.0), linear_job(2, 2000.0, 1, 1, 1, 1000.0)],
                 ClusterSpec(1, 0), "fifo")
    assert [(j.start, j.end) for j in result.jobs] == [(0.0, 1030.0), (2000.0, 3030.0)]
    s = summarize(result)
    assert s["arrival_window"] == {"start_s": 0.0, "end_s": 2000.0}
    assert s["gpu_utilization"]["training"] == s["gpu_utilization"]["overall"] == round(1030 / 16000, 4)
    assert s["gpu_utilization_to_end"]["overall"] == round(2060 / (8 * 3030), 4)
    # Useful: each job's 1000 units at 1 GPU-s per unit (1 GPU / speed 1), made 30..1030 and 2030..3030:
    # 2000 GPU-s in all, 1000 of them in the window (1000 / 16000 = 0.0625); allocated 2060 (the restarts).
    assert s["useful_work"] == {"useful_gpu_hours": round(2000 / 3600, 4), "allocated_gpu_hours": round(2060 / 3600, 4),
                                "useful_fraction": round(2000 / 2060, 4)}
    assert s["useful_utilization"] == {"overall": 0.0625, "training_work": 0.0625}


def test_an_arrival_window_of_one_instant_runs_to_the_end() -> None:
    # Both jobs arrive at 0: the window is [0, end] = [0, 1030], and the server is fully used.
    result = run([linear_job(1, 0.0, 4, 1, 1, 1000.0), linear_job(2, 0.0, 4, 1, 1, 1000.0)], ClusterSpec(1, 0), "fifo")
    s = summarize(result)
    assert s["arrival_window"] == {"start_s": 0.0, "end_s": 1030.0}
    assert s["gpu_utilization"]["overall"] == s["gpu_utilization_to_end"]["overall"] == 1.0


# -- useful work ---------------------------------------------------------------------------------------


def test_useful_work_counts_work_at_the_reference_efficiency_of_a_sub_linear_job() -> None:
    # An elastic 1..2 x 1-GPU job with speed 1.0 at one worker, 1.5 at two, 1500 units, alone on a
    # 2-GPU server: it runs at 2 workers, 30 s restart + 1500 / 1.5 = 1030 s. Allocated: 2 x 1030 =
    # 2060 GPU-s. Useful: 1500 units x (1 GPU / speed 1.0) = 1500 GPU-s (at perfect linear scaling
    # 2 workers would take 750 s: 1500 GPU-s). Fraction 1500 / 2060.
    job = TraceJob(1, "j", 0.0, 1, 1, 2, 1500.0, ((1, 1.0), (2, 1.5)))
    result = run([job], ClusterSpec(1, 0, gpus_per_server=2), "aryl")
    assert (result.jobs[0].end, result.jobs[0].scale_outs) == (1030.0, 0)
    assert result.useful_spans == ((30.0, 1030.0, 1.5),)
    assert result.jobs[0].useful_gpu_s == 1500.0
    s = summarize(result)
    assert s["useful_work"]["useful_fraction"] == round(1500 / 2060, 4)
    # Window [0, 1030] (one arrival instant): useful 1500 of 2 x 1030 GPU-s; allocated 2060 of 2060.
    assert s["useful_utilization"]["overall"] == round(1500 / 2060, 4) and s["gpu_utilization"]["overall"] == 1.0


def reclaim_run() -> SimulationResult:
    # tests/simulator/test_simulator.py's reclaim case: one inference server, demand 0 -> 1 at 2000 s -> 0 at
    # 5000 s (10, 50, 10 requests/s), checkpoints every 1000 s, cycles at least 60 s apart. Loaned at 300 s,
    # active at 360 s (the drain acknowledged at 301 s waits for the gap), an 8-GPU job of 20000 units at 1/s
    # runs on the loan from then, is preempted by the reclaim at 2000 s (back to its checkpoint at 1360 s:
    # 970 units); the simulated agent reports the server vacated at once, which calls for a cycle, so it
    # serves again at 2060 s (the gap); loaned again at 5000 s, active at 5060 s, and the job runs
    # 5060..24120 from its checkpoint. ``aryl-reactive``: loans follow the need now (``aryl``'s forecast
    # would keep the server serving for the hour after the rise it saw: tests/policies/test_demand_forecast.py).
    return run([linear_job(1, 0.0, 8, 1, 1, 20000.0)], ClusterSpec(0, 1), "aryl-reactive",
               demand=[DemandPoint(0.0, 0, 10.0), DemandPoint(2000.0, 1, 50.0), DemandPoint(5000.0, 0, 10.0)],
               params=PolicyParams(loan_buffer_servers=0), checkpoint_interval_s=1000.0, min_cycle_gap_s=60.0)


def test_work_a_preemption_threw_away_is_not_useful() -> None:
    result = reclaim_run()
    assert (result.jobs[0].start, result.jobs[0].end, result.jobs[0].preemptions) == (360.0, 24120.0, 1)
    # Kept: 390..1360 (970 units, to the checkpoint; the 640 units after it were lost) and
    # 5090..24120 (19030 units), at 8 GPU-s per unit (8 GPUs / speed 1).
    assert result.useful_spans == ((390.0, 1360.0, 8.0), (5090.0, 24120.0, 8.0))
    s = summarize(result)
    # Allocated: 8 GPUs over 360..2000 and 5060..24120 = 8 x 20700 = 165600 GPU-s = useful 160000
    # + lost 640 x 8 + restarts 2 x 30 x 8.
    assert s["useful_work"] == {"useful_gpu_hours": round(160000 / 3600, 4),
                                "allocated_gpu_hours": round(165600 / 3600, 4),
                                "useful_fraction": round(160000 / 165600, 4)}
    # One arrival instant: the window is [0, 24120], 8 GPUs. In use: 165600 training + serving 8 GPUs
    # over 2060..5000 (23520) = 189120; useful: 160000 + 23520.
    capacity = 8 * 24120
    assert s["gpu_utilization"]["overall"] == round(189120 / capacity, 4)
    assert s["useful_utilization"] == {"overall": round(183520 / capacity, 4),
                                       "training_work": round(160000 / capacity, 4)}


# -- inference shortfall and reclaims --------------------------------------------------------------------


def test_inference_shortfall_and_preemptions_per_reclaim() -> None:
    s = summarize(reclaim_run())
    # Needed 1 from 2000 s; the server is RECLAIMING until 2060 s: 60 server-seconds short. Requests:
    # 10/s x 2000 + 50/s x 3000 + 10/s x 19120 = 361200, of which 50/s x 60 = 3000 arrived short (all
    # of the needed capacity was missing, so the unserved share is the same).
    assert s["inference_shortfall"] == {"server_s": 60.0, "time_s": 60.0,
                                        "requests_short_share": round(3000 / 361200, 4),
                                        "requests_unserved_share": round(3000 / 361200, 4),
                                        "requests_beyond_cluster_share": 0.0}
    assert (s["reclaims"], s["reclaim_preemptions"], s["reclaim_scale_ins"], s["preemptions_per_reclaim"]) == \
        (1, 1, 0, 1.0)
    # One job, submitted at 0: the arrival window runs to the end, the window's figures are the whole run's.
    assert s["inference_shortfall_window"] == s["inference_shortfall"]
    # Over [0, 2030 s]: 10/s x 2000 + 50/s x 30 = 21500 requests, 50/s x 30 = 1500 of them short.
    window = inference_shortfall(reclaim_run(), start=0.0, end=2030.0)
    assert (window["server_s"], window["time_s"]) == (30.0, 30.0)
    assert window["requests_short_share"] == pytest.approx(1500 / 21500)


def test_shortfall_counts_the_share_of_need_missing_and_no_rate_means_no_share() -> None:
    # Two inference servers, demand 2 from 2000 s; a 16-GPU elastic job (8 base on the training server,
    # 8 extra on a loan) is scaled in when one server is reclaimed at 2000 s: 1 of 2 needed servers
    # short until 2060 s (cycles at least 60 s apart) -> 60 server-seconds. No request rates: no shares.
    job = linear_job(1, 0.0, 1, 8, 16, 160000.0)
    result = run([job], ClusterSpec(1, 2), "aryl", demand=[DemandPoint(0.0, 1), DemandPoint(2000.0, 2)],
                 params=PolicyParams(loan_buffer_servers=0), min_cycle_gap_s=60.0)
    s = summarize(result)
    assert (s["reclaims"], s["reclaim_scale_ins"], s["reclaim_preemptions"], s["preemptions_per_reclaim"]) == \
        (1, 1, 0, 0.0)
    assert s["inference_shortfall"] == {"server_s": 60.0, "time_s": 60.0, "requests_short_share": None,
                                        "requests_unserved_share": None, "requests_beyond_cluster_share": None}


def test_no_reclaims_no_ratio_and_demand_beyond_the_cluster_is_short_and_shown_as_such() -> None:
    # Demand 3 servers of a 1-server inference cluster that never lends: 2 servers short all along. They count
    # (the shortfall is against the unclipped demand), and the share beyond the cluster says no policy could
    # have served them: every request arrived then.
    result = run([linear_job(1, 0.0, 1, 1, 1, 100.0)], ClusterSpec(1, 1), "fifo", demand=[DemandPoint(0.0, 3, 5.0)])
    s = summarize(result)
    assert s["preemptions_per_reclaim"] is None
    short = s["inference_shortfall"]
    assert (short["server_s"], short["time_s"]) == (2 * 130.0, 130.0)
    assert (short["requests_short_share"], short["requests_beyond_cluster_share"]) == (1.0, 1.0)
    assert short["requests_unserved_share"] == round(2 / 3, 4)
    # A point that carries its unclipped need: the router asks for the whole cluster, 4 were wanted.
    clipped = run([linear_job(1, 0.0, 1, 1, 1, 100.0)], ClusterSpec(1, 1), "fifo",
                  demand=[DemandPoint(0.0, 1, 5.0, servers_wanted=4)])
    assert summarize(clipped)["inference_shortfall"]["server_s"] == 3 * 130.0


# -- percentiles -----------------------------------------------------------------------------------------


def test_queueing_and_jct_percentiles() -> None:
    # Five 8-GPU jobs at 0 on one 8-GPU server, fifo, each 30 + 970 = 1000 s: queueing 0, 1000, ...,
    # 4000 s; JCT 1000 ... 5000 s. Linear interpolation between order statistics: p50 at rank 2 (of
    # 0..4), p90 at 3.6, p99 at 3.96.
    result = run([linear_job(i, 0.0, 8, 1, 1, 970.0) for i in range(1, 6)], ClusterSpec(1, 0), "fifo")
    s = summarize(result)
    assert [j.queue_s for j in result.jobs] == [0.0, 1000.0, 2000.0, 3000.0, 4000.0]
    assert (s["median_queue_s"], s["p90_queue_s"], s["p99_queue_s"]) == (2000.0, 3600.0, 3960.0)
    assert (s["median_jct_s"], s["p90_jct_s"], s["p99_jct_s"]) == (3000.0, 4600.0, 4960.0)
    table = format_table({"fifo": s})
    assert "p99 queueing (h)" in table and "useful / allocated" in table
    assert "preemptions / reclaim" not in table  # no reclaims: the optional row is left out


# -- estimates: what the policy sees ---------------------------------------------------------------------


def test_estimate_modes_parse_and_refuse_what_they_do_not_know() -> None:
    assert Estimates.parse("exact") == Estimates() and str(Estimates.parse("none")) == "none"
    assert Estimates.parse("lognormal:0.8") == Estimates("lognormal", 0.8)
    assert str(Estimates.parse("lognormal:0.8")) == "lognormal:0.8"
    for bad in ("lognormal", "lognormal:x", "lognormal:-1", "exact:1", "perfect"):
        with pytest.raises(EstimatesError):
            Estimates.parse(bad)


def test_the_policy_sees_the_declared_estimate_and_the_truth_drives_completion() -> None:
    job = linear_job(1, 0.0, 2, 1, 1, 1000.0)  # 1000 s at its one worker
    mode = Estimates("lognormal", 0.8)
    factor = mode.error_factor(1, seed=7)
    # The factor is exp(0.8 z) for one standard-normal draw from (seed, job id): reproducible, and
    # another seed draws another.
    assert factor == mode.error_factor(1, seed=7) != mode.error_factor(1, seed=8)
    declared = mode.declare(job, seed=7)
    assert (declared.work, declared.declared_work, declared.declared_runtime_s) == (1000.0, 0.0, 1000.0 * factor)
    state = SimulatedCluster(ClusterSpec(1, 0), VirtualClock(0.0))
    state.submit(declared)
    state.submit(Estimates("none").declare(linear_job(2, 0.0, 2, 1, 1, 500.0), seed=7))
    state.submit(linear_job(3, 0.0, 2, 1, 1, 300.0))
    views = state.snapshot().jobs
    assert [(v.total_work, v.estimated_runtime_s) for v in views] == [(0.0, 1000.0 * factor), (0.0, None),
                                                                       (300.0, None)]
    # Completion follows the true work whatever the policy saw.
    for estimates in ("exact", "none", "lognormal:2"):
        result = run([job], ClusterSpec(1, 0), "aryl", estimates=estimates)
        assert (result.jobs[0].end, result.estimates) == (1030.0, estimates)


def sjf_pair() -> list[TraceJob]:
    # Both 8-GPU jobs arrive at 0 on one 8-GPU server; job 2 is the shorter (1000 vs 5000 s).
    return [linear_job(1, 0.0, 8, 1, 1, 5000.0), linear_job(2, 0.0, 8, 1, 1, 1000.0)]


def first_started(result: SimulationResult) -> int:
    return min(result.jobs, key=lambda j: (j.start, j.job_id)).job_id


def test_a_shortest_first_policy_orders_the_queue_by_what_it_sees() -> None:
    # Exact: the shorter job 2 first. No estimate: both look alike (default_runtime_s), so the
    # tie goes to submission order: job 1 first. Noisy: whichever declared the shorter run time.
    assert first_started(run(sjf_pair(), ClusterSpec(1, 0), "aryl")) == 2
    assert first_started(run(sjf_pair(), ClusterSpec(1, 0), "aryl", estimates="none")) == 1
    mode = Estimates("lognormal", 1.5)
    for seed in range(6):
        declared = {j.job_id: j.work * mode.error_factor(j.job_id, seed) for j in sjf_pair()}
        expected = min(declared, key=lambda job_id: declared[job_id])
        assert first_started(run(sjf_pair(), ClusterSpec(1, 0), "aryl", estimates=mode, seed=seed)) == expected
    # The seeds above give both orders, so the estimate (not the truth) decided.
    orders = {min((1, 2), key=lambda i: [5000.0, 1000.0][i - 1] * mode.error_factor(i, s)) for s in range(6)}
    assert orders == {1, 2}


def test_the_same_seed_gives_the_same_output_and_the_estimates_show_in_the_summary() -> None:
    jobs = [linear_job(i, 100.0 * i, 1 + i % 4, 1, 1 + i % 3, 500.0 + 300.0 * (i % 5)) for i in range(1, 13)]
    spec = ClusterSpec(1, 1)
    demand = [DemandPoint(0.0, 0, 1.0), DemandPoint(900.0, 1, 9.0)]

    def output(seed: int) -> str:
        return summary_json({"aryl": summarize(run(jobs, spec, "aryl", demand=demand, seed=seed,
                                                   estimates="lognormal:0.8"))})

    assert output(3) == output(3)
    assert '"estimates": "lognormal:0.8"' in output(3)


def test_the_cli_takes_an_estimates_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_time,gpus_per_worker,min_workers,max_workers,work,throughput\n"
                     "0,1,1,1,100,1:1.0\n", encoding="utf-8")
    out = tmp_path / "out"
    status = cli_main(["run", "--policy", "aryl", "--trace-format", "generic", "--trace", str(trace),
                       "--no-inference-load", "--training-servers", "1", "--inference-servers", "0",
                       "--estimates", "lognormal:0.5", "--out", str(out), "--no-plots", "--no-progress"])
    assert status == 0
    assert '"estimates": "lognormal:0.5"' in (out / "summary.json").read_text(encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        cli_main(["run", "--trace-format", "generic", "--trace", str(trace), "--estimates", "guess"])
    assert exit_.value.code == 2
    assert "lognormal:SIGMA" in capsys.readouterr().err


def test_lognormal_errors_have_the_stated_spread() -> None:
    # Over many jobs, log(factor) has mean ~0 and standard deviation ~sigma.
    mode = Estimates("lognormal", 0.8)
    logs = [math.log(mode.error_factor(i, seed=0)) for i in range(1, 4001)]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
    assert abs(mean) < 0.05 and abs(sd - 0.8) < 0.05


def test_gpu_time_allocated_is_useful_plus_lost_plus_restarts_for_linear_jobs() -> None:
    # With speed = workers (1 unit/s per worker), a unit of work costs g GPU-seconds at any size, so
    # every allocated GPU-second is useful, thrown away by a preemption, or a restart's: on a trace with
    # loans, reclaims, resizes and preemptions the three add up to the allocation, and each completed
    # job's useful GPU-seconds are its work x g.
    rng = random.Random(5)
    jobs = []
    for job_id in range(1, 61):
        low = rng.choice([1, 1, 2])
        high = low * rng.choice([1, 4])
        jobs.append(linear_job(job_id, round(rng.uniform(0, 8 * 3600.0), 1), rng.choice([1, 2, 4, 8]), low, high,
                               round(rng.uniform(300.0, 20000.0), 1)))
    demand = [DemandPoint(3600.0 * h, [0, 2, 1, 0, 2, 2, 0, 1][h % 8], 5.0) for h in range(24)]
    result = run(jobs, ClusterSpec(2, 2), "aryl", demand=demand, params=PolicyParams(loan_buffer_servers=0),
                 checkpoint_interval_s=900.0)
    assert result.stop_reason == "completed"
    assert sum(j.preemptions for j in result.jobs) > 0 and sum(j.scale_ins for j in result.jobs) > 0
    useful = sum(j.useful_gpu_s for j in result.jobs)
    lost = sum(j.gpu_seconds_lost for j in result.jobs)
    figures = useful_work(result)
    assert useful + lost == pytest.approx(figures["allocated_gpu_hours"] * 3600, rel=1e-9)
    assert figures["useful_gpu_hours"] * 3600 == pytest.approx(useful, rel=1e-9)
    for trace, outcome in zip(sorted(jobs, key=lambda j: j.job_id), result.jobs, strict=True):
        assert outcome.useful_gpu_s == pytest.approx(trace.work * trace.gpus_per_worker, rel=1e-9)
