"""The "goodput" section of ``docs/evaluation.md`` (``python -m evaluation --only goodput``):
capacity loaning and goodput-optimised elasticity together (issue 17), on the headline's Philly +
ServeGen setup with every job mapped to one of the six Pollux models.

Policies: ``sjf`` (separate clusters, jobs at their requested size), ``pollux`` (goodput and batch-size
adaptation, no loaning), ``aryl`` (loaning, one joint sizing valued by each job's fitted goodput model, with
the batch chosen for its allocation) and its ablations ``aryl-nogoodput`` (declared throughput only),
``aryl-noloan``, ``aryl-nojoint`` (the earlier two-step sizing), ``aryl-noshrink`` (no shrink-to-admit) and
``aryl-nopreempt`` (no preempt-to-admit).
All run on the same simulated cluster, the same jobs and the same truth.

The setup and modelling choices, fixed before the section's full run (nothing here is tuned toward the
target; the two changes made after the first small trial runs were modelling fixes, not picked by a
result: a batch change without a restart, as the job contract does it, and the headline's busy sizing once
it was committed):

- **Jobs**: the first ``WINDOW_DAYS`` (1) day of the busiest 15-day Philly window (``pollux`` took
  ~105 s for half a day on this shared 2-core machine, growing faster than the window: the full window
  is out of reach here; chosen from run times before any full result), mapped as the headline does
  (``JobMapping``: gang shape from ``num_gpus``, half the jobs elastic up to 4x, keyed draws by
  ``seed``). Each job is given a Pollux model by Pollux's own rule for Philly jobs
  (``JobMapping.assign_model``, ``"pollux-gputime"``: by GPU-hours at the requested size, 50/50 keyed
  draws), with that model's measured profile
  (``pollux-data/traces/<model>``, ``simulator.goodput_profiles.Application``) as its truth. Jobs the
  profiles cannot run (more than 64 GPUs at the requested size) keep the headline's Amdahl curve and
  take no part in goodput (``sjf``-like for every policy).
- **Batch**: a job's tuned batch ``B`` is its requested GPUs x the model's smallest batch (clamped to the
  largest validated one), as Pollux sizes Philly jobs; it declares ``BatchLimits(B, largest validated,
  largest atomic)``. Without a batch from the policy it runs Pollux's rule without a model,
  ``max(B, GPUs x smallest atomic batch)``; with one, that batch (its atomic batch raised to the model's
  smallest measured one where needed).
- **Truth**: a configuration's progress rate is ``gain(batch) / step time`` iterations at the model's
  smallest batch per second (``core.goodput.progress_rate``); step times from the profile on the job's
  placement, each 8-GPU server counted as two 4-GPU nodes of the profiles' testbed; the gradient
  statistics of the model's middle epoch throughout (so a segment keeps one speed: the cluster simulator
  advances jobs linearly per segment; Pollux's own simulator changes them by epoch). A job's work is its
  traced duration x its rate at its requested size with its own batch, so a job that runs as traced
  finishes in its traced time.
- **What the policies see**: declared throughput points = the true rate at each worker count with the
  job's own batch (cleaned to never decrease), as the headline's oracle curves; and, once a job has run,
  one step sample per configuration it ran (nodes = servers, GPUs, atomic batch, pass and step time, as
  the progress file reports them), and its gradient statistics at the batch it runs, normalised to ``B``.
  A batch change without a resize takes effect at once, without a restart (the contract's batch file is
  re-read at the next step): the segment's progress goes on from where it is at the new rate (a
  checkpoint taken earlier in that segment is then valued on the new rate, which only a later preemption
  in the same segment would read).
- **Cluster**: sized by the headline's *busy-regime* rule (``evaluation.headline.busy_regime``) on
  this window: the most 8-GPU training servers its offered load (every job started when submitted at its
  traced size, averaged over the arrival window) still fills to ``BUSY_LOAD`` (90%); one inference server
  per two training servers, whose ServeGen ``m-small`` demand (20% headroom) needs the whole inference
  cluster at the rate's ``DEMAND_QUANTILE`` (0.99) quantile. 30 s restart overhead, checkpoints every
  30 min, cycles at least 60 s apart.
- **Estimates** (``ESTIMATES``): non-clairvoyant, as the headline: the policies see a user's run-time
  estimate, the truth x exp(0.8 z) (``simulator.estimates``), and the declared throughput; ``aryl`` also runs
  with exact run times on the first window (the clairvoyant row).
- **Windows** ``WINDOWS``: the first day, the first 2 days and the first 7 days, each on clusters sized by
  the same rule on its own jobs. The 7-day window became affordable once ``pollux``'s knapsack moved to the
  exact MCKP solver ``aryl`` uses (``policies.pollux_search.min_cost_counts_mckp``): ``pollux`` then took
  ~210 s for 7 days (seed 0) on this shared 2-core machine. The whole 15-day window is left out: ``pollux``'s
  cost grows faster than the window.
- **Seeds** ``SEEDS``: each changes the elastic draws, the model draws and the estimate errors; figures
  are means over the seeds with the min..max range.
"""

from __future__ import annotations

import heapq
import math
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from evaluation.headline import DEMAND_QUANTILE, GPUS_PER_SERVER, busy_regime
from evaluation.report import process_pool
from scheduler_service.core.apply_rules import ApplySettings
from scheduler_service.core.clock import Clock
from scheduler_service.core.goodput import BatchSplit, GradParams, StepSample, progress_rate, split_batch
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import ApplyResult, Plan
from scheduler_service.core.snapshot import BatchLimits, ClusterSnapshot, JobView, WorkerView
from scheduler_service.core.throughput import ThroughputModel
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import SimulationResult, simulate
from simulator.goodput_profiles import Application, load_application
from simulator.load import demand_from_rate, load_servegen_rate
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.traces import JobMapping, job_gpu_seconds, load_philly

POLICIES = ("sjf", "pollux", "aryl-nogoodput", "aryl-noloan", "aryl-nojoint", "aryl-noshrink", "aryl-nopreempt", "aryl")
SEEDS = (0, 1, 2)
WINDOW_DAYS = 1.0
WINDOWS = (WINDOW_DAYS, 2.0, 7.0)  # the first day, 2 days and 7 days (module doc: why not longer)
ESTIMATES, EXACT = "lognormal:0.8", "exact"
PROFILE_NODE_GPUS = 4     # the profiles' testbed nodes (4 x T4)
MAX_PROFILE_GPUS = 64     # the largest configuration measured
CYCLE_GAP_S = 60.0
PARAMS = PolicyParams()


@dataclass(frozen=True, slots=True)
class GoodputTruth:
    """One job's true goodput (module doc): its model's profile, tuned batch and the epoch whose gradient
    statistics hold throughout."""

    app: Application
    batch: int            # B: the batch it was tuned for
    epoch: int
    gpus_per_worker: int

    @property
    def limits(self) -> BatchLimits:
        return BatchLimits(self.batch, self.app.max_batch_size, self.app.max_atomic_bsz)

    def own_split(self, replicas: int) -> BatchSplit:
        """The batch it runs without one from the policy: Pollux's rule without a model."""
        app = self.app
        total = min(max(self.batch, replicas * app.min_atomic_bsz), app.max_batch_size)
        return split_batch(total, replicas, app.max_atomic_bsz, init_bsz=app.init_batch_size,
                           max_batch_size=app.max_batch_size)

    def clamp(self, atomic: int, accum: int, replicas: int) -> BatchSplit:
        """A policy's batch as the job runs it: within the model's measured atomic batches and its
        largest validated batch."""
        app = self.app
        atomic = min(max(atomic, app.min_atomic_bsz), app.max_atomic_bsz)
        while accum > 0 and replicas * atomic * (accum + 1) > app.max_batch_size:
            accum -= 1
        atomic = max(app.min_atomic_bsz, min(atomic, app.max_batch_size // (replicas * (accum + 1))))
        return BatchSplit(atomic, accum)

    def step(self, placement: tuple[int, ...], split: BatchSplit) -> tuple[float, float]:
        """(step, sync) seconds of one step on ``placement`` (GPUs per server)."""
        nodes = tuple(n for gpus in placement for n in _testbed_nodes(gpus))
        return self.app.step_times(nodes, split.atomic_bsz)

    def rate(self, placement: tuple[int, ...], split: BatchSplit) -> float:
        """Iterations at the model's smallest batch per second (module doc)."""
        replicas = sum(placement)
        step, sync = self.step(placement, split)
        seconds = step + (step - sync) * split.accum_steps
        return progress_rate(self.app.gain(split.total(replicas), self.epoch), seconds)

    def grad(self, split: BatchSplit, replicas: int) -> GradParams:
        """The gradient statistics it measures at the batch it runs, normalised to ``batch``."""
        measured = self.app.grad_params(split.total(replicas), self.epoch)
        return GradParams(measured.sqr, measured.var * self.app.init_batch_size / self.batch)


def _testbed_nodes(gpus: int) -> list[int]:
    full, rest = divmod(gpus, PROFILE_NODE_GPUS)
    return [PROFILE_NODE_GPUS] * full + ([rest] if rest else [])


def _packed(workers: int, gpus_per_worker: int) -> tuple[int, ...]:
    """GPUs per server of ``workers`` workers on the fewest servers."""
    per_server = max(1, GPUS_PER_SERVER // gpus_per_worker)
    full, rest = divmod(workers, per_server)
    return (per_server * gpus_per_worker,) * full + ((rest * gpus_per_worker,) if rest else ())


def goodput_jobs(jobs: list[TraceJob], data_dir: Path, mapping: JobMapping
                 ) -> tuple[list[TraceJob], dict[int, GoodputTruth]]:
    """Each job with its Pollux model (module doc): work and declared points in its model's progress
    units, and its truth; jobs the profiles cannot run stay as they are."""
    out, truths = [], {}
    for job in jobs:
        gpw = job.gpus_per_worker
        if job.max_workers * gpw > MAX_PROFILE_GPUS:
            job = replace(job, max_workers=max(job.min_workers, MAX_PROFILE_GPUS // gpw))
        if job.min_workers * gpw > MAX_PROFILE_GPUS:
            out.append(job)
            continue
        app = load_application(data_dir, mapping.assign_model(job.name, job_gpu_seconds(job)))
        batch = min(job.min_workers * gpw * app.init_batch_size, app.max_batch_size)
        truth = GoodputTruth(app, batch, app.completion_epoch // 2, gpw)
        points, best = [], 0.0
        for w in range(job.min_workers, job.max_workers + 1):
            best = max(best, truth.rate(_packed(w, gpw), truth.own_split(w * gpw)))
            points.append((w, best))
        base = points[0][1]
        duration = job.work / dict(job.throughput)[job.min_workers]  # seconds at the requested size
        out.append(replace(job, throughput=tuple(points), work=duration * base, model=app.name))
        truths[job.job_id] = truth
    return out, truths


class GoodputCluster(SimulatedCluster):
    """The simulated cluster with goodput jobs (module doc): a job's segment runs at its true rate on its
    placement with the batch the last plan gave it (or its own), and the snapshot shows what its
    workers measured. Everything else is ``SimulatedCluster``'s."""

    def __init__(self, spec: ClusterSpec, clock: Clock, truths: dict[int, GoodputTruth], **settings: Any) -> None:
        super().__init__(spec, clock, **settings)
        self._truths = truths
        self._batch: dict[int, tuple[int, int]] = {}          # job -> (atomic, accum) the policy chose
        self._samples: dict[int, dict[tuple[int, int, int], StepSample]] = {}
        self._shown: dict[int, tuple[StepSample, ...]] = {}   # the samples as a stable tuple (the fit's key)
        self._grad: dict[int, GradParams] = {}
        self._split: dict[int, BatchSplit] = {}               # job -> the batch its segment runs

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        snap = super().snapshot(seed)
        jobs = tuple(
            replace(j, batch_limits=truth.limits, step_samples=self._shown.get(j.job_id, ()),
                    grad_stats=self._grad.get(j.job_id), batch_now=self._batch_now(j))
            if (truth := self._truths.get(j.job_id)) is not None else j
            for j in snap.jobs)
        return replace(snap, jobs=jobs)

    def _batch_now(self, job: JobView) -> tuple[int, int, int] | None:
        """The batch its running segment uses, with the GPUs it runs on (``JobView.batch_now``)."""
        split = self._split.get(job.job_id)
        if split is None or not job.workers:
            return None
        return split.atomic_bsz, split.accum_steps, job.num_workers * job.gpus_per_worker

    def apply(self, plan: Plan) -> ApplyResult:
        for b in plan.batches:
            self._batch[b.job_id] = (b.atomic_bsz, b.accum_steps)
        result = super().apply(plan)
        now = self.now
        for b in plan.batches:  # a batch change alone: the running segment goes on at the new rate
            job = self._running.get(b.job_id)
            truth = self._truths.get(b.job_id)
            if job is None or truth is None or job.seg_start == now:
                continue
            placement = _placement(job.workers)
            split = truth.clamp(b.atomic_bsz, b.accum_steps, sum(placement))
            if split == self._split.get(b.job_id):
                continue
            rate = truth.rate(placement, split)
            productive = now - job.seg_start - self.restart_overhead_s
            if productive > 0:  # the same progress now, the new rate from now on
                job.seg_work = self._work_at(job, now) - rate * productive
            job.seg_speed = rate
            job.seg_version += 1
            job.view = None
            end = job.seg_start + self.restart_overhead_s + (job.trace.work - job.seg_work) / rate
            heapq.heappush(self._completions, (max(end, now), b.job_id, job.seg_version))
            self._observe(b.job_id, truth, placement, split)
        return result

    def _observe(self, job_id: int, truth: GoodputTruth, placement: tuple[int, ...], split: BatchSplit) -> None:
        """What the job's workers measure running ``split`` on ``placement``: a step sample of that
        configuration (the newest of each), and the gradient statistics."""
        replicas = sum(placement)
        step, sync = truth.step(placement, split)
        seen = self._samples.setdefault(job_id, {})
        seen[(len(placement), replicas, split.atomic_bsz)] = StepSample(
            len(placement), replicas, split.atomic_bsz, step - sync, step)
        self._shown[job_id] = tuple(seen.values())
        self._grad[job_id] = truth.grad(split, replicas)
        self._split[job_id] = split

    def _begin_segment(self, job: Any, now: float, workers: tuple[WorkerView, ...], work: float) -> None:
        job_id = job.trace.job_id
        truth = self._truths.get(job_id)
        if truth is not None and workers:
            placement = _placement(workers)
            replicas = sum(placement)
            chosen = self._batch.get(job_id)
            split = (truth.clamp(chosen[0], chosen[1], replicas) if chosen is not None
                     else truth.own_split(replicas))
            job.model = ThroughputModel(((len(workers), truth.rate(placement, split)),))
            self._observe(job_id, truth, placement, split)
        super()._begin_segment(job, now, workers, work)


def _placement(workers: tuple[WorkerView, ...]) -> tuple[int, ...]:
    """GPUs per server of a job's workers, in the order of first appearance."""
    per_server: dict[str, int] = {}
    for w in workers:
        per_server[w.server_id] = per_server.get(w.server_id, 0) + len(w.gpu_indices)
    return tuple(per_server.values())


def busy_cluster(jobs: list[TraceJob]) -> ClusterSpec:
    """The busy-regime clusters for ``jobs`` (module doc; the headline's rule, ``evaluation.headline.busy_regime``)."""
    regime = busy_regime(jobs)
    return ClusterSpec(regime.training_servers, regime.inference_servers, GPUS_PER_SERVER)


def philly_goodput(shared: Path, seed: int, *, days: float = WINDOW_DAYS, limit: int | None = None
                   ) -> tuple[list[TraceJob], dict[int, GoodputTruth], list[DemandPoint], ClusterSpec]:
    """The section's jobs, truths, inference demand and clusters for one seed (module doc)."""
    mapping = JobMapping(seed=seed, elastic_share=0.5, max_scale=4, throughput_model="pollux-gputime",
                         gpus_per_server=GPUS_PER_SERVER)
    amdahl = replace(mapping, throughput_model="amdahl")
    jobs = [j for j in load_philly(shared / "traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz",
                                   mapping=amdahl, limit=limit)
            if j.submit_time < days * 86400.0]
    spec = busy_cluster(jobs)  # on the traced sizes and run times, before the goodput units
    jobs, truths = goodput_jobs(jobs, shared / "pollux-data/traces", mapping)
    span = max(j.submit_time for j in jobs) + 10 * 86400.0
    rate = load_servegen_rate(shared / "traces/servegen-llm-load/servegen_total_rate_10min.csv", model="m-small")
    demand = demand_from_rate(rate, inference_servers=spec.inference_servers, headroom=0.2,
                              peak_quantile=DEMAND_QUANTILE, duration_s=span)
    return jobs, truths, demand, spec


def run_goodput(jobs: list[TraceJob], truths: dict[int, GoodputTruth], demand: list[DemandPoint], policy: str,
                *, seed: int, spec: ClusterSpec, max_time_s: float | None = None, estimates: str = "exact"
                ) -> SimulationResult:
    """One run of ``policy`` on the goodput cluster (the engine's ``simulate`` on a ``GoodputCluster``)."""
    clock = VirtualClock(0.0)
    cluster = GoodputCluster(spec, clock, truths, restart_overhead_s=30.0, checkpoint_interval_s=1800.0,
                             drain_ack_s=1.0, apply_settings=ApplySettings.of(PARAMS))
    return simulate(jobs, demand, spec, policy, PARAMS, seed=seed, min_cycle_gap_s=CYCLE_GAP_S,
                    cluster=cluster, clock=clock, max_time_s=max_time_s, estimates=estimates)


def figures(result: SimulationResult, estimates: str) -> dict[str, Any]:
    """Average and p95 JCT (completed jobs), queueing, completions, loans and restarts of one run, with the
    estimates the policies saw and the plan actions the cluster rejected (0 for a sound run)."""
    done = [j for j in result.jobs if j.end is not None]
    jct = sorted(j.end - j.submit for j in done if j.end is not None)
    queue = [j.start - j.submit for j in done if j.start is not None]
    return {
        "avg_jct_s": round(sum(jct) / len(jct), 1) if jct else math.nan,
        "p95_jct_s": round(jct[min(len(jct) - 1, math.ceil(0.95 * len(jct)) - 1)], 1) if jct else math.nan,
        "avg_queue_s": round(sum(queue) / len(queue), 1) if queue else math.nan,
        "completed": len(done), "jobs": len(result.jobs),
        "loans": sum(s.loans for s in result.servers),
        "resizes": sum(j.scale_outs + j.scale_ins for j in result.jobs),
        "preemptions": sum(j.preemptions for j in result.jobs),
        "estimates": estimates, "rejected_actions": result.rejected_actions,
        "wall_s": round(result.wall_s, 1),
    }


def _lower(share: float) -> str:
    """A relative JCT change as words: 0.057 -> '5.7% lower', -0.02 -> '2.0% higher'."""
    return f"{share:.1%} lower" if share >= 0 else f"{-share:.1%} higher"


def _log(message: str) -> None:
    import sys

    print(f"[evaluation:goodput] {message}", file=sys.stderr, flush=True)


def _one_run(shared: Path, days: float, seed: int, policy: str, estimates: str) -> dict[str, Any]:
    """One run in a worker process (the inputs are rebuilt there: they are deterministic in the seed)."""
    jobs, truths, demand, spec = philly_goodput(shared, seed, days=days)
    out = figures(run_goodput(jobs, truths, demand, policy, seed=seed, spec=spec, estimates=estimates), estimates)
    _log(f"{days:g} day(s) seed {seed} {policy} {estimates}: {out}")
    return out


def goodput_section(shared: Path, assets: Path, raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Run every policy on every window and seed (and ``aryl`` with exact run times on the first window);
    the section's markdown and its raw figures. ``runs`` keeps the first window's, as before."""
    import os

    started = time.perf_counter()
    windows: dict[str, Any] = {}
    for days in WINDOWS:
        sizes: dict[int, tuple[int, int]] = {}
        spec = ClusterSpec(0, 0, GPUS_PER_SERVER)  # the same for every seed: sized on the traced jobs alone
        for seed in SEEDS:
            jobs, truths, _, spec = philly_goodput(shared, seed, days=days)
            sizes[seed] = (len(jobs), len(truths))
        windows[f"{days:g}"] = {"days": days, "jobs": sizes, "training_servers": spec.training_servers,
                                "inference_servers": spec.inference_servers, "runs": {p: {} for p in POLICIES}}
    work = [(days, seed, policy, ESTIMATES) for days in WINDOWS for seed in SEEDS for policy in POLICIES]
    work += [(WINDOWS[0], seed, "aryl", EXACT) for seed in SEEDS]
    # Longest first, so the pool's last minutes are not one long run alone.
    work.sort(key=lambda w: (-w[0], w[2] != "pollux"))
    with process_pool(os.cpu_count() or 1) as pool:
        futures = {w: pool.submit(_one_run, shared, *w) for w in work}
        exact: dict[int, Any] = {}
        for (days, seed, policy, estimates), future in futures.items():
            if estimates == EXACT:
                exact[seed] = future.result()
            else:
                windows[f"{days:g}"]["runs"][policy][seed] = future.result()
    first = windows[f"{WINDOWS[0]:g}"]
    raw_out = {"runs": first["runs"], "jobs": first["jobs"], "training_servers": first["training_servers"],
               "inference_servers": first["inference_servers"], "windows": windows, "exact": exact,
               "estimates": ESTIMATES, "wall_s": round(time.perf_counter() - started)}
    return text_of(raw_out), raw_out


def text_of(raw: dict[str, Any]) -> str:
    """The section's markdown from its raw figures (``goodput_section``'s, or summaries.json's ``goodput``)."""
    windows = []
    for window in raw["windows"].values():
        runs = {p: {int(s): v for s, v in seeds.items()} for p, seeds in window["runs"].items()}
        sizes = {int(s): (int(v[0]), int(v[1])) for s, v in window["jobs"].items()}
        windows.append((float(window["days"]), runs, sizes,
                        ClusterSpec(window["training_servers"], window["inference_servers"], GPUS_PER_SERVER)))
    exact = {int(s): v for s, v in raw.get("exact", {}).items()}
    return render(windows, exact, float(raw["wall_s"]))


def _hours(v: float) -> str:
    return f"{v / 3600:.2f} h"


def _window_text(days: float, runs: dict[str, dict[int, dict[str, Any]]], sizes: dict[int, tuple[int, int]],
                 spec: ClusterSpec) -> tuple[str, list[str]]:
    """One window's tables and comparisons; and the seeds (as "days/seed") where ``aryl`` is not below ``pollux``."""
    policies = [p for p in POLICIES if runs.get(p)]

    def spread(policy: str, key: str, fmt: Any = _hours) -> str:
        values = [runs[policy][s][key] for s in sorted(runs[policy])]
        return f"{fmt(statistics.fmean(values))} ({fmt(min(values))}..{fmt(max(values))})"

    def count(v: float) -> str:
        return f"{v:,.0f}"

    rows = [f"| {p} | {spread(p, 'avg_jct_s')} | {spread(p, 'p95_jct_s')} | {spread(p, 'avg_queue_s')} | "
            f"{spread(p, 'completed', count)} | {spread(p, 'loans', count)} | {spread(p, 'resizes', count)} | "
            f"{spread(p, 'preemptions', count)} | {spread(p, 'rejected_actions', count)} |" for p in policies]
    per_seed = [f"| {s} | {sizes[s][0]:,} ({sizes[s][1]:,} with goodput) | "
                + " | ".join(_hours(runs[p][s]["avg_jct_s"]) for p in policies) + " |" for s in sorted(sizes)]
    lines = []
    behind_pollux: list[str] = []
    for other, what in (("pollux", "the peer"), ("aryl-nojoint", "what the joint sizing adds"),
                        ("aryl-noshrink", "what shrink-to-admit adds"),
                        ("aryl-nopreempt", "what preempt-to-admit adds"),
                        ("aryl-noloan", "what loaning adds"), ("aryl-nogoodput", "what the goodput model adds"),
                        ("sjf", "the baseline")):
        if other not in policies:
            continue
        ratios = [1.0 - runs["aryl"][s]["avg_jct_s"] / runs[other][s]["avg_jct_s"] for s in sorted(runs["aryl"])]
        behind = [s for s in sorted(runs["aryl"]) if runs["aryl"][s]["avg_jct_s"] >= runs[other][s]["avg_jct_s"]]
        if other == "pollux":
            behind_pollux = [f"{days:g}/{s}" for s in behind]
        p95 = [runs["aryl"][s]["p95_jct_s"] / runs[other][s]["p95_jct_s"] - 1.0 for s in sorted(runs["aryl"])]
        lines.append(
            f"- `aryl` vs `{other}` ({what}): average JCT {_lower(statistics.fmean(ratios))} (per seed "
            f"{_lower(min(ratios))} to {_lower(max(ratios))})"
            + (f"; not lower on seed(s) {', '.join(map(str, behind))}" if behind else "")
            + f"; p95 JCT {statistics.fmean(p95):+.0%} ({min(p95):+.0%}..{max(p95):+.0%}).")
    text = f"""
**First {days:g} day(s)**: {spec.training_servers} training + {spec.inference_servers} inference servers of 8 GPUs.

| policy | avg JCT | p95 JCT | avg queue | completed | loans | resizes | preemptions | rejected actions |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

| seed | jobs | {" | ".join(policies)} |
|---|---|{"---|" * len(policies)}
{chr(10).join(per_seed)}

{chr(10).join(lines)}
"""
    return text, behind_pollux


def render(windows: list[tuple[float, dict[str, dict[int, dict[str, Any]]], dict[int, tuple[int, int]], ClusterSpec]],
           exact: dict[int, dict[str, Any]], wall_s: float) -> str:
    texts, behind = [], []
    for days, runs, sizes, spec in windows:
        text, late = _window_text(days, runs, sizes, spec)
        texts.append(text)
        behind += late
    first_days, first_runs, _, _ = windows[0]
    if exact:
        estimated = [first_runs["aryl"][s]["avg_jct_s"] for s in sorted(exact)]
        known = [exact[s]["avg_jct_s"] for s in sorted(exact)]
        texts.append(
            f"\n**Clairvoyant row** (first {first_days:g} day(s), `aryl` seeing each job's true work): average JCT "
            f"{_hours(statistics.fmean(known))} ({_hours(min(known))}..{_hours(max(known))}) against "
            f"{_hours(statistics.fmean(estimated))} with the estimates. `pollux` reads no run-time estimate, so "
            "its runs are the same either way.\n")
    verdict = ("`aryl`'s average JCT is below `pollux`'s on every seed of every window."
               if not behind else
               f"`aryl`'s average JCT is not below `pollux`'s on (window/seed) {', '.join(behind)}.")
    refused = sorted({p for _, runs, _, _ in windows for p, seeds in runs.items()
                      if any(r["rejected_actions"] for r in seeds.values())})
    rejected_text = (f" Runs with rejected actions (plan steps the simulated cluster's rule book refused; 0 in a "
                     f"sound run): {', '.join(refused)}." if refused else " Every run's plans were applied whole "
                     "(0 rejected actions).")
    tails = []
    for days, runs, _, _ in windows:
        ratio = statistics.fmean(runs["aryl"][s]["p95_jct_s"] / runs["pollux"][s]["p95_jct_s"] for s in runs["aryl"])
        tails.append((days, ratio - 1.0))
    over = [f"{days:g} day(s)" for days, excess in tails if excess > 0.10]
    tail_text = (
        "`aryl`'s p95 JCT against `pollux`'s (target: at most +10%): "
        + "; ".join(f"{days:g} day(s) {excess:+.0%}" for days, excess in tails) + "."
        + (f" Missed on {', '.join(over)}: the joint sizing runs short jobs first (the completion rates), and "
           "preempt-to-admit, what shortens the tail (the `aryl-nopreempt` row), takes only jobs just past a "
           "checkpoint." if over else ""))
    spans = ", ".join(f"{days:g}" for days, _, _, _ in windows)
    return f"""## Loaning + goodput: Philly + ServeGen with Pollux models

The first {spans} day(s) of the busiest Philly window, each on clusters sized by the
headline's busy-regime rule (ServeGen `m-small` demand), every job mapped to one of the six Pollux models by
Pollux's own rule for Philly jobs, with its measured profile as the truth (step times, statistical efficiency;
`evaluation/goodput.py` states every modelling choice). **Non-clairvoyant**: the policies see a user's
run-time estimate (`{ESTIMATES}`: the truth x exp(0.8 z)); the clairvoyant row follows. Policies: `sjf`
(separate clusters), `pollux` (goodput + batch-size adaptation, no loaning), and `aryl` (loaning; one joint
sizing of every queued and running elastic job by completion rates, valued by each job's goodput model fitted
online, with the batch chosen for its allocation) with its ablations: `aryl-nojoint` (the earlier two steps:
queued gangs shortest-first, then extras into the GPUs left over, by the JCT they cut), `aryl-noshrink` (no
shrink-to-admit: a queued gang starts on free GPUs only, running jobs keep their extras), `aryl-nopreempt` (no
preempt-to-admit: no running job is preempted to admit queued ones), `aryl-noloan` (no loaning) and
`aryl-nogoodput` (declared throughput only). Seeds {", ".join(map(str, SEEDS))} (elastic, model
and estimate draws); mean (min..max) over seeds. This section took {wall_s:.0f} s.

**Why completion rates** (the joint sizing's objective, `scheduler_service/policies/aryl/sizing.py`): a job's
value at a size is `1 / (estimated time left there + a restart if the size changes)`, and the sum over jobs is
the rate at which the cluster completes jobs. Maximising it (one exact multiple-choice knapsack per cycle, the
solver `pollux` now shares) runs short jobs first, as shortest-remaining-time does for average JCT, and gives a
job another worker only while that speeds it up more than the same GPUs would elsewhere: elastic jobs scale
sub-linearly, so this picks efficient sizes. It reads the run-time estimates, which `pollux`'s power mean of
goodput speed-ups never does; a queued job's rates are multiplied by its response ratio (`(waited + run) / run`),
so a long job rises as it waits instead of every job jumping the queue at a fixed age. A job that outlives its
estimate is taken to have as much left as it ran past 80% of it (`core.throughput.work_left`), never to be
nearly done. The cost of ordering by time left alone is the tail: a burst of short jobs queues behind long
jobs that hold their GPUs at their minimum, where `pollux` preempts them (its power mean, p = -1, counts a job
without GPUs as infinitely slowed). So the joint sizing may also preempt a running job to admit queued ones
(**preempt-to-admit**): keeping it is worth its completion rate times its response ratio plus what the
preemption costs it (the work since its checkpoint and a restart, as a rate); only jobs whose length something
declared and checkpointed at most a restart's cost ago are candidates, since the work a preemption throws away
is GPU-time the whole cluster pays for again, which no job's own rate sees (allowing it at any point, the
headline's busy trace, seed 0, lost 11,342 GPU-hours to preemptions and restarts against 2,011 with the rule,
for a higher average JCT); and only within one tier of quota, class and priority.
{"".join(texts)}
**Against the targets**: {verdict} {tail_text}{rejected_text}
"""
