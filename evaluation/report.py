"""What every section of ``docs/evaluation.md`` shares: progress lines, markdown tables, and the spread of a
figure over seeds with its formatting. The sections (``evaluation.headline``, ``goodput``, ``inference``, ...)
import it; it imports none of them.

Nouns: a **spread** is a figure over seeds, ``{"mean", "min", "max", "per_seed"}`` (``spread``); a **cell** is
its text, ``mean (min-max)`` in the unit asked for (``cell``).

Must never: run a simulation or decide what a section reports.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from simulator.results import lookup

__all__ = ["cell", "gain_spread", "log", "lookup", "process_pool", "ratio_spread", "spread", "table"]


def log(message: str) -> None:
    """A progress line on stderr (the report itself goes to docs/)."""
    print(f"[evaluation] {message}", file=sys.stderr, flush=True)


def process_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes that start fresh (``spawn``) rather than as forks of this one: a fork
    copies the caller's threads' locks in whatever state they were (pytest-xdist's workers, gRPC's, numba's)
    and a child can wait on one forever -- seen as a run_all that never returned under CI. Each worker exits
    when this process does, however it ends (a killed evaluation left its workers running a simulation each)."""
    return ProcessPoolExecutor(max_workers=max(1, workers), mp_context=multiprocessing.get_context("spawn"),
                               initializer=exit_with_parent)


def exit_with_parent() -> None:
    """In a child process: exit as soon as the parent has (a thread waits on the parent's sentinel)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def spread(values: Iterable[float | None]) -> dict[str, Any] | None:
    """Mean, min, max and the per-seed values; None when any seed has no value."""
    seen = list(values)
    if not seen or any(v is None for v in seen):
        return None
    numbers = [float(v) for v in seen if v is not None]
    return {"mean": round(sum(numbers) / len(numbers), 4), "min": round(min(numbers), 4),
            "max": round(max(numbers), 4), "per_seed": [round(v, 4) for v in numbers]}


def ratio_spread(base: Mapping[str, Any], other: Mapping[str, Any], metric: str) -> dict[str, Any] | None:
    """``base / other`` per seed (same seeds in the same order), as a spread."""
    b, o = base["spread"].get(metric), other["spread"].get(metric)
    if b is None or o is None:
        return None
    return spread(x / y if y else None for x, y in zip(b["per_seed"], o["per_seed"], strict=True))


def gain_spread(base: Mapping[str, Any], other: Mapping[str, Any], metric: str) -> dict[str, Any] | None:
    """``(other - base) / base`` in percent per seed, as a spread."""
    b, o = base["spread"].get(metric), other["spread"].get(metric)
    if b is None or o is None:
        return None
    return spread((y - x) / x * 100.0 if x else None for x, y in zip(b["per_seed"], o["per_seed"], strict=True))


# -- formatting -------------------------------------------------------------------------------------


def cell(stats: Mapping[str, Any] | None, kind: str = "h") -> str:
    """``mean (min-max)`` in hours (``h``), a percentage (``pct`` of a fraction), a ratio (``x``), a
    signed percentage (``gain``) or a count (``n``)."""
    if stats is None:
        return "n/a"
    fmt = {"h": lambda v: f"{v / 3600:.2f}", "pct": lambda v: f"{v:.1%}", "x": lambda v: f"{v:.2f}x",
           "gain": lambda v: f"{v:+.1f}%", "n": lambda v: f"{v:,.0f}", "f2": lambda v: f"{v:.2f}",
           "share": lambda v: f"{v:.2%}"}[kind]
    if stats["min"] == stats["max"]:
        return fmt(stats["mean"])
    return f"{fmt(stats['mean'])} ({fmt(stats['min'])}-{fmt(stats['max'])})"


def table(rows: list[list[str]], header: list[str]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
