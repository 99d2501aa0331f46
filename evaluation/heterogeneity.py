"""The heterogeneity section (issue 33): the fidelity gate of the heterogeneous job model (``sia`` and ``gavel``,
ours against the Sia authors' simulator, ``simulator.hetero_gate``), then beyond Sia: ``aryl`` lending an
inference pool of another GPU type to training, against ``sia``, ``gavel`` and ``aryl-noloan``
(``simulator.hetero_inference``'s module doc states the setting and what each policy is told).

It needs the Sia authors' artifact (no licence: read at run time from ``SIA_REF_GIT``, never stored here);
without it the section says how to get it and run it. The authors' runs are read from
``simulator.hetero_gate.DEFAULT_AUTHORS_DIR`` (``ARYL_SIA_AUTHORS_DIR``) and the missing ones run there by the
reference harness (``sia``: 15-40 minutes a workload on a 2-core machine; ``ARYL_SIA_AUTHORS_RUN=0``: the missing
ones are left out of the gate's table, and the section names them). Summaries:
``heterogeneity.gate.<set>/<workload>.<policy>`` = ``{"ours", "authors"}`` (average JCT, s),
``heterogeneity.gate_details`` the same keys with the rest of the gate's figures (restarts, decision times),
``heterogeneity.beyond.<setting>.<policy>`` = ``{"avg_jct_s", "avg_jct_s_range", "restarts_per_job"}``,
``<setting>`` being ``inference-pool-<set>-<workload>``; ``heterogeneity.kernels.<kernels>`` =
``{"gate": {<workload>: s}, "beyond": {<workload>: {<policy>: s}}}`` (``evaluation.kernels``: the same runs on
other BLAS kernels, the pinned ones included). Must never: copy any of the artifact into the
report's assets.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from evaluation.kernels import SPREAD_POLICIES, kernel_spread, runnable_kernels, spread_rows
from evaluation.report import log
from simulator.blas import loaded_core
from simulator.hetero_gate import ARTIFACT_COMMIT, DEFAULT_AUTHORS_DIR, DEFAULT_HARNESS, DEFAULT_WORKLOADS, gate
from simulator.hetero_inference import ESTIMATES, HOW_TO_RUN, INFERENCE, POLICIES, PROFILED, SEEDS, TRAINING, run_beyond

RATE = "traces/servegen-llm-load/servegen_total_rate_10min.csv"   # under --shared


def _pools(pools: tuple[Any, ...]) -> str:
    return " + ".join(f"{p.nodes} x {p.gpus_per_node} {p.gpu_type}" for p in pools)


GATE_POLICIES = ("sia", "gavel")
# Non-clairvoyant throughout: aryl's jobs declare user estimates (ESTIMATES); sia and gavel are told no length.
NO_LENGTHS = ("sia and gavel (the gate, and beyond Sia) are told no job's length, only what their jobs measure; "
              "aryl and aryl-noloan read user estimates")
TOLERANCE = 0.05


def gate_rows(results: dict[str, dict[str, dict[str, float]]]) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """The gate's table (markdown lines) and its two summaries (``gate`` and ``gate_details``)."""
    rows = ["| workload | policy | ours (h) | authors (h) | diff | restarts / job, ours / theirs | "
            "decision, ours: mean / p95 (ms) | authors' CBC solve: mean / p95 (ms) |",
            "|---|---|---|---|---|---|---|---|"]
    summary: dict[str, Any] = {}
    details: dict[str, Any] = {}
    for workload, per in results.items():
        for policy, f in per.items():
            theirs = f["authors_restarts_per_job"]
            solve = f"{f['solve_mean_ms']:.0f} / {f['solve_p95_ms']:.0f}" if "solve_mean_ms" in f else "-"
            rows.append(f"| {workload} | {policy} | {f['ours'] / 3600:.3f} | {f['authors'] / 3600:.3f} | "
                        f"{100 * f['diff']:+.1f}% | {f['restarts_per_job']:.2f} / "
                        f"{f'{theirs:.2f}' if theirs >= 0 else '-'} | "
                        f"{f['decision_mean_ms']:.0f} / {f['decision_p95_ms']:.0f} | {solve} |")
            summary.setdefault(workload, {})[policy] = {"ours": f["ours"], "authors": f["authors"]}
            details.setdefault(workload, {})[policy] = {k: v for k, v in f.items() if k not in ("ours", "authors")}
    return rows, summary, details


def model_rows(results: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Beyond Sia per model (markdown lines): each model's average JCT and wait for its first start under each
    policy, means over seeds, and for each workload what each model adds to `aryl-noloan`'s average JCT against
    `sia`'s (its jobs' share of the difference), the largest share each way named."""
    lines = ["Per model (means over seeds): average JCT (h) / average wait from submission to the first start (min).",
             "", "| workload | model | jobs | " + " | ".join(f"`{p}`" for p in POLICIES) + " |",
             "|---|---|---|" + "---|" * len(POLICIES)]
    notes = []
    for workload, figures in results.items():
        models = figures[POLICIES[0]]["by_model"]
        for model in models:
            cells = [f"{figures[p]['by_model'][model]['avg_jct_s'] / 3600:.3f} / "
                     f"{figures[p]['by_model'][model]['avg_first_wait_s'] / 60:.1f}" for p in POLICIES]
            lines.append(f"| {workload} | {model} | {models[model]['jobs']} | " + " | ".join(cells) + " |")
        if "sia" not in figures or "aryl-noloan" not in figures:
            continue
        ours, theirs = figures["aryl-noloan"]["by_model"], figures["sia"]["by_model"]
        total = sum(int(f["jobs"]) for f in theirs.values())
        share = {m: int(theirs[m]["jobs"]) * (ours[m]["avg_jct_s"] - theirs[m]["avg_jct_s"]) / total / 3600
                 for m in theirs if m in ours}
        worst, best = max(share, key=lambda m: share[m]), min(share, key=lambda m: share[m])
        notes.append(f"- {workload}: `aryl-noloan` {sum(share.values()):+.3f} h a job against `sia`; {worst} adds "
                     f"{share[worst]:+.3f} h ({_waits(ours, theirs, worst)}), {best} {share[best]:+.3f} h "
                     f"({_waits(ours, theirs, best)}).")
    return lines + ["", "What each model adds to `aryl-noloan`'s average JCT against `sia`'s (its jobs' share of "
                    "the difference; the joint sizing runs the jobs it estimates shortest first, and a long job waits "
                    "while the GPUs complete more elsewhere):", "", *notes]


def _kernel_rows(gate_results: dict[str, dict[str, dict[str, float]]], beyond: dict[str, dict[str, dict[str, Any]]],
                 rate: Path) -> tuple[list[str], dict[str, Any]]:
    """The kernels' spread (``evaluation.kernels``): its text and table, and its summary (per kernel, the pinned
    one included)."""
    pinned = loaded_core() or "the pinned"
    authors = {w: per["sia"]["authors"] for w, per in gate_results.items() if "sia" in per}
    pinned_figures = {"gate": {w: gate_results[w]["sia"]["ours"] for w in authors},
                      "beyond": {w: {p: figures[p]["avg_jct_s"] for p in SPREAD_POLICIES if p in figures}
                                 for w, figures in beyond.items()}}
    kernels = [k for k in runnable_kernels() if k != pinned]
    head = ("Nothing but the BLAS kernels (`evaluation/kernels.py`): `sia` (the gate's and beyond Sia's) and "
            "`aryl-noloan` (beyond Sia's, means over seeds) rerun on OpenBLAS's other x86_64 kernels that this "
            "machine runs, the same code and inputs, each in a process of its own. The gate counts the pinned run "
            "alone, its kernels (the oldest, which every x86_64 CPU runs) chosen before any of these runs; a "
            "difference inside a column's spread is one the kernels alone can make.")
    if not kernels:
        return [head + " Not measured here: this machine runs none of them.", ""], {pinned: pinned_figures}
    log(f"the kernels' spread: {', '.join(kernels)}")
    spread = kernel_spread(kernels, list(authors), list(beyond), rate)
    failed = [k for k in kernels if k not in spread]
    if failed:   # a run that stopped leaves no figures: say so, not a silently shorter table
        head += f" Left out, their runs having left no figures: {', '.join(failed)}."
    return [head, "", *spread_rows(pinned, authors, pinned_figures, spread), ""], {pinned: pinned_figures, **spread}


def _waits(ours: dict[str, Any], theirs: dict[str, Any], model: str) -> str:
    return (f"its jobs wait {ours[model]['avg_first_wait_s'] / 60:.1f} min for their first start, against "
            f"{theirs[model]['avg_first_wait_s'] / 60:.1f}")


def heterogeneity_section(shared: Path, assets: Path, raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The section (evaluation.document's registry): its markdown and summaries."""
    gate_head = [
        "## Heterogeneity: the Sia fidelity gate and beyond Sia", "",
        "### The fidelity gate", "",
        "`sia` and `gavel` on our heterogeneous job model (`simulator/hetero.py`) against the Sia authors' own "
        "simulator at the artifact's commit, run by the reference harness "
        "(`../shared/reference/sia-simulator/run-reference.sh`, the paper's command lines), on the smallest "
        f"workload of each 160-job set ({', '.join(DEFAULT_WORKLOADS)}) and the study's 64-GPU cluster (6 x 4 T4, "
        f"2 x 8 A100, 3 x 8 RTX 2080Ti). Target: average JCT within {100 * TOLERANCE:.0f}%. Our decision time is "
        "a whole `schedule` call (goodput estimates of every configuration, the solve and the placement); the "
        "authors' is their CBC solve alone, as their log prints it (their round also steps and refits every "
        "job), so ours is the larger by construction. CBC's runs are not repeatable to the digit (8 threads); "
        "ours and Gavel's are, on the same BLAS kernels, which the simulator pins (`simulator/blas.py`; the stamp "
        "below names them; after the beyond-Sia table, how far other kernels move `sia`). On every workload of "
        "both sets (measured 2026-12-02 on the pinned kernels, not rows of this section: docs/simulator.md) `sia` "
        "was within 5% on 17 of 18, from -2.6% to +5.1%, saturn/workload-2 the one beyond. "
        "Non-clairvoyant by construction: neither policy is told any job's length, only what "
        "its jobs measure, as in the study. `make sia-gate` runs the same comparison on any workloads.", ""]
    head = ["### Beyond Sia: an inference pool of another GPU type", "",
            f"Training on {_pools(TRAINING)} GPUs; an inference pool of {_pools((INFERENCE,))} (T4) serving "
            "ServeGen `m-small` (its maximum needs the whole pool with 20% headroom), which `aryl` may lend to "
            "training (a job on a T4 runs at the T4's speed by its profile). `sia`, `gavel` and `aryl-noloan` "
            f"do not lend. `aryl`'s jobs declare user estimates (`{ESTIMATES}`, seeds {list(SEEDS)}) of their true "
            "run time on one GPU of the reference type, a speed curve of their whole run alone at each size there, "
            "and report their true progress; `aryl` and `aryl-noloan` are told each type's declared speed and "
            + ("each job's one-GPU speed on every type from its arrival, as the study tells `sia` (`PROFILED`; "
               "`--measured-speeds`: only where it ran, as the live service knows it)" if PROFILED else
               "each job's measured speed per type it ran on, as the live service tells it")
            + " (`simulator.hetero`'s module doc), and value a worker by its job's speed on the server's type; "
            "`sia` and "
            "`gavel` are told what their jobs measure, no length, so one run each stands for every seed. "
            "The Sia study's workloads and per-type profiles, read at run time (`simulator/hetero_inference.py`).",
            ""]
    git_dir = os.environ.get("SIA_REF_GIT")
    if not git_dir:
        how = HOW_TO_RUN.format(commit=ARTIFACT_COMMIT)
        text = "\n".join(gate_head + head + [
            "Not run here: " + how.splitlines()[0], "", "```sh", *how.splitlines()[1:-1],
            "SIA_REF_GIT=/tmp/sia-artifacts.git python -m evaluation --only heterogeneity", "```", "",
            how.splitlines()[-1]])
        return text, {"gate": {}, "beyond": {}, "needs": "SIA_REF_GIT"}
    log(f"the Sia gate: the authors' runs in {DEFAULT_AUTHORS_DIR} (the missing ones are run now: sia takes "
        "15-40 minutes a workload)")
    run_missing = os.environ.get("ARYL_SIA_AUTHORS_RUN", "1") != "0"
    gate_results = gate(git_dir, list(DEFAULT_WORKLOADS), list(GATE_POLICIES), DEFAULT_AUTHORS_DIR,
                        Path(os.environ.get("SIA_REF_HARNESS", str(DEFAULT_HARNESS))), report=log,
                        run_missing=run_missing)
    left_out = [f"{w} {p}" for w in DEFAULT_WORKLOADS for p in GATE_POLICIES if p not in gate_results.get(w, {})]
    table, gate_summary, gate_details = gate_rows(gate_results)
    worst = max((abs(f["diff"]) for per in gate_results.values() for f in per.values()), default=0.0)
    verdict = [f"Largest difference {100 * worst:.1f}%: the gate "
               + ("passes" if worst <= TOLERANCE else f"fails (beyond {100 * TOLERANCE:.0f}%)")
               + (" on the rows above. Not compared here, the authors' run not at hand (ARYL_SIA_AUTHORS_RUN=0): "
                  + ", ".join(left_out) + "; `make sia-gate` runs them (sia: 15-40 minutes a workload on 2 cores)."
                  if left_out else "."), ""]
    results = run_beyond(git_dir, DEFAULT_WORKLOADS, shared / RATE, log=log)
    rows = ["| workload | policy | avg JCT (h), mean over seeds | seeds' range (h) | restarts / job |",
            "|---|---|---|---|---|"]
    beyond: dict[str, dict[str, Any]] = {}
    for workload, figures in results.items():
        setting = "inference-pool-" + workload.replace("/", "-")
        beyond[setting] = {}
        for policy in POLICIES:
            f = figures[policy]
            spread = f["avg_jct_s_range"]
            assert isinstance(spread, list)
            low, high = float(spread[0]), float(spread[1])
            rows.append(f"| {workload} | {policy} | {float(str(f['avg_jct_s'])) / 3600:.3f} | "
                        f"{low / 3600:.3f}-{high / 3600:.3f} | {f['restarts_per_job']} |")
            beyond[setting][policy] = {k: f[k] for k in ("avg_jct_s", "avg_jct_s_range", "restarts_per_job",
                                                         "by_model")}
    spread_text, spread = _kernel_rows(gate_results, results, shared / RATE)
    return "\n".join(gate_head + table + [""] + verdict + head + rows + [""] + spread_text + model_rows(results)), {
        "gate": gate_summary, "gate_details": gate_details, "beyond": beyond, "kernels": spread, "estimates": ESTIMATES,
        "estimates_note": NO_LENGTHS}
