"""Load -> demand: the measured request rate and latency, and the number of servers they need.

Pure arithmetic over times passed in as values (``now``: monotonic seconds; ``wall``: seconds since
the epoch, only for the time-of-day profile). Nothing here reads a clock, sleeps or does I/O, so
tests drive it with made-up times.

Nouns:
- ``LoadMeter``: request arrivals and latencies in one-second buckets; the *rate* over a window is
  arrivals in the window / the window (or / the time since the meter started, while that is shorter,
  and never less than 1 s). Latency percentiles are over the short window's completions.
- ``DemandEstimator``: ``servers_needed = max(min_servers, ceil(rate * (1 + headroom) / capacity))``
  where ``rate`` is the short window's rate, raised to the forecast when one is on, then hysteresis:
  a higher need is taken at once; a lower one only after the need has stayed below the current value
  for ``scale_down_delay_s``, and then only down to the highest need seen during that time.
- Forecasts (each optional; they only ever *add* capacity, never remove it):
  ``forecast_ewma_tau_s`` -- an exponentially weighted moving average of the rate with that time
  constant (it follows the load slowly, so a short dip does not release servers);
  ``time_of_day_profile`` -- 24 x ``profile_buckets_per_hour`` buckets of the day (UTC), each holding
  the long-window rate seen in that bucket, blended day over day with weight ``profile_weight``; the
  forecast is the largest learned value among the buckets from now to now + ``forecast_horizon_s``,
  so servers are asked for before a rise that happens every day at the same time.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from inference_router.config import RouterSection

DAY_S = 86_400.0


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]) of an ascending list; None when it is empty."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


class LoadMeter:
    """Arrivals and latencies over sliding windows of whole seconds."""

    def __init__(self, short_window_s: float, long_window_s: float, *, started_at: float) -> None:
        self.short_window_s = short_window_s
        self.long_window_s = long_window_s
        self._keep_s = math.ceil(max(short_window_s, long_window_s)) + 1
        self._started_at = started_at
        # second -> arrivals; second -> latencies of requests completed then (short window only)
        self._arrivals: deque[list[int]] = deque()          # [second, count]
        self._latencies: deque[tuple[int, list[float]]] = deque()
        self.total_arrivals = 0

    def record_arrival(self, now: float) -> None:
        self.record_arrivals(now, 1)

    def record_arrivals(self, now: float, count: int) -> None:
        """``count`` arrivals at ``now`` (HAProxy's counter, read once a sample)."""
        second = math.floor(now)
        if self._arrivals and self._arrivals[-1][0] == second:
            self._arrivals[-1][1] += count
        else:
            self._arrivals.append([second, count])
        self.total_arrivals += count
        self._trim(now)

    def record_latency(self, now: float, latency_s: float) -> None:
        second = math.floor(now)
        if not self._latencies or self._latencies[-1][0] != second:
            self._latencies.append((second, []))
        self._latencies[-1][1].append(latency_s)
        self._trim(now)

    def rate(self, now: float, window_s: float) -> float:
        """Arrivals per second over the last ``window_s`` (whole seconds, the current one included)."""
        self._trim(now)
        first = math.floor(now) - math.ceil(window_s) + 1
        count = sum(c for second, c in self._arrivals if second >= first)
        return count / min(window_s, max(1.0, now - self._started_at))

    def short_rate(self, now: float) -> float:
        return self.rate(now, self.short_window_s)

    def long_rate(self, now: float) -> float:
        return self.rate(now, self.long_window_s)

    def latency_percentiles(self, now: float, *qs: float) -> list[float | None]:
        """Latency percentiles (seconds) of the requests completed in the short window."""
        self._trim(now)
        first = math.floor(now) - math.ceil(self.short_window_s) + 1
        values = sorted(v for second, vs in self._latencies if second >= first for v in vs)
        return [percentile(values, q) for q in qs]

    def _trim(self, now: float) -> None:
        oldest = math.floor(now) - self._keep_s
        while self._arrivals and self._arrivals[0][0] < oldest:
            self._arrivals.popleft()
        oldest_latency = math.floor(now) - math.ceil(self.short_window_s)
        while self._latencies and self._latencies[0][0] < oldest_latency:
            self._latencies.popleft()


class RateEwma:
    """Exponentially weighted moving average of a rate sampled at irregular times."""

    def __init__(self, tau_s: float) -> None:
        self.tau_s = tau_s
        self.value: float | None = None
        self._at: float | None = None

    def update(self, now: float, rate: float) -> float:
        if self.value is None or self._at is None:
            self.value = rate
        else:
            alpha = 1.0 - math.exp(-max(0.0, now - self._at) / self.tau_s)
            self.value += alpha * (rate - self.value)
        self._at = now
        return self.value


class TimeOfDayProfile:
    """The rate per time-of-day bucket, learned online, day over day.

    While the clock is inside a bucket, the long-window rates seen are averaged; when the clock
    leaves it, that day's average is blended into the bucket (``weight`` for the new day). A
    bucket never seen has no value and forecasts nothing.
    """

    def __init__(self, buckets_per_hour: int, weight: float) -> None:
        self.bucket_s = 3600.0 / buckets_per_hour
        self.buckets: list[float | None] = [None] * (24 * buckets_per_hour)
        self.weight = weight
        self._current: int | None = None
        self._sum = 0.0
        self._samples = 0

    def bucket_of(self, wall: float) -> int:
        return int((wall % DAY_S) // self.bucket_s)

    def observe(self, wall: float, rate: float) -> None:
        bucket = self.bucket_of(wall)
        if bucket != self._current:
            self._close_bucket()
            self._current = bucket
        self._sum += rate
        self._samples += 1

    def forecast(self, wall: float, horizon_s: float) -> float | None:
        """The highest learned rate among the buckets from ``wall`` to ``wall + horizon_s``."""
        steps = int(horizon_s // self.bucket_s) + 1
        first = self.bucket_of(wall)
        learned = [self.buckets[(first + k) % len(self.buckets)] for k in range(min(steps, len(self.buckets)))]
        values = [v for v in learned if v is not None]
        return max(values) if values else None

    def _close_bucket(self) -> None:
        if self._current is not None and self._samples:
            day_mean = self._sum / self._samples
            old = self.buckets[self._current]
            self.buckets[self._current] = day_mean if old is None else old + self.weight * (day_mean - old)
        self._sum, self._samples = 0.0, 0


@dataclass(frozen=True)
class DemandEstimate:
    """One evaluation: what was measured, what it asks for, and what is reported after hysteresis."""

    short_rate: float
    long_rate: float
    forecast_rate: float | None
    raw_need: int                   # from the rate (and forecast) alone
    servers_needed: int             # after hysteresis: what the scheduler is told


def servers_for(rate: float, *, headroom: float, capacity_rps: float, min_servers: int) -> int:
    """``max(min_servers, ceil(rate * (1 + headroom) / capacity_rps))``, robust to float noise."""
    exact = rate * (1.0 + headroom) / capacity_rps
    return max(min_servers, math.ceil(exact - 1e-9))


class DemandEstimator:
    """Turns the meter's rates into ``servers_needed``; call ``evaluate`` regularly (any period)."""

    def __init__(self, config: RouterSection) -> None:
        if config.server_capacity_rps is None:
            raise ValueError("router.server_capacity_rps must be set to derive demand from load")
        self.config = config
        self.ewma = RateEwma(config.forecast_ewma_tau_s) if config.forecast_ewma_tau_s > 0 else None
        self.profile = (
            TimeOfDayProfile(config.profile_buckets_per_hour, config.profile_weight)
            if config.time_of_day_profile
            else None
        )
        self.current: int | None = None
        # (time, raw need) while the need is below ``current``; emptied when it is not
        self._lower_since: deque[tuple[float, int]] = deque()
        self._hold_until = -math.inf

    def hold_at_least(self, now: float, servers: int) -> None:
        """Start from ``servers`` (what serves when the router starts) and do not go below it before
        the short window has filled: a router that just started has measured nothing, and reporting
        ``min_servers`` then would have the scheduler loan servers that are busy."""
        if self.current is None or servers > self.current:
            self.current = servers
        self._hold_until = now + self.config.short_window_s

    def evaluate(self, now: float, wall: float, short_rate: float, long_rate: float) -> DemandEstimate:
        cfg = self.config
        forecasts = []
        if self.ewma is not None:
            forecasts.append(self.ewma.update(now, short_rate))
        if self.profile is not None:
            self.profile.observe(wall, long_rate)
            learned = self.profile.forecast(wall, cfg.forecast_horizon_s)
            if learned is not None:
                forecasts.append(learned)
        forecast_rate = max(forecasts) if forecasts else None
        rate = max(short_rate, forecast_rate or 0.0)
        assert cfg.server_capacity_rps is not None
        raw = servers_for(rate, headroom=cfg.headroom, capacity_rps=cfg.server_capacity_rps,
                          min_servers=cfg.min_servers)
        return DemandEstimate(short_rate, long_rate, forecast_rate, raw, self._hysteresis(now, raw))

    def _hysteresis(self, now: float, raw: int) -> int:
        if self.current is not None and now < self._hold_until:
            raw = max(raw, self.current)  # warming up: the rate is not measured yet
        if self.current is None or raw >= self.current:
            self.current = raw             # up (or equal): at once
            self._lower_since.clear()
            return self.current
        self._lower_since.append((now, raw))
        started = self._lower_since[0][0]
        if now - started >= self.config.scale_down_delay_s:
            # Lower, but only to the highest need of the whole delay window.
            window_start = now - self.config.scale_down_delay_s
            self.current = max(need for at, need in self._lower_since if at >= window_start)
            self._lower_since.clear()
        return self.current
