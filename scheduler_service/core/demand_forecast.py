"""The inference demand forecast: how many serving servers inference will need over the next horizon, with an
upper band, learned online from the demand's own history; and how long a reclaim takes, measured.

What it is for: predictive reclaim and forecast-aware loaning (``policies.aryl.loans``). One module, one
feeder: the scheduling cycle (``scheduler_service.cycle``), which the service and the simulator share, calls
``observe`` with each snapshot's demand (the routers' reported need in the service, the load trace in the
simulator) and ``observe_reclaim`` when a reclaimed server serves again, and hands the policy a frozen
``ForecastView`` in the snapshot's demand. What it must never do: decide loans, read a clock (times are
values), or look at the future of a trace (it sees what was observed up to ``now``, nothing else).

Nouns and rules:
- **History**: the need as a step function of time, in bins of ``bin_s`` (60 s); a bin holds the highest need
  seen in it (a bin the feeder skipped holds the need then in force). The last ``history_s`` (14 days) are kept.
- **Rise over a horizon** ``H`` from an anchor bin ``a``: ``(max(need[a+1 .. a+k]) - need[a]) / u(need[a])``
  with ``k = ceil(H / bin_s)`` and the unit ``u(n) = sqrt(max(n, 1))``: how far the need went above where it
  stood within ``H``, in units of the square root of where it stood (a need of 0 counts as 1, so a rise from 0
  to 1 is a rise of 1 and staying at 1 is none). Why the square root: the need follows a request count, whose
  noise grows as the square root of its level (Poisson), so rises in that unit pool across the day's high and
  low hours alike; relative rises (``/ max(n, 1)``, the unit until 2026-11-30) let the quiet hours' large
  relative jumps set the band at busy ones, absolute rises the reverse. Measured with the forecast alone
  (``evaluation.inference``, ``coverage``) at the 99.9% band over 2 minutes: the same share of minutes above
  the band on both evaluation loads (within 0.005 points), the band's average height above the need 3.5 servers
  either way on ServeGen and 10.5 -> 5.1 on the spiky Alibaba load.
- **Anchors**: the bins within ``season_window_s`` (1 h) of now's time of day on every past day of the
  history (the load's daily cycle), and the bins of the last ``season_window_s`` before now (what the load
  does now); only anchors whose whole horizon is in the past count.
- **Upper band** at quantile ``q``: ``level + u(level) x`` the anchors' rises' ``q``-quantile (nearest
  rank: a rise that was observed, never interpolated), and never below the **trend**, the least-squares slope
  of the need over the last ``trend_window_s`` (30 min) carried ``H`` ahead when it is rising: ``level + slope x
  H``. With fewer than ``min_anchors`` anchors (the first minutes) the rises count as none: the band is the
  level or the trend. The **point forecast** (shown to operators, not used to decide) uses the median rise.
- **Reclaim latency** (``lead``): the time from the decision to reclaim to the server serving again, measured:
  the ``LATENCY_QUANTILE`` (p90, nearest rank) of the last ``LATENCY_SAMPLES`` reclaims (RECLAIM step to
  RETURN step), plus the **decision lag**, the same quantile of the gaps between the last cycles (a rise is
  seen only at the next cycle). Before the first reclaim the latency is ``None`` and the policy uses its
  reclaim deadline (``policy.reclaim_deadline_s``, the longest a stop may take) instead.

Why this shape: a time-of-day conditioned empirical quantile needs no model fitted offline, adapts as the
history grows, and its band means one thing a budget can be set against: the share of moments at which the
need rises within ``H`` beyond it (``policy.inference_short_budget``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

DAY_S = 86_400.0
LATENCY_SAMPLES = 50
LATENCY_QUANTILE = 0.9


def _nearest_rank(values: list[float] | np.ndarray, q: float) -> float:
    """The ``q``-quantile of ``values`` by nearest rank (an observed value; ``q`` in (0, 1])."""
    ordered = np.sort(np.asarray(values, dtype=float))
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def _unit(need: float | np.ndarray) -> np.ndarray:
    """The unit a rise from ``need`` is measured in: ``sqrt(max(need, 1))`` (module doc, "Rise")."""
    return np.sqrt(np.maximum(need, 1.0))


def _max_table(values: np.ndarray, longest: int) -> list[np.ndarray]:
    """A sparse table of ``values``: level ``j`` holds the max of each run of ``2**j`` values from each index
    (shorter at the end), for every ``2**j <= longest``; ``_window_max`` reads any window from two entries."""
    table = [values]
    width = 1
    while 2 * width <= longest:
        prev = table[-1]
        nxt = prev.copy()
        nxt[:len(prev) - width] = np.maximum(prev[:len(prev) - width], prev[width:])
        table.append(nxt)
        width *= 2
    return table


def _window_max(table: list[np.ndarray], starts: np.ndarray, k: int) -> np.ndarray:
    """``max(values[a .. a + k - 1])`` for each start ``a`` (the windows lie within the values)."""
    j = k.bit_length() - 1
    level = table[j]
    out: np.ndarray = np.maximum(level[starts], level[starts + k - (1 << j)])
    return out


@dataclass(frozen=True)
class ForecastSettings:
    bin_s: float = 60.0
    history_s: float = 14 * DAY_S
    season_window_s: float = 3600.0
    trend_window_s: float = 1800.0
    min_anchors: int = 20

    def __post_init__(self) -> None:
        if not self.bin_s > 0 or self.history_s < DAY_S or self.season_window_s <= 0 or self.trend_window_s <= 0:
            raise ValueError(f"invalid forecast settings {self}: bin_s > 0, history_s >= 1 day, windows > 0")


@dataclass(frozen=True)
class Forecast:
    """One forecast: the need now (``level``), the expected highest need within ``horizon_s`` (``point``) and
    its upper band at ``quantile`` (``upper``), in servers (fractional; the policy rounds up)."""

    level: float
    point: float
    upper: float
    horizon_s: float
    quantile: float
    anchors: int          # how many past moments the band was learned from (0: level or trend only)
    trend_per_h: float    # the need's recent slope, servers per hour


@dataclass(frozen=True, eq=False)
class ForecastView:
    """A frozen copy of the forecaster's history at ``now``: what the policy reads (``forecast``, ``lead_s``)."""

    now: float
    settings: ForecastSettings
    level: float
    first_bin: int                  # the absolute bin of ``history[0]``
    history: np.ndarray             # need per bin, ``first_bin`` .. the bin of ``now``
    reclaim_latency_s: float | None  # measured (module doc); None: no reclaim measured yet
    decision_lag_s: float
    _memo: dict[tuple[float, float], Forecast] = field(default_factory=dict, repr=False)

    def lead_s(self, fallback_latency_s: float) -> float:
        """How far ahead a reclaim must start to have the server serving when the need arrives: the measured
        reclaim latency (``fallback_latency_s`` before one is measured) plus the decision lag."""
        latency = fallback_latency_s if self.reclaim_latency_s is None else self.reclaim_latency_s
        return latency + self.decision_lag_s

    def forecast(self, horizon_s: float, quantile: float) -> Forecast:
        if not 0 < quantile <= 1 or horizon_s < 0:
            raise ValueError(f"need 0 < quantile <= 1 and horizon_s >= 0, got {quantile}, {horizon_s}")
        key = (horizon_s, quantile)
        if key not in self._memo:
            self._memo[key] = self._compute(horizon_s, quantile)
        return self._memo[key]

    def _compute(self, horizon_s: float, quantile: float) -> Forecast:
        s = self.settings
        k = max(1, math.ceil(horizon_s / s.bin_s - 1e-9))
        now_bin = self.first_bin + len(self.history) - 1
        # Anchors: around now's time of day on past days, and the recent past; each with its whole horizon
        # before the current bin (a partly observed bin is no outcome yet).
        anchors = self._anchors(now_bin, k)
        rises = np.empty(0)
        if len(anchors) >= s.min_anchors:
            rel = anchors - self.first_bin
            ahead = self.history[rel[:, None] + np.arange(1, k + 1)[None, :]].max(axis=1)
            rises = (ahead - self.history[rel]) / _unit(self.history[rel])
        trend = self._trend_per_s()
        by_trend = self.level + max(0.0, trend) * horizon_s
        scale = float(_unit(self.level))
        upper = max(by_trend, self.level + scale * _nearest_rank(rises, quantile) if len(rises) else self.level)
        point = self.level + scale * max(0.0, float(np.median(rises))) if len(rises) else by_trend
        return Forecast(self.level, point, upper, horizon_s, quantile, len(rises), trend * 3600.0)

    def reclaimed_shares(self, windows_s: Sequence[float], serving: int, loaned: int) -> tuple[float, ...]:
        """For each window ``W``: the expected share of the ``loaned`` servers that inference takes back within
        ``W``, with ``serving`` servers serving now (the risk-valued loans of ``policies.aryl``). A sample per
        anchor (the band's anchors, module doc): the need goes to ``level + u(level) x`` the anchor's rise
        over ``W``, and the servers it needs beyond ``serving`` come back, at most ``loaned``. The mean over
        the anchors (with fewer than ``min_anchors``: the rising trend carried ``W`` ahead, one sample).
        Windows are in seconds from now; a reclaim that must start a lead ahead of the need is the caller's to
        add to ``W``."""
        if loaned <= 0:
            return tuple(0.0 for _ in windows_s)
        s = self.settings
        ks = [max(1, math.ceil(w / s.bin_s - 1e-9)) for w in windows_s]
        now_bin = self.first_bin + len(self.history) - 1
        anchors = self._anchors(now_bin, max(ks))
        if len(anchors) < s.min_anchors:
            trend = max(0.0, self._trend_per_s())
            return tuple(min(loaned, max(0, math.ceil(self.level + trend * w - 1e-9) - serving)) / loaned
                         for w in windows_s)
        rel = anchors - self.first_bin
        base = self.history[rel]
        scale = float(_unit(self.level))
        table = _max_table(self.history, max(ks))
        out = []
        for k in ks:
            ahead = _window_max(table, rel + 1, k)  # max(need[a+1 .. a+k]) for each anchor
            need = self.level + scale * (ahead - base) / _unit(base)
            taken = np.clip(np.ceil(need - 1e-9) - serving, 0, loaned)
            out.append(float(taken.mean()) / loaned)
        return tuple(out)

    def _anchors(self, now_bin: int, k: int) -> np.ndarray:
        """The band's anchors (module doc) whose whole horizon of ``k`` bins is in the past."""
        s = self.settings
        per_day = round(DAY_S / s.bin_s)
        window = max(1, round(s.season_window_s / s.bin_s))
        starts = [now_bin - window]
        starts += [now_bin - d * per_day - window for d in range(1, len(self.history) // per_day + 2)]
        anchors = np.unique(np.concatenate([np.arange(a, a + 2 * window + 1) for a in starts]))
        return anchors[(anchors >= self.first_bin) & (anchors + k <= now_bin - 1)]

    def _trend_per_s(self) -> float:
        s = self.settings
        n = min(len(self.history), max(3, round(s.trend_window_s / s.bin_s)))
        if n < 3:
            return 0.0
        y = self.history[-n:]
        x = np.arange(n, dtype=float)
        slope_per_bin = float(np.polyfit(x, y, 1)[0])
        return slope_per_bin / s.bin_s


class DemandForecaster:
    """The forecaster's state (module doc): fed by ``observe`` and ``observe_reclaim``; read through ``view``."""

    def __init__(self, settings: ForecastSettings | None = None) -> None:
        self.settings = settings or ForecastSettings()
        self._size = math.ceil(self.settings.history_s / self.settings.bin_s)
        self._buf = np.zeros(2 * self._size)  # need per bin; the live part is _buf[_lo:_hi], oldest first
        self._lo = self._hi = 0
        self._last_bin: int | None = None
        self.level = 0.0
        self._version = 0  # bumped whenever the history changes: forecasts of one version are memoised
        self._memo: dict[tuple[float, float], Forecast] = {}
        self._latencies: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._gaps: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._last_view_at: float | None = None

    def observe(self, now: float, servers_needed: float) -> None:
        """The need in force from ``now`` on. Times before the last one observed count as at it."""
        need = float(servers_needed)
        b = math.floor(now / self.settings.bin_s)
        if self._last_bin is None or b > self._last_bin:
            # The bins the feeder skipped held the previous need (a step function); at most the history.
            skipped = 0 if self._last_bin is None else min(b - self._last_bin - 1, self._size)
            self._append(np.full(skipped + 1, self.level))
            self._buf[self._hi - 1] = need
            self._last_bin = b
            self._changed()
        elif need > self._buf[self._hi - 1]:
            self._buf[self._hi - 1] = need
            self._changed()
        if need != self.level:
            self.level = need
            self._changed()

    def _append(self, values: np.ndarray) -> None:
        if self._hi + len(values) > len(self._buf):  # compact: keep the last _size - len(values) bins
            keep = self._buf[max(self._lo, self._hi - (self._size - len(values))):self._hi].copy()
            self._buf[:len(keep)] = keep
            self._lo, self._hi = 0, len(keep)
        self._buf[self._hi:self._hi + len(values)] = values
        self._hi += len(values)
        self._lo = max(self._lo, self._hi - self._size)

    def _changed(self) -> None:
        self._version += 1
        self._memo = {}

    def observe_reclaim(self, seconds: float) -> None:
        """A reclaimed server serves again, ``seconds`` after its RECLAIM step."""
        if seconds >= 0 and math.isfinite(seconds):
            self._latencies.append(float(seconds))

    @property
    def reclaim_latency_s(self) -> float | None:
        return _nearest_rank(list(self._latencies), LATENCY_QUANTILE) if self._latencies else None

    def view(self, now: float) -> ForecastView | None:
        """A frozen copy for one cycle at ``now`` (None before anything was observed). Each call is one cycle:
        the gap since the previous call is a sample of the decision lag."""
        if self._last_view_at is not None and now > self._last_view_at:
            self._gaps.append(now - self._last_view_at)
        self._last_view_at = now
        if self._last_bin is None:
            return None
        self.observe(now, self.level)  # carry the need in force up to now
        assert self._last_bin is not None
        history = self._buf[self._lo:self._hi].copy()
        return ForecastView(
            now=now, settings=self.settings, level=self.level, first_bin=self._last_bin - len(history) + 1,
            history=history, reclaim_latency_s=self.reclaim_latency_s,
            decision_lag_s=_nearest_rank(list(self._gaps), LATENCY_QUANTILE) if self._gaps else 0.0,
            _memo=self._memo)
