"""The service's real clock (the simulator supplies a virtual one with the same interface)."""

from __future__ import annotations

import time


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()
