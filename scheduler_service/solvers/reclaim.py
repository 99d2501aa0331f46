"""Which loaned servers to give back to inference: greedy on server preemption cost (the Aryl policy's
reclaim).

The setting: L loaned servers run training workers of J jobs. Returning server *l* removes every worker
on it. For each job *j*, after returning a set S of servers:

- ``kept = job_workers[j] - (j's workers on S)``;
- if *j* lost a worker and ``kept < job_min[j]``, *j* is **preempted**: cost ``job_cost[j]`` (work lost
  since its last checkpoint, GPU-seconds: since the worker saved it when it acknowledged it, else
  since the scheduler learnt of it; ``store.agents.checkpoint_values``), and all its workers
  everywhere stop, so its workers on other loaned servers no longer weigh on those servers;
- otherwise *j* is **scaled in**: cost ``scale_in_cost[j] * (workers removed)``.

The cost of S is the sum over jobs, left to right in job order (``reclaim_cost_of``); it depends only on
the set, not on the order. An inelastic job has ``job_min == job_workers``: any loss preempts it.

The exact optimum (``reclaim_exact``, numba; ``reclaim_exhaustive``, plain Python) tries every subset: the
policy (``reclaim_solve``) uses it while there are at most ``EXACT_SUBSETS`` of them, the greedy beyond.

The greedy (``reclaim_greedy``, numba; ``reclaim_greedy_reference``, plain Python, identical picks):
``n_reclaim`` times, return the server whose *marginal cost* ``cost(S + {l}) - cost(S)`` is lowest
(ties: the lower server index), then recompute. Per job on *l* that marginal is:
already preempted: 0; newly preempted: ``job_cost[j] - scale_in_cost[j] * removed_so_far[j]`` (its
scale-in charge is replaced by the preemption); scaled in: ``scale_in_cost[j] * workers_on_l``. A
server's marginal is the sum of those terms over its jobs in ascending job order. Both implementations
form exactly that sum, so their floats, and therefore their picks and tie-breaks, are identical. The
greedy's total cost is ``reclaim_cost_of`` of the picked set (the sum of the marginals equals it up to
rounding).

The encoding (CSR, "compressed sparse rows", built by ``ReclaimInstance.from_triples``):

- per server: ``server_ptr`` int64[L+1]; server *l*'s entries are ``server_ptr[l]:server_ptr[l+1]`` of
  ``server_job`` int64[nnz] (ascending job) and ``server_workers`` int64[nnz] (``> 0``);
- per job: ``job_ptr`` int64[J+1]; job *j*'s entries are ``job_ptr[j]:job_ptr[j+1]`` of ``job_server``
  int64[nnz] (ascending server) and ``job_server_workers`` int64[nnz].

A pick touches only the jobs on the picked server and, through them, the servers those jobs span; the
kernel recomputes the marginal of just those servers. Choosing the next server is a linear scan over L
(200 picks x 1,000 servers is 2e5 comparisons, cheaper than keeping a heap up to date).

Never: import grpc, SQLAlchemy or the wall clock; know about jobs or servers as domain objects.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit

from scheduler_service.solvers import BoolArray, FloatArray, IntArray, SolverInputError


@dataclass(frozen=True)
class ReclaimInstance:
    """Loaned servers, the jobs on them, and what preempting or shrinking each job costs (arrays are
    read-only; build one with ``from_triples`` or ``from_dense``)."""

    server_ptr: IntArray            # int64[L+1]
    server_job: IntArray            # int64[nnz], ascending within each server
    server_workers: IntArray        # int64[nnz], > 0
    job_ptr: IntArray               # int64[J+1]
    job_server: IntArray            # int64[nnz], ascending within each job
    job_server_workers: IntArray    # int64[nnz], > 0
    job_workers: IntArray           # int64[J]: current workers of each job, on all servers
    job_min: IntArray               # int64[J]: min_workers (== job_workers for an inelastic job)
    job_cost: FloatArray            # float64[J]: cost of preempting the job (GPU-seconds: lost work, restarts,
    #                                 a deadline the preemption makes it miss; ``policies.aryl``)
    scale_in_cost: FloatArray       # float64[J]: cost per worker removed when the job only shrinks

    @property
    def n_servers(self) -> int:
        return int(self.server_ptr.shape[0] - 1)

    @property
    def n_jobs(self) -> int:
        return int(self.job_workers.shape[0])

    @classmethod
    def from_triples(cls, placements: Iterable[tuple[int, int, int]], *, n_servers: int,
                     job_workers: Sequence[int] | IntArray, job_min: Sequence[int] | IntArray,
                     job_cost: Sequence[float] | FloatArray, scale_in_cost: Sequence[float] | FloatArray,
                     ) -> ReclaimInstance:
        """From ``(job, server, workers)`` triples: job *job* runs *workers* workers on loaned server
        *server*. Triples with 0 workers are ignored; a (job, server) pair may appear only once."""
        jw = _int_array("job_workers", job_workers)
        n_jobs = jw.shape[0]
        jm = _int_array("job_min", job_min, n_jobs)
        jc = _float_array("job_cost", job_cost, n_jobs)
        sc = _float_array("scale_in_cost", scale_in_cost, n_jobs)
        if n_servers < 0:
            raise SolverInputError("n_servers", f"must be >= 0, got {n_servers}")
        rows = np.array([t for t in placements if t[2] != 0], dtype=np.int64).reshape(-1, 3)
        job, server, workers = rows[:, 0], rows[:, 1], rows[:, 2]
        if rows.size:
            if job.min() < 0 or job.max() >= n_jobs:
                raise SolverInputError("placements", f"a job index is outside 0..{n_jobs - 1}")
            if server.min() < 0 or server.max() >= n_servers:
                raise SolverInputError("placements", f"a server index is outside 0..{n_servers - 1}")
            if workers.min() < 0:
                raise SolverInputError("placements", "a worker count is negative")
        by_server = np.lexsort((job, server))
        pairs = rows[by_server][:, :2]
        if pairs.shape[0] > 1 and np.any(np.all(pairs[1:] == pairs[:-1], axis=1)):
            raise SolverInputError("placements", "a (job, server) pair appears twice")
        if np.any(jw < 0):
            raise SolverInputError("job_workers", "must be >= 0")
        if np.any(jm < 0):
            raise SolverInputError("job_min", "must be >= 0")
        if np.any(jm > jw):
            raise SolverInputError("job_min", "a job's min_workers exceeds its current workers")
        on_loaned = np.bincount(job, weights=workers, minlength=n_jobs).astype(np.int64)
        if np.any(on_loaned > jw):
            raise SolverInputError("job_workers", "a job has more workers on loaned servers than in total")
        if np.any(jc < 0):
            raise SolverInputError("job_cost", "must be >= 0")
        if np.any(sc < 0):
            raise SolverInputError("scale_in_cost", "must be >= 0")
        by_job = np.lexsort((server, job))
        server_ptr = np.zeros(n_servers + 1, np.int64)
        np.cumsum(np.bincount(server, minlength=n_servers), out=server_ptr[1:])
        job_ptr = np.zeros(n_jobs + 1, np.int64)
        np.cumsum(np.bincount(job, minlength=n_jobs), out=job_ptr[1:])
        arrays = dict(
            server_ptr=server_ptr, server_job=job[by_server], server_workers=workers[by_server],
            job_ptr=job_ptr, job_server=server[by_job], job_server_workers=workers[by_job],
            job_workers=jw, job_min=jm, job_cost=jc, scale_in_cost=sc,
        )
        for name, arr in arrays.items():
            arr = np.ascontiguousarray(arr)
            arr.setflags(write=False)
            arrays[name] = arr
        return cls(**arrays)

    @classmethod
    def from_dense(cls, workers_on: IntArray, *, job_workers: Sequence[int] | IntArray,
                   job_min: Sequence[int] | IntArray, job_cost: Sequence[float] | FloatArray,
                   scale_in_cost: Sequence[float] | FloatArray) -> ReclaimInstance:
        """From ``workers_on`` int64[J, L]: workers of job *j* on loaned server *l*."""
        dense = np.asarray(workers_on)
        if dense.ndim != 2:
            raise SolverInputError("workers_on", f"must be 2-D [jobs, servers], got shape {dense.shape}")
        jobs, servers = np.nonzero(dense)
        triples = zip(jobs.tolist(), servers.tolist(), dense[jobs, servers].tolist(), strict=True)
        return cls.from_triples(triples, n_servers=dense.shape[1], job_workers=job_workers, job_min=job_min,
                                job_cost=job_cost, scale_in_cost=scale_in_cost)

    def dense(self) -> IntArray:
        """``workers_on`` int64[J, L] (for tests and small cases)."""
        out = np.zeros((self.n_jobs, self.n_servers), np.int64)
        for j in range(self.n_jobs):
            for e in range(self.job_ptr[j], self.job_ptr[j + 1]):
                out[j, self.job_server[e]] = self.job_server_workers[e]
        return out


@dataclass(frozen=True)
class ReclaimOutcome:
    """Servers to return and what returning them does to the jobs."""

    servers: IntArray        # int64[n]: in pick order (greedy), or as given / ascending
    preempted: BoolArray     # bool[J]
    new_workers: IntArray    # int64[J]: workers each job keeps (0 if preempted)
    total_cost: float        # reclaim_cost_of the server set
    preemptions: int


def _int_array(field: str, values: npt.ArrayLike, length: int | None = None) -> IntArray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (length is not None and arr.shape[0] != length):
        raise SolverInputError(field, f"must be 1-D with {length} entries, got shape {arr.shape}")
    return arr.astype(np.int64)


def _float_array(field: str, values: npt.ArrayLike, length: int) -> FloatArray:
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (length,):
        raise SolverInputError(field, f"must be 1-D with {length} entries, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise SolverInputError(field, "NaN or infinite")
    return arr


def _check_count(instance: ReclaimInstance, n_reclaim: int) -> int:
    if int(n_reclaim) != n_reclaim or not 0 <= n_reclaim <= instance.n_servers:
        raise SolverInputError("n_reclaim", f"must be in 0..{instance.n_servers} (loaned servers), got {n_reclaim!r}")
    return int(n_reclaim)


def _outcome(servers: IntArray, preempted: BoolArray, new_workers: IntArray, total_cost: float
             ) -> ReclaimOutcome:
    for arr in (servers, preempted, new_workers):
        arr.setflags(write=False)
    return ReclaimOutcome(servers, preempted, new_workers, float(total_cost), int(preempted.sum()))


# ---------------------------------------------------------------------------------------------
# The numba kernel


@njit(cache=True)
def _server_marginal(s: int, server_ptr: IntArray, server_job: IntArray, server_workers: IntArray,
                     job_workers: IntArray, job_min: IntArray, job_cost: FloatArray, scale_in_cost: FloatArray,
                     removed: IntArray, preempted: BoolArray) -> float:
    """cost(S + {s}) - cost(S), summed over s's jobs in ascending job order."""
    total = 0.0
    for e in range(server_ptr[s], server_ptr[s + 1]):
        j = server_job[e]
        if preempted[j]:
            continue
        w = server_workers[e]
        if job_workers[j] - removed[j] - w < job_min[j]:
            total += job_cost[j] - scale_in_cost[j] * removed[j]
        else:
            total += scale_in_cost[j] * w
    return total


@njit(cache=True)
def _reclaim_greedy_kernel(server_ptr: IntArray, server_job: IntArray, server_workers: IntArray, job_ptr: IntArray,
                           job_server: IntArray, job_workers: IntArray, job_min: IntArray, job_cost: FloatArray,
                           scale_in_cost: FloatArray, n_reclaim: int
                           ) -> tuple[IntArray, BoolArray, IntArray, float]:
    n_servers = server_ptr.shape[0] - 1
    n_jobs = job_workers.shape[0]
    removed = np.zeros(n_jobs, np.int64)
    preempted = np.zeros(n_jobs, np.bool_)
    picked = np.zeros(n_servers, np.bool_)
    seen = np.full(n_servers, -1, np.int64)  # the pick that last recomputed this server's marginal
    marginal = np.empty(n_servers, np.float64)
    for s in range(n_servers):
        marginal[s] = _server_marginal(s, server_ptr, server_job, server_workers, job_workers, job_min,
                                       job_cost, scale_in_cost, removed, preempted)
    picks = np.empty(n_reclaim, np.int64)
    for step in range(n_reclaim):
        best = -1
        for s in range(n_servers):
            if not picked[s] and (best < 0 or marginal[s] < marginal[best]):
                best = s
        picks[step] = best
        picked[best] = True
        for e in range(server_ptr[best], server_ptr[best + 1]):
            j = server_job[e]
            if preempted[j]:
                continue
            removed[j] += server_workers[e]
            if job_workers[j] - removed[j] < job_min[j]:
                preempted[j] = True
        for e in range(server_ptr[best], server_ptr[best + 1]):
            j = server_job[e]
            for f in range(job_ptr[j], job_ptr[j + 1]):
                s = job_server[f]
                if not picked[s] and seen[s] != step:
                    seen[s] = step
                    marginal[s] = _server_marginal(s, server_ptr, server_job, server_workers, job_workers,
                                                   job_min, job_cost, scale_in_cost, removed, preempted)
    new_workers = np.empty(n_jobs, np.int64)
    total = 0.0
    for j in range(n_jobs):
        if preempted[j]:
            new_workers[j] = 0
            total += job_cost[j]
        else:
            new_workers[j] = job_workers[j] - removed[j]
            if removed[j] > 0:
                total += scale_in_cost[j] * removed[j]
    return picks, preempted, new_workers, total


def reclaim_greedy(instance: ReclaimInstance, n_reclaim: int) -> ReclaimOutcome:
    """Greedy reclaim (numba kernel): ``n_reclaim`` servers in pick order and their effect."""
    n = _check_count(instance, n_reclaim)
    picks, preempted, new_workers, total = _reclaim_greedy_kernel(
        instance.server_ptr, instance.server_job, instance.server_workers, instance.job_ptr,
        instance.job_server, instance.job_workers, instance.job_min, instance.job_cost,
        instance.scale_in_cost, n,
    )
    return _outcome(picks, preempted, new_workers, total)


@njit(cache=True)
def _reclaim_exact_kernel(server_ptr: IntArray, server_job: IntArray, server_workers: IntArray, job_workers: IntArray,
                          job_min: IntArray, job_cost: FloatArray, scale_in_cost: FloatArray, n_reclaim: int
                          ) -> IntArray:
    """The cheapest set of ``n_reclaim`` servers, every subset tried in lexicographic order (the first of equal
    cost kept); each subset's cost summed over the jobs in ascending order, as ``reclaim_cost_of`` sums it."""
    n_servers = server_ptr.shape[0] - 1
    n_jobs = job_workers.shape[0]
    subset = np.arange(n_reclaim)
    best = subset.copy()
    best_cost = np.inf
    removed = np.zeros(n_jobs, np.int64)
    while True:
        removed[:] = 0
        for s in subset:
            for e in range(server_ptr[s], server_ptr[s + 1]):
                removed[server_job[e]] += server_workers[e]
        total = 0.0
        for j in range(n_jobs):
            if removed[j] > 0:
                if job_workers[j] - removed[j] < job_min[j]:
                    total += job_cost[j]
                else:
                    total += scale_in_cost[j] * removed[j]
        if total < best_cost:
            best_cost = total
            best[:] = subset
        # The next combination: the rightmost index that can move, moved, and the ones after it packed behind.
        i = n_reclaim - 1
        while i >= 0 and subset[i] == n_servers - n_reclaim + i:
            i -= 1
        if i < 0:
            return best
        subset[i] += 1
        for k in range(i + 1, n_reclaim):
            subset[k] = subset[k - 1] + 1


# Subsets the exact reclaim tries at most (``reclaim_solve``): C(20, 6) = 38,760 -- about a millisecond per
# thousand subsets of a few dozen jobs; beyond it, the greedy (its gap: ``benchmarks/bench_solvers``,
# ``reclaim_gap``).
EXACT_SUBSETS = 40_000


def reclaim_exact(instance: ReclaimInstance, n_reclaim: int) -> ReclaimOutcome:
    """The cheapest set of ``n_reclaim`` servers over all C(L, n) subsets (numba kernel; ``reclaim_exhaustive`` is
    its plain-Python reference): ascending server indices, ties to the lexicographically smallest."""
    n = _check_count(instance, n_reclaim)
    if n == 0:
        return reclaim_cost_of(instance, ())
    best = _reclaim_exact_kernel(instance.server_ptr, instance.server_job, instance.server_workers,
                                 instance.job_workers, instance.job_min, instance.job_cost, instance.scale_in_cost, n)
    return reclaim_cost_of(instance, best.tolist())


def reclaim_solve(instance: ReclaimInstance, n_reclaim: int, exact_subsets: int = EXACT_SUBSETS) -> ReclaimOutcome:
    """The Aryl reclaim: exact (``reclaim_exact``) when choosing ``n_reclaim`` of the loaned servers leaves at most
    ``exact_subsets`` subsets to try, else the greedy (``reclaim_greedy``)."""
    n = _check_count(instance, n_reclaim)
    if math.comb(instance.n_servers, n) <= exact_subsets:
        return reclaim_exact(instance, n)
    return reclaim_greedy(instance, n)


# ---------------------------------------------------------------------------------------------
# Plain-Python reference, exact cost of a set, exhaustive optimum, naive baseline


def reclaim_cost_of(instance: ReclaimInstance, servers: Iterable[int]) -> ReclaimOutcome:
    """The exact effect and cost of returning ``servers`` (a set: order and duplicates do not matter;
    ``servers`` in the outcome is as given)."""
    given = [int(s) for s in servers]
    chosen = set(given)
    if any(not 0 <= s < instance.n_servers for s in chosen):
        raise SolverInputError("servers", f"a server index is outside 0..{instance.n_servers - 1}")
    n_jobs = instance.n_jobs
    preempted = np.zeros(n_jobs, np.bool_)
    new_workers = np.zeros(n_jobs, np.int64)
    total = 0.0
    for j in range(n_jobs):
        removed = 0
        for e in range(instance.job_ptr[j], instance.job_ptr[j + 1]):
            if int(instance.job_server[e]) in chosen:
                removed += int(instance.job_server_workers[e])
        kept = int(instance.job_workers[j]) - removed
        if removed > 0 and kept < int(instance.job_min[j]):
            preempted[j] = True
            total += float(instance.job_cost[j])
        else:
            new_workers[j] = kept
            if removed > 0:
                total += float(instance.scale_in_cost[j]) * removed
    return _outcome(np.array(given, dtype=np.int64), preempted, new_workers, total)


def reclaim_greedy_reference(instance: ReclaimInstance, n_reclaim: int) -> ReclaimOutcome:
    """The greedy in plain Python, recomputing every job's state and every server's marginal from
    scratch after each pick (no incremental bookkeeping): ``O(n_reclaim * (J + nnz))``."""
    n = _check_count(instance, n_reclaim)
    on_server = [
        list(zip(instance.server_job[a:b].tolist(), instance.server_workers[a:b].tolist(), strict=True))
        for a, b in itertools.pairwise(instance.server_ptr.tolist())
    ]
    job_workers = instance.job_workers.tolist()
    job_min = instance.job_min.tolist()
    job_cost = instance.job_cost.tolist()
    scale_in = instance.scale_in_cost.tolist()
    picks: list[int] = []
    for _ in range(n):
        removed = [0] * instance.n_jobs
        for s in picks:
            for j, w in on_server[s]:
                removed[j] += w
        preempted = [r > 0 and job_workers[j] - r < job_min[j] for j, r in enumerate(removed)]
        best, best_cost = -1, 0.0
        for s in range(instance.n_servers):
            if s in picks:
                continue
            cost = 0.0
            for j, w in on_server[s]:  # ascending job order, as the kernel sums
                if preempted[j]:
                    continue
                if job_workers[j] - removed[j] - w < job_min[j]:
                    cost += job_cost[j] - scale_in[j] * removed[j]
                else:
                    cost += scale_in[j] * w
            if best < 0 or cost < best_cost:
                best, best_cost = s, cost
        picks.append(best)
    return reclaim_cost_of(instance, picks)


def reclaim_exhaustive(instance: ReclaimInstance, n_reclaim: int) -> ReclaimOutcome:
    """The cheapest set of ``n_reclaim`` servers over all C(L, n) subsets (tiny instances only); ties:
    the lexicographically smallest ascending server list."""
    n = _check_count(instance, n_reclaim)
    best: ReclaimOutcome | None = None
    for subset in itertools.combinations(range(instance.n_servers), n):
        outcome = reclaim_cost_of(instance, subset)
        if best is None or outcome.total_cost < best.total_cost:
            best = outcome
    assert best is not None  # combinations() yields at least the empty subset
    return best


def reclaim_most_recent_first(instance: ReclaimInstance, n_reclaim: int, loaned_at: Sequence[float] | FloatArray
                              ) -> ReclaimOutcome:
    """Naive baseline: return the most recently loaned servers (latest ``loaned_at`` first; ties: the
    lower server index), whatever runs on them."""
    n = _check_count(instance, n_reclaim)
    when = _float_array("loaned_at", loaned_at, instance.n_servers)
    order = sorted(range(instance.n_servers), key=lambda s: (-when[s], s))
    return reclaim_cost_of(instance, order[:n])
