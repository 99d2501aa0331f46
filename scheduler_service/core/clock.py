"""Time is injected: the one Clock interface. The core never reads the wall clock itself."""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the UNIX epoch (wall time, for timestamps users read)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for liveness and durations)."""
        ...
