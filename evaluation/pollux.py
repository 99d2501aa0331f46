"""The "pollux" section of ``docs/evaluation.md`` (``python -m evaluation --only pollux``): the Pollux study's
8 workloads on its own goodput job model (``simulator.goodput_sim``), Aryl's policies beside the authors'
published results (``pollux-data/results-jobload``).

Must never: change a policy or the job model to move a figure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evaluation.report import table

POLLUX_POLICIES = ("tiresias", "optimus", "pollux", "sjf", "aryl-noloan")


def pollux_section(shared: Path) -> tuple[str, dict[str, Any]]:
    """Section 3: Pollux's 8 workloads on the goodput job model, Aryl's policies beside the authors'."""
    from simulator.goodput_sim import load_workload, run_workload  # scipy: only this section needs it

    data = shared / "pollux-data"
    ours: dict[str, dict[str, float]] = {p: {} for p in POLLUX_POLICIES}
    for n in range(1, 9):
        w = f"workload-{n}"
        workload = load_workload(data / "workloads" / f"{w}.csv")
        for policy in POLLUX_POLICIES:
            result = run_workload(workload, data / "traces", policy, nodes=16, gpus_per_node=4, interval_s=60.0)
            ours[policy][w] = round(result.average_jct, 1)
    theirs = {p: json.loads((data / "results-jobload" / f"{p}-1.0" / "summary.json").read_text())["avgs"]
              for p in ("tiresias", "optimus", "pollux")}
    workloads = [f"workload-{n}" for n in range(1, 9)]

    def mean(values: dict[str, float]) -> float:
        return sum(values[w] for w in workloads) / len(workloads)

    def cell(value: float) -> str:
        return f"{value:,.0f} s"

    header = ["workload", *(f"{p} (Aryl)" for p in POLLUX_POLICIES), *(f"{p} (authors)" for p in theirs)]
    rows = [[w, *(cell(ours[p][w]) for p in POLLUX_POLICIES), *(cell(theirs[p][w]) for p in theirs)]
            for w in workloads]
    rows.append(["mean", *(cell(mean(ours[p])) for p in POLLUX_POLICIES), *(cell(mean(theirs[p])) for p in theirs)])
    gaps = {p: mean(ours[p]) / mean(theirs[p]) - 1.0 for p in theirs}
    text = f"""## 3. Pollux's 8 workloads on 64 GPUs, on Pollux's own job model

Every row on the same job model: the goodput model of the Pollux study (OSDI'21, section 5.3) as
`aryl-sim --job-model goodput` runs it (`simulator/goodput_sim.py`: each job's step time and gradient
statistics from the authors' measured profiles, statistical efficiency, progress to the authors' epoch
targets, 30 s per re-allocation), on `pollux-data/workloads/workload-1..8.csv` (160 jobs each, arrivals
within 8 hours, the tuned requests the authors' baselines use), 16 nodes x 4 GPUs, a decision every 60 s.
Average JCT per workload, Aryl's policies and the authors' published results
(`results-jobload/*-1.0/summary.json`):

{table(rows, header)}

- `tiresias` and `optimus` (the authors' Optimus+Oracle) reproduce the authors' results job for job on
  all 8 workloads (`tests/simulator/test_pollux_reproduction.py`): mean {gaps["tiresias"]:+.2%} and
  {gaps["optimus"]:+.2%}.
- `pollux` (`scheduler_service/policies/pollux.py`): the authors' objective (power mean, p = -1, of
  goodput speed-ups over a fair share, the re-allocation penalty) optimised exactly over GPU counts by a
  knapsack instead of their genetic algorithm; mean {gaps["pollux"]:+.2%} against theirs. A workload-6
  run took 14-38 s of wall time on this shared 2-core machine (the authors' simulator: 27-28 min,
  `reference/pollux-simulator/README.md`; `make bench`, `pollux`, times both on the same intervals in one
  run).
- `sjf` and `aryl-noloan` are Aryl's registered policies deciding on snapshots of the simulated jobs
  through the scheduler's own cycle (`simulator/goodput_policies.py`): gangs of the requested GPUs,
  `aryl-noloan` elastic up to 16x its request (within its batch); both at the requested batch size, with
  the oracle's throughput and remaining work as declared points and work (as Optimus+Oracle gets).
  Neither adapts batch sizes, which is most of what Pollux gains.
"""
    return text, {"ours": ours, "theirs": theirs}
