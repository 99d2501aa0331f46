"""In-process wake-ups from committed changes to the asyncio streams that wait for them.

A ``Signal`` is a version counter: writers (any thread) bump it after commit; readers remember the
version they saw, re-read the database, and wait for a newer one. A missed wake-up only delays a
reader until its poll timeout; it never loses data, because the database is re-read every time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable


class Signal:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.version = 0
        self._waiters: set[asyncio.Future[None]] = set()

    def bump_threadsafe(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._bump)
        except RuntimeError:
            pass  # the loop is closed: the service is shutting down, nobody is waiting

    def _bump(self) -> None:
        self.version += 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait_newer(self, seen: int, timeout: float) -> None:
        """Return once ``version > seen`` or after ``timeout`` seconds."""
        if self.version > seen:
            return
        waiter = self._loop.create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait_for(waiter, timeout)
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)


class AsyncNotifier:
    """The service's ``Notifier``: event-log, per-server desired-state and cycle-trigger signals."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.events = Signal(loop)
        self.cycle = Signal(loop)
        self._servers: dict[str, Signal] = {}
        self._lock = threading.Lock()

    def server(self, server_id: str) -> Signal:
        with self._lock:
            signal = self._servers.get(server_id)
            if signal is None:
                signal = self._servers[server_id] = Signal(self._loop)
            return signal

    def events_appended(self) -> None:
        self.events.bump_threadsafe()

    def desired_state_changed(self, server_ids: Iterable[str]) -> None:
        for server_id in server_ids:
            self.server(server_id).bump_threadsafe()

    def cycle_requested(self) -> None:
        self.cycle.bump_threadsafe()
