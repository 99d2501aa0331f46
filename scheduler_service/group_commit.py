"""Group commit: concurrent calls are gathered into groups, each committed in one go by one worker
thread (``GroupCommitter``: the service's SubmitJob and CancelJob calls).

Under load, many SubmitJob calls arrive at once; committing them one transaction each is bound by
round trips and per-transaction overhead. ``GroupCommitter`` hands whatever has queued up (up to
``max_group``) to a commit function in one go; each caller gets its own result or exception through
a Future. With one caller at a time it degenerates to a group of one, with no added wait.

A caller may give up at any time (its RPC cancelled: ``asyncio.wrap_future`` then cancels the
Future). Before its group is committed, that takes its item out: it is never applied. Once its group
is being committed, the item can no longer be withdrawn (``Future.set_running_or_notify_cancel``): it is
applied and its result delivered to no one, so the caller must look for it (a SubmitJob retried with the
same idempotency key and spec is answered with the job the first try queued). Never: let one caller, one
group or a commit function that breaks its contract stop the worker thread; every other caller waits on
it. If the thread stops nonetheless, it fails every caller still waiting, refuses new ones, and tells its
stop callbacks (the service reports NOT_SERVING).

(Not to be confused with a training job's *batch*, the samples of one step: ``core.batch``.)
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Generic, TypeVar

import structlog

from scheduler_service.errors import Unavailable

In = TypeVar("In")
Out = TypeVar("Out")

log = structlog.get_logger("aryl.group_commit")

# Called once, on the worker thread, when it stops: with None after ``close``, else with what stopped it.
StopCallback = Callable[[BaseException | None], None]


class GroupCommitter(Generic[In, Out]):
    def __init__(self, commit_group: Callable[[Sequence[In]], Sequence[Out | Exception]], *,
                 max_group: int = 256, name: str = "group-commit") -> None:
        self.name = name
        self._commit_group = commit_group
        self._max_group = max_group
        self._queue: queue.SimpleQueue[tuple[In, Future[Out]] | None] = queue.SimpleQueue()  # None: stop
        # Guards ``_stopped`` and the queue's puts against the worker's last drain: no caller is
        # queued after the worker has stopped, where no one would ever answer it.
        self._lock = threading.Lock()
        self._stopped = False
        self._stop_error: BaseException | None = None
        self._stop_callbacks: list[StopCallback] = []
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the worker still takes calls."""
        with self._lock:
            return not self._stopped

    def submit(self, item: In) -> Future[Out]:
        """Queue ``item`` for the next group. Raises ``Unavailable`` once the worker has stopped."""
        future: Future[Out] = Future()
        with self._lock:
            if self._stopped:
                raise Unavailable(self._stopped_message())
            self._queue.put((item, future))
        return future

    def add_stop_callback(self, callback: StopCallback) -> None:
        """Have ``callback`` called when the worker stops (at once, here, if it already has)."""
        with self._lock:
            if not self._stopped:
                self._stop_callbacks.append(callback)
                return
        callback(self._stop_error)

    def close(self) -> None:
        """Finish what is queued, then stop the worker (callers queued after this are refused)."""
        with self._lock:
            if not self._stopped:
                self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._serve()
        except BaseException as exc:  # reported to the stop callbacks, who act on it
            error = exc
            log.critical("group-commit worker stopped", committer=self.name, exc_info=exc)
        finally:
            self._end(error)

    def _serve(self) -> None:
        while True:
            group, stop = self._next_group()
            try:
                self._complete(group)
            except Exception as exc:  # a broken group fails its own callers only; the next one is served
                # The event's wording is older than the module's name; kept, as log searches may use it.
                log.exception("group-commit batch failed", committer=self.name, size=len(group))
                _fail(group, exc)
            except BaseException:
                _fail(group, Unavailable(self._stopped_message()))
                raise
            if stop:
                return

    def _next_group(self) -> tuple[list[tuple[In, Future[Out]]], bool]:
        """The next group (waiting for its first item) and whether ``close`` came after it."""
        group: list[tuple[In, Future[Out]]] = []
        stop = False
        while len(group) < self._max_group:
            try:
                entry = self._queue.get() if not group else self._queue.get_nowait()
            except queue.Empty:
                break
            if entry is None:
                stop = True
                break
            group.append(entry)
        return group, stop

    def _complete(self, group: list[tuple[In, Future[Out]]]) -> None:
        # Callers that gave up already are dropped unapplied; the others can no longer give up, so
        # each result below has a Future to go to.
        live = [(item, future) for item, future in group if future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = self._commit_group([item for item, _ in live])
        except Exception as exc:  # noqa: BLE001 - every caller of the group gets the failure
            _fail(live, exc)
            return
        if len(results) != len(live):
            raise ValueError(f"{self.name}: the commit function answered {len(results)} of {len(live)} items")
        for (_, future), result in zip(live, results, strict=True):
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _end(self, error: BaseException | None) -> None:
        with self._lock:
            self._stopped = True
            self._stop_error = error
            callbacks, self._stop_callbacks = self._stop_callbacks, []
        refused = Unavailable(self._stopped_message())
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                break
            if entry is not None:
                _fail([entry], refused)
        for callback in callbacks:
            try:
                callback(error)
            except Exception:  # one failing callback must not keep the others from being told
                log.exception("group-commit stop callback failed", committer=self.name)

    def _stopped_message(self) -> str:
        return f"the scheduler's {self.name} worker has stopped; retry once the scheduler has restarted"


def _fail(group: Sequence[tuple[object, Future[Out]]], exc: BaseException) -> None:
    """Fail every caller of ``group`` still waiting (those that gave up or were answered are skipped)."""
    for _, future in group:
        if future.done():
            continue
        try:
            future.set_exception(exc)
        except InvalidStateError:  # it gave up just now
            pass
