"""The plan's job changes, once the cycle's sizes are decided (``sizing``, ``base``): each running job whose
workers changed becomes a scale (``plan_scales``; a job started this cycle and grown at once starts at its full
size instead), each job held below its maximum a note saying why it keeps its size (``size_notes``), and each job
with batch limits the batch it runs at its size (``plan_batches``).

Must never decide anything (a size, a start, a preemption, a placement): it writes down what the earlier steps
decided (a start grown at once keeps its placement, only its size and message change). Pure: no I/O, no wall
clock; deterministic for a given snapshot.
"""

from __future__ import annotations

from collections.abc import Sequence

from scheduler_service.core.goodput_fit import batch_for
from scheduler_service.core.plan import BatchSize, KeepSize, Reason, ScaleJob, StartJob, WorkerPlacement
from scheduler_service.policies.aryl.cycle import _Cycle, _Job, _placed


def plan_scales(cycle: _Cycle) -> list[ScaleJob]:
    """The plan's scales: each running job whose workers this cycle changed. A job started this cycle and
    grown at once starts at its full size instead (its ``StartJob`` is rewritten)."""
    started = {s.job_id: s for s in cycle.starts}
    scales = []
    changed = sorted((job_id, job) for job_id, job in cycle.running.items()
                     if job_id in started or not _unchanged(job))
    regrown: dict[int, StartJob] = {}
    for job_id, job in changed:
        before = [(w.rank, w.server_id, w.gpu_indices) for w in sorted(job.view.workers, key=lambda w: w.rank)]
        after = [(rank, w.server_id, w.gpu_indices) for rank, w in enumerate(job.workers)]
        if job_id in started:
            if len(job.workers) != job.view.min_workers:
                # A job started this cycle and grown at once: start it at its full size, and say so
                # (the message names the size it starts with, not only its minimum).
                grown = tuple(WorkerPlacement(r, sid, g) for r, sid, g in after)
                extras = len(grown) - job.view.min_workers
                s = started[job_id]
                regrown[job_id] = StartJob(
                    s.job_id, grown, s.reason,
                    f"{_placed(grown)}: its minimum of {job.view.min_workers} and {extras} elastic "
                    f"extra(s) from this cycle's spare GPUs{s.message.removeprefix(_placed(s.workers))}")
            continue
        if after != before:
            scales.append(
                ScaleJob(job_id, tuple(WorkerPlacement(r, sid, g) for r, sid, g in after),
                         job.reason or Reason.SCALED_OUT, job.message)
            )
    if regrown:
        cycle.starts = [regrown.get(s.job_id, s) for s in cycle.starts]
    return scales


def _unchanged(job: _Job) -> bool:
    """Does the job still hold exactly the snapshot's workers, ranks 0..n-1? (Then it needs no scale.)"""
    workers, shown = job.workers, job.view.workers
    if len(workers) != len(shown):
        return False
    for rank, (a, b) in enumerate(zip(workers, shown, strict=True)):
        if a is not b or a.rank != rank:
            return False
    return True


def size_notes(cycle: _Cycle, scales: Sequence[ScaleJob]) -> tuple[KeepSize, ...]:
    """One note per running job below max_workers that keeps its size this cycle (``cycle.holds``), and
    a clearing one for each job whose standing note no longer holds (it changed size, reached its
    maximum, or nothing holds it back); ``cycle.only_changed_reasons`` keeps only the changes."""
    changed = {s.job_id for s in scales} | {s.job_id for s in cycle.starts}
    notes = []
    for job_id, job in sorted(cycle.running.items()):
        hold = cycle.holds.get(job_id) if job_id not in changed else None
        if hold is not None:
            view = job.view
            notes.append(KeepSize(job_id, hold[0], f"held at {len(job.workers)} of {view.min_workers}-"
                                                   f"{view.max_workers} worker(s): {hold[1]}"))
        elif job.view.size_note:
            notes.append(KeepSize(job_id, None))
    return tuple(notes)


def plan_batches(cycle: _Cycle) -> tuple[BatchSize, ...]:
    """The batch of every job with batch limits that holds workers once the plan is applied, at the size
    and on the servers it then has (``core.goodput_fit.batch_for``), in job order; every cycle, as the
    choice follows the job's fit (the applier passes on only a change)."""
    out = []
    for _, job in sorted(cycle.running.items()):
        if job.view.batch_limits is not None and job.workers:
            batch = batch_for(job.view, len({w.server_id for w in job.workers}), len(job.workers))
            if batch is not None:
                out.append(batch)
    return tuple(out)
