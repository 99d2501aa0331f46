"""``Signal``: a version counter that wakes the asyncio tasks waiting for a newer version.

Writers (any thread) bump it after commit; readers remember the version they saw, re-read the
database, and wait for a newer one. A missed wake-up only delays a reader until its poll timeout.
Never: carry data (the database is re-read every time) or decide anything.
"""

from __future__ import annotations

import asyncio


class Signal:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.version = 0
        self._waiters: set[asyncio.Future[None]] = set()

    def bump_threadsafe(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self.bump)
        except RuntimeError:
            pass  # the loop is closed: the service is shutting down, nobody is waiting

    def bump(self) -> None:
        """Wake every waiter; only on the loop's own thread."""
        self.version += 1
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait_newer(self, seen: int, timeout: float | None) -> None:
        """Return once ``version > seen`` or after ``timeout`` seconds (None: no timeout)."""
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
