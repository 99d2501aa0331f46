"""One decision of the ``dl2`` policy at 1,000 jobs (target: at most 10 ms), beside ``aryl``'s on the same snapshot.

The snapshot is ``bench_cycle.synthetic_cluster`` (seeded): 250 servers of 8 GPUs (a fifth of them inference,
half of those on loan), 1,000 jobs of 1-8 GPUs per worker, about half running. The figure is
``policy.schedule(snapshot)`` p50/max with the weights shipped with Aryl (numpy, no torch): the encoding of the
32 oldest jobs, the network's action loop and the plan of all 1,000 jobs. Every plan is checked against the
invariants once, outside the timing.
"""

from __future__ import annotations

import logging
import statistics
import time

from benchmarks import emit_figure
from benchmarks.bench_cycle import synthetic_cluster
from benchmarks.bench_service import QUICK, BenchContext, Benchmark
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.policies import create_policy

log = logging.getLogger("aryl.bench")


def dl2_bench(ctx: BenchContext) -> None:
    runs = 5 if ctx.sizes is QUICK else 30
    servers, jobs = 250, 1000
    snapshot = synthetic_cluster(servers, jobs)
    timings = {}
    for name in ("dl2", "aryl"):
        policy = create_policy(name, PolicyParams())
        plan = policy.schedule(snapshot)  # warm-up (aryl's numba kernels load from their cache)
        problems = check_plan(snapshot, plan)
        if problems:
            raise AssertionError(f"{name} plan breaks invariants: {problems[:3]}")
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            policy.schedule(snapshot)
            samples.append((time.perf_counter() - start) * 1e3)
        timings[name] = (statistics.median(samples), max(samples))
        log.info("%s: %d starts, %d scales, %d preemptions", name, len(plan.starts), len(plan.scales),
                 len(plan.preemptions))
    common = dict(servers=servers, jobs=jobs, runs=runs, reference_name="aryl_schedule_p50",
                  reference_value=timings["aryl"][0], reference_unit="ms")
    emit_figure("dl2_decide_p50", timings["dl2"][0], "ms", target=10, **common)
    emit_figure("dl2_decide_max", timings["dl2"][1], "ms", **common)


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("dl2_decide", dl2_bench, "one dl2 decision at 1,000 jobs (target <= 10 ms) vs aryl on the same snapshot"),
)
