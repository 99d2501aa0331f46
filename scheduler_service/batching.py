"""Group commit: concurrent calls are gathered into batches handled by one worker thread.

Under load, many SubmitJob calls arrive at once; committing them one transaction each is bound by
round trips and per-transaction overhead. ``GroupCommitter`` hands whatever has queued up (up to
``max_batch``) to a batch function in one go; each caller gets its own result or exception through
a Future. With one caller at a time it degenerates to one item per batch, with no added wait.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

_STOP = object()


class GroupCommitter(Generic[In, Out]):
    def __init__(self, handle_batch: Callable[[Sequence[In]], Sequence[Out | Exception]], *,
                 max_batch: int = 256, name: str = "group-commit") -> None:
        self._handle_batch = handle_batch
        self._max_batch = max_batch
        self._queue: queue.SimpleQueue[tuple[In, Future[Out]] | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: In) -> Future[Out]:
        future: Future[Out] = Future()
        self._queue.put((item, future))
        return future

    def close(self) -> None:
        """Finish what is queued, then stop the worker."""
        self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = False
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                    break
                batch.append(nxt)
            self._complete(batch)  # type: ignore[arg-type]
            if stop:
                return

    def _complete(self, batch: list[tuple[In, Future[Out]]]) -> None:
        try:
            results = self._handle_batch([item for item, _ in batch])
        except Exception as exc:  # noqa: BLE001 - every caller of the batch gets the failure
            for _, future in batch:
                future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
