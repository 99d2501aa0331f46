"""Job-trace loaders: Philly, Pollux workloads and a generic CSV, turned into ``TraceJob`` values.

What this module is for: reading a job trace from a path given by the caller and mapping every job,
explicitly and reproducibly, to what the scheduler sees -- a gang size (``gpus_per_worker`` x
``min_workers``), an elastic range (``max_workers``), an amount of work and a throughput curve.
What it must never do: decide anything at run time, read the clock, or depend on files inside the
repository (the traces live outside it; every path is an argument).

Nouns
-----
- *worker*: one gang member; ``gpus_per_worker`` GPUs on one server.
- *base size*: the job's ``min_workers`` -- the size the trace says it ran at.
- *speed*: work units per second at a worker count; ``TraceJob.throughput`` holds one point for
  **every** worker count ``min_workers..max_workers``, so the simulator's true speed and the speed a
  policy reads from the declared points are the same numbers.
- *throughput model*: where a job's speed curve comes from -- ``"amdahl"`` (parametric) or one of
  Pollux's measured profiles (``bert``, ``cifar10``, ``deepspeech2``, ``imagenet``, ``ncf``,
  ``yolov3``; see `Pollux profiles`_ below).

The mapping (``JobMapping``) -- the rules the evaluation cites
--------------------------------------------------------------
All random choices are *keyed*, not sequential: a job's draw is a hash of ``(seed, purpose, job
name)`` (BLAKE2b, 64 bits -> a uniform number in [0, 1)). The same trace and seed therefore give an
identical list; a job's choice does not change when other jobs are filtered out, the trace is cut
with ``limit``, or jobs are reordered; and a different seed gives independent choices. Philly has no
job ids, so a Philly job is named by its content: ``philly-<YYYYmmddTHHMMSS>-<cluster>``, with
``-2``, ``-3``... for further rows of the same second and cluster. The name does not depend on the
file's extent, so a job gets the same mapping from the 15-day file as from ``busiest_window`` cut out
of the full trace. (``job_id`` is renumbered 1.. over the jobs kept.)

1. **Gang shape (Philly, and generic rows that give only GPUs).** A worker is the part of a job on one
   server: ``num_gpus <= gpus_per_server`` -> one worker of ``num_gpus`` GPUs (a 4-GPU job is 1 x 4);
   larger jobs -> the fewest equal workers of at most ``gpus_per_server`` GPUs each (16 GPUs = 2 x 8,
   12 GPUs = 2 x 6, 24 = 3 x 8). No randomness: this is how multi-GPU training is launched
   (one torchrun worker group per node). It also means a 4-GPU elastic job grows in steps of 4 GPUs.
2. **Elastic or not.** A job is elastic iff its draw ``u(seed, "elastic", name) < elastic_share``
   (so about ``elastic_share`` of the jobs, stable per job). Inelastic: ``max_workers = min_workers``.
   Elastic: ``max_workers = min_workers * max_scale``, capped so that ``max_workers *
   gpus_per_worker <= max_gpus_per_job`` (never below ``min_workers``), and then capped at the worker
   count where the job's cleaned speed curve stops rising (a worker that adds no speed is never
   declared). A job drawn elastic whose curve is flat above its base size therefore ends up with
   ``max_workers == min_workers``. ``min_workers`` is always the trace's size: jobs never run below it.
3. **Throughput model.** ``throughput_model`` names the assignment:
   - ``"amdahl"`` -- every job gets Amdahl's law over GPUs with serial fraction ``amdahl_alpha``:
     ``S(n) = n / (1 + alpha (n - 1))``, the very function the policy uses
     (``scheduler_service.core.throughput.amdahl_speedup``), here with ``n`` counting GPUs.
   - ``"pollux-gputime"`` -- Pollux's own rule for Philly jobs (``workload.py`` of the OSDI'21
     artifact), by the job's GPU-time at its base size: < 1 GPU-hour -> ``cifar10`` or ``ncf``,
     < 10 GPU-hours -> ``deepspeech2`` or ``bert``, < 100 -> ``yolov3``, otherwise ``imagenet``;
     each "or" is a 50/50 keyed draw ``u(seed, "model", name)``.
   - ``"pollux-random"`` -- one of ``profile_names``, uniformly by ``u(seed, "model", name)``.
   - a profile name, e.g. ``"bert"`` -- every job gets that profile.
   Pollux workload files name their application, so this setting does not apply to them.
4. **Work.** Philly and generic ``duration_s``: speeds are *relative* -- 1.0 at the job's base size,
   ``speed(w) = S(w * gpus_per_worker) / S(min_workers * gpus_per_worker)`` with ``S`` the model's
   speed at that many GPUs -- and ``work`` is the trace duration in seconds, i.e. the job finishes in
   exactly its traced run time when it runs at its traced size. Pollux workloads: speeds in samples/s
   and work in samples (see below).

Pollux profiles
---------------
(``../shared/traces/pollux-throughput-profiles/<model>/``, Apache-2.0, measured on 16 nodes x 4 T4.)
One replica = one GPU. For a job with total batch size ``B`` on ``r`` GPUs:

- **Placement.** The tightest packing on the 4-GPU testbed nodes (``ceil(r/4)`` nodes, as Pollux's
  ``get_configurations`` does). ``r <= 16``: the measured ``placements.csv`` row of that placement
  (e.g. 6 GPUs = ``24``, rotations normalised to the smallest as Pollux does). ``r > 16``:
  ``scalability.csv`` rows with ``num_nodes = r/4`` (measured at 24, 32, 48 and 64 GPUs); between
  measured counts, step and sync time are interpolated linearly in ``r`` (with 16 GPUs = ``4444``
  as the lower anchor). Above 64 GPUs nothing was measured: those sizes are not offered.
- **Batch size as the job scales.** Pollux's rule without a fitted model
  (``simulator.py: update_local_bsz``): ``M(r) = max(B, r * min_local_bsz)``, so the batch stays
  ``B`` until each GPU would go below the smallest measured local batch, and then grows. ``M(r) >
  max_batch_size`` (the largest ``validation-*.csv``) is infeasible: that size is not offered.
  Local batches above ``max_local_bsz`` use gradient accumulation exactly as Pollux does:
  ``accum = ceil(local / max_local) - 1`` extra micro-steps, ``atomic = ceil(local / (accum + 1))``,
  and one iteration takes ``step(atomic) + accum * (step(atomic) - sync(atomic))``; step and sync are
  interpolated linearly in ``local_bsz`` within a placement's measurements.
- **Work and statistical efficiency.** A job is done when it has trained for the profile's epochs
  (the number of rows in ``validation-*.csv``: bert 2, cifar10 100, deepspeech2 80, imagenet 90,
  ncf 10, yolov3 50 -- the ``max_epochs`` of Pollux's ``applications.py``). The validation runs are
  aligned on statistical progress, so ``samples(B) = iteration_final(B) * B`` -- the ``iteration``
  of the last row of ``validation-B.csv`` times ``B``, linear in ``B`` between measured batch sizes
  as Pollux's ``get_iteration`` does -- is the number of samples the job needs at batch ``B`` (the
  same quantity Pollux's ``get_configurations`` uses to estimate a configuration's JCT). A Pollux
  workload job's ``work`` is ``samples(B)``; its speed at ``r`` GPUs is the *goodput in
  B-equivalent samples/s*: ``M / t_iter * samples(B) / samples(M)`` -- raw throughput, discounted by
  how many more samples the larger batch needs.
- **Cleaning.** Measured goodput is not always monotone in ``r`` (crossing a node boundary, e.g.
  4 -> 5 GPUs, adds network synchronisation; a grown batch costs statistical efficiency). The curve
  is cleaned with a running maximum -- the speed at ``r`` is the best speed at any size ``<= r``,
  i.e. surplus GPUs would idle rather than slow the job -- and ``max_workers`` is cut at the first
  size that reaches the curve's maximum. Curves are not made concave: some keep the measured
  plateau-then-rise at node boundaries (the knapsack does not need concavity). Example, bert at
  batch 12 from 1 GPU: measured 1.00, 1.57, 1.85, 2.07 on 1-4 GPUs, then 0.65 on 5 (two nodes) and
  only 2.10 again at 11 GPUs -- cleaned, a 1-GPU bert job declares 1..4 workers. NCF's measured
  goodput never rises above one GPU at small batches, so NCF jobs end up inelastic (Pollux pins NCF
  to one replica too).
- **Check.** Against the Pollux simulator's own Tiresias runs of ``workloads-realistic``
  (``pollux-data/reference-runs``): for 1-GPU jobs that started at once, the simulator's JCT is this
  runtime at base size plus its 30-s start delay (cifar10 4,028 s here vs 4,030 s there; bert, deepspeech2,
  ncf, yolov3 within 2%). Multi-node jobs differ by up to ~20% because that simulator placed them
  differently from the tightest packing used here.

Pollux workload files (``name,time,application,num_replicas,batch_size``): ``gpus_per_worker = 1``,
``min_workers = num_replicas``, ``B = batch_size`` (clamped to the profile's measured batch range),
submit time = ``time`` as given. Elasticity as rule 2. (Pollux itself ignores ``num_replicas`` and
``batch_size`` and adapts both; here they are the job's base size and base batch.)

Philly (``timestamp,duration,num_gpus,gpu_time,cluster``): submit time = seconds since the first
row's timestamp (or since midnight of its day, ``time_origin="midnight"``); gang shape rule 1;
throughput rule 3 at ``B = min(num_gpus * init_batch_size, max_batch_size)`` (how Pollux's
``workloads-realistic`` files size batches); work rule 4. No filtering unless asked (Pollux/Sia
use ``min_duration_s=60, max_gpu_time_s=1000*3600``). The VC (``cluster``) column is not carried
into ``TraceJob``. A job whose base size the profile cannot run (more than 64 GPUs, or a batch above
the profile's largest) gets a flat relative curve ``((base, 1.0),)`` and stays inelastic.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from scheduler_service.core.throughput import amdahl_speedup
from simulator.model import TraceJob

__all__ = [
    "POLLUX_APPLICATIONS",
    "JobMapping",
    "PolluxProfile",
    "TraceFormatError",
    "TraceWindow",
    "busiest_window",
    "gang_shape",
    "job_gpu_seconds",
    "load_generic_csv",
    "load_philly",
    "load_pollux_profile",
    "load_pollux_workload",
]

POLLUX_APPLICATIONS: tuple[str, ...] = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
# Pollux's applications.py forces yolov3's largest local batch to 8 (its placements go up to 16).
_POLLUX_MAX_LOCAL_BSZ = {"yolov3": 8}
_POLLUX_GPUS_PER_NODE = 4  # the profiles' testbed: g4dn.12xlarge, 4 x T4 per node
_THROUGHPUT_MODELS = ("amdahl", "pollux-gputime", "pollux-random")


class TraceFormatError(ValueError):
    """A trace file the loader cannot use; names the file, the 1-based line and the column."""

    def __init__(self, path: str | Path, line: int | None, column: str | None, message: str):
        self.path = str(path)
        self.line = line
        self.column = column
        where = self.path if line is None else f"{self.path}:{line}"
        col = f" column {column!r}:" if column else ""
        super().__init__(f"{where}:{col} {message}")


@dataclass(frozen=True, slots=True)
class JobMapping:
    """How trace jobs become scheduler jobs. Every field is a documented rule (see the module doc)."""

    seed: int = 0
    elastic_share: float = 0.5        # fraction of jobs made elastic (keyed draw per job name)
    max_scale: int = 4                # elastic max_workers = min_workers * max_scale, then capped
    max_gpus_per_job: int = 64        # cap on max_workers * gpus_per_worker (never below the base size)
    throughput_model: str = "amdahl"  # "amdahl" | "pollux-gputime" | "pollux-random" | a profile name
    amdahl_alpha: float = 0.05        # Amdahl serial fraction (over GPUs)
    profile_names: tuple[str, ...] = POLLUX_APPLICATIONS  # the choices of "pollux-random"
    gpus_per_server: int = 8

    def __post_init__(self) -> None:
        if not 0.0 <= self.elastic_share <= 1.0:
            raise ValueError(f"elastic_share must be in [0, 1], got {self.elastic_share}")
        if self.max_scale < 1:
            raise ValueError(f"max_scale must be >= 1, got {self.max_scale}")
        if self.max_gpus_per_job < 1 or self.gpus_per_server < 1:
            raise ValueError("max_gpus_per_job and gpus_per_server must be >= 1")
        if not 0.0 <= self.amdahl_alpha <= 1.0:
            raise ValueError(f"amdahl_alpha must be in [0, 1], got {self.amdahl_alpha}")
        if self.throughput_model not in _THROUGHPUT_MODELS and self.throughput_model not in POLLUX_APPLICATIONS:
            raise ValueError(
                f"unknown throughput_model {self.throughput_model!r}; "
                f"choose one of {_THROUGHPUT_MODELS + POLLUX_APPLICATIONS}"
            )
        unknown = set(self.profile_names) - set(POLLUX_APPLICATIONS)
        if not self.profile_names or unknown:
            raise ValueError(f"profile_names must be non-empty Pollux applications; unknown: {sorted(unknown)}")

    def draw(self, purpose: str, key: str) -> float:
        """A uniform number in [0, 1) fixed by (seed, purpose, key): the only source of randomness."""
        return _keyed_uniform(self.seed, purpose, key)

    def is_elastic(self, name: str) -> bool:
        return self.draw("elastic", name) < self.elastic_share

    def assign_model(self, name: str, gpu_seconds: float) -> str:
        """The throughput model of a job (rule 3), from its name and its GPU-time at base size."""
        choice = self.throughput_model
        if choice == "amdahl" or choice in POLLUX_APPLICATIONS:
            return choice
        u = self.draw("model", name)
        if choice == "pollux-random":
            return self.profile_names[min(int(u * len(self.profile_names)), len(self.profile_names) - 1)]
        gpu_hours = gpu_seconds / 3600.0  # "pollux-gputime"
        if gpu_hours < 1:
            return "cifar10" if u < 0.5 else "ncf"
        if gpu_hours < 10:
            return "deepspeech2" if u < 0.5 else "bert"
        if gpu_hours < 100:
            return "yolov3"
        return "imagenet"


def _keyed_uniform(seed: int, purpose: str, key: str) -> float:
    digest = hashlib.blake2b(f"{seed}\x1f{purpose}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def gang_shape(num_gpus: int, gpus_per_server: int) -> tuple[int, int]:
    """``(gpus_per_worker, workers)`` for a job of ``num_gpus`` GPUs (rule 1): one worker per server,
    the fewest equal workers of at most ``gpus_per_server`` GPUs."""
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    workers = math.ceil(num_gpus / gpus_per_server)
    while num_gpus % workers:
        workers += 1
    return num_gpus // workers, workers


def job_gpu_seconds(job: TraceJob) -> float:
    """GPU-seconds the job needs at its base size."""
    return job.runtime_at(job.min_workers) * job.min_workers * job.gpus_per_worker


# --------------------------------------------------------------------------------------------------
# Pollux measured profiles
# --------------------------------------------------------------------------------------------------


class PolluxProfile:
    """One application's measured step times and validation runs, with the goodput rule of the
    module doc. Built by ``load_pollux_profile``; immutable after construction."""

    def __init__(
        self,
        name: str,
        placements: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
        scalability: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
        validation: dict[int, np.ndarray],
        min_local_bsz: int,
        max_local_bsz: int,
    ):
        self.name = name
        self.min_local_bsz = min_local_bsz
        self.max_local_bsz = max_local_bsz
        self.epochs = min(len(its) for its in validation.values())
        self._val_bsz = np.array(sorted(validation), dtype=float)
        self._val_final_iter = np.array([validation[b][self.epochs - 1] for b in sorted(validation)], dtype=float)
        self.init_batch_size = int(self._val_bsz[0])
        self.max_batch_size = int(self._val_bsz[-1])
        # Step-time anchors for the packed placement of r GPUs (module doc, "Placement").
        anchors: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for r in range(1, 4 * _POLLUX_GPUS_PER_NODE + 1):  # placements.csv: up to 4 nodes
            pid = _placement_id(_packed_placement(r))
            if pid in placements:
                anchors[r] = placements[pid]
        for (nodes, replicas), table in scalability.items():
            if nodes == math.ceil(replicas / _POLLUX_GPUS_PER_NODE) and replicas not in anchors:
                anchors[replicas] = table
        self._anchor_r = np.array(sorted(anchors))
        self._anchors = anchors
        self.max_replicas = int(self._anchor_r[-1])
        self._goodput_memo: dict[tuple[int, int], float | None] = {}

    def samples_to_finish(self, batch_size: float) -> float:
        """Samples the job needs at total batch ``batch_size`` (``iteration_final(B) * B``)."""
        b = min(max(float(batch_size), self._val_bsz[0]), self._val_bsz[-1])
        return float(np.interp(b, self._val_bsz, self._val_final_iter)) * b

    def clamp_batch(self, batch_size: float) -> int:
        return int(min(max(batch_size, self.init_batch_size), self.max_batch_size))

    def _step_sync(self, replicas: int, atomic_bsz: int) -> tuple[float, float] | None:
        def at(r: int) -> tuple[float, float]:
            bsz, step, sync = self._anchors[r]
            return float(np.interp(atomic_bsz, bsz, step)), float(np.interp(atomic_bsz, bsz, sync))

        if replicas in self._anchors:
            return at(replicas)
        i = int(np.searchsorted(self._anchor_r, replicas))
        if i == 0 or i >= len(self._anchor_r):
            return None  # not measured
        lo, hi = int(self._anchor_r[i - 1]), int(self._anchor_r[i])
        (s0, y0), (s1, y1) = at(lo), at(hi)
        f = (replicas - lo) / (hi - lo)
        return s0 + f * (s1 - s0), y0 + f * (y1 - y0)

    def goodput(self, replicas: int, batch_size: int) -> float | None:
        """B-equivalent samples/s of a job with base batch ``batch_size`` on ``replicas`` GPUs, or
        ``None`` where the profile cannot run it (batch too large, or more GPUs than measured)."""
        key = (replicas, batch_size)
        if key not in self._goodput_memo:
            self._goodput_memo[key] = self._goodput(replicas, batch_size)
        return self._goodput_memo[key]

    def _goodput(self, r: int, b: int) -> float | None:
        total = max(b, r * self.min_local_bsz)
        if total > self.max_batch_size or r > self.max_replicas:
            return None
        local = math.ceil(total / r - 1e-8)
        accum = math.ceil(local / self.max_local_bsz - 1e-8) - 1
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, self.max_batch_size // (r * (accum + 1)))
        if atomic < self.min_local_bsz:
            return None
        times = self._step_sync(r, atomic)
        if times is None:
            return None
        step, sync = times
        t_iter = step + accum * (step - sync)
        effective = r * atomic * (accum + 1)
        return effective / t_iter * self.samples_to_finish(b) / self.samples_to_finish(effective)


def _packed_placement(replicas: int) -> tuple[int, ...]:
    full, rest = divmod(replicas, _POLLUX_GPUS_PER_NODE)
    return (_POLLUX_GPUS_PER_NODE,) * full + ((rest,) if rest else ())


def _placement_id(placement: tuple[int, ...]) -> int:
    # Pollux normalises a placement to its lexicographically smallest rotation.
    best = min(placement[i:] + placement[:i] for i in range(len(placement)))
    return int("".join(map(str, best)))


def _bsz_table(rows: list[tuple[int, float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (local_bsz, step, sync) -> arrays sorted by local_bsz, duplicates averaged."""
    by_bsz: dict[int, list[tuple[float, float]]] = {}
    for bsz, step, sync in rows:
        by_bsz.setdefault(bsz, []).append((step, sync))
    keys = sorted(by_bsz)
    steps = [sum(s for s, _ in by_bsz[k]) / len(by_bsz[k]) for k in keys]
    syncs = [sum(y for _, y in by_bsz[k]) / len(by_bsz[k]) for k in keys]
    return np.array(keys, dtype=float), np.array(steps), np.array(syncs)


def load_pollux_profile(profiles_dir: str | Path, name: str) -> PolluxProfile:
    """Read ``<profiles_dir>/<name>/{placements,scalability,validation-*}.csv`` (cached per path)."""
    return _load_pollux_profile(str(Path(profiles_dir).resolve()), name)


@lru_cache(maxsize=64)
def _load_pollux_profile(profiles_dir: str, name: str) -> PolluxProfile:
    root = Path(profiles_dir) / name
    if not root.is_dir():
        raise FileNotFoundError(f"no Pollux profile {name!r} under {profiles_dir} (expected a folder {root})")
    placement_rows: dict[int, list[tuple[int, float, float]]] = {}
    min_local = max_local = None
    for line, row in _dict_rows(root / "placements.csv", ("placement", "local_bsz", "step_time", "sync_time")):
        pid = _parse(row, "placement", int, root / "placements.csv", line)
        bsz = _parse(row, "local_bsz", int, root / "placements.csv", line)
        step = _parse(row, "step_time", float, root / "placements.csv", line)
        sync = _parse(row, "sync_time", float, root / "placements.csv", line)
        placement_rows.setdefault(pid, []).append((bsz, step, sync))
        min_local = bsz if min_local is None else min(min_local, bsz)
        max_local = bsz if max_local is None else max(max_local, bsz)
    scal_rows: dict[tuple[int, int], list[tuple[int, float, float]]] = {}
    cols = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
    for line, row in _dict_rows(root / "scalability.csv", cols):
        p = root / "scalability.csv"
        key = (_parse(row, "num_nodes", int, p, line), _parse(row, "num_replicas", int, p, line))
        scal_rows.setdefault(key, []).append(
            (_parse(row, "local_bsz", int, p, line), _parse(row, "step_time", float, p, line),
             _parse(row, "sync_time", float, p, line))
        )
    validation: dict[int, np.ndarray] = {}
    for path in sorted(root.glob("validation-*.csv")):
        batch = int(path.stem.split("-")[-1])
        its = [_parse(row, "iteration", float, path, line) for line, row in _dict_rows(path, ("iteration",))]
        if not its:
            raise TraceFormatError(path, None, None, "no validation rows")
        validation[batch] = np.array(its)
    if not placement_rows or not validation or min_local is None or max_local is None:
        raise TraceFormatError(root, None, None, "a profile needs placements.csv and validation-*.csv rows")
    return PolluxProfile(
        name=name,
        placements={k: _bsz_table(v) for k, v in placement_rows.items()},
        scalability={k: _bsz_table(v) for k, v in scal_rows.items()},
        validation=validation,
        min_local_bsz=min_local,
        max_local_bsz=_POLLUX_MAX_LOCAL_BSZ.get(name, max_local),
    )


# --------------------------------------------------------------------------------------------------
# Speed curves
# --------------------------------------------------------------------------------------------------


def _clean_curve(raw: Sequence[float | None]) -> list[float]:
    """Running maximum, cut at the first size reaching the maximum; ``None`` (not runnable) ends it.
    ``raw[0]`` (the base size) must be a number."""
    out: list[float] = []
    for speed in raw:
        if speed is None:
            break
        out.append(max(speed, out[-1]) if out else speed)
    best = out[-1]
    return out[: out.index(best) + 1]


@lru_cache(maxsize=4096)
def _relative_amdahl_curve(gpw: int, base: int, top: int, alpha: float) -> tuple[float, ...]:
    ref = amdahl_speedup(base * gpw, alpha)
    return tuple(amdahl_speedup(w * gpw, alpha) / ref for w in range(base, top + 1))


def _profile_curve(profile: PolluxProfile, gpw: int, base: int, top: int, batch: int) -> list[float] | None:
    """Goodput (B-equivalent samples/s) for workers ``base..top``, cleaned; None if the base size
    itself cannot run on the profile."""
    raw = [profile.goodput(w * gpw, batch) for w in range(base, top + 1)]
    if raw[0] is None:
        return None
    return _clean_curve(raw)


@lru_cache(maxsize=65536)
def _curve_points(
    profile: PolluxProfile | None,
    gpus_per_worker: int,
    min_workers: int,
    max_workers: int,
    batch: int | None,
    alpha: float,
    relative: bool,
    keep_max: bool,
) -> tuple[tuple[int, float], ...]:
    """One point per worker count ``min_workers..``, cleaned (module doc); Amdahl when ``profile``
    is None. A profile that cannot run the base size gives a flat relative curve ``((base, 1.0),)``."""
    if profile is not None:
        assert batch is not None
        curve = _profile_curve(profile, gpus_per_worker, min_workers, max_workers, batch)
        if curve is None:  # base size beyond the profile's measurements: flat, inelastic
            curve, relative = [1.0], True
    else:
        curve = list(_relative_amdahl_curve(gpus_per_worker, min_workers, max_workers, alpha))
    if keep_max and len(curve) < max_workers - min_workers + 1:
        curve += [curve[-1]] * (max_workers - min_workers + 1 - len(curve))
    if relative:
        curve = [s / curve[0] for s in curve]
    return tuple((min_workers + i, float(s)) for i, s in enumerate(curve))


def _make_job(
    *,
    job_id: int,
    name: str,
    submit_time: float,
    gpus_per_worker: int,
    min_workers: int,
    max_workers: int,
    model: str,
    mapping: JobMapping,
    profiles: dict[str, PolluxProfile],
    profile_batch: int | None,
    duration_s: float | None = None,
    work: float | None = None,
    relative: bool,
    deadline: float | None = None,
    priority: int = 0,
    keep_max: bool = False,
) -> TraceJob:
    """Build a TraceJob with one throughput point per worker count (rules 2-4 of the module doc).

    ``relative``: speeds normalised to 1.0 at ``min_workers`` (``work`` = ``duration_s``).
    ``keep_max``: the caller fixed ``max_workers`` (generic CSV); the curve is not allowed to cut it.
    """
    profile = profiles.get(model)
    batch = None
    if profile is not None:
        batch = profile.clamp_batch(profile_batch if profile_batch is not None else
                                    min_workers * gpus_per_worker * profile.init_batch_size)
    points = _curve_points(profile, gpus_per_worker, min_workers, max_workers, batch,
                           mapping.amdahl_alpha, relative, keep_max)
    if work is None:
        assert duration_s is not None
        work = duration_s * points[0][1]
    return TraceJob(
        job_id=job_id,
        name=name,
        submit_time=float(submit_time),
        gpus_per_worker=gpus_per_worker,
        min_workers=min_workers,
        max_workers=points[-1][0],
        work=float(work),
        throughput=points,
        model=model,
        deadline=deadline,
        priority=priority,
    )


def _elastic_top(mapping: JobMapping, name: str, gpus_per_worker: int, min_workers: int) -> int:
    """Rule 2 before the curve's cut: the largest worker count a job may declare."""
    if not mapping.is_elastic(name):
        return min_workers
    cap = max(min_workers, mapping.max_gpus_per_job // gpus_per_worker)
    return min(min_workers * mapping.max_scale, cap)


def _profiles_for(names: Iterable[str], profiles_dir: str | Path | None, what: str) -> dict[str, PolluxProfile]:
    names = sorted(set(names) & set(POLLUX_APPLICATIONS))
    if names and profiles_dir is None:
        raise ValueError(f"{what} uses Pollux profiles {names}: pass profiles_dir=")
    return {n: load_pollux_profile(profiles_dir, n) for n in names}  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# CSV reading
# --------------------------------------------------------------------------------------------------


def _open_text(path: str | Path) -> io.TextIOBase:
    """Open plain or gzip CSV (by magic bytes, not by name)."""
    p = Path(path)
    with p.open("rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(p, "rb"), encoding="utf-8", newline="")
    return p.open("r", encoding="utf-8", newline="")


def _dict_rows(
    path: str | Path, required: Sequence[str], allowed: Sequence[str] | None = None
) -> Iterator[tuple[int, dict[str, str]]]:
    """``(line number, row)`` for every data row; the header must name every ``required`` column
    and, when ``allowed`` is given, no other."""
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceFormatError(path, 1, None, "empty file (expected a header row)")
        header = [h.strip() for h in header]
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceFormatError(path, 1, missing[0], f"missing column(s) {missing}; header is {header}")
        unknown = [c for c in header if allowed is not None and c not in allowed]
        if unknown:
            raise TraceFormatError(path, 1, unknown[0], f"unknown column(s) {unknown}; known: {list(allowed or ())}")
        for values in reader:
            if not values or all(not v.strip() for v in values):
                continue
            if len(values) != len(header):
                raise TraceFormatError(
                    path, reader.line_num, None, f"expected {len(header)} fields, found {len(values)}"
                )
            yield reader.line_num, dict(zip(header, (v.strip() for v in values), strict=True))


def _parse(row: dict[str, str], column: str, kind: type, path: str | Path, line: int):
    text = row.get(column, "")
    if text == "":
        raise TraceFormatError(path, line, column, "value is missing")
    try:
        if kind is int:
            value = float(text)
            if not value.is_integer():
                raise ValueError
            return int(value)
        value = kind(text)
    except ValueError:
        raise TraceFormatError(path, line, column, f"expected {kind.__name__}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise TraceFormatError(path, line, column, f"expected a finite number, got {text!r}")
    return value


# --------------------------------------------------------------------------------------------------
# Philly
# --------------------------------------------------------------------------------------------------


def load_philly(
    path: str | Path,
    *,
    mapping: JobMapping,
    profiles_dir: str | Path | None = None,
    limit: int | None = None,
    min_duration_s: float | None = None,
    max_gpu_time_s: float | None = None,
    time_origin: str = "first_job",
) -> list[TraceJob]:
    """Load the Pollux-preprocessed Philly trace (``timestamp,duration,num_gpus,gpu_time,cluster``,
    plain or gzip) as ``TraceJob``s, mapped by ``mapping`` (module doc).

    Submit times are seconds since the first row's timestamp (``time_origin="first_job"``) or since
    midnight of that row's day (``"midnight"``, so that time of day lines up with a load series whose
    t = 0 is midnight, like ServeGen's). Rows must be sorted by time, as both files in
    ``shared/traces/philly-pollux`` are. ``limit`` keeps the first N jobs (after the optional
    filters). ``profiles_dir`` is needed when the mapping assigns Pollux profiles.
    """
    if time_origin not in ("first_job", "midnight"):
        raise ValueError(f"time_origin must be 'first_job' or 'midnight', got {time_origin!r}")
    need = {
        "amdahl": (),
        "pollux-gputime": ("cifar10", "ncf", "deepspeech2", "bert", "yolov3", "imagenet"),
        "pollux-random": mapping.profile_names,
    }.get(mapping.throughput_model, (mapping.throughput_model,))
    profiles = _profiles_for(need, profiles_dir, f"throughput_model={mapping.throughput_model!r}")
    jobs: list[TraceJob] = []
    origin: datetime | None = None
    last: datetime | None = None
    repeats: dict[str, int] = {}
    for line, row in _dict_rows(path, ("timestamp", "duration", "num_gpus")):
        if limit is not None and len(jobs) >= limit:
            break
        try:
            stamp = datetime.fromisoformat(row["timestamp"])
        except ValueError:
            raise TraceFormatError(
                path, line, "timestamp", f"expected YYYY-MM-DD HH:MM:SS, got {row['timestamp']!r}"
            ) from None
        if origin is None:
            origin = stamp if time_origin == "first_job" else datetime.combine(stamp.date(), datetime.min.time())
        if last is not None and stamp < last:
            raise TraceFormatError(path, line, "timestamp", "rows are not sorted by time (sort the file first)")
        last = stamp
        duration = _parse(row, "duration", float, path, line)
        num_gpus = _parse(row, "num_gpus", int, path, line)
        if duration <= 0:
            raise TraceFormatError(path, line, "duration", f"must be > 0, got {duration}")
        if num_gpus < 1:
            raise TraceFormatError(path, line, "num_gpus", f"must be >= 1, got {num_gpus}")
        gpu_seconds = duration * num_gpus
        compact = row["timestamp"].replace("-", "").replace(":", "").replace(" ", "T")
        name = f"philly-{compact}-{row.get('cluster', '') or 'na'}"
        repeats[name] = repeats.get(name, 0) + 1
        if repeats[name] > 1:
            name = f"{name}-{repeats[name]}"
        if min_duration_s is not None and duration < min_duration_s:
            continue
        if max_gpu_time_s is not None and gpu_seconds >= max_gpu_time_s:
            continue
        gpw, base = gang_shape(num_gpus, mapping.gpus_per_server)
        jobs.append(
            _make_job(
                job_id=len(jobs) + 1,
                name=name,
                submit_time=(stamp - origin).total_seconds(),
                gpus_per_worker=gpw,
                min_workers=base,
                max_workers=_elastic_top(mapping, name, gpw, base),
                model=mapping.assign_model(name, gpu_seconds),
                mapping=mapping,
                profiles=profiles,
                profile_batch=None,
                duration_s=duration,
                relative=True,
            )
        )
    return jobs


# --------------------------------------------------------------------------------------------------
# Pollux workloads
# --------------------------------------------------------------------------------------------------


def load_pollux_workload(
    path: str | Path,
    *,
    profiles_dir: str | Path,
    mapping: JobMapping,
    limit: int | None = None,
) -> list[TraceJob]:
    """Load a Pollux workload CSV (``name,time,application,num_replicas,batch_size``).

    Each job: 1 GPU per worker, ``min_workers = num_replicas``, work = samples to finish at
    ``batch_size`` and speeds = goodput in those samples/s from the application's profile (module
    doc, "Pollux profiles"); elastic by ``mapping`` rule 2. Jobs are ordered by ``time`` (stable).
    """
    rows = []
    seen: set[str] = set()
    cols = ("name", "time", "application", "num_replicas", "batch_size")
    for line, row in _dict_rows(path, cols):
        name = row["name"]
        if not name:
            raise TraceFormatError(path, line, "name", "value is missing")
        if name in seen:
            raise TraceFormatError(path, line, "name", f"duplicate job name {name!r}")
        seen.add(name)
        app = row["application"]
        if app not in POLLUX_APPLICATIONS:
            raise TraceFormatError(
                path, line, "application", f"unknown application {app!r}; expected one of {POLLUX_APPLICATIONS}"
            )
        time = _parse(row, "time", float, path, line)
        replicas = _parse(row, "num_replicas", int, path, line)
        batch = _parse(row, "batch_size", int, path, line)
        if time < 0:
            raise TraceFormatError(path, line, "time", f"must be >= 0, got {time}")
        if replicas < 1:
            raise TraceFormatError(path, line, "num_replicas", f"must be >= 1, got {replicas}")
        if batch < 1:
            raise TraceFormatError(path, line, "batch_size", f"must be >= 1, got {batch}")
        rows.append((time, line, name, app, replicas, batch))
    rows.sort(key=lambda r: r[0])
    if limit is not None:
        rows = rows[:limit]
    profiles = _profiles_for({r[3] for r in rows}, profiles_dir, "a Pollux workload")
    jobs: list[TraceJob] = []
    for time, line, name, app, replicas, batch in rows:
        profile = profiles[app]
        if profile.goodput(replicas, profile.clamp_batch(batch)) is None:
            raise TraceFormatError(
                path, line, "num_replicas",
                f"{app} cannot run {replicas} GPUs at batch {batch} (profile: local batch "
                f"{profile.min_local_bsz}..{profile.max_local_bsz}, total <= {profile.max_batch_size}, "
                f"<= {profile.max_replicas} GPUs)",
            )
        batch = profile.clamp_batch(batch)
        jobs.append(
            _make_job(
                job_id=len(jobs) + 1,
                name=name,
                submit_time=time,
                gpus_per_worker=1,
                min_workers=replicas,
                max_workers=_elastic_top(mapping, name, 1, replicas),
                model=app,
                mapping=mapping,
                profiles=profiles,
                profile_batch=batch,
                work=profile.samples_to_finish(batch),
                relative=False,
            )
        )
    return jobs


# --------------------------------------------------------------------------------------------------
# Generic CSV
# --------------------------------------------------------------------------------------------------

GENERIC_COLUMNS = (
    "submit_time", "gpus_per_worker", "min_workers", "max_workers", "duration_s", "work",
    "model", "throughput", "deadline_s", "priority", "name",
    "queue", "user", "priority_class", "gpu_types",  # tenancy (``_tenancy``)
)
_GENERIC_REQUIRED = ("submit_time", "gpus_per_worker", "min_workers")


def _parse_points(text: str, path: str | Path, line: int) -> list[tuple[int, float]]:
    points: dict[int, float] = {}
    for part in text.replace(",", ";").split(";"):
        part = part.strip()
        if not part:
            continue
        workers, sep, speed = part.partition(":")
        try:
            w, s = int(workers), float(speed)
        except ValueError:
            w, s = 0, float("nan")
        if not sep or w < 1 or not (s > 0 and math.isfinite(s)):
            raise TraceFormatError(
                path, line, "throughput", f"expected 'workers:speed;...' with workers >= 1 and speed > 0, got {part!r}"
            )
        if w in points:
            raise TraceFormatError(path, line, "throughput", f"two points for {w} workers")
        points[w] = s
    if not points:
        raise TraceFormatError(path, line, "throughput", "no points")
    return sorted(points.items())


def load_generic_csv(
    path: str | Path,
    *,
    mapping: JobMapping = JobMapping(),
    profiles_dir: str | Path | None = None,
    limit: int | None = None,
) -> list[TraceJob]:
    """Load the generic job CSV documented in docs/simulator.md (plain or gzip).

    Columns (header names; only the first three are required, unknown names are an error):
    ``submit_time`` (s since trace start, >= 0), ``gpus_per_worker`` (>= 1), ``min_workers`` (>= 1),
    ``max_workers`` (>= min_workers; empty or absent -> the mapping decides, rule 2), exactly one of
    ``duration_s`` (s at min_workers, > 0) or ``work`` (units of ``throughput``, > 0) per row,
    ``model`` (a Pollux profile name, ``amdahl``, any other label -> Amdahl; empty -> the mapping's
    rule 3), ``throughput`` (``"w:speed;w:speed"``, overrides the model, must reach from
    min_workers to max_workers; linear in between), ``deadline_s`` (s since trace start, >
    submit_time), ``priority`` (int, default 0), ``name`` (unique; default ``job-<line>``).
    Tenancy (``core.quota``; all optional): ``queue`` (default ``default``), ``user`` (fair share
    within a queue; default empty), ``priority_class`` (the class's *value*, an int; default 0),
    ``gpu_types`` (``"A100;V100"``: the types the job may run on, preferred first; empty: any).

    Errors are ``TraceFormatError`` naming the file, line and column. Jobs are ordered by
    ``submit_time`` (stable) and numbered 1..
    """
    draft = []
    seen: set[str] = set()
    tenancy: dict[int, dict[str, Any]] = {}
    for line, row in _dict_rows(path, _GENERIC_REQUIRED, GENERIC_COLUMNS):
        tenancy[line] = _tenancy(row, path, line)
        submit = _parse(row, "submit_time", float, path, line)
        if submit < 0:
            raise TraceFormatError(path, line, "submit_time", f"must be >= 0, got {submit}")
        gpw = _parse(row, "gpus_per_worker", int, path, line)
        if gpw < 1:
            raise TraceFormatError(path, line, "gpus_per_worker", f"must be >= 1, got {gpw}")
        base = _parse(row, "min_workers", int, path, line)
        if base < 1:
            raise TraceFormatError(path, line, "min_workers", f"must be >= 1, got {base}")
        top = None
        if row.get("max_workers", ""):
            top = _parse(row, "max_workers", int, path, line)
            if top < base:
                raise TraceFormatError(path, line, "max_workers", f"must be >= min_workers ({base}), got {top}")
        has_duration, has_work = bool(row.get("duration_s", "")), bool(row.get("work", ""))
        if has_duration == has_work:
            raise TraceFormatError(path, line, "duration_s" if not has_duration else "work",
                                   "give exactly one of duration_s and work")
        duration = _parse(row, "duration_s", float, path, line) if has_duration else None
        work = _parse(row, "work", float, path, line) if has_work else None
        for column, value in (("duration_s", duration), ("work", work)):
            if value is not None and value <= 0:
                raise TraceFormatError(path, line, column, f"must be > 0, got {value}")
        points = _parse_points(row["throughput"], path, line) if row.get("throughput", "") else None
        if work is not None and points is None:
            raise TraceFormatError(
                path, line, "work", "work needs a throughput column (its unit); use duration_s otherwise"
            )
        deadline = None
        if row.get("deadline_s", ""):
            deadline = _parse(row, "deadline_s", float, path, line)
            if deadline <= submit:
                raise TraceFormatError(
                    path, line, "deadline_s", f"must be after submit_time ({submit}), got {deadline}"
                )
        priority = _parse(row, "priority", int, path, line) if row.get("priority", "") else 0
        name = row.get("name", "") or f"job-{line}"
        if name in seen:
            raise TraceFormatError(path, line, "name", f"duplicate job name {name!r}")
        seen.add(name)
        model = row.get("model", "")
        if model in POLLUX_APPLICATIONS and profiles_dir is None and points is None:
            raise TraceFormatError(path, line, "model", f"{model!r} is a Pollux profile: pass profiles_dir=")
        draft.append((submit, line, name, gpw, base, top, duration, work, model, points, deadline, priority))
    draft.sort(key=lambda d: d[0])
    if limit is not None:
        draft = draft[:limit]
    jobs: list[TraceJob] = []
    for submit, line, name, gpw, base, top, duration, work, model, points, deadline, priority in draft:
        if not model and points is None:
            model = mapping.assign_model(name, (duration or 0.0) * base * gpw)
            if model in POLLUX_APPLICATIONS and profiles_dir is None:
                raise ValueError(
                    f"throughput_model={mapping.throughput_model!r} uses Pollux profiles: pass profiles_dir="
                )
        keep_max = top is not None
        if top is None:
            top = _elastic_top(mapping, name, gpw, base)
        if points is not None:
            jobs.append(_generic_declared_job(path, line, len(jobs) + 1, name, submit, gpw, base, top,
                                              duration, work, model, points, deadline, priority))
            continue
        profiles = _profiles_for([model], profiles_dir, f"line {line}")
        jobs.append(
            _make_job(
                job_id=len(jobs) + 1, name=name, submit_time=submit, gpus_per_worker=gpw,
                min_workers=base, max_workers=top, model=model or "amdahl", mapping=mapping,
                profiles=profiles, profile_batch=None, duration_s=duration, relative=True,
                deadline=deadline, priority=priority, keep_max=keep_max,
            )
        )
    return [replace(job, **tenancy[d[1]]) if tenancy[d[1]] else job for d, job in zip(draft, jobs, strict=True)]


def _tenancy(row: dict[str, str], path: str | Path, line: int) -> dict[str, Any]:
    """A generic row's queue, user, priority class value and GPU types (only those given)."""
    out: dict[str, Any] = {}
    for column in ("queue", "user"):
        if row.get(column, ""):
            out[column] = row[column].strip()
    if row.get("priority_class", ""):
        out["priority_class"] = _parse(row, "priority_class", int, path, line)
    if row.get("gpu_types", ""):
        types = tuple(t.strip() for t in row["gpu_types"].split(";") if t.strip())
        if len(set(types)) != len(types):
            raise TraceFormatError(path, line, "gpu_types", f"a type is listed twice in {row['gpu_types']!r}")
        out["gpu_types"] = types
    return out


def _generic_declared_job(path, line, job_id, name, submit, gpw, base, top, duration, work, model,
                          points, deadline, priority) -> TraceJob:
    """A generic row with an explicit ``throughput`` column: linear between the given points."""
    xs = [w for w, _ in points]
    ys = [s for _, s in points]
    if xs[0] > base or xs[-1] < top:
        raise TraceFormatError(path, line, "throughput",
                               f"points {xs[0]}..{xs[-1]} workers must cover min_workers..max_workers ({base}..{top})")
    speeds = [float(np.interp(w, xs, ys)) for w in range(base, top + 1)]
    if work is None:
        work = duration * speeds[0]
    return TraceJob(
        job_id=job_id, name=name, submit_time=float(submit), gpus_per_worker=gpw, min_workers=base,
        max_workers=top, work=float(work),
        throughput=tuple((base + i, s) for i, s in enumerate(speeds)),
        model=model, deadline=deadline, priority=priority,
    )


# --------------------------------------------------------------------------------------------------
# Windows
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceWindow:
    """A cut of a trace: ``jobs`` submitted in ``[start_s, end_s)`` of the original clock, rebased so
    the window starts at 0 and renumbered 1.. (names kept, so mapping draws are unchanged).
    ``weight`` is what the window maximised (GPU-seconds or jobs)."""

    start_s: float
    end_s: float
    weight: float
    jobs: list[TraceJob] = field(default_factory=list)


def busiest_window(
    jobs: Sequence[TraceJob], days: float = 15, *, by: str = "gpu_time", align_s: float | None = None
) -> TraceWindow:
    """The ``days``-long window with the most GPU-time submitted (``by="gpu_time"``, GPU-seconds at
    base size, ``job_gpu_seconds``) or the most jobs submitted (``by="jobs"``).

    Candidate starts are the jobs' submit times, or, with ``align_s`` (e.g. 86400), multiples of
    ``align_s`` on the trace's clock (load Philly with ``time_origin="midnight"`` for calendar days).
    Ties go to the earliest start. ``jobs`` must be sorted by submit time (as every loader returns
    them). On the full Philly trace the 15-day calendar window with the most *jobs* is
    2017-10-10..10-25 (28,554 jobs, the ``philly_jobs_15d_2017-10-10`` file); the one with the most
    GPU-time starts 2017-10-14 (672 vs 586 GPUs busy on average, 23,570 jobs).
    """
    if not jobs:
        raise ValueError("busiest_window of an empty trace")
    if by not in ("gpu_time", "jobs"):
        raise ValueError(f"by must be 'gpu_time' or 'jobs', got {by!r}")
    span = days * 86400.0
    times = np.array([j.submit_time for j in jobs])
    if np.any(np.diff(times) < 0):
        raise ValueError("jobs must be sorted by submit_time")
    weights = [job_gpu_seconds(j) for j in jobs] if by == "gpu_time" else [1.0] * len(jobs)
    cum = np.concatenate(([0.0], np.cumsum(weights)))
    if align_s is None:
        starts = times
    else:
        starts = np.arange(math.floor(times[0] / align_s), math.floor(times[-1] / align_s) + 1) * align_s
    lo = np.searchsorted(times, starts, side="left")
    hi = np.searchsorted(times, starts + span, side="left")
    totals = cum[hi] - cum[lo]
    best = int(np.argmax(totals))
    start = float(starts[best])
    chosen = jobs[lo[best]: hi[best]]
    rebased = [
        replace(j, job_id=i, submit_time=j.submit_time - start,
                deadline=None if j.deadline is None else j.deadline - start)
        for i, j in enumerate(chosen, start=1)
    ]
    return TraceWindow(start_s=start, end_s=start + span, weight=float(totals[best]), jobs=rebased)
