"""What a job's workers report for goodput (issue 17), kept in ``jobs.goodput_reports`` (migration 0014).

Nouns: a *configuration* is (nodes, replicas, local batch size, GPU type) -- the servers and GPUs a job
ran on, its per-GPU batch per pass and the model of those GPUs ("" when they mix models or none is known);
a *step-time sample* is the newest (pass time, step time) its rank 0 measured at one configuration;
*gradient statistics* are Pollux's ``grad_sqr`` and ``grad_var`` (normalised to the job's init batch size),
the latest reported.

Which reports count: rank 0's only (every rank of a synchronous data-parallel job runs the same
steps and, after the all-reduce, the same gradients: one rank says it all), and only of the job's
current incarnation (the caller's filter, ``store.agents``: an older incarnation's report is history).
The nodes and replicas of a sample are the job's allocation as the scheduler placed it; the batch is
the one the worker says it ran.

Bounded: at most ``MAX_STEP_TIMES`` configurations per job; a new one beyond that drops the one
measured longest ago (a job that ran at many sizes keeps its recent ones).

The JSON document::

    {"step_times": [[nodes, replicas, local, accum, pass_s, step_s, measured_at, gpu_type], ...],  # oldest first
     "grad": [sqr, var, measured_at] or null, "samples": n}

Never: decide anything, or write: the caller writes the document this returns.
"""

from __future__ import annotations

from typing import Any

from scheduler_service.core.batch import step_sample
from scheduler_service.core.goodput import GradParams, StepSample
from scheduler_service.records import GoodputInfo, StepTimeInfo, WorkerReport

MAX_STEP_TIMES = 32


_NO_REPORTS = GoodputInfo()  # frozen, of immutable parts: one value for every job without reports


def goodput_info(document: Any) -> GoodputInfo:
    """``jobs.goodput_reports`` as a value; empty for NULL (or JSON null)."""
    if not isinstance(document, dict):
        return _NO_REPORTS
    grad = document.get("grad")
    return GoodputInfo(
        # Entries written before the GPU type was kept have 7 fields: their type is not known.
        step_times=tuple(
            StepTimeInfo(int(n), int(r), int(b), int(a), float(p), float(s), float(t), str(rest[0]) if rest else "")
            for n, r, b, a, p, s, t, *rest in document.get("step_times") or ()
        ),
        grad=GradParams(float(grad[0]), float(grad[1])) if grad else None,
        samples=float(document.get("samples") or 0.0),
    )


def with_report(document: Any, report: WorkerReport, *, nodes: int, replicas: int, now: float,
                gpu_type: str = "") -> dict[str, Any] | None:
    """``document`` with what rank 0's ``report`` adds (module doc), at ``nodes`` servers and
    ``replicas`` GPUs of model ``gpu_type``; None when the report adds nothing (no goodput measures in it)."""
    current: dict[str, Any] = dict(document) if isinstance(document, dict) else {}
    changed = False
    if report.step_time_s > 0 and report.pass_time_s > 0 and report.local_batch_size > 0 and replicas > 0:
        key = (nodes, replicas, report.local_batch_size, gpu_type)
        kept = [entry for entry in current.get("step_times") or ()
                if (*entry[:3], entry[7] if len(entry) > 7 else "") != key]
        kept.append([nodes, replicas, report.local_batch_size, report.accum_steps, report.pass_time_s,
                     report.step_time_s, now, gpu_type])
        current["step_times"] = kept[-MAX_STEP_TIMES:]
        changed = True
    if report.grad_sqr > 0 or report.grad_var > 0:
        current["grad"] = [report.grad_sqr, report.grad_var, now]
        changed = True
    if report.samples > 0 and report.samples != current.get("samples"):
        current["samples"] = report.samples
        changed = True
    return current if changed else None


def step_samples(info: GoodputInfo) -> tuple[StepSample, ...]:
    """The step times as ``core.goodput`` fits them (``core.batch.step_sample``: without accumulation), of the GPU
    type the job measured last only: one performance model is one type's (a pass on a T4 and one on an A100 are
    not points of one curve, and a fit over both mixed the two into neither). A job moved to another type is
    fitted from its first report there, on that type's samples (those it kept from an earlier stay included)."""
    times = info.step_times
    if not times:
        return ()
    latest = max(times, key=lambda t: t.measured_at).gpu_type
    return tuple(step_sample(t.nodes, t.replicas, t.local_batch_size, t.accum_steps, t.pass_time_s, t.step_time_s)
                 for t in times if t.gpu_type == latest)
