"""What the job contract tells a training program about its allocation, read once at start.

Nouns: the *allocation* is this incarnation's world (``WORLD_SIZE``, ``RANK``), where it keeps its
checkpoints, and the *batch* the scheduler chose for it (``node_agent.contract.Batch``):
``local_batch_size`` samples per replica per pass and ``accum_steps`` extra passes accumulated before
each optimiser step, so a step takes local × world × (accum + 1) samples. A job that declared no batch
limits is sent no batch: the program's own initial batch is then split over the world in one pass.
The batch may change while the workers run (``ARYL_BATCH_FILE``): ``Trainer`` follows it, this
module only reads the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from node_agent import contract
from node_agent.contract import Batch


@dataclass(frozen=True, slots=True)
class Allocation:
    world_size: int
    rank: int
    batch: Batch                # the batch at start (the scheduler's, or the program's split)
    init_batch_size: int        # the total batch the hyper-parameters were tuned for (Pollux's B₀)
    checkpoint_dir: Path
    incarnation: int = 0
    batch_from_scheduler: bool = False

    @classmethod
    def from_env(cls, init_batch_size: int, default_checkpoint_dir: str = "checkpoints") -> Allocation:
        """This process's allocation. ``init_batch_size``: the program's own total batch, used where
        the job declared no batch limits (the declared one wins where it did)."""
        world = contract.world_size()
        limits = contract.batch_limits()
        init = limits.init_batch_size if limits is not None else init_batch_size
        chosen = contract.start_batch()
        batch = chosen if chosen is not None else Batch(max(1, math.ceil(init / world)))
        return cls(world_size=world, rank=contract.rank(), batch=batch, init_batch_size=init,
                   checkpoint_dir=contract.checkpoint_dir(default_checkpoint_dir),
                   incarnation=contract.incarnation(), batch_from_scheduler=chosen is not None)
