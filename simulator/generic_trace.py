"""The generic job CSV (docs/simulator.md, ``aryl-sim --trace-format generic``): one job per row, with
columns for its shape, work, speed curve, deadline and tenancy, turned into ``TraceJob`` values.

What this module is for: any trace that is not Philly's or Pollux's, written by hand or converted
by a user. Columns left empty fall back to ``JobMapping``'s rules (``simulator.traces``: elasticity,
throughput model); a ``throughput`` column overrides the model and is interpolated linearly.
Nouns: a *declared* job gives its own ``throughput`` points; *tenancy* is its queue, user, priority
class and GPU types (``core.quota``).
What it must never do: accept a column it does not know (a typo would silently change a run), or
depend on files inside the repository.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.model import TraceJob
from simulator.trace_csv import TraceFormatError, _dict_rows, _parse
from simulator.trace_profiles import POLLUX_APPLICATIONS
from simulator.traces import JobMapping, _elastic_top, _make_job, _profiles_for

__all__ = ["GENERIC_COLUMNS", "load_generic_csv"]

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
    mapping: JobMapping = JobMapping(),  # noqa: B008 (a frozen dataclass; ruff sees it so only in its own module)
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
