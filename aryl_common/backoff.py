"""Exponential backoff with jitter, for the retries after a failed call to the scheduler.

Pure arithmetic over a random source: it never sleeps, so callers sleep the way their loop does
(``time.sleep``, ``Event.wait``, ``asyncio.sleep``).
"""

from __future__ import annotations

import random


class Backoff:
    """Exponential backoff with jitter: ``initial * multiplier**n``, capped, each delay drawn from [d/2, d].

    Jitter keeps a fleet of agents that lost the scheduler together from reconnecting in lock-step.
    ``reset()`` after a success, so the next outage starts short again.
    """

    def __init__(
        self,
        max_delay_s: float,
        *,
        initial_s: float = 0.5,
        multiplier: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial_s <= max_delay_s:
            raise ValueError(f"need 0 < initial_s ({initial_s}) <= max_delay_s ({max_delay_s})")
        self.max_delay_s = max_delay_s
        self.initial_s = initial_s
        self.multiplier = multiplier
        self._rng = rng or random.Random()
        self._failures = 0

    @classmethod
    def capped(cls, max_delay_s: float) -> Backoff:
        """The daemons' backoff (0.5 s doubling, jittered), starting lower when the cap is below 0.5 s."""
        return cls(max_delay_s, initial_s=min(0.5, max_delay_s))

    @property
    def failures(self) -> int:
        """Consecutive failures since the last ``reset()``."""
        return self._failures

    def next_delay(self) -> float:
        """Record one more failure; return how long to wait before trying again."""
        ceiling = min(self.max_delay_s, self.initial_s * self.multiplier**self._failures)
        self._failures += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._failures = 0
