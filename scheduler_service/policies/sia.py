"""Sia (Jayaram Subramanya et al., SOSP'23): heterogeneity-aware, goodput-optimised scheduling, our implementation.

Each cycle, for every active job and every *configuration* -- (GPU type, nodes, GPUs), ``core.gpu_configs``
-- an estimate of its goodput there; then one integer program picks at most one configuration per job:

- **goodput estimates** per configuration (``SiaJob.goodput``). A type on which the job has no model of its
  own is *bootstrapped* from the first type on which it has one: the goodput of as many GPUs there
  (``ceil(gpus / that type's GPUs per node)`` nodes), scaled by the ratio of the two types' one-GPU speeds
  (``SiaJob.base_speed``). A job with no model anywhere is offered one GPU (goodput 1) and nothing else,
  as Sia offers a job it has never seen run.
- **normalisation**: each job's row is divided by its smallest goodput, so 1 is "one GPU of the slowest
  useful configuration" and jobs of different sizes weigh alike; a configuration the job cannot use
  counts as ``ZERO_GAIN``.
- **restart penalty**: every configuration but the job's current one is multiplied by
  ``r = max(age - restarts * S, 0) / (age + S)`` (1 while ``age < S``), ``S`` the job's restart cost in
  seconds: a young or often-restarted job gains little from a move. A job still in its restart keeps its
  configuration (a constraint).
- **objective**: minimise ``sum(X * G**p) + lambda_n * (jobs - sum(X))`` over binary ``X`` with ``p < 0``
  (``SiaParams.p``, -0.5): ``G**p`` rounded to 2 decimals, clipped at ``CLIP``; ``lambda_n`` (1.1) > 1 >=
  every ``G**p`` of a useful configuration, so as many jobs run as fit, then the allocation of highest
  p-mean goodput wins. Constraints: at most one configuration per job; the GPUs of each type.
- **solver**: exact, ``scipy.optimize.milp`` (HiGHS) with a relative gap of 1e-4 (Sia's setting for
  CBC). Only variables that can lower the objective (``G**p < lambda_n``) and the pinned ones enter the
  program; the others are 0 at every optimum, so the answer is the same.

The registered policy (``sia``) runs the decision on a ``ClusterSnapshot``: pools from the servers' GPU
types, estimates from the job's declared throughput (``core.throughput.estimate``) times its speed on
each type (``core.type_speed.job_type_speeds``: measured from its step times where it ran, bootstrapped
elsewhere by the declared speeds, ``ClusterSnapshot.gpu_speed``; the declared speed alone until it has
measures). A job model that knows more (the simulator's heterogeneous job model, ``simulator.hetero``) hands its
estimates in with ``with_estimates``. Placement (one type per job) is ``core.gpu_configs``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from scheduler_service.core.gpu_configs import (
    Config,
    GpuPool,
    configurations,
    current_config,
    fits_job,
    gpu_pools,
    plan_configurations,
    server_types,
)
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import ThroughputModel, estimate
from scheduler_service.core.type_speed import job_type_speeds
from scheduler_service.policies.extras import require_scipy
from scheduler_service.policies.worker_targets import active_jobs

ZERO_GAIN = 1e-4   # a configuration the job cannot use
CLIP = 3000.0      # the largest G**p entering the program


@dataclass(frozen=True, slots=True)
class SiaParams:
    p: float = -0.5          # the p-norm of the objective (< 0: fairness between jobs)
    lambda_n: float = 1.1    # the cost of leaving a job without GPUs (> 1)
    mip_gap: float = 1e-4    # the solver's relative gap
    project: bool = True     # bootstrap unseen types from a type the job has a model on


@dataclass(frozen=True)
class SiaJob:
    """One active job as the decision sees it. ``goodput(type, nodes, gpus)``: its estimated goodput
    (any unit, > 0) there, or None where it has no model of that type; ``allowed(config)``: whether it may
    run there at all (types it accepts, whole workers)."""

    key: int
    goodput: Callable[[str, int, int], float | None]
    base_speed: Mapping[str, float]
    max_gpus: int
    current: Config | None = None
    age_s: float = 0.0
    restarts: int = 0
    restart_s: float = 30.0
    in_restart: bool = False
    allowed: Callable[[Config], bool] = field(default=lambda config: True)


@dataclass(frozen=True, slots=True)
class SiaDecision:
    configs: dict[int, Config | None]
    objective: float
    variables: int


def sia_allocate(jobs: Sequence[SiaJob], pools: Sequence[GpuPool], params: SiaParams = SiaParams()) -> SiaDecision:
    """The configuration of every job (None: it waits), by the program in the module doc."""
    configs = [c for pool in pools for c in configurations(pool)]
    if not jobs or not configs:
        return SiaDecision({j.key: None for j in jobs}, 0.0, 0)
    per_node = {p.gpu_type: p.gpus_per_node for p in pools}
    capacity = {p.gpu_type: p.gpus for p in pools}
    types = [p.gpu_type for p in pools]
    rows = np.array([_goodput_row(job, configs, types, per_node, params) for job in jobs], dtype=float)
    cost = np.minimum(np.round(np.power(rows, params.p), 2), CLIP)
    # Variables: (job, config) pairs that can lower the objective, and the pinned ones.
    pairs: list[tuple[int, int]] = []
    pinned: list[int] = []
    for i, job in enumerate(jobs):
        pin = _config_index(configs, job.current) if job.in_restart else None
        for c in range(len(configs)):
            if c == pin:
                pinned.append(len(pairs))
                pairs.append((i, c))
            elif cost[i, c] < params.lambda_n and rows[i, c] > ZERO_GAIN * 1.0001:
                pairs.append((i, c))
    chosen: dict[int, Config | None] = {j.key: None for j in jobs}
    objective = params.lambda_n * len(jobs)
    if pairs:
        x = _solve(pairs, cost, configs, capacity, len(jobs), pinned, params)
        for v, (i, c) in enumerate(pairs):
            if x[v] > 0.5:
                chosen[jobs[i].key] = configs[c]
                objective += cost[i, c] - params.lambda_n
    return SiaDecision(chosen, float(objective), len(pairs))


def _goodput_row(job: SiaJob, configs: Sequence[Config], types: Sequence[str], per_node: Mapping[str, int],
                 params: SiaParams) -> list[float]:
    modelled = [t for t in types if job.goodput(t, 1, 1) is not None]
    row = [0.0] * len(configs)
    for k, config in enumerate(configs):
        gpu_type, nodes, gpus = config
        if gpus > job.max_gpus or not job.allowed(config):
            continue
        if gpu_type in modelled:
            row[k] = job.goodput(gpu_type, nodes, gpus) or 0.0
        elif params.project and modelled:
            source = modelled[0]
            base = job.goodput(source, math.ceil(gpus / per_node[source]), gpus) or 0.0
            ratio = job.base_speed.get(gpu_type, 1.0) / job.base_speed.get(source, 1.0)
            row[k] = base * ratio
    useful = [g for g in row if g > ZERO_GAIN]
    if not modelled or (not params.project and not useful):
        # Never seen run: one GPU of any type, goodput 1 (Sia's first allocation).
        row = [1.0 if c[2] == 1 and job.allowed(c) else 0.0 for c in configs]
        useful = [1.0]
    scale = 1.0 / min(useful) if useful else 1.0
    row = [max(g * scale, ZERO_GAIN) for g in row]
    if job.current is not None and job.age_s >= job.restart_s:
        factor = max(job.age_s - job.restarts * job.restart_s, 0.0) / (job.age_s + job.restart_s)
        keep = _config_index(configs, job.current)
        row = [g if k == keep else max(g * factor, ZERO_GAIN) for k, g in enumerate(row)]
    return row


def _config_index(configs: Sequence[Config], current: Config | None) -> int | None:
    """The configuration a job runs in: its type and GPU count (however its GPUs are spread)."""
    if current is None:
        return None
    return next((k for k, c in enumerate(configs) if c[0] == current[0] and c[2] == current[2]), None)


def _solve(pairs: list[tuple[int, int]], cost: np.ndarray, configs: Sequence[Config], capacity: Mapping[str, int],
           num_jobs: int, pinned: list[int], params: SiaParams) -> np.ndarray:
    from scipy.optimize import Bounds, LinearConstraint, milp  # type: ignore[import-untyped]
    from scipy.sparse import coo_matrix  # type: ignore[import-untyped]

    n = len(pairs)
    c = np.array([cost[i, k] - params.lambda_n for i, k in pairs])
    types = sorted(capacity)
    type_row = {t: num_jobs + r for r, t in enumerate(types)}
    rows, cols, vals = [], [], []
    for v, (i, k) in enumerate(pairs):
        rows += [i, type_row[configs[k][0]]]
        cols += [v, v]
        vals += [1.0, float(configs[k][2])]
    a = coo_matrix((vals, (rows, cols)), shape=(num_jobs + len(types), n)).tocsr()
    upper = np.array([1.0] * num_jobs + [float(capacity[t]) for t in types])
    lower = np.full(n, 0.0)
    lower[pinned] = 1.0
    result = milp(c, integrality=np.ones(n), bounds=Bounds(lower, np.ones(n)),
                  constraints=LinearConstraint(a, -np.inf, upper), options={"mip_rel_gap": params.mip_gap})
    if result.x is None:  # the pins alone overfill a type (GPUs lost): decide without them
        result = milp(c, integrality=np.ones(n), bounds=Bounds(np.zeros(n), np.ones(n)),
                      constraints=LinearConstraint(a, -np.inf, upper), options={"mip_rel_gap": params.mip_gap})
    return np.asarray(result.x if result.x is not None else np.zeros(n))


# --------------------------------------------------------------------------------------------------
# The registered policy, on a ClusterSnapshot
# --------------------------------------------------------------------------------------------------

SiaEstimates = Callable[[ClusterSnapshot, Sequence[JobView]], Mapping[int, SiaJob]]


@dataclass(frozen=True)
class SiaPolicy:
    """Reads ``restart_cost_s`` (a restart's cost ``S``), ``default_runtime_s`` and ``amdahl_alpha`` (jobs
    that declare no speed-up)."""

    params: PolicyParams
    estimates: SiaEstimates | None = None
    sia: SiaParams = SiaParams()
    name: str = "sia"

    def __post_init__(self) -> None:
        require_scipy(self.name)

    def with_estimates(self, estimates: SiaEstimates) -> SiaPolicy:
        """This policy deciding on ``estimates`` (a job model's own) instead of the declared speeds."""
        return replace(self, estimates=estimates)

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        active = active_jobs(snapshot)
        pools = gpu_pools(snapshot)
        known = (self.estimates or self._declared)(snapshot, active)
        decision = sia_allocate([known[j.job_id] for j in active], pools, self.sia)
        return plan_configurations(snapshot, active, decision.configs, who="Sia",
                                   why_waiting="the GPUs give more p-mean goodput to other jobs",
                                   why_preempted="its GPUs give more p-mean goodput to other jobs")

    def _declared(self, snapshot: ClusterSnapshot, active: Sequence[JobView]) -> dict[int, SiaJob]:
        """Estimates from what jobs declare: speed by workers, times each type's speed for the job -- its own,
        measured where it ran and bootstrapped elsewhere (``core.type_speed``, ``JobView.type_speeds``), else
        the type's declared speed."""
        declared = dict(snapshot.gpu_speed)
        types = server_types(snapshot)
        pools = gpu_pools(snapshot)
        out: dict[int, SiaJob] = {}
        for job in active:
            model = estimate(job, now=snapshot.now, default_runtime_s=self.params.default_runtime_s,
                             alpha=self.params.amdahl_alpha).model
            per = max(1, job.gpus_per_worker)
            speed = job_type_speeds(job, declared, [p.gpu_type for p in pools])

            def goodput(gpu_type: str, nodes: int, gpus: int, model: ThroughputModel = model,
                        per: int = per, speed: dict[str, float] = speed) -> float | None:
                return float(model.speed(max(1, gpus // per))) * speed.get(gpu_type, 1.0)

            def allowed(config: Config, job: JobView = job) -> bool:
                return fits_job(job, config)

            resized = job.last_resized_at

            out[job.job_id] = SiaJob(
                job.job_id, goodput, speed,
                max_gpus=job.max_workers * per, current=current_config(job, types),
                age_s=max(0.0, snapshot.now - job.submitted_at), restarts=len(job.disruptions),
                restart_s=self.params.restart_cost_s,
                in_restart=resized is not None and snapshot.now - resized < self.params.restart_cost_s,
                allowed=allowed)
        return out


policies.register("sia")(SiaPolicy)
