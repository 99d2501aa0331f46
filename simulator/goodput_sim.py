"""The goodput job model in a cluster: Pollux workloads (``pollux-data/workloads*/workload-N.csv``) run on
``nodes`` x ``gpus_per_node`` GPUs, a decision every ``interval_s``, each job's progress from its
application's measured profile (``simulator.goodput_profiles``) and the goodput equations of
``scheduler_service.core.goodput``. It reproduces the setting of the Pollux study's simulator (OSDI'21,
section 5.3) so that Aryl's policies can be compared with the authors' published figures.

Modelling choices (each is the authors'; each changes the figures):

- **time**: fixed ticks of ``interval_s`` (60 s). Every job advances a tick, then the policy decides at
  the tick's end on the jobs submitted by then and not completed; a job submitted mid-tick waits for the
  next decision. Completion times are exact to the second (see below), so JCT is not a multiple of 60.
- **restart**: every allocation change -- the first start included, and a move to other GPUs of the same
  count -- costs ``restart_s`` (30 s) without progress, counted as attained service. A preempted or
  resized job loses no progress (no checkpoint interval), and jobs never fail.
- **no interference** between jobs sharing a node, and no cluster autoscaling (the study's defaults).
- **progress** within a tick: at the configuration's true step time and true efficiency gain
  (``Application.step_times`` and ``Application.gain``, gradient statistics of the current epoch),
  ``gain / step_time`` iterations-at-initial-batch per second, piecewise by epoch: crossing an epoch
  boundary takes ``round(to_go / rate)`` whole seconds (half to even; the progress is then set to the
  boundary exactly) and the new epoch's statistics apply from there; the job completes when it finishes
  its last epoch.
- **batch size**: fixed as the workload requests it (Tiresias, Optimus); split over the replicas as
  ``core.goodput.split_batch`` (one GPU running more than the initial batch makes two passes), the atomic
  batch cut so that the total stays within the largest validated batch.
- **placement**: the policy returns, per job, one node index per GPU; the job's placement is the GPUs per
  node in that order (consecutive equal indices), which sets its measured step time.
- **NCF** jobs never get more than one GPU (Optimus, Pollux).
- **Pollux's jobs** (``pollux``) choose their own batch size: before they have run, the smallest their GPUs
  allow; then, after every stretch of training and at every re-allocation, the best by their goodput model
  (``policies.pollux.GoodputModel``): the step-time parameters refitted
  (``policies.pollux_search.fit_perf_params_lbfgs``) each time they run a configuration (nodes, GPUs,
  atomic batch) not seen before, and the gradient statistics last measured. NCF keeps 32768.

Policies: ``tiresias`` (``scheduler_service.policies.tiresias.tiresias_decide``, requested GPUs as the
gang; queue 0 in arrival order, queue 1 in demotion order) and ``optimus``
(``scheduler_service.policies.optimus.optimus_allocate``, the study's Optimus+Oracle: the oracle's step
time is the true one of a *packed* placement (4 GPUs per node) whatever the job's real placement, with
at least two passes on one GPU even at the initial batch size; ``max_gpus`` = batch size // smallest
atomic batch; the remaining iterations at the requested batch size from the start of the current epoch,
1 in the last). The decisions are the registered policies' own functions, imported, not copied; the
placement of both is ``core.most_free.place_in_order`` (kept jobs stay; the others take the most free node
first). ``pollux`` (``scheduler_service.policies.pollux.pollux_decide``, ``PolluxDecider``) on the jobs' own
fitted models. ``sjf`` and ``aryl-noloan``: the registered policies themselves on a snapshot of the
simulated jobs, their plans applied (``SnapshotDecider``).
"""

from __future__ import annotations

import csv
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from scheduler_service.core.goodput import GradParams, PerfParams, StepSample, progress_rate, split_batch
from scheduler_service.core.most_free import place_in_order
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView, WorkerView
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.policies.optimus import OptimusJob, optimus_allocate, optimus_place
from scheduler_service.policies.pollux import GoodputModel, PolluxJob, pollux_decide
from scheduler_service.policies.pollux_search import fit_perf_params_lbfgs
from scheduler_service.policies.tiresias import TiresiasJob, TiresiasState, tiresias_decide
from simulator.goodput_profiles import Application, load_application

# Each Pollux job refits 7 step-time parameters (scipy's L-BFGS-B) whenever it runs a new configuration:
# thousands of tiny fits per run, in which BLAS threads only contend (0.6 s a fit instead of 0.03 s on a
# busy 2-core machine). scipy's BLAS (not numpy's) reads this when scipy is first imported, which the
# simulation does lazily, after this; an explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@dataclass(frozen=True, slots=True)
class WorkloadJob:
    name: str
    submit_time: float
    application: str
    num_replicas: int   # GPUs requested (Tiresias' gang)
    batch_size: int     # total batch size requested


class WorkloadError(ValueError):
    """A workload file is malformed; the message names the file and line."""


def load_workload(path: str | Path) -> list[WorkloadJob]:
    """``name,time,application,num_replicas,batch_size`` rows, in file order."""
    path = Path(path)
    jobs: list[WorkloadJob] = []
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            need = ("name", "time", "application", "num_replicas", "batch_size")
            missing = [c for c in need if c not in (reader.fieldnames or ())]
            if missing:
                raise WorkloadError(f"{path}: missing column(s) {', '.join(missing)}")
            for line, row in enumerate(reader, start=2):
                try:
                    jobs.append(WorkloadJob(row["name"], float(row["time"]), row["application"],
                                            int(row["num_replicas"]), int(row["batch_size"])))
                except ValueError as exc:
                    raise WorkloadError(f"{path}:{line}: {exc}") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: {exc.strerror or exc}") from exc
    return jobs


@dataclass(slots=True)
class SimJob:
    """A job's simulated state (the authors' ``Job``: placement, batch split, progress, epoch)."""

    index: int
    spec: WorkloadJob
    app: Application
    placement: tuple[int, ...] = ()
    atomic_bsz: int = 0
    accum_steps: int = 0
    progress: float = 0.0
    epoch: int = 0
    restart_left: float = 0.0
    attained_gpu_s: float = 0.0
    completion_time: float | None = None
    restarts: int = -1  # -1: never started
    # Pollux's jobs (``adaptive``): the batch size is the job's own choice, from the goodput model it fits
    # to the configurations it has run (``profile``: (nodes, replicas, atomic batch) -> (step, sync) s)
    # and the gradient statistics it last measured.
    adaptive: bool = False
    profile: dict[tuple[int, int, int], tuple[float, float]] = field(default_factory=dict)
    perf: PerfParams | None = None
    grad: GradParams | None = None

    @property
    def batch_size(self) -> int:
        """The batch size asked for (Pollux's NCF jobs too: 32768, as the authors fix it)."""
        return 32768 if self.adaptive and self.app.name == "ncf" else self.spec.batch_size

    def model(self) -> GoodputModel | None:
        if self.perf is None or self.grad is None:
            return None
        app = self.app
        return GoodputModel(self.perf, self.grad, app.init_batch_size, app.max_batch_size, app.min_atomic_bsz,
                            app.max_atomic_bsz)

    def set_batch(self) -> None:
        replicas = sum(self.placement)
        app = self.app
        nodes = len([g for g in self.placement if g])
        model = self.model() if self.adaptive and app.name != "ncf" else None
        if model is not None:
            _, atomic, accum = model.best(nodes, replicas)
            self.accum_steps = accum
            self.atomic_bsz = min(atomic, int(app.max_batch_size / (replicas * (accum + 1))))
            return
        batch = self.batch_size
        if self.adaptive and app.name != "ncf":  # no model yet: the smallest batch the GPUs allow
            batch = max(app.init_batch_size, app.min_atomic_bsz * replicas)
        split = split_batch(batch, replicas, app.max_atomic_bsz,
                            init_bsz=app.init_batch_size, max_batch_size=app.max_batch_size)
        self.atomic_bsz, self.accum_steps = split.atomic_bsz, split.accum_steps

    def observe(self, batch: int, step: float, sync: float) -> None:
        """What a Pollux job measures while it runs: the gradient statistics, and a step-time sample of a
        configuration not yet seen, which refits its step-time parameters."""
        self.grad = self.app.grad_params(batch, self.epoch)
        key = (len([g for g in self.placement if g]), sum(self.placement), self.atomic_bsz)
        if key in self.profile:
            return
        self.profile[key] = (step, sync)
        self.perf = _fit(self.app.name, self.profile)

    def reallocate(self, placement: tuple[int, ...], restart_s: float) -> None:
        self.placement = placement
        if placement:
            self.set_batch()
            self.restart_left = restart_s
            self.restarts += 1
        else:
            self.atomic_bsz = 0

    def advance(self, start: float, seconds: float) -> None:
        """Run from ``start`` for ``seconds`` (module doc: restart delay, then epoch by epoch)."""
        if not self.placement or self.completion_time is not None:
            return
        gpus = sum(self.placement)
        delay = min(self.restart_left, seconds)
        self.restart_left -= delay
        self.attained_gpu_s += delay * gpus
        now, seconds = start + delay, seconds - delay
        app = self.app
        while seconds > 0 and self.completion_time is None:
            batch = sum(self.placement) * self.atomic_bsz * (self.accum_steps + 1)
            step, sync = app.step_times(self.placement, self.atomic_bsz)
            rate = progress_rate(app.gain(batch, self.epoch), step + (step - sync) * self.accum_steps)
            if self.adaptive:
                self.observe(batch, step, sync)
            epoch_end = app.epoch_end(self.epoch)
            if self.progress + rate * seconds < epoch_end:
                self.progress += rate * seconds
                self.attained_gpu_s += seconds * gpus
                seconds = 0
            else:
                delta = round((epoch_end - self.progress) / rate)
                self.epoch += 1
                if self.epoch > app.completion_epoch:
                    self.completion_time = now + delta
                self.progress = epoch_end
                now += delta
                self.attained_gpu_s += delta * gpus
                seconds -= delta
            if self.adaptive:  # the batch size is chosen again after every stretch of training
                self.set_batch()


_FITS: dict[tuple[str, frozenset[tuple[tuple[int, int, int], tuple[float, float]]]], PerfParams] = {}


def _fit(app: str, profile: dict[tuple[int, int, int], tuple[float, float]]) -> PerfParams:
    """``policies.pollux_search.fit_perf_params_lbfgs`` on a job's samples, memoised on the samples: jobs of one
    model that ran the same configurations hold the same fit."""
    key = (app, frozenset(profile.items()))
    known = _FITS.get(key)
    if known is None:
        samples = [StepSample(n, r, b, step - sync, step) for (n, r, b), (step, sync) in profile.items()]
        known = _FITS[key] = fit_perf_params_lbfgs(samples)
    return known


def _placement_of(nodes: list[int]) -> tuple[int, ...]:
    """GPUs per node, in the order of ``nodes`` (one node index per GPU)."""
    out: list[int] = []
    for i, node in enumerate(nodes):
        if i and node == nodes[i - 1]:
            out[-1] += 1
        else:
            out.append(1)
    return tuple(out)


def _packed(gpus: int, per_node: int) -> tuple[int, ...]:
    full, rest = divmod(gpus, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


class Decider(Protocol):
    """One policy's cycle over the simulated jobs: (active jobs in arrival order, their previous
    allocations, now) -> allocations, one node index per GPU. Holds what the policy keeps between cycles."""

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]: ...


@dataclass
class TiresiasDecider:
    """``tiresias_decide`` on the requested GPUs as gangs; its queues carried from cycle to cycle."""

    nodes: int
    gpus_per_node: int
    state: TiresiasState = field(default_factory=TiresiasState)

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        self.state, run = tiresias_decide(self.state, [TiresiasJob(j.index, j.spec.num_replicas) for j in active],
                                          now, self.nodes * self.gpus_per_node)
        kept = {k: previous[k] for k in run if previous.get(k)}
        capacity = dict.fromkeys(range(self.nodes), self.gpus_per_node)
        return place_in_order(run, {j.index: j.spec.num_replicas for j in active}, kept, capacity)


@dataclass
class OptimusOracleDecider:
    """``optimus_allocate`` with the oracle's step times and remaining iterations (module doc)."""

    nodes: int
    gpus_per_node: int
    _memo: dict[tuple[str, int, int], float] = field(default_factory=dict)

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        jobs = [OptimusJob(j.index, 1 if j.app.name == "ncf" else j.spec.batch_size // j.app.min_atomic_bsz,
                           self._remaining(j), self._step_time(j)) for j in active]
        count = optimus_allocate(jobs, self.nodes * self.gpus_per_node)
        return optimus_place(count, previous, dict.fromkeys(range(self.nodes), self.gpus_per_node))

    @staticmethod
    def _remaining(job: SimJob) -> float:
        """Iterations left at the requested batch size, counted to the end of the current epoch."""
        app, batch = job.app, job.spec.batch_size
        if app.completion_epoch <= job.epoch:
            return 1.0
        return app.iterations_after(batch, app.completion_epoch) - app.iterations_after(batch, job.epoch)

    def _step_time(self, job: SimJob) -> Callable[[int], float]:
        app, batch = job.app, job.spec.batch_size

        def step_time(replicas: int) -> float:
            key = (app.name, batch, replicas)
            known = self._memo.get(key)
            if known is None:
                # The authors' oracle: a packed placement, and at least two passes on one GPU.
                split = split_batch(batch, replicas, app.max_atomic_bsz, max_batch_size=app.max_batch_size,
                                    init_bsz=0 if replicas == 1 else None)
                step, sync = app.step_times(_packed(replicas, self.gpus_per_node), split.atomic_bsz)
                known = self._memo[key] = step + (step - sync) * split.accum_steps
            return known

        return step_time


@dataclass
class PolluxDecider:
    """``pollux_decide`` on the jobs' own goodput models (fitted to what each ran), least attained
    service first; a job may take at most twice the most GPUs it has run on (at least 1, at most 64
    and as many as its smallest atomic batch allows in its largest batch); NCF one GPU (the authors')."""

    nodes: int
    gpus_per_node: int
    adaptive_batch: bool = True

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        ordered = sorted(active, key=lambda j: (j.attained_gpu_s, j.spec.submit_time))
        jobs = []
        for j in ordered:
            app = j.app
            seen = max((r for _, r, _ in j.profile), default=0)
            most = 1 if app.name == "ncf" else min(max(2 * seen, 1), 64, app.max_batch_size // app.min_atomic_bsz)
            held: dict[int, int] = {}
            for node in previous.get(j.index, ()):
                held[node] = held.get(node, 0) + 1
            jobs.append(PolluxJob(j.index, most, held, now - j.spec.submit_time, max(j.restarts, 0), j.model()))
        return pollux_decide(jobs, dict.fromkeys(range(self.nodes), self.gpus_per_node))


@dataclass
class SnapshotDecider:
    """A registered policy (``create_policy(name)``) deciding on a ``ClusterSnapshot`` of the simulated jobs,
    its plan applied to the allocations: how Aryl's own policies (``sjf``, ``aryl-noloan``) run on the
    goodput model. Each job is a gang of its requested GPUs (``min_workers``, 1 GPU per worker); elastic
    (``elastic``) up to 16x that, within what its batch allows (the smallest atomic batch per GPU) and one
    GPU for NCF, as ``optimus``. It declares what an oracle knows, as ``optimus`` is given: its progress
    rate per worker count at its requested batch size (this epoch's efficiency, a packed placement) as its
    throughput points, and its training target and progress as its total work and work done. The batch
    size stays the requested one (the policies do not choose it)."""

    nodes: int
    gpus_per_node: int
    policy: str = "sjf"
    elastic: bool = False
    params: PolicyParams = field(default_factory=PolicyParams)
    _workers: dict[int, tuple[WorkerView, ...]] = field(default_factory=dict)
    _started: dict[int, float] = field(default_factory=dict)
    _resized: dict[int, float] = field(default_factory=dict)

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        from scheduler_service.policies import create_policy  # the registry imports every policy

        alive = {j.index for j in active}
        self._workers = {k: v for k, v in self._workers.items() if k in alive}
        views = [self._view(j, now) for j in active]
        allocated = sorted((int(w.server_id[1:]), g, k) for k, ws in self._workers.items() for w in ws
                           for g in w.gpu_indices)
        servers = tuple(ServerView(f"n{i}", Pool.TRAINING, ServerState.TRAINING, tuple(range(self.gpus_per_node)),
                                   allocated=tuple((g, k) for n, g, k in allocated if n == i))
                        for i in range(self.nodes))
        plan = create_policy(self.policy, self.params).schedule(ClusterSnapshot(now=now, servers=servers,
                                                                                jobs=tuple(views)))
        for p in plan.preemptions:
            self._workers.pop(p.job_id, None)
        changes = [(s.job_id, s.workers) for s in plan.scales] + [(s.job_id, s.workers) for s in plan.starts]
        for key, placed in changes:
            self._workers[key] = tuple(WorkerView(w.rank, w.server_id, w.gpu_indices) for w in placed)
            self._started.setdefault(key, now)
            self._resized[key] = now
        return {k: sorted(int(w.server_id[1:]) for w in ws for _ in w.gpu_indices)
                for k, ws in self._workers.items() if ws}

    def _view(self, job: SimJob, now: float) -> JobView:
        app, batch = job.app, job.spec.batch_size
        request = 1 if app.name == "ncf" else job.spec.num_replicas
        most = request
        if self.elastic and app.name != "ncf":
            most = max(request, min(16 * request, batch // app.min_atomic_bsz, self.nodes * self.gpus_per_node))
        gain = app.gain(batch, min(job.epoch, app.completion_epoch))
        points = []
        for w in range(1, most + 1):
            split = split_batch(batch, w, app.max_atomic_bsz, init_bsz=app.init_batch_size,
                                max_batch_size=app.max_batch_size)
            step, sync = app.step_times(_packed(w, self.gpus_per_node), split.atomic_bsz)
            points.append((w, progress_rate(gain, step + (step - sync) * split.accum_steps)))
        workers = self._workers.get(job.index, ())
        target = app.epoch_end(app.completion_epoch)
        return JobView(job_id=job.index, state=JobState.RUNNING if workers else JobState.PENDING, gpus_per_worker=1,
                       min_workers=request, max_workers=most, priority=0, submitted_at=job.spec.submit_time,
                       workers=workers, throughput_points=tuple(points), total_work=target,
                       work_done=min(job.progress, target), started_at=self._started.get(job.index),
                       last_resized_at=self._resized.get(job.index))


def _registered(name: str, elastic: bool) -> Callable[[int, int, PolicyParams | None], Decider]:
    return lambda nodes, gpus, params: SnapshotDecider(nodes, gpus, name, elastic, params or PolicyParams())


def _authors(decider: Callable[[int, int], Decider]) -> Callable[[int, int, PolicyParams | None], Decider]:
    return lambda nodes, gpus, params: decider(nodes, gpus)


# name -> factory(nodes, GPUs per node, PolicyParams or None). tiresias, optimus and pollux run the authors'
# decision rules on this job model and read no PolicyParams; sjf and aryl-noloan are Aryl's registered policies.
DECIDERS: dict[str, Callable[[int, int, PolicyParams | None], Decider]] = {
    "tiresias": _authors(TiresiasDecider), "optimus": _authors(OptimusOracleDecider), "pollux": _authors(PolluxDecider),
    "sjf": _registered("sjf", False), "aryl-noloan": _registered("aryl-noloan", True)}
GOODPUT_POLICIES = tuple(DECIDERS)
PARAMETERISED = ("sjf", "aryl-noloan")  # the goodput job model's policies that read PolicyParams (--param)


@dataclass(frozen=True)
class GoodputRunResult:
    policy: str
    jcts: dict[str, float]          # job name -> completion - submission, seconds
    restarts: dict[str, int]
    end_time: float                 # the last completion, seconds since the trace's start
    wall_s: float

    @property
    def average_jct(self) -> float:
        return sum(self.jcts.values()) / len(self.jcts) if self.jcts else 0.0


def run_workload(workload: list[WorkloadJob], data_dir: str | Path, policy: str, *, nodes: int = 16,
                 gpus_per_node: int = 4, interval_s: float = 60.0, restart_s: float = 30.0,
                 max_time_s: float = 30 * 86400.0, until_s: float | None = None,
                 params: PolicyParams | None = None) -> GoodputRunResult:
    """Simulate ``workload`` under ``policy`` (``GOODPUT_POLICIES``) until every job completed, or only the
    intervals up to ``until_s`` of simulated time (a bounded run: the jobs completed by then). ``params``:
    the policy's parameters (``PARAMETERISED`` policies only: the others read none, and say so)."""
    if policy not in GOODPUT_POLICIES:
        raise ValueError(f"the goodput job model runs {', '.join(GOODPUT_POLICIES)}, not {policy!r}")
    if params is not None and policy not in PARAMETERISED:
        raise ValueError(f"{policy} in the goodput job model runs the authors' rules and reads no policy "
                         f"parameters (--param applies to {', '.join(PARAMETERISED)} there)")
    started = time.perf_counter()
    decider = DECIDERS[policy](nodes, gpus_per_node, params)
    adaptive = bool(getattr(decider, "adaptive_batch", False))
    jobs = [SimJob(i, spec, load_application(data_dir, spec.application), adaptive=adaptive)
            for i, spec in enumerate(workload)]
    allocations: dict[int, list[int]] = {}
    now = 0.0
    while any(j.completion_time is None for j in jobs):
        if until_s is not None and now >= until_s:
            break
        if now >= max_time_s:
            raise RuntimeError(f"{policy}: jobs still running at {max_time_s} s of simulated time")
        for job in jobs:
            job.advance(now, interval_s)
        now += interval_s
        active = [j for j in jobs if j.spec.submit_time <= now and j.completion_time is None]
        if not active:
            continue
        previous = {j.index: allocations[j.index] for j in active if j.index in allocations}
        decided = decider.decide(active, previous, now)
        for job in active:
            if decided.get(job.index) != previous.get(job.index):
                job.reallocate(_placement_of(decided.get(job.index, [])), restart_s)
        allocations = decided
    return GoodputRunResult(
        policy=policy,
        jcts={j.spec.name: j.completion_time - j.spec.submit_time for j in jobs if j.completion_time is not None},
        restarts={j.spec.name: max(j.restarts, 0) for j in jobs},
        end_time=max((j.completion_time for j in jobs if j.completion_time is not None), default=now),
        wall_s=time.perf_counter() - started,
    )


def summary(result: GoodputRunResult, settings: dict[str, float]) -> dict[str, object]:
    """The figures of one run (``aryl-sim --job-model goodput``), JSON-ready."""
    jcts = sorted(result.jcts.values())
    return {
        "policy": result.policy, "job_model": "goodput", **settings,
        "jobs": len(jcts), "avg_jct_s": round(result.average_jct, 3), "median_jct_s": _quantile(jcts, 0.5),
        "p99_jct_s": _quantile(jcts, 0.99), "makespan_s": result.end_time,
        "avg_restarts": round(sum(result.restarts.values()) / len(result.restarts), 3),
        "wall_s": round(result.wall_s, 2), "jcts_s": dict(result.jcts),
    }


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (as numpy's default)."""
    position = (len(values) - 1) * q
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def format_summaries(summaries: list[dict[str, object]]) -> str:
    keys = ("jobs", "avg_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "avg_restarts", "wall_s")
    width = max(12, *(len(str(s["policy"])) + 2 for s in summaries))
    lines = ["metric".ljust(14) + "".join(str(s["policy"]).rjust(width) for s in summaries)]
    for key in keys:
        cells = []
        for s in summaries:
            value = s[key]
            digits = 3 if key == "avg_restarts" else 1
            cells.append((f"{value:.{digits}f}" if isinstance(value, float) else str(value)).rjust(width))
        lines.append(key.ljust(14) + "".join(cells))
    return "\n".join(lines) + "\n"
