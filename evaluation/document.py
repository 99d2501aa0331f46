"""Regenerate ``docs/evaluation.md``: ``make evaluation`` (= ``python -m evaluation``).

Runs the simulator (the service's own scheduling core and cycle) on the public traces in
``--shared`` (default ``../shared``) and writes the report, its plots and raw summaries under
``docs/``. Every number in the report is computed by this script in the same run; nothing is typed in
by hand except the Aryl paper's published headline figures, quoted for comparison.

Scenarios (all seeded, deterministic):
1. **Headline** (``evaluation/headline.py``): the busiest 15 days of Philly (by jobs submitted:
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
3. **Pollux workloads** (``pollux``, ``evaluation/pollux.py``): the 8 ``workloads`` traces on 64 GPUs
   (16 x 4), on the Pollux study's own goodput job model (``simulator/goodput_sim.py``): Aryl's tiresias,
   optimus, pollux, sjf and aryl-noloan beside the authors' published results
   (``pollux-data/results-jobload/*-1.0``).
4. **Tenants** (``tenants``, ``evaluation/tenants.py``): two teams' queues with quotas on a Philly sample.
5. **Deadlines** (``deadlines``, ``evaluation/deadlines.py``): deadline completion rates of sjf, qos and
   aryl, with resources short and sufficient, tight and loose deadlines.
6. **DL2** (``dl2``, ``evaluation/dl2.py``): drf, optimus and the learned dl2 after warm-up and after RL.
7. **Loaning + goodput** (``goodput``, ``evaluation/goodput.py``): sjf, pollux, aryl and its ablations
   (aryl-nogoodput, aryl-noloan, aryl-nojoint, aryl-noshrink) on Philly + ServeGen with jobs mapped to the six
   Pollux models, on the first 1, 2 and 7 days, non-clairvoyant, with a clairvoyant row.
8. **Inference** (``inference``, ``evaluation/inference.py``): forecast-aware loaning against the reactive
   loan cycle, the risk-valued loans (``aryl-risk``) and the naive reclaim, on the headline's training side
   with ServeGen and the spiky Alibaba GenAI load, the inference cluster provisioned for each load's peak,
   shortfall against the unclipped need.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evaluation.deadlines import deadlines_section
from evaluation.dl2 import dl2_section
from evaluation.eta import eta_section
from evaluation.goodput import goodput_section
from evaluation.headline_sections import headline_section, lead_text, sensitivity_section
from evaluation.heterogeneity import heterogeneity_section
from evaluation.inference import inference_section
from evaluation.pollux import pollux_section
from evaluation.report import log, process_pool
from evaluation.tenants import tenants_section
from simulator.blas import loaded_core

REPO = Path(__file__).resolve().parent.parent


READING = """
## Reading these results

- Each section says the commit it was computed at: `--only` regenerates some sections and keeps the
  others as they were. Only the papers' figures are quoted. Since 2026-12-02 the stamp also names scipy's
  BLAS kernels, which the simulator pins (`simulator/blas.py`); a section stamped without them ran on its
  machine's own (those before were an Intel Xeon's, SkylakeX), and where its jobs fit step times (the
  goodput and Pollux sections) a rerun on the pinned kernels may differ in the last digits.
- Sections 1-2: the cluster sizes follow the rules of `evaluation/headline.py` (the busy regime from the
  trace's offered load, the inference cluster from a quantile of its demand), fixed before the first run
  and not tuned towards the paper or the project's target. The light-load row keeps the earlier setting
  (640 training GPUs, the inference cluster sized to ServeGen's maximum), where the baseline's own
  queueing is short and ratios of it are large.
- Utilisation is over the arrival window (first to last submission); the figure over the whole run,
  including the multi-day tail of the longest Philly jobs after arrivals stop, is in `summaries.json`
  (`gpu_utilization_to_end`).
- `aryl` vs `aryl-naivereclaim` isolates the reclaim on the same loans: which servers go back, and whether
  a job left below its minimum restarts elsewhere (`aryl`) or is preempted (naive).
- Known gaps: cycles are batched at least 60 s apart (a cycle per event takes ~3x longer to simulate and
  changes average JCT by ~1% on this trace, measured while building the simulator).
"""


# The report's sections, in order: name -> function(shared, assets, earlier raw summaries) -> (markdown, raw).
# A section added by another module registers here with one line. Each section's text sits between
# ``<!-- section:NAME -->`` markers in docs/evaluation.md, so ``--only NAME`` rewrites that section in place
# (and its key in summaries.json) and leaves the others as they are.
Section = Callable[[Path, Path, dict[str, Any]], tuple[str, Any]]
SECTIONS: dict[str, Section] = {
    "headline": headline_section,
    "sensitivity": sensitivity_section,
    "pollux": lambda shared, assets, raw: pollux_section(shared),
    "tenants": tenants_section,
    "deadlines": deadlines_section,
    "dl2": dl2_section,
    "eta": eta_section,  # evaluation/eta.py: the start-time forecast against actual starts
    "goodput": goodput_section,
    "inference": inference_section,  # evaluation/inference.py: does serving notice the loans?
    "heterogeneity": heterogeneity_section,  # evaluation/heterogeneity.py: beyond Sia (needs SIA_REF_GIT)
}


def source_version() -> str:
    """The commit the report is computed at (``+changes`` when the tree differs from it), for each section's
    stamp: ``--only`` regenerates some sections and keeps the others, so each says which code made it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    commit = git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs")
    return commit + ("+changes" if changed else "")


def stamped(text: str, version: str, seconds: float, blas: str | None = None) -> str:
    """A section's text with the line saying where and how fast it was computed, and on which of scipy's BLAS
    kernels (``simulator.blas``: the fits' last bits, and so some policies' choices, depend on them)."""
    kernels = f"; scipy's BLAS kernels: {blas}" if blas else ""
    return (f"{text.rstrip()}\n\n_Computed at `{version}` (`python -m evaluation`; the run took {seconds:.0f} s"
            f"{kernels})._\n")


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


LEAD = "lead"  # the report's opening lines (``evaluation.headline_sections.lead_text``), rewritten with the headline


def splice_lead(doc: str, text: str) -> str:
    """``doc`` with its opening lines replaced (inserted before the first section if absent)."""
    pattern = re.compile(rf"<!-- section:{LEAD} -->\n.*?<!-- /section:{LEAD} -->\n", re.S)
    if pattern.search(doc):
        return pattern.sub(lambda _: marked(LEAD, text), doc)
    title = doc.find("\n\n") + 2 if doc.startswith("# ") else 0  # right under the title
    return doc[:title] + marked(LEAD, text) + "\n" + doc[title:]


HEADLINE_PAIR = ("headline", "sensitivity")


def run_section(name: str, section: Section, shared: Path, assets: Path) -> tuple[str, Any]:
    """One section in a worker process (the function itself is sent: a spawned worker starts from a fresh
    import and sees the registry as the module defines it, not as the caller may have changed it)."""
    log(f"section {name} (worker process)")
    return section(shared, assets, {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation", description=__doc__.splitlines()[0])
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
    with process_pool(min(len(beside), os.cpu_count() or 1)) as pool:
        futures = {name: pool.submit(run_section, name, SECTIONS[name], args.shared, assets) for name in beside}
        for name in wanted:
            if name not in futures:
                log(f"section {name}")
                texts[name], raw[name] = SECTIONS[name](args.shared, assets, raw)
        for name, future in futures.items():
            texts[name], raw[name] = future.result()
    version, took = source_version(), time.perf_counter() - started
    texts = {name: stamped(texts[name], version, took, loaded_core()) for name in wanted}
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
Regenerate with `make evaluation` (= `.venv/bin/python -m evaluation --shared ../shared`);
this run took {time.perf_counter() - started:.0f} s. Raw summaries: `docs/evaluation/summaries.json`.
One section alone: `python -m evaluation --only NAME` (sections: {", ".join(SECTIONS)}).
Metric definitions: `simulator/results.py`. All runs use the same scheduling core and cycle as the
service (`scheduler_service/cycle.py`, `scheduler_service/policies/`), driven by a virtual clock.

""" + "\n".join(marked(name, text) for name, text in texts.items()) + READING
    report.write_text(doc)
    log(f"wrote {report} in {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
