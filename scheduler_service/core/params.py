"""The tunables every policy is built with (one typed object; each policy uses what applies to it).

The service builds it from its config's ``[policy]`` section; the simulator from its arguments.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

QOS_HOPELESS = ("deprioritise", "keep")  # policy.qos_hopeless
RECLAIM_PROTECTION = ("strict", "shrink")  # policy.reclaim_protection


@dataclass(frozen=True)
class PolicyParams:
    loan_buffer_servers: int = 1       # serving servers kept beyond demand before any loan
    loan_idle_s: float = 300.0         # a server must have been serving this long to be loaned
    min_loan_s: float = 600.0          # younger loans are reclaimed only when older ones do not suffice
    drain_timeout_s: float = 30.0      # DRAINING -> LOANED after this (until the router acknowledges)
    # A reclaim's hard deadline: a RECLAIMING server whose agent has not confirmed the training workers
    # gone by then goes back to inference anyway (routing still waits for the agent's confirmation).
    reclaim_deadline_s: float = 120.0
    # The share of inference requests that may arrive while serving capacity is below need (``aryl``'s
    # forecast-aware loaning, ``policies.aryl.loans``): its complement is the quantile of the demand
    # forecast's upper band that the reclaim starts ahead of and that no loan may eat into.
    inference_short_budget: float = 0.001
    starvation_s: float = 3600.0       # a job waiting this long gets a reservation
    # Anti-thrashing (``core.protection``: one window every mechanism honours): a job runs at least this
    # long after a start or resize before it is resized or preempted again, and is disrupted at most
    # max_disruptions_per_hour times an hour (0: no cap); only an inference reclaim that finds nothing
    # else, or a drain past its deadline, overrides either.
    min_resize_interval_s: float = 300.0
    max_disruptions_per_hour: int = 6
    # What an inference reclaim (``aryl``, ``policies.aryl.loans.choose_reclaim``) makes of that protection.
    # "shrink" (the default): shrinking a protected elastic job costs it one more restart of all its GPUs (the
    # thrash the window exists to spare it), weighed against the other choices' work lost and restarts;
    # stopping a protected job stays the last resort. "strict": it disrupts a protected job only when the
    # loaned servers without one do not suffice, even if that means stopping an unprotected job instead of
    # shrinking a protected one (docs/evaluation.md, inference: 1.5x the preemptions per reclaimed server).
    reclaim_protection: str = "shrink"
    restart_cost_s: float = 60.0       # a restart's cost, in seconds of completion time
    default_runtime_s: float = 3600.0  # run-time estimate for jobs that declare none
    amdahl_alpha: float = 0.05         # speed-up model for jobs that declare no throughput points
    max_extra_options: int = 64        # knapsack options per elastic job (k = 1..this)
    # Deadlines (``JobView.deadline``). ``aryl``: turning a predicted miss into a hit is worth this many
    # times the job's remaining time at min_workers, in its knapsack and its reclaim cost (0: aryl
    # ignores deadlines). ``qos``: what becomes of a job that can no longer meet its deadline --
    # "deprioritise" (it queues behind the jobs without one) or "keep" (it keeps its urgency) -- and the
    # margin, a share of its remaining time, below which a job's slack counts as at risk.
    deadline_weight: float = 1.0
    qos_hopeless: str = "deprioritise"
    qos_margin: float = 0.2
    # ``dl2``: its weights file ("": the weights shipped with Aryl, ``policies/data/dl2.npz``); a missing file
    # or one made for another encoding stops the service at start. Online learning: off unless set (needs torch);
    # one learning step each time this many jobs have left the active set (completed, cancelled or failed).
    dl2_model: str = ""
    dl2_online_learning: bool = False
    dl2_online_batch_jobs: int = 8

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, (int, float)) and value < 0:
                raise ValueError(f"policy.{name} must be >= 0 (got {value})")
        if self.qos_hopeless not in QOS_HOPELESS:
            raise ValueError(f"policy.qos_hopeless must be one of {', '.join(QOS_HOPELESS)} "
                             f"(got {self.qos_hopeless!r})")
        if self.reclaim_protection not in RECLAIM_PROTECTION:
            raise ValueError(f"policy.reclaim_protection must be one of {', '.join(RECLAIM_PROTECTION)} "
                             f"(got {self.reclaim_protection!r})")
        if self.dl2_online_batch_jobs < 1:
            raise ValueError(f"policy.dl2_online_batch_jobs must be >= 1 (got {self.dl2_online_batch_jobs})")
        if not self.inference_short_budget < 1:
            raise ValueError(f"policy.inference_short_budget must be below 1, a share of requests "
                             f"(got {self.inference_short_budget}; the default is 0.001)")
        if not 1 <= self.max_extra_options <= 126:
            raise ValueError(f"policy.max_extra_options must be between 1 and 126 (got {self.max_extra_options})")


class ParamError(ValueError):
    """A policy parameter given as text (``aryl-sim --param``, ``arylctl what-if --param``) that is unknown
    or of the wrong type; ``key`` is the name as given, ``problem`` says what is wrong."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


def params_from_text(base: PolicyParams, changes: Mapping[str, str]) -> PolicyParams:
    """``base`` with ``changes``: field names (``-`` works as ``_``) to values as text, each read as its
    field's type (flags: ``true``/``false``/``1``/``0``). ParamError for an unknown name or a value that is
    not of its field's type; ValueError (``PolicyParams``' own checks) for a value out of range."""
    known = {f.name for f in dataclasses.fields(PolicyParams)}
    values: dict[str, object] = {}
    for raw, text in changes.items():
        key = raw.strip().replace("-", "_")
        if key not in known:
            raise ParamError(raw, f"unknown policy parameter; known: {', '.join(sorted(known))}")
        kind = type(getattr(base, key))
        try:
            if kind is bool and text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            values[key] = text.lower() in ("true", "1") if kind is bool else kind(text)
        except ValueError:
            raise ParamError(raw, f"expected {kind.__name__} (got {text!r})") from None
    return dataclasses.replace(base, **values)  # type: ignore[arg-type]


def changed_params(base: PolicyParams, changed: PolicyParams) -> Sequence[str]:
    """``KEY=VALUE`` of each parameter of ``changed`` that differs from ``base`` (field order)."""
    return [f"{f.name}={getattr(changed, f.name)}" for f in dataclasses.fields(PolicyParams)
            if getattr(changed, f.name) != getattr(base, f.name)]
