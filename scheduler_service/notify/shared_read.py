"""``SharedRead``: the answer of one read shared by every stream that watches it (WatchServingPool).

One reader re-reads it after each wake-up and at least every ``recheck_s`` while any stream watches;
streams are woken only when the answer's *key* changed.
Never: read while nobody watches, keep an answer nobody watches, or decide anything.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Generic, TypeVar

import structlog

from scheduler_service.notify.signals import Signal

log = structlog.get_logger("aryl.notify")

T = TypeVar("T")


class SharedRead(Generic[T]):
    """The answer of one read, shared by every stream that watches it: while any stream watches,
    one reader (a task on the loop) re-reads it on ``executor`` after each wake-up of ``wake``
    (coalesced) and at least every ``recheck_s``, and streams are woken only when ``key`` of the
    answer changed. A stream costs no database work of its own."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, wake: Signal, read: Callable[[], T], *, executor: Executor | None,
        recheck_s: float, key: Callable[[T], object] = lambda value: value,
    ) -> None:
        self._loop = loop
        self._wake = wake
        self._read = read
        self._executor = executor
        self.recheck_s = recheck_s
        self._key = key
        self.changed = Signal(loop)
        self.reads = 0
        self.value: T | None = None
        self.watchers = 0
        self._reader: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None

    async def watch(self) -> AsyncIterator[T]:
        """Yield the answer now (a fresh read when no stream watched) and again whenever it changes."""
        self.watchers += 1
        try:
            if self._reader is None or self._reader.done():
                self._ready = self._loop.create_future()
                self._reader = self._loop.create_task(self._run(self._ready))
            assert self._ready is not None
            await asyncio.shield(self._ready)
            sent: object = _NOTHING
            while True:
                seen = self.changed.version
                value = self.value
                assert value is not None
                if self._key(value) != sent:
                    sent = self._key(value)
                    yield value
                if self.changed.version == seen:
                    await self.changed.wait_newer(seen, timeout=None)
        finally:
            self.watchers -= 1

    async def _run(self, ready: asyncio.Future[None]) -> None:
        retry_s = min(1.0, self.recheck_s)
        while True:
            seen = self._wake.version
            try:
                value = await self._loop.run_in_executor(self._executor, self._read)
                self.reads += 1
                wait = self.recheck_s
            except Exception as exc:  # noqa: BLE001 - the first read's error goes to the streams waiting
                if not ready.done():
                    ready.set_exception(exc)
                    ready.exception()
                    return
                log.warning("shared read failed; retrying", error=repr(exc), retry_s=retry_s)
                wait = retry_s
            else:
                if self.value is None or self._key(value) != self._key(self.value):
                    self.value = value
                    self.changed.bump()
                if not ready.done():
                    ready.set_result(None)
            if not self.watchers:
                self.value = None  # nobody watches: the next stream gets a fresh read
                return
            await self._wake.wait_newer(seen, timeout=wait)
            if not self.watchers:
                self.value = None
                return


_NOTHING = object()
