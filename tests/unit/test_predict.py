"""core.predict: remaining time from a job's own measured rate (scaled by the throughput model for
other sizes), from its declared hints before that, and its outlook against a deadline. Every expected
figure is worked out by hand in the comments."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from scheduler_service.core.predict import (
    Basis,
    DeadlineStatus,
    admission_outlook,
    clock_time,
    confidence,
    deadline_outlook,
    predict,
    remaining_seconds,
    workers_needed,
)
from scheduler_service.core.snapshot import JobView, ProgressWindow, WorkerView
from scheduler_service.lifecycle import JobState

# Declared: 10 samples/s per worker up to 4 (40/s), and the same slope beyond: speed(w) = 10 w.
POINTS = ((1, 10.0), (2, 20.0), (4, 40.0))


def running(workers: int = 4, **changes: Any) -> JobView:
    job = JobView(
        job_id=1, state=JobState.RUNNING, gpus_per_worker=1, min_workers=2, max_workers=8, priority=0,
        submitted_at=0.0, workers=tuple(WorkerView(r, "s1", (r,)) for r in range(workers)),
        throughput_points=POINTS, total_work=10_000.0, started_at=0.0, last_resized_at=0.0,
    )
    return dataclasses.replace(job, **changes)


def window(first: tuple[float, float], last: tuple[float, float], reports: int, workers: int = 4) -> ProgressWindow:
    return ProgressWindow(workers=workers, first_work=first[1], first_at=first[0], last_work=last[1],
                          last_at=last[0], reports=reports)


def test_measured_rate_at_its_size_and_scaled_to_others() -> None:
    # 1,000 samples in 100 s at 4 workers: 10/s (a quarter of the declared 40/s); 8,000 left.
    job = running(work_done=2000.0, progress_window=window((1000.0, 1000.0), (1100.0, 2000.0), reports=10))
    assert remaining_seconds(job, 4, 1100.0) == pytest.approx(800.0)
    # Other sizes keep the declared shape: speed(8)/speed(4) = 80/40 -> 20/s -> 400 s; speed(2) = 20 -> 1,600 s.
    assert remaining_seconds(job, 8, 1100.0) == pytest.approx(400.0)
    assert remaining_seconds(job, 2, 1100.0) == pytest.approx(1600.0)
    assert confidence(job, 4) == pytest.approx(10 / 13)        # r / (r + 3), r = 10
    assert confidence(job, 8) == pytest.approx(0.8 * 10 / 13)  # another size: the model's shape assumed
    p = predict(job, 1100.0)
    assert p is not None and (p.workers, p.basis) == (4, Basis.MEASURED) and p.finish == pytest.approx(1900.0)
    p8 = predict(job, 1100.0, 8)
    assert p8 is not None and p8.basis == Basis.SCALED


def test_declared_before_any_progress() -> None:
    job = running(last_resized_at=None, workers=0, state=JobState.PENDING)
    # 10,000 / speed(w): 250 s at 4, 1,000 s at 1; confidence of declared points: 0.3.
    assert remaining_seconds(job, 4, 0.0) == pytest.approx(250.0)
    assert remaining_seconds(job, 1, 0.0) == pytest.approx(1000.0)
    assert confidence(job, 4) == 0.3
    # Pending: predicted at min_workers (2) as if it started now: 10,000 / 20 = 500 s.
    p = predict(job, 100.0)
    assert p is not None and p.finish == pytest.approx(600.0)
    # Only an estimated run time (1 h at min_workers = 2), Amdahl alpha 0.05: speed(2) = 2/1.05,
    # speed(4) = 4/1.15 -> 3600 * (2/1.05) / (4/1.15) = 1971.43 s.
    bare = dataclasses.replace(job, throughput_points=(), total_work=0.0, estimated_runtime_s=3600.0)
    assert remaining_seconds(bare, 4, 0.0) == pytest.approx(3600 * (2 / 1.05) / (4 / 1.15))
    assert confidence(bare, 4) == 0.15
    # Nothing declared, nothing measured: unknown, not a guess.
    nothing = dataclasses.replace(bare, estimated_runtime_s=None)
    assert remaining_seconds(nothing, 4, 0.0) is None and predict(nothing, 0.0) is None
    assert deadline_outlook(dataclasses.replace(nothing, deadline=5000.0), 0.0).status == DeadlineStatus.UNKNOWN


def test_prediction_converges_on_a_job_with_steady_progress() -> None:
    """The job truly does 10 samples/s at 4 workers (declared: 40/s) and reports every 10 s from t = 10:
    progress 100 k at t = 10 k. Its true finish is t = 1,000 (10,000 samples)."""
    job = running()
    finishes, confidences = [], []
    for k in range(1, 11):
        t = 10.0 * k
        w = None if k == 1 else window((10.0, 100.0), (t, 100.0 * k), reports=k - 1)
        p = predict(running(work_done=100.0 * k, progress_window=w), t)
        assert p is not None
        finishes.append(p.finish)
        confidences.append(p.confidence)
    # One report: the declared curve from the reported progress, 10 + (10,000 - 100) / 40 = 257.5 (wrong).
    assert finishes[0] == pytest.approx(257.5) and confidences[0] == 0.3
    # From the second report on: its own rate, 10/s -> t + (10,000 - 100 k) / 10 = 1,000 exactly.
    assert finishes[1:] == pytest.approx([1000.0] * 9)
    # Confidence grows with the reports: 1/4, 2/5, 3/6, ... 9/12.
    assert confidences[1:] == pytest.approx([r / (r + 3) for r in range(1, 10)])
    assert confidences[1:] == sorted(confidences[1:])
    p = predict(job, 0.0)
    assert p is not None and p.finish == pytest.approx(250.0)


def test_a_rate_that_drifts_is_followed() -> None:
    # 10/s for 100 s, then 5/s for 100 s: the window's mean rate is 7.5/s; 8,500 left -> 1,133.3 s.
    job = running(work_done=1500.0, progress_window=window((0.0, 0.0), (200.0, 1500.0), reports=20))
    assert remaining_seconds(job, 4, 200.0) == pytest.approx(8500 / 7.5)
    # No progress between two reports yet (or time): no rate, the declared curve stands.
    flat = running(work_done=100.0, progress_window=window((10.0, 100.0), (20.0, 100.0), reports=1))
    assert remaining_seconds(flat, 4, 20.0) == pytest.approx(9900 / 40)


def test_deadline_outlook_texts() -> None:
    # Measured 10/s at 4 workers, 8,000 left at now = 1,100: finishes at 1,900 (00:31:40 UTC, Jan 1 1970).
    job = running(work_done=2000.0, progress_window=window((1000.0, 1000.0), (1100.0, 2000.0), reports=10))
    on_track = deadline_outlook(dataclasses.replace(job, deadline=3100.0), 1100.0)
    assert on_track.status == DeadlineStatus.ON_TRACK
    assert on_track.note == "on track: finishes 00:31 UTC, 20 min before its deadline"
    # Deadline at 1,600: 300 s late at 4. At w workers the rate is 2.5 w (10 * 10w / 40), so 3,200 / w s:
    # w = 7 needs 457 s <= 500, w = 6 needs 533 s.
    at_risk = deadline_outlook(dataclasses.replace(job, deadline=1600.0), 1100.0)
    assert at_risk.status == DeadlineStatus.AT_RISK and at_risk.workers_needed == 7
    assert at_risk.note == "will miss its deadline by ~5 min at 4 workers; needs 7"
    assert workers_needed(job, 1100.0, 1600.0, 8) == 7
    # The cluster could give it 6 at most: 533.3 s, 33 s late.
    miss = deadline_outlook(dataclasses.replace(job, deadline=1600.0), 1100.0, most_workers=6)
    assert miss.status == DeadlineStatus.WILL_MISS
    assert miss.note == "will miss its deadline by ~5 min at 4 workers; even 6 workers would be ~33 s late"
    passed = deadline_outlook(dataclasses.replace(job, deadline=1000.0), 1100.0)
    assert passed.status == DeadlineStatus.WILL_MISS and "the deadline passed 2 min ago" in passed.note
    assert deadline_outlook(job, 1100.0).note == "finishes ~00:31 UTC at 4 workers"


def test_ended_jobs_met_or_missed() -> None:
    done = running(state=JobState.COMPLETED, workers=0, deadline=5000.0)
    met = deadline_outlook(done, 9000.0, finished_at=3800.0)
    assert (met.status, met.note) == (DeadlineStatus.MET, "met its deadline: finished 20 min before it")
    late = deadline_outlook(done, 9000.0, finished_at=7100.0)
    assert (late.status, late.note) == (DeadlineStatus.MISSED, "missed its deadline by 35 min")
    assert deadline_outlook(dataclasses.replace(done, state=JobState.FAILED), 9000.0,
                            finished_at=6000.0).status == DeadlineStatus.MISSED


def test_clock_time_in_utc_with_the_date_on_another_day() -> None:
    # 2026-11-24 17:40:00 UTC = 1,795,542,000; the next day's 01:05 = 1,795,568,700.
    assert clock_time(1_795_542_000.0, 1_795_540_000.0) == "17:40 UTC"
    assert clock_time(1_795_568_700.0, 1_795_540_000.0) == "Nov 25 01:05 UTC"


def test_admission_at_the_most_workers_it_could_have() -> None:
    # Not started: 10,000 samples at speed(w) = 10 w. At its max 8: 125 s; capped at 4 by the cluster: 250 s.
    job = running(state=JobState.PENDING, workers=0, last_resized_at=None, deadline=200.0)
    fits = admission_outlook(job, 0.0, most_workers=64)
    assert fits.status == DeadlineStatus.ON_TRACK and fits.workers_needed == 5  # 10,000 / 50 = 200 s <= 200
    assert fits.note == ("can meet its deadline: needs ~2 min at its max 8 workers, the deadline is in 3 min; "
                         "at least 5 worker(s) from now on")
    short = admission_outlook(job, 0.0, most_workers=4)
    assert short.status == DeadlineStatus.WILL_MISS and short.prediction is not None \
        and short.prediction.remaining_s == pytest.approx(250.0)
    assert short.note == ("cannot meet its deadline: needs ~4 min at 4 workers (the most the cluster holds); "
                          "the deadline is in 3 min")
    free = admission_outlook(dataclasses.replace(job, deadline=None), 0.0, most_workers=64)
    assert free.status == DeadlineStatus.NONE
    assert free.note == "finishes ~00:02 UTC if it starts now at its max 8 workers"
    bare = dataclasses.replace(job, throughput_points=(), total_work=0.0)
    assert admission_outlook(bare, 0.0, 64).status == DeadlineStatus.UNKNOWN
