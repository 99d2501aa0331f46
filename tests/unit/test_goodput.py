"""The goodput job model (``core.goodput``), the measured profiles and tick simulation built on it
(``simulator.goodput_profiles``, ``simulator.goodput_sim``), and the ``tiresias`` and ``optimus`` policies:
their pure decisions, and the registered policies on hand-built snapshots. The full reproduction of the
Pollux study's figures is ``test_pollux_reproduction.py``."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from scheduler_service.core.goodput import (
    BatchSplit,
    GradParams,
    PerfParams,
    StepSample,
    best_batch_size,
    efficiency,
    efficiency_gain,
    fit_perf_params,
    geometric_candidates,
    goodput,
    network_time,
    pass_time,
    progress_rate,
    split_batch,
    step_time,
    throughput,
)
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.most_free import place_most_free
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Reason, unorderable
from scheduler_service.lifecycle import JobState
from scheduler_service.policies import create_policy
from scheduler_service.policies.optimus import OptimusJob, optimus_allocate, optimus_place
from scheduler_service.policies.tiresias import (
    QUEUE_THRESHOLD_GPU_S,
    TiresiasJob,
    TiresiasState,
    tiresias_decide,
)
from simulator.cli import main as cli_main
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import simulate
from simulator.goodput_cluster import allocation_of
from simulator.goodput_jobs import placement_of
from simulator.goodput_policies import AuthorsRules, plan_for_allocations
from simulator.goodput_profiles import load_application, normalise_placement
from simulator.goodput_sim import SimJob, WorkloadJob, load_workload, run_workload
from simulator.model import ClusterSpec
from tests.fixtures.traces import traces_dir
from tests.harness import NOW, linear_job, pending_job, running_job, snapshot_of, training_server

PERF = PerfParams(alpha_c=0.02, beta_c=0.001, alpha_n=0.05, beta_n=0.004, alpha_r=0.01, beta_r=0.001, gamma=2.0)


# -- core.goodput --------------------------------------------------------------------------------------


def test_efficiency_is_one_at_the_initial_batch_and_falls_as_the_batch_grows() -> None:
    grad = GradParams(sqr=1.0, var=4.0)  # noise scale 4 x B0
    assert efficiency(grad, 128, 128) == pytest.approx(1.0)
    values = [efficiency(grad, 128, b) for b in (128, 256, 512, 1024, 4096)]
    assert all(a > b for a, b in itertools.pairwise(values))
    # (var + sqr) / (var / s + sqr) / s at s = 4: 5 / 2 / 4
    assert efficiency(grad, 128, 512) == pytest.approx(5 / 2 / 4)


def test_noise_dominated_gradients_scale_linearly_and_noiseless_ones_not_at_all() -> None:
    assert efficiency_gain(GradParams(sqr=1e-9, var=1.0), 100, 800) == pytest.approx(8.0, rel=1e-6)
    assert efficiency_gain(GradParams(sqr=1.0, var=0.0), 100, 800) == pytest.approx(1.0)
    assert efficiency_gain(GradParams(sqr=0.0, var=0.0), 100, 800) == 1.0  # nothing measured yet


def test_network_time_takes_the_slowest_link() -> None:
    assert network_time(PERF, 1, 1) == pytest.approx(0.0, abs=1e-7)
    assert network_time(PERF, 1, 4) == pytest.approx(0.01 + 0.001 * 2)
    assert network_time(PERF, 2, 8) == pytest.approx(0.05 + 0.004 * 6)


def test_step_time_overlaps_the_last_pass_with_the_all_reduce_as_a_gamma_norm() -> None:
    sequential = PerfParams(0.02, 0.001, 0.05, 0.004, 0.01, 0.001, 1.0)
    overlapped = PerfParams(0.02, 0.001, 0.05, 0.004, 0.01, 0.001, 10.0)
    t_pass, t_net = 0.02 + 0.001 * 64, 0.05 + 0.004 * 6
    assert step_time(sequential, 2, 8, 64, 0) == pytest.approx(t_pass + t_net)
    assert step_time(overlapped, 2, 8, 64, 0) == pytest.approx(max(t_pass, t_net), rel=0.08)
    # each accumulation pass adds a plain pass
    assert step_time(PERF, 2, 8, 64, 3) - step_time(PERF, 2, 8, 64, 0) == pytest.approx(3 * t_pass)
    assert throughput(PERF, 2, 8, 64, 3) == pytest.approx(8 * 64 * 4 / step_time(PERF, 2, 8, 64, 3))


def test_goodput_is_throughput_times_efficiency_and_the_progress_rate_is_per_initial_batch() -> None:
    grad = GradParams(sqr=1.0, var=4.0)
    value = goodput(PERF, grad, 128, 2, 8, 64, 0)
    assert value == pytest.approx(throughput(PERF, 2, 8, 64, 0) * efficiency(grad, 128, 512))
    rate = progress_rate(efficiency_gain(grad, 128, 512), step_time(PERF, 2, 8, 64, 0))
    assert rate == pytest.approx(value / 128)


def test_a_batch_is_split_into_passes_that_fit_the_gpu() -> None:
    assert split_batch(2048, 6, 1024) == BatchSplit(342, 0)           # ceil(2048 / 6)
    assert split_batch(2048, 16, 1024) == BatchSplit(128, 0)          # exact despite float division
    assert split_batch(4096, 2, 1024) == BatchSplit(1024, 1)          # two passes of 1024
    assert split_batch(256, 1, 1024, init_bsz=128) == BatchSplit(128, 1)  # one GPU above B0: two passes
    assert split_batch(128, 1, 1024, init_bsz=128) == BatchSplit(128, 0)
    # 4096 over 3 GPUs rounds up to 2 x 683 each = 4098 > 4096: the atomic batch is cut
    assert split_batch(4096, 3, 1024, max_batch_size=4096) == BatchSplit(682, 1)
    assert split_batch(4096, 3, 1024, max_batch_size=4096).total(3) <= 4096


def test_the_batch_size_optimiser_takes_the_best_candidate_within_the_limits() -> None:
    for grad in (GradParams(1.0, 0.1), GradParams(1.0, 50.0), GradParams(1e-6, 1.0)):
        for nodes, replicas in ((1, 1), (1, 4), (3, 12)):
            choice = best_batch_size(PERF, grad, 128, nodes, replicas, max_batch_size=4096,
                                     atomic_bsz_range=(32, 512))
            brute = 0.0
            for b in geometric_candidates(max(128, 32 * replicas), 4096):
                split = split_batch(b, replicas, 512, init_bsz=128)
                if 32 <= split.atomic_bsz <= 512:
                    brute = max(brute, goodput(PERF, grad, 128, nodes, replicas, split.atomic_bsz,
                                               split.accum_steps))
            assert choice.goodput == pytest.approx(brute)
            assert 32 <= choice.split.atomic_bsz <= 512
    # little noise: stay near B0; much noise: large batches pay
    quiet = best_batch_size(PERF, GradParams(1.0, 0.1), 128, 1, 4, max_batch_size=4096, atomic_bsz_range=(32, 512))
    noisy = best_batch_size(PERF, GradParams(1e-6, 1.0), 128, 1, 4, max_batch_size=4096, atomic_bsz_range=(32, 512))
    assert quiet.split.total(4) < noisy.split.total(4)


def test_geometric_candidates_span_both_ends() -> None:
    values = geometric_candidates(128, 4096)
    assert len(values) == 50 and values[0] == 128 and values[-1] == 4096
    assert values[1] / values[0] == pytest.approx(values[-1] / values[-2])


def test_fitting_recovers_the_step_time_parameters_from_exact_measurements() -> None:
    true = PerfParams(0.02, 0.0008, 0.06, 0.003, 0.012, 0.0015, 2.5)
    shapes = [(1, 1), (1, 2), (1, 4), (2, 4), (2, 8), (3, 12), (4, 16)]
    samples = [StepSample(n, r, b, pass_time(true, b), step_time(true, n, r, b, 0))
               for n, r in shapes for b in (32, 64, 128)]
    fitted = fit_perf_params(samples)
    for n, r in [*shapes, (8, 32)]:  # (8, 32): beyond the measurements
        assert step_time(fitted, n, r, 96, 2) == pytest.approx(step_time(true, n, r, 96, 2), rel=1e-3)


def test_fitting_fixes_what_the_measurements_cannot_tell() -> None:
    true = PerfParams(0.02, 0.0008, 0.06, 0.003, 0.012, 0.0015, 2.5)
    one_node = [StepSample(1, r, 64, pass_time(true, 64), step_time(true, 1, r, 64, 0)) for r in (1, 2, 4)]
    fitted = fit_perf_params(one_node)
    assert fitted.alpha_c == pytest.approx(pass_time(true, 64) / 2)      # one atomic batch size only
    assert fitted.alpha_n >= 1.1 * fitted.alpha_r and fitted.beta_n >= 1.1 * fitted.beta_r  # no network seen
    assert step_time(fitted, 1, 4, 64, 0) == pytest.approx(step_time(true, 1, 4, 64, 0), rel=0.02)
    single = fit_perf_params([StepSample(1, 1, 64, 0.05, 0.05)])
    assert (single.alpha_r, single.beta_r) == (1e-8, 1e-8)
    with pytest.raises(ValueError, match="no samples"):
        fit_perf_params([])


# -- tiresias ------------------------------------------------------------------------------------------


def test_tiresias_runs_whole_gangs_in_queue_order_and_lets_smaller_jobs_skip_ahead() -> None:
    jobs = [TiresiasJob(1, 6), TiresiasJob(2, 4), TiresiasJob(3, 2)]
    state, run = tiresias_decide(TiresiasState(), jobs, 60.0, 8)
    assert run == [1, 3]  # job 2 does not fit behind job 1; job 3 does
    assert state.queue0 == (1, 2, 3) and state.queue1 == ()


def test_tiresias_demotes_a_job_past_the_threshold_and_preempts_it_for_queue_0() -> None:
    big = TiresiasJob(1, 8)
    state, run = tiresias_decide(TiresiasState(), [big], 60.0, 8)
    assert run == [1]
    hours = QUEUE_THRESHOLD_GPU_S / 8  # seconds until 8 GPUs reach the threshold
    state, run = tiresias_decide(state, [big], 60.0 + hours - 60, 8)
    assert state.queue1 == () and run == [1]
    state, run = tiresias_decide(state, [big, TiresiasJob(2, 4)], 60.0 + hours, 8)
    assert state.queue0 == (2,) and state.queue1 == (1,)
    assert run == [2]  # the demoted job no longer fits behind the new one: preempted
    assert state.executed_s[1] == pytest.approx(hours)
    state, run = tiresias_decide(state, [big], 120.0 + hours, 8)  # job 2 done
    assert run == [1] and state.executed_s[1] == pytest.approx(hours)  # no service while it waited


def test_place_most_free_takes_the_emptiest_server_first() -> None:
    free = {0: 2, 1: 4, 2: 4}
    assert place_most_free(free, 6) == [1, 1, 1, 1, 2, 2]
    assert free == {0: 2, 1: 0, 2: 2}
    with pytest.raises(ValueError, match="only 4 free"):
        place_most_free(free, 5)


# -- optimus -------------------------------------------------------------------------------------------


def test_optimus_gives_each_job_one_gpu_then_the_greatest_marginal_gains() -> None:
    def job(key: int, remaining: float, serial: float, max_gpus: int = 64) -> OptimusJob:
        return OptimusJob(key, max_gpus, remaining, lambda n: serial + (1 - serial) / n)

    count = optimus_allocate([job(1, 100.0, 0.0), job(2, 100.0, 0.5), job(3, 1000.0, 0.0, max_gpus=2)], 6)
    # gains for a 2nd GPU: job 3 (10x the work) 500, job 1 50, job 2 (half serial) 25. Job 3 takes one and
    # reaches its cap; job 1 takes one (its 3rd would gain 16.7); job 2 takes the last (25)
    assert count == {1: 2, 2: 2, 3: 2}
    assert optimus_allocate([job(1, 1.0, 0.0), job(2, 1.0, 0.0), job(3, 1.0, 0.0)], 2) == {1: 1, 2: 1, 3: 0}
    # ties go to the earlier job
    assert optimus_allocate([job(1, 1.0, 0.0), job(2, 1.0, 0.0)], 3) == {1: 2, 2: 1}


def test_optimus_place_keeps_unchanged_jobs_where_they_are() -> None:
    placed = optimus_place({1: 2, 2: 3, 3: 0}, {1: [1, 1], 2: [0, 0], 3: [2]}, {0: 4, 1: 4, 2: 4})
    assert placed[1] == [1, 1]                    # same count: kept
    assert sorted(placed) == [1, 2]               # job 3 has none
    assert placed[2] == [0, 0, 0]                 # most free first: node 0 (4) ties node 2 (4), 0 first


# -- the registered policies on snapshots --------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiresias", "optimus"])
def test_the_registered_policies_make_valid_plans(name: str) -> None:
    servers = [training_server("a"), training_server("b")]
    jobs = [running_job(1, [("a", (0,)), ("a", (1,))], low=2, resized=NOW - 600),
            pending_job(2, gpus=1, workers=4), pending_job(3, gpus=1, workers=1, max_workers=4)]
    snap = snapshot_of(servers, jobs)
    plan = create_policy(name).schedule(snap)
    assert check_plan(snap, plan) == []
    started = {s.job_id for s in plan.starts}
    assert started, plan
    placed = sum(len(s.workers) for s in plan.starts) + sum(len(s.workers) for s in plan.scales)
    assert placed <= 8


def test_registered_tiresias_preempts_a_job_past_the_threshold_for_a_new_one() -> None:
    servers = [training_server("a")]
    # 4 GPUs for 5 h: 20 GPU-hours, past the 16 GPU-hour threshold
    old = running_job(1, [("a", (0, 1, 2, 3))], low=1, resized=NOW - 5 * 3600)
    new = pending_job(2, gpus=4, workers=1)
    snap = snapshot_of(servers, [old, new])
    plan = create_policy("tiresias").schedule(snap)
    assert check_plan(snap, plan) == []
    assert [(p.job_id, p.reason) for p in plan.preemptions] == [(1, Reason.PREEMPTED_BY_POLICY)]
    assert [s.job_id for s in plan.starts] == [2]
    young = snapshot_of(servers, [running_job(1, [("a", (0, 1, 2, 3))], low=1, resized=NOW - 3600), new])
    plan = create_policy("tiresias").schedule(young)
    assert plan.preemptions == () and plan.starts == ()
    assert [(p.job_id, p.reason) for p in plan.pending] == [(2, Reason.WAITING_FOR_GANG)]
    assert young.jobs[0].state == JobState.RUNNING


@pytest.mark.parametrize("name", ["tiresias", "optimus"])
def test_the_registered_policies_run_a_trace_in_the_simulator_with_valid_plans(name: str) -> None:
    # 2 servers x 4 GPUs; gangs of 1-2 workers of 1-4 GPUs, some elastic, arriving together and later
    jobs = [linear_job(1, 0.0, 4, 1, 1, 4000.0), linear_job(2, 0.0, 1, 2, 6, 3000.0),
            linear_job(3, 100.0, 2, 1, 2, 2000.0), linear_job(4, 200.0, 1, 1, 4, 1000.0),
            linear_job(5, 300.0, 4, 2, 2, 1500.0)]
    result = simulate(jobs, [], ClusterSpec(2, 0, gpus_per_server=4), name, PolicyParams(), seed=0,
                      cycle_interval_s=60.0, check_plans=True)
    assert result.stop_reason == "completed" and result.rejected_actions == 0
    assert all(job.end is not None for job in result.jobs)


def test_registered_tiresias_keeps_a_demoted_job_in_queue_1_once_it_is_preempted() -> None:
    # Two 4-GPU jobs of 6 h on one 4-GPU server: the first is demoted at 16 GPU-hours (4 h) and preempted
    # for the second, which is demoted 4 h later and gives way to the first (earlier in queue 1). Had a
    # preempted job counted as never served, each would preempt the other every cycle, losing the work
    # since its checkpoint each time, and neither would finish.
    jobs = [linear_job(1, 0.0, 4, 1, 1, 6 * 3600.0), linear_job(2, 10.0, 4, 1, 1, 6 * 3600.0)]
    result = simulate(jobs, [], ClusterSpec(1, 0, gpus_per_server=4), "tiresias", PolicyParams(), seed=0,
                      cycle_interval_s=60.0, max_time_s=30 * 3600.0, check_plans=True)
    assert result.stop_reason == "completed"
    assert [job.preemptions for job in result.jobs] == [1, 1]


# -- measured profiles and the simulated job (need the Pollux data) -------------------------------------


def test_placements_are_normalised_to_their_smallest_rotation() -> None:
    assert normalise_placement((4, 2, 0, 4)) == (2, 4, 4)
    assert normalise_placement((1, 3)) == (1, 3) and normalise_placement((3, 1)) == (1, 3)
    assert placement_of([5, 5, 2, 2, 2, 7]) == (2, 3, 1)


def test_a_profile_reads_the_measured_step_times_and_limits() -> None:
    app = load_application(traces_dir(), "cifar10")
    assert (app.init_batch_size, app.max_batch_size, app.min_atomic_bsz, app.max_atomic_bsz) == (128, 4096, 32, 1024)
    assert load_application(traces_dir(), "yolov3").max_atomic_bsz == 8
    step, sync = app.step_times((4,), 128)
    assert 0 < sync < step
    assert app.step_times((2, 4, 4), 128) == app.step_times((4, 4, 2), 128)   # measured, rotated
    far_step, _ = app.step_times((4,) * 12, 128)                              # interpolated (scalability)
    assert math.isfinite(far_step) and far_step > step
    assert app.gain(128, 0) == pytest.approx(1.0)
    assert 1.0 < app.gain(1024, 50) < 8.0


def test_a_simulated_job_completes_after_its_last_epoch_at_the_profiles_speed() -> None:
    app = load_application(traces_dir(), "bert")  # 2 epochs
    job = SimJob(0, WorkloadJob("bert-0", 0.0, "bert", 1, 12), app)
    job.reallocate((1,), 30.0)
    step, _ = app.step_times((1,), job.atomic_bsz)
    seconds = sum(app.epoch_end(e) - (app.epoch_end(e - 1) if e else 0.0) for e in range(2)) * step
    t = 0.0
    while job.completion_time is None:
        job.advance(t, 60.0)
        t += 60.0
    assert job.completion_time == pytest.approx(30.0 + seconds, abs=2.0)  # 30 s restart, whole seconds per epoch
    assert job.attained_gpu_s == pytest.approx(job.completion_time)


def test_aryl_sim_runs_a_pollux_workload_under_the_goodput_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    traces = traces_dir()
    workload = traces.parent / "workloads" / "workload-6.csv"
    common = ["--job-model", "goodput", "--trace-format", "pollux", "--trace", str(workload), "--profiles-dir",
              str(traces), "--limit", "12", "--training-servers", "4", "--inference-servers", "0",
              "--gpus-per-server", "4", "--cycle-interval", "60"]
    assert cli_main(["compare", "--policies", "tiresias,optimus", *common, "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["metric", "tiresias", "optimus"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["tiresias"]["jobs"] == 12 and summary["optimus"]["nodes"] == 4
    assert summary["tiresias"]["avg_jct_s"] == pytest.approx(sum(summary["tiresias"]["jcts_s"].values()) / 12)
    assert cli_main(["run", "--policy", "aryl", *common]) == 2
    assert "runs the policies tiresias, optimus" in capsys.readouterr().err


def test_the_goodput_job_model_reads_param_or_refuses_it(capsys: pytest.CaptureFixture[str]) -> None:
    traces = traces_dir()
    workload = load_workload(traces.parent / "workloads" / "workload-6.csv")[:6]
    with pytest.raises(ValueError, match="reads no policy parameters"):
        run_workload(workload, traces, "pollux", nodes=2, gpus_per_node=4, params=PolicyParams())
    # aryl-noloan reads them: one extra worker at most per job (max_extra_options) changes its run.
    one = run_workload(workload, traces, "aryl-noloan", nodes=2, gpus_per_node=4, until_s=7200.0,
                       params=PolicyParams(max_extra_options=1))
    default = run_workload(workload, traces, "aryl-noloan", nodes=2, gpus_per_node=4, until_s=7200.0)
    assert one.jcts != default.jcts
    common = ["--job-model", "goodput", "--trace-format", "pollux", "--trace",
              str(traces.parent / "workloads" / "workload-6.csv"), "--profiles-dir", str(traces), "--limit", "4",
              "--training-servers", "2", "--inference-servers", "0", "--gpus-per-server", "4"]
    assert cli_main(["run", "--policy", "pollux", "--param", "restart_cost_s=10", *common]) == 2
    assert "--param is read by sjf, aryl-noloan" in capsys.readouterr().err


# -- the authors' rules as plans (simulator.goodput_policies) --------------------------------------------


class _Decided:
    """A decider that decides ``allocations`` whatever it is shown."""

    def __init__(self, allocations: dict[int, list[int]]) -> None:
        self.allocations = allocations

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        return self.allocations


def test_a_swap_the_authors_rules_decide_is_applied_in_two_plans_at_one_instant() -> None:
    # Two full 2-GPU nodes, job 1 on n0 and job 2 on n1, swapped by the decision: as two resizes no order
    # applies them (each takes GPUs the other still holds), so one job is preempted and then started again.
    cluster = SimulatedCluster(ClusterSpec(2, 0, gpus_per_server=2), VirtualClock(0.0),
                               training_server_ids=["n0", "n1"])
    for job_id in (1, 2):
        cluster.submit(linear_job(job_id, 0.0, 1, 1, 4, 1e9))
    # Stand-ins for the authors' jobs (SimJob): the rules read only their index.
    first = AuthorsRules("test", _Decided({1: [0, 0], 2: [1, 1]}),
                         [SimpleNamespace(index=k) for k in (1, 2)])  # type: ignore[misc]
    assert cluster.apply(first.schedule(cluster.snapshot())).started == (1, 2)
    swapped = {1: [1, 1], 2: [0, 0]}
    snapshot = cluster.snapshot()
    held = {j.job_id: [(w.server_id, g) for w in j.workers for g in w.gpu_indices] for j in snapshot.jobs}
    assert len(unorderable(plan_for_allocations(snapshot, swapped, "test"), held)) == 2
    rules = AuthorsRules("test", _Decided(swapped), [SimpleNamespace(index=k) for k in (1, 2)])  # type: ignore[misc]
    one = cluster.apply(rules.schedule(snapshot))
    assert (one.preempted, one.scaled, one.rejected) == ((1,), (2,), ())
    assert rules.follow_up_due(snapshot.now)
    two = cluster.apply(rules.schedule(cluster.snapshot()))
    assert (two.started, two.rejected) == ((1,), ()) and not rules.follow_up_due(snapshot.now)
    assert {j.job_id: allocation_of(j.workers) for j in cluster.snapshot().jobs} == swapped
