"""The simulator's speed: the 15-day Philly window (28,554 jobs) and the full trace with ``aryl``.

Targets from the issue: <= 60 s on one core for the 15-day window, <= 5 min for the full 82k-job trace,
at the evaluation's settings (``evaluation.document``: cycles batched at least 60 s apart).
Figures: wall seconds of one ``simulate`` run of the 15-day window with a cycle at every event
(``min_cycle_gap_s=0``, as the service) and with cycles at least 60 s apart (as the evaluation runs),
and of the full trace at 60 s; reference: ``fifo`` on the same inputs at gap 0 (the simulator's own
overhead plus the cheapest policy). Reads the traces from ``$ARYL_SHARED_DIR`` or ``../shared``;
``--quick`` uses the first 3,000 jobs of the window and skips the full trace.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from benchmarks import emit_figure
from benchmarks.harness import QUICK, BenchContext, Benchmark
from scheduler_service.core.params import PolicyParams
from simulator.engine import simulate
from simulator.load import demand_from_rate, load_servegen_rate
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.traces import JobMapping, load_philly

log = logging.getLogger("aryl.bench")
REPO = Path(__file__).resolve().parent.parent


def shared_dir() -> Path:
    return Path(os.environ.get("ARYL_SHARED_DIR", REPO.parent / "shared"))


def sim_bench(ctx: BenchContext) -> None:
    shared = shared_dir()
    limit = 3000 if ctx.sizes is QUICK else None
    rate = load_servegen_rate(shared / "traces/servegen-llm-load/servegen_total_rate_10min.csv", model="m-small")
    spec = ClusterSpec(80, 40, 8)

    def inputs(trace: str) -> tuple[list[TraceJob], list[DemandPoint]]:
        jobs = load_philly(shared / "traces/philly-pollux" / trace, mapping=JobMapping(seed=0), limit=limit)
        span = max(j.submit_time for j in jobs) + 10 * 86400
        return jobs, demand_from_rate(rate, inference_servers=40, duration_s=span)

    def timed(jobs: list[TraceJob], demand: list[DemandPoint], policy: str, gap: float) -> float:
        started = time.perf_counter()
        result = simulate(jobs, demand, spec, policy, PolicyParams(), seed=0, min_cycle_gap_s=gap)
        wall = time.perf_counter() - started
        log.info("%d jobs, %s gap %.0fs: %d cycles, %s, %.1fs", len(jobs), policy, gap, result.cycles,
                 result.stop_reason, wall)
        return wall

    jobs, demand = inputs("philly_jobs_15d_2017-10-10.csv.gz")
    reference = timed(jobs, demand, "fifo", 0.0)
    for gap in (0.0, 60.0):
        emit_figure("sim_philly15d_aryl_wall", timed(jobs, demand, "aryl", gap), "s", jobs=len(jobs),
                    min_cycle_gap_s=gap, target=60 if limit is None else None,
                    reference_name="sim_philly15d_fifo_wall_gap0", reference_value=reference, reference_unit="s")
    if limit is None:
        jobs, demand = inputs("philly_jobs.csv.gz")
        emit_figure("sim_philly_full_aryl_wall", timed(jobs, demand, "aryl", 60.0), "s", jobs=len(jobs),
                    min_cycle_gap_s=60.0, target=300, reference_name="sim_philly15d_fifo_wall_gap0",
                    reference_value=reference, reference_unit="s")


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("simulator_philly", sim_bench, "aryl-sim on the 15-day Philly window and the full trace (aryl), vs fifo"),
)
