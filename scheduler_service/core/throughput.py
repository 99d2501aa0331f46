"""Throughput model per job: speed vs number of workers, and the completion-time estimates built on it.

A job's speed at ``w`` workers comes from the points the user declared (piecewise-linear between
them, proportional below the first, extended with the last segment's slope -- never decreasing --
above the last), or, without points, from Amdahl's law with a serial fraction ``alpha``
(``amdahl_speedup``). Speeds are in the job's own unit (samples/s); without points they are relative
(1 worker = 1.0).

The remaining work is ``total_work - work_done`` when the job declared both points and total work;
otherwise it is derived from the estimated run time at ``min_workers`` (declared, or the policy's
default), minus what the job did so far (``work_left``: near and past the estimate, it grows again).
``remaining_time(w)`` is then ``remaining_work / speed(w)``.

Speeds are memoised: a model remembers each speed it computed, and ``model_for`` hands out one model
per (points, alpha), so a scheduler that estimates the same jobs every cycle interpolates each
curve once. Memos of pure functions, bounded; they change no result.

Pure: no I/O, no clock (``now`` is passed in).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field
from functools import lru_cache

from scheduler_service.core.snapshot import JobView


def amdahl_speedup(n: int, alpha: float) -> float:
    """Amdahl's law: the speed-up of ``n`` workers over one, ``n / (1 + alpha (n - 1))``, when a
    fraction ``alpha`` of the work is serial (0: linear, 1: no gain). 1.0 at ``n = 1``; for ``alpha``
    in [0, 1] it never decreases as ``n`` grows, and it tends to ``1 / alpha``.

    The one definition of the formula. ``ThroughputModel`` uses it as a job's relative speed when the
    job declared no points, and to extend a single declared point (the ratio of two speed-ups); the
    simulator's trace loader (``simulator.traces``) uses it over GPUs, ``n`` = GPUs, to build the
    declared curves of its jobs -- so the policy and the simulated truth agree on what Amdahl means.
    """
    return n / (1.0 + alpha * (n - 1))


@dataclass(frozen=True, slots=True)
class ThroughputModel:
    points: tuple[tuple[int, float], ...] = ()
    alpha: float = 0.05  # Amdahl serial fraction, used when no points are declared
    _speeds: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _rows: dict[tuple[int, int], tuple[float, ...]] = field(default_factory=dict, init=False, repr=False,
                                                            compare=False)

    def speed(self, workers: int) -> float:
        known = self._speeds.get(workers)
        if known is None:
            known = self._speeds[workers] = self._speed(workers)
        return known

    def speeds(self, first: int, count: int) -> tuple[float, ...]:
        """``(speed(first), speed(first + 1), ..., speed(first + count - 1))``."""
        row = self._rows.get((first, count))
        if row is None:
            row = self._rows[(first, count)] = tuple(self.speed(w) for w in range(first, first + count))
        return row

    def _speed(self, workers: int) -> float:
        if workers <= 0:
            return 0.0
        if not self.points:
            return amdahl_speedup(workers, self.alpha)
        xs = [w for w, _ in self.points]
        ys = [s for _, s in self.points]
        if workers <= xs[0]:
            return ys[0] * workers / xs[0]
        if workers >= xs[-1]:
            if len(xs) == 1:  # one point: Amdahl through it (the ratio first: the same rounding as ever)
                return ys[0] * (amdahl_speedup(workers, self.alpha) / amdahl_speedup(xs[0], self.alpha))
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            return ys[-1] + slope * (workers - xs[-1])
        i = bisect_left(xs, workers)
        if xs[i] == workers:
            return ys[i]
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (workers - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class JobEstimate:
    """Remaining work of a job and the model to turn it into time at any worker count."""

    model: ThroughputModel
    remaining_work: float

    def remaining_time(self, workers: int) -> float:
        speed = self.model.speed(workers)
        return self.remaining_work / speed if speed > 0 else float("inf")

    def remaining_gpu_time(self, workers: int, gpus_per_worker: int) -> float:
        return self.remaining_time(workers) * workers * gpus_per_worker

    def jct_reduction(self, workers: int, extra: int) -> float:
        """Seconds of completion time saved by running with ``extra`` more workers."""
        return self.remaining_time(workers) - self.remaining_time(workers + extra)

    def jct_reductions(self, workers: int, most: int) -> list[float]:
        """``[jct_reduction(workers, k) for k in 1..most]`` (the same arithmetic, computed at once)."""
        work, inf = self.remaining_work, float("inf")
        base, *more = self.model.speeds(workers, most + 1)
        now = work / base if base > 0 else inf  # remaining_time(workers)
        return [now - (work / s if s > 0 else inf) for s in more]


@lru_cache(maxsize=16384)
def model_for(points: tuple[tuple[int, float], ...], alpha: float) -> ThroughputModel:
    """The (shared, memoising) model of a speed curve; equal inputs give the same object."""
    return ThroughputModel(points=points, alpha=alpha)


def estimate(job: JobView, *, now: float, default_runtime_s: float, alpha: float) -> JobEstimate:
    model = model_for(job.throughput_points, alpha)
    if job.throughput_points and job.total_work > 0:
        return JobEstimate(model, max(job.total_work - job.work_done, 0.0))
    runtime = job.estimated_runtime_s if job.estimated_runtime_s else default_runtime_s
    total = runtime * model.speed(job.min_workers)
    done = job.work_done
    if not done and job.workers and job.last_resized_at is not None:
        # No progress reported: assume it has been running at its current size since its last resize.
        done = max(now - job.last_resized_at, 0.0) * model.speed(job.num_workers)
    return JobEstimate(model, work_left(total, done))


def work_left(total: float, done: float) -> float:
    """Work left of a job whose user estimated ``total`` and that has done ``done`` (one unit): the estimate
    less what it did, while that is at least 10% of the estimate; from 90% of it on, the time left grows
    again with every unit done (``done - 0.8 total``: 20% of the estimate at the estimate, 1.2x it at twice).

    A job past its estimate has shown the estimate short, and the longer it outlives it the longer it is
    likely to run yet: with user estimates off by a log-normal factor, the expected time left of a job past
    its estimate is about the estimate again and grows with its age. A fixed floor (10% of the estimate,
    forever) made every overrunning job look nearly done: a scheduler ranking by time left then kept
    giving it GPUs ahead of queued work. Continuous, so a prediction never jumps."""
    return max(total - done, done - 0.8 * total)
