"""Regenerate ``docs/evaluation.md``: ``make evaluation`` (= ``python -m simulator.evaluation``).

Runs the simulator (the service's own scheduling core and cycle) on the public traces in
``--shared`` (default ``../shared``) and writes the report, its plots and raw summaries under
``docs/``. Every number in the report is computed by this script in the same run; nothing is typed in
by hand except the Aryl paper's published headline figures, quoted for comparison.

Scenarios (all seeded, deterministic):
1. **Headline** (``simulator/eval_headline.py``): the busiest 15 days of Philly (by jobs submitted:
   2017-10-10..25, 28,554 jobs) with ServeGen ``m-small`` LLM load on an inference cluster, in a *busy*
   regime sized from the trace (offered load >= 90% of the training capacity, inference sized for the
   maximum of its demand) and, as a second row, the earlier *light* setting. Non-clairvoyant
   (log-normal user estimates) and exact, 3 seeds each. Policies: ``sjf`` (separate clusters: the
   baseline), the elastic peers ``tiresias`` and ``optimus``, ``aryl-noloan``, ``aryl-noelastic``,
   ``aryl`` and ``aryl-naivereclaim``; ``pollux`` on a subset. Its figures also write the report's
   opening lines (``lead``).
2. **Sensitivity**: ``aryl`` vs ``sjf`` in the busy regime under other speed-up models (Amdahl alpha
   0.02-0.2, Pollux's measured profiles). Computed with the headline in one process pool: ``--only
   headline`` regenerates both.
3. **Pollux workloads** (``pollux``): the 8 ``workloads`` traces on 64 GPUs (16 x 4), on the Pollux
   study's own goodput job model (``simulator/goodput_sim.py``): Aryl's tiresias, optimus, pollux, sjf and
   aryl-noloan beside the authors' published results (``pollux-data/results-jobload/*-1.0``).
4. **Tenants** (``tenants``, ``simulator/eval_tenants.py``): two teams' queues with quotas on a Philly sample.
5. **Deadlines** (``deadlines``, ``simulator/eval_deadlines.py``): deadline completion rates of sjf, qos and
   aryl, with resources short and sufficient, tight and loose deadlines.
6. **DL2** (``dl2``, ``simulator/eval_dl2.py``): drf, optimus and the learned dl2 after warm-up and after RL.
7. **Loaning + goodput** (``goodput``, ``simulator/eval_goodput.py``): sjf, pollux, aryl and its ablations
   (aryl-nogoodput, aryl-noloan, aryl-nojoint, aryl-noshrink) on Philly + ServeGen with jobs mapped to the six
   Pollux models, on the first 1, 2 and 7 days, non-clairvoyant, with a clairvoyant row.
8. **Inference** (``inference``, ``simulator/eval_inference.py``): forecast-aware loaning against the reactive
   loan cycle and the naive reclaim, on the headline's training side with ServeGen and the spiky Alibaba GenAI
   load, the inference cluster provisioned for each load's peak, shortfall against the unclipped need.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from simulator.eval_deadlines import deadlines_section
from simulator.eval_dl2 import dl2_section
from simulator.eval_eta import eta_section
from simulator.eval_goodput import goodput_section
from simulator.eval_headline import headline_section, lead_text, sensitivity_section
from simulator.eval_inference import inference_section
from simulator.eval_tenants import tenants_section

REPO = Path(__file__).resolve().parent.parent


READING = """
## Reading these results

- Everything above was computed in one run of this script; only the papers' figures are quoted.
- Sections 1-2: the cluster sizes follow the rules of `simulator/eval_headline.py` (the busy regime from the
  trace's offered load, the inference cluster from a quantile of its demand), fixed before the first run
  and not tuned towards the paper or the project's target. The light-load row keeps the earlier setting
  (640 training GPUs, the inference cluster sized to ServeGen's maximum), where the baseline's own
  queueing is short and ratios of it are large.
- Utilisation is over the arrival window (first to last submission); the figure over the whole run,
  including the multi-day tail of the longest Philly jobs after arrivals stop, is in `summaries.json`
  (`gpu_utilization_to_end`).
- `aryl` vs `aryl-naivereclaim` isolates the reclaim choice on the same loans.
- Known gaps: cycles are batched at least 60 s apart (a cycle per event takes ~3x longer to simulate and
  changes average JCT by ~1% on this trace, measured while building the simulator).
"""


def log(message: str) -> None:
    print(f"[evaluation] {message}", file=sys.stderr, flush=True)


def table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


POLLUX_POLICIES = ("tiresias", "optimus", "pollux", "sjf", "aryl-noloan")


def pollux(shared: Path) -> tuple[str, dict[str, Any]]:
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
  all 8 workloads (`tests/test_pollux_reproduction.py`): mean {gaps["tiresias"]:+.2%} and
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


# The report's sections, in order: name -> function(shared, assets, earlier raw summaries) -> (markdown, raw).
# A section added by another module registers here with one line. Each section's text sits between
# ``<!-- section:NAME -->`` markers in docs/evaluation.md, so ``--only NAME`` rewrites that section in place
# (and its key in summaries.json) and leaves the others as they are.
Section = Callable[[Path, Path, dict[str, Any]], tuple[str, Any]]
SECTIONS: dict[str, Section] = {
    "headline": headline_section,
    "sensitivity": sensitivity_section,
    "pollux": lambda shared, assets, raw: pollux(shared),
    "tenants": tenants_section,
    "deadlines": deadlines_section,
    "dl2": dl2_section,
    "eta": eta_section,  # simulator/eval_eta.py: the start-time forecast against actual starts
    "goodput": goodput_section,
    "inference": inference_section,  # simulator/eval_inference.py: does serving notice the loans?
}


def marked(name: str, text: str) -> str:
    return f"<!-- section:{name} -->\n{text.rstrip()}\n<!-- /section:{name} -->\n"


def splice(doc: str, name: str, text: str) -> str:
    """``doc`` with section ``name`` replaced by ``text`` (appended before the closing notes if absent)."""
    pattern = re.compile(rf"<!-- section:{re.escape(name)} -->\n.*?<!-- /section:{re.escape(name)} -->\n", re.S)
    if pattern.search(doc):
        return pattern.sub(lambda _: marked(name, text), doc)
    anchor = doc.find(READING.strip().splitlines()[0])
    if anchor < 0:
        return doc.rstrip() + "\n\n" + marked(name, text)
    return doc[:anchor] + marked(name, text) + "\n" + doc[anchor:]


LEAD = "lead"  # the report's opening lines (``eval_headline.lead_text``), rewritten with the headline


def splice_lead(doc: str, text: str) -> str:
    """``doc`` with its opening lines replaced (inserted before the first section if absent)."""
    pattern = re.compile(rf"<!-- section:{LEAD} -->\n.*?<!-- /section:{LEAD} -->\n", re.S)
    if pattern.search(doc):
        return pattern.sub(lambda _: marked(LEAD, text), doc)
    title = doc.find("\n\n") + 2 if doc.startswith("# ") else 0  # right under the title
    return doc[:title] + marked(LEAD, text) + "\n" + doc[title:]


HEADLINE_PAIR = ("headline", "sensitivity")


def run_section(name: str, shared: Path, assets: Path) -> tuple[str, Any]:
    """One section in a worker process (by name: the registry is rebuilt there on import)."""
    log(f"section {name} (worker process)")
    return SECTIONS[name](shared, assets, {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.evaluation", description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=REPO.parent / "shared", help="the public data folder")
    parser.add_argument("--out", type=Path, default=REPO / "docs", help="where evaluation.md goes")
    parser.add_argument("--only", choices=tuple(SECTIONS), action="append",
                        help="regenerate only this section (repeatable), in place in an existing report")
    args = parser.parse_args(argv)
    assets = args.out / "evaluation"
    assets.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    report, summaries_path = args.out / "evaluation.md", assets / "summaries.json"
    partial = bool(args.only) and report.exists()
    chosen = set(args.only or SECTIONS)
    if "headline" in chosen:  # the two share one process pool: the headline's runs feed both
        chosen.add("sensitivity")
    wanted = [name for name in SECTIONS if name in chosen]
    raw: dict[str, Any] = json.loads(summaries_path.read_text()) if partial and summaries_path.exists() else {}
    texts: dict[str, str] = {}
    # With the headline, the other sections run in worker processes beside its pool (each section is
    # independent of the others' figures), so the whole report takes about its CPU time over the cores.
    beside = [n for n in wanted if n not in HEADLINE_PAIR] if "headline" in wanted else []
    with ProcessPoolExecutor(max_workers=max(1, min(len(beside), os.cpu_count() or 1))) as pool:
        futures = {name: pool.submit(run_section, name, args.shared, assets) for name in beside}
        for name in wanted:
            if name not in futures:
                log(f"section {name}")
                texts[name], raw[name] = SECTIONS[name](args.shared, assets, raw)
        for name, future in futures.items():
            texts[name], raw[name] = future.result()
    texts = {name: texts[name] for name in wanted}
    if partial and summaries_path.exists():
        # Re-read: another section may have been rewritten meanwhile (runs take minutes); keep its figures.
        raw = {**json.loads(summaries_path.read_text()), **{name: raw[name] for name in texts}}
    summaries_path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    lead = lead_text(raw["headline"]) if "headline" in texts else None
    if partial:
        doc = report.read_text()
        for name, text in texts.items():
            doc = splice(doc, name, text)
        if lead is not None:
            doc = splice_lead(doc, lead)
    else:
        opening = marked(LEAD, lead) + "\n" if lead else ""
        doc = "# Evaluation\n\n" + opening + f"""\
Regenerate with `make evaluation` (= `.venv/bin/python -m simulator.evaluation --shared ../shared`);
this run took {time.perf_counter() - started:.0f} s. Raw summaries: `docs/evaluation/summaries.json`.
One section alone: `python -m simulator.evaluation --only NAME` (sections: {", ".join(SECTIONS)}).
Metric definitions: `simulator/results.py`. All runs use the same scheduling core and cycle as the
service (`scheduler_service/cycle.py`, `scheduler_service/policies/`), driven by a virtual clock.

""" + "\n".join(marked(name, text) for name, text in texts.items()) + READING
    report.write_text(doc)
    log(f"wrote {report} in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
