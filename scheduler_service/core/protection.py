"""Anti-thrashing: one protection window per running job, asked by every mechanism that would take GPUs
from it or change its size. Pure: reads a ``JobView``, ``now`` and ``PolicyParams``; never I/O, never
the wall clock.

Nouns
-----
- *Disruption*: anything that restarts a running job's workers -- a resize (out or in, for whatever
  reason) or a preemption. Each costs the job a restart (``policy.restart_cost_s``) and the work since
  its last checkpoint. ``JobView.disruptions`` holds the times of its recent ones (the service's store
  and the simulator record each scale and preemption as it is applied).
- *Protection window*: a running job is *protected* while either rule holds (``ProtectionRule``):
  - ``MIN_RUNTIME``: it started, restarted or resized less than ``policy.min_resize_interval_s`` ago
    (the minimum resize interval the elastic step always had, now one rule for every mechanism);
  - ``DISRUPTION_CAP``: it was disrupted ``policy.max_disruptions_per_hour`` times or more in the last
    hour (``DISRUPTION_WINDOW_S``); it is protected until the oldest of those ages out of the hour.
  When both hold, the one that lasts longer is reported (it is the one that binds).
- *Mechanism*: who asks (``Mechanism``). *Soft* mechanisms -- elastic scaling (either way), a queued
  gang or a starving job's reservation taking elastic extras, queue reclaim (a queue within its quota
  taking back borrowed GPUs), priority preemption, and an operator's drain before its deadline -- leave a
  protected job alone: the job keeps its size and the asking job waits (at most ``min_resize_interval_s``,
  or the hour of the cap), with the rule named in its reason.
- *Hard needs* override protection, and say so in the action's message (``overridden``):
  - an inference reclaim must get its servers back: it prefers loaned servers whose reclaim disrupts no
    protected job, and takes one that does only when the others do not free enough servers
    (``reclaim_penalty`` makes the reclaim greedy choose that way);
  - a drain whose deadline has passed: the operator's deadline is the promise (``core.faults``);
  - a LOST server is not a decision: its workers are gone already (``core.faults`` never asks).
- *Who asks*: ``core.faults`` (drains) and the ``aryl`` family, ``qos`` and ``dl2`` (their resize
  interval is this window). The peers reproduced from their papers -- ``tiresias``, ``optimus``, ``pollux``,
  ``drf`` -- resize and preempt by their own published rules (each round reallocates) and do not ask.

Why these defaults (``core.params``): a disruption costs about ``restart_cost_s`` (60 s) plus the work since
the last checkpoint; a window of 300 s (5 restarts' worth) keeps a job's restart overhead from any one
mechanism under ~20% even when it is disrupted as soon as its window ends, and the cap of 6 an hour bounds
the overhead of all of them together at ~10% of the hour (6 x 60 s). They are settings, not tuned figures:
0 turns either rule off.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import clock_time
from scheduler_service.core.snapshot import JobView
from scheduler_service.lifecycle import JobState

# The cap counts the disruptions of this last stretch of time (the "per hour" of max_disruptions_per_hour).
DISRUPTION_WINDOW_S = 3600.0
# Added per protected worker a reclaim would stop (GPU-seconds): more than any real cost (31 GPU-years),
# so the reclaim greedy disrupts a protected job only when no unprotected choice is left.
RECLAIM_PROTECTED_PENALTY = 1e9
_RUNNING = (JobState.RUNNING, JobState.SCALING)


class ProtectionRule(StrEnum):
    """Which rule protects a job (stable: shown in reason messages and ``arylctl explain``)."""

    MIN_RUNTIME = "MIN_RUNTIME"          # started or resized less than policy.min_resize_interval_s ago
    DISRUPTION_CAP = "DISRUPTION_CAP"    # policy.max_disruptions_per_hour reached in the last hour


class Mechanism(StrEnum):
    """What would disrupt the job (named in the messages)."""

    ELASTIC = "elastic scaling"
    BASE_DEMAND = "a queued job's gang"
    STARVATION = "a starving job's reservation"
    RECLAIM = "inference reclaim"
    QUOTA = "queue reclaim"
    PRIORITY = "priority preemption"
    DRAIN = "server drain"


@dataclass(frozen=True, slots=True)
class Protection:
    """A job is protected by ``rule`` until ``until`` (snapshot time); ``detail`` says why, in numbers."""

    job_id: int
    rule: ProtectionRule
    until: float
    detail: str

    @property
    def summary(self) -> str:
        """"protected (MIN_RUNTIME) until 14:07:10 UTC: resized at 14:02:10 UTC, ..."""
        return f"protected ({self.rule}) until {clock_time(self.until)}: {self.detail}"


def recent_disruptions(job: JobView, now: float) -> tuple[float, ...]:
    """The times of the job's disruptions within the last ``DISRUPTION_WINDOW_S``, oldest first."""
    return tuple(sorted(t for t in job.disruptions if now - t < DISRUPTION_WINDOW_S))


def protection(job: JobView, now: float, params: PolicyParams) -> Protection | None:
    """The job's protection at ``now``, or None when nothing protects it (not running, or neither rule
    holds)."""
    if job.state not in _RUNNING or not job.workers:
        return None
    found: list[Protection] = []
    at, window = job.last_resized_at, params.min_resize_interval_s
    if at is not None and window > 0 and now - at < window:
        found.append(Protection(job.job_id, ProtectionRule.MIN_RUNTIME, at + window,
                                f"started or resized at {clock_time(at)}; a job runs at least {window:.0f}s at a "
                                "size (policy.min_resize_interval_s)"))
    cap = params.max_disruptions_per_hour
    if cap > 0:
        recent = recent_disruptions(job, now)
        if len(recent) >= cap:
            # Protected until enough of them age out that one more keeps it within the cap.
            until = recent[len(recent) - cap] + DISRUPTION_WINDOW_S
            found.append(Protection(job.job_id, ProtectionRule.DISRUPTION_CAP, until,
                                    f"{len(recent)} resizes/preemptions in the last hour; at most {cap} "
                                    "(policy.max_disruptions_per_hour)"))
    return max(found, key=lambda p: p.until) if found else None


def protected_jobs(jobs: Iterable[JobView], now: float, params: PolicyParams) -> dict[int, Protection]:
    """Each protected job's protection, by job id (a cycle asks once, every mechanism reads it)."""
    out = {}
    for job in jobs:
        p = protection(job, now, params)
        if p is not None:
            out[job.job_id] = p
    return out


def blocked(p: Protection, mechanism: Mechanism) -> str:
    """The message fragment for a disruption the protection blocked."""
    return f"job {p.job_id} is {p.summary}; {mechanism} leaves it be"


def overridden(p: Protection, mechanism: Mechanism, why: str) -> str:
    """The message fragment for a hard need that overrides a job's protection (the rule that was set aside
    and why it had to be)."""
    return f"overrides its protection ({p.rule}, until {clock_time(p.until)}): {mechanism} {why}"


def reclaim_penalty(p: Protection | None) -> float:
    """What a reclaim adds, per worker it stops, for a job with protection ``p`` (0 when unprotected)."""
    return RECLAIM_PROTECTED_PENALTY if p is not None else 0.0


def reclaim_scale_in_penalty(p: Protection | None, params: PolicyParams, job_gpus: int) -> float:
    """What a reclaim adds, per worker it removes from a job that keeps running, for a job of ``job_gpus`` GPUs
    with protection ``p`` (0 when unprotected): under ``policy.reclaim_protection`` "strict" as much as for a
    stop (``reclaim_penalty``); under "shrink" one more restart of all its GPUs (``restart_cost_s`` each), the
    thrash its window exists to spare it, so that a reclaim shrinks it rather than stop an unprotected job
    whose stop costs more."""
    if p is None:
        return 0.0
    if params.reclaim_protection == "shrink":
        return params.restart_cost_s * job_gpus
    return reclaim_penalty(p)


def record_disruption(times: Iterable[float] | None, now: float) -> tuple[float, ...]:
    """A job's disruption times (``JobView.disruptions``) once one more is applied at ``now``: the last
    ``DISRUPTION_WINDOW_S`` of them, oldest first (both appliers, the store's and the simulator's, keep them so)."""
    return (*sorted(t for t in (times or ()) if now - t < DISRUPTION_WINDOW_S), now)


def explain(job: JobView, now: float, params: PolicyParams) -> tuple[str, int]:
    """What ``arylctl explain`` shows of the window (``ExplainJobResponse.protection``): the protection's
    summary ("" when nothing protects the job) and its disruptions in the last hour."""
    shield = protection(job, now, params)
    return (shield.summary if shield is not None else "", len(recent_disruptions(job, now)))
