"""The soak's summary and checks (benchmarks.soak_summary.summarize/render) on synthetic samples: each check
can fail, and the warm-up and latency windows are the ones the summary names; and the soak's
security: the scheduler's settings and every client's credentials come from one development CA."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from aryl_common.security import load_tokens
from benchmarks.fake_fleet import agent_security, client_security
from benchmarks.soak import make_pki, security_settings
from benchmarks.soak_load import ROUTER, USERS
from benchmarks.soak_summary import (
    DRIFT_LIMIT,
    DRIFT_WINDOW,
    FD_SLACK,
    Outcome,
    Sample,
    Summary,
    render,
    summarize,
    warmup_seconds,
)


def sample(minute: int, *, rss: float = 200.0, fds: int = 1100, submit_p99: float = 20.0,
           report_p99: float = 30.0, load1: float = 1.0) -> Sample:
    return Sample(
        t_s=60.0 * minute, rss_mib=rss, fds=fds, db_mib=10.0 + minute, events_rows=100 * minute,
        jobs_rows=10 * minute, jobs_active=5, submits=10 * minute, cancels=minute, completed=5 * minute,
        loans=2 * minute, reclaims=minute, errors=0, submit_calls=60, submit_p50_ms=5.0, submit_p99_ms=submit_p99,
        reports=12_000, report_p50_ms=8.0, report_p99_ms=report_p99, load1=load1,
    )


CLEAN = Outcome(acknowledged=50, lost=0, cancels_not_applied=0, errors={"CancelJob:FAILED_PRECONDITION": 3},
                lease_epochs=(3, 3))


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
    (dataclasses.replace(CLEAN, lease_epochs=(3, 4)), "did not hold the leader lease throughout"),
    (dataclasses.replace(CLEAN, lease_epochs=(None, None)), "did not hold the leader lease throughout"),
])
def test_lost_jobs_unapplied_cancels_errors_a_dead_scheduler_and_a_lost_lease_fail(
        outcome: Outcome, message: str) -> None:
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


# ---------------------------------------------------------------------------------------------
# Latency drift: medians over DRIFT_WINDOW samples, judged only when two disjoint windows fit


def hour(submit: list[float] | None = None, report: list[float] | None = None,
         load: list[float] | None = None) -> list[Sample]:
    """Samples at minutes 0..60 (the warm-up ends at 6: windows 7-16 and 51-60), p99s 20/30 ms unless
    given per minute."""
    return [sample(m, submit_p99=(submit or [20.0] * 61)[m], report_p99=(report or [30.0] * 61)[m],
                   load1=(load or [1.0] * 61)[m]) for m in range(61)]


def judge(samples: list[Sample]) -> Summary:
    return summarize(samples, CLEAN, warmup_s=warmup_seconds(60))


def test_an_hour_compares_the_first_ten_minutes_after_the_warm_up_with_the_last_ten() -> None:
    assert DRIFT_WINDOW == 10 and DRIFT_LIMIT == 2.0  # the README states these
    load = [1.0] * 61
    load[7:17] = [2.0] * 10
    load[51:61] = [4.0] * 10
    s = judge(hour(submit=[20.0] * 51 + [39.0] * 10, load=load))
    assert s.drift_judged and s.drift_window == 10
    assert s.first_window == (420.0, 960.0) and s.last_window == (3060.0, 3600.0)
    assert s.submit_p99_first_ms == 20.0 and s.submit_p99_last_ms == 39.0
    assert s.submit_drift == pytest.approx(1.95) and s.failures == ()
    assert (s.load_first, s.load_last) == (2.0, 4.0)
    text = render(s, {})
    assert "samples at 7-16 min (load1 2.0) against 51-60 min (load1 4.0)" in text
    assert "20.0 -> 39.0 ms (x1.95; limit x2)" in text


@pytest.mark.parametrize("method", ["SubmitJob", "ReportStatus"])
def test_a_p99_that_more_than_doubles_fails(method: str) -> None:
    slow = [20.0] * 51 + [41.0] * 10 if method == "SubmitJob" else [30.0] * 51 + [61.0] * 10
    s = judge(hour(**{"submit" if method == "SubmitJob" else "report": slow}))
    assert len(s.failures) == 1 and s.failures[0].startswith(f"{method} p99 drifted x2.0")
    assert "limit x2" in s.failures[0]
    assert render(s, {}).startswith("Aryl soak: FAIL")


def test_a_few_slow_minutes_do_not_move_the_median() -> None:
    # Four of the last ten minutes at 10x (a neighbour's burst), the rest unchanged: the median holds.
    submit = [20.0] * 61
    submit[52] = submit[55] = submit[57] = submit[60] = 200.0
    assert judge(hour(submit=submit)).failures == ()
    submit[58] = 200.0  # the fifth slow minute of ten, and one more: now the median itself is slow
    submit[59] = 200.0
    assert judge(hour(submit=submit)).failures


def test_minutes_without_calls_are_left_out_of_the_median() -> None:
    submit = [20.0] * 51 + [math.nan] * 5 + [30.0] * 5
    s = judge(hour(submit=submit))
    assert s.submit_p99_last_ms == 30.0 and s.failures == ()


def test_a_short_run_reports_its_drift_but_is_not_judged_on_it() -> None:
    # soak-ci: 5 minutes, warm-up 1: four samples after it, windows of two; x3 drift, no failure.
    samples = [sample(0), sample(1), sample(2, submit_p99=10.0), sample(3, submit_p99=10.0),
               sample(4, submit_p99=30.0), sample(5, submit_p99=30.0)]
    s = summarize(samples, CLEAN, warmup_s=warmup_seconds(5))
    assert not s.drift_judged and s.drift_window == 2
    assert s.submit_drift == pytest.approx(3.0) and s.failures == ()
    assert f"not judged: fewer than 2 x {DRIFT_WINDOW} samples after the warm-up" in render(s, {})
    # The same drift with two full windows after the warm-up fails.
    longer = [sample(0), sample(1)] + [sample(m, submit_p99=10.0 if m < 12 else 30.0) for m in range(2, 22)]
    assert summarize(longer, CLEAN, warmup_s=60.0).failures


# ---------------------------------------------------------------------------------------------
# Security: one CA for the scheduler, the agents, the users and the router


def test_the_scheduler_and_every_client_use_the_same_development_ca(tmp_path: Path) -> None:
    make_pki(tmp_path, ["soak-train-00000", "soak-infer-00000"])
    settings = security_settings(tmp_path)
    assert settings["ARYL_SECURITY__INSECURE"] == "false"
    for key in ("TLS_CERT", "TLS_KEY", "TLS_CLIENT_CA", "TOKENS_FILE"):
        assert Path(settings[f"ARYL_SECURITY__{key}"]).is_file()
    principals = {str(p) for p in load_tokens(settings["ARYL_SECURITY__TOKENS_FILE"]).values()}
    assert {"agent:soak-train-00000", "agent:soak-infer-00000", f"router:{ROUTER}"} <= principals
    assert {f"user:{u}" for u in USERS} <= principals
    agent = agent_security(tmp_path, "soak-train-00000")
    assert not agent.insecure and agent.token and agent.cert_file.endswith("agent-soak-train-00000.crt")
    user = client_security(tmp_path, "client", USERS[0])
    assert not user.insecure and user.token and user.token != agent.token
    assert security_settings(None) == {"ARYL_SECURITY__INSECURE": "true"}
    assert agent_security(None, "soak-train-00000").insecure
