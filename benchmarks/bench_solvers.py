"""The policy's numeric solvers at production sizes: the multiple-choice knapsack (elastic extras) and
the greedy reclaim, numba kernels against their plain-Python references, the greedy's gap to the exact reclaim
on small instances, plus numba's compile cost.

Instances are synthetic but shaped like the real thing:
- knapsack: one group per elastic job; option k = add k workers of ``gpus_per_worker`` in {1, 2, 4, 8};
  value = JCT reduction from an Amdahl speedup curve (parallel share 0.8-0.995, remaining single-worker
  work log-normal around 8 h, 1-8 current workers), minus a restart cost of 30-180 s. Concave in k.
- reclaim: every job runs 1-4 workers on each of 1-3 loaned servers plus 0-8 elsewhere; 40% are
  inelastic (min == current), the rest have min uniform in 1..current; preempting costs the GPU-seconds
  since the last checkpoint (0-30 min), shrinking 30-120 GPU-seconds per worker. Server GPU capacity is
  not modelled, so servers hold more jobs than 8 GPUs would allow: a denser, harder instance.

Timings are wall-clock around the typed wrapper (input checks included), after one untimed call that
compiles or loads the kernel. No database is used. Never: assert on timings, import from ``tests/``.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks import emit_figure
from benchmarks.harness import FULL as SERVICE_FULL
from benchmarks.harness import QUICK, BenchContext, Benchmark
from scheduler_service.solvers import (
    ReclaimInstance,
    reclaim_exact,
    reclaim_greedy,
    reclaim_greedy_reference,
    reclaim_most_recent_first,
    solve_knapsack,
    solve_knapsack_reference,
)

log = logging.getLogger("aryl.bench")

KNAPSACK_TARGET_MS = 100.0
RECLAIM_TARGET_MS = 10.0
SEED = 20240601


@dataclass(frozen=True)
class SolverSizes:
    groups: int              # elastic jobs in the knapsack
    options: int             # option slots per group (add 1..options workers)
    capacity: int            # spare GPUs
    reference_groups: int    # the plain-Python DP runs on this scaled-down instance...
    reference_capacity: int  # ...with this capacity (it is O(groups * capacity * options) in Python)
    servers: int             # loaned servers in the reclaim
    jobs: int
    reclaim: int             # servers to give back
    runs: int                # timed runs per figure (p50 reported)


FULL = SolverSizes(groups=5000, options=8, capacity=10_000, reference_groups=500, reference_capacity=1000,
                   servers=1000, jobs=5000, reclaim=200, runs=20)
SMALL = SolverSizes(groups=500, options=8, capacity=1000, reference_groups=100, reference_capacity=200,
                    servers=100, jobs=500, reclaim=20, runs=5)


def _sizes(ctx: BenchContext | None) -> SolverSizes:
    # ``--quick`` (the service benchmarks' QUICK sizes) means SMALL here too.
    return SMALL if ctx is not None and ctx.sizes == QUICK else FULL


# ---------------------------------------------------------------------------------------------
# Instances


def elastic_extras(rng: np.random.Generator, groups: int, options: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, values, counts) for ``groups`` elastic jobs; see the module docstring."""
    gpus_per_worker = rng.choice([1, 2, 4, 8], groups)
    workers = rng.integers(1, 9, groups)[:, None]
    parallel = rng.uniform(0.8, 0.995, groups)[:, None]
    remaining = rng.lognormal(np.log(8 * 3600.0), 1.0, groups)[:, None]
    restart = rng.uniform(30.0, 180.0, groups)[:, None]
    counts = rng.integers(1, options + 1, groups)  # max_workers caps some jobs below 8 extras
    k = np.arange(1, options + 1)[None, :]

    def jct(n):
        return remaining * ((1 - parallel) + parallel / n)

    values = jct(workers) - jct(workers + k) - restart
    weights = k * gpus_per_worker[:, None]
    return weights.astype(np.int64), values, counts.astype(np.int64)


def loaned_servers(rng: np.random.Generator, servers: int, jobs: int) -> tuple[ReclaimInstance, np.ndarray]:
    """A reclaim instance and each server's ``loaned_at``; see the module docstring."""
    triples = []
    job_workers = np.zeros(jobs, np.int64)
    for j in range(jobs):
        on_loaned = 0
        for s in rng.choice(servers, size=int(rng.integers(1, 4)), replace=False):
            w = int(rng.integers(1, 5))
            triples.append((j, int(s), w))
            on_loaned += w
        job_workers[j] = on_loaned + int(rng.integers(0, 9))
    inelastic = rng.random(jobs) < 0.4
    job_min = np.where(inelastic, job_workers, rng.integers(1, job_workers + 1))
    gpus_per_worker = rng.choice([1, 2, 4, 8], jobs)
    instance = ReclaimInstance.from_triples(
        triples, n_servers=servers, job_workers=job_workers, job_min=job_min,
        job_cost=job_workers * gpus_per_worker * rng.uniform(0.0, 1800.0, jobs),
        scale_in_cost=gpus_per_worker * rng.uniform(30.0, 120.0, jobs),
    )
    return instance, rng.uniform(0.0, 86_400.0, servers)


# ---------------------------------------------------------------------------------------------
# Timing


def _time_ms(call: Callable[[], object], runs: int) -> list[float]:
    call()  # compile, or load from the on-disk cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _p(times: list[float], q: float) -> float:
    return float(np.percentile(times, q))


def knapsack_bench(ctx: BenchContext | None = None) -> None:
    sizes = _sizes(ctx)
    rng = np.random.default_rng(SEED)
    weights, values, counts = elastic_extras(rng, sizes.groups, sizes.options)
    params = dict(groups=sizes.groups, options=sizes.options, capacity=sizes.capacity, runs=sizes.runs)
    solution = solve_knapsack(weights, values, counts, sizes.capacity)
    times = _time_ms(lambda: solve_knapsack(weights, values, counts, sizes.capacity), sizes.runs)

    # The plain-Python DP is O(groups * capacity * options): minutes at full size, so it runs once on
    # a scaled-down instance, and numba is timed on that same instance for a like-for-like ratio.
    small_w, small_v, small_c = elastic_extras(np.random.default_rng(SEED + 1), sizes.reference_groups, sizes.options)
    start = time.perf_counter()
    reference = solve_knapsack_reference(small_w, small_v, small_c, sizes.reference_capacity)
    reference_ms = (time.perf_counter() - start) * 1e3
    small_solution = solve_knapsack(small_w, small_v, small_c, sizes.reference_capacity)
    small_times = _time_ms(lambda: solve_knapsack(small_w, small_v, small_c, sizes.reference_capacity), sizes.runs)
    same_value = abs(small_solution.total_value - reference.total_value) <= 1e-9 * abs(reference.total_value)
    log.info("knapsack: numba and reference agree on the scaled instance: value %s, choice %s", same_value,
             bool(np.array_equal(small_solution.choice, reference.choice)))

    emit_figure(
        "knapsack_solve_p50", statistics.median(times), "ms", **params, p90_ms=_p(times, 90),
        target=KNAPSACK_TARGET_MS, dp_groups=solution.dp_groups, dp_capacity=solution.dp_capacity,
        chosen_gpus=solution.total_weight,
        reference_name="solve_knapsack_reference (plain-Python DP), scaled-down instance",
        reference_value=reference_ms, reference_unit="ms",
        reference_groups=sizes.reference_groups, reference_capacity=sizes.reference_capacity,
    )
    emit_figure(
        "knapsack_solve_scaled_p50", statistics.median(small_times), "ms", groups=sizes.reference_groups,
        options=sizes.options, capacity=sizes.reference_capacity, runs=sizes.runs,
        same_value_as_reference=same_value,
        same_choice_as_reference=bool(np.array_equal(small_solution.choice, reference.choice)),
        reference_name="solve_knapsack_reference (plain-Python DP), same instance",
        reference_value=reference_ms, reference_unit="ms",
    )

    # What the Lagrangian reduction buys, and the case it cannot help (the same value per GPU
    # everywhere: nothing can be fixed, the DP is the full groups * capacity * options).
    plain_runs = max(3, sizes.runs // 4)
    plain = solve_knapsack(weights, values, counts, sizes.capacity, reduce=False)
    plain_times = _time_ms(lambda: solve_knapsack(weights, values, counts, sizes.capacity, reduce=False), plain_runs)
    emit_figure(
        "knapsack_solve_unreduced_p50", statistics.median(plain_times), "ms", **(params | dict(runs=plain_runs)),
        dp_groups=plain.dp_groups, dp_capacity=plain.dp_capacity,
        same_value_as_reduced=plain.total_value == solution.total_value,
        reference_name="knapsack_solve_p50 (with the Lagrangian reduction)",
        reference_value=statistics.median(times), reference_unit="ms",
    )
    linear = weights * 3.0
    worst = solve_knapsack(weights, linear, counts, sizes.capacity)
    worst_times = _time_ms(lambda: solve_knapsack(weights, linear, counts, sizes.capacity), plain_runs)
    emit_figure(
        "knapsack_solve_linear_values_p50", statistics.median(worst_times), "ms", **(params | dict(runs=plain_runs)),
        target=KNAPSACK_TARGET_MS, dp_groups=worst.dp_groups, dp_capacity=worst.dp_capacity,
        note="adversarial: value = 3 per GPU for every option, so no option can be ruled out",
        reference_name="knapsack_solve_p50 (realistic concave values)",
        reference_value=statistics.median(times), reference_unit="ms",
    )


def reclaim_bench(ctx: BenchContext | None = None) -> None:
    sizes = _sizes(ctx)
    instance, loaned_at = loaned_servers(np.random.default_rng(SEED + 2), sizes.servers, sizes.jobs)
    params = dict(servers=sizes.servers, jobs=sizes.jobs, reclaim=sizes.reclaim,
                  placements=int(instance.server_job.shape[0]), runs=sizes.runs)
    greedy = reclaim_greedy(instance, sizes.reclaim)
    times = _time_ms(lambda: reclaim_greedy(instance, sizes.reclaim), sizes.runs)
    start = time.perf_counter()
    reference = reclaim_greedy_reference(instance, sizes.reclaim)
    reference_ms = (time.perf_counter() - start) * 1e3
    emit_figure(
        "reclaim_greedy_p50", statistics.median(times), "ms", **params, p90_ms=_p(times, 90),
        target=RECLAIM_TARGET_MS, same_picks_as_reference=bool(np.array_equal(greedy.servers, reference.servers)),
        reference_name="reclaim_greedy_reference (plain Python, recomputed from scratch each pick), run once",
        reference_value=reference_ms, reference_unit="ms",
    )
    naive = reclaim_most_recent_first(instance, sizes.reclaim, loaned_at)
    emit_figure(
        "reclaim_greedy_cost", greedy.total_cost, "GPU-s", **(params | dict(runs=1)),
        preemptions=greedy.preemptions, reference_preemptions=naive.preemptions,
        reference_name="reclaim_most_recent_first (naive: latest loaned first)",
        reference_value=naive.total_cost, reference_unit="GPU-s",
    )


# The greedy's gap to the exact reclaim, on instances small enough for the exact one (``reclaim_solve`` uses it
# up to ``EXACT_SUBSETS`` subsets): (loaned servers, servers returned), each with 2.5 jobs per server.
GAP_SHAPES = ((12, 3), (16, 4), (20, 6))


def reclaim_gap_bench(ctx: BenchContext | None = None) -> None:
    instances = 10 if ctx is not None and ctx.sizes is QUICK else 100
    rng = np.random.default_rng(SEED + 3)
    for servers, reclaim in GAP_SHAPES:
        gaps, preempt_greedy, preempt_exact, exact_ms, greedy_ms = [], 0, 0, [], []
        for _ in range(instances):
            instance, _ = loaned_servers(rng, servers, int(2.5 * servers))
            start = time.perf_counter()
            greedy = reclaim_greedy(instance, reclaim)
            greedy_ms.append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            exact = reclaim_exact(instance, reclaim)
            exact_ms.append((time.perf_counter() - start) * 1e3)
            if greedy.total_cost < exact.total_cost - 1e-6 * max(1.0, exact.total_cost):
                raise AssertionError(f"the greedy beat the exact reclaim ({greedy.total_cost} < {exact.total_cost})")
            gaps.append((greedy.total_cost - exact.total_cost) / exact.total_cost * 100 if exact.total_cost else 0.0)
            preempt_greedy += greedy.preemptions
            preempt_exact += exact.preemptions
        emit_figure(
            f"reclaim_greedy_gap_{servers}_servers", statistics.mean(gaps), "% above the exact cost",
            servers=servers, reclaim=reclaim, jobs=int(2.5 * servers), instances=instances,
            greedy_optimal_share=sum(g <= 1e-9 for g in gaps) / len(gaps), max_gap_pct=max(gaps),
            p95_gap_pct=_p(gaps, 95), preemptions=preempt_greedy, reference_preemptions=preempt_exact,
            greedy_p50_ms=statistics.median(greedy_ms),
            reference_name="reclaim_exact (every subset, numba), p50 time", reference_value=statistics.median(exact_ms),
            reference_unit="ms",
        )


# ---------------------------------------------------------------------------------------------
# Compile cost: a fresh interpreter, with an empty numba cache directory, then again with it filled.

_FIRST_CALLS = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
from scheduler_service.solvers import ReclaimInstance, knapsack, reclaim, reclaim_greedy, solve_knapsack
t1 = time.perf_counter()
solve_knapsack(np.array([[1, 2]]), np.array([[1.0, 1.5]]), np.array([2]), 1)
t2 = time.perf_counter()
inst = ReclaimInstance.from_triples([(0, 0, 1)], n_servers=1, job_workers=[1], job_min=[1], job_cost=[1.0],
                                    scale_in_cost=[1.0])
t3 = time.perf_counter()
reclaim_greedy(inst, 1)
t4 = time.perf_counter()
def hits(kernel):
    return sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values())
print(json.dumps(dict(import_s=t1 - t0, knapsack_s=t2 - t1, reclaim_s=t4 - t3,
                      knapsack_cache=hits(knapsack._knapsack_kernel),
                      reclaim_cache=hits(reclaim._reclaim_greedy_kernel))))
"""


def _first_calls(cache_dir: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", _FIRST_CALLS], env=env, cwd=root, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def compile_bench(ctx: BenchContext | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="aryl-numba-cache-") as cache_dir:
        cold = _first_calls(cache_dir)
        warm = _first_calls(cache_dir)
    for kernel in ("knapsack", "reclaim"):
        hits_cold, misses_cold = cold[f"{kernel}_cache"]
        hits_warm, misses_warm = warm[f"{kernel}_cache"]
        emit_figure(
            f"{kernel}_first_call_cold_cache", cold[f"{kernel}_s"], "s",
            cache_hits=hits_cold, cache_misses=misses_cold,
            reference_name=f"{kernel}_first_call_warm_cache (fresh process, kernel loaded from the on-disk cache)",
            reference_value=warm[f"{kernel}_s"], reference_unit="s",
            reference_cache_hits=hits_warm, reference_cache_misses=misses_warm,
        )
    emit_figure("solvers_import", warm["import_s"], "s",
                note="import numpy + numba + scheduler_service.solvers in a fresh process",
                reference_name="solvers_import with an empty numba cache", reference_value=cold["import_s"],
                reference_unit="s")


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("knapsack_solver", knapsack_bench,
              "multiple-choice knapsack, 5,000 jobs x 8 options, 10,000 GPUs: numba p50 vs plain-Python DP"),
    Benchmark("reclaim_solver", reclaim_bench,
              "greedy reclaim, 1,000 loaned servers / 5,000 jobs / 200 returned: numba p50 vs plain Python; "
              "cost vs latest-loaned-first"),
    Benchmark("reclaim_gap", reclaim_gap_bench,
              "the greedy reclaim's cost above the exact one (every subset) on 12-20 loaned servers, 100 instances "
              "each; the exact solver's time as the reference"),
    Benchmark("solver_compile", compile_bench,
              "numba first-call time in a fresh process, empty vs filled on-disk cache"),
)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.bench_solvers [--quick]``: the solver benchmarks alone (no database)."""
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    ctx = BenchContext(admin_url="", sizes=QUICK if "--quick" in args else SERVICE_FULL)
    for bench in BENCHMARKS:
        log.info("running %s; load average %.2f on %d CPUs", bench.name, os.getloadavg()[0], os.cpu_count() or 0)
        bench.run(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
