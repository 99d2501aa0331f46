"""The batch a job adapting its batch size runs with (issue 17): the one a goodput-aware policy chose
for its allocation, else the default -- its init batch split over its GPUs in the fewest passes that
fit its largest per-GPU batch (``core.goodput.split_batch``; one sample per GPU at least).

A choice holds for the GPU count it was made for: a job resized without a new choice (a policy that
does not choose batches, or one that chose none for the new size) runs the default again, never a
per-GPU batch chosen for another size (its total would be another batch than anyone chose).

Never: read a clock, a store or any cluster state. Pure functions of numbers.
"""

from __future__ import annotations

from scheduler_service.core import goodput_fit
from scheduler_service.core.goodput import BatchSplit, GradParams
from scheduler_service.core.snapshot import BatchLimits


def default_batch(limits: BatchLimits, gpus: int) -> BatchSplit:
    """The init batch over ``gpus`` GPUs (at least one), never a pass above ``max_atomic_bsz``: the
    batch a policy's goodput model gives a job it has not fitted (``core.goodput_fit.default_batch``,
    one rule for both)."""
    return goodput_fit.default_batch(limits, max(gpus, 1))


def job_batch(limits: BatchLimits | None, chosen: BatchSplit | None, chosen_for_gpus: int | None,
              gpus: int) -> BatchSplit | None:
    """The batch of a job holding ``gpus`` GPUs: ``chosen`` when it was chosen for that many, else the
    default; None for a job without batch limits, or one that holds no GPU (it runs no batch)."""
    if limits is None or gpus <= 0:
        return None
    if chosen is not None and chosen_for_gpus == gpus:
        return chosen
    return default_batch(limits, gpus)


def noise_scale(grad: GradParams | None, init_bsz: int) -> float:
    """The gradient noise scale in samples (Pollux's phi: ``init_bsz * var / sqr``, the batch size at
    which the gradient's noise and its signal weigh the same); 0 when not measured."""
    if grad is None or grad.sqr <= 0:
        return 0.0
    return init_bsz * grad.var / grad.sqr
