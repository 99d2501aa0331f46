"""Gavel (Narayanan et al., OSDI'20), max-sum-throughput with rounds: the Sia study's heterogeneity-aware
baseline, our implementation.

Each job asks for a fixed number of GPUs (its ``gpus``) and runs on one type at a time. Each round:

1. **allocation** -- the linear program of Gavel's max-sum-throughput policy: the fraction of time
   ``x[j, t]`` that job ``j`` should spend on type ``t``, maximising ``sum(x[j, t] * T[j, t])`` (``T``: the
   job's throughput on ``t`` at its size) subject to ``sum_t x[j, t] <= 1`` and, per type,
   ``sum_j gpus_j * x[j, t] <= GPUs of t``. Solved exactly by HiGHS (``scipy.optimize.linprog``);
   where the optimum is not unique, HiGHS' vertex may differ from another solver's.
2. **priorities** -- ``x[j, t]`` divided by the share of the type's time the job has received so far
   (``GavelJob.time_on``, over ``cluster_time``; every job starts with half a round on every type); a job
   that has received none ranks first among those with ``x > 0``.
3. **rounds** -- (job, type) entries by priority, then allocation, highest first: a job not yet scheduled
   gets its type if its GPUs fit there. The others wait for the next round (time-sharing by rounds).

The registered policy (``gavel``) decides on a ``ClusterSnapshot``: a job's size is its ``max_workers``
workers, its throughput on a type its declared speed there (``core.throughput.estimate`` times the type's
declared speed), the time it has received its current run's (a live snapshot keeps no history of rounds).
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
from scheduler_service.policies.worker_targets import active_jobs


@dataclass(frozen=True)
class GavelJob:
    key: int
    gpus: int
    throughput: Mapping[str, float]   # per GPU type, at ``gpus`` GPUs
    time_on: Mapping[str, float]      # seconds of rounds received per type (plus half a round each)


@dataclass(frozen=True)
class GavelRound:
    jobs: Mapping[int, GavelJob]
    cluster_time: Mapping[str, float]  # per type: the sum of every job's ``time_on`` there, ever


def max_sum_throughput(jobs: Sequence[GavelJob], pools: Sequence[GpuPool]) -> np.ndarray:
    """The allocation ``x`` (jobs x pools) of step 1."""
    from scipy.optimize import linprog  # type: ignore[import-untyped]

    m, n = len(jobs), len(pools)
    if not m or not n:
        return np.zeros((m, n))
    t = np.array([[job.throughput.get(p.gpu_type, 0.0) for p in pools] for job in jobs])
    a_rows: list[np.ndarray] = []
    b: list[float] = []
    for j in range(m):
        row = np.zeros(m * n)
        row[j * n:(j + 1) * n] = 1.0
        a_rows.append(row)
        b.append(1.0)
    for k, pool in enumerate(pools):
        row = np.zeros(m * n)
        for j, job in enumerate(jobs):
            row[j * n + k] = job.gpus
        a_rows.append(row)
        b.append(float(pool.gpus))
    result = linprog(-t.reshape(-1), A_ub=np.array(a_rows), b_ub=np.array(b), bounds=(0.0, 1.0), method="highs")
    x = np.asarray(result.x).reshape(m, n) if result.x is not None else np.zeros((m, n))
    return np.asarray(np.clip(np.round(x, 5), 0.0, 1.0))


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
            ran = snapshot.now - job.last_resized_at if held is not None and job.last_resized_at is not None else 0.0
            jobs[job.job_id] = GavelJob(job.job_id, gpus, throughput,
                                        {p.gpu_type: 1.0 + (ran if held and held[0] == p.gpu_type else 0.0)
                                         for p in pools})
        cluster_time = {p.gpu_type: sum(j.time_on[p.gpu_type] for j in jobs.values()) for p in pools}
        return GavelRound(jobs, cluster_time)


def gpu_pools_by_type(pools: Sequence[GpuPool]) -> dict[str, GpuPool]:
    return {p.gpu_type: p for p in pools}


policies.register("gavel")(GavelPolicy)
