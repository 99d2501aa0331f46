"""Numba kernels of the ``pollux`` policy: the goodput of every (nodes, replicas) a job could get, at its
best batch size (``goodput_grid``), the GPU counts that minimise the sum of per-job costs within the
cluster's GPUs (``min_cost_counts``, an exact multiple-choice knapsack by dynamic programming), and the
fit of a job's step-time parameters as Pollux fits them (``fit_perf_params_lbfgs``: scipy's L-BFGS-B on
``core.goodput``'s objective with its exact gradient, jitted).

The goodput equations are ``scheduler_service.core.goodput``'s (``best_batch_size`` and ``goodput``),
restated over arrays so that one call covers a job's whole table; ``tests/policies/test_pollux_policy.py`` checks
them against the pure-Python functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numba import njit

from scheduler_service.core.goodput import PerfParams, StepSample, fixed_terms
from scheduler_service.solvers.knapsack import MAX_OPTIONS, solve_knapsack

_EPS = 1e-8
CANDIDATES = 50  # batch sizes tried per configuration (geometric, as core.goodput.best_batch_size)


@njit(cache=True)
def _goodput(perf: np.ndarray, sqr: float, var: float, init_bsz: float, nodes: int, replicas: int,
             atomic: int, accum: int) -> float:
    t_pass = perf[0] + perf[1] * atomic
    extra = max(replicas - 2.0, _EPS)
    if nodes > 1:
        t_net = perf[2] + perf[3] * extra
    elif replicas > 1:
        t_net = perf[4] + perf[5] * extra
    else:
        t_net = _EPS + _EPS * extra
    g = perf[6]
    t_step = accum * t_pass + math.exp(math.log(t_pass ** g + t_net ** g) / g)
    batch = replicas * atomic * (accum + 1.0)
    scale = batch / init_bsz
    denom = var / scale + sqr
    gain = (var + sqr) / denom if denom > 0 else 1.0
    return float(batch / t_step * gain / scale)


@njit(cache=True)
def best_config(perf: np.ndarray, sqr: float, var: float, init_bsz: float, max_bsz: float, min_atomic: int,
                max_atomic: int, nodes: int, replicas: int) -> tuple[float, int, int]:
    """(goodput, atomic batch, accumulation steps) of the best of ``CANDIDATES`` total batch sizes spaced
    geometrically from ``max(init_bsz, min_atomic * replicas)`` to ``max_bsz``; goodput 0: none valid."""
    low = max(init_bsz, min_atomic * replicas * 1.0)
    log_low, log_high = math.log10(low), math.log10(max_bsz)
    step = (log_high - log_low) / (CANDIDATES - 1)
    best, best_atomic, best_accum = -1.0, 0, 0
    for i in range(CANDIDATES):
        if i == 0:
            batch = low
        elif i == CANDIDATES - 1:
            batch = max_bsz
        else:
            batch = 10.0 ** (i * step + log_low)
        local = batch / replicas
        accum = math.ceil(local / max_atomic - _EPS) - 1
        if replicas == 1 and local > init_bsz + _EPS:
            accum = max(accum, 1)
        atomic = math.ceil(local / (accum + 1) - _EPS)
        value = 0.0
        if min_atomic <= atomic <= max_atomic:
            value = _goodput(perf, sqr, var, init_bsz, nodes, replicas, atomic, accum)
        if value > best:
            best, best_atomic, best_accum = value, atomic, accum
    return best, best_atomic, best_accum


@njit(cache=True)
def goodput_grid(perf: np.ndarray, sqr: float, var: float, init_bsz: float, max_bsz: float, min_atomic: int,
                 max_atomic: int, max_nodes: int, max_replicas: int) -> np.ndarray:
    """``out[n, r]``: the best goodput on ``n`` nodes and ``r`` replicas (0 where ``n > r``, ``n`` or
    ``r`` is 0, or ``n`` exceeds ``max_nodes``)."""
    out = np.zeros((max_nodes + 1, max_replicas + 1))
    for r in range(1, max_replicas + 1):
        for n in range(1, min(r, max_nodes) + 1):
            out[n, r] = best_config(perf, sqr, var, init_bsz, max_bsz, min_atomic, max_atomic, n, r)[0]
    return out


@njit(cache=True)
def min_cost_counts(cost: np.ndarray, capacity: int) -> np.ndarray:
    """``cost[j, r]``: job ``j``'s cost on ``r`` GPUs (``inf``: not allowed). The counts, one per job,
    whose costs sum to the least with at most ``capacity`` GPUs in all (ties: fewer GPUs, earlier jobs
    first served). Every job must allow 0."""
    jobs, width = cost.shape
    best = np.full(capacity + 1, np.inf)
    best[0] = 0.0
    choice = np.zeros((jobs, capacity + 1), dtype=np.int64)
    for j in range(jobs):
        nxt = np.full(capacity + 1, np.inf)
        for used in range(capacity + 1):
            if best[used] == np.inf:
                continue
            for r in range(min(width, capacity - used + 1)):
                c = cost[j, r]
                if c == np.inf:
                    continue
                total = best[used] + c
                if total < nxt[used + r] - 1e-12:
                    nxt[used + r] = total
                    choice[j, used + r] = r
        best = nxt
    end = 0
    for used in range(capacity + 1):
        if best[used] < best[end] - 1e-12:
            end = used
    counts = np.zeros(jobs, dtype=np.int64)
    for j in range(jobs - 1, -1, -1):
        r = choice[j, end]
        counts[j] = r
        end -= r
    return counts


def min_cost_counts_mckp(cost: np.ndarray, capacity: int) -> np.ndarray:
    """``min_cost_counts``'s problem on the exact multiple-choice knapsack the ``aryl`` policy uses
    (``solvers.knapsack``: Pareto pruning and a Lagrangian reduction before its DP). Job ``j`` at ``r`` GPUs
    is worth its cost at 0 GPUs less its cost there; the most total worth is the least total cost. The same
    optimum as ``min_cost_counts`` (``tests/policies/test_pollux_policy.py`` checks both against brute force), which
    is a plain DP over every job, GPU count and option: seconds a decision at thousands of jobs and GPUs.
    Ties (equal total cost): the fewest GPUs, then the earlier jobs (the knapsack's tie rule)."""
    if cost.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    finite = np.isfinite(cost[:, 1:])
    counts = finite.sum(axis=1).astype(np.int64)
    slots = max(1, int(counts.max()))
    if slots > MAX_OPTIONS:  # the knapsack's choice table holds at most this many options a job
        return min_cost_counts(cost, capacity)
    # Each job's allowed counts first, in increasing order (a stable sort puts the finite ones ahead).
    order = np.argsort(~finite, axis=1, kind="stable")[:, :slots]
    weights = (order + 1).astype(np.int64)
    values = cost[:, :1] - np.take_along_axis(cost[:, 1:], order, axis=1)
    values[~np.take_along_axis(finite, order, axis=1)] = 0.0  # slots past a job's count: never read
    choice = solve_knapsack(weights, values, counts, capacity).choice
    picked = np.take_along_axis(weights, np.maximum(choice - 1, 0)[:, None], axis=1)[:, 0]
    return np.where(choice > 0, picked, 0).astype(np.int64)


@njit(cache=True)
def _fit_objective(x: np.ndarray, nodes: np.ndarray, replicas: np.ndarray, bsz: np.ndarray, log_pass: np.ndarray,
                   log_step: np.ndarray) -> tuple[float, np.ndarray]:
    """``core.goodput._objective`` at ``x`` (the 7 parameters) and its gradient (derived by hand; Pollux
    takes it from autograd)."""
    ac, bc, an, bn, ar, br, g = x[0], x[1], x[2], x[3], x[4], x[5], x[6]
    n = len(nodes)
    sq1 = 0.0
    sq2 = 0.0
    r1 = np.empty(n)
    r2 = np.empty(n)
    t_pass = np.empty(n)
    la = np.empty(n)
    lc = np.empty(n)
    log_sum = np.empty(n)
    for i in range(n):
        t_pass[i] = ac + bc * bsz[i]
        extra = max(replicas[i] - 2.0, _EPS)
        if nodes[i] > 1:
            t_net = an + bn * extra
        elif replicas[i] > 1:
            t_net = ar + br * extra
        else:
            t_net = _EPS + _EPS * extra
        la[i] = math.log(t_pass[i])
        lc[i] = math.log(t_net)
        hi = max(g * la[i], g * lc[i])
        log_sum[i] = hi + math.log(math.exp(g * la[i] - hi) + math.exp(g * lc[i] - hi))
        r1[i] = la[i] - log_pass[i]
        r2[i] = log_sum[i] / g - log_step[i]
        sq1 += r1[i] * r1[i]
        sq2 += r2[i] * r2[i]
    err1 = math.sqrt(sq1 / n)
    err2 = math.sqrt(sq2 / n)
    value = err1 + err2 + 1e-3 * (g - 1.0) ** 2 + 1e-2 * ((bn / an) ** 2 + (br / ar) ** 2)
    grad = np.zeros(7)
    for i in range(n):
        d1 = r1[i] / (n * err1) / t_pass[i] if err1 > 0 else 0.0   # d err1 / d t_pass
        d2 = r2[i] / (n * err2) if err2 > 0 else 0.0                # d err2 / d log step
        d_pass = d1 + d2 * math.exp((g - 1.0) * la[i] - log_sum[i])
        d_net = d2 * math.exp((g - 1.0) * lc[i] - log_sum[i])
        grad[0] += d_pass
        grad[1] += d_pass * bsz[i]
        extra = max(replicas[i] - 2.0, _EPS)
        if nodes[i] > 1:
            grad[2] += d_net
            grad[3] += d_net * extra
        elif replicas[i] > 1:
            grad[4] += d_net
            grad[5] += d_net * extra
        w = math.exp(g * la[i] - log_sum[i])
        grad[6] += d2 * (-log_sum[i] / (g * g) + (w * la[i] + (1.0 - w) * lc[i]) / g)
    grad[6] += 2e-3 * (g - 1.0)
    grad[2] -= 2e-2 * bn * bn / an ** 3
    grad[3] += 2e-2 * bn / (an * an)
    grad[4] -= 2e-2 * br * br / ar ** 3
    grad[5] += 2e-2 * br / (ar * ar)
    return value, grad


_FLOOR = 1e-8


def fit_perf_params_lbfgs(samples: Sequence[StepSample]) -> PerfParams:
    """``core.goodput.fit_perf_params``'s objective and rules, minimised as Pollux does: L-BFGS-B from
    Pollux's starting point within its bounds (time parameters >= 1e-8, gamma in [1, 10]), with the exact
    gradient. Needs scipy (the simulator's extra); the pure-Python ``fit_perf_params`` is what a scheduler
    without scipy keeps."""
    from scipy.optimize import Bounds, minimize  # type: ignore[import-untyped]

    if not samples:
        raise ValueError("no samples to fit")
    arrays = (np.array([s.nodes for s in samples], dtype=np.float64),
              np.array([s.replicas for s in samples], dtype=np.float64),
              np.array([s.atomic_bsz for s in samples], dtype=np.float64),
              np.log(np.array([s.pass_s for s in samples], dtype=np.float64)),
              np.log(np.array([s.step_s for s in samples], dtype=np.float64)))
    start = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [_FLOOR] * 6 + [1.0]
    upper = [math.inf] * 6 + [10.0]
    for i, v in fixed_terms(samples).items():
        start[i] = lower[i] = upper[i] = v
    result = minimize(_fit_objective, np.array(start), args=arrays, jac=True, method="L-BFGS-B",
                      bounds=Bounds(lower, upper, keep_feasible=True))
    x = [float(v) for v in result.x]
    if not any(s.nodes > 1 for s in samples):  # a network is no faster than the bus inside a node
        x[2] = max(x[2], x[4] * 1.1)
        x[3] = max(x[3], x[5] * 1.1)
    return PerfParams(*x)
