"""From ``SimulationResult`` to what a reader looks at: per-job CSV, summary metrics, a comparison
table and plots. Pure functions of the results; every file is deterministic (fixed float formatting,
sorted keys, PNGs without timestamps or version metadata), so two runs of the same inputs and seed
produce byte-identical files.

Metrics (``summarize``), all in seconds unless named otherwise:

- ``jobs_total``: jobs in the trace; ``jobs_completed``: those that finished before the run stopped.
- ``avg_jct_s``, ``median_jct_s``, ``p90_jct_s``, ``p95_jct_s``, ``p99_jct_s``: job completion time =
  completion - submission, over completed jobs. Percentiles interpolate linearly between order
  statistics (NumPy's default).
- ``avg_queue_s``, ``median_queue_s``, ``p90_queue_s``, ``p95_queue_s``, ``p99_queue_s``: queueing time
  = first start - submission, over completed jobs (later waits after a preemption count towards JCT,
  not here).
- ``makespan_s``: when the run stopped -- the last completion when every job completed.
- ``arrival_window``: ``start_s`` / ``end_s``, the first and the last job submission, the stretch
  over which the utilisation figures are compared: policies finish the same arrivals at different
  times, and a tail of stragglers after the last arrival says nothing about how well a busy cluster
  is used. ``end_s`` is at most the run's end (a run stopped early); when every job arrived at one
  instant, the window runs from then to the run's end.
- ``gpu_utilization`` (fractions of GPU-time over the arrival window, from the piecewise-constant
  utilisation series):
  - ``training``: training-pool GPUs allocated to jobs / training-pool GPUs;
  - ``inference``: inference-pool GPUs in use -- serving inference, min(servers needed, SERVING
    servers) x GPUs per server, plus allocated to loaned training -- / inference-pool GPUs;
  - ``loaned_training``: the second part alone (inference-pool GPUs allocated to training) /
    inference-pool GPUs;
  - ``overall``: all GPUs in use (the three above) / all GPUs.
  A pool with no GPUs, or a window of no length, reports 0.
- ``gpu_utilization_to_end``: the same four over [0, makespan] (what ``gpu_utilization`` meant before
  the arrival window; it counts the drain of the queue after the last arrival).
- ``useful_work``: GPU-hours of progress at the job's reference efficiency against GPU-hours allocated,
  over the whole run. A job's *reference cost* is the GPU-seconds one unit of its work takes at its
  ``min_workers`` (on GPUs of speed 1.0): ``min_workers x gpus_per_worker / speed(min_workers)``; with
  ``min_workers`` 1 that is ``gpus_per_worker / speed(1)``, what the work costs at perfect linear
  scaling. *Useful GPU-seconds* = work kept x reference cost: work a preemption threw away is not
  kept (its redo counts once), restart overheads make none, and a job still running at the end counts
  its progress so far. So a job of work W at n workers with speed s(n) on g GPUs per worker is
  allocated n x g x W / s(n) GPU-seconds (plus overheads) and makes W x g / s(1) useful ones; under
  sub-linear scaling the ratio is s(n) / (n x s(1)) < 1.
  - ``useful_gpu_hours``, ``allocated_gpu_hours`` (GPUs allocated to training jobs in both pools,
    over [0, makespan]), ``useful_fraction`` = useful / allocated (0 when nothing was allocated).
- ``useful_utilization`` (over the arrival window, as ``gpu_utilization``, of all GPUs):
  ``training_work``: useful training GPU-seconds made in the window / all GPU-seconds of the window;
  ``overall``: the same plus inference serving (min(servers needed, SERVING servers) x GPUs per server,
  counted as useful) -- ``gpu_utilization.overall`` with allocated training GPUs replaced by useful
  ones. Progress is placed in time exactly (``simulator.cluster``'s useful spans).
- ``inference_shortfall``, over [0, makespan]. At each moment the serving shortfall is
  ``max(servers wanted - min(servers needed, SERVING servers), 0)``: servers inference needed but did not
  have because they were draining, loaned, being reclaimed or down, or because the demand was beyond the
  whole inference cluster (``DemandPoint.servers_wanted``, the need before the clip: counted, unclipped).
  - ``server_s``: the shortfall integrated over time (server-seconds); ``time_s``: seconds with any;
  - with a request-rate trace (``DemandPoint.rate_rps``), ``requests_short_share``: the share of
    requests that arrived while the shortfall was above 0, and ``requests_unserved_share``: the share
    beyond serving capacity, rate x shortfall / servers needed (each serving server taking an equal
    share); None without a rate. ``requests_beyond_cluster_share``: the share that arrived while the
    demand was beyond the whole inference cluster (no policy could serve them: the floor under the first).
- ``inference_shortfall_window``: the same over the arrival window (``arrival_window``), where training is busy
  and loans are many: the stretch a busy regime is about. Over the makespan, the tail after the last arrival
  (training winding down, few loans, little shortfall) dilutes the share.
- ``loans``: loans begun (LOAN steps committed; a loan cancelled while draining counts);
  ``reclaims``: RECLAIM steps committed (one per reclaimed server).
- ``preemptions``, ``scale_ins``, ``scale_outs``: over all jobs (a resize to the same size elsewhere
  is neither). ``reclaim_preemptions`` / ``reclaim_scale_ins``: those whose reason was a reclaim
  (``PREEMPTED_FOR_RECLAIM``, ``SCALED_IN_FOR_RECLAIM``); ``preemptions_per_reclaim`` =
  reclaim_preemptions / reclaims (None without reclaims).
- ``estimates``: what policies saw of jobs' lengths (``simulator.estimates``: ``exact`` is
  clairvoyant).
- ``gpu_hours_lost``: GPU time lost, over all jobs: work a preemption threw away (since the job's last
  checkpoint) plus restart overheads of starts, restarts and resizes, in GPU-hours. A shrink off a
  lost server throws work away too (its dead workers took no checkpoint).
- ``server_failures``: injected server failures (``simulator.failures``); ``fault_evictions``: jobs
  shrunk or requeued because a server they ran on was lost (also counted in ``scale_ins`` /
  ``preemptions``).
- ``stop_reason``, ``cycles``, ``rejected_actions``: how the run ended, how many scheduling cycles ran,
  and how many plan actions the applier refused.
- Only when some job has a deadline (``TraceJob.deadline``; ``simulator.deadlines``):
  ``jobs_with_deadline``; ``deadlines_met``, those completed by their deadline (a job that never
  completed missed it); ``deadline_completion_rate`` = met / with deadline, the QoS figure.

Must never: run a simulation or touch scheduler state.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np

from simulator.engine import SimulationResult
from simulator.thrash import thrash_metrics

if TYPE_CHECKING:  # matplotlib is imported when a plot is drawn, not when results are summarised
    from matplotlib.figure import Figure

FLOAT_DIGITS = 4          # decimals of every float in summary.json
CSV_FLOAT_FORMAT = "{:.3f}"
JOB_CSV_COLUMNS = ("job_id", "name", "submit", "start", "end", "queue_s", "jct_s", "preemptions", "scale_outs",
                   "scale_ins", "gpu_seconds_lost")
UTILISATION_CSV_COLUMNS = ("time", "training_gpus", "inference_gpus", "loaned_training_gpus", "loaned_servers",
                           "servers_needed", "rate_rps")
# Rows of the comparison table: (summary key, label, format). Nested keys with a dot.
TABLE_ROWS = (
    ("jobs_completed", "jobs completed", "{:.0f}"),
    ("avg_jct_s", "avg JCT (h)", "hours"),
    ("median_jct_s", "median JCT (h)", "hours"),
    ("p90_jct_s", "p90 JCT (h)", "hours"),
    ("p99_jct_s", "p99 JCT (h)", "hours"),
    ("avg_queue_s", "avg queueing (h)", "hours"),
    ("median_queue_s", "median queueing (h)", "hours"),
    ("p90_queue_s", "p90 queueing (h)", "hours"),
    ("p99_queue_s", "p99 queueing (h)", "hours"),
    ("makespan_s", "makespan (h)", "hours"),
    ("gpu_utilization.training", "GPU util training (arrivals)", "{:.3f}"),
    ("gpu_utilization.inference", "GPU util inference (arrivals)", "{:.3f}"),
    ("gpu_utilization.overall", "GPU util overall (arrivals)", "{:.3f}"),
    ("gpu_utilization_to_end.overall", "GPU util overall (to end)", "{:.3f}"),
    ("useful_utilization.overall", "useful util overall (arrivals)", "{:.3f}"),
    ("useful_work.useful_gpu_hours", "useful GPU-hours", "{:.0f}"),
    ("useful_work.allocated_gpu_hours", "allocated GPU-hours", "{:.0f}"),
    ("useful_work.useful_fraction", "useful / allocated", "{:.3f}"),
    ("inference_shortfall.server_s", "inference short (server-h)", "hours"),
    ("inference_shortfall.requests_short_share", "requests met short (share)", "{:.4f}"),
    ("server_failures", "server failures", "{:.0f}"),
    ("fault_evictions", "fault evictions", "{:.0f}"),
    ("loans", "loans", "{:.0f}"),
    ("reclaims", "reclaims", "{:.0f}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("preemptions_per_reclaim", "preemptions / reclaim", "{:.2f}"),
    ("scale_outs", "scale-outs", "{:.0f}"),
    ("scale_ins", "scale-ins", "{:.0f}"),
    ("gpu_hours_lost", "GPU-hours lost", "{:.1f}"),
    ("deadline_completion_rate", "deadlines met (rate)", "{:.3f}"),
)
# Rows left out of a table in which no policy has the metric (runs without deadlines).
OPTIONAL_ROWS = frozenset({"deadline_completion_rate", "inference_shortfall.requests_short_share",
                           "preemptions_per_reclaim"})


# -- per job ------------------------------------------------------------------------------------


def _fmt(value: float | None) -> str:
    return "" if value is None else CSV_FLOAT_FORMAT.format(value)


def jobs_csv(result: SimulationResult) -> str:
    """One row per job, in job-id order; times in seconds since the trace's start, empty when the job
    never started / finished."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(JOB_CSV_COLUMNS)
    for j in result.jobs:
        writer.writerow((j.job_id, j.name, _fmt(j.submit), _fmt(j.start), _fmt(j.end), _fmt(j.queue_s),
                         _fmt(j.jct_s), j.preemptions, j.scale_outs, j.scale_ins, _fmt(j.gpu_seconds_lost)))
    return out.getvalue()


def utilisation_csv(result: SimulationResult) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(UTILISATION_CSV_COLUMNS)
    for s in result.utilisation:
        writer.writerow((_fmt(s.time), s.training_gpus, s.inference_gpus, s.loaned_training_gpus, s.loaned_servers,
                         s.servers_needed, _fmt(s.rate_rps)))
    return out.getvalue()


# -- summary --------------------------------------------------------------------------------------


def _round(value: float) -> float:
    rounded = round(float(value), FLOAT_DIGITS)
    return 0.0 if rounded == 0 else rounded  # no "-0.0"


class _Series:
    """The utilisation series as arrays (one column per level; ``times`` with the run's end appended),
    built once per summary and read by every metric of it."""

    __slots__ = ("levels", "times")

    def __init__(self, result: SimulationResult) -> None:
        rows = np.array([(s.time, s.training_gpus, s.inference_gpus, s.loaned_training_gpus, s.servers_needed,
                          s.rate_rps, max(s.servers_wanted, s.servers_needed)) for s in result.utilisation],
                        dtype=float).reshape(-1, 7)
        self.times = np.append(rows[:, 0], result.end_time)
        names = ("training_gpus", "inference_gpus", "loaned_training_gpus", "servers_needed", "rate_rps",
                 "servers_wanted")
        self.levels = {name: rows[:, k + 1] for k, name in enumerate(names)}

    def durations(self, start: float, end: float) -> np.ndarray:
        """Seconds each sample holds within [start, end] (the last one holds until the run's end)."""
        return np.clip(np.minimum(self.times[1:], end) - np.maximum(self.times[:-1], start), 0.0, None)


def _integrals(series: _Series, start: float, end: float) -> dict[str, float]:
    """GPU-seconds of each utilisation level over [start, end]."""
    durations = series.durations(start, end) if end > start else np.zeros(len(series.times) - 1)
    return {name: float(np.dot(series.levels[f"{name}_gpus"], durations))
            for name in ("training", "inference", "loaned_training")}


def arrival_window(result: SimulationResult) -> tuple[float, float]:
    """(first submission, last submission), the window ``gpu_utilization`` covers (module doc)."""
    if not result.jobs:
        return 0.0, result.end_time
    start = min(j.submit for j in result.jobs)
    end = min(max(j.submit for j in result.jobs), result.end_time)
    return start, end if end > start else max(result.end_time, start)


def _gpus(result: SimulationResult) -> tuple[int, int]:
    spec = result.spec
    return spec.training_servers * spec.gpus_per_server, spec.inference_servers * spec.gpus_per_server


def gpu_utilization(result: SimulationResult, start: float = 0.0, end: float | None = None, *,
                    series: _Series | None = None) -> dict[str, float]:
    """The four utilisation shares over [start, end] (default: [0, end_time])."""
    end = result.end_time if end is None else end
    training_gpus, inference_gpus = _gpus(result)
    used = _integrals(series or _Series(result), start, end)
    span = end - start

    def share(gpu_s: float, gpus: int) -> float:
        return gpu_s / (gpus * span) if gpus > 0 and span > 0 else 0.0

    return {
        "training": share(used["training"], training_gpus),
        "inference": share(used["inference"] + used["loaned_training"], inference_gpus),
        "loaned_training": share(used["loaned_training"], inference_gpus),
        "overall": share(sum(used.values()), training_gpus + inference_gpus),
    }


def useful_gpu_seconds(result: SimulationResult, start: float = 0.0, end: float = float("inf")) -> float:
    """Useful training GPU-seconds made within [start, end] (module doc), from the useful spans."""
    if not result.useful_spans:
        return 0.0
    spans = np.array(result.useful_spans, dtype=float)
    overlap = np.clip(np.minimum(spans[:, 1], end) - np.maximum(spans[:, 0], start), 0.0, None)
    return float(np.dot(overlap, spans[:, 2]))


def useful_work(result: SimulationResult, *, series: _Series | None = None) -> dict[str, float]:
    used = _integrals(series or _Series(result), 0.0, result.end_time)
    allocated = used["training"] + used["loaned_training"]
    useful = useful_gpu_seconds(result)
    return {"useful_gpu_hours": useful / 3600.0, "allocated_gpu_hours": allocated / 3600.0,
            "useful_fraction": useful / allocated if allocated > 0 else 0.0}


def useful_utilization(result: SimulationResult, start: float, end: float, *,
                       series: _Series | None = None) -> dict[str, float]:
    """Useful GPU-seconds within [start, end] as shares of all GPUs (module doc)."""
    training_gpus, inference_gpus = _gpus(result)
    capacity = (training_gpus + inference_gpus) * (end - start)
    if capacity <= 0:
        return {"overall": 0.0, "training_work": 0.0}
    training = useful_gpu_seconds(result, start, end)
    serving = _integrals(series or _Series(result), start, end)["inference"]
    return {"overall": (training + serving) / capacity, "training_work": training / capacity}


def inference_shortfall(result: SimulationResult, *, series: _Series | None = None, start: float = 0.0,
                        end: float | None = None) -> dict[str, float | None]:
    """Servers inference needed but had not serving, over [start, end] (module doc; [0, end_time] by default)."""
    empty: dict[str, float | None] = {"server_s": 0.0, "time_s": 0.0, "requests_short_share": None,
                                      "requests_unserved_share": None, "requests_beyond_cluster_share": None}
    if not result.utilisation or result.end_time <= 0:
        return empty
    spec, series = result.spec, series or _Series(result)
    level, durations = series.levels, series.durations(start, result.end_time if end is None else end)
    wanted = np.clip(level["servers_wanted"], 0.0, None)   # unclipped
    serving = level["inference_gpus"] / spec.gpus_per_server  # min(needed, SERVING)
    short = np.clip(wanted - serving, 0.0, None)
    rate = level["rate_rps"]
    requests = float(np.dot(rate, durations))
    unserved = np.divide(short, wanted, out=np.zeros_like(short), where=wanted > 0)

    def share(weights: np.ndarray) -> float | None:
        return float(np.dot(rate * weights, durations)) / requests if requests > 0 else None

    return {
        "server_s": float(np.dot(short, durations)),
        "time_s": float(durations[short > 0].sum()),
        "requests_short_share": share((short > 0).astype(float)),
        "requests_unserved_share": share(unserved),
        "requests_beyond_cluster_share": share((wanted > spec.inference_servers).astype(float)),
    }


class Summary(TypedDict):
    """What ``summarize`` returns (one policy's entry in summary.json); the metrics are defined in this
    module's docstring. A percentile or mean over no completed job is None."""

    policy: str
    jobs_total: int
    jobs_completed: int
    avg_jct_s: float | None
    median_jct_s: float | None
    p90_jct_s: float | None
    p95_jct_s: float | None
    p99_jct_s: float | None
    avg_queue_s: float | None
    median_queue_s: float | None
    p90_queue_s: float | None
    p95_queue_s: float | None
    p99_queue_s: float | None
    makespan_s: float
    arrival_window: dict[str, float]
    gpu_utilization: dict[str, float]
    gpu_utilization_to_end: dict[str, float]
    useful_work: dict[str, float]
    useful_utilization: dict[str, float]
    inference_shortfall: dict[str, float | None]
    inference_shortfall_window: dict[str, float | None]
    loans: int
    reclaims: int
    preemptions: int
    scale_outs: int
    scale_ins: int
    reclaim_preemptions: int
    reclaim_scale_ins: int
    preemptions_per_reclaim: float | None
    estimates: str
    gpu_hours_lost: float
    server_failures: int
    fault_evictions: int
    stop_reason: str
    cycles: int
    rejected_actions: int
    jobs_with_deadline: NotRequired[int]
    deadlines_met: NotRequired[int]
    deadline_completion_rate: NotRequired[float]
    # resizes and preemptions per job-hour (``simulator.thrash``)
    resizes_per_job_hour: float | None
    preemptions_per_job_hour: float | None
    disruptions_per_job_hour: float | None
    max_disruptions_per_job: int


def summarize(result: SimulationResult) -> Summary:
    """The metrics defined in this module's docstring, floats rounded to FLOAT_DIGITS decimals."""
    done = [j for j in result.jobs if j.end is not None]
    jct = np.array([j.jct_s for j in done], dtype=float)
    queue = np.array([j.queue_s for j in done], dtype=float)

    def stat(values: np.ndarray, kind: str) -> float | None:
        if values.size == 0:
            return None
        if kind == "mean":
            return _round(float(values.mean()))
        return _round(float(np.percentile(values, {"median": 50, "p90": 90, "p95": 95, "p99": 99}[kind])))

    def figures(values: Mapping[str, float]) -> dict[str, float]:
        return {k: _round(v) for k, v in sorted(values.items())}

    def rounded(values: Mapping[str, float | None]) -> dict[str, float | None]:
        return {k: None if v is None else _round(v) for k, v in sorted(values.items())}

    start, end = arrival_window(result)
    series = _Series(result)
    reclaims = sum(s.reclaims for s in result.servers)
    reclaim_preemptions = sum(j.reclaim_preemptions for j in result.jobs)
    thrash = thrash_metrics(result.jobs, result.end_time)
    summary: Summary = {
        "policy": result.policy,
        "jobs_total": len(result.jobs),
        "jobs_completed": len(done),
        "avg_jct_s": stat(jct, "mean"),
        "median_jct_s": stat(jct, "median"),
        "p90_jct_s": stat(jct, "p90"),
        "p95_jct_s": stat(jct, "p95"),
        "p99_jct_s": stat(jct, "p99"),
        "avg_queue_s": stat(queue, "mean"),
        "median_queue_s": stat(queue, "median"),
        "p90_queue_s": stat(queue, "p90"),
        "p95_queue_s": stat(queue, "p95"),
        "p99_queue_s": stat(queue, "p99"),
        "makespan_s": _round(result.end_time),
        "arrival_window": {"end_s": _round(end), "start_s": _round(start)},
        "gpu_utilization": figures(gpu_utilization(result, start, end, series=series)),
        "gpu_utilization_to_end": figures(gpu_utilization(result, series=series)),
        "useful_work": figures(useful_work(result, series=series)),
        "useful_utilization": figures(useful_utilization(result, start, end, series=series)),
        "inference_shortfall": rounded(inference_shortfall(result, series=series)),
        "inference_shortfall_window": rounded(inference_shortfall(result, series=series, start=start, end=end)),
        "loans": sum(s.loans for s in result.servers),
        "reclaims": reclaims,
        "preemptions": sum(j.preemptions for j in result.jobs),
        "scale_outs": sum(j.scale_outs for j in result.jobs),
        "scale_ins": sum(j.scale_ins for j in result.jobs),
        "reclaim_preemptions": reclaim_preemptions,
        "reclaim_scale_ins": sum(j.reclaim_scale_ins for j in result.jobs),
        "preemptions_per_reclaim": _round(reclaim_preemptions / reclaims) if reclaims else None,
        "estimates": result.estimates,
        "gpu_hours_lost": _round(sum(j.gpu_seconds_lost for j in result.jobs) / 3600.0),
        "server_failures": result.server_failures,
        "fault_evictions": result.fault_evictions,
        "stop_reason": result.stop_reason,
        "cycles": result.cycles,
        "rejected_actions": result.rejected_actions,
        "resizes_per_job_hour": thrash["resizes_per_job_hour"],
        "preemptions_per_job_hour": thrash["preemptions_per_job_hour"],
        "disruptions_per_job_hour": thrash["disruptions_per_job_hour"],
        "max_disruptions_per_job": thrash["max_disruptions_per_job"],
    }
    verdicts = [j.met_deadline for j in result.jobs if j.met_deadline is not None]
    if verdicts:
        summary["jobs_with_deadline"] = len(verdicts)
        summary["deadlines_met"] = sum(verdicts)
        summary["deadline_completion_rate"] = _round(sum(verdicts) / len(verdicts))
    return summary


def summary_json(summaries: Mapping[str, Mapping[str, object]]) -> str:
    """``{policy: summary}`` as JSON with sorted keys and a trailing newline."""
    return json.dumps(summaries, indent=2, sort_keys=True) + "\n"


def lookup(summary: Mapping[str, object], key: str) -> float | None:
    """The number at dotted ``key`` of a summary (``gpu_utilization.overall``) as a float; None where the
    path is missing or ends at something that is not a number (a bool is not one)."""
    value: object = summary
    for part in key.split("."):
        if not isinstance(value, Mapping):
            return None
        value = value.get(part)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def format_table(summaries: Mapping[str, Mapping[str, object]]) -> str:
    """Policies side by side (in the mapping's order); from the second column on, each value is
    followed by its ratio to the first policy's, e.g. ``1.23 (x0.85)``."""
    names = list(summaries)
    baseline = summaries[names[0]] if names else {}
    header = ["metric", *names]
    rows = [header]
    for key, label, fmt in TABLE_ROWS:
        if key in OPTIONAL_ROWS and all(lookup(summaries[name], key) is None for name in names):
            continue
        row = [label]
        base = lookup(baseline, key)
        for index, name in enumerate(names):
            value = lookup(summaries[name], key)
            if value is None:
                row.append("-")
                continue
            text = f"{value / 3600.0:.2f}" if fmt == "hours" else fmt.format(value)
            if index > 0 and base:
                text += f" (x{value / base:.2f})"
            row.append(text)
        rows.append(row)
    widths = [max(len(r[c]) for r in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[0]) if c == 0 else cell.rjust(widths[c]) for c, cell in enumerate(r)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


# -- plots ----------------------------------------------------------------------------------------

_PNG_METADATA = {"Software": None}  # no version string: byte-identical PNGs across runs


def _pyplot() -> ModuleType:
    """``matplotlib.pyplot`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png", dpi=100, metadata=_PNG_METADATA)
    _pyplot().close(fig)


def plot_jct_cdf(results: Sequence[SimulationResult], path: Path) -> None:
    """The CDF of job completion times (hours, log scale), one line per policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for result in results:
        jct = np.sort(np.array([j.jct_s for j in result.jobs if j.end is not None], dtype=float)) / 3600.0
        if jct.size:
            ax.step(np.maximum(jct, 1e-3), np.arange(1, jct.size + 1) / jct.size, where="post", label=result.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    _save(fig, path)


def _series(result: SimulationResult) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Sample times (hours) with the end time appended, and each level repeated for the end."""
    samples = result.utilisation
    times = np.array([s.time for s in samples] + [result.end_time], dtype=float) / 3600.0

    def column(name: str) -> np.ndarray:
        values = [getattr(s, name) for s in samples]
        return np.array(values + values[-1:], dtype=float)

    names = ("training_gpus", "inference_gpus", "loaned_training_gpus", "loaned_servers", "servers_needed")
    return times, {name: column(name) for name in names}


def plot_utilisation(results: Sequence[SimulationResult], path: Path) -> None:
    """GPU utilisation over time per policy: training pool (allocated / its GPUs) and inference pool
    (serving + loaned training / its GPUs)."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for result in results:
        if not result.utilisation:
            continue
        times, levels = _series(result)
        spec = result.spec
        if spec.training_servers:
            top.step(times, levels["training_gpus"] / (spec.training_servers * spec.gpus_per_server), where="post",
                     label=result.policy, linewidth=0.8)
        if spec.inference_servers:
            used = levels["inference_gpus"] + levels["loaned_training_gpus"]
            bottom.step(times, used / (spec.inference_servers * spec.gpus_per_server), where="post",
                        label=result.policy, linewidth=0.8)
    top.set_ylabel("training pool")
    bottom.set_ylabel("inference pool")
    bottom.set_xlabel("time (hours)")
    for ax in (top, bottom):
        ax.set_ylim(0, 1.05)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    top.set_title("GPU utilisation")
    fig.tight_layout()
    _save(fig, path)


def plot_loans(results: Sequence[SimulationResult], path: Path) -> None:
    """Loaned inference servers per policy against the inference demand (servers needed)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    demand_drawn = False
    for result in results:
        if not result.utilisation:
            continue
        times, levels = _series(result)
        if not demand_drawn:
            ax.step(times, levels["servers_needed"], where="post", color="black", linewidth=1.0,
                    label="inference demand (servers needed)")
            ax.axhline(result.spec.inference_servers, color="gray", linestyle="--", linewidth=0.8,
                       label="inference servers")
            demand_drawn = True
        ax.step(times, levels["loaned_servers"], where="post", linewidth=0.8, label=f"loaned ({result.policy})")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("servers")
    ax.set_title("Loaned servers vs inference demand")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    _save(fig, path)


# -- all outputs of a run -------------------------------------------------------------------------


def write_outputs(results: Sequence[SimulationResult], out_dir: Path, *, plots: bool = True) -> dict[str, Summary]:
    """Write ``jobs-<policy>.csv``, ``utilization-<policy>.csv``, ``summary.json`` ({policy: summary}) and,
    with ``plots``, ``jct_cdf.png``, ``utilization.png``, ``loans.png`` into ``out_dir``. Returns the
    summaries (in the order of ``results``)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = {r.policy: summarize(r) for r in results}
    for result in results:
        (out_dir / f"jobs-{result.policy}.csv").write_text(jobs_csv(result), encoding="utf-8")
        (out_dir / f"utilization-{result.policy}.csv").write_text(utilisation_csv(result), encoding="utf-8")
    (out_dir / "summary.json").write_text(summary_json(summaries), encoding="utf-8")
    if plots:
        plot_jct_cdf(results, out_dir / "jct_cdf.png")
        plot_utilisation(results, out_dir / "utilization.png")
        plot_loans(results, out_dir / "loans.png")
    return summaries
