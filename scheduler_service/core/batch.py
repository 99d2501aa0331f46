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
from scheduler_service.core.goodput import BatchSplit, GradParams, StepSample
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


def step_sample(nodes: int, replicas: int, local_batch_size: int, accum_steps: int, pass_s: float,
                step_s: float) -> StepSample:
    """A measured step as ``core.goodput`` fits it, a step without accumulation: one that ran
    ``accum_steps`` extra passes counts without them (its time less that many passes, never below one
    pass), as Pollux's model adds them back (``core.goodput.step_time``)."""
    return StepSample(nodes=nodes, replicas=replicas, atomic_bsz=float(local_batch_size), pass_s=pass_s,
                      step_s=max(step_s - accum_steps * pass_s, pass_s))


def prediction_sizes(min_workers: int, max_workers: int, current: int, *, most: int = 12) -> tuple[int, ...]:
    """The worker counts a job's predicted speed-ups are shown at: every size from ``min_workers`` to
    ``max_workers`` when there are at most ``most``, else the ends, its current size and its neighbours,
    and the powers of two between."""
    low, high = max(min_workers, 1), max(max_workers, min_workers, 1)
    if high - low + 1 <= most:
        return tuple(range(low, high + 1))
    sizes = {low, high, *(c for c in (current - 1, current, current + 1) if low <= c <= high)}
    power = 1
    while power < high and len(sizes) < most:
        if power > low:
            sizes.add(power)
        power *= 2
    return tuple(sorted(sizes))
