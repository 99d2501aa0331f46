"""Section ``inference`` of ``docs/evaluation.md``: does inference notice the loans? ``aryl``'s forecast-aware
loaning (``policies.aryl.loans.demand_outlook``, ``core.demand_forecast``) against the reactive loan cycle it
replaced (``aryl-reactive``), and its reclaim against the naive one (``aryl-naivereclaim``: most recently loaned
first), on two inference loads with the headline's training side.

The setup (fixed before the first run; nothing here is tuned toward a figure):
- **Training side**: the headline's busy regime (``evaluation.headline.busy_regime``): the busiest 15 days of Philly,
  its clusters, job mapping and seeds, **non-clairvoyant** (``lognormal:0.8`` estimates).
- **Loads**, each scaled so that its **maximum** needs the whole inference cluster with 20% headroom
  (``peak_quantile = 1``: provisioned for the peak, nothing clipped), and the shortfall counted against the
  unclipped need (``simulator.results``):
  - ``servegen``: the headline's ServeGen ``m-small`` request rate (10-minute windows);
  - ``alibaba``: the Alibaba GenAI request trace (``alibaba-genai-2026/lora_request_trace.csv.gz``), every
    request counted in 10-minute bins from the first day with real load (day 4; ``simulator.load``'s
    ``load_request_times_rate``): a spiky load -- its largest bin is ~13x its mean, and ~46% of its bins are
    empty -- repeated end to end to cover the run.
- **Policies**: ``aryl-reactive`` (loans and reclaims on the need now: the loan cycle before the forecast),
  ``aryl`` (reclaim ahead of the forecast's upper band over the measured lead; no loan of what the band over
  lead + payback needs; ``policy.inference_short_budget`` = 0.001), ``aryl`` with ``policy.reclaim_protection =
  strict`` (the default until a diagnosis showed most of its reclaim preemptions were unprotected jobs stopped
  to spare protected ones: "shrink", the default since, may shrink a protected job for one more restart
  instead), ``aryl-risk`` (``aryl`` with risk-valued
  loans: an extra worker valued by its expected time before its loaned server goes back), ``aryl-naivereclaim``
  (``aryl`` with the naive reclaim). Seeds 0, 1, 2; mean (min-max).
- **Forecast coverage** (no scheduling): each load alone fed to a ``DemandForecaster`` minute by minute over the
  arrival window, with the band at the policy's quantile over a ``COVERAGE_LEAD_S`` lead: the share of minutes
  at which the need within the lead rose above the band, and the band's average height above the need.

Must never: decide anything, or pick a load, a size or a setting by looking at a policy's result.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from evaluation.headline import (
    CYCLE_GAP_S,
    ESTIMATED,
    HEADROOM,
    SEEDS,
    TAIL_S,
    Inputs,
    aggregate,
    arrival_span,
    busy_regime,
    load_jobs,
    load_rate,
)
from evaluation.report import cell, gain_spread, log, process_pool, ratio_spread, table
from scheduler_service.core.demand_forecast import DemandForecaster
from scheduler_service.core.params import PolicyParams, params_from_text
from simulator.load import demand_from_rate, load_request_times_rate
from simulator.model import ClusterSpec, DemandPoint

LOADS = ("servegen", "alibaba")
# The rows: a policy by name, and for one of them policy parameters as text (``core.params.params_from_text``, as
# ``aryl-sim --param`` takes them). A row's label is its key in the summaries.
STRICT = "aryl|reclaim_protection=strict"
ROWS: dict[str, tuple[str, dict[str, str]]] = {
    "aryl-reactive": ("aryl-reactive", {}),
    "aryl": ("aryl", {}),
    STRICT: ("aryl", {"reclaim_protection": "strict"}),
    "aryl-risk": ("aryl-risk", {}),
    "aryl-naivereclaim": ("aryl-naivereclaim", {}),
}
POLICIES = tuple(ROWS)
ALIBABA_TRACE = "traces/alibaba-genai-2026/lora_request_trace.csv.gz"
ALIBABA_START_DAY = 4
COVERAGE_LEAD_S = 120.0   # the simulator's: a reclaim serves at the next cycle (60 s apart) after the one that saw it


@lru_cache(maxsize=2)
def _alibaba_rate(path: Path) -> tuple[tuple[float, float], ...]:
    return tuple(load_request_times_rate(path, start_day=ALIBABA_START_DAY))


def load_demand(shared: Path, load: str, inference_servers: int, duration_s: float) -> list[DemandPoint]:
    """The load's servers-needed series over ``duration_s`` (module doc)."""
    inputs = Inputs.from_shared(shared)
    series = list(load_rate(inputs.rate)) if load == "servegen" else list(_alibaba_rate(shared / ALIBABA_TRACE))
    return demand_from_rate(series, inference_servers=inference_servers, headroom=HEADROOM, peak_quantile=1.0,
                            duration_s=duration_s)


@dataclass(frozen=True)
class InferenceRun:
    load: str
    policy: str  # a row's label (``ROWS``)
    seed: int


def run_one(shared: Path, spec: InferenceRun) -> dict[str, Any]:
    import time

    from simulator.engine import simulate
    from simulator.results import summarize

    started = time.perf_counter()
    inputs = Inputs.from_shared(shared)
    jobs = list(load_jobs(inputs, spec.seed))
    regime = busy_regime(load_jobs(inputs, SEEDS[0]))
    demand = load_demand(shared, spec.load, regime.inference_servers, arrival_span(jobs)[1] + TAIL_S)
    policy, params = ROWS[spec.policy]
    result = simulate(jobs, demand, ClusterSpec(regime.training_servers, regime.inference_servers, 8), policy,
                      params_from_text(PolicyParams(), params), seed=spec.seed, min_cycle_gap_s=CYCLE_GAP_S,
                      estimates=ESTIMATED)
    log(f"inference {spec.load} {spec.policy} seed {spec.seed}: {result.stop_reason}, "
        f"{time.perf_counter() - started:.0f} s")
    return dict(summarize(result))


def coverage(shared: Path, load: str, quantile: float) -> dict[str, float]:
    """The forecast alone on ``load`` (module doc): minutes the need within the lead rose above the band, and
    the band's average height above the need, over the headline's arrival window."""
    inputs = Inputs.from_shared(shared)
    jobs = load_jobs(inputs, SEEDS[0])
    regime = busy_regime(jobs)
    end = arrival_span(jobs)[1]
    demand = load_demand(shared, load, regime.inference_servers, end + TAIL_S)
    times = np.array([p.time for p in demand])
    needs = np.array([p.servers_needed for p in demand], dtype=float)

    def need_at(t: float) -> float:
        return float(needs[np.searchsorted(times, t, side="right") - 1])

    forecaster, misses, minutes, height = DemandForecaster(), 0, 0, 0.0
    t = 0.0
    while t < end:
        forecaster.observe(t, need_at(t))
        view = forecaster.view(t)
        assert view is not None
        band = math.ceil(view.forecast(COVERAGE_LEAD_S, quantile).upper - 1e-9)
        ahead = max(need_at(t + s) for s in np.arange(1.0, COVERAGE_LEAD_S + 1.0, 30.0))
        misses += ahead > band
        height += band - view.level
        minutes += 1
        t += 60.0
    return {"miss_share": misses / minutes, "band_height_servers": height / minutes,
            "mean_need_servers": float(np.mean([need_at(m * 60.0) for m in range(minutes)])),
            "inference_servers": regime.inference_servers}


def inference_section(shared: Path, assets: Path, raw: dict[str, Any],
                      seeds: Sequence[int] = SEEDS, loads: Sequence[str] = LOADS) -> tuple[str, dict[str, Any]]:
    """The section (evaluation.py's registry): its markdown and summaries."""
    specs = [InferenceRun(load, policy, seed) for load in loads for policy in POLICIES for seed in seeds]
    with process_pool(min(len(specs), os.cpu_count() or 1)) as pool:
        outs = list(pool.map(partial(run_one, shared), specs))
    figures: dict[str, Any] = {"seeds": list(seeds), "estimates": ESTIMATED, "budget": PolicyParams().
                               inference_short_budget, "coverage_lead_s": COVERAGE_LEAD_S, "loads": {}}
    for load in loads:
        per = {policy: aggregate([o for s, o in zip(specs, outs, strict=True) if (s.load, s.policy) == (load, policy)],
                                 list(seeds))
               for policy in POLICIES}
        per["coverage"] = coverage(shared, load, 1.0 - PolicyParams().inference_short_budget)
        figures["loads"][load] = per
    return inference_text(figures), figures


HEADER = ["load", "policy", "requests short", "short, arrivals", "requests unserved", "beyond the cluster",
          "server-h short", "avg JCT (h)", "p95 JCT (h)", "loans", "reclaims", "preempt. / reclaimed server",
          "GPU-h lost"]


def inference_text(figures: Mapping[str, Any]) -> str:
    rows, lines = [], []
    for load, per in figures["loads"].items():
        for policy in POLICIES:
            s = per[policy]["spread"]
            label = f"`{policy}`" if not ROWS[policy][1] else f"`{ROWS[policy][0]}`, " + ", ".join(
                f"`{k} = {v}`" for k, v in ROWS[policy][1].items())
            rows.append([load, label, cell(s.get("inference_shortfall.requests_short_share"), "share"),
                         cell(s.get("inference_shortfall_window.requests_short_share"), "share"),
                         cell(s.get("inference_shortfall.requests_unserved_share"), "share"),
                         cell(s.get("inference_shortfall.requests_beyond_cluster_share"), "share"),
                         cell(s.get("inference_shortfall.server_s"), "h"), cell(s.get("avg_jct_s")),
                         cell(s.get("p95_jct_s")), cell(s.get("loans"), "n"), cell(s.get("reclaims"), "n"),
                         cell(s.get("preemptions_per_reclaim"), "f2"), cell(s.get("gpu_hours_lost"), "n")])
        reactive, aryl, naive, risk = per["aryl-reactive"], per["aryl"], per["aryl-naivereclaim"], per["aryl-risk"]
        strict = per[STRICT]
        cost = gain_spread(reactive, aryl, "avg_jct_s")
        risk_jct, risk_lost = gain_spread(aryl, risk, "avg_jct_s"), gain_spread(aryl, risk, "gpu_hours_lost")
        naive_ratio = ratio_spread(naive, aryl, "preemptions_per_reclaim")
        strict_ratio = ratio_spread(naive, strict, "preemptions_per_reclaim")
        strict_jct, strict_lost = gain_spread(aryl, strict, "avg_jct_s"), gain_spread(aryl, strict, "gpu_hours_lost")
        short = aryl["spread"].get("inference_shortfall.requests_short_share")
        window = aryl["spread"].get("inference_shortfall_window.requests_short_share")
        reactive_window = reactive["spread"].get("inference_shortfall_window.requests_short_share")
        cov = per["coverage"]
        lines.append(
            f"- **{load}**: `aryl` leaves {cell(short, 'share')} of requests short, {cell(window, 'share')} over the "
            f"arrival window "
            f"(`aryl-reactive`: {cell(reactive['spread'].get('inference_shortfall.requests_short_share'), 'share')}, "
            f"{cell(reactive_window, 'share')}) "
            f"at {cell(cost, 'gain')} average JCT against `aryl-reactive`. Reclaim: `aryl-naivereclaim` makes "
            f"{cell(naive_ratio, 'x')} the preemptions per reclaimed server of `aryl`'s reclaim, and "
            f"{cell(strict_ratio, 'x')} those of `aryl`'s with `reclaim_protection = strict`, which against `aryl` "
            f"moves average JCT by {cell(strict_jct, 'gain')} and GPU-hours lost by {cell(strict_lost, 'gain')}. "
            "`aryl-risk` against "
            f"`aryl`: average JCT {cell(risk_jct, 'gain')}, GPU-hours lost {cell(risk_lost, 'gain')}. "
            "The forecast alone: "
            f"the need within {figures['coverage_lead_s']:.0f} s rose above the band at {cov['miss_share']:.2%} of "
            f"minutes; the band stood {cov['band_height_servers']:.1f} servers above the need on average (the need: "
            f"{cov['mean_need_servers']:.1f} of {cov['inference_servers']} servers) -- what loaning gives up for it.")
    budget = figures["budget"]
    return f"""## Inference: does serving notice the loans?

`evaluation/inference.py` (its module doc has the setup). The headline's training side (busy regime,
non-clairvoyant `{figures['estimates']}`, seeds {', '.join(map(str, figures['seeds']))}) with two inference loads,
each scaled so that its **maximum** needs the whole inference cluster (provisioned for the peak: nothing is
clipped, and the shortfall is counted against the unclipped need; "beyond the cluster" is the share of requests
that arrived when even the whole cluster was too small, the floor no policy can go under): ServeGen `m-small`
(the headline's) and the **Alibaba GenAI** request trace, binned to 10 minutes (spiky: idle hours, sudden
evening bursts). "Requests short": the share that arrived while serving capacity was below the need, over
the whole run; "short, arrivals": the same over the arrival window (the first to the last job submission, the
busy stretch where loans are many; after it, training winds down and the shortfall thins out, so the whole
run's share is the smaller and the window's the one the budget is about); "unserved": the share beyond what
was serving.

- `aryl-reactive`: loans and reclaims follow the need now (the loan cycle before the forecast): a rise is met
  one reclaim latency late.
- `aryl`: reclaims ahead of the demand forecast's upper band over the measured lead (reclaim latency plus the
  decision lag), and loans nothing the band over lead + payback (2 restarts) needs; the band's quantile is
  1 - `policy.inference_short_budget` = {1 - budget:.1%} (`scheduler_service/core/demand_forecast.py`: time
  of day and the recent hour, rises in units of the need's square root (relative rises until 2026-11-30), the
  rising trend). Its reclaim (every row's but the last) chooses the servers by their whole cost and restarts a
  job left below its minimum elsewhere where it can: on
  free GPUs, over other jobs' unprotected extras, or (since 2026-11-30) on a server cleared by moving other
  unprotected jobs there at their size, those holding at most the job's minimum's GPUs (`MOVED_TO_MAKE_ROOM`,
  `policies/aryl/base.py`); only a job that fits nowhere is preempted.
- `aryl`, `reclaim_protection = strict` (the default before this section's diagnosis): its reclaim disrupts
  a job in its protection window (`policy.min_resize_interval_s`, `policy.max_disruptions_per_hour`) only when
  the loaned servers without one do not suffice, and so stops unprotected jobs rather than shrink protected
  ones. `aryl` ("shrink", the default) may shrink a protected job at the cost of one more restart of all its
  GPUs, weighed against the other choices (`core.protection.reclaim_scale_in_penalty`). Both stop a protected
  job only as a last resort.
- `aryl-risk`: `aryl` with risk-valued loans (`policies/aryl/loans.py`, `loan_risk`): the sizing values an
  extra worker by its expected remaining time when its loaned server may go back -- the chance of that within
  each horizon from the forecast's own rises (anchors as for the band, the lead included), times the share of
  the GPUs the sizing shares out that are loaned; a reclaim costs the job a restart and the rest at its
  smaller size. `aryl` values an extra worker at its full rate.
- `aryl-naivereclaim`: `aryl` with the naive reclaim (the most recently loaned servers first; a job left below
  its minimum is preempted).

{table(rows, HEADER)}

{chr(10).join(lines)}

Targets (issue 31): at most 0.1% of requests short on the busy ServeGen load (read on the arrival window: the
whole run's share counts the quiet tail too) at no more than 2% higher average JCT than `aryl-reactive`; at most
0.5% on the spiky load with the JCT cost reported; at least 3x fewer preemptions per reclaimed server than naive,
in every seed (the ratios' ranges above are the seeds').
Where `aryl`'s JCT cost against `aryl-reactive` comes from (servegen, seeds 0-2, measured 2026-11-30 at 3ba6d00
with the forecast's two uses taken apart by hand; not rows of this section): loans held to the band over the lead
and reclaims on the need now cost +1.1% average JCT (7,162 s against 7,086) and leave 0.83%-0.86% of requests short
over the arrival window, with 192-197 loans a run; adding the predictive reclaim gives `aryl` (+2.4%, 0.10% short,
747-795 loans: a server reclaimed ahead of a rise the band allows for is lent again once the band falls). The
payback rule (no loan of what the band over lead + two restarts needs) never bound: without it every run was the
same to the second. So the cost is the band itself -- how far above the need a 99.9% band over the lead must
stand on this load -- split about evenly between the loans it withholds and the reclaims it starts early; a
sharper forecast would lower both, the loan rules would not. The sharper forecast since (rises in units of the
need's square root, `core.demand_forecast`; hand-run on seed 0 before this section was regenerated with it):
against `aryl-reactive`, servegen +2.2% -> +2.0% and alibaba +3.9% -> +2.9% average JCT. The lead in these runs
is the measured reclaim latency (60 s) plus the decision lag, the p90 gap between cycles (servegen, seed 0: the
lead's median 308 s, p90 360 s): the simulator's periodic cycle comes every 300 s when no event wakes one (the
service's every 2 s, `scheduling.cycle_interval_s`), so the band spans up to 6 minutes, not the 2 of the
forecast-alone figure. It is not the lag that costs: with a cycle every 60 s (seed 0, hand-run) `aryl`'s average
JCT moved by +0.0% and `aryl-reactive`'s by -0.3%, a gap of +2.3%.

`aryl`'s reclaim is exact while there are at most 40,000 sets of loaned servers to try
(`solvers.reclaim.reclaim_solve`), greedy on server preemption cost beyond (its gap to the exact answer: `make
bench`, `reclaim_gap`). The risk valuation covers extra workers only: a queued job's base workers placed on a
loaned server are valued at their full rate (a reclaim relocates them where it can).
"""
