"""Deadlines for trace jobs: the seeded rule the evaluation cites (``aryl-sim --deadlines``).

Traces (Philly, Pollux workloads) carry no deadlines, so a job is given one by rule:

    deadline = submit_time + f x duration,   f ~ U(a, b)

- ``duration``: the job's run time from scratch at its requested size, ``min_workers`` (the size the
  trace says it ran at; ``TraceJob.runtime_at``) -- for a Philly job, its traced run time;
- ``f``: a keyed draw, as every random choice of ``simulator.traces``: the BLAKE2b hash of
  ``(seed, "deadline", job name)`` as a uniform number in [0, 1), mapped to [a, b). A job's deadline
  does not change when other jobs are filtered out or the trace is cut, and the seed picks another
  independent set;
- the settings (``DEADLINE_SETTINGS``): **tight** ``U(1.0, 2.0)`` -- a job meets it only if it waits
  less than its own run time (less with the restart), or is scaled up; **loose** ``U(2.0, 4.0)``.

A job whose ``f`` is 1.0 exactly must run at once and lose no second to restarts; none is below its
run time, so every deadline is feasible for a job alone on an empty cluster that is scaled up.

Never: run a simulation or decide anything; it only fills in ``TraceJob.deadline``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from simulator.model import TraceJob
from simulator.traces import _keyed_uniform

# setting -> (a, b) of the factor's uniform range
DEADLINE_SETTINGS: dict[str, tuple[float, float]] = {"tight": (1.0, 2.0), "loose": (2.0, 4.0)}


def assign_deadlines(jobs: Iterable[TraceJob], setting: str, seed: int) -> list[TraceJob]:
    """``jobs`` with the deadline of the rule above (any deadline they had is replaced)."""
    if setting not in DEADLINE_SETTINGS:
        raise ValueError(f"unknown deadline setting {setting!r}; one of {', '.join(DEADLINE_SETTINGS)}")
    low, high = DEADLINE_SETTINGS[setting]
    return [replace(job, deadline=job.submit_time + deadline_factor(job, low, high, seed)
                    * job.runtime_at(job.min_workers))
            for job in jobs]


def deadline_factor(job: TraceJob, low: float, high: float, seed: int) -> float:
    """The job's ``f`` in [low, high): its keyed draw (module doc)."""
    return low + (high - low) * _keyed_uniform(seed, "deadline", job.name)
