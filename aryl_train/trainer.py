"""``Trainer``: one data-parallel training loop that keeps Aryl's job contract.

What it does around the program's own forward pass (``pass_loss``), and why:
- *steps*: ``accum_steps + 1`` forward/backward passes of ``local_batch_size`` samples per replica,
  the first ones under DDP's ``no_sync`` (no all-reduce until the last), then the optimiser step;
- *measures* (the progress file's goodput fields): a pass's time is from its start to the moment its
  last local gradient is computed (before waiting for the all-reduce), a step's time covers all its
  passes, the sync and the update; means over the last ``WINDOW`` steps, the first step of an
  incarnation left out (it pays for warm-up). Host clocks: exact on CPU; on a GPU, where kernels run
  asynchronously, a pass's end is when its last gradient was handed over (tested on CPU only);
- *gradient statistics* (``aryl_train.noise``): a tensor hook on each parameter adds the squared norm
  of its local gradient per pass; after the all-reduce the squared norm of the averaged gradient is
  the other half. One small all-reduce per step sums the local norms over the replicas, and carries
  two more things so that every rank acts at the same step: a stop flag (any rank saw SIGTERM) and
  the batch rank 0 read from ``ARYL_BATCH_FILE`` (the contract's in-place batch change);
- *the first step's batch*: the ranks of one world are started by different agents, and the scheduler
  may change the batch in place between two of those starts, so ranks may start with different
  batches. Before the first step every rank takes rank 0's current batch (one broadcast: at
  construction where the process group exists, else at the first step). Ranks whose passes per step
  differed would pair their all-reduces wrongly, and the first step would weigh ranks unequally;
- *checkpoints* (rank 0, atomically: a temporary file then ``os.replace``): model, optimiser, step,
  samples, RNG states (the CUDA generator's too, on a GPU) and the smoothed gradient statistics.
  Rank 0 alone reads it back (onto the CPU first, so a checkpoint saved on a GPU resumes on a CPU and
  the other way round) and broadcasts it, so every rank resumes from the same state even if another
  rank's server sees an older file (only rank 0's server needs ``ARYL_CHECKPOINT_DIR``'s latest content);
- *devices*: the model may live on a GPU (``examples/ddp_train.py --device cuda``). The small tensors
  the ranks exchange live on the device their process group's backend reduces on (the model's under
  NCCL, the CPU under gloo);
- *SIGTERM* (a resize or preemption): the step in flight finishes on every rank, rank 0 saves, all
  ranks meet at a barrier (so no rank of the next incarnation can read an older file), acknowledge
  the checkpoint (the agent then ends the stop without waiting out the grace period) and return 0.

It never chooses a batch size or a world size: those are the scheduler's.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import time
from collections import deque
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from aryl_train.allocation import Allocation
from aryl_train.noise import GradStats, SmoothedGradStats, estimate
from node_agent import contract
from node_agent.contract import Batch

CHECKPOINT = "checkpoint.pt"
WINDOW = 20  # steps the reported times are averaged over

PassLoss = Callable[[int], torch.Tensor]  # local batch size -> the mean loss of one pass over that many samples


class Trainer:
    """Trains ``model`` (a ``DistributedDataParallel`` module, or a plain one in a world of 1) with
    ``optimizer`` under ``allocation``. Installs a SIGTERM handler: build it in the main thread."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, allocation: Allocation, *,
                 smoothing: float = 0.95, log: Callable[[str], None] = print) -> None:
        self.model = model
        self.module: nn.Module = getattr(model, "module", model)  # what is saved: DDP's wrapped module
        self.optimizer = optimizer
        self.allocation = allocation
        self.batch: Batch = allocation.batch
        self._batch_agreed = False  # every rank runs rank 0's batch from the first step (module doc)
        self.step = 0
        self.samples = 0
        self.checkpoint_step = 0
        self.grad_stats = SmoothedGradStats(smoothing)
        self.stopping = False  # a stop was agreed on: finish, save and return
        self._log = log
        self._sigterm = False
        self._local_terms: list[torch.Tensor] = []  # this step's squared local gradient norms, per parameter and pass
        self._grads_done_at = 0.0       # when the latest local gradient was computed
        self._previous_grad: torch.Tensor | None = None  # for the differenced estimate (one sample per step)
        self._step_times: deque[float] = deque(maxlen=WINDOW)
        self._pass_times: deque[float] = deque(maxlen=WINDOW)
        self._timed_steps = 0
        for parameter in self._parameters():
            parameter.register_hook(self._on_local_grad)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        self._agree_start_batch()

    # --- the loop ----------------------------------------------------------------------------------

    def fit(self, total_steps: int, pass_loss: PassLoss, *, checkpoint_every: int = 0,
            on_step: Callable[[float], None] | None = None) -> int:
        """Train until ``total_steps`` or an agreed stop; checkpoint (every ``checkpoint_every`` steps,
        and at the end) and return the exit status (0). ``on_step`` gets each step's mean loss."""
        while self.step < total_steps and not self.stopping:
            loss = self.train_step(pass_loss)
            if on_step is not None:
                on_step(loss)
            if checkpoint_every and self.step % checkpoint_every == 0 and not self.stopping:
                self.save()
                if self.allocation.rank == 0 and not self._sigterm:  # a stop is answered after the barrier
                    contract.acknowledge_checkpoint(self.step)  # outside a stop: a report of the saved work
        self.save()
        if self.allocation.world_size > 1:
            dist.barrier()  # rank 0's file is complete before any rank exits (module doc)
        self.report(0.0)
        if self.stopping:
            contract.acknowledge_checkpoint(self.checkpoint_step)  # last: the agent may end us now
        return 0

    def train_step(self, pass_loss: PassLoss) -> float:
        """One optimiser step (module doc); returns the mean loss of its passes on this replica."""
        started = time.perf_counter()
        if not self._batch_agreed:
            self._agree_start_batch()
        batch = self.batch
        passes = batch.accum_steps + 1
        self.optimizer.zero_grad(set_to_none=True)
        self._local_terms = []
        loss_sum, pass_seconds = 0.0, 0.0
        for index in range(passes):
            pass_started = time.perf_counter()
            with self._no_sync(last=index == passes - 1):
                loss = pass_loss(batch.local_batch_size)
                (loss / passes).backward()
            pass_seconds += self._grads_done_at - pass_started
            loss_sum += float(loss.detach())
        # The hooks saw each pass's gradient divided by ``passes``: scale its square back. One read of the
        # device per step (a GPU is not synchronised per parameter).
        local_sqr = float(torch.stack(self._local_terms).sum()) if self._local_terms else 0.0
        stats = self._agree(local_sqr * passes * passes)
        self._update_grad_stats(local_sum=stats[0], batch=batch)
        self.optimizer.step()
        self.step += 1
        self.samples += batch.total(self.allocation.world_size)
        self.stopping = stats[1] > 0
        next_batch = Batch(int(stats[2]), int(stats[3])) if stats[2] > 0 else batch
        if self._timed_steps > 0:  # the first step pays for warm-up
            self._step_times.append(time.perf_counter() - started)
            self._pass_times.append(pass_seconds / passes)
        self._timed_steps += 1
        if next_batch != batch:
            self._log(f"batch {batch.local_batch_size}x{batch.accum_steps + 1} -> "
                      f"{next_batch.local_batch_size}x{next_batch.accum_steps + 1} at step {self.step}")
            self.batch = next_batch
            self._step_times.clear()
            self._pass_times.clear()
        self.report()
        return loss_sum / passes

    # --- measures ----------------------------------------------------------------------------------

    def report(self, samples_per_second: float | None = None) -> None:
        """Write the progress file (contract: progress = steps done, and the goodput measures)."""
        step_time = sum(self._step_times) / len(self._step_times) if self._step_times else 0.0
        pass_time = sum(self._pass_times) / len(self._pass_times) if self._pass_times else 0.0
        if samples_per_second is None:
            samples_per_second = self.batch.total(self.allocation.world_size) / step_time if step_time else 0.0
        stats = self.grad_stats.value
        contract.report_progress(
            self.step, samples_per_second, self.checkpoint_step, step_time_s=step_time, pass_time_s=pass_time,
            local_batch_size=self.batch.local_batch_size, accum_steps=self.batch.accum_steps,
            grad_sqr=stats.sqr if stats else None, grad_var=stats.var if stats else None, samples=self.samples)

    def _update_grad_stats(self, local_sum: float, batch: Batch) -> None:
        grads = [p.grad.detach().reshape(-1) for p in self._parameters() if p.grad is not None]
        if not grads:
            return
        count = self.allocation.world_size * (batch.accum_steps + 1)
        scale = batch.total(self.allocation.world_size) / self.allocation.init_batch_size
        if count > 1:
            total_sqr = float(torch.stack([g.pow(2).sum(dtype=torch.float64) for g in grads]).sum())
            self._previous_grad = None
            stats = estimate(local_sum / count, total_sqr, count, batch.local_batch_size,
                             self.allocation.init_batch_size)
        else:  # one sample per step: pair it with the previous step's (module doc of aryl_train.noise)
            flat = torch.cat(grads).double()
            previous, self._previous_grad = self._previous_grad, flat.clone()
            if previous is None or previous.shape != flat.shape:
                return
            local = (float(previous.pow(2).sum()) + float(flat.pow(2).sum())) / 2
            total = float(((previous + flat) / 2).pow(2).sum())
            stats = estimate(local, total, 2, batch.local_batch_size, self.allocation.init_batch_size)
            scale *= 2
        self.grad_stats.update(stats, scale)

    @property
    def gradient_statistics(self) -> GradStats | None:
        return self.grad_stats.value

    def _agree(self, local_sqr: float) -> list[float]:
        """[Σ local squared norms, stop flag, rank 0's batch file (local, accum)], summed over the
        world: one small all-reduce, so every rank stops and changes batch at the same step."""
        values = [local_sqr, 1.0 if self._sigterm else 0.0, 0.0, 0.0]
        if self.allocation.rank == 0:
            current = contract.current_batch()
            if current is not None:
                values[2:] = [float(current.local_batch_size), float(current.accum_steps)]
        if self.allocation.world_size == 1:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.all_reduce(tensor)
        return tensor.tolist()

    def _agree_start_batch(self) -> None:
        """Every rank takes rank 0's current batch (the batch file, else its start), once; a world of 1
        has nothing to agree. Waits for the process group: a trainer built before it agrees at its first step."""
        if self.allocation.world_size == 1:
            self._batch_agreed = True
            return
        if not dist.is_initialized():
            return
        values = [0.0, 0.0]
        if self.allocation.rank == 0:
            current = contract.current_batch() or self.batch
            values = [float(current.local_batch_size), float(current.accum_steps)]
        tensor = torch.tensor(values, dtype=torch.float64, device=self._collective_device())
        dist.broadcast(tensor, src=0)
        local, accum = (int(v) for v in tensor.tolist())
        if local > 0 and Batch(local, accum) != self.batch:
            self._log(f"batch {self.batch.local_batch_size}x{self.batch.accum_steps + 1} at start -> rank 0's "
                      f"{local}x{accum + 1}")
            self.batch = Batch(local, accum)
        self._batch_agreed = True

    def _on_local_grad(self, grad: torch.Tensor) -> None:
        self._local_terms.append(grad.detach().pow(2).sum(dtype=torch.float64))
        self._grads_done_at = time.perf_counter()

    def _no_sync(self, *, last: bool) -> AbstractContextManager[Any]:
        no_sync = getattr(self.model, "no_sync", None)
        return nullcontext() if last or no_sync is None else no_sync()

    def _parameters(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    @property
    def device(self) -> torch.device:
        """Where the model's parameters live (the CPU for a model without any)."""
        return next((p.device for p in self.module.parameters()), torch.device("cpu"))

    def _collective_device(self) -> torch.device:
        """Where a tensor the ranks all-reduce or broadcast must live: NCCL reduces only GPU tensors,
        gloo is given CPU ones."""
        return self.device if dist.get_backend() == dist.Backend.NCCL else torch.device("cpu")

    def _on_sigterm(self, _signum: int, _frame: object) -> None:
        self._sigterm = True

    # --- checkpoints -------------------------------------------------------------------------------

    @property
    def checkpoint_path(self) -> Path:
        return self.allocation.checkpoint_dir / CHECKPOINT

    def save(self) -> None:
        """Rank 0 writes the checkpoint atomically; the other ranks hold the same state and only note
        the step."""
        if self.checkpoint_step == self.step:
            return
        if self.allocation.rank != 0:
            self.checkpoint_step = self.step
            return
        state = {
            "step": self.step, "samples": self.samples, "batch": [self.batch.local_batch_size, self.batch.accum_steps],
            "model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
            "rng": self._rng_state(),
            "grad_stats": self.grad_stats.state_dict(),
        }
        temporary = self.checkpoint_path.with_name(f"{CHECKPOINT}.tmp.{os.getpid()}")
        with open(temporary, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.checkpoint_path)
        self.checkpoint_step = self.step
        self._log(f"saved step {self.step} (parameters {self.checksum()})")

    def resume(self) -> int:
        """Load the checkpoint if there is one (rank 0 reads, every rank gets its content); returns the
        step it holds (0: starting afresh)."""
        state = None
        if self.allocation.rank == 0 and self.checkpoint_path.exists():
            # Onto the CPU whatever device saved it: the loads below copy each tensor to its parameter's
            # device, and the RNG states must be CPU tensors.
            state = torch.load(self.checkpoint_path, weights_only=True, map_location="cpu")
        if self.allocation.world_size > 1:
            box = [state]
            dist.broadcast_object_list(box, src=0)
            state = box[0]
        if state is None:
            self._log(f"no checkpoint: starting at step 0 (parameters {self.checksum()})")
            return 0
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._restore_rng(state["rng"])
        self.grad_stats.load_state_dict(state["grad_stats"])
        self.step = self.checkpoint_step = int(state["step"])
        self.samples = int(state["samples"])
        self._log(f"resumed step {self.step} (parameters {self.checksum()})")
        return self.step

    def _rng_state(self) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
        if self.device.type == "cuda":  # the generator of the model's GPU (dropout and the like draw there)
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return rng

    def _restore_rng(self, rng: dict[str, Any]) -> None:
        """The saved RNG states; a CUDA one only where the model is on a GPU now (a checkpoint saved on a
        CPU, or before CUDA states were saved, has none: the GPU's generator keeps its seed)."""
        torch.set_rng_state(rng["torch"].cpu())
        random.setstate(_as_tuples(rng["python"]))
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"].cpu(), self.device)

    def checksum(self) -> str:
        """A short digest of the parameters' exact values (equal before a save and after its load)."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()[:16]


def _as_tuples(value: Any) -> Any:
    """``random.getstate()``'s nested tuples, which a weights-only load may return as lists."""
    return tuple(_as_tuples(v) for v in value) if isinstance(value, list | tuple) else value
