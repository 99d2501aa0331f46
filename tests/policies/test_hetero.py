"""The heterogeneous job model (``simulator.hetero``) and the policies that decide per GPU type (``sia``,
``gavel``; issue 33), on synthetic profiles of the Sia study's shape generated here (none of the study's
data is in the repository: ``simulator.hetero_gate`` compares with it where it is at hand)."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from scheduler_service.core.gpu_configs import GpuPool, configurations
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.policies.gavel import GavelJob, GavelRound, gavel_allocate, max_sum_throughput
from scheduler_service.policies.sia import SiaJob, SiaParams, _goodput_row, sia_allocate
from simulator.clock import VirtualClock
from simulator.engine import simulate
from simulator.estimates import Estimates
from simulator.goodput_jobs import WorkloadJob
from simulator.hetero import RESTART_S, HeteroCluster, HeteroJob, TypePool, load_typed_app, run_hetero, summary
from simulator.model import ClusterSpec, DemandPoint, TraceJob

POOLS = (TypePool("slow", 3, 4), TypePool("fast", 2, 8))
INFER = TypePool("infer", 2, 4)    # an inference pool of a type of its own (issue 33 item 5)
SPEED = {"slow": 1.0, "fast": 2.5, "infer": 0.6}


def _write(path: Path, header: str, rows: Sequence[Sequence[float]]) -> None:
    path.write_text(header + "\n" + "\n".join(",".join(f"{v:g}" for v in r) for r in rows) + "\n")


def synthetic_traces(root: Path, epochs: int = 100, per_epoch: float = 150.0) -> Path:
    """A ``cifar10``-named model on the types of ``POOLS`` and ``INFER``: step time linear in the local batch,
    slower across nodes, ``SPEED`` times faster on ``fast``; gradient noise that makes larger batches
    less efficient."""
    app = root / "cifar10"
    app.mkdir(parents=True)
    for pool in (*POOLS, INFER):
        f = SPEED[pool.gpu_type]
        per = pool.gpus_per_node
        placements, scal = [], []
        shapes = [(1,), (2,), (4,)] + ([(8,)] if per == 8 else []) + [(per, per)]
        for shape in shapes:
            pid = int("".join(map(str, shape)))
            for bsz in (32, 64, 128):
                sync = 0.0 if sum(shape) == 1 else 0.01 * len(shape) + 0.002 * sum(shape)
                compute = (0.01 + 0.0004 * bsz) / f
                placements.append((pid, bsz, compute + sync, sync))
        for nodes in range(1, pool.nodes + 1):
            for replicas in sorted({nodes, nodes * per // 2, nodes * per}):
                for bsz in (32, 64, 128):
                    sync = 0.0 if replicas == 1 else 0.01 * nodes + 0.002 * replicas
                    scal.append((nodes, replicas, bsz, (0.01 + 0.0004 * bsz) / f + sync, sync))
        _write(app / f"placements-{pool.gpu_type}.csv", "placement,local_bsz,step_time,sync_time", placements)
        _write(app / f"scalability-{pool.gpu_type}.csv", "num_nodes,num_replicas,local_bsz,step_time,sync_time", scal)
    for batch in (128, 256, 512, 1024):
        rows = [((e + 1) * per_epoch, (e + 1) * per_epoch * 128 / batch, 0.5, 1.0, 40.0 / (1 + e / 20))
                for e in range(epochs)]
        _write(app / f"validation-{batch}.csv", "progress,iteration,metric,grad_sqr,grad_var", rows)
    return root


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_traces(tmp_path_factory.mktemp("hetero"))


def _workload(n: int = 12) -> list[WorkloadJob]:
    return [WorkloadJob(f"cifar10-{i}", 30.0 * i, "cifar10", 1 + (i % 3) * 2, 256 * (1 + i % 2)) for i in range(n)]


# -- configurations -------------------------------------------------------------------------------------

def test_configurations_follow_sias_list() -> None:
    four = configurations(GpuPool("t4", 4, tuple(f"s{i}" for i in range(6))))
    assert [(n, g) for _, n, g in four] == [(1, 1), (1, 2), (1, 4), (2, 8), (3, 12), (4, 16), (5, 20), (6, 24)]
    eight = configurations(GpuPool("a100", 8, ("a", "b")))
    assert [(n, g) for _, n, g in eight] == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 16)]


# -- sia's program is exact -----------------------------------------------------------------------------

def _brute_force(jobs: list[SiaJob], pools: tuple[GpuPool, ...], params: SiaParams) -> float:
    configs = [c for p in pools for c in configurations(p)]
    types = [p.gpu_type for p in pools]
    per_node = {p.gpu_type: p.gpus_per_node for p in pools}
    cost = [np.minimum(np.round(np.power(np.array(_goodput_row(j, configs, types, per_node, params)), params.p), 2),
                       3000.0) for j in jobs]
    best = math.inf
    for choice in itertools.product(range(-1, len(configs)), repeat=len(jobs)):
        used = {t: 0 for t in types}
        value = 0.0
        for i, k in enumerate(choice):
            if k < 0:
                value += params.lambda_n
            else:
                used[configs[k][0]] += configs[k][2]
                value += cost[i][k]
        if all(used[p.gpu_type] <= p.gpus for p in pools):
            best = min(best, value)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_sia_program_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pools = (GpuPool("a", 4, ("a0",)), GpuPool("b", 8, ("b0",)))
    jobs = []
    for k in range(3):
        scale = {"a": 1.0, "b": float(rng.uniform(0.5, 3.0))}
        alpha = float(rng.uniform(0.3, 1.0))
        has_b = k != 0  # job 0 has no model on b: bootstrapped

        def goodput(t: str, nodes: int, gpus: int, scale=scale, alpha=alpha, has_b=has_b) -> float | None:
            if t == "b" and not has_b:
                return None
            return scale[t] * gpus ** alpha / nodes ** 0.1

        jobs.append(SiaJob(k, goodput, {"a": 1.0, "b": scale["b"]}, max_gpus=8,
                           current=("a", 1, 2) if k == 1 else None, age_s=900.0, restarts=1, restart_s=30.0))
    params = SiaParams()
    decision = sia_allocate(jobs, pools, params)
    assert decision.objective == pytest.approx(_brute_force(jobs, pools, params), abs=1e-6)


def test_sia_offers_a_job_never_seen_run_one_gpu() -> None:
    pools = (GpuPool("a", 4, ("a0", "a1")),)
    fresh = SiaJob(1, lambda t, n, g: None, {"a": 1.0}, max_gpus=8)
    assert sia_allocate([fresh], pools).configs == {1: ("a", 1, 1)}


def test_sia_keeps_a_job_in_its_restart() -> None:
    pools = (GpuPool("a", 4, ("a0",)),)
    busy = SiaJob(1, lambda t, n, g: float(g), {"a": 1.0}, max_gpus=4, current=("a", 1, 1), in_restart=True)
    other = SiaJob(2, lambda t, n, g: float(g), {"a": 1.0}, max_gpus=4)
    configs = sia_allocate([busy, other], pools).configs
    assert configs[1] == ("a", 1, 1)


# -- gavel ----------------------------------------------------------------------------------------------

def test_gavel_puts_throughput_where_it_is_largest() -> None:
    pools = (GpuPool("slow", 4, ("s0",)), GpuPool("fast", 4, ("f0",)))
    jobs = [GavelJob(1, 4, {"slow": 1.0, "fast": 3.0}, {}), GavelJob(2, 4, {"slow": 1.0, "fast": 1.2}, {})]
    x = max_sum_throughput(jobs, pools)
    assert x[0, 1] == pytest.approx(1.0) and x[1, 0] == pytest.approx(1.0)
    round_ = GavelRound({j.key: j for j in jobs}, {"slow": 0.0, "fast": 0.0})
    assert gavel_allocate(round_, [1, 2], pools) == {1: "fast", 2: "slow"}


# -- the job model ------------------------------------------------------------------------------------

def test_restart_only_on_a_new_type_or_shape(traces: Path) -> None:
    apps = {p.gpu_type: load_typed_app(traces, "cifar10", p.gpu_type) for p in POOLS}
    job = HeteroJob(0, WorkloadJob("cifar10-0", 0.0, "cifar10", 2, 256), apps, tuned=True)
    assert job.reallocate("slow", (2,), 0.0) and job.restart_left == RESTART_S["cifar10"] and job.restarts == 0
    assert not job.reallocate("slow", (2,), 60.0)   # other nodes, same shape: no restart
    assert job.reallocate("fast", (2,), 120.0) and job.restarts == 1
    job.advance(120.0, 50.0)
    assert job.progress == 0.0 and job.restart_left == 0.0   # the restart delay: no progress
    job.advance(170.0, 60.0)
    assert job.progress > 0 and "fast" in job.perf and "slow" not in job.perf


def test_the_fast_type_runs_faster(traces: Path) -> None:
    apps = {p.gpu_type: load_typed_app(traces, "cifar10", p.gpu_type) for p in POOLS}
    done = {}
    for gpu_type in ("slow", "fast"):
        job = HeteroJob(0, WorkloadJob("cifar10-0", 0.0, "cifar10", 1, 256), apps, tuned=False)
        job.reallocate(gpu_type, (1,), 0.0)
        job.advance(0.0, 10 * 86400.0)
        done[gpu_type] = job.completion_time
    assert done["fast"] is not None and done["slow"] is not None and done["fast"] < done["slow"]


@pytest.mark.parametrize("policy", ["sia", "gavel"])
def test_runs_complete_and_are_pinned(traces: Path, policy: str) -> None:
    result = run_hetero(_workload(), traces, policy, pools=POOLS, check_plans=True)
    assert len(result.jcts) == 12
    again = run_hetero(_workload(), traces, policy, pools=POOLS)
    assert again.jcts == result.jcts  # deterministic
    pinned = {"sia": PINNED_SIA, "gavel": PINNED_GAVEL}[policy]
    assert result.average_jct == pytest.approx(pinned, rel=1e-6)


PINNED_SIA = 722.9166666666666    # seconds; moves only when the model or a policy changes
PINNED_GAVEL = 973.1666666666666


@pytest.mark.parametrize("policy", ["sia", "gavel"])
def test_live_policies_run_on_a_typed_cluster(policy: str) -> None:
    """The registered policies on a plain engine run (declared speeds per type, no job model of theirs)."""
    spec = ClusterSpec(4, 0, 4, training_gpu_types=(("t4", 2), ("a100", 2)), gpu_speed=(("a100", 2.0),))
    jobs = [TraceJob(i + 1, f"j{i}", 30.0 * i, 1, 1, 4, work=3600.0 * (1 + i % 3),
                     throughput=((1, 1.0), (2, 1.8), (4, 3.0))) for i in range(6)]
    result = simulate(jobs, [], spec, policy, PolicyParams(), seed=0, cycle_interval_s=60.0, check_plans=True)
    assert result.stop_reason == "completed" and all(j.end is not None for j in result.jobs)


def test_gavel_shares_a_type_evenly_between_equal_jobs() -> None:
    """The central optimum, as Gavel's interior-point solver returns it, not a vertex."""
    jobs = [GavelJob(i, 4, {"a100": 3.0}, {}) for i in range(4)]
    x = max_sum_throughput(jobs, (GpuPool("a100", 8, ("a",)),))
    assert x[:, 0] == pytest.approx([0.5] * 4, abs=1e-5)


def test_a_swap_of_types_is_done_in_two_cycles_at_one_instant() -> None:
    """Two running jobs that trade GPU types: a plan cannot apply a swap, so one is stopped to move
    (``PREEMPTED_TO_MOVE``) and the engine's next cycle, at the same instant, starts it there."""
    from scheduler_service.core.gpu_configs import plan_configurations
    from scheduler_service.core.invariants import check_plan
    from scheduler_service.core.plan import Reason
    from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView, WorkerView
    from scheduler_service.lifecycle import JobState, Pool, ServerState

    servers = (ServerView("a", Pool.TRAINING, ServerState.TRAINING, (0, 1), allocated=((0, 1), (1, 1)), gpu_type="x"),
               ServerView("b", Pool.TRAINING, ServerState.TRAINING, (0, 1), allocated=((0, 2), (1, 2)), gpu_type="y"))
    jobs = tuple(JobView(k, JobState.RUNNING, 1, 1, 2, 0, 0.0, workers=(WorkerView(0, s, (0,)), WorkerView(1, s, (1,))),
                         last_resized_at=0.0) for k, s in ((1, "a"), (2, "b")))
    snapshot = ClusterSnapshot(now=100.0, servers=servers, jobs=jobs)
    plan = plan_configurations(snapshot, jobs, {1: ("y", 1, 2), 2: ("x", 1, 2)}, who="t", why_waiting="w",
                               why_preempted="p")
    assert check_plan(snapshot, plan) == []
    assert [p.reason for p in plan.preemptions] == [Reason.PREEMPTED_TO_MOVE]
    assert len(plan.scales) == 1


def test_the_gate_says_how_to_get_the_artifact(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from simulator import hetero_gate

    monkeypatch.delenv("SIA_REF_GIT", raising=False)
    assert hetero_gate.main([]) == 2
    assert "SIA_REF_GIT=" in capsys.readouterr().err


def test_the_gate_reads_the_authors_figures(tmp_path: Path) -> None:
    from simulator.hetero_gate import authors_figures

    (tmp_path / "summary.json").write_text('{"jcts": {}, "avgs": {"workload-2": 2575.15}, "mean": 2575.15}')
    (tmp_path / "simulator-stdout.log").write_text(
        "Total time (CPU seconds):       0.00   (Wallclock seconds):       0.02\n"
        "Total time (CPU seconds):       0.10   (Wallclock seconds):       0.18\n")
    figures = authors_figures(tmp_path)
    assert figures["avg_jct_s"] == 2575.15 and figures["solve_mean_ms"] == pytest.approx(100.0)


def test_aryl_sim_runs_the_hetero_job_model(traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simulator.cli import main

    workload = tmp_path / "workload.csv"
    workload.write_text("name,time,application,num_replicas,batch_size\n" + "".join(
        f"{j.name},{j.submit_time},{j.application},{j.num_replicas},{j.batch_size}\n" for j in _workload(4)))
    assert main(["compare", "--policies", "sia,gavel", "--job-model", "hetero", "--trace-format", "pollux",
                 "--trace", str(workload), "--profiles-dir", str(traces), "--gpu-pools", "slow:3x4,fast:2x8",
                 "--check"]) == 0
    table = capsys.readouterr().out
    assert "avg_jct_s" in table and "gavel" in table


# -- an inference pool of its own type (issue 33 item 5) ------------------------------------------------

def _demand(needed: int, until: float = 86400.0) -> list[DemandPoint]:
    return [DemandPoint(0.0, needed), DemandPoint(until, needed)]


@pytest.mark.parametrize("policy", ["aryl", "aryl-noloan", "sia", "gavel"])
def test_only_a_loaning_policy_trains_on_the_inference_type(traces: Path, policy: str) -> None:
    result = run_hetero(_workload(), traces, policy, pools=POOLS, inference=INFER, demand=_demand(0),
                        estimates="lognormal:0.8", seed=1, check_plans=True)
    assert len(result.jcts) == 12
    loaned = result.gpu_seconds_by_type.get("infer", 0.0)
    if policy == "aryl":
        assert result.loans > 0 and loaned > 0   # nothing needed for inference: aryl lends, jobs run on it
    else:
        assert result.loans == 0 and loaned == 0


def test_no_loan_while_inference_needs_the_whole_pool(traces: Path) -> None:
    result = run_hetero(_workload(), traces, "aryl", pools=POOLS, inference=INFER, demand=_demand(INFER.nodes),
                        estimates="lognormal:0.8", seed=0)
    assert len(result.jcts) == 12 and result.loans == 0 and "infer" not in result.gpu_seconds_by_type


def test_jobs_are_declared_with_user_estimates(traces: Path) -> None:
    apps = {p.gpu_type: load_typed_app(traces, "cifar10", p.gpu_type) for p in (*POOLS, INFER)}
    jobs = [HeteroJob(i, w, apps, tuned=True) for i, w in enumerate(_workload(4))]
    cluster = HeteroCluster(POOLS, jobs, VirtualClock(0.0), interval_s=60.0, inference=INFER)
    assert cluster.spec.inference_servers == 2 and cluster.spec.inference_gpu_type == "infer"
    assert cluster.reference_pool() == TypePool("fast", 2, 8)
    exact = cluster.trace_jobs(Estimates.parse("exact"))
    noisy = cluster.trace_jobs(Estimates.parse("lognormal:0.8"), seed=3)
    for e, n, job in zip(exact, noisy, jobs, strict=True):
        assert e.declared_work == pytest.approx(job.total_progress()) and math.isinf(e.work)
        speeds = [v for _, v in e.throughput]
        assert all(v > 0 for v in speeds) and [n for n, _ in e.throughput][:3] == [1, 2, 4]
        truth = job.total_progress() / speeds[0]
        assert n.declared_runtime_s == pytest.approx(truth * Estimates.parse("lognormal:0.8").error_factor(
            n.job_id, 3))
    assert cluster.trace_jobs() == cluster.trace_jobs(None, seed=5)   # sia, gavel: nothing declared


def test_an_inference_pool_needs_a_type_of_its_own(traces: Path) -> None:
    with pytest.raises(ValueError, match="training pool"):
        HeteroCluster(POOLS, [], VirtualClock(0.0), interval_s=60.0, inference=TypePool("slow", 1, 4))


# -- what aryl is told: the truth of a job's length and progress, its speeds per type (2026-11-30) ---------

def test_the_declared_curve_is_the_job_run_alone(traces: Path) -> None:
    apps = {p.gpu_type: load_typed_app(traces, "cifar10", p.gpu_type) for p in (*POOLS, INFER)}
    spec = _workload(1)[0]
    job = HeteroJob(0, spec, apps, tuned=True)
    pool = POOLS[1]   # fast, 2 x 8
    for gpus, placement in ((1, (1,)), (8, (8,)), (12, (8, 4))):
        alone = HeteroJob(0, spec, apps, tuned=True)
        alone.reallocate(pool.gpu_type, placement, 0.0)
        now = 0.0
        while alone.completion_time is None:
            alone.advance(now, 60.0)
            now += 60.0
        assert alone.completion_time is not None and alone.completion_time > RESTART_S["cifar10"]
        # the whole run's progress over its run time, the first start's delay included
        assert job.declared_rate(pool, gpus) == pytest.approx(job.total_progress() / alone.completion_time)
    # the one-GPU point is the true one-GPU run time an estimate starts from
    told = HeteroCluster(POOLS, [job], VirtualClock(0.0), interval_s=60.0).trace_jobs(Estimates.parse("exact"))[0]
    assert told.declared_work is not None
    assert told.declared_work / told.throughput[0][1] == pytest.approx(
        job.total_progress() / job.declared_rate(HeteroCluster(POOLS, [], VirtualClock(0.0), interval_s=60.0)
                                                 .reference_pool(), 1))


def test_a_policy_sees_the_progress_a_job_truly_made(traces: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, float]] = []
    original = HeteroCluster.snapshot

    def watched(self: HeteroCluster, seed: int = 0) -> ClusterSnapshot:
        snap = original(self, seed)
        seen.extend((view.work_done, self.hetero[view.job_id].progress) for view in snap.jobs)
        return snap

    monkeypatch.setattr(HeteroCluster, "snapshot", watched)
    result = run_hetero(_workload(3), traces, "aryl", pools=POOLS, estimates="lognormal:0.8", seed=2)
    assert len(result.jcts) == 3 and any(true > 0 for _, true in seen)
    assert all(shown == true for shown, true in seen)


def test_profiled_speeds_are_shown_on_every_type_from_arrival(traces: Path) -> None:
    apps = {p.gpu_type: load_typed_app(traces, "cifar10", p.gpu_type) for p in POOLS}
    jobs = [HeteroJob(i, w, apps, tuned=True) for i, w in enumerate(_workload(2))]
    profiled = HeteroCluster(POOLS, jobs, VirtualClock(0.0), interval_s=60.0, gpu_speed={"slow": 1.0, "fast": 2.0},
                             profiled=True)
    for trace in profiled.trace_jobs(Estimates.parse("exact")):
        profiled.submit(trace)
    views = profiled.snapshot().jobs
    assert [dict(v.type_speeds) for v in views] == [{t: apps[t].one_gpu_speed for t in ("fast", "slow")}] * 2
    measured = HeteroCluster(POOLS, jobs, VirtualClock(0.0), interval_s=60.0, gpu_speed={"slow": 1.0, "fast": 2.0})
    for trace in measured.trace_jobs(Estimates.parse("exact")):
        measured.submit(trace)
    assert all(v.type_speeds == () for v in measured.snapshot().jobs)   # nothing run, nothing measured


def test_the_gate_finds_the_authors_finished_runs(tmp_path: Path) -> None:
    from simulator.hetero_gate import authors_folder

    assert authors_folder("sia", "saturn/workload-2", tmp_path) is None
    (tmp_path / "sia-saturn-workload-2").mkdir()      # a run under way: no summary yet
    assert authors_folder("sia", "saturn/workload-2", tmp_path) is None
    (tmp_path / "out-sia-saturn-workload-2").mkdir()  # as the harness's examples name it, finished
    (tmp_path / "out-sia-saturn-workload-2" / "summary.json").write_text("{}")
    assert authors_folder("sia", "saturn/workload-2", tmp_path) == tmp_path / "out-sia-saturn-workload-2"


@pytest.mark.parametrize("policy", ["sia", "gavel"])
def test_a_scheduler_without_scipy_refuses_sia_and_gavel_at_start_with_the_fix(policy: str) -> None:
    # Their programs are solved with scipy's HiGHS: without scipy the service must stop at start, naming the
    # extra that has it, rather than fail every cycle once jobs arrive (a fresh interpreter where scipy is missing).
    code = ("import sys; sys.modules['scipy'] = None\n"
            "from scheduler_service.policies import create_policy\n"
            f"create_policy({policy!r})\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode != 0
    assert f"ValueError: policy {policy!r} solves with scipy" in out.stderr
    assert "pip install 'aryl[scheduler]'" in out.stderr and "scheduling.policy" in out.stderr


def test_the_summary_breaks_jct_and_first_wait_down_by_model(traces: Path) -> None:
    """Each job's first wait is from its submission to its first start; on a cluster with GPUs free, that is the
    time to the round's end where it arrives (60 s rounds: a job submitted at 30 s starts at 60 s). The summary's
    figures per model are its jobs' means."""
    result = run_hetero(_workload(6), traces, "aryl", pools=POOLS)
    assert set(result.models.values()) == {"cifar10"} and len(result.models) == 6
    for i in range(5):  # the sixth finds every GPU taken and waits for some to free
        submitted = 30.0 * i
        assert result.first_waits[f"cifar10-{i}"] == math.ceil(submitted / 60.0) * 60.0 - submitted
    assert result.first_waits["cifar10-5"] > 0.0
    figures = summary(result)["by_model"]
    assert figures == {"cifar10": {"jobs": 6, "avg_jct_s": round(sum(result.jcts.values()) / 6, 1),
                                   "avg_first_wait_s": round(sum(result.first_waits.values()) / 6, 1)}}
