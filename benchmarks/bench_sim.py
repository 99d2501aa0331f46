"""The simulator's speed: the 15-day Philly window (28,554 jobs) with the ``aryl`` policy.

Targets from the issue: <= 60 s on one core for the 15-day window, <= 5 min for the full 82k-job trace.
Figures: wall seconds of one ``simulate`` run with a cycle at every event (``min_cycle_gap_s=0``, as the
service) and with cycles batched at least 60 s apart (as the evaluation runs); reference: ``fifo``
on the same inputs (the simulator's own overhead plus the cheapest policy). Reads the trace from
``$ARYL_SHARED_DIR`` or ``../shared``; ``--quick`` uses its first 3,000 jobs.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from benchmarks import emit_figure
from benchmarks.bench_service import QUICK, Benchmark, BenchContext
from scheduler_service.core.params import PolicyParams
from simulator.engine import simulate
from simulator.load import demand_from_rate, load_servegen_rate
from simulator.model import ClusterSpec
from simulator.traces import JobMapping, load_philly

log = logging.getLogger("aryl.bench")
REPO = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    return Path(os.environ.get("ARYL_SHARED_DIR", REPO.parent / "shared"))


def sim_bench(ctx: BenchContext) -> None:
    shared = shared_dir()
    limit = 3000 if ctx.sizes is QUICK else None
    jobs = load_philly(shared / "traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz",
                       mapping=JobMapping(seed=0), limit=limit)
    rate = load_servegen_rate(shared / "traces/servegen-llm-load/servegen_total_rate_10min.csv", model="m-small")
    demand = demand_from_rate(rate, inference_servers=40, duration_s=max(j.submit_time for j in jobs) + 10 * 86400)
    spec = ClusterSpec(80, 40, 8)

    def timed(policy: str, gap: float) -> float:
        started = time.perf_counter()
        result = simulate(jobs, demand, spec, policy, PolicyParams(), seed=0, min_cycle_gap_s=gap)
        wall = time.perf_counter() - started
        log.info("%s gap %.0fs: %d cycles, %s, %.1fs", policy, gap, result.cycles, result.stop_reason, wall)
        return wall

    reference = timed("fifo", 0.0)
    for gap in (0.0, 60.0):
        emit_figure("sim_philly15d_aryl_wall", timed("aryl", gap), "s", jobs=len(jobs), min_cycle_gap_s=gap,
                    target=60 if limit is None else None, reference_name="sim_philly15d_fifo_wall_gap0",
                    reference_value=reference, reference_unit="s")


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("simulator_philly", sim_bench, "aryl-sim on the 15-day Philly window (aryl), vs fifo"),
)
