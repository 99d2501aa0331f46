"""How far the heterogeneity section's figures move with nothing but the BLAS kernels (``simulator.blas``): ``sia``
(the gate's, and beyond Sia's) and ``aryl-noloan`` (beyond Sia's) rerun on OpenBLAS's other x86_64 kernels that
this machine's CPU runs, each in a process of its own (the kernels load once a process), the same code and inputs.

Why: the simulator pins the kernels, so a run is the same on every machine; but which kernels is a choice, and a
policy whose choices turn on near-ties (``sia``'s program) lands elsewhere on each. A single run against the
authors' single run says less than it seems; these rows say how much less. The gate's verdict counts the pinned
run alone. Must never: decide a verdict, or run a kernel the CPU lacks (it stops on an illegal instruction).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# OpenBLAS's x86_64 kernels by age, each with the CPU flag it needs (/proc/cpuinfo's name).
SPREAD_KERNELS = (("Nehalem", "sse4_2"), ("Sandybridge", "avx"), ("Haswell", "avx2"), ("SkylakeX", "avx512f"))
SPREAD_POLICIES = ("sia", "aryl-noloan")   # beyond Sia: the two whose comparison is the close one

Runner = Callable[[list[str], dict[str, str]], None]


def runnable_kernels(cpuinfo: Path = Path("/proc/cpuinfo"), machine: str | None = None) -> list[str]:
    """The kernels of ``SPREAD_KERNELS`` this machine runs: its CPU has each one's flag (x86_64 Linux only)."""
    if (machine or platform.machine()).lower() not in ("x86_64", "amd64"):
        return []
    try:
        line = next(x for x in cpuinfo.read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return []
    flags = set(line.split(":", 1)[1].split())
    return [kernel for kernel, flag in SPREAD_KERNELS if flag in flags]


def _run(argv: list[str], env: dict[str, str]) -> None:
    subprocess.run([sys.executable, *argv], env=env, check=False, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)


def kernel_spread(kernels: Sequence[str], gate_workloads: Sequence[str], beyond_workloads: Sequence[str],
                  rate: Path, run: Runner = _run, workers: int | None = None) -> dict[str, dict[str, Any]]:
    """Per kernel: ``{"gate": {workload: ours_s}, "beyond": {workload: {policy: avg_jct_s}}}`` (average JCTs, s;
    beyond Sia's a mean over seeds), from ``python -m simulator.hetero_gate`` (its authors' runs read from their
    folder, as the section's own gate left them) and ``python -m simulator.hetero_inference``, run with
    ``ARYL_SIM_BLAS_CORE`` set (``SIA_REF_GIT`` from the environment). A kernel whose runs left no figures is
    left out."""
    def one(kernel: str) -> tuple[str, dict[str, Any]]:
        env = {**os.environ, "ARYL_SIM_BLAS_CORE": kernel}
        with tempfile.TemporaryDirectory(prefix="aryl-kernels.") as tmp:
            gate_json, beyond_json = Path(tmp) / "gate.json", Path(tmp) / "beyond.json"
            if gate_workloads:
                run(["-m", "simulator.hetero_gate", "--policies", "sia", "--workloads", ",".join(gate_workloads),
                     "--json", str(gate_json)], env)
            run(["-m", "simulator.hetero_inference", "--policies", ",".join(SPREAD_POLICIES), "--workloads",
                 ",".join(beyond_workloads), "--rate", str(rate), "--json", str(beyond_json)], env)
            gate = json.loads(gate_json.read_text()) if gate_json.exists() else {}
            beyond = json.loads(beyond_json.read_text()) if beyond_json.exists() else {}
        return kernel, {"gate": {w: per["sia"]["ours"] for w, per in gate.items() if "sia" in per},
                        "beyond": {w: {p: f["avg_jct_s"] for p, f in per.items()} for w, per in beyond.items()}}

    with ThreadPoolExecutor(max(1, min(len(kernels), workers or os.cpu_count() or 1))) as pool:
        done = dict(pool.map(one, kernels))
    return {k: v for k, v in done.items() if v["gate"] or v["beyond"]}


def spread_rows(pinned: str, gate_authors: dict[str, float], pinned_figures: dict[str, Any],
                spread: dict[str, dict[str, Any]]) -> list[str]:
    """The spread's table (markdown lines): a row per kernel, the pinned one first (``pinned_figures`` in
    ``kernel_spread``'s shape), the gate's ``sia`` against the authors' (``gate_authors``: workload -> s) and
    beyond Sia's ``sia`` and ``aryl-noloan`` per workload, in hours."""
    gate_w = list(gate_authors)
    beyond_w = list(pinned_figures["beyond"])
    head = ["kernels"] + [f"gate {w}: `sia` (diff)" for w in gate_w] + [
        f"beyond {w}: `{p}`" for w in beyond_w for p in SPREAD_POLICIES]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for kernel, figures in [(f"{pinned} (pinned)", pinned_figures), *spread.items()]:
        cells = [kernel]
        for w in gate_w:
            ours = figures["gate"].get(w)
            cells.append("-" if ours is None else f"{ours / 3600:.3f} ({100 * (ours / gate_authors[w] - 1):+.1f}%)")
        for w in beyond_w:
            per = figures["beyond"].get(w, {})
            cells += ["-" if p not in per else f"{per[p] / 3600:.3f}" for p in SPREAD_POLICIES]
        rows.append("| " + " | ".join(cells) + " |")
    return rows
