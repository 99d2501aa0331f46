"""The heterogeneous job model: jobs of a Sia-style workload on a cluster of several GPU types, run by the one
engine (``simulator.engine.simulate``), for comparisons with the Sia study (SOSP'23, sec. 5.2; issue 33).

What it adds to the engine is a ``ClusterState`` port, ``HeteroCluster`` -- the main engine's
``SimulatedCluster`` (its servers, allocations, lifecycles and apply rules), with each job's progress
computed by this module's physics instead of the cluster's linear segments -- and, for the policies that
decide per GPU type (``sia``, ``gavel``), what the jobs tell them (``with_estimates``). Nothing of the Sia
study's code or data is in this repository: the profiles and workloads are read at run time from a folder
the caller names (``simulator.hetero_gate`` extracts them from the authors' public artifact, never
committed); ``tests/policies/test_hetero.py`` runs the model on synthetic profiles of the same shape.

Modelling choices (the study's simulator's, as its paper and README describe them; each changes figures):

- **cluster**: pools of one GPU type each, ``TypePool`` (nodes x GPUs per node); the study's
  "heterogeneous" cluster is ``SIA_CLUSTER``: 6 x 4 T4 (``aws``), 2 x 8 A100 (``dgx-ext``), 3 x 8 RTX 2080Ti
  (``rtx``). Servers are named ``<type>-<k>``.
- **an inference pool** (optional, ``HeteroCluster(inference=...)``; issue 33 item 5): servers of a GPU type
  of their own, the engine's inference servers (``i0000``..), serving a demand series the caller hands to
  ``run_hetero``; a loaning policy (``aryl``) may lend the ones not needed to training, where a job placed on
  them runs at that type's speed by its profile for the type (so the profiles must cover it), and gives them
  back when demand asks (a reclaim is a restart like any other change of type).
- **one GPU type per job** (``core.gpu_configs``): a job's GPUs are all of one type; its placement is its
  GPUs per node, which sets its measured step time.
- **per-type physics**: one ``Application`` per (model, type) from ``placements-<type>.csv`` and
  ``scalability-<type>.csv`` (``simulator.goodput_profiles``: measured placement, else N-d interpolation),
  gradient statistics from ``validation-*.csv`` (shared by the types). Progress per second is
  ``gain / (step + accum * (step - sync)) / SLOWDOWN[model]`` (the study's calibration of its simulator to
  real runs), epoch by epoch; epoch crossings take whole seconds; a job completes after epoch
  ``max_epochs - 1`` (no target metric).
- **time**: rounds of ``interval_s`` (60 s for ``sia``, 360 s for ``gavel``), counted from 0: jobs advance
  at every round's end, then the policy decides on the jobs submitted by then and not completed; a job
  that completes mid-round keeps its GPUs until the round ends (its completion time is exact).
- **restart**: a job's first start, and every change of its type or of its GPUs per node, holds the new GPUs
  without progress for ``RESTART_S[model]`` seconds (cifar10 50, deepspeech2 25, bert 120, yolov3 80,
  imagenet 250, ncf 15; else 30), counted as a restart; a move to other nodes of the same shape is free, as
  in the study's simulator. No progress is lost (jobs checkpoint at every change).
- **batch size**: ``sia`` jobs choose theirs (Pollux's goodput model, refitted per type on the
  configurations they have run there, ``policies.pollux.GoodputModel``), between the smallest batch their
  GPUs allow and the largest validated one; NCF's requested batch is 32768. ``gavel`` jobs run the
  workload's batch size on the workload's GPU count.
- **what the other policies are told** (``aryl`` and the policies of one engine that read the trace,
  ``trace_jobs(shown=...)``): each job's length as a user would declare it (``simulator.estimates``: exact, or its
  true run time on one GPU times a lognormal error, drawn as every evaluation draws it) and a speed curve: its
  average progress per second over a whole run alone on 1, 2, 4, .. GPUs of the largest training pool's type
  (``reference``), by this module's physics (``HeteroJob.declared_rate``: the batch chosen as the job chooses it,
  so the one-GPU point is the true run time on one GPU the estimates start from; a curve of the requested batch at
  epoch 0, as before 2026-11-30, told cifar10 and deepspeech2 jobs 9-10x their true length and bert's about right,
  so the policy ranked jobs by their model); the progress it reports is its true progress (as a live job reports
  its steps; the engine's reckoning on the curve times its type's declared speed, before 2026-11-30, showed a job
  on a type faster by declaration than for its model as done long before it was, and it was never grown). Per type
  (``run_hetero(type_speeds=True)``, the default), what the live service tells a policy (issue 33 item 4): each
  type's **declared speed** (``ClusterSnapshot.gpu_speed``, ``declared_speeds``: what an operator would declare
  from a one-GPU benchmark of the workload's models -- per type, the geometric mean over the models of one GPU's
  samples per second there over the reference type's, which is 1.0) and each job's **measured speed** per type it
  has run on (``JobView.type_speeds``: its local batch over its pass time at the largest local batch it ran there,
  ``HeteroJob.type_speeds``, as the live store reads its step times). ``aryl`` keeps each job on one type
  (``core.placement``) and values a worker by its job's speed on the server's type
  (``policies.aryl.cycle.type_factors``). ``type_speeds=False``: neither is shown, and ``aryl`` sizes as if every
  type ran at the reference type's speed.
- **what ``sia`` and ``gavel`` are told** (``with_estimates``): ``sia`` -- each job's goodput per configuration from
  its own fitted models (none on a type it has not run on; Sia then bootstraps), its restarts and age, its
  largest useful size (2x the most GPUs it has run on of any type, at most 64); ``gavel`` -- the throughput
  of the job's requested size on each type (the profile's, calibrated), and the rounds it has received.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from scheduler_service.core.clock import Clock
from scheduler_service.core.goodput import GradParams, PerfParams, StepSample, efficiency_gain
from scheduler_service.core.gpu_configs import current_config, gpu_pools, server_types
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import ApplyResult, Plan
from scheduler_service.core.registry import Policy
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, derived
from scheduler_service.policies import create_policy
from scheduler_service.policies.gavel import GavelJob, GavelPolicy, GavelRound
from scheduler_service.policies.pollux import GoodputModel
from scheduler_service.policies.pollux_search import fit_perf_params_lbfgs
from scheduler_service.policies.sia import SiaJob, SiaPolicy
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import simulate
from simulator.estimates import Estimates
from simulator.goodput_jobs import WorkloadJob, placement_of
from simulator.goodput_profiles import Application, load_application
from simulator.model import ClusterSpec, DemandPoint, TraceJob

SLOWDOWN = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5}
RESTART_S = {"cifar10": 50.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 80.0, "imagenet": 250.0, "ncf": 15.0}
# The restart cost Sia's policy charges (its own table: cifar10 and yolov3 differ from the true delays).
SIA_RESTART_PENALTY_S = {"cifar10": 30.0, "deepspeech2": 25.0, "bert": 120.0, "yolov3": 45.0, "imagenet": 250.0}
MAX_GPUS = 64
ALONE_LIMIT_S = 400 * 86400.0   # a run alone (HeteroJob.declared_rate) longer than this is no curve point


@dataclass(frozen=True, slots=True)
class TypePool:
    gpu_type: str
    nodes: int
    gpus_per_node: int


SIA_CLUSTER = (TypePool("aws", 6, 4), TypePool("dgx-ext", 2, 8), TypePool("rtx", 3, 8))


# -- per-type profiles -----------------------------------------------------------------------------

@dataclass
class TypedApp:
    """One model's profile on one GPU type, with the limits the study's simulator applies."""

    app: Application
    gpu_type: str
    scalability: list[tuple[int, int, int]]          # (nodes, replicas, local batch) rows
    min_local: int
    max_local: int
    max_local_by_replicas: dict[int, int]            # measured placements: largest local batch per GPU count
    one_gpu_speed: float                             # samples/s of one GPU at its largest measured batch

    def max_local_for(self, placement: tuple[int, ...]) -> int:
        """The largest local batch measured for this placement (or, unmeasured, for a larger one)."""
        used = tuple(g for g in placement if g)
        pid = int("".join(map(str, min(used[i:] + used[:i] for i in range(len(used))))))
        measured = self.app.placements.get(pid)
        if measured is not None:
            return int(measured[0][-1])
        nodes, replicas = len(used), sum(used)
        bigger = [b for n, r, b in self.scalability if n >= nodes and r >= replicas]
        return max(bigger) if bigger else self.max_local


def load_typed_app(traces_dir: str | Path, name: str, gpu_type: str) -> TypedApp:
    app = load_application(traces_dir, name, gpu_type)
    root = Path(traces_dir) / name
    with (root / f"placements-{gpu_type}.csv").open(newline="") as handle:
        rows = [(str(int(float(r["placement"]))), int(float(r["local_bsz"])), float(r["step_time"]))
                for r in csv.DictReader(handle)]
    with (root / f"scalability-{gpu_type}.csv").open(newline="") as handle:
        scal = [(int(float(r["num_nodes"])), int(float(r["num_replicas"])), int(float(r["local_bsz"])))
                for r in csv.DictReader(handle)]
    by_replicas: dict[int, int] = {}
    for pid, bsz, _ in rows:
        r = sum(int(d) for d in pid)
        by_replicas[r] = max(by_replicas.get(r, 0), bsz)
    single = [(bsz, step) for pid, bsz, step in rows if pid == "1"]
    speed = max(b for b, _ in single) / max(s for _, s in single) if single else 1.0
    max_local = 57 if name == "deepspeech2" and gpu_type == "rtx" else max(b for _, b, _ in rows)
    app = replace(app, max_atomic_bsz=max_local)
    return TypedApp(app, gpu_type, scal, min(b for _, b, _ in rows), max_local, by_replicas, speed)


# -- a job's physics and what it learns -------------------------------------------------------------

_ALONE: dict[tuple[str, int, bool, TypePool, int, float], float] = {}   # HeteroJob.declared_rate's runs
_FITS: dict[tuple[str, str, frozenset[tuple[tuple[int, int, int], tuple[float, float]]]], PerfParams] = {}


@dataclass
class HeteroJob:
    """One job's simulated state: where it runs, its batch, its progress, and its per-type models."""

    index: int
    spec: WorkloadJob
    apps: dict[str, TypedApp]       # per GPU type
    tuned: bool                     # chooses its batch size (sia) or runs the requested one (gavel)
    gpu_type: str | None = None
    placement: tuple[int, ...] = ()
    atomic_bsz: int = 0
    accum_steps: int = 0
    progress: float = 0.0
    epoch: int = 0
    restart_left: float = 0.0
    restarts: int = -1              # -1: never started
    completion_time: float | None = None
    profiles: dict[str, dict[tuple[int, int, int], tuple[float, float]]] = field(default_factory=dict)
    perf: dict[str, PerfParams] = field(default_factory=dict)
    grad: GradParams | None = None
    time_on: dict[str, float] = field(default_factory=dict)   # gavel's rounds received per type
    gpu_seconds: float = 0.0

    @property
    def model(self) -> str:
        return self.spec.application

    @property
    def target_batch(self) -> int:
        return 32768 if self.tuned and self.model == "ncf" else self.spec.batch_size

    def _app(self) -> TypedApp:
        assert self.gpu_type is not None
        return self.apps[self.gpu_type]

    def set_batch(self) -> None:
        """The batch for the current placement (module doc: tuned, or the requested one split)."""
        typed = self._app()
        app = typed.app
        placement = tuple(g for g in self.placement if g)
        nodes, replicas = len(placement), sum(placement)
        max_local = typed.max_local_for(placement)
        perf = self.perf.get(self.gpu_type or "")
        if self.tuned and perf is not None and self.grad is not None:
            model = GoodputModel(perf, self.grad, app.init_batch_size, app.max_batch_size, typed.min_local, max_local)
            _, self.atomic_bsz, self.accum_steps = model.best(nodes, replicas)
        else:
            batch = max(app.init_batch_size, typed.min_local * replicas) if self.tuned else self.target_batch
            local = math.ceil(batch / replicas - 1e-8)
            self.accum_steps = math.ceil(local / max_local - 1e-8) - 1
            if replicas == 1 and batch > app.init_batch_size:
                self.accum_steps = max(1, self.accum_steps)
            self.atomic_bsz = math.ceil(local / (self.accum_steps + 1) - 1e-8)
        cap = typed.max_local_by_replicas.get(replicas)
        if cap is not None:
            self.atomic_bsz = min(self.atomic_bsz, cap)
        self.atomic_bsz = min(self.atomic_bsz, int(app.max_batch_size / (replicas * (self.accum_steps + 1))))

    def observe(self, nodes: int, replicas: int, step: float, sync: float, batch: int) -> None:
        app = self._app().app
        self.grad = app.grad_params(batch, self.epoch)
        gpu_type = self.gpu_type or ""
        profile = self.profiles.setdefault(gpu_type, {})
        key = (nodes, replicas, self.atomic_bsz)
        if key in profile:
            return
        profile[key] = (step, sync)
        memo = (self.model, gpu_type, frozenset(profile.items()))
        fit = _FITS.get(memo)
        if fit is None:
            fit = _FITS[memo] = fit_perf_params_lbfgs(
                [StepSample(n, r, b, s - y, s) for (n, r, b), (s, y) in profile.items()])
        self.perf[gpu_type] = fit

    def reallocate(self, gpu_type: str | None, placement: tuple[int, ...], now: float) -> bool:
        """Runs from ``now`` on ``placement`` (GPUs per node) of ``gpu_type`` (None / (): no GPUs). True if
        that is a restart (module doc)."""
        if not placement or gpu_type is None:
            self.placement, self.atomic_bsz = (), 0
            return False
        if gpu_type == self.gpu_type and placement == self.placement:
            return False
        self.gpu_type, self.placement = gpu_type, placement
        self.set_batch()
        self.restart_left = RESTART_S.get(self.model, 30.0)
        self.restarts += 1
        return True

    def advance(self, start: float, seconds: float) -> None:
        """Run from ``start`` for ``seconds``: the restart delay, then epoch by epoch (module doc)."""
        if not self.placement or self.completion_time is not None:
            return
        gpus = sum(self.placement)
        delay = min(self.restart_left, seconds)
        self.restart_left -= delay
        self.gpu_seconds += seconds * gpus
        now, seconds = start + delay, seconds - delay
        typed = self._app()
        app = typed.app
        placement = tuple(g for g in self.placement if g)
        nodes, replicas = len(placement), sum(placement)
        while seconds > 0 and self.completion_time is None:
            batch = replicas * self.atomic_bsz * (self.accum_steps + 1)
            gain = efficiency_gain(app.grad_params(batch, self.epoch), app.init_batch_size, batch)
            step, sync = app.step_times(placement, self.atomic_bsz)
            self.observe(nodes, replicas, step, sync, batch)
            rate = gain / (step + (step - sync) * self.accum_steps) / SLOWDOWN.get(self.model, 1.0)
            epoch_end = app.epoch_end(self.epoch)
            if self.progress + rate * seconds < epoch_end:
                self.progress += rate * seconds
                seconds = 0
            else:
                delta = round((epoch_end - self.progress) / rate)
                self.epoch += 1
                if self.epoch > app.completion_epoch:
                    self.completion_time = now + delta
                self.progress = epoch_end
                now += delta
                seconds -= delta
            if self.completion_time is None:
                self.set_batch()

    # -- what the policies are told ------------------------------------------------------------------

    def profiled_speeds(self) -> tuple[tuple[str, float], ...]:
        """One GPU's samples per second on every type of its profiles, at the largest batch measured there
        (``TypedApp.one_gpu_speed``): what a one-GPU profile of the job on each type at its arrival tells, as
        the Sia study tells ``sia`` (``sia_estimates``' base speeds)."""
        return tuple((t, typed.one_gpu_speed) for t, typed in sorted(self.apps.items()) if typed.one_gpu_speed > 0)

    def type_speeds(self) -> tuple[tuple[str, float], ...]:
        """One GPU's samples per second on each type the job has run on, from its own step times there, as the
        live store reads them (``core.type_speed.measured_speeds``): its local batch over its pass time (the
        step less the gradient sync), at the largest local batch measured on the type."""
        out = []
        for gpu_type, profile in sorted(self.profiles.items()):
            measured = [(batch, batch / (step - sync)) for (_, _, batch), (step, sync) in profile.items()
                        if batch > 0 and step > sync]
            if measured:
                out.append((gpu_type, max(measured)[1]))
        return tuple(out)

    def goodput(self, gpu_type: str, nodes: int, gpus: int) -> float | None:
        perf = self.perf.get(gpu_type)
        if perf is None or self.grad is None:
            return None
        typed = self.apps[gpu_type]
        model = GoodputModel(perf, self.grad, typed.app.init_batch_size, self.target_batch, typed.min_local,
                             typed.max_local)
        return model.best(nodes, gpus)[0]

    def max_gpus(self) -> int:
        """Sia's largest size: twice the most GPUs it has run on (shared by every type), within limits."""
        sizes = []
        for gpu_type, typed in self.apps.items():
            seen = max((r for _, r, _ in self.profiles.get(gpu_type, {})), default=0)
            sizes.append(min(max(2 * seen, 1), MAX_GPUS, typed.app.max_batch_size // typed.min_local))
        return max(sizes)

    def declared_rate(self, pool: TypePool, gpus: int, step_s: float = 60.0) -> float:
        """Progress per second over a whole run alone on ``gpus`` GPUs of ``pool``, packed, by this module's
        physics (the batch chosen as the job chooses it, the first start's delay included): the speed curve a
        user who timed the job at each size could declare (module doc). Runs advance by ``step_s``, as a
        round. Memoised per (model, batch, pool, size): the run is the same for every job of that spec."""
        key = (self.model, self.spec.batch_size, self.tuned, pool, gpus, step_s)
        rate = _ALONE.get(key)
        if rate is None:
            per = pool.gpus_per_node
            alone = HeteroJob(self.index, self.spec, self.apps, tuned=self.tuned)
            alone.reallocate(pool.gpu_type, (per,) * (gpus // per) + ((gpus % per,) if gpus % per else ()), 0.0)
            now = 0.0
            while alone.completion_time is None:
                if now > ALONE_LIMIT_S:
                    raise ValueError(f"{self.model} on {gpus} {pool.gpu_type} GPUs: no end within {ALONE_LIMIT_S:g} s")
                alone.advance(now, step_s)
                now += step_s
            rate = _ALONE[key] = self.total_progress() / alone.completion_time
        return rate

    def total_progress(self) -> float:
        app = next(iter(self.apps.values())).app
        return float(app.epoch_end(app.completion_epoch))

    def gavel_throughput(self, pool: TypePool, largest: int) -> float:
        """Iterations per second of its requested size, packed on ``pool`` (0.1 where it is too large)."""
        gpus = self.spec.num_replicas
        if gpus > largest:
            return 0.1
        typed = self.apps[pool.gpu_type]
        app = typed.app
        per = pool.gpus_per_node
        placement = (per,) * (gpus // per) + ((gpus % per,) if gpus % per else ())
        local = math.ceil(self.spec.batch_size / gpus - 1e-8)
        accum = math.ceil(local / typed.max_local_for(placement) - 1e-8) - 1
        if gpus == 1:
            accum = max(1, accum)
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, int(app.max_batch_size / (gpus * (accum + 1))))
        step, sync = app.step_times(placement, atomic)
        return 1.0 / (step + (step - sync) * accum) / SLOWDOWN.get(self.model, 1.0)


# -- the ClusterState port -------------------------------------------------------------------------

class HeteroCluster(SimulatedCluster):
    """The simulated cluster of typed pools, its jobs moved by ``HeteroJob`` physics (module doc)."""

    def __init__(self, pools: Sequence[TypePool], jobs: Sequence[HeteroJob], clock: Clock, *, interval_s: float,
                 policy_restart_s: Mapping[str, float] | None = None, inference: TypePool | None = None,
                 gpu_speed: Mapping[str, float] | None = None, profiled: bool = False) -> None:
        """``inference``: a pool of inference servers of a GPU type no training pool has; ``gpu_speed``: the
        declared speed of each type (``declared_speeds``; None: none declared, and no job's measured speeds
        per type are shown either); ``profiled``: each job's speeds per type are shown from its arrival, on
        every type, as a one-GPU profile there gives them (``HeteroJob.profiled_speeds``), not only where it
        has run (module doc)."""
        if inference is not None and inference.gpu_type in {p.gpu_type for p in pools}:
            raise ValueError(f"the inference pool's GPU type {inference.gpu_type!r} is a training pool's too")
        names = [f"{p.gpu_type}-{k:02d}" for p in pools for k in range(p.nodes)]
        every = (*pools, *((inference,) if inference else ()))
        spec = ClusterSpec(len(names), inference.nodes if inference else 0, max(p.gpus_per_node for p in every),
                           training_gpu_types=tuple((p.gpu_type, p.nodes) for p in pools),
                           inference_gpu_type=inference.gpu_type if inference else "",
                           gpu_speed=tuple(sorted((gpu_speed or {}).items())))
        # The router acknowledges a drain a second after a loan begins, as the engine's default (no router
        # where there is no inference pool, as in the study).
        super().__init__(spec, clock, restart_overhead_s=0.0, drain_ack_s=1.0 if inference else None,
                         training_server_ids=names)
        per_node = {p.gpu_type: p.gpus_per_node for p in every}
        for record in self._servers.values():  # a pool of smaller nodes: fewer GPUs per server
            if len(record.gpu_indices) != per_node[record.gpu_type]:
                record.gpu_indices = tuple(range(per_node[record.gpu_type]))
                record.view = None
        self._server_views = tuple(self._servers[s].build_view() for s in sorted(self._servers))
        self.pools = tuple(pools)
        self.inference = inference
        self.hetero = {job.index + 1: job for job in jobs}   # by job id
        self.interval_s = interval_s
        self._advanced_to = 0.0
        self._policy_restart_s = dict(policy_restart_s or SIA_RESTART_PENALTY_S)
        self.cluster_time = {p.gpu_type: 0.0 for p in pools}
        self.gpu_seconds_by_type: dict[str, float] = {}   # GPUs held by jobs, by type (loaned ones too)
        self.show_type_speeds = gpu_speed is not None
        self.profiled = profiled
        # Each job's view with its measured speeds per type, while its view and speeds stay (so a view the
        # engine reuses stays the same object, as a policy's carried estimates expect).
        self._typed_views: dict[int, tuple[JobView, tuple[tuple[tuple[str, float], ...], float], JobView]] = {}

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        """The engine's snapshot, each job with the progress it has truly made (``JobView.work_done``, as a live
        job reports its steps, not the engine's reckoning on its declared curve) and, where the cluster declares
        speeds, its measured speed per GPU type (``JobView.type_speeds``, as the live store shows it) (module
        doc)."""
        snap = super().snapshot(seed)
        views, changed = [], False
        for view in snap.jobs:
            job = self.hetero[view.job_id]
            speeds = (job.profiled_speeds() if self.profiled else job.type_speeds()) if self.show_type_speeds else ()
            if not speeds and job.progress == view.work_done:
                views.append(view)
                continue
            known = self._typed_views.get(view.job_id)
            if known is None or known[0] is not view or known[1] != (speeds, job.progress):
                known = self._typed_views[view.job_id] = (
                    view, (speeds, job.progress), replace(view, type_speeds=speeds, work_done=job.progress))
            views.append(known[2])
            changed = True
        return derived(snap, jobs=tuple(views)) if changed else snap

    def trace_jobs(self, shown: Estimates | None = None, seed: int = 0) -> list[TraceJob]:
        """The engine's arrivals: every job one GPU per worker, 1..64 workers, its work its own; each
        arrives at the end of the round it was submitted in, where the policy first sees it (its JCT
        counts from its true submission, ``HeteroJob.spec.submit_time``). ``shown``: what a policy that
        reads the trace sees of the job (module doc), its errors drawn from ``seed``; None: nothing (``sia``
        and ``gavel`` are told by ``informed``)."""
        jobs = []
        for key, job in self.hetero.items():
            trace = TraceJob(key, job.spec.name, self._round_end(job.spec.submit_time), 1, 1, MAX_GPUS,
                             work=math.inf, throughput=((1, 1.0),), model=job.model)
            if shown is not None:
                trace = self._declared(trace, job, shown, seed)
            jobs.append(trace)
        return jobs

    def reference_pool(self) -> TypePool:
        """The training pool of the most GPUs (the first of them): the type the declared curves are of."""
        return max(self.pools, key=lambda p: p.nodes * p.gpus_per_node)

    def _declared(self, trace: TraceJob, job: HeteroJob, shown: Estimates, seed: int) -> TraceJob:
        pool = self.reference_pool()
        largest = min(MAX_GPUS, pool.nodes * pool.gpus_per_node)
        sizes = sorted({1, largest} | {2 ** k for k in range(7) if 2 ** k <= largest})
        points = []
        for n in sizes:   # up to the largest size its profile measures on the reference type
            try:
                points.append((n, job.declared_rate(pool, n)))
            except ValueError:
                break
        curve = tuple(points)
        total = job.total_progress()
        if shown.kind == "exact":
            return replace(trace, throughput=curve, declared_work=total)
        if shown.kind == "none":
            return replace(trace, throughput=curve, declared_work=0.0, declared_runtime_s=None)
        runtime = total / curve[0][1] * shown.error_factor(trace.job_id, seed)
        return replace(trace, throughput=curve, declared_work=0.0, declared_runtime_s=runtime)

    def _round_end(self, t: float) -> float:
        return math.ceil(t / self.interval_s - 1e-9) * self.interval_s

    def submit(self, trace: TraceJob) -> None:
        super().submit(trace)
        job = self.hetero[trace.job_id]
        for pool in self.pools:  # gavel's accounting: every job starts with half a round on every type
            job.time_on[pool.gpu_type] = self.interval_s / 2
            self.cluster_time[pool.gpu_type] += self.interval_s / 2

    def complete_due(self) -> list[int]:
        """Jobs advance to the last round's end; those done by then complete (at their exact time)."""
        boundary = math.floor(self.now / self.interval_s + 1e-9) * self.interval_s
        if boundary > self._advanced_to:
            for key, record in self._running.items():
                job = self.hetero[key]
                job.advance(self._advanced_to, boundary - self._advanced_to)
                # gavel's accounting: the rounds each job held a type, counted as each round ends
                gpu_type = self._servers[record.workers[0].server_id].gpu_type
                rounds = (boundary - self._advanced_to)
                job.time_on[gpu_type] = job.time_on.get(gpu_type, 0.0) + rounds
                self.cluster_time[gpu_type] = self.cluster_time.get(gpu_type, 0.0) + rounds
                self.gpu_seconds_by_type[gpu_type] = (self.gpu_seconds_by_type.get(gpu_type, 0.0)
                                                      + rounds * len(record.workers))
            self._advanced_to = boundary
        done = sorted(k for k in self._running if self.hetero[k].completion_time is not None)
        for key in done:
            self.finish(key)
            end = self.hetero[key].completion_time
            assert end is not None
            self.outcomes[key].end = end
        return done

    def apply(self, plan: Plan) -> ApplyResult:
        before = {k: self._shape(k) for k in self._active}
        result = super().apply(plan)
        now = self.now
        for key in sorted(set(result.started) | set(result.scaled) | set(result.preempted)):
            after = self._shape(key)
            if after != before.get(key):
                self.hetero[key].reallocate(after[0], after[1], now)
        return result

    def _shape(self, key: int) -> tuple[str | None, tuple[int, ...]]:
        workers = self._active[key].workers if key in self._active else ()
        if not workers:
            return None, ()
        nodes = [w.server_id for w in sorted(workers, key=lambda w: w.rank) for _ in w.gpu_indices]
        # GPUs per server, in the order the servers first appear by rank (a job whose ranks interleave
        # servers, as a scale-out may leave them, has the same placement as one whose ranks do not).
        order = {s: i for i, s in enumerate(dict.fromkeys(nodes))}
        return self._servers[nodes[0]].gpu_type, placement_of(sorted(order[s] for s in nodes))

    # -- estimates handed to the policies --------------------------------------------------------------

    def sia_estimates(self, snapshot: ClusterSnapshot, active: Sequence[JobView]) -> dict[int, SiaJob]:
        types = server_types(snapshot)
        out: dict[int, SiaJob] = {}
        for view in active:
            job = self.hetero[view.job_id]
            penalty = self._policy_restart_s.get(job.model, 30.0)
            out[view.job_id] = SiaJob(
                view.job_id, job.goodput, {t: a.one_gpu_speed for t, a in job.apps.items()},
                max_gpus=job.max_gpus(), current=current_config(view, types),
                age_s=snapshot.now - job.spec.submit_time, restarts=max(job.restarts, 0), restart_s=penalty,
                in_restart=job.restart_left > 0 and bool(job.placement))
        return out

    def gavel_estimates(self, snapshot: ClusterSnapshot, active: Sequence[JobView]) -> GavelRound:
        pools = gpu_pools(snapshot)
        largest = {p.gpu_type: min(p.gpus, MAX_GPUS) for p in pools}
        by_type = {p.gpu_type: p for p in self.pools}
        jobs = {}
        for view in active:
            job = self.hetero[view.job_id]
            jobs[view.job_id] = GavelJob(view.job_id, job.spec.num_replicas,
                                         {p.gpu_type: job.gavel_throughput(by_type[p.gpu_type], largest[p.gpu_type])
                                          for p in pools}, dict(job.time_on))
        return GavelRound(jobs, dict(self.cluster_time))


def informed(policy: Policy, cluster: HeteroCluster) -> Policy:
    """The registered policy, told what this job model's jobs know (module doc); others as they are."""
    if isinstance(policy, SiaPolicy):
        return policy.with_estimates(cluster.sia_estimates)
    if isinstance(policy, GavelPolicy):
        return policy.with_estimates(cluster.gavel_estimates)
    return policy


# -- a run ---------------------------------------------------------------------------------------------

ROUND_S = {"sia": 60.0, "gavel": 360.0}   # the study's rounds per policy (others: 60 s)


@dataclass(frozen=True)
class HeteroRunResult:
    policy: str
    jcts: dict[str, float]
    restarts: dict[str, int]
    end_time: float
    cycles: int
    decision_s: tuple[float, ...]     # wall seconds of each decision
    wall_s: float
    gpu_seconds_by_type: dict[str, float] = field(default_factory=dict)   # GPU-seconds jobs held per type
    loans: int = 0                    # inference servers lent to training
    models: dict[str, str] = field(default_factory=dict)        # each job's model, by name
    first_waits: dict[str, float] = field(default_factory=dict)  # from submission to its first start, by name

    @property
    def average_jct(self) -> float:
        return sum(self.jcts.values()) / len(self.jcts) if self.jcts else 0.0


def declared_speeds(apps: Mapping[str, Mapping[str, TypedApp]], reference: str) -> dict[str, float]:
    """The speed an operator declares for each GPU type (``scheduling.gpu_speeds``) from a one-GPU benchmark of
    the workload's models: per type, the geometric mean over the models of one GPU's speed there
    (``TypedApp.one_gpu_speed``) over its speed on ``reference``, which is 1.0 (module doc)."""
    types = sorted({t for by_type in apps.values() for t in by_type})
    out = {}
    for gpu_type in types:
        ratios = [by_type[gpu_type].one_gpu_speed / by_type[reference].one_gpu_speed for by_type in apps.values()
                  if gpu_type in by_type and reference in by_type and by_type[reference].one_gpu_speed > 0]
        if ratios:
            out[gpu_type] = 1.0 if gpu_type == reference else round(
                math.exp(sum(math.log(r) for r in ratios) / len(ratios)), 3)
    return out


def run_hetero(workload: Sequence[WorkloadJob], traces_dir: str | Path, policy: str, *,
               pools: Sequence[TypePool] = SIA_CLUSTER, interval_s: float | None = None,
               params: PolicyParams | None = None, max_time_s: float = 30 * 86400.0,
               check_plans: bool = False, inference: TypePool | None = None,
               demand: Sequence[DemandPoint] = (), estimates: Estimates | str = "exact",
               seed: int = 0, type_speeds: bool = True, profiled: bool = False) -> HeteroRunResult:
    """Simulate ``workload`` under the registered ``policy`` on ``pools`` with the engine (module doc).
    ``check_plans``: the engine asserts that every plan keeps the invariants and is applied in full.
    ``inference`` and ``demand``: an inference pool and the servers of it needed over time (empty: no
    demand signal, so nothing is loaned). ``estimates``: what a policy that reads the trace is told of
    each job's length (``simulator.estimates``), drawn from ``seed`` (also every snapshot's seed).
    ``type_speeds``: the cluster declares each type's speed (``declared_speeds``, relative to the reference
    type's) and shows each job's measured speed per type (module doc); False: neither. ``profiled`` (with
    ``type_speeds``): each job's speed on every type is shown from its arrival, by a one-GPU profile there
    (``HeteroJob.profiled_speeds``, what the study tells ``sia``), not only on the types it has run on."""
    import time

    interval = interval_s if interval_s is not None else ROUND_S.get(policy, 60.0)
    params = params or PolicyParams()
    names = sorted({j.application for j in workload})
    types = [p.gpu_type for p in pools] + ([inference.gpu_type] if inference else [])
    apps = {name: {t: load_typed_app(traces_dir, name, t) for t in types} for name in names}
    jobs = [HeteroJob(i, spec, apps[spec.application], tuned=policy != "gavel") for i, spec in enumerate(workload)]
    clock = VirtualClock(0.0)
    reference = max(pools, key=lambda p: p.nodes * p.gpus_per_node).gpu_type   # HeteroCluster.reference_pool
    cluster = HeteroCluster(pools, jobs, clock, interval_s=interval, inference=inference,
                            gpu_speed=declared_speeds(apps, reference) if type_speeds else None,
                            profiled=profiled and type_speeds)
    built = create_policy(policy, params).policy
    decider = informed(built, cluster)
    told_apart = decider is not built   # sia, gavel: told by their estimates, not the trace
    arrivals = cluster.trace_jobs(None if told_apart else Estimates.parse(estimates), seed)
    timings: list[float] = []

    class Timed:
        name = decider.name

        def schedule(self, snapshot: ClusterSnapshot) -> Plan:
            started = time.perf_counter()
            plan = decider.schedule(snapshot)
            timings.append(time.perf_counter() - started)
            return plan

    # Every event falls on a round's end (arrivals are moved there, jobs complete there), so cycles run at
    # rounds' ends, and at once again after a plan that moves a job in two steps (``PREEMPTED_TO_MOVE``).
    result = simulate(arrivals, list(demand), cluster.spec, Timed(), params, seed=seed, cycle_interval_s=interval,
                      min_cycle_gap_s=0.0, max_time_s=max_time_s, cluster=cluster, clock=clock,
                      check_plans=check_plans)
    jcts = {j.spec.name: j.completion_time - j.spec.submit_time for j in jobs if j.completion_time is not None}
    first_waits = {cluster.hetero[key].spec.name: outcome.start - cluster.hetero[key].spec.submit_time
                   for key, outcome in cluster.outcomes.items() if outcome.start is not None}
    return HeteroRunResult(policy, jcts, {j.spec.name: max(j.restarts, 0) for j in jobs},
                           max((j.completion_time for j in jobs if j.completion_time is not None), default=0.0),
                           result.cycles, tuple(timings), result.wall_s, dict(cluster.gpu_seconds_by_type),
                           sum(s.loans for s in result.servers), {j.spec.name: j.model for j in jobs}, first_waits)


def summary(result: HeteroRunResult) -> dict[str, object]:
    """The figures of one run (``aryl-sim --job-model hetero``), JSON-ready, in the goodput model's keys."""
    jcts = sorted(result.jcts.values())
    times = sorted(result.decision_s)

    def quantile(values: list[float], q: float) -> float:
        if not values:
            return 0.0
        position = (len(values) - 1) * q
        low = int(position)
        high = min(low + 1, len(values) - 1)
        return values[low] + (values[high] - values[low]) * (position - low)

    by_model: dict[str, dict[str, float]] = {}
    for model in sorted(set(result.models.values())):
        names = [n for n, m in result.models.items() if m == model and n in result.jcts]
        waits = [result.first_waits[n] for n in names if n in result.first_waits]
        by_model[model] = {"jobs": len(names),
                           "avg_jct_s": round(sum(result.jcts[n] for n in names) / max(1, len(names)), 1),
                           "avg_first_wait_s": round(sum(waits) / max(1, len(waits)), 1)}
    return {
        "by_model": by_model,
        "policy": result.policy, "job_model": "hetero", "jobs": len(jcts), "avg_jct_s": round(result.average_jct, 3),
        "median_jct_s": quantile(jcts, 0.5), "p99_jct_s": quantile(jcts, 0.99), "makespan_s": result.end_time,
        "avg_restarts": round(sum(result.restarts.values()) / max(1, len(result.restarts)), 3),
        "gpu_h_by_type": {t: round(v / 3600, 1) for t, v in sorted(result.gpu_seconds_by_type.items())},
        "loans": result.loans, "wall_s": round(result.wall_s, 2),
        "decision_mean_ms": round(1000 * sum(times) / max(1, len(times)), 2),
        "decision_p95_ms": round(1000 * quantile(times, 0.95), 2), "jcts_s": dict(result.jcts),
    }


def parse_pools(text: str) -> tuple[TypePool, ...]:
    """``aws:6x4,dgx-ext:2x8,rtx:3x8`` (type:nodes x GPUs per node, ...) -> pools."""
    pools = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        try:
            gpu_type, shape = part.rsplit(":", 1)
            nodes, per = shape.lower().split("x")
            pools.append(TypePool(gpu_type, int(nodes), int(per)))
        except ValueError:
            raise ValueError(f"bad GPU pool {part!r}: expected TYPE:NODESxGPUS, e.g. rtx:3x8") from None
    if not pools:
        raise ValueError("no GPU pool given")
    return tuple(pools)


__all__ = ["SIA_CLUSTER", "HeteroCluster", "HeteroJob", "HeteroRunResult", "TypePool", "TypedApp", "informed",
           "load_typed_app", "parse_pools", "run_hetero",
           "summary"]

