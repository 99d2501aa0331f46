"""Job-trace loaders: Philly and Pollux workloads turned into ``TraceJob`` values, and the mapping rules
(``JobMapping``) that every loader, the generic CSV's included (``simulator.generic_trace``), follows.

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
  ``yolov3``; their rules are ``simulator.trace_profiles``'s docstring).

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
   and work in samples (``simulator.trace_profiles``).

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

import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import numpy as np

from scheduler_service.core.throughput import amdahl_speedup
from simulator.model import TraceJob
from simulator.trace_csv import TraceFormatError, _dict_rows, _parse
from simulator.trace_profiles import POLLUX_APPLICATIONS, PolluxProfile, load_pollux_profile

__all__ = [
    "JobMapping",
    "TraceWindow",
    "busiest_window",
    "gang_shape",
    "job_gpu_seconds",
    "load_philly",
    "load_pollux_workload",
]

_THROUGHPUT_MODELS = ("amdahl", "pollux-gputime", "pollux-random")


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
