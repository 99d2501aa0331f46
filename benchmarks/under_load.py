"""The loaded mode (``python -m benchmarks --under-load``, ``make bench-under-load``): each benchmark run twice,
quiet and then with a CPU hog on every core, and the two runs' figures side by side.

Why: a scheduler's host is rarely idle, and figures that hold only on an idle machine do not hold for a user.
The latency targets (issue 35: the router's added latency, the desired-state pushes, the reclaim, SubmitJob
against the RPC layer) are set for a busy machine; this mode shows each figure on the machine as it is and with
every core contended, in one command and one run.

Nouns:
- A *CPU hog* is a child process that spins in pure Python (``HOG_CODE``) at the default priority, one per core
  by default (``--hogs``). Each exits by itself once its parent is gone, so a killed benchmark run never leaves
  one behind; ``CpuHogs`` also stops them on exit, even on failure.
- A *pair* is one benchmark's quiet run and its loaded run. Every benchmark's quiet run comes first, then every
  loaded one (the hogs start right before each loaded run and stop right after it): a quiet run right after a
  loaded one would meet the load average the hogs left, which decays over minutes.
- The *side-by-side table* (``side_by_side``, on stderr at the end; stdout keeps one JSON figure per line, each
  tagged ``"run": "quiet"`` or ``"loaded"`` with ``"hogs"``) pairs the two runs' figures in the order they were
  printed, with each run's load average, reference and, where the figure has one, its target and whether it met
  it.

Never: judge a figure (a slow figure is printed, not failed), or leave a hog running.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks import figures
from benchmarks.harness import BenchContext, Benchmark

log = logging.getLogger("aryl.bench")

# The benchmarks with the latency and throughput targets a busy machine must meet (issue 35): the loaded mode's
# default selection (``--only`` picks others).
LATENCY_BENCHMARKS = ("router_latency", "agent_fleet", "reclaim_latency", "submit_batch_throughput")
HOG_MARKER = "aryl-bench-cpu-hog"
# Spins; every few million turns checks that its parent (the pid it is given: it may be gone before the hog starts)
# is still its parent, and exits when it is not.
HOG_CODE = (f"# {HOG_MARKER}\n"
            "import os, sys\n"
            "parent = int(sys.argv[1])\n"
            "n = 0\n"
            "while True:\n"
            "    n += 1\n"
            "    if n % 2_000_000 == 0 and os.getppid() != parent:\n"
            "        raise SystemExit(0)\n")


class CpuHogs:
    """``count`` CPU hogs (module doc) while within."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuHogs:
        try:
            for _ in range(self.count):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", HOG_CODE, str(os.getpid())],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


@dataclass
class Pair:
    """One benchmark's two runs: the figures each printed, and whether each raised."""

    name: str
    quiet: list[dict[str, Any]] = field(default_factory=list)
    loaded: list[dict[str, Any]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # "quiet" / "loaded": the runs that raised


def run_once(bench: Benchmark, ctx: BenchContext, pair: Pair, run: str, hogs: int) -> None:
    """``bench``'s ``run`` ("quiet", or "loaded" beside ``hogs`` CPU hogs) into ``pair``; a run that raises is
    logged and named in ``Pair.failed``."""
    hogs = hogs if run == "loaded" else 0
    log.info("running %s, %s run (%d CPU hogs); load average %.2f on %d CPUs", bench.name, run, hogs,
             os.getloadavg()[0], os.cpu_count() or 0)
    with figures(run=run, hogs=hogs) as kept:
        try:
            if hogs:
                with CpuHogs(hogs):
                    time.sleep(1.0)  # let the hogs take the cores before the benchmark starts
                    bench.run(ctx)
            else:
                bench.run(ctx)
        except Exception:  # one broken run must not hide the other's figures
            log.exception("benchmark %s failed in its %s run", bench.name, run)
            pair.failed.append(run)
    getattr(pair, run).extend(kept)


# The fields that tell two figures of one name apart (a data plane, an in-flight level, a view).
_KEY_FIELDS = ("data_plane", "in_flight", "calls_in_flight", "view", "method", "batch")


def _label(fig: dict[str, Any]) -> str:
    keys = [f"{k}={fig[k]}" for k in _KEY_FIELDS if k in fig]
    return fig["name"] + (f" ({', '.join(keys)})" if keys else "")


def target_check(fig: dict[str, Any]) -> tuple[str, bool] | None:
    """The figure against its target, where it carries one: what is compared, and whether it is met."""
    if "added_target_ms" in fig and "added_ms" in fig:
        return f"adds {fig['added_ms']:g} ms, target <= {fig['added_target_ms']:g}", \
            fig["added_ms"] <= fig["added_target_ms"]
    if "health_check_ratio_target" in fig and "health_check_ratio" in fig:
        return f"{fig['health_check_ratio']:.0%} of health checks, target >= {fig['health_check_ratio_target']:.0%}", \
            fig["health_check_ratio"] >= fig["health_check_ratio_target"]
    target = fig.get("target", fig.get("target_s"))
    if not isinstance(target, int | float) or isinstance(target, bool):
        return None
    lower_is_better = fig["unit"] in ("ms", "s", "us")
    met = fig["value"] <= target if lower_is_better else fig["value"] >= target
    return f"target {'<=' if lower_is_better else '>='} {target:g} {fig['unit']}", met


def _cell(fig: dict[str, Any] | None) -> str:
    if fig is None:
        return "(none)"
    text = f"{fig['value']:g} (load {fig.get('load_avg', 0):.1f})"
    if "reference_value" in fig:
        text += f"; ref {fig['reference_value']:g}"
    check = target_check(fig)
    if check is not None:
        text += f"; {check[0]}: {'met' if check[1] else 'NOT met'}"
    return text


def side_by_side(pairs: Sequence[Pair], hogs: int) -> str:
    """The two runs' figures as a markdown table, paired in the order each run printed them."""
    lines = [f"| figure | unit | quiet | loaded ({hogs} CPU hogs) |", "|---|---|---|---|"]
    for pair in pairs:
        for i in range(max(len(pair.quiet), len(pair.loaded))):
            quiet = pair.quiet[i] if i < len(pair.quiet) else None
            loaded = pair.loaded[i] if i < len(pair.loaded) else None
            first = quiet or loaded
            assert first is not None
            if quiet is not None and loaded is not None and _label(quiet) != _label(loaded):
                lines.append(f"| {_label(quiet)} | {quiet['unit']} | {_cell(quiet)} | (not paired) |")
                lines.append(f"| {_label(loaded)} | {loaded['unit']} | (not paired) | {_cell(loaded)} |")
                continue
            lines.append(f"| {_label(first)} | {first['unit']} | {_cell(quiet)} | {_cell(loaded)} |")
        for run in pair.failed:
            quiet_cell, loaded_cell = ("FAILED", "") if run == "quiet" else ("", "FAILED")
            lines.append(f"| {pair.name} | | {quiet_cell} | {loaded_cell} |")
    return "\n".join(lines)


def run_under_load(benchmarks: Sequence[Benchmark], ctx: BenchContext, hogs: int) -> list[str]:
    """Every benchmark's pair; the table on stderr; the names of the benchmarks with a run that raised."""
    pairs = [Pair(bench.name) for bench in benchmarks]
    # Every quiet run first, then every loaded one: a quiet run right after a loaded one would meet the load
    # average the hogs left (it decays over minutes) and print it as its own.
    for run in ("quiet", "loaded"):
        for bench, pair in zip(benchmarks, pairs, strict=True):
            run_once(bench, ctx, pair, run, hogs)
    print("\nquiet and loaded runs side by side (each figure's value, the load average when it was printed, its "
          "reference and target):\n" + side_by_side(pairs, hogs), file=sys.stderr, flush=True)
    return [f"{pair.name} ({', '.join(pair.failed)} run)" for pair in pairs if pair.failed]
