"""Regenerate ``docs/evaluation.md``: ``make evaluation`` (= ``python -m simulator.evaluation``).

Runs the simulator (the service's own scheduling core and cycle) on the public traces in
``--shared`` (default ``../shared``) and writes the report, its plots and raw summaries under
``docs/``. Every number in the report is computed by this script in the same run; nothing is typed in
by hand except the Aryl paper's published headline figures, quoted for comparison.

Scenarios (all seeded, deterministic):
1. **Headline**: the busiest 15 days of Philly (by jobs submitted: 2017-10-10..25, 28,554 jobs) on a
   training cluster, with ServeGen ``m-small`` LLM load scaled to an inference cluster. Policies:
   ``sjf`` (separate clusters: the baseline), ``aryl-noloan``, ``aryl-noelastic``, ``aryl``, and
   ``aryl-naivereclaim`` (reclaim most-recently-loaned first) for the reclaim comparison.
2. **Sensitivity**: ``aryl`` vs ``sjf`` with the inference cluster two steps smaller and larger
   (20, 30, 50, 60 servers; headline 40), and the share of elastic jobs two steps lower and higher
   (0%, 25%, 75%, 100%; headline 50%).
3. **Pollux workloads** (``pollux``): the 8 ``workloads`` traces on 64 GPUs (16 x 4), on the Pollux
   study's own goodput job model (``simulator/goodput_sim.py``): Aryl's tiresias, optimus, pollux, sjf and
   aryl-noloan beside the authors' published results (``pollux-data/results-jobload/*-1.0``).
4. **Tenants** (``tenants``, ``simulator/eval_tenants.py``): two teams' queues with quotas on a Philly sample.
5. **Deadlines** (``deadlines``, ``simulator/eval_deadlines.py``): deadline completion rates of sjf, qos and
   aryl, with resources short and sufficient, tight and loose deadlines.
6. **DL2** (``dl2``, ``simulator/eval_dl2.py``): drf, optimus and the learned dl2 after warm-up and after RL.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from scheduler_service.core.params import PolicyParams
from simulator.engine import SimulationResult, simulate
from simulator.eval_deadlines import deadlines_section
from simulator.eval_dl2 import dl2_section
from simulator.eval_tenants import tenants_section
from simulator.load import demand_from_rate, load_servegen_rate
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.results import Summary, plot_jct_cdf, plot_loans, plot_utilisation, summarize
from simulator.traces import JobMapping, load_philly

REPO = Path(__file__).resolve().parent.parent
PAPER = {"queue_reduction": 1.53, "jct_reduction": 1.50, "usage_gain_pct": 26.9}


@dataclass(frozen=True)
class Setup:
    training_servers: int = 80        # 640 GPUs: the 15-day window keeps ~586 GPUs busy on average
    inference_servers: int = 40       # 320 GPUs, sized so ServeGen's peak needs all of them
    gpus_per_server: int = 8
    elastic_share: float = 0.5
    max_scale: int = 4
    throughput_model: str = "amdahl"
    headroom: float = 0.2
    seed: int = 0


SETUP = Setup()
HEADLINE_POLICIES = ("sjf", "aryl-noloan", "aryl-noelastic", "aryl", "aryl-naivereclaim")
PARAMS = PolicyParams()
# Cycles at least 60 s apart (events in between are batched into the next cycle), like the Pollux
# simulator's 60 s scheduling interval; at 0 (a cycle per event: ~61k cycles instead of ~22k) one aryl
# run of 15 days takes about 3x longer (benchmarks/bench_sim.py measures both).
CYCLE_GAP_S = 60.0
# The sensitivity steps (section 2): one setting varied at a time, the others as in SETUP.
INFERENCE_STEPS = (20, 30, 50, 60)
ELASTIC_STEPS = (0.0, 0.25, 0.75, 1.0)


READING = """
## Reading these results

- Everything above was computed in one run of this script; only the paper's figures are quoted.
- The queueing-time reduction is far larger than the paper's because, with 640 training GPUs, the
  baseline's own queueing is short (minutes on average); the JCT reduction, which counts run time too,
  lands near the paper's. The cluster sizes were chosen once (training: a little above the window's
  average GPU demand; inference: ServeGen's peak needs all of it) and not tuned towards the paper.
- Utilisation is integrated up to the last completion, which includes the multi-day tail of the
  longest Philly jobs after arrivals stop, so all utilisation figures are low in absolute terms; the
  gain is the comparison that matters.
- `aryl` vs `aryl-naivereclaim` isolates the reclaim choice: the greedy preempts fewer jobs and loses
  fewer GPU-hours on the same loans.
- Known gaps: the sensitivity study varies one setting at a time, two steps each way; cycles are
  batched at least 60 s apart (a cycle per event takes ~3x longer to simulate and changes average JCT
  by ~1% on this trace, measured while building the simulator).
"""


def log(message: str) -> None:
    print(f"[evaluation] {message}", file=sys.stderr, flush=True)


def philly_inputs(shared: Path, setup: Setup) -> tuple[list[TraceJob], list[DemandPoint]]:
    mapping = JobMapping(seed=setup.seed, elastic_share=setup.elastic_share, max_scale=setup.max_scale,
                         throughput_model=setup.throughput_model, gpus_per_server=setup.gpus_per_server)
    jobs = load_philly(shared / "traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz", mapping=mapping,
                       profiles_dir=shared / "traces/pollux-throughput-profiles")
    span = max(j.submit_time for j in jobs) + 10 * 86400.0
    rate = load_servegen_rate(shared / "traces/servegen-llm-load/servegen_total_rate_10min.csv", model="m-small")
    demand = demand_from_rate(rate, inference_servers=setup.inference_servers, headroom=setup.headroom,
                              duration_s=span)
    return jobs, demand


def run(jobs: list[TraceJob], demand: list[DemandPoint], setup: Setup, policy: str) -> SimulationResult:
    started = time.perf_counter()
    spec = ClusterSpec(setup.training_servers, setup.inference_servers, setup.gpus_per_server)
    result = simulate(jobs, demand, spec, policy, PARAMS, seed=setup.seed, min_cycle_gap_s=CYCLE_GAP_S)
    log(f"{policy}: {len(jobs)} jobs, {result.cycles} cycles, {result.stop_reason}, "
        f"{time.perf_counter() - started:.0f}s")
    return result


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "n/a"


def fmt_h(seconds: float | None) -> str:
    return f"{seconds / 3600:.2f} h" if seconds is not None else "n/a"


def table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def headline(shared: Path, assets: Path) -> tuple[str, dict[str, Summary]]:
    jobs, demand = philly_inputs(shared, SETUP)
    results = {name: run(jobs, demand, SETUP, name) for name in HEADLINE_POLICIES}
    summaries = {name: summarize(r) for name, r in results.items()}
    plotted = [results[n] for n in ("sjf", "aryl-noloan", "aryl-noelastic", "aryl")]
    plot_jct_cdf(plotted, assets / "philly_jct_cdf.png")
    plot_utilisation([results["sjf"], results["aryl"]], assets / "philly_utilization.png")
    plot_loans([results["aryl"]], assets / "philly_loans.png")
    base, aryl = summaries["sjf"], summaries["aryl"]

    def util(summary: Summary, kind: str) -> float:
        return summary["gpu_utilization"][kind]

    rows = [
        [name, fmt_h(s["avg_jct_s"]), fmt_h(s["median_jct_s"]), fmt_h(s["p95_jct_s"]), fmt_h(s["avg_queue_s"]),
         f"{util(s, 'training'):.1%}", f"{util(s, 'inference'):.1%}", f"{util(s, 'overall'):.1%}",
         str(s["loans"]), str(s["reclaims"]), str(s["preemptions"]), str(s["scale_ins"]),
         f"{s['gpu_hours_lost']:.0f}", f"{s['jobs_completed']}/{s['jobs_total']}"]
        for name, s in summaries.items()
    ]
    header = ["policy", "avg JCT", "median JCT", "p95 JCT", "avg queue", "util train", "util infer",
              "util overall", "loans", "reclaims", "preemptions", "scale-ins", "GPU-h lost", "completed"]
    usage_gain = (util(aryl, "overall") - util(base, "overall")) / util(base, "overall") * 100
    naive = summaries["aryl-naivereclaim"]
    text = f"""## 1. Headline: Philly (15 busiest days) + ServeGen m-small

**Setup.** {len(jobs):,} jobs from `traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz` (the
15 busiest days by jobs submitted, 2017-10-10..25). Training cluster: {SETUP.training_servers} servers x
{SETUP.gpus_per_server} GPUs = {SETUP.training_servers * SETUP.gpus_per_server} GPUs. Inference cluster:
{SETUP.inference_servers} servers x {SETUP.gpus_per_server} GPUs; its demand is ServeGen `m-small`'s total
request rate (10-minute windows, repeated daily over the run, gaps interpolated) turned into servers
needed with {SETUP.headroom:.0%} headroom, the per-server capacity chosen so that the trace's peak needs
the whole inference cluster. Job mapping (`simulator/traces.py`): gang shape from `num_gpus` (up to 8
GPUs = one worker, larger = the fewest equal workers of at most 8), {SETUP.elastic_share:.0%} of jobs
elastic (seeded hash per job) with `max_workers = {SETUP.max_scale} x min_workers` (at most 64 GPUs),
speed-up by Amdahl's law (alpha = {PARAMS.amdahl_alpha}), work = the traced duration at the traced size.
Simulator: restart/resize overhead 30 s, checkpoints every 30 min (preemption loses work since the last
one), cycles on events but at least {CYCLE_GAP_S:.0f} s apart (events in between are batched), and at
least every 300 s. A loan's drain is acknowledged {results['aryl'].settings['drain_ack_s']:g} s after it begins
(the simulated router: its in-flight requests finish; `drain_ack_s`); no server failures are injected.
Policy tunables: the defaults of `scheduler_service/core/params.py`. Seed {SETUP.seed}. Plan actions
the applier refused in these runs: {sum(r.rejected_actions for r in results.values())} (a valid plan is
never refused; `simulator/engine.py`).

{table(rows, header)}

**Against the paper's headline** (ratios of `sjf`, the separate-clusters baseline, to `aryl`):

| metric | paper (Aryl, EuroSys'23) | measured here |
|---|---|---|
| average queuing time reduction | {PAPER['queue_reduction']}x | {ratio(base['avg_queue_s'], aryl['avg_queue_s'])} |
| average JCT reduction | {PAPER['jct_reduction']}x | {ratio(base['avg_jct_s'], aryl['avg_jct_s'])} |
| cluster usage gain (overall GPU utilisation) | up to {PAPER['usage_gain_pct']}% | {usage_gain:+.1f}% |
| preemptions | -- | {aryl['preemptions']} (sjf: {base['preemptions']}) |

**Reclaim: greedy on preemption cost vs naive (most recently loaned first)**, same runs otherwise:
preemptions {aryl['preemptions']} vs {naive['preemptions']}, GPU-hours lost {aryl['gpu_hours_lost']:.0f}
vs {naive['gpu_hours_lost']:.0f}, scale-ins {aryl['scale_ins']} vs {naive['scale_ins']}, average JCT
{fmt_h(aryl['avg_jct_s'])} vs {fmt_h(naive['avg_jct_s'])}.

![JCT CDF](evaluation/philly_jct_cdf.png)
![Utilisation](evaluation/philly_utilization.png)
![Loans vs demand](evaluation/philly_loans.png)
"""
    return text, summaries


def sensitivity(shared: Path, headline_summaries: dict[str, Summary] | None
                ) -> tuple[str, dict[str, dict[str, Summary]]]:
    rows: list[list[str]] = []
    raw: dict[str, dict[str, Summary]] = {}
    variants = [("inference servers", replace(SETUP, inference_servers=n)) for n in INFERENCE_STEPS]
    variants += [("elastic share", replace(SETUP, elastic_share=share)) for share in ELASTIC_STEPS]
    if headline_summaries:
        variants.insert(0, ("headline setup", SETUP))
    for label, setup in variants:
        if setup is SETUP and headline_summaries:
            summaries = {p: headline_summaries[p] for p in ("sjf", "aryl")}
        else:
            jobs, demand = philly_inputs(shared, setup)
            # sjf uses neither the inference cluster nor elasticity, so these variants cannot change it:
            # the headline run stands for it (it is re-run only when the headline was not).
            sjf = headline_summaries["sjf"] if headline_summaries else summarize(run(jobs, demand, setup, "sjf"))
            summaries = {"sjf": sjf, "aryl": summarize(run(jobs, demand, setup, "aryl"))}
        key = f"{label}: inference={setup.inference_servers}, elastic={setup.elastic_share}"
        raw[key] = summaries
        base, aryl = summaries["sjf"], summaries["aryl"]
        rows.append([label, str(setup.inference_servers), f"{setup.elastic_share:.0%}",
                     ratio(base["avg_queue_s"], aryl["avg_queue_s"]), ratio(base["avg_jct_s"], aryl["avg_jct_s"]),
                     f"{aryl['gpu_utilization']['overall']:.1%} vs {base['gpu_utilization']['overall']:.1%}",
                     str(aryl["loans"]), str(aryl["preemptions"])])
    header = ["varied", "inference servers", "elastic share", "queue reduction", "JCT reduction",
              "overall util (aryl vs sjf)", "loans", "preemptions"]
    return "## 2. Sensitivity (aryl vs sjf, Philly 15 days)\n\n" + table(rows, header) + "\n", raw


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
  (`SnapshotDecider`): gangs of the requested GPUs, `aryl-noloan` elastic up to 16x its request (within
  its batch); both at the requested batch size, with the oracle's throughput and remaining work as
  declared points and work (as Optimus+Oracle gets). Neither adapts batch sizes, which is most of what
  Pollux gains.
"""
    return text, {"ours": ours, "theirs": theirs}


# The report's sections, in order: name -> function(shared, assets, earlier raw summaries) -> (markdown, raw).
# A section added by another module registers here with one line. Each section's text sits between
# ``<!-- section:NAME -->`` markers in docs/evaluation.md, so ``--only NAME`` rewrites that section in place
# (and its key in summaries.json) and leaves the others as they are.
Section = Callable[[Path, Path, dict[str, Any]], tuple[str, Any]]
SECTIONS: dict[str, Section] = {
    "headline": lambda shared, assets, raw: headline(shared, assets),
    "sensitivity": lambda shared, assets, raw: sensitivity(shared, raw.get("headline")),
    "pollux": lambda shared, assets, raw: pollux(shared),
    "tenants": tenants_section,
    "deadlines": deadlines_section,
    "dl2": dl2_section,
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
    wanted = [name for name in SECTIONS if name in set(args.only or SECTIONS)]
    raw: dict[str, Any] = json.loads(summaries_path.read_text()) if partial and summaries_path.exists() else {}
    texts: dict[str, str] = {}
    for name in wanted:
        log(f"section {name}")
        texts[name], raw[name] = SECTIONS[name](args.shared, assets, raw)
    summaries_path.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    if partial:
        doc = report.read_text()
        for name, text in texts.items():
            doc = splice(doc, name, text)
    else:
        doc = f"""# Evaluation

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
