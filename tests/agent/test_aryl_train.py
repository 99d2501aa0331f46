"""``aryl_train``, the helper for PyTorch programs: the gradient noise estimate on cases whose gradient
statistics are known, the trainer's measures, batch changes, checkpoints and stops.

The known case: a loss linear in the parameters, ``mean(x) · w`` with samples x ~ N(μ, σ²I) in d
dimensions, has the gradient ``mean(x)`` whatever w is, so |E g|² = |μ|² and tr Σ = d σ² exactly, and
Pollux's statistics normalised to the initial batch B₀ are |μ|² and d σ² / B₀. The multi-process tests
run real gloo worlds of two processes (``torch.distributed`` on CPU).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("CI") != "true":  # torch is in the dev extra: under CI a missing torch fails, never skips
    pytest.importorskip("torch", reason="PyTorch is not installed (pip install -e '.[dev]' brings the CPU build)")

import torch

from aryl_train import Allocation, GradStats, SmoothedGradStats, Trainer, estimate
from node_agent.contract import Batch, read_progress, write_batch
from tests.helpers import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
D, SIGMA = 6, 2.0
MU = [0.5, -1.0, 0.25, 0.0, 1.5, -0.5]
TRUE_SQR = sum(m * m for m in MU)  # |μ|² = 3.875
TRUE_TRACE = D * SIGMA**2          # tr Σ per sample = 24


@pytest.fixture(autouse=True)
def sigterm_restored() -> Iterator[None]:
    """A Trainer installs a SIGTERM handler; pytest's own comes back after each test."""
    saved = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, saved)


@pytest.fixture
def contract_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A world of 1 under the contract: checkpoint dir, progress file, batch file."""
    for name in list(os.environ):
        if name.startswith("ARYL_") or name in ("WORLD_SIZE", "RANK"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ARYL_CHECKPOINT_DIR", str(tmp_path / "ck"))
    monkeypatch.setenv("ARYL_PROGRESS_FILE", str(tmp_path / "progress.json"))
    return tmp_path


def gradient_samples(count: int, atomic_bsz: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` gradients, each the mean of ``atomic_bsz`` per-sample gradients x ~ N(μ, σ²I)."""
    x = torch.tensor(MU, dtype=torch.float64) + SIGMA * torch.randn(count, atomic_bsz, D, generator=generator,
                                                                    dtype=torch.float64)
    return x.mean(dim=1)


@pytest.mark.parametrize(("count", "atomic_bsz", "init_bsz"), [(2, 4, 8), (4, 16, 32), (12, 2, 64)])
def test_the_estimate_is_unbiased_on_gradients_of_known_statistics(count: int, atomic_bsz: int,
                                                                   init_bsz: int) -> None:
    generator = torch.Generator().manual_seed(count)
    trials = 4000
    sqr_sum = var_sum = 0.0
    for _ in range(trials):
        g = gradient_samples(count, atomic_bsz, generator)
        local = float(g.pow(2).sum(dim=1).mean())
        total = float(g.mean(dim=0).pow(2).sum())
        stats = estimate(local, total, count, atomic_bsz, init_bsz)
        sqr_sum += stats.sqr
        var_sum += stats.var
    assert sqr_sum / trials == pytest.approx(TRUE_SQR, rel=0.05)
    assert var_sum / trials == pytest.approx(TRUE_TRACE / init_bsz, rel=0.05)


def test_the_estimate_needs_two_gradient_samples() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        estimate(1.0, 1.0, 1, 8, 8)


def test_smoothing_is_bias_corrected_weighs_larger_batches_more_and_survives_a_checkpoint() -> None:
    smoothed = SmoothedGradStats(smoothing=0.9)
    assert smoothed.value is None
    smoothed.update(GradStats(2.0, 1.0), scale=1)
    assert smoothed.value == pytest.approx(GradStats(2.0, 1.0))  # not pulled towards 0
    smoothed.update(GradStats(4.0, 3.0), scale=1)
    one_step = smoothed.value
    assert one_step is not None and 2.0 < one_step.sqr < 4.0
    heavier = SmoothedGradStats(smoothing=0.9)
    heavier.update(GradStats(2.0, 1.0), scale=1)
    heavier.update(GradStats(4.0, 3.0), scale=8)  # a step over 8 B₀ samples moves the average further
    assert heavier.value is not None and heavier.value.sqr > one_step.sqr
    copy = SmoothedGradStats(smoothing=0.9)
    copy.load_state_dict(heavier.state_dict())
    assert copy.value == heavier.value
    smoothed.update(GradStats(1.0, -50.0), scale=1)  # one noisy negative estimate: reported as 0, not < 0
    assert smoothed.value is not None and smoothed.value.var == 0.0


class LinearLoss(torch.nn.Module):
    """``mean(x) · w``: its gradient is the batch mean of x, whatever w is (module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(D, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.w).mean()


def linear_pass_loss(model: torch.nn.Module, generator: torch.Generator, sizes: list[int] | None = None):
    def pass_loss(batch_size: int) -> torch.Tensor:
        if sizes is not None:
            sizes.append(batch_size)
        x = torch.tensor(MU, dtype=torch.float64) + SIGMA * torch.randn(batch_size, D, generator=generator,
                                                                        dtype=torch.float64)
        return model(x)
    return pass_loss


@pytest.mark.parametrize("accum_steps", [3, 0])  # 4 samples per step; 1 (the differenced estimate)
def test_the_trainer_measures_known_gradient_statistics(contract_env: Path, monkeypatch: pytest.MonkeyPatch,
                                                        accum_steps: int) -> None:
    monkeypatch.setenv("ARYL_LOCAL_BATCH_SIZE", "4")
    monkeypatch.setenv("ARYL_ACCUM_STEPS", str(accum_steps))
    allocation = Allocation.from_env(init_batch_size=16)
    assert allocation.batch == Batch(4, accum_steps) and allocation.batch_from_scheduler
    model = LinearLoss()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), allocation, smoothing=0.995,
                      log=lambda _: None)
    pass_loss = linear_pass_loss(model, torch.Generator().manual_seed(7))
    for _ in range(1500):
        trainer.train_step(pass_loss)
    stats = trainer.gradient_statistics
    assert stats is not None
    assert stats.sqr == pytest.approx(TRUE_SQR, rel=0.15)
    assert stats.var == pytest.approx(TRUE_TRACE / 16, rel=0.15)
    report = read_progress(contract_env / "progress.json")
    assert report is not None
    assert (report.progress, report.local_batch_size, report.accum_steps) == (1500, 4, accum_steps)
    assert report.samples == 1500 * 4 * (accum_steps + 1)
    assert (report.grad_sqr, report.grad_var) == pytest.approx((stats.sqr, stats.var))
    assert report.step_time_s > 0 and 0 < report.pass_time_s <= report.step_time_s


def test_a_batch_written_to_the_batch_file_is_used_from_the_next_step(contract_env: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARYL_LOCAL_BATCH_SIZE", "4")
    monkeypatch.setenv("ARYL_BATCH_FILE", str(contract_env / "batch.json"))
    model = LinearLoss()
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), Allocation.from_env(16), log=lambda _: None)
    sizes: list[int] = []
    pass_loss = linear_pass_loss(model, torch.Generator().manual_seed(1), sizes)
    trainer.train_step(pass_loss)
    write_batch(contract_env / "batch.json", Batch(8, 2))
    trainer.train_step(pass_loss)  # read at the end of this step (rank 0 reads, the world agrees)
    trainer.train_step(pass_loss)
    assert sizes == [4, 4, 8, 8, 8]
    report = read_progress(contract_env / "progress.json")
    assert report is not None and (report.local_batch_size, report.accum_steps, report.samples) == (8, 2, 4 + 4 + 24)


def test_a_job_without_batch_limits_splits_its_own_batch_over_the_world(contract_env: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "3")
    allocation = Allocation.from_env(init_batch_size=32)
    assert allocation.batch == Batch(11, 0) and not allocation.batch_from_scheduler
    monkeypatch.setenv("ARYL_INIT_BATCH_SIZE", "64")
    monkeypatch.setenv("ARYL_MAX_BATCH_SIZE", "512")
    monkeypatch.setenv("ARYL_MAX_LOCAL_BATCH_SIZE", "64")
    assert Allocation.from_env(init_batch_size=32).init_batch_size == 64  # the declared one wins


def test_a_checkpoint_restores_model_optimiser_step_samples_rng_and_statistics(contract_env: Path) -> None:
    def build() -> tuple[torch.nn.Module, Trainer]:
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(D, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        return model, Trainer(model, optimizer, Allocation.from_env(8), log=lambda _: None)

    model, trainer = build()
    generator = torch.Generator().manual_seed(5)

    def pass_loss(batch_size: int) -> torch.Tensor:
        x = torch.randn(batch_size, D, generator=generator)
        return model(x).pow(2).mean()

    for _ in range(5):
        trainer.train_step(pass_loss)
    trainer.save()
    saved = (trainer.checksum(), trainer.step, trainer.samples, trainer.gradient_statistics,
             trainer.optimizer.state_dict()["state"][0]["momentum_buffer"].clone())
    expected_draw = torch.rand(3)  # the RNG right after the save
    assert not list(contract_env.glob("ck/*.tmp.*"))  # written through a temporary file, renamed

    _, resumed = build()
    assert resumed.checksum() != saved[0]
    assert resumed.resume() == 5
    assert (resumed.checksum(), resumed.step, resumed.samples, resumed.gradient_statistics) == saved[:4]
    assert torch.equal(resumed.optimizer.state_dict()["state"][0]["momentum_buffer"], saved[4])
    assert torch.equal(torch.rand(3), expected_draw)
    assert resumed.checkpoint_step == 5


WORKER = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    sys.path.insert(0, os.environ["TEST_DIR"])
    from test_aryl_train import LinearLoss, linear_pass_loss
    from aryl_train import Allocation, Trainer
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = DistributedDataParallel(LinearLoss())
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.01), Allocation.from_env(16), smoothing=0.995)
    trainer.resume()
    generator = torch.Generator().manual_seed(100 + int(os.environ["RANK"]))
    total = int(sys.argv[1])
    sys.exit(trainer.fit(total, linear_pass_loss(model, generator)))
""")


def start_world(tmp_path: Path, total_steps: int, *, local: int, accum: int,
                checkpoint_dirs: tuple[str, str] = ("ck", "ck"),
                rank_1_batch: tuple[int, int] | None = None) -> list[subprocess.Popen[str]]:
    """Two ranks started with batch (local, accum); rank 1 with ``rank_1_batch`` where given (its agent
    had already heard of an in-place change when it started it)."""
    port = str(free_port())
    workers = []
    for rank in range(2):
        if rank == 1 and rank_1_batch is not None:
            local, accum = rank_1_batch
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env.update(WORLD_SIZE="2", RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   ARYL_LOCAL_BATCH_SIZE=str(local), ARYL_ACCUM_STEPS=str(accum), ARYL_INIT_BATCH_SIZE="16",
                   ARYL_MAX_BATCH_SIZE="256", ARYL_MAX_LOCAL_BATCH_SIZE="64",
                   ARYL_CHECKPOINT_DIR=str(tmp_path / checkpoint_dirs[rank]),
                   ARYL_PROGRESS_FILE=str(tmp_path / f"progress-{rank}.json"),
                   ARYL_CHECKPOINT_ACK_FILE=str(tmp_path / f"ack-{rank}.json"),
                   PYTHONPATH=str(REPO), TEST_DIR=str(Path(__file__).resolve().parent), OMP_NUM_THREADS="1")
        workers.append(subprocess.Popen([sys.executable, "-c", WORKER, str(total_steps)], env=env, cwd=tmp_path,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return workers


def finish(workers: list[subprocess.Popen[str]]) -> list[str]:
    outputs = [w.communicate(timeout=60)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    return outputs


def test_two_ranks_sum_their_local_gradients_into_the_known_statistics(tmp_path: Path) -> None:
    """DDP's all-reduce averages the two ranks' gradients; the tensor hooks see each rank's own, so a
    step has 2 ranks × 2 passes = 4 gradient samples of 4 samples each."""
    finish(start_world(tmp_path, 300, local=8, accum=1))
    report = read_progress(tmp_path / "progress-0.json")
    assert report is not None and report.progress == 300 and report.samples == 300 * 32
    assert report.grad_sqr == pytest.approx(TRUE_SQR, rel=0.15)
    assert report.grad_var == pytest.approx(TRUE_TRACE / 16, rel=0.15)
    other = read_progress(tmp_path / "progress-1.json")
    assert other is not None and (other.grad_sqr, other.grad_var) == (report.grad_sqr, report.grad_var)  # agreed


def test_ranks_started_with_different_batches_all_run_rank_0_s_from_the_first_step(tmp_path: Path) -> None:
    """Agents start a world's ranks at different moments, and the batch may change in place between two
    starts. Every rank must run rank 0's batch from the first step: the ranks' sample counts agree."""
    outputs = finish(start_world(tmp_path, 5, local=8, accum=1, rank_1_batch=(4, 1)))
    reports = [read_progress(tmp_path / f"progress-{r}.json") for r in range(2)]
    assert [(r.progress, r.samples) for r in reports if r is not None] == [(5, 5 * 2 * 8 * 2)] * 2, outputs
    assert "batch 4x2 at start -> rank 0's 8x2" in outputs[1], outputs[1]


def test_sigterm_to_one_rank_stops_both_at_the_same_step_after_rank_0_saved(tmp_path: Path) -> None:
    workers = start_world(tmp_path, 10**9, local=2, accum=0)
    wait_for(lambda: (p := read_progress(tmp_path / "progress-0.json")) is not None and p.progress >= 3,
             timeout=60, what="steps")
    workers[1].send_signal(signal.SIGTERM)  # the other rank hears of it through the step's all-reduce
    outputs = finish(workers)
    reports = [read_progress(tmp_path / f"progress-{r}.json") for r in range(2)]
    assert reports[0] is not None and reports[1] is not None
    assert reports[0].progress == reports[1].progress == reports[0].checkpoint_progress > 0
    step = int(reports[0].progress)
    assert f"saved step {step}" in outputs[0]
    assert torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)["step"] == step
    acks = [json.loads((tmp_path / f"ack-{r}.json").read_text()) for r in range(2)]
    assert [a["checkpoint_progress"] for a in acks] == [step, step]

    # The next world resumes there on both ranks, though rank 1's server has no checkpoint: rank 0 reads
    # it and broadcasts it.
    saved = outputs[0].split(f"saved step {step} (parameters ")[1].split(")")[0]
    outputs = finish(start_world(tmp_path, step + 2, local=2, accum=0, checkpoint_dirs=("ck", "elsewhere")))
    assert all(f"resumed step {step} (parameters {saved})" in output for output in outputs), outputs
    progress = read_progress(tmp_path / "progress-1.json")
    assert progress is not None and progress.progress == step + 2
