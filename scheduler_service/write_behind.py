"""Write-behind (``LatestWriter``): the latest item per key written on one thread of its own, after
its caller was answered.

The service's telemetry-only status reports go through one (``app.agents``, keyed by server): a report
never waits for a database write that decides nothing, and a slow database makes telemetry staler
instead of reports slower.

Never: let one item's write stop the thread, or hold more than one waiting item per key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import structlog

In = TypeVar("In")

log = structlog.get_logger("aryl.write_behind")


class LatestWriter(Generic[In]):
    """Writes behind their answers, on one thread of its own, the latest item per key: an item offered
    while an older one of its key still waits replaces it in its place in line (the older is never
    written). So the backlog is bounded by the number of keys, however fast items come, and when the
    writer falls behind, what it writes grows staler instead of its callers waiting.

    ``write`` runs on the thread, one item at a time; what it raises is logged and the next item
    served. Never: let one item stop the thread. If it stops nonetheless, ``offer`` answers False
    (the caller writes on its own thread instead, as before there was a writer).
    """

    def __init__(self, write: Callable[[In], None], *, key: Callable[[In], str], name: str) -> None:
        self.name = name
        self._write = write
        self._key = key
        self._waiting: dict[str, In] = {}  # oldest key first
        self._changed = threading.Condition()
        self._closing = False  # close() called, or the thread stopped: offers are refused
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def offer(self, item: In) -> bool:
        """Queue ``item`` (replacing an older item of its key that waits); False once the writer has
        stopped or is closing, when nothing is queued."""
        with self._changed:
            if self._closing:
                return False
            key = self._key(item)
            first = key not in self._waiting
            self._waiting[key] = item
            if first:
                self._changed.notify()
        return True

    def withdraw(self, key: str) -> None:
        """Drop the item of ``key`` that waits, if any (something newer of that key was written)."""
        with self._changed:
            self._waiting.pop(key, None)

    def backlog(self) -> int:
        with self._changed:
            return len(self._waiting)

    def close(self) -> None:
        """Write what waits, then stop the thread (later offers answer False)."""
        with self._changed:
            self._closing = True
            self._changed.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    while not self._waiting and not self._closing:
                        self._changed.wait()
                    if not self._waiting:
                        return
                    key = next(iter(self._waiting))
                    item = self._waiting.pop(key)
                try:
                    self._write(item)
                except Exception:  # one item's failure is its own; the next is served
                    log.exception("write-behind failed", writer=self.name, key=key)
        except BaseException:
            log.critical("write-behind worker stopped", writer=self.name, exc_info=True)
            raise
        finally:
            with self._changed:
                self._closing = True
                self._waiting.clear()
