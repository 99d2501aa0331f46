"""Write-behind (``LatestWriter``): the latest item per key written on one thread of its own, after
its caller was answered.

The service's telemetry-only status reports go through one (``app.agents``, keyed by server): a report
never waits for a database write that decides nothing, and a slow database makes telemetry staler
instead of reports slower.

Never: let one item's write stop the thread, or hold more than one waiting item per key.
"""

from __future__ import annotations

import itertools
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

    ``write`` runs on the thread, one item at a time (or ``write_many``, a batch); what it raises is
    logged and the next item served. Never: let one item stop the thread. If it stops nonetheless,
    ``offer`` answers False (the caller writes on its own thread instead, as before there was a writer).
    """

    def __init__(
        self, write: Callable[[In], None], *, key: Callable[[In], str], name: str,
        write_many: Callable[[list[In]], None] | None = None, batch: int = 1, gather_s: float = 0.0,
    ) -> None:
        """With ``write_many``, the thread takes up to ``batch`` waiting items at a time (their keys
        distinct, the oldest first) and writes them with one call, having waited ``gather_s`` once it found
        fewer waiting, so that others join them; if that call raises, each item is written with ``write``
        (one alone always is)."""
        self.name = name
        self._write = write
        self._write_many = write_many
        self._batch = max(1, batch) if write_many is not None else 1
        self._gather_s = gather_s if write_many is not None else 0.0
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
                    if self._gather_s > 0 and not self._closing and len(self._waiting) < self._batch:
                        self._changed.wait_for(lambda: self._closing, timeout=self._gather_s)
                    items = [self._waiting.pop(key) for key in list(itertools.islice(self._waiting, self._batch))]
                if len(items) > 1 and self._write_many is not None:
                    try:
                        self._write_many(items)
                        continue
                    except Exception:  # the items are written one by one below
                        log.exception("write-behind of a batch failed; writing its items one by one",
                                      writer=self.name, items=len(items))
                for item in items:
                    try:
                        self._write(item)
                    except Exception:  # one item's failure is its own; the next is served
                        log.exception("write-behind failed", writer=self.name, key=self._key(item))
        except BaseException:
            log.critical("write-behind worker stopped", writer=self.name, exc_info=True)
            raise
        finally:
            with self._changed:
                self._closing = True
                self._waiting.clear()
