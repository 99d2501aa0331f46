"""Inference load for the simulator: a request-rate series turned into "inference servers needed".

What this module is for: producing the ``DemandPoint`` series that drives loaning and reclaim in a
simulation -- from a measured request-rate trace (ServeGen's total-rate CSV) or from a synthetic
diurnal curve. What it must never do: decide loans (that is the policy's job, from this signal), read
the clock, or depend on files inside the repository (paths are arguments).

Rules (cited by the evaluation)
-------------------------------
- **ServeGen rates** (``servegen_total_rate_10min.csv``: ``category,model,t_sec,total_rate_rps,
  active_clients``): ``t_sec`` is the start of a 600-s window and t = 0 is local midnight;
  ``total_rate_rps`` is the mean request rate over the window, summed over clients. Windows with
  ``active_clients == 0`` are gaps in the published data (m-small has 37 of its 2,016 windows, all
  between hours 172 and 318, several back to back), not idle service: with ``fill_gaps=True``
  (default) their rate is interpolated linearly from the nearest non-gap windows on both sides (the
  nearest one at the ends).
- **Servers needed** at rate ``r``: ``ceil(r * (1 + headroom) / per_server_rps)``, clipped to
  ``[min_servers, inference_servers]`` (what the router can ask for); the need before the upper clip is kept as
  ``servers_wanted``, and the shortfall is counted against it (``simulator.results``). "Scaled to the
  inference cluster": when ``per_server_rps`` is not given it is chosen so that the series' peak needs
  ``peak_utilisation`` of the cluster, i.e.
  ``per_server_rps = peak * (1 + headroom) / (peak_utilisation * inference_servers)``; with the
  default ``peak_utilisation = 1.0`` the peak window needs exactly the whole cluster. ``peak`` is
  the ``peak_quantile`` of the rates (default 1.0: the maximum; a lower quantile lets rarer spikes
  clip at the full cluster). For ServeGen m-small the maximum (3,880 rps, at hour 284) is 2.3x the
  mean daily peak (about 1,700 rps at 20h); scaled to it, the daily peaks of the first 9 days need
  40-50% of the cluster (``peak_quantile=0.99``: 2,367 rps is the full cluster).
- **Request traces** (``load_request_times_rate``; the Alibaba GenAI trace ``lora_request_trace.csv``: one row
  per request, ``gmt_create`` as ``YYYY-MM-DD HH:MM:SS``): requests are counted in bins of ``bin_s`` (600 s)
  from the local midnight before the first request, and a bin's rate is its count / ``bin_s`` (requests/s;
  every request counts, failed ones too: they were load). Bins without requests have rate 0 -- not gaps: this
  trace has whole idle hours. ``start_day`` drops the days before it (the Alibaba trace's first 4 days carry
  about 90 requests a day, then 400-2,700). Spikes are kept as they are: scaled with ``peak_quantile = 1``,
  the largest bin needs the whole cluster and nothing is clipped.
- **Covering the simulation.** The series is laid from ``start_s`` (a time on the series' own clock,
  default its start) and repeated end to end with period = its span (last ``t`` - first ``t`` + one
  step; 14 days for ServeGen's language models, 1 day for the others -- whole days, so the time of
  day, and with 14 days the weekday, is kept across repeats) until ``duration_s`` is covered. One
  point per series window; the simulator holds each value until the next point.
- **Synthetic diurnal curve**: the needed fraction of the cluster is
  ``low + (high - low) * (1 + cos(2 pi (t - peak_s) / period_s)) / 2`` (``high`` at ``peak_s``
  each period, ``low`` half a period away), times ``(1 + noise * N(0,1))`` from a seeded generator,
  then ``servers = ceil(fraction * inference_servers)`` clipped as above.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simulator.model import DemandPoint
from simulator.trace_csv import TraceFormatError, _open_text

__all__ = ["demand_from_rate", "diurnal_demand", "load_request_times_rate", "load_servegen_rate"]


def load_servegen_rate(
    path: str | Path,
    *,
    category: str = "language",
    model: str = "m-small",
    fill_gaps: bool = True,
) -> list[tuple[float, float]]:
    """``[(t_sec, rate_rps), ...]`` of one ServeGen model from ``servegen_total_rate_10min.csv``
    (plain or gzip), sorted by time; gaps filled as the module doc says."""
    points: list[tuple[float, float, int]] = []
    available: set[tuple[str, str]] = set()
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        needed = ("category", "model", "t_sec", "total_rate_rps", "active_clients")
        missing = [c for c in needed if c not in header]
        if missing:
            raise TraceFormatError(path, 1, missing[0], f"missing column(s) {missing}; header is {header}")
        idx = {c: header.index(c) for c in needed}
        for values in reader:
            if not values:
                continue
            line = reader.line_num
            try:
                cat, mod = values[idx["category"]], values[idx["model"]]
            except IndexError:
                raise TraceFormatError(
                    path, line, None, f"expected {len(header)} fields, found {len(values)}"
                ) from None
            available.add((cat, mod))
            if (cat, mod) != (category, model):
                continue
            row = []
            for column, kind in (("t_sec", float), ("total_rate_rps", float), ("active_clients", int)):
                text = values[idx[column]]
                try:
                    value = kind(text)
                except ValueError:
                    raise TraceFormatError(path, line, column, f"expected {kind.__name__}, got {text!r}") from None
                if not math.isfinite(value) or value < 0:
                    raise TraceFormatError(path, line, column, f"expected a finite value >= 0, got {text!r}")
                row.append(value)
            points.append((row[0], row[1], int(row[2])))
    if not points:
        raise ValueError(
            f"{path}: no rows for category={category!r} model={model!r}; available: {sorted(available)}"
        )
    points.sort()
    times = np.array([p[0] for p in points])
    rates = np.array([p[1] for p in points])
    gap = np.array([p[2] == 0 for p in points])
    if fill_gaps and gap.any() and not gap.all():
        rates[gap] = np.interp(times[gap], times[~gap], rates[~gap])
    return [(float(t), float(r)) for t, r in zip(times, rates, strict=True)]


def load_request_times_rate(path: str | Path, *, bin_s: float = 600.0, time_column: str = "gmt_create",
                            start_day: int = 0) -> list[tuple[float, float]]:
    """``[(t_sec, rate_rps), ...]`` from a per-request trace (plain or gzip CSV), binned as the module doc
    says; every bin from the first kept midnight to the last request's bin, zero-rate bins included."""
    from datetime import datetime, timedelta

    if not bin_s > 0 or start_day < 0:
        raise ValueError(f"need bin_s > 0 and start_day >= 0, got {bin_s}, {start_day}")
    stamps: list[datetime] = []
    with _open_text(path) as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if time_column not in header:
            raise TraceFormatError(path, 1, time_column, f"missing column {time_column!r}; header is {header}")
        col = header.index(time_column)
        for values in reader:
            if not values:
                continue
            text = values[col] if col < len(values) else ""
            try:
                # Local times of the trace's own zone (offset-shifted upstream): only differences are used.
                stamps.append(datetime.strptime(text.strip(), "%Y-%m-%d %H:%M:%S"))  # noqa: DTZ007
            except ValueError:
                raise TraceFormatError(path, reader.line_num, time_column,
                                       f"expected YYYY-MM-DD HH:MM:SS, got {text!r}") from None
    if not stamps:
        raise ValueError(f"{path}: no requests")
    origin = min(stamps).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=start_day)
    offsets = np.array([(t - origin).total_seconds() for t in stamps])
    offsets = offsets[offsets >= 0]
    if not len(offsets):
        raise ValueError(f"{path}: no requests from day {start_day} on")
    counts = np.bincount((offsets // bin_s).astype(np.int64))
    return [(k * bin_s, float(c) / bin_s) for k, c in enumerate(counts)]


def _clip(needed: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, needed))


def demand_from_rate(
    series: Sequence[tuple[float, float]],
    *,
    inference_servers: int,
    per_server_rps: float | None = None,
    headroom: float = 0.2,
    peak_utilisation: float = 1.0,
    peak_quantile: float = 1.0,
    min_servers: int = 1,
    duration_s: float | None = None,
    start_s: float | None = None,
) -> list[DemandPoint]:
    """Servers needed over simulated time from a ``[(t, rate_rps)]`` series (module doc).

    ``duration_s``: simulated seconds to cover (the series is repeated); ``None`` = the series once.
    ``start_s``: the series time that becomes simulated time 0 (default: the series' first time).
    """
    if inference_servers < 1:
        raise ValueError(f"inference_servers must be >= 1, got {inference_servers}")
    if not 0 <= min_servers <= inference_servers:
        raise ValueError(f"min_servers must be in [0, inference_servers], got {min_servers}")
    if headroom < 0:
        raise ValueError(f"headroom must be >= 0, got {headroom}")
    if not 0 < peak_utilisation <= 1 or not 0 < peak_quantile <= 1:
        raise ValueError("peak_utilisation and peak_quantile must be in (0, 1]")
    if not series:
        raise ValueError("empty rate series")
    times = np.array([t for t, _ in series], dtype=float)
    rates = np.array([r for _, r in series], dtype=float)
    if np.any(np.diff(times) <= 0):
        raise ValueError("rate series times must be strictly increasing")
    if np.any(rates < 0) or not np.all(np.isfinite(rates)):
        raise ValueError("rates must be finite and >= 0")
    if per_server_rps is None:
        peak = float(np.quantile(rates, peak_quantile))
        if peak <= 0:
            raise ValueError("the series has no positive rate to scale to the cluster")
        per_server_rps = peak * (1.0 + headroom) / (peak_utilisation * inference_servers)
    elif per_server_rps <= 0:
        raise ValueError(f"per_server_rps must be > 0, got {per_server_rps}")

    step = float(times[1] - times[0]) if len(times) > 1 else 600.0
    period = float(times[-1] - times[0]) + step
    offsets = times - times[0]
    phase = ((float(times[0]) if start_s is None else float(start_s)) - float(times[0])) % period
    horizon = period if duration_s is None else float(duration_s)
    out: list[DemandPoint] = []
    lap, i = 0, int(np.searchsorted(offsets, phase, side="right")) - 1  # the window holding start_s
    while True:
        sim_t = max(0.0, lap * period + float(offsets[i]) - phase)
        if out and sim_t >= horizon:
            break
        rate = float(rates[i])
        # ceil with a tolerance, so that the peak needs exactly peak_utilisation * N, not one more
        needed = math.ceil(rate * (1.0 + headroom) / per_server_rps - 1e-9)
        out.append(DemandPoint(time=sim_t, servers_needed=_clip(needed, min_servers, inference_servers), rate_rps=rate,
                               servers_wanted=max(needed, min_servers)))
        i += 1
        if i == len(offsets):
            lap, i = lap + 1, 0
    return out


def diurnal_demand(
    *,
    inference_servers: int,
    days: float,
    period_s: float = 86400.0,
    low: float = 0.2,
    high: float = 1.0,
    step_s: float = 600.0,
    peak_s: float = 20 * 3600.0,
    noise: float = 0.05,
    min_servers: int = 1,
    per_server_rps: float = 1.0,
    seed: int = 0,
) -> list[DemandPoint]:
    """A synthetic daily curve of servers needed (module doc). ``rate_rps`` is the needed fraction
    times ``inference_servers * per_server_rps`` (for plots)."""
    if inference_servers < 1:
        raise ValueError(f"inference_servers must be >= 1, got {inference_servers}")
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError(f"need 0 <= low <= high <= 1, got low={low} high={high}")
    if step_s <= 0 or period_s <= 0 or days <= 0 or noise < 0:
        raise ValueError("step_s, period_s and days must be > 0, noise >= 0")
    rng = np.random.default_rng(seed)
    n = math.ceil(days * 86400.0 / step_s)
    t = np.arange(n) * step_s
    shape = (1.0 + np.cos(2.0 * np.pi * (t - peak_s) / period_s)) / 2.0
    fraction = low + (high - low) * shape
    if noise > 0:
        fraction = fraction * (1.0 + noise * rng.standard_normal(n))
    fraction = np.clip(fraction, 0.0, 1.0)
    return [
        DemandPoint(
            time=float(ti),
            servers_needed=_clip(math.ceil(f * inference_servers - 1e-9), min_servers, inference_servers),
            rate_rps=float(f * inference_servers * per_server_rps),
        )
        for ti, f in zip(t, fraction, strict=True)
    ]
