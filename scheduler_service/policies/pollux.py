"""``pollux``: Pollux (Qiao et al., OSDI'21) -- each cycle, every job's GPUs (and, through its goodput
model, its batch size) chosen to maximise a cluster-wide mean of per-job speed-ups.

The decision (``pollux_decide``, pure):

- a job's **speed-up** on ``n`` nodes and ``r`` GPUs is its goodput there, at the best batch size
  (``core.goodput.best_batch_size``, computed by ``policies.pollux_search``), over its goodput on its
  *fair share* (``ceil(total GPUs / jobs)`` GPUs on one node); scaled by ``nodes / total GPUs`` (the
  authors': a share worth one node counts 1). A job without a goodput model yet (never run) counts
  ``r / fair share``.
- a job whose allocation changes (a start included, and a move to other GPUs of the same count) has its
  speed-up multiplied by ``max(age - restarts x 30 s, 0) / (age + 30 s)``: the re-allocation penalty.
- the **objective** is the power mean of ``speed-up + 0.001`` over the jobs with the fairness exponent
  ``p`` (-1, the authors'): maximised. For ``p < 0`` that is the least sum of ``(speed-up + 0.001)^p``;
  for ``p > 0`` the greatest sum of ``^p``; for 0 the greatest sum of logarithms.
- each job's GPU count, from 0 to its ``max_replicas``, is chosen **exactly** for that sum within the
  cluster's GPUs (``policies.pollux_search.min_cost_counts_mckp``, an exact multiple-choice knapsack),
  valuing ``r`` GPUs on the fewest nodes that hold them -- or, for the count it has, where it is without the penalty,
  if that is better. (The authors search the allocations with a genetic algorithm, NSGA-II, 100
  generations of 100; the optimum of the same objective is found here in milliseconds.)
- **placement**: jobs keeping their count (and chosen to stay) keep their GPUs; the others, most GPUs
  first, take one node that has room (the fullest that fits, their own first) or, if they need more than
  a node, whole nodes most-free first, never sharing a node with another multi-node job (the authors'
  rule); a job that finds less room gets what there is; GPUs left over then go, one each, to jobs left
  with none.

The registered policy (``PolluxPolicy``) runs the same decision on a ``ClusterSnapshot``, in units of
GPUs, each job's count a multiple of its worker's GPUs (``PolluxJob.step``); the count decided, in whole
workers, is what is applied. A job that reported step times and gradient statistics and declares batch
limits has a fitted goodput model (``core.goodput_fit.job_goodput``): its goodput is that model's on its
GPUs, at the best batch size, and it may take at most ``EXPLORE_FACTOR`` x the GPUs it has run on (the
authors' bound on extrapolating a fit). Any other job's goodput is its declared throughput curve
(``core.throughput``: points, else Amdahl), i.e. statistical efficiency 1 and no batch-size choice, and
its node count does not change it. The allocation is applied as ``optimus`` applies its own (a shrinking
job keeps its lowest ranks, a growing one keeps its workers); every job with batch limits that holds
workers afterwards gets its batch in ``Plan.batches`` (``core.goodput_fit.batch_for``: the fitted best on
the servers it holds, else the tuned ``init_bsz``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Generic, TypeVar

import numpy as np

from scheduler_service.core.goodput import GradParams, PerfParams
from scheduler_service.core.goodput_fit import MIN_ATOMIC_BSZ, batch_for, job_goodput
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import BatchSize, Plan, ScaleJob, StartJob
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import ThroughputModel, model_for
from scheduler_service.lifecycle import JobState
from scheduler_service.policies.pollux_search import best_config, min_cost_counts_mckp
from scheduler_service.policies.worker_targets import plan_worker_targets

RESTART_PENALTY_S = 30.0
FAIRNESS_P = -1.0
SPEEDUP_FLOOR = 1e-3      # added to every speed-up in the power mean (a job with none counts 0.001)
MAX_NODES_PER_JOB = 16

N = TypeVar("N", bound=Hashable)  # a node's key


@dataclass(frozen=True, slots=True)
class GoodputModel:
    """What the decision needs of a job's goodput: its fitted step-time parameters, its latest gradient
    statistics and its batch-size limits."""

    perf: PerfParams
    grad: GradParams
    init_bsz: int
    max_bsz: int
    min_atomic: int
    max_atomic: int
    _perf_array: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_perf_array", np.array([self.perf.alpha_c, self.perf.beta_c, self.perf.alpha_n,
                                                          self.perf.beta_n, self.perf.alpha_r, self.perf.beta_r,
                                                          self.perf.gamma]))

    def best(self, nodes: int, replicas: int) -> tuple[float, int, int]:
        """(goodput, atomic batch, accumulation steps) at the best batch size on ``nodes`` x ``replicas``."""
        g, atomic, accum = best_config(self._perf_array, self.grad.sqr, self.grad.var, float(self.init_bsz),
                                       float(self.max_bsz), self.min_atomic, self.max_atomic, nodes, replicas)
        return float(g), int(atomic), int(accum)


@dataclass(frozen=True, slots=True)
class PolluxJob:
    """One active job as the decision sees it. ``placement``: GPUs it holds per node (empty: none);
    ``speed``: for a job without a goodput model, its relative speed by GPU count (``None``: linear).
    ``step``: its GPUs come in multiples of this (a live job's worker of several GPUs on one node); a job
    with ``step`` > 1 gets no single GPUs left over (``_Packing._fill``)."""

    key: int
    max_replicas: int
    placement: Mapping[Any, int]
    age_s: float
    restarts: int
    model: GoodputModel | None = None
    min_replicas: int = 0
    speed: Sequence[float] | None = None
    step: int = 1


def _power_cost(speedup: float, p: float) -> float:
    """The job's term of the objective, to be minimised."""
    x = speedup + SPEEDUP_FLOOR
    if p < 0:
        return float(x ** p)
    if p == 0:
        return -math.log(x)
    return -float(x ** p)


def _nodes_needed(sizes: list[int], replicas: int) -> int:
    """The fewest nodes (of ``sizes``, largest first) holding ``replicas`` GPUs."""
    held = 0
    for i, size in enumerate(sizes, start=1):
        held += size
        if held >= replicas:
            return i
    return len(sizes)


def pollux_decide(jobs: Sequence[PolluxJob], capacity: Mapping[N, int], *, p: float = FAIRNESS_P,
                  restart_penalty_s: float = RESTART_PENALTY_S,
                  max_nodes_per_job: int = MAX_NODES_PER_JOB) -> dict[int, list[N]]:
    """Each job's node per GPU (the module doc), for the jobs given an allocation; ``jobs`` in priority
    order (ties in the objective go to the earlier one), ``capacity``: free GPUs per node, in node order."""
    total = sum(capacity.values())
    if not jobs or total <= 0:
        return {}
    sizes = sorted(capacity.values(), reverse=True)
    fair = math.ceil(total / len(jobs))
    scale = len(capacity) / total
    objective = _Objective(jobs, fair, scale, p, restart_penalty_s)
    width = min(total, max(j.max_replicas for j in jobs)) + 1
    cost = np.full((len(jobs), width), np.inf)
    stay = np.zeros((len(jobs), width), dtype=bool)
    for i, job in enumerate(jobs):
        held = sum(job.placement.values())
        cost[i, 0] = _power_cost(0.0, p)
        for r in range(max(1, job.min_replicas), min(job.max_replicas, width - 1) + 1):
            if r % job.step:
                continue
            cost[i, r] = objective.cost(i, min(_nodes_needed(sizes, r), max_nodes_per_job), r, True)
            if r == held:
                kept = objective.cost(i, len([g for g in job.placement.values() if g]), r, False)
                if kept <= cost[i, r]:
                    cost[i, r], stay[i, r] = kept, True
    counts = min_cost_counts_mckp(cost, total)
    return _Packing(jobs, objective, capacity, max_nodes_per_job).run(
        [int(c) for c in counts], [bool(stay[i, c]) for i, c in enumerate(counts)])


class _Objective:
    """Each job's term of the objective (to be minimised) for a configuration, memoised per cycle."""

    def __init__(self, jobs: Sequence[PolluxJob], fair: int, scale: float, p: float, penalty_s: float) -> None:
        self.jobs, self.fair, self.scale, self.p = jobs, fair, scale, p
        self.factor = [max(j.age_s - j.restarts * penalty_s, 0.0) / (j.age_s + penalty_s) for j in jobs]
        self.base = [j.model.best(1, fair)[0] if j.model is not None else 0.0 for j in jobs]
        self._memo: dict[tuple[int, int, int, bool], float] = {}

    def cost(self, i: int, nodes: int, replicas: int, changed: bool) -> float:
        key = (i, nodes, replicas, changed)
        known = self._memo.get(key)
        if known is None:
            speedup = 0.0
            if replicas > 0:
                speedup = _speedup(self.jobs[i], nodes, replicas, self.base[i], self.fair) * self.scale
                if changed:
                    speedup *= self.factor[i]
            known = self._memo[key] = _power_cost(speedup, self.p)
        return known

    def of(self, i: int, spread: Mapping[Any, int]) -> float:
        """The term of job ``i`` on ``spread`` (GPUs per node)."""
        used = {n: g for n, g in spread.items() if g}
        own = {n: g for n, g in self.jobs[i].placement.items() if g}
        return self.cost(i, len(used), sum(used.values()), used != own)


def _speedup(job: PolluxJob, nodes: int, replicas: int, base: float, fair: int) -> float:
    if job.model is None:
        if job.speed is not None:
            return job.speed[min(replicas, len(job.speed) - 1)] / job.speed[min(fair, len(job.speed) - 1)]
        return replicas / fair
    if base <= 0:
        return replicas / fair
    return job.model.best(nodes, replicas)[0] / base


class _Packing(Generic[N]):
    """Nodes for the chosen counts (module doc), each choice by the true term of the objective: a job is
    valued on the nodes it actually gets, so a job that finds no node with room for its count compares
    spreading over nodes with fewer GPUs on one; then GPUs left over go, one at a time, where they lower
    the objective most."""

    def __init__(self, jobs: Sequence[PolluxJob], objective: _Objective, capacity: Mapping[N, int],
                 max_nodes_per_job: int) -> None:
        self.jobs, self.objective, self.max_nodes = jobs, objective, max_nodes_per_job
        self.order = {node: i for i, node in enumerate(capacity)}
        self.free = dict(capacity)
        self.multi: set[N] = set()   # nodes holding a job that spans nodes
        self.placed: dict[int, dict[N, int]] = {}
        # Nodes by free GPUs, each a heap by node order (entries whose node's free count changed since are
        # skipped when met): ``_single``'s best fit without a scan of every node.
        self.by_free: dict[int, list[tuple[int, N]]] = {}
        for node, free in self.free.items():
            self.by_free.setdefault(free, []).append((self.order[node], node))
        for heap in self.by_free.values():
            heapq.heapify(heap)

    def _take(self, i: int, spread: dict[N, int]) -> None:
        old = self.placed.get(i, {})
        for n, g in old.items():
            self.free[n] += g
        if len(old) > 1:
            self.multi.difference_update(old)
        self.placed[i] = spread
        for n, g in spread.items():
            self.free[n] -= g
        if len(spread) > 1:
            self.multi.update(spread)
        for n in {*old, *spread}:
            heapq.heappush(self.by_free.setdefault(self.free[n], []), (self.order[n], n))

    def _single(self, i: int, want: int) -> dict[N, int] | None:
        own = self.jobs[i].placement
        want -= want % self.jobs[i].step
        if want <= 0:
            return None
        # A node it is on first, then the fewest free GPUs that fit, then node order.
        mine = [n for n, g in own.items() if g and self.free.get(n, 0) >= want]
        if mine:
            return {min(mine, key=lambda n: (self.free[n], self.order[n])): want}
        for free in sorted(f for f in self.by_free if f >= want):
            heap = self.by_free[free]
            while heap and self.free[heap[0][1]] != free:
                heapq.heappop(heap)  # its node's free count changed since
            if heap:
                return {heap[0][1]: want}
        return None

    def _spread(self, i: int, want: int) -> dict[N, int]:
        own = self.jobs[i].placement
        spread: dict[N, int] = {}
        for node in sorted((n for n in self.free if n not in self.multi and self.free[n] > 0),
                           key=lambda n: (-self.free[n], own.get(n, 0) == 0, self.order[n])):
            if want <= 0 or len(spread) >= self.max_nodes:
                break
            step = self.jobs[i].step
            take = min(self.free[node] - self.free[node] % step, want)
            if take <= 0:
                continue
            spread[node] = take
            want -= take
        return spread

    def run(self, counts: list[int], stay: list[bool]) -> dict[int, list[N]]:
        jobs = self.jobs
        for i, job in enumerate(jobs):
            if counts[i] and stay[i]:
                self._take(i, {n: g for n, g in job.placement.items() if g})
        for i in sorted((i for i in range(len(jobs)) if counts[i] and not stay[i]), key=lambda i: (-counts[i], i)):
            want = counts[i]
            options = [o for o in (self._single(i, want),) if o]
            if not options:
                most = max(self.free.values(), default=0)
                if most > 0:
                    options.append(self._single(i, most) or {})
                spread = self._spread(i, want)
                if spread:
                    options.append(spread)
            options = [o for o in options if o]
            if options:
                self._take(i, min(options, key=lambda o: self.objective.of(i, o)))
        self._fill()
        return {jobs[i].key: [n for n in sorted(spread, key=lambda n: self.order[n]) for _ in range(spread[n])]
                for i, spread in self.placed.items() if spread}

    def _fill(self) -> None:
        """One GPU at a time to the job whose term falls most by it (on a node it is on, or, for a job with
        none, the fullest node with room), while GPUs are free and one lowers the objective."""
        while any(g > 0 for g in self.free.values()):
            best: tuple[float, int, dict[N, int]] | None = None
            for i, job in enumerate(self.jobs):
                spread = self.placed.get(i, {})
                if sum(spread.values()) >= job.max_replicas or job.step > 1:
                    continue
                if spread:
                    nodes = [n for n in spread if self.free[n] > 0]
                    if len(spread) > 1:
                        nodes += [n for n in self.free if n not in self.multi and self.free[n] > 0]
                else:
                    if job.min_replicas > 1:
                        continue
                    nodes = [n for n in self.free if self.free[n] > 0]
                if not nodes:
                    continue
                now = self.objective.of(i, spread)
                if not spread:  # a job with none: the fullest node with room
                    nodes = sorted(set(nodes), key=lambda n: (self.free[n], self.order[n]))[:1]
                for node in nodes:
                    trial = dict(spread)
                    trial[node] = trial.get(node, 0) + 1
                    gain = self.objective.of(i, trial) - now
                    if gain < -1e-12 and (best is None or gain < best[0]):
                        best = (gain, i, trial)
            if best is None:
                return
            self._take(best[1], best[2])


# --------------------------------------------------------------------------------------------------
# The registered policy, on a ClusterSnapshot
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolluxPolicy:
    """Uses ``amdahl_alpha`` (jobs that declare no throughput points) and ``restart_cost_s`` is not used:
    the re-allocation penalty is the authors' 30 s."""

    params: PolicyParams
    name: str = "pollux"
    p: float = FAIRNESS_P

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        active = sorted((j for j in snapshot.jobs if j.state in (JobState.PENDING, JobState.RUNNING)),
                        key=lambda j: (_attained_s(j, snapshot.now) * max(j.num_workers, 1), j.submitted_at,
                                       j.job_id))
        servers = [s for s in snapshot.servers if s.runs_training and not s.cordoned]
        if not active or not servers:
            return Plan()
        # Units of the decision: GPUs, each job's in multiples of its worker's GPUs (``PolluxJob.step``).
        capacity = {s.server_id: len(s.healthy_gpus) for s in servers}
        capacity = {k: v for k, v in capacity.items() if v > 0}
        if not capacity:
            return Plan()
        decision_jobs = []
        total = sum(capacity.values())
        for j in active:
            model = model_for(j.throughput_points, self.params.amdahl_alpha)
            gpw = j.gpus_per_worker
            most = max(j.max_workers, j.min_workers, 1)
            held: dict[Hashable, int] = {}
            for w in j.workers:
                held[w.server_id] = held.get(w.server_id, 0) + len(w.gpu_indices)
            fitted = _goodput_model(j)
            if fitted is not None:  # within what its fit speaks for (the explored range)
                trusted = job_goodput(j)
                assert trusted is not None
                most = max(min(most, trusted.trusted // gpw), j.min_workers, 1)
            decision_jobs.append(PolluxJob(
                key=j.job_id, max_replicas=most * gpw, placement=held,
                age_s=max(0.0, snapshot.now - j.submitted_at),
                restarts=0, min_replicas=max(1, j.min_workers) * gpw, model=fitted, step=gpw,
                speed=_speeds(model, gpw, most * gpw + total + 1)))
        decided = pollux_decide(decision_jobs, capacity, p=self.p)
        target = {}
        for j in active:
            count = len(decided.get(j.job_id, [])) // j.gpus_per_worker
            # The packing may find a job less room than its count: below its gang's minimum, a queued job waits
            # and a running one keeps its size (a size below min_workers is no size: the rule book refuses it).
            if 0 < count < j.min_workers:
                count = 0 if j.state == JobState.PENDING else j.num_workers
            target[j.job_id] = count
        plan = plan_worker_targets(
            snapshot, active, target, who="Pollux", largest_first=True,
            why_waiting="the free GPUs raise the cluster's mean speed-up more on other jobs",
            why_shrunk="its GPUs raise the cluster's mean speed-up more elsewhere", why_grown="the best mean speed-up",
            why_preempted="its GPUs raise the cluster's mean speed-up more on other jobs")
        batches = _batches(active, plan)
        return replace(plan, batches=batches) if batches else plan


@lru_cache(maxsize=4096)
def _speeds(model: ThroughputModel, gpus_per_worker: int, count: int) -> tuple[float, ...]:
    """A declared curve by GPU count ``0..count - 1``: the speed of the whole workers those GPUs hold (below
    one worker, its share of one worker's speed: a fair share smaller than a worker is still a share)."""
    one = model.speed(1)
    return tuple(model.speed(r // gpus_per_worker) if r >= gpus_per_worker else one * r / gpus_per_worker
                 for r in range(count))


def _goodput_model(job: JobView) -> GoodputModel | None:
    """The decision's goodput model of a job with a fitted one (``core.goodput_fit``), else None."""
    fitted = job_goodput(job)
    if fitted is None:
        return None
    lim = fitted.limits
    return GoodputModel(fitted.perf, fitted.grad, lim.init_bsz, max(lim.max_bsz, lim.init_bsz), MIN_ATOMIC_BSZ,
                        max(lim.max_atomic_bsz, MIN_ATOMIC_BSZ))


def _batches(active: Sequence[JobView], plan: Plan) -> tuple[BatchSize, ...]:
    """The batch of every job with batch limits that holds workers once ``plan`` is applied, on the
    servers it then holds (module doc), in job order."""
    placed: dict[int, set[str]] = {j.job_id: {w.server_id for w in j.workers} for j in active}
    counts = {j.job_id: len(j.workers) for j in active}
    changes: list[StartJob | ScaleJob] = [*plan.starts, *plan.scales]
    for action in changes:
        placed[action.job_id] = {w.server_id for w in action.workers}
        counts[action.job_id] = len(action.workers)
    for preempted in plan.preemptions:
        counts[preempted.job_id] = 0
    out = []
    for j in sorted(active, key=lambda j: j.job_id):
        if j.batch_limits is not None and counts[j.job_id] > 0:
            batch = batch_for(j, len(placed[j.job_id]), counts[j.job_id])
            if batch is not None:
                out.append(batch)
    return tuple(out)


def _attained_s(job: JobView, now: float) -> float:
    return max(0.0, now - (job.started_at if job.started_at is not None else now))


policies.register("pollux")(PolluxPolicy)
