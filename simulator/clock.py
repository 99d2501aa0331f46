"""The simulator's clock: the core's ``Clock`` interface over virtual time.

Virtual time is seconds since the trace's start. Only the engine moves it (``advance_to``), forward
only; nothing here reads the wall clock, so a simulation is a function of its inputs.
"""

from __future__ import annotations


class VirtualClock:
    """``now()`` and ``monotonic()`` both return the virtual time; a cycle's measured durations
    (``CycleReport.decide_s``, ``total_s``) are therefore 0: planning takes no virtual time."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def advance_to(self, when: float) -> None:
        """Move to ``when``; refuses to go back (virtual time is monotonic like the real one)."""
        if when < self._now:
            raise ValueError(f"virtual time cannot go back from {self._now} to {when}")
        self._now = float(when)
