"""Predicted finish of a job, and whether it meets its deadline.

``remaining_seconds(job, workers, now)`` is the one estimate of how long a job still needs at a given
size; the rest of the module builds on it:

- *Measured*: once the job reported progress twice at its current size (``JobView.progress_window``)
  and declared its ``total_work``, its own rate there (work/s) gives the remaining time at that size;
  other sizes scale that rate by the throughput model's speed ratio (``core.throughput``:
  ``speed(n) / speed(measured size)``), so a measured rate corrects the declared curve's level and
  keeps its shape. No extrapolation past the last report: a stalled job's finish slips, never arrives.
- *Declared*, before any measured rate: ``(total_work - work_done) / speed(n)`` with declared points
  and total work; else the declared ``estimated_runtime`` (at ``min_workers``) scaled by the model,
  less the time run at the current size since its last resize, never below 10% of the estimate and
  growing again past it (``throughput.work_left``, as ``throughput.estimate``). Nothing declared and
  nothing measured: unknown (None), never a guess.

*Confidence* (0..1) says how far to trust a prediction: measured, ``r / (r + 3)`` for ``r`` reports
after the first at this size (1 report: 0.25, 3: 0.5, 9: 0.75), at most 0.95, times 0.8 at a size other
than the measured one (the model's shape is then assumed); declared points and total work: 0.3; a
declared run time only: 0.15.

A *deadline outlook* compares the predicted finish with the job's deadline at the size it runs at
(its ``min_workers`` while it waits) and, when late, finds the fewest workers (up to ``max_workers``
and what the cluster could give) that would meet it.

Pure: no I/O, no clock (``now`` is passed in); times print in UTC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.snapshot import JobView
from scheduler_service.core.throughput import JobEstimate, model_for, work_left
from scheduler_service.lifecycle import JobState

DEFAULT_ALPHA = PolicyParams.amdahl_alpha  # the speed-up model for jobs that declare no points


# A prediction further out than this says nothing (a declared rate near zero, a stalled job's last
# rate): it is reported as unknown, never as a date (a Timestamp ends in year 9999).
HORIZON_S = 100 * 365 * 86400.0


def remaining_seconds(job: JobView, workers: int, now: float, *, alpha: float = DEFAULT_ALPHA) -> float | None:
    """Predicted seconds from ``now`` until ``job`` finishes if it runs at ``workers`` workers from now
    on (restart costs not included); None when nothing measured or declared says (see the module doc),
    or when the figure is not a finite time within ``HORIZON_S``."""
    if workers <= 0:
        return None
    try:
        remaining = _remaining(job, workers, now, alpha)
    except (ZeroDivisionError, OverflowError):
        return None
    if remaining is None or not math.isfinite(remaining) or not 0.0 <= remaining <= HORIZON_S:
        return None
    return remaining



def predicted_remaining(job: JobView, workers: int, now: float, fallback: JobEstimate, alpha: float) -> float:
    """Seconds ``job`` still needs at ``workers`` workers: the service's prediction (``remaining_seconds``),
    or ``fallback``'s (a policy's estimate, ``core.throughput.estimate``) where it has none."""
    known = remaining_seconds(job, workers, now, alpha=alpha)
    return known if known is not None else fallback.remaining_time(workers)


def _remaining(job: JobView, workers: int, now: float, alpha: float) -> float | None:
    model = model_for(job.throughput_points, alpha)
    rate = _measured_rate(job)
    if rate is not None and job.progress_window is not None:
        window = job.progress_window
        speed = rate * model.speed(workers) / model.speed(window.workers)
        return max(job.total_work - window.last_work, 0.0) / speed
    speed = model.speed(workers)
    if job.throughput_points and job.total_work > 0:
        return max(job.total_work - _work_done(job, now, model.speed(job.num_workers)), 0.0) / speed
    if job.estimated_runtime_s:
        total = job.estimated_runtime_s * model.speed(job.min_workers)  # in the model's relative unit
        done = _time_at_current_size(job, now) * model.speed(job.num_workers)
        return work_left(total, done) / speed
    return None


def confidence(job: JobView, workers: int) -> float:
    """How far to trust ``remaining_seconds(job, workers, ...)``, 0..1 (see the module doc)."""
    if _measured_rate(job) is not None and job.progress_window is not None:
        reports = job.progress_window.reports
        measured = min(reports / (reports + 3), 0.95)
        return measured if workers == job.progress_window.workers else 0.8 * measured
    if job.throughput_points and job.total_work > 0:
        return 0.3
    if job.estimated_runtime_s:
        return 0.15
    return 0.0


class Basis(StrEnum):
    """What a prediction rests on."""

    MEASURED = "measured"          # the job's own rate at this size
    SCALED = "measured, scaled"    # its rate at another size, scaled by the throughput model
    DECLARED = "declared"          # its throughput hints only


@dataclass(frozen=True, slots=True)
class Prediction:
    workers: int          # the size it is predicted at
    remaining_s: float
    finish: float         # now + remaining_s
    confidence: float
    basis: Basis


def predict(job: JobView, now: float, workers: int | None = None, *, alpha: float = DEFAULT_ALPHA) -> Prediction | None:
    """The predicted finish at ``workers`` (default: its current size, or ``min_workers`` while it
    waits, as if it started now); None when unknown."""
    size = workers if workers is not None else job.num_workers or job.min_workers
    remaining = remaining_seconds(job, size, now, alpha=alpha)
    if remaining is None:
        return None
    window = job.progress_window if _measured_rate(job) is not None else None
    basis = Basis.DECLARED if window is None else Basis.MEASURED if window.workers == size else Basis.SCALED
    return Prediction(size, remaining, now + remaining, confidence(job, size), basis)


class DeadlineStatus(StrEnum):
    """Where a job stands against its deadline (``types.proto`` ``DeadlineStatus``)."""

    NONE = "NONE"            # no deadline
    UNKNOWN = "UNKNOWN"      # a deadline, but no prediction (nothing declared or measured)
    ON_TRACK = "ON_TRACK"    # predicted to finish by it at its size
    AT_RISK = "AT_RISK"      # late at its size, in time with more workers (``workers_needed``)
    WILL_MISS = "WILL_MISS"  # late even at the most workers it could have
    MET = "MET"              # completed by its deadline
    MISSED = "MISSED"        # completed after it, or ended without completing after it passed


@dataclass(frozen=True, slots=True)
class DeadlineOutlook:
    status: DeadlineStatus
    note: str                          # one line for people (``arylctl job``/``explain``)
    prediction: Prediction | None      # at its size (None: unknown, or the job has ended)
    workers_needed: int | None = None  # AT_RISK: the fewest workers that meet the deadline


def deadline_outlook(
    job: JobView, now: float, *, finished_at: float | None = None, most_workers: int | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> DeadlineOutlook:
    """``job``'s prediction against its deadline. ``most_workers``: the most workers it could have (the
    cluster's share; default and at most ``max_workers``). ``finished_at``: when an ended job ended."""
    deadline = job.deadline
    if job.state.is_terminal:
        if deadline is None:
            return DeadlineOutlook(DeadlineStatus.NONE, "", None)
        end = finished_at if finished_at is not None else now
        if job.state == JobState.COMPLETED and end <= deadline:
            return DeadlineOutlook(DeadlineStatus.MET, f"met its deadline: finished {_span(deadline - end)} before it",
                                   None)
        if job.state == JobState.COMPLETED:
            return DeadlineOutlook(DeadlineStatus.MISSED, f"missed its deadline by {_span(end - deadline)}", None)
        if end > deadline:
            return DeadlineOutlook(DeadlineStatus.MISSED, f"ended {job.state.lower()} after its deadline", None)
        return DeadlineOutlook(DeadlineStatus.NONE, f"ended {job.state.lower()} before its deadline", None)
    prediction = predict(job, now, alpha=alpha)
    if prediction is None:
        if deadline is None:
            return DeadlineOutlook(DeadlineStatus.NONE, "", None)
        return DeadlineOutlook(DeadlineStatus.UNKNOWN, "no prediction: it declares no throughput hints (total_work "
                               "with points, or estimated_runtime) and has reported no progress rate yet", None)
    at = f"{prediction.workers} worker{'s' if prediction.workers != 1 else ''}"
    if deadline is None:
        return DeadlineOutlook(DeadlineStatus.NONE, f"finishes ~{clock_time(prediction.finish, now)} at {at}",
                               prediction)
    if prediction.finish <= deadline:
        return DeadlineOutlook(DeadlineStatus.ON_TRACK, f"on track: finishes {clock_time(prediction.finish, now)}, "
                               f"{_span(deadline - prediction.finish)} before its deadline", prediction)
    late = f"will miss its deadline by ~{_span(prediction.finish - deadline)} at {at}"
    if deadline <= now:
        return DeadlineOutlook(DeadlineStatus.WILL_MISS, f"{late}: the deadline passed {_span(now - deadline)} ago",
                               prediction)
    cap = min(job.max_workers, most_workers) if most_workers is not None else job.max_workers
    needed = workers_needed(job, now, deadline, cap, alpha=alpha)
    if needed is not None:
        return DeadlineOutlook(DeadlineStatus.AT_RISK, f"{late}; needs {needed}", prediction, needed)
    best = remaining_seconds(job, cap, now, alpha=alpha) if cap > prediction.workers else None
    if best is None:
        limit = "its max" if cap == job.max_workers else "the most the cluster could give it,"
        return DeadlineOutlook(DeadlineStatus.WILL_MISS, f"{late} ({limit} {prediction.workers})", prediction)
    even = f"even {cap} workers would be ~{_span(now + best - deadline)} late"
    return DeadlineOutlook(DeadlineStatus.WILL_MISS, f"{late}; {even}", prediction)


def admission_outlook(job: JobView, now: float, most_workers: int, *, alpha: float = DEFAULT_ALPHA) -> DeadlineOutlook:
    """SubmitJob's feedback on a job not started yet: its finish if it started ``now`` at the most workers it
    could have (``most_workers``, at most ``max_workers``), and whether that meets its deadline: ON_TRACK
    (with the fewest workers that would), WILL_MISS, UNKNOWN (nothing declared), or NONE (no deadline)."""
    most = max(min(job.max_workers, most_workers), job.min_workers)
    limit = f"its max {most} workers" if most == job.max_workers else f"{most} workers (the most the cluster holds)"
    prediction = predict(job, now, most, alpha=alpha)
    deadline = job.deadline
    if prediction is None:
        if deadline is None:
            return DeadlineOutlook(DeadlineStatus.NONE, "", None)
        return DeadlineOutlook(DeadlineStatus.UNKNOWN, "cannot judge its deadline: it declares no throughput hints "
                               "(total_work with points, or estimated_runtime)", None)
    if deadline is None:
        return DeadlineOutlook(DeadlineStatus.NONE, f"finishes ~{clock_time(prediction.finish, now)} if it starts now "
                               f"at {limit}", prediction)
    needs = f"needs ~{_span(prediction.remaining_s)} at {limit}"
    if prediction.finish > deadline:
        return DeadlineOutlook(DeadlineStatus.WILL_MISS, f"cannot meet its deadline: {needs}; the deadline is in "
                               f"{_span(deadline - now)}", prediction)
    fewest = workers_needed(job, now, deadline, most, alpha=alpha)
    return DeadlineOutlook(DeadlineStatus.ON_TRACK, f"can meet its deadline: {needs}, the deadline is in "
                           f"{_span(deadline - now)}; at least {fewest} worker(s) from now on", prediction, fewest)


def workers_needed(job: JobView, now: float, deadline: float, most: int, *, alpha: float = DEFAULT_ALPHA) -> int | None:
    """The fewest workers in ``min_workers..most`` that finish by ``deadline``; None if none does."""
    for workers in range(job.min_workers, most + 1):
        remaining = remaining_seconds(job, workers, now, alpha=alpha)
        if remaining is not None and now + remaining <= deadline:
            return workers
    return None


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def clock_time(at: float, now: float) -> str:
    """``17:40 UTC``, with the date (``Nov 25 17:40 UTC``) when ``at`` is not on ``now``'s day (UTC).
    Arithmetic on epoch seconds: the core imports no clock module."""
    day, minute = divmod(int(at // 60), 24 * 60)
    hhmm = f"{minute // 60:02d}:{minute % 60:02d} UTC"
    if day == int(now // 86400):
        return hhmm
    _, month, mday = _civil_date(day)
    return f"{_MONTHS[month - 1]} {mday:02d} {hhmm}"


def _civil_date(days: int) -> tuple[int, int, int]:
    """(year, month, day) of ``days`` since 1970-01-01 in the proleptic Gregorian calendar (the inverse
    of the usual days-from-civil count, in 400-year eras)."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _span(seconds: float) -> str:
    """A duration for people: ``45 s``, ``20 min``, ``2.5 h``, ``3.0 d``."""
    seconds = max(seconds, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _measured_rate(job: JobView) -> float | None:
    """The job's own rate at its current size, when it can turn into a remaining time."""
    window = job.progress_window
    if window is None or job.total_work <= 0 or window.workers <= 0:
        return None
    return window.rate


def _time_at_current_size(job: JobView, now: float) -> float:
    if not job.workers or job.last_resized_at is None:
        return 0.0
    return max(now - job.last_resized_at, 0.0)


def _work_done(job: JobView, now: float, current_speed: float) -> float:
    """Reported progress; without any, the work of running at the current size since the last resize."""
    return job.work_done or _time_at_current_size(job, now) * current_speed
