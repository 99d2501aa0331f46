"""Gavel (Narayanan et al., OSDI'20), max-sum-throughput with rounds: the Sia study's heterogeneity-aware
baseline, our implementation.

Each job asks for a fixed number of GPUs (its ``gpus``) and runs on one type at a time. Each round:

1. **allocation** -- the linear program of Gavel's max-sum-throughput policy: the fraction of time
   ``x[j, t]`` that job ``j`` should spend on type ``t``, maximising ``sum(x[j, t] * T[j, t])`` (``T``: the
   job's throughput on ``t`` at its size) subject to ``sum_t x[j, t] <= 1`` and, per type,
   ``sum_j gpus_j * x[j, t] <= GPUs of t``. Solved by an interior-point method of our own
   (``central_lp``), as Gavel solves it (ECOS): where the optimum is not unique, the solution is the
   central one, equal jobs sharing a type evenly, not a vertex.
2. **priorities** -- ``x[j, t]`` divided by the share of the type's time the job has received so far
   (``GavelJob.time_on``, over ``cluster_time``; every job starts with half a round on every type); a job
   that has received none ranks first among those with ``x > 0``.
3. **rounds** -- (job, type) entries by priority, then allocation, highest first: a job not yet scheduled
   gets its type if its GPUs fit there. The others wait for the next round (time-sharing by rounds).

The registered policy (``gavel``) decides on a ``ClusterSnapshot``: a job's size is its ``max_workers``
workers, its throughput on a type its declared speed there (``core.throughput.estimate`` times the type's
declared speed), the time it has received its work done at that speed (a live snapshot keeps no history of
rounds), and a running job that has not checkpointed since it (re)started keeps its type (``pinned``):
stopped, it would lose its work.
A job model that knows more (``simulator.hetero``) hands its own in with ``with_estimates``. Placement
(one type per job) is ``core.gpu_configs``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from scheduler_service.core.gpu_configs import (
    Config,
    GpuPool,
    current_config,
    gpu_pools,
    plan_configurations,
    server_types,
)
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import estimate
from scheduler_service.policies.extras import require_scipy
from scheduler_service.policies.worker_targets import active_jobs


@dataclass(frozen=True)
class GavelJob:
    key: int
    gpus: int
    throughput: Mapping[str, float]   # per GPU type, at ``gpus`` GPUs
    time_on: Mapping[str, float]      # seconds of rounds received per type (plus half a round each)
    pinned: str | None = None         # the type it keeps this round whatever its priority (None: none)


@dataclass(frozen=True)
class GavelRound:
    jobs: Mapping[int, GavelJob]
    cluster_time: Mapping[str, float]  # per type: the sum of every job's ``time_on`` there, ever


def max_sum_throughput(jobs: Sequence[GavelJob], pools: Sequence[GpuPool]) -> np.ndarray:
    """The allocation ``x`` (jobs x pools) of step 1: the central optimum (``central_lp``), rounded to 5
    decimals; HiGHS' vertex (``scipy.optimize.linprog``) where the interior-point iteration fails."""
    m, n = len(jobs), len(pools)
    if not m or not n:
        return np.zeros((m, n))
    t = np.array([[job.throughput.get(p.gpu_type, 0.0) for p in pools] for job in jobs]).reshape(-1)
    a = np.zeros((m + n, m * n))
    b = np.zeros(m + n)
    for j, job in enumerate(jobs):
        a[j, j * n:(j + 1) * n] = 1.0
        b[j] = 1.0
        for k in range(n):
            a[m + k, j * n + k] = job.gpus
    for k, pool in enumerate(pools):
        b[m + k] = float(pool.gpus)
    x = central_lp(t, a, b)
    if x is None:
        from scipy.optimize import linprog  # type: ignore[import-untyped]

        result = linprog(-t, A_ub=a, b_ub=b, bounds=(0.0, None), method="highs")
        x = np.asarray(result.x) if result.x is not None else np.zeros(m * n)
    return np.asarray(np.clip(np.round(x.reshape(m, n), 5), 0.0, 1.0))


def central_lp(c: np.ndarray, a: np.ndarray, b: np.ndarray, *, tolerance: float = 1e-9,
               iterations: int = 100) -> np.ndarray | None:
    """``max c.x`` subject to ``a x <= b``, ``x >= 0`` (``b > 0``), by a primal-dual interior-point method
    (Mehrotra's predictor-corrector). Where the optimum is not unique its iterates tend to the analytic
    centre of the optimal face -- equal jobs share a type's GPUs evenly -- as those of Gavel's solver
    (ECOS, an interior-point method too) do, where a simplex method would return a vertex (one job all,
    the other none), and Gavel's rounds depend on that. None if it does not converge."""
    rows, cols = a.shape
    m = np.hstack([a, np.eye(rows)])            # a x + s = b, z = (x, s) >= 0
    q = np.concatenate([-c, np.zeros(rows)])   # minimise -c.x
    z, w, y = np.ones(cols + rows), np.ones(cols + rows), np.zeros(rows)
    size = len(z)
    for _ in range(iterations):
        rp = b - m @ z
        rd = q - m.T @ y - w
        mu = float(z @ w) / size
        if (np.linalg.norm(rp) <= tolerance * (1 + np.linalg.norm(b))
                and np.linalg.norm(rd) <= tolerance * (1 + np.linalg.norm(q)) and mu <= tolerance):
            return z[:cols]
        d = z / w
        normal = (m * d) @ m.T

        def direction(rc: np.ndarray, normal: np.ndarray = normal, d: np.ndarray = d, rp: np.ndarray = rp,
                      rd: np.ndarray = rd, w: np.ndarray = w) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            dy = np.linalg.solve(normal, rp - m @ (rc / w) + m @ (d * rd))
            dw = rd - m.T @ dy
            return rc / w - d * dw, dy, dw

        try:
            dz, dy, dw = direction(-z * w)
            step_p, step_d = _step(z, dz), _step(w, dw)
            mu_aff = float((z + step_p * dz) @ (w + step_d * dw)) / size
            sigma = (mu_aff / mu) ** 3
            dz, dy, dw = direction(sigma * mu - z * w - dz * dw)
        except np.linalg.LinAlgError:
            return None
        step_p, step_d = 0.995 * _step(z, dz), 0.995 * _step(w, dw)
        z, y, w = z + step_p * dz, y + step_d * dy, w + step_d * dw
    return None


def _step(v: np.ndarray, dv: np.ndarray) -> float:
    """The longest step in [0, 1] along ``dv`` that keeps ``v`` >= 0."""
    falling = dv < 0
    return float(min(1.0, np.min(-v[falling] / dv[falling]))) if falling.any() else 1.0


def gavel_allocate(round_: GavelRound, order: Sequence[int], pools: Sequence[GpuPool]) -> dict[int, str | None]:
    """The type each job of ``order`` (its arrival order) runs on this round, None: it waits (steps 2, 3)."""
    jobs = [round_.jobs[k] for k in order]
    x = max_sum_throughput(jobs, pools)
    entries: list[tuple[float, float, int, int]] = []   # (priority, allocation, entry order, job index)
    for k, pool in enumerate(pools):
        total = round_.cluster_time.get(pool.gpu_type, 0.0)
        for j, job in enumerate(jobs):
            share = job.time_on.get(pool.gpu_type, 0.0) / total if total > 0 else 0.0
            alloc = float(x[j, k])
            priority = alloc * 1e9 if alloc == 0.0 or share <= 0.0 else alloc / share
            entries.append((priority, alloc, k * len(jobs) + j, j))
    # Highest priority first (then allocation); equal keys keep their order (types, then arrival).
    entries.sort(key=lambda e: (-e[0], -e[1], e[2]))
    left = {p.gpu_type: p.gpus for p in pools}
    chosen: dict[int, str | None] = {k: None for k in order}
    for job in jobs:  # pinned jobs keep their type first
        if job.pinned is not None and job.pinned in left and job.gpus <= left[job.pinned]:
            left[job.pinned] -= job.gpus
            chosen[job.key] = job.pinned
    for _, _, position, j in entries:
        gpu_type = pools[position // len(jobs)].gpu_type
        job = jobs[j]
        if chosen[job.key] is not None or left[gpu_type] == 0 or job.gpus > left[gpu_type]:
            continue
        left[gpu_type] -= job.gpus
        chosen[job.key] = gpu_type
    return chosen


GavelEstimates = Callable[[ClusterSnapshot, Sequence[JobView]], GavelRound]


@dataclass(frozen=True)
class GavelPolicy:
    """Reads ``default_runtime_s`` and ``amdahl_alpha`` (jobs that declare no speed-up)."""

    params: PolicyParams
    estimates: GavelEstimates | None = None
    name: str = "gavel"

    def __post_init__(self) -> None:
        require_scipy(self.name)  # the fallback where the interior-point iteration fails (``central_lp``)

    def with_estimates(self, estimates: GavelEstimates) -> GavelPolicy:
        return replace(self, estimates=estimates)

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        active = active_jobs(snapshot)
        pools = gpu_pools(snapshot)
        round_ = (self.estimates or self._declared)(snapshot, active)
        types = gpu_pools_by_type(pools)
        chosen = gavel_allocate(round_, [j.job_id for j in active], pools)
        decided: dict[int, Config | None] = {}
        for job in active:
            gpu_type = chosen[job.job_id]
            if gpu_type is None:
                decided[job.job_id] = None
                continue
            gpus = round_.jobs[job.job_id].gpus
            decided[job.job_id] = (gpu_type, math.ceil(gpus / types[gpu_type].gpus_per_node), gpus)
        return plan_configurations(snapshot, active, decided, who="Gavel",
                                   why_waiting="its round goes to jobs of higher priority",
                                   why_preempted="its round goes to jobs of higher priority")

    def _declared(self, snapshot: ClusterSnapshot, active: Sequence[JobView]) -> GavelRound:
        speed = dict(snapshot.gpu_speed)
        types = server_types(snapshot)
        pools = gpu_pools(snapshot)
        jobs: dict[int, GavelJob] = {}
        for job in active:
            model = estimate(job, now=snapshot.now, default_runtime_s=self.params.default_runtime_s,
                             alpha=self.params.amdahl_alpha).model
            gpus = job.max_workers * max(1, job.gpus_per_worker)
            rate = model.speed(job.max_workers)
            throughput = {p.gpu_type: (rate * speed.get(p.gpu_type, 1.0) if gpus <= p.gpus else 0.0) for p in pools}
            held = current_config(job, types)
            # Service received so far, at its size: the work it has done (a live snapshot keeps no rounds).
            received = job.work_done / rate if rate > 0 else 0.0
            # A running job that has not checkpointed since it (re)started would lose its work: it keeps its GPUs.
            fresh = held is not None and (job.last_checkpoint_at is None or job.last_resized_at is None
                                          or job.last_checkpoint_at < job.last_resized_at)
            jobs[job.job_id] = GavelJob(job.job_id, gpus, throughput, {p.gpu_type: 1.0 + received for p in pools},
                                        pinned=held[0] if fresh and held is not None else None)
        cluster_time = {p.gpu_type: sum(j.time_on[p.gpu_type] for j in jobs.values()) for p in pools}
        return GavelRound(jobs, cluster_time)


def gpu_pools_by_type(pools: Sequence[GpuPool]) -> dict[str, GpuPool]:
    return {p.gpu_type: p for p in pools}


policies.register("gavel")(GavelPolicy)
