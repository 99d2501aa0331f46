"""Group commit: concurrent calls are gathered into groups, each committed in one go by one worker
thread (``GroupCommitter``: the service's SubmitJob and CancelJob calls).

Under load, many SubmitJob calls arrive at once; committing them one transaction each is bound by
round trips and per-transaction overhead. ``GroupCommitter`` hands whatever has queued up (up to
``max_group``) to a commit function in one go; each caller gets its own result or exception through
a Future. With one caller at a time it degenerates to a group of one, with no added wait.

A caller on an asyncio event loop (the servicers) uses ``submit_on_loop``: its answer comes as a future
of that loop, and a group's answers reach the loop in one wake-up, not one per caller (``wrap_future``'s
way: a callback and a write to the loop's self-pipe per caller, which at 64 SubmitJobs in flight cost the
event loop, whose interpreter lock every RPC shares, more than the group's commit function did).

A caller may give up at any time (its RPC cancelled: the loop's future is cancelled, which cancels the
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

import asyncio
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, Generic, TypeVar

import structlog

from scheduler_service.errors import Unavailable

In = TypeVar("In")
Out = TypeVar("Out")

log = structlog.get_logger("aryl.group_commit")

# Called once, on the worker thread, when it stops: with None after ``close``, else with what stopped it.
StopCallback = Callable[[BaseException | None], None]


class _LoopAnswer:
    """Where a ``submit_on_loop`` caller waits: its loop and that loop's future."""

    __slots__ = ("future", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
        self.loop = loop
        self.future = future


# A queued call: its item, the Future the worker answers, and the caller's loop future (None: a caller
# that waits on the Future itself).
_Entry = tuple[In, Future[Out], _LoopAnswer | None]


class GroupCommitter(Generic[In, Out]):
    def __init__(self, commit_group: Callable[[Sequence[In]], Sequence[Out | Exception]], *,
                 max_group: int = 256, name: str = "group-commit") -> None:
        self.name = name
        self._commit_group = commit_group
        self._max_group = max_group
        self._queue: queue.SimpleQueue[_Entry[In, Out] | None] = queue.SimpleQueue()  # None: stop
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
        self._put((item, future, None))
        return future

    def submit_on_loop(self, item: In) -> asyncio.Future[Out]:
        """``submit`` from a coroutine: the answer as a future of the running loop, set on that loop
        together with the rest of its group's answers. Cancelling it withdraws ``item`` unless its
        group is already committing (as cancelling ``submit``'s Future does). Raises ``Unavailable``
        once the worker has stopped."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Out] = loop.create_future()
        future: Future[Out] = Future()
        answer.add_done_callback(lambda done: future.cancel() if done.cancelled() else None)
        self._put((item, future, _LoopAnswer(loop, answer)))
        return answer

    def _put(self, entry: _Entry[In, Out]) -> None:
        with self._lock:
            if self._stopped:
                raise Unavailable(self._stopped_message())
            self._queue.put(entry)

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

    def _next_group(self) -> tuple[list[_Entry[In, Out]], bool]:
        """The next group (waiting for its first item) and whether ``close`` came after it."""
        group: list[_Entry[In, Out]] = []
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

    def _complete(self, group: list[_Entry[In, Out]]) -> None:
        # Callers that gave up already are dropped unapplied; the others can no longer give up, so
        # each result below has a Future to go to.
        live = [entry for entry in group if entry[1].set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = self._commit_group([item for item, _, _ in live])
        except Exception as exc:  # noqa: BLE001 - every caller of the group gets the failure
            _fail(live, exc)
            return
        if len(results) != len(live):
            raise ValueError(f"{self.name}: the commit function answered {len(results)} of {len(live)} items")
        for (_, future, _), result in zip(live, results, strict=True):
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)
        _relay(live)

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


def _fail(group: Sequence[_Entry[object, Out]], exc: BaseException) -> None:
    """Fail every caller of ``group`` still waiting (those that gave up or were answered are skipped)."""
    for _, future, _ in group:
        if future.done():
            continue
        try:
            future.set_exception(exc)
        except InvalidStateError:  # it gave up just now
            pass
    _relay(group)


def _relay(group: Sequence[_Entry[object, Out]]) -> None:
    """Hand the answered Futures of ``group``'s loop callers to their loops: one wake-up per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Future[Out], asyncio.Future[Any]]]] = {}
    for _, future, waiter in group:
        if waiter is not None and future.done():
            by_loop.setdefault(waiter.loop, []).append((future, waiter.future))
    for loop, answers in by_loop.items():
        try:
            loop.call_soon_threadsafe(_deliver, answers)
        except RuntimeError:  # the loop has closed: no one is left to answer
            pass


def _deliver(answers: Sequence[tuple[Future[Out], asyncio.Future[Any]]]) -> None:
    """On the callers' loop: each Future's outcome to its caller's future, unless that caller gave up."""
    for future, answer in answers:
        if answer.done() or future.cancelled():
            continue
        error = future.exception()
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(future.result())
