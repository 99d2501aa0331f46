"""The ``dl2`` policy: its encoding, its action loop's invariants, the weights file, training (warm-up and RL on
a tiny trace) and online learning (``policies/dl2*.py``, ``simulator/dl2_train.py``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.policies import create_policy
from scheduler_service.policies.dl2 import Decision, Dl2Policy, Greedy, create_dl2, decide
from scheduler_service.policies.dl2_model import (
    BUNDLED_MODEL,
    ENCODING_VERSION,
    GLOBAL_FEATURES,
    JOB_FEATURES,
    JOB_SLOTS,
    STOP,
    ModelFileError,
    input_size,
    load_network,
    random_network,
    save_network,
)
from simulator.model import ClusterSpec, TraceJob
from tests.harness import NOW, pending_job, running_job, snapshot_of, training_server

try:
    import torch  # noqa: F401

    HAVE_TORCH = True
except ModuleNotFoundError:
    HAVE_TORCH = False
# Under CI the dev extra installs torch (CPU build): missing there is a failure, not a skip.
needs_torch = pytest.mark.skipif(not HAVE_TORCH and os.environ.get("CI") != "true",
                                 reason="PyTorch is not installed (pip install -e '.[dev]' brings the CPU build)")


# -- the encoding --------------------------------------------------------------------------------------


def test_a_job_set_encodes_to_the_expected_vector() -> None:
    # 8 GPUs; job 1 runs 2 workers (1..4, 1 GPU each, speed = workers, 3600 units of work left), job 2 waits
    # (a 2 x 2-GPU gang); slot order is arrival order (job 2 was submitted first).
    servers = [training_server("a"), training_server("b")]
    run = replace(running_job(1, [("a", (0,)), ("a", (1,))], low=1, high=4, resized=NOW - 900),
                  submitted_at=NOW - 600, throughput_points=((1, 1.0), (2, 2.0), (4, 4.0)), total_work=7200.0,
                  work_done=3600.0)
    wait = pending_job(2, gpus=2, workers=2, submitted=NOW - 3600, runtime=1800.0)
    decision = Decision(snapshot_of(servers, [run, wait]), PolicyParams())
    x = decision.observation()
    assert x.shape == (input_size(),) and x.dtype == np.float32
    slots = x[: JOB_SLOTS * JOB_FEATURES].reshape(JOB_SLOTS, JOB_FEATURES)

    def lg(v: float, top: float = 64.0) -> float:
        return math.log2(1 + v) / math.log2(1 + top)

    def share(v: float) -> float:  # a share of the cluster's 8 GPUs, log-scaled
        return lg(64 * v / 8)

    def mins(s: float) -> float:
        return math.log1p(s / 60) / math.log1p(14400)

    # Row 0: job 2, pending, no workers: a 2-GPU worker is half a 4-GPU server; its gang (4 GPUs) is half the
    # cluster; gain and saving are 1; remaining 1800 s at its 2 workers; its unit (4 GPUs) over 6 free.
    expected_wait = [1, 0, 0.5, share(4), share(4), 0, 0, 1, 1, 1, mins(1800), mins(3600), 4 / 6, 0, 0, 0]
    # Row 1: job 1, running 2 of 4: next worker x1.5 speed; 3600 left at 2/s = 1800 s, at 3/s 1200 s: saves
    # 600 s, a third of it; its unit is 1 GPU of 6 free; second by arrival.
    expected_run = [1, 1, 0.25, share(1), share(4), share(2), 0.5, 0.5, 1 / 3, mins(600), mins(1800), mins(600),
                    1 / 6, 0, 0, 1 / JOB_SLOTS]
    np.testing.assert_allclose(slots[0], expected_wait, rtol=1e-6)
    np.testing.assert_allclose(slots[1], expected_run, rtol=1e-6)
    assert not slots[2:].any()  # empty rows are zeros
    # free share (6 of 8); the largest free block (server b's 4) / a server's 4; demand: 5 GPUs at min_workers
    # over 8; no job unseen; 2 of 32 rows used.
    np.testing.assert_allclose(x[-GLOBAL_FEATURES:], [6 / 8, 1.0, lg(5 / 8, 16), 0.0, 2 / JOB_SLOTS], rtol=1e-6)
    # Legal: add to both, remove only from the running one; not stop, while job 2's gang fits.
    legal = decision.mask()
    assert set(np.flatnonzero(legal)) == {0, 1, JOB_SLOTS + 1}
    # Adding the gang of job 2 updates its slot (and the free GPUs) in place.
    assert decision.apply(0)
    after = decision.observation()
    assert after[: JOB_FEATURES][5] == pytest.approx(share(4)) and after[: JOB_FEATURES][13] == 1.0
    assert after[-GLOBAL_FEATURES] == pytest.approx(2 / 8)
    assert after[JOB_FEATURES + 12] == pytest.approx(1 / 2)  # job 1's unit over the 2 GPUs still free
    assert set(np.flatnonzero(decision.mask())) == {1, STOP}  # removals are over once something was added
    # A job resized within policy.min_resize_interval_s (300 s) keeps its size: neither add nor remove.
    fresh = Decision(snapshot_of(servers, [replace(run, last_resized_at=NOW - 60), wait]), PolicyParams())
    assert set(np.flatnonzero(fresh.mask())) == {0}


def _observations(seed: int, batch: int = 6, present: int = 20) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.random((batch, input_size())).astype(np.float32)
    rows = x[:, : JOB_SLOTS * JOB_FEATURES].reshape(batch, JOB_SLOTS, JOB_FEATURES)
    rows[:, present:] = 0.0  # empty rows
    rows[:, :present, 0] = 1.0
    return x


def _permuted(x: np.ndarray, order: np.ndarray) -> np.ndarray:
    rows = x[:, : JOB_SLOTS * JOB_FEATURES].reshape(len(x), JOB_SLOTS, JOB_FEATURES)[:, order]
    return np.concatenate([rows.reshape(len(x), -1), x[:, JOB_SLOTS * JOB_FEATURES:]], axis=1)


@pytest.mark.parametrize("seed", range(3))
def test_permuting_the_jobs_permutes_the_logits(seed: int) -> None:
    # One shared per-job network and order-free pooling: the rows' order means nothing. Every row of the
    # permutation moves (present and empty rows alike); add and remove logits follow their job, stop and
    # the value do not change.
    network = random_network(seed=seed)
    x = _observations(seed)
    order = np.random.default_rng(seed + 100).permutation(JOB_SLOTS)
    logits, values = network.forward_batch(x)
    moved, moved_values = network.forward_batch(_permuted(x, order))
    np.testing.assert_allclose(moved[:, :JOB_SLOTS], logits[:, order], atol=1e-5)
    np.testing.assert_allclose(moved[:, JOB_SLOTS:STOP], logits[:, JOB_SLOTS + order], atol=1e-5)
    np.testing.assert_allclose(moved[:, STOP], logits[:, STOP], atol=1e-5)
    np.testing.assert_allclose(moved_values, values, atol=1e-5)
    one, value = network.forward(x[0])  # the live path is the batch's first row
    np.testing.assert_allclose(one, logits[0], atol=1e-6)
    assert value == pytest.approx(float(values[0]), abs=1e-6)


def test_an_empty_row_changes_nothing_the_jobs_see() -> None:
    # Empty rows are left out of the pooling: more empty rows (fewer jobs in the cluster) never shift the
    # logits of the jobs that are there.
    network = random_network(seed=4)
    x = _observations(4, present=5)
    noisy = x.copy()
    rows = noisy[:, : JOB_SLOTS * JOB_FEATURES].reshape(len(x), JOB_SLOTS, JOB_FEATURES)
    rows[:, 5:, 1:] = 0.7  # junk in the empty rows' other features: still absent (present = 0)
    a, _ = network.forward_batch(x)
    b, _ = network.forward_batch(noisy)
    np.testing.assert_allclose(a[:, :5], b[:, :5], atol=1e-6)
    np.testing.assert_allclose(a[:, STOP], b[:, STOP], atol=1e-6)


@needs_torch
def test_the_torch_twin_computes_the_numpy_network() -> None:
    import torch

    from scheduler_service.policies.dl2_model import POLICY_ARRAYS, from_torch, policy_parameters, torch_network

    network = random_network(seed=5)
    x = _observations(5)
    module = torch_network(network)
    logits, values = module(torch.from_numpy(x))
    want_logits, want_values = network.forward_batch(x)
    np.testing.assert_allclose(logits.detach().numpy(), want_logits, atol=1e-5)
    np.testing.assert_allclose(values.detach().numpy(), want_values, atol=1e-5)
    assert len(policy_parameters(module)) == len(POLICY_ARRAYS)
    back = from_torch(module, network.meta)
    assert all(np.array_equal(a, b) for a, b in zip(back.arrays().values(), network.arrays().values(), strict=True))


def test_features_are_relative_to_the_cluster() -> None:
    # The same jobs on 2 x 4 GPUs and, twice as wide, on 2 x 8 GPUs with twice the GPUs per worker: every
    # feature matches, so the network sees the same state.
    def observe(gpus_per_server: int) -> np.ndarray:
        k = gpus_per_server // 4
        servers = [training_server("a", gpus=gpus_per_server), training_server("b", gpus=gpus_per_server)]
        run = replace(running_job(1, [("a", tuple(range(k))), ("a", tuple(range(k, 2 * k)))], low=1, high=4,
                                  resized=NOW - 900),
                      submitted_at=NOW - 600, throughput_points=((1, 1.0), (2, 2.0), (4, 4.0)), total_work=7200.0,
                      work_done=3600.0)
        wait = pending_job(2, gpus=2 * k, workers=2, submitted=NOW - 3600, runtime=1800.0)
        return Decision(snapshot_of(servers, [run, wait]), PolicyParams()).observation()

    np.testing.assert_allclose(observe(4), observe(8), rtol=1e-6)


# -- the action loop keeps the invariants ---------------------------------------------------------------


class RandomLegal:
    """Picks uniformly among the legal actions, stop included (a worst-case network)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def choose(self, observation: np.ndarray, legal: np.ndarray, logits: np.ndarray) -> int:
        options = np.flatnonzero(legal)
        # stop rarely, so that loops run long
        return int(self.rng.choice(options[options != STOP])) if len(options) > 1 and self.rng.random() < 0.95 \
            else STOP

    def cycle_done(self, decision: object) -> None:
        return None


@pytest.mark.parametrize("seed", range(6))
def test_any_sequence_of_legal_actions_makes_a_valid_plan(seed: int) -> None:
    rng = np.random.default_rng(seed)
    servers = [training_server(f"s{i}", gpus=4) for i in range(4)]
    jobs, free = [], [(f"s{i}", g) for i in range(4) for g in range(4)]
    rng.shuffle(free)
    for jid in range(1, 5):  # running jobs, 1-GPU workers, on scattered GPUs
        n = int(rng.integers(1, 4))
        placement: list[tuple[str, tuple[int, ...]]] = [(sid, (g,)) for sid, g in free[:n]]
        free = free[n:]
        low, high = int(rng.integers(1, n + 1)), n + int(rng.integers(0, 4))
        jobs.append(replace(running_job(jid, placement, low=low, high=high), submitted_at=float(jid)))
    for jid in range(5, 5 + 40):  # more pending jobs than slots, gangs of 1..3 workers of 1..2 GPUs
        low = int(rng.integers(1, 4))
        top = low + int(rng.integers(0, 3))
        jobs.append(pending_job(jid, gpus=int(rng.integers(1, 3)), workers=low, max_workers=top, submitted=float(jid)))
    snap = snapshot_of(servers, jobs)
    policy = Dl2Policy(PolicyParams(), lambda: random_network(seed=seed), chooser=RandomLegal(seed))
    plan = policy.schedule(snap)
    assert check_plan(snap, plan) == []  # no double-booking, whole gangs, min..max, an apply order
    for start in plan.starts:
        job = next(j for j in jobs if j.job_id == start.job_id)
        assert job.min_workers <= len(start.workers) <= job.max_workers
    assert {p.job_id for p in plan.pending} | {s.job_id for s in plan.starts} == {j for j in range(5, 45)}


def test_the_registered_policy_loads_the_shipped_weights_and_decides_deterministically() -> None:
    servers = [training_server("a"), training_server("b")]
    jobs = [running_job(1, [("a", (0,)), ("a", (1,))], low=1, high=8, resized=NOW - 600),
            pending_job(2, gpus=1, workers=1, max_workers=4), pending_job(3, gpus=2, workers=2)]
    snap = snapshot_of(servers, jobs)
    policy = create_policy("dl2")
    plan = policy.schedule(snap)
    assert check_plan(snap, plan) == []
    assert plan == create_policy("dl2").schedule(snap)


# -- the weights file -----------------------------------------------------------------------------------


def test_a_missing_or_mismatched_weights_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="does not exist; train one with `aryl-sim train-dl2`"):
        create_dl2(PolicyParams(dl2_model=str(tmp_path / "nope.npz")))
    odd = random_network(hidden=8)
    meta = {**odd.meta, "encoding_version": 0}  # an older encoding
    old: dict[str, Any] = {"meta": np.array(json.dumps(meta)), **odd.arrays()}  # savez's **kwds: arrays by name
    np.savez(tmp_path / "old.npz", **old)
    with pytest.raises(ModelFileError, match="was made for encoding"):
        load_network(tmp_path / "old.npz")
    cut: dict[str, Any] = {"meta": np.array(json.dumps(odd.meta)), **odd.arrays(), "w1": odd.w1[:-1]}
    np.savez(tmp_path / "cut.npz", **cut)
    with pytest.raises(ModelFileError, match="array w1 has shape"):
        load_network(tmp_path / "cut.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a weights file")
    with pytest.raises(ModelFileError, match="is not a dl2 weights file"):
        load_network(tmp_path / "junk.npz")
    good = random_network(hidden=16, seed=3)
    save_network(good, tmp_path / "good.npz", seed=3)
    back = load_network(tmp_path / "good.npz")
    assert back.meta["seed"] == 3 and np.array_equal(back.w1, good.w1)
    assert load_network(BUNDLED_MODEL).meta["encoding_version"] == ENCODING_VERSION


def test_the_scheduler_refuses_to_start_without_its_weights(tmp_path: Path) -> None:
    env = {**os.environ, "ARYL_POLICY__DL2_MODEL": str(tmp_path / "missing.npz")}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "aryl-scheduler"), "--policy", "dl2", "--database-url",
         f"sqlite:///{tmp_path / 'aryl.db'}"], capture_output=True, text=True, timeout=60, check=False, env=env)
    assert result.returncode == 2, result.stderr
    assert "missing.npz' does not exist; train one with `aryl-sim train-dl2`" in result.stderr


# -- training on a tiny trace ---------------------------------------------------------------------------


def tiny_trace(seed: int, jobs: int = 10) -> tuple[TraceJob, ...]:
    """Elastic 1-GPU-worker jobs (1..4 workers, diminishing returns) arriving over an hour, on 8 GPUs."""
    rng = np.random.default_rng(seed)
    out = []
    for jid in range(1, jobs + 1):
        speedup = float(rng.uniform(0.3, 0.95))  # each worker past the first adds this much
        points = tuple((w, 1.0 + speedup * (w - 1)) for w in range(1, 5))
        out.append(TraceJob(jid, f"j{jid}", float(rng.uniform(0, 3600)), 1, 1, 4, float(rng.uniform(1800, 7200)),
                            points))
    return tuple(sorted(out, key=lambda j: j.submit_time))


@pytest.fixture(scope="module")
def tiny_env():
    from simulator.dl2_train import Environment

    return Environment((tiny_trace(1), tiny_trace(2)), ClusterSpec(2, 0, 4))


@needs_torch
def test_warm_up_agrees_with_its_teacher(tiny_env) -> None:
    from simulator.dl2_train import imitate

    # 80 epochs: on 341 labels (2 batches an epoch) the shared per-job network needs more steps than 40
    result, teacher_jct, steps = imitate(tiny_env, seed=0, epochs=80, dagger_rounds=1)
    # Threshold: 90% of the recorded steps (teacher's and DAgger's) pick the teacher's action.
    assert result.agreement >= 0.9, result.agreement
    assert len(steps.actions) > 100 and all(math.isfinite(j) for j in teacher_jct)


@needs_torch
def test_reinforcement_learning_improves_on_the_warm_up(tiny_env) -> None:
    from simulator.dl2_train import greedy_jct, imitate, reinforce

    warm, _, _ = imitate(tiny_env, seed=0, epochs=10, dagger_rounds=0)  # a short warm-up: room to improve
    before = float(np.mean(greedy_jct(tiny_env, warm.network)))
    rl = reinforce(tiny_env, warm.network, seed=0, iterations=15, episodes=4)  # 2 per workload: siblings
    after = float(np.mean(greedy_jct(tiny_env, rl.network)))
    assert after < before, (before, after, rl.curve)
    again = reinforce(tiny_env, warm.network, seed=0, iterations=15, episodes=4)  # seeded: the same run
    assert again.curve == rl.curve


def _steps(cycles: list[tuple[float, int, int]]) -> Any:
    """Recorded steps of one run: per cycle (time, active jobs, steps it took)."""
    from simulator.dl2_train import Steps

    steps = Steps()
    for time_s, jobs, n in cycles:
        for _ in range(n):
            steps.record(np.zeros(input_size(), dtype=np.float32), np.ones(2 * JOB_SLOTS + 1, dtype=bool), STOP)
        steps.cycle_times.append(time_s)
        steps.cycle_jobs.append(jobs)
        steps.cycle_last_step.append(len(steps.actions) - 1)
    return steps


def test_rewards_follow_each_cycles_last_step_discounted_in_time() -> None:
    from simulator.dl2_train import gae, step_rewards

    # Cycles at 0 h (2 steps, 3 jobs), 1 h (no step: nothing was legal, 2 jobs), 2 h (1 step, 1 job); end at 3 h.
    steps = _steps([(0.0, 3, 2), (3600.0, 2, 0), (7200.0, 1, 1)])
    reward, gap_h = step_rewards(steps, end_time=10800.0, horizon_h=2.0)
    # Step 0 is followed by step 1 in its cycle (nothing, no time); step 1 by cycles 0 and 1 (the latter 1 h
    # later, discounted), then step 2 two hours on; step 2 by its cycle, then the end.
    np.testing.assert_allclose(reward, [0.0, -3.0 - 2.0 * math.exp(-0.5), -1.0])
    np.testing.assert_allclose(gap_h, [0.0, 2.0, math.inf])
    # Monte-Carlo returns (lambda inf, no values): the discounted sum of the rewards that follow.
    returns = gae(reward, gap_h, np.zeros(3), 2.0, math.inf)
    np.testing.assert_allclose(returns, [reward[1] + math.exp(-1.0) * -1.0] * 2 + [-1.0])
    # With exact values every advantage is zero, at any lambda.
    np.testing.assert_allclose(gae(reward, gap_h, returns, 2.0, 0.5), 0.0, atol=1e-12)


def test_the_input_driven_baseline_compares_runs_of_the_same_workload_at_the_same_time() -> None:
    from simulator.dl2_train import input_driven_advantages

    a = _steps([(0.0, 1, 1), (600.0, 1, 2)])
    b = _steps([(0.0, 1, 1), (300.0, 1, 1), (900.0, 1, 1)])
    c = _steps([(0.0, 1, 1)])
    out = input_driven_advantages([(a, 1000.0, 0), (b, 1000.0, 0), (c, 1000.0, 1)],
                                  [np.array([-5.0, -2.0, -2.0]), np.array([-4.0, -3.0, -1.0]), np.array([-1.0])])
    # a at 0 s vs b at 0 s; a at 600 s vs b interpolated between 300 s (-3) and 900 s (-1): -2.
    assert out[0] is not None and out[1] is not None
    np.testing.assert_allclose(out[0], np.array([-1.0, 0.0, 0.0]))
    # b at 300 s vs a interpolated between 0 s (-5) and 600 s (-2): -3.5; at 900 s vs a's last point (-2).
    np.testing.assert_allclose(out[1], np.array([1.0, 0.5, 1.0]))
    assert out[2] is None                                  # alone on its workload: no sibling


def test_checkpoints_round_trip_and_the_shipped_ones_match_the_shipped_weights(tmp_path: Path) -> None:
    from simulator.dl2_train import checkpoints_path, load_checkpoints, save_checkpoints

    nets = [(0, random_network(hidden=8, seed=1)), (5, random_network(hidden=8, seed=2))]
    save_checkpoints(nets, tmp_path / "c.npz")
    back = load_checkpoints(tmp_path / "c.npz", nets[1][1])
    assert [k for k, _ in back] == [0, 5] and np.array_equal(back[0][1].wp, nets[0][1].wp)
    assert checkpoints_path(BUNDLED_MODEL).exists()
    for final in sorted(BUNDLED_MODEL.parent.glob("dl2*.npz")):
        if final.name.endswith((".warmup.npz", ".checkpoints.npz")) or not checkpoints_path(final).exists():
            continue
        shipped = load_network(final)
        points = load_checkpoints(checkpoints_path(final), shipped)
        warm = load_network(final.with_suffix(".warmup.npz"))
        assert points[0][0] == 0 and np.array_equal(points[0][1].w1, warm.w1), final  # iteration 0 = warm-up
        assert np.array_equal(points[-1][1].wp, shipped.wp), final                    # the last = the file
        assert f"--seed {shipped.meta['seed']}" in shipped.meta["command"]


SHARED = Path(os.environ.get("ARYL_SHARED_DIR") or Path(__file__).resolve().parents[2].parent / "shared")


def test_the_philly_training_samples_end_before_the_evaluations_window() -> None:
    # The evaluation's Philly sample is the start of the 15-day window from 2017-10-10 (``evaluation.dl2``);
    # training must never read it (``simulator.dl2_train``'s module doc).
    import csv
    import gzip

    from simulator.dl2_train import PHILLY_FILE, PHILLY_SAMPLES

    path = SHARED / PHILLY_FILE
    if not path.exists():
        pytest.skip(f"{path} is not here (the public data folder)")
    last = max(first + jobs for first, jobs, *_ in PHILLY_SAMPLES)
    with gzip.open(path, "rt", newline="") as handle:
        stamps = [row["timestamp"] for _, row in zip(range(last), csv.DictReader(handle), strict=False)]
    assert len(stamps) == last and max(stamps) < "2017-10-10"


# -- online learning ------------------------------------------------------------------------------------


@needs_torch
def test_online_learning_updates_weights_in_the_background_with_valid_plans(tmp_path: Path) -> None:
    from scheduler_service.policies.dl2_online import OnlineLearner
    from simulator.engine import simulate
    from simulator.model import DemandPoint

    params = PolicyParams(dl2_online_learning=True)
    policy = create_dl2(params)
    learner = policy.chooser
    assert isinstance(learner, OnlineLearner)
    first = policy.current()
    result = simulate(list(tiny_trace(3, jobs=24)), [DemandPoint(0.0, 0, 0.0)], ClusterSpec(2, 0, 4), policy, params,
                      seed=0, min_cycle_gap_s=60.0, drain_ack_s=None, check_plans=True)
    assert result.stop_reason == "completed"
    assert learner.wait_idle(30.0)
    assert learner.updates >= 2, (learner.updates, learner.dropped_batches)
    assert not np.array_equal(policy.current().wp, first.wp)  # new weights were swapped in
    learner.stop()


@needs_torch
def test_online_learning_charges_each_preemption_at_once() -> None:
    from scheduler_service.policies.dl2_online import OnlineLearner

    # As offline (the test below): a job running its 2-worker minimum since its checkpoint 20 minutes ago is
    # preempted; the cycle's return is charged (1200 + 30) s of restart_cost_s = 0.34 job-hours on top of
    # (2 active jobs x 1 h to the next cycle).
    servers = [training_server("a", gpus=2)]
    run = replace(running_job(1, [("a", (0,)), ("a", (1,))], low=2, high=2, resized=NOW - 3600),
                  submitted_at=NOW - 7200, last_checkpoint_at=NOW - 1200)
    snap = snapshot_of(servers, [run, pending_job(2, gpus=1, workers=2, submitted=NOW - 60)])
    params = PolicyParams(restart_cost_s=30.0)
    learner = OnlineLearner(random_network(seed=1), params)
    learner.stop()  # the test reads the batch the thread would have taken
    decision = Decision(snap, params, preempt=True)
    legal = decision.mask()
    logits = np.where(np.arange(len(legal)) == JOB_SLOTS, 50.0, -50.0).astype(np.float32)
    assert learner.choose(decision.observation(), legal, logits) == JOB_SLOTS
    assert decision.apply(JOB_SLOTS) and [j.job_id for j in decision.preempted()] == [1]
    learner.cycle_done(decision)
    learner.cycle_done(Decision(replace(snap, now=NOW + 3600), params))  # the next cycle, an hour later
    learner._hand_over()
    batch = learner._queue.get_nowait()
    assert batch is not None and batch[3].tolist() == [pytest.approx(-(2 * 1.0 + 1230 / 3600))]


def test_greedy_decisions_do_not_need_torch() -> None:
    # The registered policy without online learning runs on numpy alone: decide in a fresh interpreter where
    # importing torch fails.
    code = ("import sys; sys.modules['torch'] = None\n"
            "from scheduler_service.policies import create_policy\n"
            "from tests.harness import pending_job, snapshot_of, training_server\n"
            "plan = create_policy('dl2').schedule(snapshot_of([training_server('a')], [pending_job(1)]))\n"
            "print(len(plan.starts) + len(plan.pending))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "1"


def test_decide_stops_when_nothing_is_legal() -> None:
    snap = snapshot_of([training_server("a", gpus=1)], [pending_job(1, gpus=2)])  # never fits
    decision = decide(snap, PolicyParams(), random_network(seed=1), Greedy())
    assert decision.plan().starts == () and len(decision.plan().pending) == 1


def test_queued_jobs_past_the_window_start_at_their_minimum_on_the_gpus_the_network_left_free() -> None:
    # JOB_SLOTS + 3 queued jobs, one 1-GPU worker each, on a server of JOB_SLOTS + 2 GPUs: the network must start
    # the JOB_SLOTS it sees (stop is illegal while a visible gang fits); of the 3 past the window, the 2 oldest
    # start on the 2 GPUs left, the third waits, saying why.
    jobs = [pending_job(i, 1, 1, submitted=NOW - 1000 + i) for i in range(1, JOB_SLOTS + 4)]
    snap = snapshot_of([training_server("a", gpus=JOB_SLOTS + 2)], jobs)
    for seed in (1, 2):
        plan = decide(snap, PolicyParams(), random_network(seed=seed), Greedy()).plan()
        assert check_plan(snap, plan) == []
        started = {s.job_id: s for s in plan.starts}
        assert set(started) == set(range(1, JOB_SLOTS + 3))
        assert [started[j].reason.value for j in (JOB_SLOTS + 1, JOB_SLOTS + 2)] == ["BACKFILLED"] * 2
        [waiting] = plan.pending
        assert waiting.job_id == JOB_SLOTS + 3 and "oldest active jobs" in waiting.message


def test_only_weights_trained_with_preemption_may_remove_a_jobs_last_gang() -> None:
    # Job 1 runs its 2-worker minimum gang (outside its protection window), job 2 waits for 4 GPUs of a full
    # 4-GPU cluster. Weights without ``meta["preemption"]`` may not touch job 1 (it is at its minimum); weights
    # trained with it may remove its whole gang at once -- a preemption -- and then start job 2.
    servers = [training_server("a", gpus=4)]
    run = replace(running_job(1, [("a", (0,)), ("a", (1,))], low=2, high=4, resized=NOW - 3600),
                  submitted_at=NOW - 7200)
    other = replace(running_job(3, [("a", (2,)), ("a", (3,))], low=2, high=2, resized=NOW - 3600),
                    submitted_at=NOW - 7100)
    wait = pending_job(2, gpus=1, workers=4, submitted=NOW - 60)
    snap = snapshot_of(servers, [run, other, wait])
    plain = random_network(seed=3)
    assert not plain.preempts and not Decision(snap, PolicyParams()).mask()[JOB_SLOTS:STOP].any()
    preempting = replace(plain, meta={**plain.meta, "preemption": True})
    decision = Decision(snap, PolicyParams(), preempt=preempting.preempts)
    assert set(np.flatnonzero(decision.mask())) == {JOB_SLOTS, JOB_SLOTS + 1, STOP}  # remove job 1 or 3, or stop
    assert decision.apply(JOB_SLOTS) and decision.workers[0] == []  # the whole gang went at once
    assert decision.apply(JOB_SLOTS + 1) and decision.workers[1] == []
    assert decision.apply(2)  # job 2's 4-GPU gang now fits
    plan = decision.plan()
    assert check_plan(snap, plan) == []
    assert {p.job_id for p in plan.preemptions} == {1, 3} and [s.job_id for s in plan.starts] == [2]
    # A job in its protection window is never preempted, whatever the weights.
    held = Decision(snapshot_of(servers, [replace(run, last_resized_at=NOW - 60), other, wait]), PolicyParams(),
                    preempt=True)
    assert set(np.flatnonzero(held.mask())) == {JOB_SLOTS + 1, STOP}


def test_the_teacher_never_preempts_but_shows_the_network_where_it_could() -> None:
    from simulator.dl2_train import Demonstrator

    # optimus gives every job its minimum in arrival order first: a job waiting since before a running one was
    # submitted (say, preempted earlier) would take that one's gang. The demonstrator does not (``teacher_wants``):
    # the running job keeps its gang either way; with preemption among the actions, the steps it records show the
    # removal as legal (so the warm-up learns not to take it) and the job still runs.
    servers = [training_server("a", gpus=4)]
    late = replace(running_job(1, [("a", (g,)) for g in range(4)], low=4, high=4, resized=NOW - 3600),
                   submitted_at=NOW - 60)
    early = pending_job(2, gpus=1, workers=4, submitted=NOW - 7200, runtime=600.0)
    snap = snapshot_of(servers, [late, early])
    assert [p.job_id for p in create_policy("optimus").schedule(snap).preemptions] == [1]  # optimus itself would
    for preempt in (False, True):
        teacher = Demonstrator(PolicyParams(), preempt=preempt)
        plan = teacher.schedule(snap)
        assert check_plan(snap, plan) == [] and plan.preemptions == () and plan.starts == ()
        slot = 1  # job 2 arrived first: slot 0
        assert bool(teacher.steps.legal[0][JOB_SLOTS + slot]) is preempt
        assert teacher.steps.actions == [STOP]


def test_each_preemption_is_charged_its_redo_and_restart_in_the_cycles_reward() -> None:
    from simulator.dl2_train import Sampler, step_rewards

    # A job running its 2-worker minimum since its last checkpoint 20 minutes ago is preempted (a network
    # trained with preemption, the only legal removal taken): the cycle is charged (1200 + 30) s = 0.34 job-hours
    # at its weight 1, on top of (2 active jobs x 1 h to the next cycle).
    servers = [training_server("a", gpus=2)]
    run = replace(running_job(1, [("a", (0,)), ("a", (1,))], low=2, high=2, resized=NOW - 3600),
                  submitted_at=NOW - 7200, last_checkpoint_at=NOW - 1200)
    snap = snapshot_of(servers, [run, pending_job(2, gpus=1, workers=2, submitted=NOW - 60)])
    sampler = Sampler(0, restart_overhead_s=30.0, preemption_cost=1.0)
    decision = Decision(snap, PolicyParams(), preempt=True)
    assert decision.apply(JOB_SLOTS) and [j.job_id for j in decision.preempted()] == [1]
    sampler.steps.record(decision.observation(), decision.mask(), JOB_SLOTS)
    sampler.cycle_done(decision)
    assert sampler.steps.cycle_costs == [pytest.approx(1230 / 3600)]
    reward, _ = step_rewards(sampler.steps, end_time=NOW + 3600, horizon_h=4.0)
    assert reward[0] == pytest.approx(-(2 * 1.0 + 1230 / 3600))
    # Without the charge (weight 0), the same cycle costs its active jobs' time only.
    free = Sampler(0, restart_overhead_s=30.0)
    free.steps.record(decision.observation(), decision.mask(), JOB_SLOTS)
    free.cycle_done(decision)
    assert step_rewards(free.steps, end_time=NOW + 3600, horizon_h=4.0)[0][0] == pytest.approx(-2.0)


def test_the_evaluations_headroom_floor_is_each_job_alone_at_its_fastest_size() -> None:
    from evaluation.dl2 import _headroom
    from simulator.dl2_train import Environment

    # Job 1 speeds up to 4 workers (work 3,600 at 2.5/s: 1,440 s); job 2 asks 2 GPUs a worker, so on 4 GPUs it
    # runs at most 2 workers though it may take 4 (work 1,800 at 1.8/s: 1,000 s). Floor: (1,440 + 1,000) / 2.
    jobs = (TraceJob(1, "a", 0.0, 1, 1, 4, 3600.0, ((1, 1.0), (2, 1.8), (4, 2.5))),
            TraceJob(2, "b", 60.0, 2, 1, 4, 1800.0, ((1, 1.0), (2, 1.8), (4, 2.5))))
    env = Environment((jobs,), ClusterSpec(1, 0, 4))
    room = _headroom(env)
    assert room["floor_avg_jct_s"] == pytest.approx((1440.0 + 1000.0) / 2)
    # The reference policy ran through the simulator and can only be slower than the floor.
    assert room["aryl_avg_jct_s"] >= room["floor_avg_jct_s"]
