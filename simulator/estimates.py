"""What a job tells the scheduler about its length: the truth, a noisy user estimate, or nothing.

A trace knows each job's true ``work``; a real scheduler does not. ``Estimates`` turns a trace job
into one that *declares* something else (``TraceJob.declared_work`` / ``declared_runtime_s``), which
the simulated cluster shows the policy in place of the truth (``JobView.total_work`` /
``estimated_runtime_s``); the truth still drives progress and completion. The modes, by name
(``Estimates.parse``, ``aryl-sim --estimates``):

- ``exact`` (the default): the policy sees the true total work -- a clairvoyant scheduler.
- ``lognormal:SIGMA``: the user declares a run time at ``min_workers`` (the service's
  ``estimated_runtime``) equal to the true one times ``exp(SIGMA x z)``, z standard normal: unbiased in
  log space (the median estimate is the truth), off by a factor of ``exp(SIGMA)`` or more for about a
  third of jobs (SIGMA 0.8: 2.2x; 1.0: 2.7x). No total work is declared, so the policy estimates as the
  service does for such a job (``core.throughput.estimate``): the declared time at ``min_workers``
  less the progress the job reports, never below 10% of the estimate and growing again past it
  (``core.throughput.work_left``: a job that outlives its estimate is not taken to be nearly done).
  z is drawn per job from ``(seed, job_id)`` alone, so a job's error does not
  depend on the other jobs of the trace, and the same seed gives the same estimates.
- ``none``: nothing declared; the policy falls back to ``PolicyParams.default_runtime_s`` at
  ``min_workers`` less the reported progress, as the service does for a job without hints.

Throughput points (the speed curve) are declared in every mode: this module is about length only.

Must never: touch the true ``work`` or run a simulation.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from scheduler_service.core.throughput import ThroughputModel
from simulator.model import TraceJob

Kind = Literal["exact", "lognormal", "none"]
KINDS: tuple[Kind, ...] = ("exact", "lognormal", "none")


class EstimatesError(ValueError):
    """An estimates mode that does not parse; the message lists the valid forms."""


@dataclass(frozen=True, slots=True)
class Estimates:
    kind: Kind = "exact"
    sigma: float = 0.0   # lognormal: the standard deviation of the log of the error factor

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise EstimatesError(f"unknown estimates mode {self.kind!r}; expected exact, lognormal:SIGMA or none")
        if self.kind == "lognormal" and not (math.isfinite(self.sigma) and self.sigma >= 0):
            raise EstimatesError(f"lognormal sigma must be a finite number >= 0 (got {self.sigma})")

    @classmethod
    def parse(cls, text: str | Estimates) -> Estimates:
        """``exact``, ``none`` or ``lognormal:SIGMA`` (e.g. ``lognormal:0.8``)."""
        if isinstance(text, Estimates):
            return text
        name, _, arg = text.strip().partition(":")
        if name == "lognormal":
            try:
                return cls("lognormal", float(arg))
            except ValueError:
                raise EstimatesError(f"lognormal needs a sigma, e.g. lognormal:0.8 (got {text!r})") from None
        if name in ("exact", "none") and not arg:
            return cls(name)  # type: ignore[arg-type]  # narrowed by the test above
        raise EstimatesError(f"unknown estimates mode {text!r}; expected exact, lognormal:SIGMA or none")

    def __str__(self) -> str:
        return f"lognormal:{self.sigma:g}" if self.kind == "lognormal" else self.kind

    def error_factor(self, job_id: int, seed: int) -> float:
        """lognormal: the job's multiplicative error, ``exp(sigma x z)``, z drawn from (seed, job id)."""
        z = random.Random(f"aryl-estimate:{seed}:{job_id}").gauss(0.0, 1.0)
        return math.exp(self.sigma * z)

    def declare(self, job: TraceJob, seed: int) -> TraceJob:
        """``job`` as it declares itself in this mode (the same object for ``exact``)."""
        if self.kind == "exact":
            return job
        if self.kind == "none":
            return dataclasses.replace(job, declared_work=0.0, declared_runtime_s=None)
        true_runtime = job.work / ThroughputModel(points=job.throughput).speed(job.min_workers)
        return dataclasses.replace(job, declared_work=0.0,
                                   declared_runtime_s=true_runtime * self.error_factor(job.job_id, seed))

    def apply(self, jobs: Iterable[TraceJob], seed: int) -> list[TraceJob]:
        return [self.declare(job, seed) for job in jobs]


EXACT = Estimates()
