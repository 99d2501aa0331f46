"""The soak's samples and what its summary makes of them: growth after the warm-up, latency drift and
the checks (``summarize``), and the text ``benchmarks.soak`` prints (``render``). Pure: no process, no
database, no clock (tests/simulator/test_soak_summary.py runs it on synthetic samples).

The **checks** (``benchmarks.soak`` exits 1 when one fails): the scheduler's RSS grew 10% or more from the end of the
warm-up to the end; its descriptors grew by more than ``FD_SLACK``; an acknowledged submission is
missing from the database, or an acknowledged cancellation did not end its job CANCELLED; any error
other than the expected one; the scheduler exited; it lost the leader lease (the lease's term at the
end is not the one it took at the start); **latency drift**: the median of the per-minute p99s of
SubmitJob, or of ReportStatus, over the last ``DRIFT_WINDOW`` samples is more than ``DRIFT_LIMIT``
times its median over the first ``DRIFT_WINDOW`` samples after the warm-up. Medians of ten minutes
because the machine is shared: a minute of a neighbour's burst moves one p99, not the median of ten
(benchmarks/README.md, "Soak", says why the bound is 2x). A run with fewer than two disjoint windows
after its warm-up (``soak-ci``'s five minutes) reports its drift over shorter windows but is not
judged on it.

Never: import from ``tests/``, or take a sample (``benchmarks.soak`` does, and hands them here).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

RSS_GROWTH_LIMIT = 0.10          # the target, and a check
# Latency drift (a check): the median of the per-minute p99s over the last DRIFT_WINDOW samples
# against the median over the first DRIFT_WINDOW after the warm-up, at most DRIFT_LIMIT times it.
# Why these values: benchmarks/README.md, "Soak".
DRIFT_WINDOW = 10
DRIFT_LIMIT = 2.0
FD_SLACK = 16                    # descriptors the scheduler may gain after the warm-up (streams, pool churn)
EXPECTED_ERRORS = frozenset({"CancelJob:FAILED_PRECONDITION"})  # the job ended before the cancel came


@dataclass(frozen=True)
class Sample:
    t_s: float                 # seconds since the load started
    rss_mib: float             # scheduler resident set
    fds: int                   # scheduler open descriptors
    db_mib: float              # pg_database_size
    events_rows: int
    jobs_rows: int
    jobs_active: int           # PENDING, RUNNING, SCALING, PREEMPTED
    submits: int               # acknowledged so far
    cancels: int               # acknowledged so far
    completed: int             # jobs COMPLETED so far
    loans: int                 # loans so far (loans rows)
    reclaims: int              # of them reclaimed (RECLAIMING or RETURNED)
    errors: int                # unexpected errors so far
    submit_calls: int          # SubmitJob calls answered in the minute before
    submit_p50_ms: float
    submit_p99_ms: float
    reports: int               # ReportStatus calls answered in the minute before
    report_p50_ms: float
    report_p99_ms: float
    load1: float               # the machine's 1-minute load average


@dataclass(frozen=True)
class Outcome:
    """What the end-of-run verification found, and the error counts by ``Method:CODE``."""

    acknowledged: int
    lost: int                       # acknowledged submissions missing from the database
    cancels_not_applied: int        # acknowledged cancellations whose job is not CANCELLED
    errors: Mapping[str, int]
    scheduler_exit: int | None = None  # set when the scheduler exited during the run
    messages: Mapping[str, str] = field(default_factory=dict)  # the first message of each kind of error
    # The leader lease's term (epoch) when the load started and after it stopped; None: no lease row
    # (a scheduler on PostgreSQL that does not lead).
    lease_epochs: tuple[int | None, int | None] = (None, None)


@dataclass(frozen=True)
class Summary:
    warmup_s: float
    rss_start_mib: float
    rss_end_mib: float
    rss_growth: float               # fraction of rss_start
    fds_start: int
    fds_end: int
    fd_growth: int
    # Latency drift: medians of the per-minute p99s over the first window after the warm-up and the
    # last window, each of ``drift_window`` samples (DRIFT_WINDOW, fewer in a short run).
    drift_window: int
    drift_judged: bool              # two disjoint windows of DRIFT_WINDOW samples fit after the warm-up
    first_window: tuple[float, float]  # (t_s of its first sample, of its last)
    last_window: tuple[float, float]
    submit_p99_first_ms: float
    submit_p99_last_ms: float
    report_p99_first_ms: float
    report_p99_last_ms: float
    load_first: float               # mean load1 over each window
    load_last: float
    db_start_mib: float
    db_end_mib: float
    submits: int
    cancels: int
    completed: int
    loans: int
    reclaims: int
    outcome: Outcome
    failures: tuple[str, ...] = field(default=())

    @property
    def submit_drift(self) -> float:
        return _ratio(self.submit_p99_last_ms, self.submit_p99_first_ms)

    @property
    def report_drift(self) -> float:
        return _ratio(self.report_p99_last_ms, self.report_p99_first_ms)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and not math.isnan(a) and not math.isnan(b) else math.nan


def warmup_seconds(minutes: float) -> float:
    """The warm-up: the first 10% of the run, at least one minute."""
    return max(60.0, 0.1 * minutes * 60.0)


def _median_p99(window: Sequence[Sample], p99: Callable[[Sample], float]) -> float:
    """The median of the window's per-minute p99s that have a value (a minute without calls has none)."""
    values = [v for v in map(p99, window) if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def summarize(samples: Sequence[Sample], outcome: Outcome, *, warmup_s: float,
              rss_limit: float = RSS_GROWTH_LIMIT, fd_slack: int = FD_SLACK,
              drift_window: int = DRIFT_WINDOW, drift_limit: float = DRIFT_LIMIT) -> Summary:
    """Growth from the first sample at or after ``warmup_s`` to the last, latency drift (the first
    ``drift_window`` samples after it against the last ``drift_window``), and the checks that failed.
    Drift is judged only when the two windows are disjoint and full; a shorter run compares windows
    of half the samples after its warm-up (at least one each) and reports them only."""
    if len(samples) < 2:
        raise ValueError(f"a soak needs at least two samples (got {len(samples)})")
    start = next((i for i, s in enumerate(samples) if s.t_s >= warmup_s), len(samples) - 1)
    start = min(start, len(samples) - 2)  # a run no longer than its warm-up: growth over its last window
    base, last = samples[start], samples[-1]
    after = samples[start + 1:]  # each holds the latencies of the minute before it: all after the base
    judged = len(after) >= 2 * drift_window
    window = drift_window if judged else max(1, len(after) // 2)
    first_w, last_w = after[:window], after[-window:]
    submit_first, submit_last = (_median_p99(w, lambda s: s.submit_p99_ms) for w in (first_w, last_w))
    report_first, report_last = (_median_p99(w, lambda s: s.report_p99_ms) for w in (first_w, last_w))
    rss_growth = (last.rss_mib - base.rss_mib) / base.rss_mib if base.rss_mib > 0 else math.nan
    fails = []
    if not rss_growth < rss_limit:
        fails.append(f"scheduler RSS grew {percent_text(rss_growth)} after the warm-up "
                     f"({base.rss_mib:.1f} -> {last.rss_mib:.1f} MiB; limit {rss_limit:.0%})")
    if last.fds - base.fds > fd_slack:
        fails.append(f"scheduler file descriptors grew by {last.fds - base.fds} after the warm-up "
                     f"({base.fds} -> {last.fds}; limit {fd_slack})")
    if outcome.lost:
        fails.append(f"{outcome.lost} of {outcome.acknowledged} acknowledged job(s) are missing from the database")
    if outcome.cancels_not_applied:
        fails.append(f"{outcome.cancels_not_applied} acknowledged cancellation(s) did not end their job CANCELLED")
    unexpected = {k: v for k, v in outcome.errors.items() if k not in EXPECTED_ERRORS and v}
    if unexpected:
        fails.append("unexpected errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(unexpected.items())))
    if outcome.scheduler_exit is not None:
        fails.append(f"the scheduler exited during the run (code {outcome.scheduler_exit})")
    began, ended = outcome.lease_epochs
    if began is None or ended is None or began != ended:
        fails.append(f"the scheduler did not hold the leader lease throughout (its term when the load started: "
                     f"{began}, after it stopped: {ended})")
    for method, before, after_ in (("SubmitJob", submit_first, submit_last),
                                   ("ReportStatus", report_first, report_last)):
        drift = _ratio(after_, before)
        if judged and drift > drift_limit:
            fails.append(f"{method} p99 drifted x{drift:.2f} (median of the minutes' p99s {before:.1f} -> "
                         f"{after_:.1f} ms, first {window} samples after the warm-up against the last {window}; "
                         f"limit x{drift_limit:g})")
    return Summary(
        warmup_s=base.t_s, rss_start_mib=base.rss_mib, rss_end_mib=last.rss_mib, rss_growth=rss_growth,
        fds_start=base.fds, fds_end=last.fds, fd_growth=last.fds - base.fds,
        drift_window=window, drift_judged=judged,
        first_window=(first_w[0].t_s, first_w[-1].t_s), last_window=(last_w[0].t_s, last_w[-1].t_s),
        submit_p99_first_ms=submit_first, submit_p99_last_ms=submit_last,
        report_p99_first_ms=report_first, report_p99_last_ms=report_last,
        load_first=statistics.fmean(s.load1 for s in first_w), load_last=statistics.fmean(s.load1 for s in last_w),
        db_start_mib=base.db_mib, db_end_mib=last.db_mib,
        submits=last.submits, cancels=last.cancels, completed=last.completed, loans=last.loans,
        reclaims=last.reclaims, outcome=outcome, failures=tuple(fails),
    )


def percent_text(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.1%}"


def render(summary: Summary, regime: Mapping[str, object]) -> str:
    s, o = summary, summary.outcome
    limit = (f"limit x{DRIFT_LIMIT:g}" if s.drift_judged else
             f"not judged: fewer than 2 x {DRIFT_WINDOW} samples after the warm-up")
    expected = {k: v for k, v in o.errors.items() if k in EXPECTED_ERRORS}
    unexpected = {k: v for k, v in o.errors.items() if k not in EXPECTED_ERRORS and v}
    lines = [
        "Aryl soak: " + ("PASS" if not s.failures else "FAIL"),
        "load regime: " + "; ".join(f"{k}={v}" for k, v in regime.items()),
        f"measured from the end of the warm-up (sample at {s.warmup_s / 60:.1f} min) to the end:",
        f"  scheduler RSS        {s.rss_start_mib:.1f} -> {s.rss_end_mib:.1f} MiB ({percent_text(s.rss_growth)}; "
        f"target < {RSS_GROWTH_LIMIT:.0%})",
        f"  scheduler fds        {s.fds_start} -> {s.fds_end} ({s.fd_growth:+d}; limit +{FD_SLACK})",
        f"  database size        {s.db_start_mib:.1f} -> {s.db_end_mib:.1f} MiB",
        f"latency drift: median of the per-minute p99s, samples at {_minutes(s.first_window)} min "
        f"(load1 {s.load_first:.1f}) against {_minutes(s.last_window)} min (load1 {s.load_last:.1f}):",
        f"  SubmitJob p99        {s.submit_p99_first_ms:.1f} -> {s.submit_p99_last_ms:.1f} ms "
        f"(x{s.submit_drift:.2f}; {limit})",
        f"  ReportStatus p99     {s.report_p99_first_ms:.1f} -> {s.report_p99_last_ms:.1f} ms "
        f"(x{s.report_drift:.2f}; {limit})",
        f"counts at the last sample: submits {s.submits}, cancels {s.cancels}, completed {s.completed}, "
        f"loans {s.loans}, reclaims {s.reclaims}",
        f"after the load stopped: acknowledged jobs {o.acknowledged}, lost {o.lost}; cancellations not applied "
        f"{o.cancels_not_applied}",
        "errors: expected " + (", ".join(f"{k} x{v}" for k, v in sorted(expected.items())) or "none")
        + "; unexpected " + (", ".join(f"{k} x{v}" for k, v in sorted(unexpected.items())) or "none"),
    ]
    lines += [f"  first {k}: {o.messages[k]}" for k in sorted(o.messages) if k in o.errors]
    lines.append(f"leader lease: term {o.lease_epochs[0]} when the load started, {o.lease_epochs[1]} after it stopped")
    lines += [f"FAILED: {f}" for f in s.failures]
    return "\n".join(lines) + "\n"


def _minutes(window: tuple[float, float]) -> str:
    a, b = (t / 60 for t in window)
    return f"{a:.0f}" if round(a) == round(b) else f"{a:.0f}-{b:.0f}"


def percentile_ms(samples_s: Sequence[float], pct: int) -> float:
    if len(samples_s) < 2:
        return samples_s[0] * 1e3 if samples_s else math.nan
    return statistics.quantiles(samples_s, n=100, method="inclusive")[pct - 1] * 1e3
