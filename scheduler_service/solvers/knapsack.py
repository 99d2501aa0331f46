"""Multiple-choice knapsack for elastic extras (Phase 2 of the Aryl policy): which elastic job gets how
many extra workers out of the spare GPUs.

The problem, as arrays (G groups, one per elastic job; K option slots per group):

- ``weights`` int64[G, K]: ``weights[g, k-1]`` is the GPUs of option *k* of group *g* ("add *k* workers",
  ``k * gpus_per_worker``); ``>= 0``.
- ``values`` float64[G, K]: ``values[g, k-1]`` is what option *k* is worth (JCT reduction minus restart
  cost, plus a deadline it saves: ``policies.aryl``). Any finite number; an option worth ``<= 0`` is
  never taken.
- ``counts`` int64[G]: group *g* has options ``1..counts[g]``; slots ``counts[g]..K-1`` are ignored (their
  contents do not matter). ``0 <= counts[g] <= K <= 126``.
- ``capacity``: spare GPUs, ``>= 0``.

Option 0 ("add nothing": weight 0, value 0) exists in every group and is always allowed. The answer,
``choice`` int64[G] with ``0 <= choice[g] <= counts[g]``, maximises the total value subject to total
weight ``<= capacity``.

Tie rule (all three implementations follow it; ties are exact float equality):
1. the highest total value;
2. then the fewest total GPUs;
3. then the lexicographically *largest* vector of chosen weights, group 0 first: an equal trade goes
   to the lower group index (the policy orders groups so that index expresses preference);
4. then, within a group, the lower option index among options of equal weight.

Exactness: the answer is the optimum of the sums as the kernel forms them. Values that are exact in
binary (integers, multiples of 1/4, ...) add exactly and all three implementations agree bit for bit;
with arbitrary floats two solutions whose values differ only by rounding (~1e-16 relative) may be
ordered differently by different implementations. ``total_value`` is always recomputed from ``choice``
as a left-to-right sum in group order, so the same choice reports the same value everywhere.

How the kernel stays exact and fast (each step keeps every optimal solution, so the tie rule survives):
1. *Pareto pruning*: per group, an option with more weight and no more value than another (option 0
   included) can be swapped for it without loss, so it is dropped. What remains has weights and values
   strictly increasing; options worth ``<= 0`` are gone.
2. *Everything fits*: if the heaviest remaining options of all groups fit, take them.
3. *Lagrangian reduction* (Dyer/Pisinger style): for any multiplier ``lam >= 0``,
   ``D(lam) = lam*capacity + sum_g max_k (v_gk - lam*w_gk)`` bounds every feasible solution, and a
   solution that uses option *k* in group *g* is worth at most ``D - r_gk``, where the reduced cost is
   ``r_gk = max_k' (v_gk' - lam*w_gk') - (v_gk - lam*w_gk) >= 0``. So with a feasible solution of value
   ``L`` in hand, an option with ``r_gk > D - L`` is in no optimal solution and is dropped (plus a
   relative margin of 1e-9, so float rounding can never drop an optimal option). ``lam`` is found by
   bisection on the subgradient (total weight of the maximisers vs capacity). ``L`` comes in two rounds:
   a) the LP solution rounded down to a feasible one, then greedily topped up; its ``D - L`` is about
      ``lam`` times the GPUs left over, which still leaves thousands of options;
   b) if so, the problem restricted to the ~512 options of smallest reduced cost (plus every group's
      ``r = 0`` option, which together fit) is solved exactly by steps 4-5. A restriction, so its
      optimum is feasible; if its own ``D - L`` is below the restriction's threshold, every option that
      can be optimal was in it and it *is* the answer; otherwise one more exact solve over every option
      with ``r_gk <= D - L`` follows.
   Groups left with one option are fixed; the rest form the *core*.
4. *Shift and scale*: each core group's lightest remaining option is taken as its baseline (its weight
   comes off the capacity); weights are divided by the gcd of the remaining increments; the DP
   capacity is ``min(capacity left, sum of the increments)``.
5. *DP* over the core only, exact-weight, suffix order, with a compact int8 choice table for
   reconstruction (hence ``K <= 126``): ``core groups x (DP capacity + 1)`` bytes, 50 MB at worst for
   5,000 groups and 10,000 GPUs.

For concave JCT-reduction values almost every group is fixed by step 3 and the DP is small (5,000
groups x 8 options, 10,000 GPUs: a DP of ~500 groups x ~400 units). For adversarial inputs (every
option of every group at the same value per GPU, e.g. ``values == weights``) nothing can be ruled out
and the DP is the full ``G * capacity * K``: exact, but about 30x slower.

Never: import grpc, SQLAlchemy or the wall clock; know about jobs or servers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from numba import njit

from scheduler_service.solvers import FloatArray, IntArray, SolverInputError

MAX_OPTIONS = 126  # options per group: the choice table is int8 and option 0 takes one slot
# Relative margin for the Lagrangian reduction: an option is dropped only if its bound is below the
# best known solution by more than this share of the instance's magnitude; rounding in sums of a few
# thousand terms is ~1e-13 relative, so no optimal option is ever dropped by rounding.
_REDUCTION_MARGIN = 1e-9
_BISECTION_STEPS = 60
# Options of smallest reduced cost in the first, heuristic round of the reduction (step 3).
_FIRST_CORE = 512


@dataclass(frozen=True)
class KnapsackSolution:
    """The chosen option per group and its totals.

    ``dp_groups`` and ``dp_capacity`` say how big the dynamic program actually was (groups left after
    the reductions, capacity in gcd units); they explain the running time and are not part of the answer.
    """

    choice: IntArray        # int64[G], 0..counts[g]; 0 = add nothing
    total_value: float      # sum of the chosen values, left to right in group order
    total_weight: int       # sum of the chosen weights
    dp_groups: int = 0
    dp_capacity: int = 0


# ---------------------------------------------------------------------------------------------
# Input checks (shared by all three implementations)


def _as_arrays(weights: npt.ArrayLike, values: npt.ArrayLike, counts: npt.ArrayLike, capacity: int
               ) -> tuple[IntArray, FloatArray, IntArray, int]:
    w = np.asarray(weights)
    v = np.asarray(values)
    if w.ndim != 2:
        raise SolverInputError("weights", f"must be a 2-D array [groups, options], got shape {w.shape}")
    if v.shape != w.shape:
        raise SolverInputError("values", f"shape {v.shape} differs from weights' {w.shape}")
    if not np.issubdtype(w.dtype, np.integer) and w.size and not np.array_equal(w, np.round(w)):
        raise SolverInputError("weights", "must be whole GPUs")
    groups, slots = w.shape
    if slots > MAX_OPTIONS:
        raise SolverInputError("weights", f"{slots} option slots per group; at most {MAX_OPTIONS}")
    c = np.asarray(counts)
    if c.shape != (groups,):
        raise SolverInputError("counts", f"must have one entry per group ({groups}), got shape {c.shape}")
    c = c.astype(np.int64)
    if groups and (c.min() < 0 or c.max() > slots):
        raise SolverInputError("counts", f"each count must be in 0..{slots}")
    if int(capacity) != capacity or capacity < 0:
        raise SolverInputError("capacity", f"must be a whole number of GPUs >= 0, got {capacity!r}")
    w = np.ascontiguousarray(w, dtype=np.int64)
    v = np.ascontiguousarray(v, dtype=np.float64)
    used = np.arange(slots)[None, :] < c[:, None]
    if np.any(w[used] < 0):
        raise SolverInputError("weights", "an option's weight is negative")
    if not np.all(np.isfinite(v[used])):
        raise SolverInputError("values", "an option's value is NaN or infinite")
    return w, v, np.ascontiguousarray(c), int(capacity)


def _solution(w: IntArray, v: FloatArray, choice: IntArray, dp_groups: int, dp_capacity: int
              ) -> KnapsackSolution:
    total_value, total_weight = _totals(w, v, choice)
    choice.setflags(write=False)
    return KnapsackSolution(choice, float(total_value), int(total_weight), dp_groups, dp_capacity)


# ---------------------------------------------------------------------------------------------
# The numba kernel


@njit(cache=True)
def _totals(weights: IntArray, values: FloatArray, choice: IntArray) -> tuple[float, int]:
    """Total value (left to right in group order) and total weight of ``choice``."""
    total_value = 0.0
    total_weight = 0
    for g in range(choice.shape[0]):
        k = choice[g]
        if k > 0:
            total_value += values[g, k - 1]
            total_weight += weights[g, k - 1]
    return total_value, total_weight


@njit(cache=True)
def _pareto_options(weights: IntArray, values: FloatArray, counts: IntArray, opt: IntArray, ow: IntArray,
                    ov: FloatArray, nk: IntArray) -> None:
    """Per group, the options no other option of the group dominates, by ascending weight (and so by
    strictly ascending value). Writes option index / weight / value into ``opt``/``ow``/``ov`` rows and
    the number kept into ``nk``. The first kept option always has weight 0."""
    groups = weights.shape[0]
    for g in range(groups):
        n = counts[g] + 1
        idx = np.empty(n, np.int64)
        cw = np.empty(n, np.int64)
        cv = np.empty(n, np.float64)
        idx[0] = 0
        cw[0] = 0
        cv[0] = 0.0
        for k in range(1, n):
            idx[k] = k
            cw[k] = weights[g, k - 1]
            cv[k] = values[g, k - 1]
        # Insertion sort by (weight asc, value desc, index asc); n <= 127.
        for a in range(1, n):
            ki, kw, kv = idx[a], cw[a], cv[a]
            b = a - 1
            while b >= 0 and (cw[b] > kw or (cw[b] == kw and (cv[b] < kv or (cv[b] == kv and idx[b] > ki)))):
                idx[b + 1] = idx[b]
                cw[b + 1] = cw[b]
                cv[b + 1] = cv[b]
                b -= 1
            idx[b + 1] = ki
            cw[b + 1] = kw
            cv[b + 1] = kv
        kept = 0
        for a in range(n):
            # Keep only a strict value improvement over every lighter (or equal, earlier-sorted) option.
            if kept == 0 or cv[a] > ov[g, kept - 1]:
                opt[g, kept] = idx[a]
                ow[g, kept] = cw[a]
                ov[g, kept] = cv[a]
                kept += 1
        nk[g] = kept


@njit(cache=True)
def _argmax_at(ow: IntArray, ov: FloatArray, nk: IntArray, lam: float, out: IntArray) -> tuple[float, int]:
    """Per-group maximiser of ``v - lam*w`` into ``out`` (ties: the lightest). Returns the sum of the
    maxima and the total weight of the maximisers."""
    total = 0.0
    weight = 0
    for g in range(ow.shape[0]):
        best = ov[g, 0] - lam * ow[g, 0]
        best_j = 0
        for j in range(1, nk[g]):
            x = ov[g, j] - lam * ow[g, j]
            if x > best:
                best = x
                best_j = j
        out[g] = best_j
        total += best
        weight += ow[g, best_j]
    return total, weight


@njit(cache=True)
def _lagrangian(ow: IntArray, ov: FloatArray, nk: IntArray, capacity: int
                ) -> tuple[float, FloatArray, IntArray, float]:
    """Multiplier, dual bound, reduced costs and a feasible rounded solution (module docstring, step 3).

    Returns ``(dual, rc, x, margin)``: ``rc[g, j] >= 0`` is option j's reduced cost, ``x`` a feasible
    choice (kept-option positions) and ``margin`` the float-rounding allowance."""
    groups = ow.shape[0]
    hi = 0.0
    for g in range(groups):
        for j in range(1, nk[g]):
            if ow[g, j] > 0:
                r = ov[g, j] / ow[g, j]
                if r > hi:
                    hi = r
    # Twice the largest value per weight: every option of positive weight is then worth less than nothing at hi
    # (v - 2 (v / w) w = -v), with room to spare. At the ratio itself, ``v - (v / w) w`` may round to a hair
    # above 0, that option becomes the maximiser at hi, and the invariant below fails: the "feasible" rounded
    # solution does not fit, ``dual - lower`` goes negative, and the reduction keeps no option of some group.
    hi *= 2.0
    lo = 0.0
    x = np.empty(groups, np.int64)
    at_lo = np.empty(groups, np.int64)
    # Invariant: the maximisers at hi fit (at hi every group's maximiser is its weight-0 option), those
    # at lo do not (the caller has checked that not everything fits).
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _argmax_at(ow, ov, nk, mid, x)[1] <= capacity:
            hi = mid
        else:
            lo = mid
    lam = hi
    dual = lam * capacity + _argmax_at(ow, ov, nk, lam, x)[0]
    _argmax_at(ow, ov, nk, lo, at_lo)
    rc = np.zeros(ow.shape, np.float64)
    magnitude = abs(dual) + lam * capacity
    for g in range(groups):
        best = ov[g, x[g]] - lam * ow[g, x[g]]
        magnitude += abs(ov[g, nk[g] - 1])
        for j in range(nk[g]):
            rc[g, j] = max(0.0, best - (ov[g, j] - lam * ow[g, j]))
    # Round the maximisers at hi up greedily, groups in index order: first towards the LP's
    # fractional choices at lo, then to the heaviest upgrade that still fits.
    slack = capacity
    for g in range(groups):
        slack -= ow[g, x[g]]
    for g in range(groups):
        b = at_lo[g]
        if b > x[g] and ow[g, b] - ow[g, x[g]] <= slack:
            slack -= ow[g, b] - ow[g, x[g]]
            x[g] = b
    for g in range(groups):
        j = nk[g] - 1
        while j > x[g] and ow[g, j] - ow[g, x[g]] > slack:
            j -= 1
        if j > x[g]:
            slack -= ow[g, j] - ow[g, x[g]]
            x[g] = j
    return dual, rc, x, _REDUCTION_MARGIN * magnitude


@njit(cache=True)
def _threshold_for(rc: FloatArray, nk: IntArray, upper: float, wanted: int) -> float:
    """A reduced cost ``t <= upper`` such that about ``wanted`` options have ``0 < rc <= t`` (at least
    one). Bisection on the value, not a sort: a heuristic threshold needs no exact rank, and numba
    compiles a counting loop in a fraction of the time of its sort."""
    lo = 0.0
    hi = upper
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        n = 0
        for g in range(rc.shape[0]):
            for j in range(nk[g]):
                if 0.0 < rc[g, j] <= mid:
                    n += 1
        if n >= wanted:
            hi = mid
        else:
            lo = mid
    return hi


@njit(cache=True)
def _restrict(opt: IntArray, ow: IntArray, ov: FloatArray, nk: IntArray, rc: FloatArray, threshold: float
              ) -> tuple[IntArray, IntArray, FloatArray, IntArray]:
    """Copies of the option rows keeping only options with reduced cost ``<= threshold``."""
    groups, width = ow.shape
    r_opt = np.empty((groups, width), np.int64)
    r_ow = np.empty((groups, width), np.int64)
    r_ov = np.empty((groups, width), np.float64)
    r_nk = np.empty(groups, np.int64)
    for g in range(groups):
        kept = 0
        for j in range(nk[g]):
            if rc[g, j] <= threshold:
                r_opt[g, kept] = opt[g, j]
                r_ow[g, kept] = ow[g, j]
                r_ov[g, kept] = ov[g, j]
                kept += 1
        r_nk[g] = kept
    return r_opt, r_ow, r_ov, r_nk


@njit(cache=True)
def _lightest_fit(ow: IntArray, capacity: int) -> bool:
    """Whether every group's lightest option fits together. Always true after a correct reduction
    (the rounded feasible solution survives it); checked so that rounding can never cost exactness:
    on failure the caller solves the unreduced rows."""
    total = 0
    for g in range(ow.shape[0]):
        total += ow[g, 0]
    return total <= capacity


@njit(cache=True)
def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


@njit(cache=True)
def _solve_options(opt: IntArray, ow: IntArray, ov: FloatArray, nk: IntArray, capacity: int, choice: IntArray
                   ) -> tuple[int, int]:
    """The optimal choice over the given option rows (ascending weight, strictly ascending value) into
    ``choice`` (original option indices). Returns (DP groups, DP capacity in gcd units), 0 when no DP
    was needed. Requires the lightest options of all groups to fit."""
    groups = ow.shape[0]
    # Baselines: every group's lightest option; the core (groups with a choice left) decides how far
    # above it to go.
    room = capacity
    unit = 0
    n_core = 0
    for g in range(groups):
        room -= ow[g, 0]
        choice[g] = opt[g, 0]
        if nk[g] > 1:
            n_core += 1
            for j in range(1, nk[g]):
                unit = _gcd(unit, ow[g, j] - ow[g, 0])
    if n_core == 0:
        return 0, 0
    core = np.empty(n_core, np.int64)
    i = 0
    spread = 0
    for g in range(groups):
        if nk[g] > 1:
            core[i] = g
            i += 1
            spread += (ow[g, nk[g] - 1] - ow[g, 0]) // unit
    cap = room // unit
    if spread <= cap:
        # Everything left fits: the heaviest option is the best one.
        for i in range(n_core):
            g = core[i]
            choice[g] = opt[g, nk[g] - 1]
        return 0, 0

    # Exact-weight DP over the core in suffix order: best[c] = the best value of core groups i.. with
    # increments totalling exactly c units. Options are tried heaviest first and only a strictly
    # better value replaces the incumbent, so among equal values the heavier option wins (tie rule 3).
    table = np.empty((n_core, cap + 1), np.int8)
    prev = np.full(cap + 1, -np.inf)
    cur = np.full(cap + 1, -np.inf)
    prev[0] = 0.0
    reach = 0
    for i in range(n_core - 1, -1, -1):
        g = core[i]
        n = nk[g]
        top = (ow[g, n - 1] - ow[g, 0]) // unit
        new_reach = min(cap, reach + top)
        row = table[i]
        for c in range(new_reach + 1):
            cur[c] = -np.inf
            row[c] = -1
        for j in range(n - 1, -1, -1):
            u = (ow[g, j] - ow[g, 0]) // unit
            v = ov[g, j]
            jj = np.int8(j)
            last = min(new_reach, reach + u)
            if last < u:
                continue
            # Slices indexed from 0 and branch-free selects, so LLVM can vectorise the loop.
            src = prev[: last - u + 1]
            dst = cur[u : last + 1]
            mark = row[u : last + 1]
            for t in range(src.shape[0]):
                cand = src[t] + v
                old = dst[t]
                better = cand > old
                dst[t] = cand if better else old
                mark[t] = jj if better else mark[t]
        prev, cur = cur, prev
        reach = new_reach
    # The best value; among equal values the fewest GPUs (tie rule 2).
    best_c = 0
    for c in range(1, reach + 1):
        if prev[c] > prev[best_c]:
            best_c = c
    c = best_c
    for i in range(n_core):
        g = core[i]
        j = table[i, c]
        choice[g] = opt[g, j]
        c -= (ow[g, j] - ow[g, 0]) // unit
    return n_core, cap


@njit(cache=True)
def _knapsack_kernel(weights: IntArray, values: FloatArray, counts: IntArray, capacity: int, reduce: bool,
                     first_core: int) -> tuple[IntArray, int, int]:
    """Returns (choice int64[G], DP groups, DP capacity in gcd units) of the last DP solved."""
    groups, slots = weights.shape
    choice = np.zeros(groups, np.int64)
    width = slots + 1
    opt = np.empty((groups, width), np.int64)
    ow = np.empty((groups, width), np.int64)
    ov = np.empty((groups, width), np.float64)
    nk = np.empty(groups, np.int64)
    _pareto_options(weights, values, counts, opt, ow, ov, nk)

    heaviest = 0
    for g in range(groups):
        heaviest += ow[g, nk[g] - 1]
    if heaviest <= capacity:
        # Everything fits: every group takes its best option (the lightest of equal best values).
        for g in range(groups):
            choice[g] = opt[g, nk[g] - 1]
        return choice, 0, 0
    if not reduce:
        dp_groups, dp_cap = _solve_options(opt, ow, ov, nk, capacity, choice)
        return choice, dp_groups, dp_cap

    dual, rc, x, margin = _lagrangian(ow, ov, nk, capacity)
    lower = 0.0
    for g in range(groups):
        lower += ov[g, x[g]]
    threshold = max(dual - lower + margin, 0.0)  # >= 0: every group keeps its rc = 0 option
    # Round 1, only when the bound from the rounded solution leaves a big core: solve exactly over the
    # first_core options of smallest reduced cost (plus every group's rc = 0 option), which is a
    # restriction, so its optimum is feasible and usually all but optimal.
    candidates = 0
    for g in range(groups):
        for j in range(nk[g]):
            if 0.0 < rc[g, j] <= threshold:
                candidates += 1
    if candidates > first_core:
        trial = _threshold_for(rc, nk, threshold, first_core)
        r_opt, r_ow, r_ov, r_nk = _restrict(opt, ow, ov, nk, rc, trial)
        if not _lightest_fit(r_ow, capacity):
            dp_groups, dp_cap = _solve_options(opt, ow, ov, nk, capacity, choice)
            return choice, dp_groups, dp_cap
        dp_groups, dp_cap = _solve_options(r_opt, r_ow, r_ov, r_nk, capacity, choice)
        lower = _totals(weights, values, choice)[0]
        threshold = max(dual - lower + margin, 0.0)
        if threshold <= trial:
            # Every option that can be in an optimal solution was in the restricted problem.
            return choice, dp_groups, dp_cap
    # Round 2: every option that can be in an optimal solution (rc <= dual - lower), exactly.
    r_opt, r_ow, r_ov, r_nk = _restrict(opt, ow, ov, nk, rc, threshold)
    if not _lightest_fit(r_ow, capacity):
        r_opt, r_ow, r_ov, r_nk = opt, ow, ov, nk
    dp_groups, dp_cap = _solve_options(r_opt, r_ow, r_ov, r_nk, capacity, choice)
    return choice, dp_groups, dp_cap


def solve_knapsack(weights: npt.ArrayLike, values: npt.ArrayLike, counts: npt.ArrayLike, capacity: int, *,
                   reduce: bool = True) -> KnapsackSolution:
    """The optimal option per group (numba kernel). ``reduce=False`` skips the Lagrangian reduction
    (step 3), leaving a plain DP over the Pareto-pruned options: the same answer, for tests and for
    measuring what the reduction buys."""
    w, v, c, cap = _as_arrays(weights, values, counts, capacity)
    choice, dp_groups, dp_capacity = _knapsack_kernel(w, v, c, cap, reduce, _FIRST_CORE)
    return _solution(w, v, choice, int(dp_groups), int(dp_capacity))


# ---------------------------------------------------------------------------------------------
# Plain-Python reference and brute force


def solve_knapsack_reference(weights: npt.ArrayLike, values: npt.ArrayLike, counts: npt.ArrayLike, capacity: int
                             ) -> KnapsackSolution:
    """The textbook DP in plain Python, no pruning: ``best[g][c]`` is the best value of groups ``g..``
    using exactly ``c`` GPUs; ``O(G * capacity * K)``. Same tie rule as the kernel."""
    w, v, cnt, cap = _as_arrays(weights, values, counts, capacity)
    groups = w.shape[0]
    neg = float("-inf")
    options = [[(0, 0, 0.0)] + [(k, int(w[g, k - 1]), float(v[g, k - 1])) for k in range(1, int(cnt[g]) + 1)]
               for g in range(groups)]
    best_next = [neg] * (cap + 1)
    best_next[0] = 0.0
    tables: list[list[int]] = [[] for _ in range(groups)]
    for g in range(groups - 1, -1, -1):
        best_here = [neg] * (cap + 1)
        table = [-1] * (cap + 1)
        for c in range(cap + 1):
            top, top_k, top_w = neg, -1, -1
            for k, wk, vk in options[g]:
                if wk > c or best_next[c - wk] == neg:
                    continue
                cand = best_next[c - wk] + vk
                # Higher value; then the heavier option (tie rule 3); then the lower index (rule 4).
                if cand > top or (cand == top and (wk > top_w or (wk == top_w and k < top_k))):
                    top, top_k, top_w = cand, k, wk
            best_here[c] = top
            table[c] = top_k
        tables[g] = table
        best_next = best_here
    best_c = 0
    for c in range(1, cap + 1):
        if best_next[c] > best_next[best_c]:
            best_c = c
    choice = np.zeros(groups, np.int64)
    c = best_c
    for g in range(groups):
        k = tables[g][c]
        choice[g] = k
        c -= 0 if k == 0 else int(w[g, k - 1])
    return _solution(w, v, choice, groups, cap)


def solve_knapsack_brute_force(weights: npt.ArrayLike, values: npt.ArrayLike, counts: npt.ArrayLike, capacity: int
                               ) -> KnapsackSolution:
    """Every combination of options (tiny instances only), ranked by the tie rule directly."""
    w, v, cnt, cap = _as_arrays(weights, values, counts, capacity)
    groups = w.shape[0]
    best_key = None
    best_choice: tuple[int, ...] = (0,) * groups
    for combo in itertools.product(*(range(int(cnt[g]) + 1) for g in range(groups))):
        chosen_w = tuple(0 if k == 0 else int(w[g, k - 1]) for g, k in enumerate(combo))
        total_w = sum(chosen_w)
        if total_w > cap:
            continue
        total_v = 0.0
        for g, k in enumerate(combo):
            if k:
                total_v += float(v[g, k - 1])
        key = (total_v, -total_w, chosen_w, tuple(-k for k in combo))
        if best_key is None or key > best_key:
            best_key, best_choice = key, combo
    return _solution(w, v, np.array(best_choice, dtype=np.int64), 0, 0)
