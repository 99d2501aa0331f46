"""The goodput job model's jobs: a Pollux workload (``pollux-data/workloads*/workload-N.csv``) and each
job's simulated state and progress (``SimJob``), from its application's measured profile
(``simulator.goodput_profiles``) and the goodput equations of ``scheduler_service.core.goodput``.

This is the job model's physics only: how a job with a placement advances, when it completes, and what
a Pollux job measures and refits while it runs. The modelling choices are the Pollux study's simulator's
(OSDI'21, section 5.3); ``simulator.goodput_sim`` states them. What this module must never do: decide
a placement (the policies do, ``simulator.goodput_policies``) or hold the cluster's allocations
(``simulator.goodput_cluster``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

from scheduler_service.core.goodput import GradParams, PerfParams, StepSample, progress_rate, split_batch
from scheduler_service.policies.pollux import GoodputModel
from scheduler_service.policies.pollux_search import fit_perf_params_lbfgs
from simulator.goodput_profiles import Application


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


def placement_of(nodes: list[int]) -> tuple[int, ...]:
    """GPUs per node, in the order of ``nodes`` (one node index per GPU)."""
    out: list[int] = []
    for i, node in enumerate(nodes):
        if i and node == nodes[i - 1]:
            out[-1] += 1
        else:
            out.append(1)
    return tuple(out)


def packed(gpus: int, per_node: int) -> tuple[int, ...]:
    """``gpus`` GPUs packed onto nodes of ``per_node``: full nodes first (the oracle's placement)."""
    full, rest = divmod(gpus, per_node)
    return (per_node,) * full + ((rest,) if rest else ())
