"""A real PyTorch data-parallel training program on Aryl (``torch.distributed``: NCCL on GPUs, gloo on CPUs).

    pip install -e '.[torch]'
    python examples/ddp_train.py --total-steps 200                       # alone: a world of 1
    arylctl submit --name ddp --min-workers 1 --max-workers 3 --batch-size 32 --max-batch-size 256 \\
        --max-local-batch-size 64 -- python examples/ddp_train.py --total-steps 2000

It fits a model (linear; with ``--hidden``, a ReLU network of ``--layers`` layers that wide, big enough
to keep a GPU busy) to noisy data drawn from a fixed random linear map, with ``aryl_train``
keeping the job contract: it reads its world and the batch the scheduler chose from the environment
the agent sets (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``ARYL_LOCAL_BATCH_SIZE``,
``ARYL_ACCUM_STEPS``), resumes from ``$ARYL_CHECKPOINT_DIR``, reports step times and gradient
statistics in its progress file, follows an in-place batch change, and on SIGTERM (a resize, a
preemption) checkpoints and exits 0. The learning rate follows the batch (linear scaling against
``--batch-size``). Each rank prints its batch at start and the parameters' digest at every save and
load, so a resume can be checked against the save it came from.

``--sample-time`` adds that many seconds per sample to each pass (a stand-in for a real model's
compute), so the throughput depends on the batch as a GPU's does.

``--device`` (default ``auto``: a GPU where PyTorch sees one) picks where it trains. On a GPU each worker
uses the first GPU it sees: the agent gives each worker only its own (``CUDA_VISIBLE_DEVICES``, in
``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so they are the GPUs it registered); run by hand, ``LOCAL_RANK``
chooses. The ranks then reduce over NCCL. The start line names the device, the batches are drawn on the
CPU (the same numbers on either device) and moved to it.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from aryl_train import Allocation, Trainer

FEATURES = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=200, help="optimiser steps in all (default 200)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="total batch the learning rate is tuned for, where the job declared none (default 32)")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate at --batch-size (default 0.05)")
    parser.add_argument("--checkpoint-every", type=int, default=20, help="steps between checkpoints (default 20)")
    parser.add_argument("--sample-time", type=float, default=0.0, help="extra seconds per sample and pass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                        help="where to train: auto (default) is cuda where PyTorch sees a GPU, else cpu")
    parser.add_argument("--hidden", type=int, default=0,
                        help="width of the hidden layers (default 0: a linear model, no hidden layer)")
    parser.add_argument("--layers", type=int, default=2, help="hidden layers, with --hidden (default 2)")
    return parser.parse_args(argv)


class Samples:
    """The data: x ~ N(0, I), y = x·w* + noise, drawn from a seed, the step, the rank and the pass,
    so a resumed run sees what it would have seen without the interruption."""

    def __init__(self, seed: int, rank: int, trainer: Trainer) -> None:
        self.seed, self.rank, self.trainer = seed, rank, trainer
        self.step, self.passes = -1, 0  # passes drawn in the current step
        self.target = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(seed))

    def draw(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.step != self.trainer.step:
            self.step, self.passes = self.trainer.step, 0
        self.passes += 1
        key = hash((self.seed, self.step, self.rank, self.passes)) % 2**62
        generator = torch.Generator().manual_seed(key)
        x = torch.randn(count, FEATURES, generator=generator)
        return x, x @ self.target + 0.5 * torch.randn(count, 1, generator=generator)


def choose_device(requested: str) -> torch.device:
    """``requested`` as a device: a GPU for ``cuda`` (``auto`` where PyTorch sees one), else the CPU."""
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: PyTorch {torch.__version__} sees no GPU "
                         f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')!r})")
    # Under Aryl the worker sees only its own GPUs: the first is its own. By hand (torchrun), LOCAL_RANK's.
    index = 0 if "CUDA_VISIBLE_DEVICES" in os.environ else int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)
    return device


def build_model(hidden: int, layers: int) -> nn.Module:
    if hidden <= 0:
        return nn.Linear(FEATURES, 1)
    widths = [FEATURES] + [hidden] * layers
    stages: list[nn.Module] = []
    for inputs, outputs in itertools.pairwise(widths):
        stages += [nn.Linear(inputs, outputs), nn.ReLU()]
    return nn.Sequential(*stages, nn.Linear(hidden, 1))


def describe(device: torch.device) -> str:
    return f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)


def main(args: argparse.Namespace) -> int:
    allocation = Allocation.from_env(init_batch_size=args.batch_size)
    world, rank = allocation.world_size, allocation.rank
    say = lambda text: print(f"[rank {rank}/{world}] {text}", flush=True)  # noqa: E731
    device = choose_device(args.device)
    torch.manual_seed(args.seed)
    net = build_model(args.hidden, args.layers).to(device)
    model: nn.Module = net
    if world > 1:  # the agent set MASTER_ADDR and MASTER_PORT: rank 0's host is the rendezvous
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=60))
        model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    trainer = Trainer(model, optimizer, allocation, log=say)
    batch = trainer.batch  # rank 0's, on every rank (the trainer agrees on it before the first step)
    say(f"incarnation {allocation.incarnation}: batch local {batch.local_batch_size} accum {batch.accum_steps} "
        f"({'from the scheduler' if allocation.batch_from_scheduler else 'own'}), init {allocation.init_batch_size}, "
        f"device {describe(device)}, {sum(p.numel() for p in net.parameters())} parameters")
    samples = Samples(args.seed, rank, trainer)
    mse = nn.MSELoss()

    def pass_loss(batch_size: int) -> torch.Tensor:
        if args.sample_time > 0:
            time.sleep(args.sample_time * batch_size)
        x, y = samples.draw(batch_size)
        return mse(model(x.to(device)), y.to(device))

    def follow_batch() -> None:  # the learning rate follows the total batch (linear scaling)
        for group in optimizer.param_groups:
            group["lr"] = args.lr * trainer.batch.total(world) / allocation.init_batch_size

    def on_step(loss: float) -> None:
        follow_batch()
        if trainer.step % 20 == 0:
            stats = trainer.gradient_statistics
            noise = f", grad sqr {stats.sqr:.3g} var {stats.var:.3g}" if stats else ""
            say(f"step {trainer.step}/{args.total_steps} loss {loss:.4f}{noise}")

    trainer.resume()
    follow_batch()
    status = trainer.fit(args.total_steps, pass_loss, checkpoint_every=args.checkpoint_every, on_step=on_step)
    say(f"{'stopped (SIGTERM)' if trainer.stopping else 'done'}: step {trainer.step}, "
        f"checkpointed at {trainer.checkpoint_step}")
    if world > 1:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    sys.exit(main(parse_args()))
