"""The soak's summary and checks (benchmarks.soak.summarize/render) on synthetic samples: each check
can fail, and the warm-up and latency windows are the ones the summary names."""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks.soak import FD_SLACK, Outcome, Sample, Summary, render, summarize, warmup_seconds


def sample(minute: int, *, rss: float = 200.0, fds: int = 1100, submit_p99: float = 20.0,
           report_p99: float = 30.0) -> Sample:
    return Sample(
        t_s=60.0 * minute, rss_mib=rss, fds=fds, db_mib=10.0 + minute, events_rows=100 * minute,
        jobs_rows=10 * minute, jobs_active=5, submits=10 * minute, cancels=minute, completed=5 * minute,
        loans=2 * minute, reclaims=minute, errors=0, submit_calls=60, submit_p50_ms=5.0, submit_p99_ms=submit_p99,
        reports=12_000, report_p50_ms=8.0, report_p99_ms=report_p99, load1=1.0,
    )


CLEAN = Outcome(acknowledged=50, lost=0, cancels_not_applied=0, errors={"CancelJob:FAILED_PRECONDITION": 3})


def run(samples: list[Sample], outcome: Outcome = CLEAN, warmup_s: float = 60.0) -> Summary:
    return summarize(samples, outcome, warmup_s=warmup_s)


def test_steady_run_passes_and_measures_from_the_end_of_the_warm_up() -> None:
    # Growth during the warm-up (minute 0 -> 1) does not count; after it, 200 -> 210 is +5%.
    samples = [sample(0, rss=100.0, fds=900, submit_p99=500.0), sample(1, rss=200.0),
               sample(2, rss=204.0, submit_p99=22.0, report_p99=31.0), sample(3, rss=207.0),
               sample(4, rss=210.0, fds=1100 + FD_SLACK, submit_p99=44.0, report_p99=30.0)]
    s = run(samples)
    assert s.failures == ()
    assert s.warmup_s == 60.0
    assert s.rss_start_mib == 200.0 and s.rss_end_mib == 210.0
    assert s.rss_growth == pytest.approx(0.05)
    assert s.fd_growth == FD_SLACK
    # The first window after the warm-up is the minute ending at sample 2; the last, sample 4's.
    assert s.submit_p99_first_ms == 22.0 and s.submit_p99_last_ms == 44.0
    assert s.submit_drift == pytest.approx(2.0)
    assert s.report_drift == pytest.approx(30.0 / 31.0)
    assert (s.submits, s.cancels, s.completed, s.loans, s.reclaims) == (40, 4, 20, 8, 4)
    text = render(s, {"agents": 1000})
    assert text.startswith("Aryl soak: PASS")
    assert "agents=1000" in text and "+5.0%" in text and "CancelJob:FAILED_PRECONDITION x3" in text


def test_rss_growth_of_ten_percent_fails() -> None:
    s = run([sample(0), sample(1, rss=200.0), sample(2, rss=210.0), sample(3, rss=220.0)])
    assert len(s.failures) == 1 and "RSS grew +10.0%" in s.failures[0]
    assert "FAILED: scheduler RSS grew" in render(s, {})
    assert render(s, {}).startswith("Aryl soak: FAIL")


def test_fd_growth_beyond_the_slack_fails() -> None:
    s = run([sample(0), sample(1), sample(2, fds=1100 + FD_SLACK + 1)])
    assert len(s.failures) == 1 and f"grew by {FD_SLACK + 1}" in s.failures[0]


@pytest.mark.parametrize(("outcome", "message"), [
    (dataclasses.replace(CLEAN, lost=1), "1 of 50 acknowledged job(s) are missing"),
    (dataclasses.replace(CLEAN, cancels_not_applied=2), "2 acknowledged cancellation(s)"),
    (dataclasses.replace(CLEAN, errors={"ReportStatus:UNAVAILABLE": 4, "CancelJob:FAILED_PRECONDITION": 9}),
     "unexpected errors: ReportStatus:UNAVAILABLE x4"),
    (dataclasses.replace(CLEAN, scheduler_exit=-9), "the scheduler exited during the run (code -9)"),
])
def test_lost_jobs_unapplied_cancels_errors_and_a_dead_scheduler_fail(outcome: Outcome, message: str) -> None:
    s = run([sample(0), sample(1), sample(2)], outcome)
    assert len(s.failures) == 1 and message in s.failures[0]


def test_expected_errors_alone_do_not_fail() -> None:
    outcome = dataclasses.replace(CLEAN, errors={"CancelJob:FAILED_PRECONDITION": 100, "SubmitJob:INTERNAL": 0})
    assert run([sample(0), sample(1), sample(2)], outcome).failures == ()


def test_a_run_no_longer_than_its_warm_up_measures_its_last_window() -> None:
    s = run([sample(0, rss=100.0), sample(1, rss=150.0)], warmup_s=600.0)
    assert s.warmup_s == 0.0 and s.rss_growth == pytest.approx(0.5) and s.failures


def test_unreadable_latency_gives_no_drift_and_one_sample_is_refused() -> None:
    s = run([sample(0), sample(1), sample(2, submit_p99=math.nan)])
    assert math.isnan(s.submit_drift)
    with pytest.raises(ValueError, match="at least two samples"):
        run([sample(0)])


def test_warm_up_is_a_tenth_of_the_run_and_at_least_a_minute() -> None:
    assert warmup_seconds(60) == 360.0
    assert warmup_seconds(5) == 60.0


def test_the_first_message_of_each_kind_of_error_is_shown() -> None:
    outcome = dataclasses.replace(CLEAN, errors={"ReportStatus:ABORTED": 2},
                                  messages={"ReportStatus:ABORTED": "a concurrent change won; retry"})
    text = render(run([sample(0), sample(1), sample(2)], outcome), {})
    assert "unexpected ReportStatus:ABORTED x2" in text
    assert "first ReportStatus:ABORTED: a concurrent change won; retry" in text
