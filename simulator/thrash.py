"""Thrash metrics of a simulation run (the anti-thrashing rule's yardstick, ``core.protection``).

Nouns:
- *Disruption*: a resize (out, in, or a move to the same size elsewhere) or a preemption of a job: each
  restarts all its workers.
- *Job-hour*: an hour of a job's life from its first start to its completion (a started job still running
  when the run stops counts up to the run's end). Queueing before the first start is left out: a job that
  has not started cannot be disrupted.

``thrash_metrics`` gives, over all started jobs: ``resizes_per_job_hour``, ``preemptions_per_job_hour``
and ``disruptions_per_job_hour`` (their sum), and ``max_disruptions_per_job`` (the worst single job).
``simulator.results.summarize`` adds them to every summary.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypedDict

from simulator.cluster import JobOutcome


class ThrashMetrics(TypedDict):
    resizes_per_job_hour: float | None
    preemptions_per_job_hour: float | None
    disruptions_per_job_hour: float | None
    max_disruptions_per_job: int


def thrash_metrics(jobs: Iterable[JobOutcome], end_time: float, digits: int = 4) -> ThrashMetrics:
    """Resizes and preemptions per job-hour (see the module docstring); None where no job started."""
    hours = resizes = preemptions = worst = 0.0
    for j in jobs:
        if j.start is None:
            continue
        hours += max((j.end if j.end is not None else end_time) - j.start, 0.0) / 3600.0
        moved = j.scale_outs + j.scale_ins + j.moves
        resizes += moved
        preemptions += j.preemptions
        worst = max(worst, moved + j.preemptions)

    def per_hour(count: float) -> float | None:
        return round(count / hours, digits) if hours > 0 else None

    return {
        "resizes_per_job_hour": per_hour(resizes),
        "preemptions_per_job_hour": per_hour(preemptions),
        "disruptions_per_job_hour": per_hour(resizes + preemptions),
        "max_disruptions_per_job": int(worst),
    }
