"""Aryl's benchmarks: measured figures of the running service, each next to a reference from the same run.

Nouns:
- A *benchmark* is one named measurement (``submit_throughput``, ``list_jobs_latency``) that drives the
  real service the way users do and prints what it saw. Run them with ``python -m benchmarks``.
- A *figure* is one line of output: a JSON object with ``name``, ``value`` and ``unit``, the parameters
  it was measured under (``in_flight``, ``jobs``, ...) and a *reference*: a figure for the same work
  measured in the same run by a simpler path (``reference_name``, ``reference_value``,
  ``reference_unit``), so a number always comes with something to compare it to on this machine.
- A *target* is the figure the project aims for (``target``, in the figure's unit), where one exists.

Benchmarks never assert on time: they print figures (stdout, one JSON object per line) and log
progress to stderr. They must never touch a database they did not create.

What every benchmark stands on (sizes, a scratch database, the scheduler as a child process, CPU
accounting) is ``benchmarks.harness``; ``bench_*`` modules hold the benchmarks, each listing its own in
``BENCHMARKS``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# What the running benchmark's figures are tagged with, and where they are also kept (``figures``): set by the
# loaded mode (``benchmarks.under_load``), which prints a quiet and a loaded run side by side.
_tags: dict[str, Any] = {}
_kept: list[dict[str, Any]] | None = None


def emit_figure(name: str, value: float, unit: str, **fields: Any) -> None:
    """Print one figure as a JSON line on stdout (and nothing else goes to stdout)."""
    line = {"name": name, "value": _round(value), "unit": unit}
    line.update({key: _round(v) for key, v in fields.items() if v is not None})
    # Other work on the machine moves every figure: each says how busy the machine was when it was emitted.
    line.setdefault("load_avg", round(os.getloadavg()[0], 2))
    line.update(_tags)
    if _kept is not None:
        _kept.append(line)
    print(json.dumps(line), file=sys.stdout, flush=True)


@contextmanager
def figures(**tags: Any) -> Iterator[list[dict[str, Any]]]:
    """Within: every figure printed carries ``tags`` and is also appended to the list this yields."""
    global _kept, _tags
    kept: list[dict[str, Any]] = []
    before = (_kept, _tags)
    _kept, _tags = kept, {**_tags, **tags}
    try:
        yield kept
    finally:
        _kept, _tags = before


def _round(value: Any) -> Any:
    # Four significant digits are more than a benchmark on a shared machine can defend.
    return float(f"{value:.4g}") if isinstance(value, float) else value
