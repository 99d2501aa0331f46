"""Online goodput fitting (issue 17): a job's goodput model from what its workers reported, and the
predictions the policies and the views read from it.

Nouns (``core.goodput`` defines the goodput ones):

- **fitted job**: a job with ``batch_limits``, ``grad_stats`` and at least ``MIN_STEP_SAMPLES`` step
  samples in its ``JobView``. Its step-time parameters are fitted to the samples
  (``core.goodput.fit_perf_params``: Pollux's objective and priors); its statistical efficiency comes
  from its latest gradient statistics. Every other job is **declared**: its speed is its declared
  throughput points, else Amdahl's law with the policy's ``amdahl_alpha`` (``core.throughput``), exactly
  as before goodput existed, and its batch size (if it has ``batch_limits``) is the one it was tuned
  for (``init_bsz``, split over its GPUs; ``default_batch``).
- **batch hysteresis** (``batch_for``): at the allocation its current batch was chosen for, a fitted job
  keeps that batch unless the best one has ``BATCH_HYSTERESIS`` more goodput by its fit.
- **explored range**: a fit is trusted up to ``EXPLORE_FACTOR`` x the most GPUs the job has run on
  (Pollux lets a job grow at most that far beyond what it has measured, because a fit extrapolates
  optimistically: with no multi-GPU sample it sees no network cost at all). Beyond it the fitted
  goodput at the edge is carried on by the declared curve's ratio, ``G(r) = G(edge) x S(r) / S(edge)``.
- **speed curve** (``goodput_curve``): goodput per worker count at the best batch size, on the fewest
  servers that hold the workers (``nodes_for``); a relative speed, so policies use it where they use a
  declared curve (``JobEstimate``), anchored at the declared speed of ``min_workers``.
- **prediction** (``predicted_speedups``): the speed-up at other worker counts over the job's current
  size (``min_workers`` when it holds none), with the batch size that goes with each, and the source
  (``fitted`` / ``declared``). The views (``arylctl job ID``) show it.

Fitting is not free (measured on this project's shared 2-core machine): 1 ms for one sample, 20-90 ms
for 2-6 on an idle core, ~180 ms on average under load (a 6-hour Philly run of ``aryl`` on the goodput
evaluation: 216 fits, 78% of its simulation time; fewer Nelder-Mead iterations lose the parameters). So
it is memoised on the sample set (``fitted_perf``, bounded; a hit costs ~0.5 us), and a job's model with
its batch choices on (samples, gradient statistics, limits) (``_model``): a policy that runs every cycle
refits a job only when it reported a new configuration, and recomputes its batch choices only when its
gradient statistics change.

Pure: no I/O, no clock; the memos are of pure functions and change no result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from scheduler_service.core.goodput import (
    BatchChoice,
    BatchSplit,
    GradParams,
    PerfParams,
    StepSample,
    best_batch_size,
    fit_perf_params,
    goodput,
    split_batch,
)
from scheduler_service.core.plan import BatchSize
from scheduler_service.core.snapshot import BatchLimits, JobView
from scheduler_service.core.throughput import model_for

MIN_STEP_SAMPLES = 1     # Pollux fits from the first configuration a job ran (fixed_terms covers the rest)
EXPLORE_FACTOR = 2       # a fit is trusted up to this many times the most GPUs sampled (Pollux's rule)
MIN_ATOMIC_BSZ = 1       # the contract declares no smallest per-GPU batch: any positive one runs
# At an unchanged allocation a job keeps the batch it runs unless the best one has this much more goodput
# (by its fit): gradient statistics are noisy, and each change is an event, a desired state pushed to its
# agents and a batch file rewritten; without it a job's batch wandered every few steps (12, 14, 16, 12, ...).
BATCH_HYSTERESIS = 0.05
GPUS_PER_SERVER = 8      # servers' size when the caller does not say (the predictions' packing)


@lru_cache(maxsize=4096)
def fitted_perf(samples: tuple[StepSample, ...]) -> PerfParams:
    """``core.goodput.fit_perf_params`` on ``samples`` (in a canonical order), memoised: jobs that ran the
    same configurations with the same times share one fit, and a job is refitted only when a sample
    changes."""
    return fit_perf_params(sorted(samples, key=lambda s: (s.nodes, s.replicas, s.atomic_bsz, s.pass_s, s.step_s)))


@dataclass(frozen=True, slots=True)
class FittedGoodput:
    """A fitted job's goodput model: its step-time parameters, gradient statistics and batch limits.
    ``explored``: the most GPUs it has a sample at. ``choice`` memoises per (nodes, GPUs)."""

    perf: PerfParams
    grad: GradParams
    limits: BatchLimits
    explored: int
    _choices: dict[tuple[int, int], BatchChoice] = field(default_factory=dict, repr=False, compare=False)

    def choice(self, nodes: int, replicas: int) -> BatchChoice:
        """The best batch size on ``nodes`` servers x ``replicas`` GPUs and its goodput (samples at
        ``init_bsz`` per second; 0: no valid batch)."""
        key = (nodes, replicas)
        known = self._choices.get(key)
        if known is None:
            lim = self.limits
            top = max(lim.max_bsz, lim.init_bsz)
            atomic_top = max(lim.max_atomic_bsz, MIN_ATOMIC_BSZ)
            known = self._choices[key] = best_batch_size(
                self.perf, self.grad, lim.init_bsz, min(nodes, replicas), replicas, max_batch_size=top,
                atomic_bsz_range=(MIN_ATOMIC_BSZ, atomic_top))
        return known

    @property
    def trusted(self) -> int:
        """The most GPUs the fit speaks for (the explored range)."""
        return max(1, EXPLORE_FACTOR * self.explored)


@lru_cache(maxsize=4096)
def _model(samples: tuple[StepSample, ...], grad: GradParams, limits: BatchLimits) -> FittedGoodput:
    return FittedGoodput(fitted_perf(samples), grad, limits, max(s.replicas for s in samples))


def job_goodput(job: JobView) -> FittedGoodput | None:
    """The job's fitted goodput model, or None when it is a declared job (module doc: it needs batch
    limits, gradient statistics and at least ``MIN_STEP_SAMPLES`` step samples)."""
    if job.batch_limits is None or job.grad_stats is None or len(job.step_samples) < MIN_STEP_SAMPLES:
        return None
    return _model(tuple(job.step_samples), job.grad_stats, job.batch_limits)


def nodes_for(workers: int, gpus_per_worker: int, gpus_per_server: int = GPUS_PER_SERVER) -> int:
    """The fewest servers that hold ``workers`` workers of ``gpus_per_worker`` GPUs (a worker never spans
    servers)."""
    per_server = max(1, gpus_per_server // max(gpus_per_worker, 1))
    return max(1, math.ceil(workers / per_server))


def goodput_curve(job: JobView, model: FittedGoodput, last: int, *, alpha: float,
                  gpus_per_server: int = GPUS_PER_SERVER) -> tuple[tuple[int, float], ...]:
    """Speed per worker count ``1..last`` from the fitted goodput (module doc), as throughput points: the
    fitted goodput relative to the fitted goodput at ``min_workers``, times the declared speed there. A
    count whose batch cannot run (goodput 0) gets the speed of the best smaller count (idle GPUs, no
    slow-down)."""
    declared = model_for(job.throughput_points, alpha)
    gpw = job.gpus_per_worker
    edge_workers = max(1, model.trusted // gpw)

    def raw(workers: int) -> float:
        w = min(workers, edge_workers)
        value = model.choice(nodes_for(w, gpw, gpus_per_server), w * gpw).goodput
        if workers > w and declared.speed(w) > 0:
            value *= declared.speed(workers) / declared.speed(w)
        return value

    anchor = max(job.min_workers, 1)
    base = raw(anchor)
    scale = declared.speed(anchor) / base if base > 0 else 0.0
    points, best = [], 0.0
    for w in range(1, max(last, anchor) + 1):
        best = max(best, raw(w) * scale) if scale > 0 else declared.speed(w)
        points.append((w, best))
    return tuple(points)


def default_batch(limits: BatchLimits, replicas: int) -> BatchSplit:
    """A declared job's batch: ``init_bsz`` (what its hyper-parameters were tuned for), or one sample per
    GPU if it has more GPUs than that, split over its GPUs within ``max_atomic_bsz``."""
    total = min(max(limits.init_bsz, replicas * MIN_ATOMIC_BSZ), max(limits.max_bsz, limits.init_bsz))
    return split_batch(total, replicas, max(limits.max_atomic_bsz, MIN_ATOMIC_BSZ))


def batch_for(job: JobView, nodes: int, workers: int) -> BatchSize | None:
    """The batch size of a job with ``batch_limits`` on ``nodes`` servers x ``workers`` workers: the best
    by its fitted model, else ``default_batch``; None for a job without batch limits or workers."""
    limits = job.batch_limits
    if limits is None or workers <= 0:
        return None
    replicas = workers * job.gpus_per_worker
    model = job_goodput(job)
    split = None
    if model is not None:
        chosen = model.choice(max(1, min(nodes, replicas)), replicas)
        split = chosen.split if chosen.goodput > 0 else None
        now = job.batch_now
        if split is not None and now is not None and now[2] == replicas and (now[0], now[1]) != (
                split.atomic_bsz, split.accum_steps):
            kept = goodput(model.perf, model.grad, limits.init_bsz, max(1, min(nodes, replicas)), replicas,
                           now[0], now[1])
            if kept >= (1.0 - BATCH_HYSTERESIS) * chosen.goodput:
                split = BatchSplit(now[0], now[1])
    if split is None:
        split = default_batch(limits, replicas)
    return BatchSize(job.job_id, split.atomic_bsz, split.accum_steps)


@dataclass(frozen=True, slots=True)
class SpeedupPrediction:
    """The predicted speed of a job at ``workers`` workers over its speed at ``reference`` workers, and
    the batch that goes with it (None: the job has no batch limits)."""

    workers: int
    reference: int
    speedup: float
    batch: BatchSize | None
    source: str  # "fitted" | "declared"


def predicted_speedups(job: JobView, workers: Sequence[int], *, alpha: float = 0.05,
                       gpus_per_server: int = GPUS_PER_SERVER) -> tuple[SpeedupPrediction, ...]:
    """The job's predicted speed-up at each of ``workers`` (module doc), over its current size
    (``min_workers`` when it holds none). ``alpha``: the policy's Amdahl fraction for declared jobs."""
    reference = job.num_workers or max(job.min_workers, 1)
    model = job_goodput(job)
    last = max([reference, *workers])
    if model is not None:
        speeds = dict(goodput_curve(job, model, last, alpha=alpha, gpus_per_server=gpus_per_server))
        source = "fitted"
    else:
        declared = model_for(job.throughput_points, alpha)
        speeds = {w: declared.speed(w) for w in range(1, last + 1)}
        source = "declared"
    base = speeds.get(reference, 0.0)
    out = []
    for w in workers:
        value = speeds.get(w, 0.0)
        out.append(SpeedupPrediction(w, reference, value / base if base > 0 else 0.0,
                                     batch_for(job, nodes_for(w, job.gpus_per_worker, gpus_per_server), w),
                                     source))
    return tuple(out)
