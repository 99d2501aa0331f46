"""``pollux`` in the goodput job model against the authors' own simulator, on workload-6 (160 jobs,
16 nodes x 4 GPUs, a decision every 60 s).

Target from the issue: one workload's simulation at least 50x faster than the reference harness
(``shared/reference/pollux-simulator``, whose genetic algorithm takes ~27 min a workload on 2 cores).
A whole reference run does not fit a benchmark, so both simulate the first ``INTERVALS`` scheduling
intervals of workload-6 in the same run: the reference (``run-reference.sh pollux``, its private
virtualenv) timed from its first printed interval to its ``INTERVALS``-th -- its start-up (imports, data)
excluded -- and Aryl timed over the whole bounded call, start-up (profiles, the first fits) included.
Figures: the two wall times and their ratio; then Aryl's whole workload-6 run (wall and average JCT)
beside the authors' published average JCT and the reference's wall time measured in the reference's
README (1625-1662 s, not in this run). ``--quick``: 10 intervals, and no whole run.

The reference needs its virtualenv (numpy 1.23, pandas 1.5, scipy 1.10, pymoo 0.4, autograd): made by
``run-reference.sh`` on first use in ``$POLLUX_REF_VENV`` (default ``$TMPDIR/pollux-ref-venv``), which needs
the package index; without it the reference figure is skipped and said so.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from pathlib import Path

from benchmarks import emit_figure
from benchmarks.bench_sim import shared_dir
from benchmarks.harness import QUICK, BenchContext, Benchmark
from simulator.goodput_sim import load_workload, run_workload

log = logging.getLogger("aryl.bench")
INTERVALS = 40
INTERVAL_S = 60
AUTHORS_W6_S = 2446.1            # results-jobload/pollux-1.0, workload-6
REFERENCE_README_WALL_S = 1625.5  # reference/pollux-simulator/README.md: pollux, workload-6, 2-core machine
_STEP = re.compile(r"SIMULATOR TIME: (\d+)")


def reference_wall(shared: Path, intervals: int, timeout_s: float) -> float | None:
    """Seconds the reference simulator takes from its first interval to its ``intervals``-th (None: it
    could not run)."""
    script = shared / "reference/pollux-simulator/run-reference.sh"
    if not script.exists():
        log.warning("no reference harness at %s", script)
        return None
    proc = subprocess.Popen(["bash", str(script), "pollux", "workloads/workload-6.csv"], stdout=subprocess.PIPE,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "OPENBLAS_NUM_THREADS": "1"},
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    first: float | None = None
    deadline = time.monotonic() + timeout_s
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            match = _STEP.search(line)
            if not match:
                if time.monotonic() > deadline:
                    break
                continue
            now, step = time.perf_counter(), int(match.group(1)) // INTERVAL_S
            if step == 1:
                first = now
            elif step >= intervals and first is not None:
                return (now - first) * intervals / (intervals - 1)  # intervals 2..N, scaled to N of them
            if time.monotonic() > deadline:
                break
        log.warning("the reference simulator stopped or timed out before interval %d", intervals)
        return None
    finally:
        os.killpg(proc.pid, 15)
        proc.wait()


def pollux_bench(ctx: BenchContext) -> None:
    shared = shared_dir()
    data = shared / "pollux-data"
    workload = load_workload(data / "workloads/workload-6.csv")
    intervals = 10 if ctx.sizes is QUICK else INTERVALS
    run_workload(workload[:4], data / "traces", "pollux", until_s=120.0)  # numba's cache loaded, profiles read
    started = time.perf_counter()
    bounded = run_workload(workload, data / "traces", "pollux", until_s=intervals * INTERVAL_S)
    ours = time.perf_counter() - started
    log.info("aryl pollux: %d intervals of workload-6 in %.2f s", intervals, ours)
    theirs = reference_wall(shared, intervals, timeout_s=1800.0)
    log.info("reference pollux: %s", "did not run" if theirs is None else f"{theirs:.1f} s")
    emit_figure("pollux_w6_bounded_wall", ours, "s", intervals=intervals, jobs_done=len(bounded.jcts),
                reference_name="pollux_reference_w6_bounded_wall", reference_value=theirs, reference_unit="s",
                speedup=None if theirs is None else theirs / ours, target_speedup=50)
    if ctx.sizes is QUICK:
        return
    whole = run_workload(workload, data / "traces", "pollux")
    emit_figure("pollux_w6_wall", whole.wall_s, "s", avg_jct_s=whole.average_jct, authors_avg_jct_s=AUTHORS_W6_S,
                reference_name="pollux_reference_w6_wall_readme", reference_value=REFERENCE_README_WALL_S,
                reference_unit="s", speedup_vs_readme=REFERENCE_README_WALL_S / whole.wall_s)


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("pollux", pollux_bench, "pollux on workload-6 (goodput model) vs the authors' simulator, "
                                      "first 40 intervals in the same run, and the whole workload"),
)
