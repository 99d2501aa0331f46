"""Sections 1-2 of ``docs/evaluation.md`` (``headline``, ``sensitivity``): the sizing rules, the runs (a
process pool over the machine's cores) and the seed aggregation. Their text, and the report's opening
lines, are ``evaluation.headline_sections``'s.

The setup, fixed before the first run of the busy regime and not changed after (nothing here is tuned
toward a figure; the issue's targets are compared against, never aimed at):

- **Trace**: the busiest 15 days of Philly (``philly_jobs_15d_2017-10-10``), mapped by ``JobMapping``:
  half the jobs elastic up to 4x their traced size (keyed draw per job), speed-ups by Amdahl's law with
  ``alpha = 0.05``, work = the traced run time at the traced size.
- **Offered load** (``offered_load``): the GPU demand if every job started when submitted and ran at its
  traced size, averaged over the arrival window (first to last submission); a job still running at the
  window's end counts only its part inside it.
- **Busy regime** (the headline, ``busy_regime``): the training cluster has the most 8-GPU servers that
  the offered load still fills to ``BUSY_LOAD`` (90%) or more: ``floor(offered / (0.9 x 8))``. The
  inference cluster keeps today's ratio to it (``INFERENCE_PER_TRAINING``: 40 to 80, one inference server
  per two training servers), and its demand is ServeGen ``m-small``'s request rate scaled so that the
  rate's ``DEMAND_QUANTILE`` (1.0: its maximum) needs the whole inference cluster with 20% headroom
  (``simulator.load.demand_from_rate``'s ``peak_quantile``): the cluster is provisioned for its peak, as a
  separate inference cluster is. (Until issue 31 it was the 0.99 quantile, with the rarer spikes clipped to
  the cluster and counted in no shortfall; the shortfall is now counted against the unclipped need, and at
  the 0.99 quantile 2.4% of the trace's requests arrive in the 1% of its windows above it, when even the
  whole cluster is too small: a floor under every policy.) The loanable capacity this leaves
  (``loanable_gpus``: inference GPUs not needed, averaged over the arrival window) is reported as a
  share of the training capacity.
- **Light regime** (today's setting before this sizing, kept as a second row): 80 training servers, 40
  inference servers, the rate's maximum needing the whole inference cluster.
- **Estimates**: the headline is non-clairvoyant: policies see a user's run-time estimate, the truth
  times ``exp(0.8 z)``, z standard normal per job (``simulator.estimates``, ``lognormal:0.8``); the
  clairvoyant runs (``exact``) are reported beside it.
- **Seeds** (``SEEDS``): a seed changes the elastic draw of every job (which jobs are elastic), the
  estimate errors, the model draw of the ``pollux-gputime`` mapping, and the snapshots' seed handed to
  the policies. With exact estimates and Amdahl's law, ``sjf`` sees nothing a seed changes.
- **Peers**: ``tiresias`` and ``pollux`` (no loaning) on the whole trace (``pollux`` since its knapsack
  moved to the exact MCKP solver ``aryl`` uses); ``optimus`` is too slow on the whole trace's clusters for
  the report's budget, so all peers also run, beside ``sjf`` and ``aryl``, on the trace's first
  ``PEER_SUBSET_JOBS`` jobs, on clusters sized by the same busy rule from that subset's own offered load.
  No peer loans (the inference servers stay with inference); all see the same estimates.
- **Budget** (``Plan``): every seed for the headline pair (estimated and exact), ``aryl-noloan``,
  ``tiresias``, ``pollux`` and the subset's runs; seed 0 only for the other ablations, the light-load row and the
  sensitivity rows.

Runs are independent and go to a process pool (``run_all``); every figure is a function of its
``RunSpec`` alone, so the pool's order does not change any number.

Must never: decide anything, or pick a cluster size by looking at a policy's result.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.report import gain_spread, log, lookup, process_pool, ratio_spread, spread
from scheduler_service.core.params import PolicyParams
from simulator.engine import SimulationResult, simulate
from simulator.load import demand_from_rate, load_servegen_rate
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.results import summarize
from simulator.traces import JobMapping, load_philly

GPUS_PER_SERVER = 8
BUSY_LOAD = 0.9                 # offered in-window load / training capacity, at least
INFERENCE_PER_TRAINING = 0.5    # inference servers per training server (today's 40:80)
DEMAND_QUANTILE = 1.0           # the rate quantile that needs the whole inference cluster: its maximum
HEADROOM = 0.2
SEEDS = (0, 1, 2)
ESTIMATED = "lognormal:0.8"
EXACT = "exact"
CYCLE_GAP_S = 60.0              # cycles at least 60 s apart, as before (see evaluation.py)
TAIL_S = 10 * 86400.0           # inference demand laid this long past the last arrival
ALPHAS = (0.02, 0.05, 0.1, 0.2)
SCALING_MODELS = tuple(("amdahl", a) for a in ALPHAS) + (("pollux-gputime", 0.05),)
PEER_SUBSET_JOBS = 5000
EXACT_POLICIES = ("sjf", "aryl")
# The metrics aggregated over seeds (dotted paths into a ``Summary``).
METRICS = ("avg_queue_s", "median_queue_s", "p95_queue_s", "p99_queue_s", "avg_jct_s", "median_jct_s",
           "p95_jct_s", "p99_jct_s", "gpu_utilization.overall", "gpu_utilization.training",
           "gpu_utilization.inference", "gpu_utilization_to_end.overall", "useful_utilization.overall",
           "useful_work.useful_gpu_hours", "useful_work.allocated_gpu_hours", "useful_work.useful_fraction",
           "inference_shortfall.server_s", "inference_shortfall.time_s",
           "inference_shortfall.requests_short_share", "inference_shortfall.requests_unserved_share",
           "inference_shortfall.requests_beyond_cluster_share", "inference_shortfall_window.requests_short_share",
           "loans", "reclaims", "preemptions",
           "reclaim_preemptions", "preemptions_per_reclaim", "scale_ins",
           "gpu_hours_lost", "jobs_completed", "jobs_total")


# -- inputs and sizing ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """The files a run reads (outside the repository) and how much of the trace it takes."""

    trace: Path
    rate: Path
    profiles: Path
    limit: int | None = None       # the first N jobs only (tests, development)

    @classmethod
    def from_shared(cls, shared: Path, limit: int | None = None) -> Inputs:
        return cls(shared / "traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz",
                   shared / "traces/servegen-llm-load/servegen_total_rate_10min.csv",
                   shared / "traces/pollux-throughput-profiles", limit)


@dataclass(frozen=True)
class Regime:
    """A pair of clusters: training and inference servers, and the rate quantile that needs the whole
    inference cluster (1.0: the maximum)."""

    name: str
    training_servers: int
    inference_servers: int
    peak_quantile: float


LIGHT = Regime("light", 80, 40, 1.0)


@dataclass(frozen=True)
class RunSpec:
    """One simulation: everything a figure depends on."""

    regime: Regime
    policy: str
    seed: int
    estimates: str = ESTIMATED
    throughput_model: str = "amdahl"
    amdahl_alpha: float = 0.05
    elastic_share: float = 0.5
    limit: int | None = None       # the first N jobs (the peers' subset), within Inputs.limit
    keep: bool = False             # return the SimulationResult too (for the plots)


@lru_cache(maxsize=16)
def load_jobs(inputs: Inputs, seed: int, throughput_model: str = "amdahl", amdahl_alpha: float = 0.05,
              elastic_share: float = 0.5, limit: int | None = None) -> tuple[TraceJob, ...]:
    mapping = JobMapping(seed=seed, elastic_share=elastic_share, max_scale=4, throughput_model=throughput_model,
                         amdahl_alpha=amdahl_alpha, gpus_per_server=GPUS_PER_SERVER)
    cut = min(x for x in (inputs.limit, limit) if x is not None) if (inputs.limit or limit) else None
    return tuple(load_philly(inputs.trace, mapping=mapping, profiles_dir=inputs.profiles, limit=cut))


@lru_cache(maxsize=2)
def load_rate(path: Path) -> tuple[tuple[float, float], ...]:
    return tuple(load_servegen_rate(path, model="m-small"))


def arrival_span(jobs: Sequence[TraceJob]) -> tuple[float, float]:
    return min(j.submit_time for j in jobs), max(j.submit_time for j in jobs)


def offered_load(jobs: Sequence[TraceJob]) -> float:
    """GPUs busy on average over the arrival window if every job started when submitted and ran at its
    traced size (the part of each job inside the window)."""
    start, end = arrival_span(jobs)
    if end <= start:
        return 0.0
    gpu_s = 0.0
    for j in jobs:
        run_s = j.runtime_at(j.min_workers)
        gpu_s += j.min_workers * j.gpus_per_worker * max(0.0, min(j.submit_time + run_s, end) - j.submit_time)
    return gpu_s / (end - start)


def busy_regime(jobs: Sequence[TraceJob]) -> Regime:
    """The headline's clusters (module doc): the most training servers the offered load still fills to
    BUSY_LOAD, and INFERENCE_PER_TRAINING inference servers per training server."""
    training = max(1, math.floor(offered_load(jobs) / (BUSY_LOAD * GPUS_PER_SERVER)))
    return Regime("busy", training, max(1, round(training * INFERENCE_PER_TRAINING)), DEMAND_QUANTILE)


def demand_for(inputs: Inputs, regime: Regime, jobs: Sequence[TraceJob]) -> list[DemandPoint]:
    return demand_from_rate(list(load_rate(inputs.rate)), inference_servers=regime.inference_servers,
                            headroom=HEADROOM, peak_quantile=regime.peak_quantile,
                            duration_s=arrival_span(jobs)[1] + TAIL_S)


def loanable_gpus(demand: Sequence[DemandPoint], regime: Regime, window: tuple[float, float]) -> float:
    """Inference GPUs not needed, averaged over ``window`` (the demand is a step function)."""
    start, end = window
    if end <= start or not demand:
        return 0.0
    times = np.array([p.time for p in demand] + [math.inf])
    spare = np.array([regime.inference_servers - p.servers_needed for p in demand], dtype=float)
    held = np.clip(np.minimum(times[1:], end) - np.maximum(times[:-1], start), 0.0, None)
    return float(np.dot(spare, held)) * GPUS_PER_SERVER / (end - start)


def describe_regime(inputs: Inputs, regime: Regime, limit: int | None = None) -> dict[str, float | int | str]:
    jobs = load_jobs(inputs, SEEDS[0], limit=limit)
    window = arrival_span(jobs)
    training_gpus = regime.training_servers * GPUS_PER_SERVER
    offered = offered_load(jobs)
    loanable = loanable_gpus(demand_for(inputs, regime, jobs), regime, window)
    rates = np.array([rate for _, rate in load_rate(inputs.rate)])
    return {"name": regime.name, "training_servers": regime.training_servers,
            "inference_servers": regime.inference_servers, "gpus_per_server": GPUS_PER_SERVER,
            "demand_quantile": regime.peak_quantile, "jobs": len(jobs),
            "arrival_window_h": round((window[1] - window[0]) / 3600.0, 2),
            "offered_gpus": round(offered, 1), "offered_load": round(offered / training_gpus, 4),
            "loanable_gpus": round(loanable, 1), "loanable_share": round(loanable / training_gpus, 4),
            "rate_max_over_quantile": round(float(rates.max() / np.quantile(rates, DEMAND_QUANTILE)), 3)}


# -- runs -----------------------------------------------------------------------------------------


def run_one(inputs: Inputs, spec: RunSpec) -> dict[str, Any]:
    """Simulate ``spec``; its summary (and, with ``spec.keep``, the result) and the host seconds taken."""
    started = time.perf_counter()
    jobs = list(load_jobs(inputs, spec.seed, spec.throughput_model, spec.amdahl_alpha, spec.elastic_share,
                          spec.limit))
    regime = spec.regime
    result = simulate(jobs, demand_for(inputs, regime, jobs),
                      ClusterSpec(regime.training_servers, regime.inference_servers, GPUS_PER_SERVER),
                      spec.policy, PolicyParams(amdahl_alpha=spec.amdahl_alpha), seed=spec.seed,
                      min_cycle_gap_s=CYCLE_GAP_S, estimates=spec.estimates)
    out: dict[str, Any] = {"summary": summarize(result), "wall_s": time.perf_counter() - started}
    log(f"{regime.name} {spec.policy} seed {spec.seed} {spec.estimates} {spec.throughput_model} "
        f"alpha={spec.amdahl_alpha} jobs={len(jobs)}: {result.cycles} cycles, {result.stop_reason}, "
        f"{out['wall_s']:.0f} s")
    if spec.keep:
        out["result"] = result
    return out


def run_all(inputs: Inputs, specs: Sequence[RunSpec], workers: int | None = None) -> list[dict[str, Any]]:
    """``run_one`` of every spec, in ``specs``' order; over a pool of ``workers`` processes (default: the
    machine's cores), or in this process with 1."""
    workers = workers or os.cpu_count() or 1
    started = time.perf_counter()
    if workers <= 1 or len(specs) <= 1:
        outs = [run_one(inputs, s) for s in specs]
    else:
        with process_pool(min(workers, len(specs))) as pool:
            outs = list(pool.map(partial(run_one, inputs), specs))
    log(f"{len(specs)} runs on {workers} processes: {time.perf_counter() - started:.0f} s wall, "
        f"{sum(o['wall_s'] for o in outs):.0f} s of runs")
    return outs


# -- aggregation over seeds ---------------------------------------------------------------------


def aggregate(summaries: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """One policy over seeds: each metric's mean at its own path (``avg_queue_s``,
    ``gpu_utilization.overall``, ...) and ``spread`` {metric: mean, min, max, per_seed}."""
    out: dict[str, Any] = {"seeds": list(seeds), "estimates": summaries[0].get("estimates", EXACT),
                           "stop_reasons": sorted({str(s.get("stop_reason")) for s in summaries}),
                           # plan steps the simulated cluster refused, over the seeds (0 for sound runs)
                           "rejected_actions": sum(int(s.get("rejected_actions") or 0) for s in summaries),
                           "spread": {}}
    for metric in METRICS:
        stats = spread(lookup(s, metric) for s in summaries)
        if stats is None:
            continue
        out["spread"][metric] = stats
        head, _, leaf = metric.rpartition(".")
        (out.setdefault(head, {}) if head else out)[leaf] = stats["mean"]
    return out


def comparison(base: Mapping[str, Any], other: Mapping[str, Any]) -> dict[str, Any]:
    return {"queue_reduction": ratio_spread(base, other, "avg_queue_s"),
            "jct_reduction": ratio_spread(base, other, "avg_jct_s"),
            "usage_gain_pct": gain_spread(base, other, "gpu_utilization.overall"),
            "useful_usage_gain_pct": gain_spread(base, other, "useful_utilization.overall")}


# -- the sections -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """Which runs the two sections make. The default fits ``make evaluation`` in ~15 minutes on 2 cores:
    the headline pair (``sjf``, ``aryl``), ``aryl-noloan`` and the peers on every seed, both ways; the
    other ablations, the light-load row and the sensitivity rows on fewer seeds (smaller in tests)."""

    seeds: tuple[int, ...] = SEEDS
    policies: tuple[str, ...] = ("sjf", "tiresias", "pollux", "aryl-noloan", "aryl")
    ablations: tuple[str, ...] = ("aryl-noelastic", "aryl-naivereclaim", "aryl-nopreempt")
    ablation_seeds: tuple[int, ...] = SEEDS[:1]
    exact_policies: tuple[str, ...] = EXACT_POLICIES
    light: bool = True
    light_seeds: tuple[int, ...] = SEEDS[:1]
    peers_on_subset: tuple[str, ...] = ("tiresias", "optimus", "pollux")
    subset_jobs: int = PEER_SUBSET_JOBS
    subset_seeds: tuple[int, ...] = SEEDS
    sensitivity_seeds: tuple[int, ...] = SEEDS[:1]
    scaling: tuple[tuple[str, float], ...] = SCALING_MODELS
    plots: bool = True


def headline_specs(inputs: Inputs, plan: Plan) -> tuple[Regime, Regime, dict[str, list[RunSpec]]]:
    """The busy regime, the subset's, and the runs of both sections grouped by the table cell they feed
    (``<group>/<policy>``)."""
    busy = busy_regime(load_jobs(inputs, SEEDS[0]))
    subset = replace(busy_regime(load_jobs(inputs, SEEDS[0], limit=plan.subset_jobs)), name="busy-subset")
    groups: dict[str, list[RunSpec]] = {}
    for policy in plan.policies:
        groups[f"busy/{ESTIMATED}/{policy}"] = [
            RunSpec(busy, policy, s, keep=plan.plots and s == plan.seeds[0] and policy in ("sjf", "aryl"))
            for s in plan.seeds]
    for policy in plan.ablations:
        groups[f"ablation/{ESTIMATED}/{policy}"] = [RunSpec(busy, policy, s) for s in plan.ablation_seeds]
    for policy in plan.exact_policies:
        groups[f"busy/{EXACT}/{policy}"] = [RunSpec(busy, policy, s, estimates=EXACT) for s in plan.seeds]
    if plan.light:
        for estimates in (ESTIMATED, EXACT):
            for policy in ("sjf", "aryl"):
                groups[f"light/{estimates}/{policy}"] = [RunSpec(LIGHT, policy, s, estimates=estimates)
                                                        for s in plan.light_seeds]
    if plan.peers_on_subset:  # the subset's own baseline and aryl beside the slow peers
        for policy in dict.fromkeys(("sjf", *plan.peers_on_subset, "aryl")):
            groups[f"subset/{ESTIMATED}/{policy}"] = [RunSpec(subset, policy, s, limit=plan.subset_jobs)
                                                      for s in plan.subset_seeds]
    for model, alpha in plan.scaling:
        if (model, alpha) == ("amdahl", 0.05):
            continue  # the headline's own runs
        # sjf is the headline's: it runs every job at its traced size, where every model's speed is 1
        groups[f"scaling/{model}/{alpha}/aryl"] = [
            RunSpec(busy, "aryl", s, throughput_model=model, amdahl_alpha=alpha) for s in plan.sensitivity_seeds]
    return busy, subset, groups


def _cost_order(spec: RunSpec) -> int:
    """Longest first, so the pool's last runs are short ones (a guess: pollux is the slowest)."""
    return 0 if spec.policy == "pollux" else 1 if spec.policy in ("optimus", "tiresias") else 2


def run_groups(inputs: Inputs, groups: Mapping[str, list[RunSpec]], workers: int | None
               ) -> tuple[dict[str, list[tuple[int, Mapping[str, Any]]]], dict[str, SimulationResult], float]:
    """Every group's runs: {key: [(seed, summary), ...]}, the kept results, the seconds of runs."""
    flat = [(key, spec) for key, specs in groups.items() for spec in specs]
    order = sorted(range(len(flat)), key=lambda i: _cost_order(flat[i][1]))
    outs = run_all(inputs, [flat[i][1] for i in order], workers)
    by_index = dict(zip(order, outs, strict=True))
    summaries: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    kept: dict[str, SimulationResult] = {}
    for i, (key, spec) in enumerate(flat):
        summaries.setdefault(key, []).append((spec.seed, by_index[i]["summary"]))
        if "result" in by_index[i]:
            kept[key] = by_index[i]["result"]
    return summaries, kept, sum(o["wall_s"] for o in outs)
