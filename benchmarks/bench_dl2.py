"""One decision of the ``dl2`` policy at about 1,000 jobs (target: at most 10 ms), beside ``aryl``'s on the same
snapshot.

The snapshot is ``bench_cycle.synthetic_cluster`` (seeded: 250 servers of 8 GPUs, a fifth of them inference,
half of those on loan; 1,000 jobs of 1-8 GPUs per worker, about half running) after a quarter of its running
jobs finished (``with_finished``: 946 jobs are left, 462 GPUs free). Why the finished jobs:
``synthetic_cluster`` packs every GPU, and on a full cluster dl2 has no legal action (nothing fits, every
running job is at ``min_workers``), so its decision is the encoding alone and the network never runs (this
benchmark timed that, 0.85 ms, before). With GPUs free the network's action loop runs, and the figure says
how many actions it took (``network_actions``, at most ``MAX_STEPS``); none fails the benchmark.

The figure is ``policy.schedule(snapshot)`` p50/max with the weights shipped with Aryl (numpy, no torch): the
encoding of the 32 oldest jobs, the network's action loop and the plan of every job. Every plan is checked
against the invariants once, outside the timing.
"""

from __future__ import annotations

import logging
import statistics
import time

import numpy as np

from benchmarks import emit_figure
from benchmarks.bench_cycle import synthetic_cluster, with_finished
from benchmarks.harness import QUICK, BenchContext, Benchmark
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.policies import create_policy
from scheduler_service.policies.dl2 import MAX_STEPS, Greedy, create_dl2, decide

log = logging.getLogger("aryl.bench")

FINISHED_SHARE = 0.25  # of the running jobs: enough free GPUs that the network acts for many steps


class CountingGreedy(Greedy):
    """The live chooser, counting the network's actions (``stop`` included)."""

    def __init__(self) -> None:
        self.actions = 0

    def choose(self, observation: np.ndarray, legal: np.ndarray, logits: np.ndarray) -> int:
        self.actions += 1
        return super().choose(observation, legal, logits)


def dl2_bench(ctx: BenchContext) -> None:
    runs = 5 if ctx.sizes is QUICK else 30
    servers, jobs = 250, 1000
    snapshot = with_finished(synthetic_cluster(servers, jobs), FINISHED_SHARE)
    params = PolicyParams()
    counter = CountingGreedy()
    decide(snapshot, params, create_dl2(params).current(), counter)  # outside the timing: what the network did
    if counter.actions == 0:
        raise AssertionError("dl2 took no action on the benchmark's snapshot: the figure would time the encoding only")
    timings = {}
    for name in ("dl2", "aryl"):
        policy = create_policy(name, params)
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
    common = dict(servers=servers, jobs=len(snapshot.jobs), runs=runs, free_gpus=FreeCapacity.of(snapshot).total,
                  network_actions=counter.actions, max_actions=MAX_STEPS, reference_name="aryl_schedule_p50",
                  reference_value=timings["aryl"][0], reference_unit="ms")
    emit_figure("dl2_decide_p50", timings["dl2"][0], "ms", target=10, **common)
    emit_figure("dl2_decide_max", timings["dl2"][1], "ms", **common)


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("dl2_decide", dl2_bench,
              "one dl2 decision at ~1,000 jobs with GPUs free (target <= 10 ms) vs aryl on the same snapshot"),
)
