"""The heterogeneity section (issue 33): beyond Sia, ``aryl`` lending an inference pool of another GPU type to
training, against ``sia``, ``gavel`` and ``aryl-noloan`` (``simulator.hetero_inference``'s module doc states
the setting and what each policy is told).

It needs the Sia authors' artifact (no licence: read at run time from ``SIA_REF_GIT``, never stored here);
without it the section says how to get it and run it. Summaries: ``heterogeneity.beyond.<setting>.<policy>``
= ``{"avg_jct_s", "avg_jct_s_range", "restarts_per_job", "seeds"}``, ``<setting>`` being
``inference-pool-<set>-<workload>``. Must never: copy any of the artifact into the report's assets.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from evaluation.report import log
from simulator.hetero_gate import ARTIFACT_COMMIT, DEFAULT_WORKLOADS
from simulator.hetero_inference import ESTIMATES, HOW_TO_RUN, INFERENCE, POLICIES, SEEDS, TRAINING, run_beyond

RATE = "traces/servegen-llm-load/servegen_total_rate_10min.csv"   # under --shared


def _pools(pools: tuple[Any, ...]) -> str:
    return " + ".join(f"{p.nodes} x {p.gpus_per_node} {p.gpu_type}" for p in pools)


def heterogeneity_section(shared: Path, assets: Path, raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The section (evaluation.document's registry): its markdown and summaries."""
    head = ["## Heterogeneity: beyond Sia", "",
            f"Training on {_pools(TRAINING)} GPUs; an inference pool of {_pools((INFERENCE,))} (T4) serving "
            "ServeGen `m-small` (its maximum needs the whole pool with 20% headroom), which `aryl` may lend to "
            "training (a job on a T4 runs at the T4's speed by its profile). `sia`, `gavel` and `aryl-noloan` "
            f"do not lend. `aryl`'s jobs declare user estimates (`{ESTIMATES}`, seeds {list(SEEDS)}); `aryl` and "
            "`aryl-noloan` are "
            "told each type's declared speed and each job's measured speed per type it ran on, as the live service "
            "tells it (`simulator.hetero`'s module doc), and values a worker by its job's speed on the server's type; "
            "`sia` and "
            "`gavel` are told what their jobs measure, no length, so one run each stands for every seed. "
            "The Sia study's workloads and per-type profiles, read at run time (`simulator/hetero_inference.py`).",
            ""]
    git_dir = os.environ.get("SIA_REF_GIT")
    if not git_dir:
        how = HOW_TO_RUN.format(commit=ARTIFACT_COMMIT)
        text = "\n".join(head + ["Not run here: " + how.splitlines()[0], "", "```sh", *how.splitlines()[1:-1],
                                 "SIA_REF_GIT=/tmp/sia-artifacts.git python -m evaluation --only heterogeneity",
                                 "```", "", how.splitlines()[-1]])
        return text, {"beyond": {}, "needs": "SIA_REF_GIT"}
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
            beyond[setting][policy] = {k: f[k] for k in ("avg_jct_s", "avg_jct_s_range", "restarts_per_job")}
    return "\n".join(head + rows), {"beyond": beyond}
