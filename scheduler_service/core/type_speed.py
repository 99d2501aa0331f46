"""How fast one job runs on each GPU type: measured where it ran, bootstrapped from declared factors elsewhere
(issue 33, item 4).

Nouns: a job's **per-GPU speed** on a type is the samples one GPU of that type computes per second, its local
batch over its pass time (``StepTimeInfo``: the forward/backward pass without the gradient sync, so the
figure is the GPU's, not the network's), taken at the largest local batch measured on that type (a GPU is
most efficient there, and that is the batch a goodput policy runs it at). A **declared factor** is the
operator's relative speed of a GPU type (``scheduling.gpu_speeds``: ``{"a100": 1.0, "t4": 0.25}``), the same
for every job. A type the job has not run on is **bootstrapped**: its speed on the types it ran on (those
with a declared factor), scaled by the factors' ratio, averaged over them. A type with neither a measure nor
a factor has no estimate (it is left out, never guessed).

``relative``: over the fastest type in the estimate, so a reader sees at once what a slower server costs.

Must never: read the store, the clock or a policy; it is a pure function of what the job reported.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduler_service.core.snapshot import JobView

MEASURED, BOOTSTRAPPED = "measured", "bootstrapped"


class StepTimeInfo(Protocol):
    """What a measure needs (``records.StepTimeInfo`` has it): the GPU model, local batch and pass time."""

    @property
    def gpu_type(self) -> str: ...
    @property
    def local_batch_size(self) -> int: ...
    @property
    def pass_time_s(self) -> float: ...


@dataclass(frozen=True, slots=True)
class TypeSpeed:
    gpu_type: str
    samples_per_gpu_s: float  # one GPU's samples per second at the local batch it was measured at
    local_batch_size: int     # that batch (measured), or the one of the speeds it was bootstrapped from (0: mixed)
    source: str               # MEASURED or BOOTSTRAPPED
    relative: float = 1.0     # over the fastest type of the estimate


def measured_speeds(step_times: Iterable[StepTimeInfo]) -> dict[str, tuple[float, int]]:
    """Per GPU type the job ran on alone (a configuration of one known model): its per-GPU speed at the
    largest local batch measured there, with that batch."""
    best: dict[str, tuple[int, float]] = {}
    for t in step_times:
        if not t.gpu_type or t.pass_time_s <= 0 or t.local_batch_size <= 0:
            continue
        speed = t.local_batch_size / t.pass_time_s
        known = best.get(t.gpu_type)
        if known is None or (t.local_batch_size, speed) > known:
            best[t.gpu_type] = (t.local_batch_size, speed)
    return {gpu_type: (speed, batch) for gpu_type, (batch, speed) in best.items()}


def type_speeds(step_times: Sequence[StepTimeInfo], declared: Mapping[str, float],
                types: Iterable[str] = ()) -> tuple[TypeSpeed, ...]:
    """The job's speed on each type it ran on (measured) and on each other type of ``types`` or ``declared``
    that a declared factor reaches (bootstrapped); fastest first, then by name."""
    return estimate(measured_speeds(step_times), declared, types)


def estimate(measured: Mapping[str, tuple[float, int]], declared: Mapping[str, float],
             types: Iterable[str] = ()) -> tuple[TypeSpeed, ...]:
    """``type_speeds`` from the measured (speed, batch) per type."""
    out = [TypeSpeed(gpu_type, speed, batch, MEASURED) for gpu_type, (speed, batch) in measured.items()]
    anchors = [(speed, batch, declared[gpu_type]) for gpu_type, (speed, batch) in measured.items()
               if declared.get(gpu_type, 0.0) > 0]
    if anchors:
        batches = {batch for _, batch, _ in anchors}
        anchor_batch = batches.pop() if len(batches) == 1 else 0
        for gpu_type in sorted(set(types) | set(declared)):
            factor = declared.get(gpu_type, 0.0)
            if gpu_type in measured or not gpu_type or factor <= 0:
                continue
            speed = sum(s * factor / f for s, _, f in anchors) / len(anchors)
            out.append(TypeSpeed(gpu_type, speed, anchor_batch, BOOTSTRAPPED))
    fastest = max((s.samples_per_gpu_s for s in out), default=0.0)
    return tuple(sorted(
        (TypeSpeed(s.gpu_type, s.samples_per_gpu_s, s.local_batch_size, s.source,
                   s.samples_per_gpu_s / fastest if fastest > 0 else 0.0) for s in out),
        key=lambda s: (-s.samples_per_gpu_s, s.gpu_type)))


def job_type_speeds(job: JobView, declared: Mapping[str, float], types: Iterable[str]) -> dict[str, float]:
    """A policy's speed factor of each GPU type in ``types`` for ``job``: its per-GPU speed there over its
    fastest (measured or bootstrapped, ``JobView.type_speeds``), where that is known; elsewhere the type's
    declared factor (``ClusterSnapshot.gpu_speed``; 1 if none is declared), scaled alike."""
    wanted = list(types)
    known = {s.gpu_type: s.relative
             for s in estimate({t: (v, 0) for t, v in job.type_speeds}, declared, wanted)}
    if not known:
        return {t: declared.get(t, 1.0) for t in wanted}
    # A type the job's measures do not reach (no factor declared for it): the mean of the known ones.
    rest = sum(known.values()) / len(known)
    return {t: known.get(t, rest) for t in wanted}
