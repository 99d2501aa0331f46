"""An open ``WatchEvents`` call as an iterator of events (:class:`EventStream`), which a user may drop, break
out of, or cancel; its failures arrive as :class:`arylctl.errors.ArylError`.

What this module must never do: reopen a stream on its own (``arylctl events --follow`` does, knowing where
to resume).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from queue import Empty, SimpleQueue
from types import TracebackType
from typing import Any, Final

import grpc

from arylctl.errors import aryl_error
from protos.aryl.v1 import types_pb2

_END: Final = object()  # queue marker: the stream is over (after its events or its error)


def _pump(call: Any, events: SimpleQueue[object]) -> None:
    """Move a call's events into a queue. Holds no reference to the EventStream, so that a
    stream dropped by its user is garbage-collected and its ``__del__`` cancels the call."""
    try:
        for event in call:
            events.put(event)
    except grpc.RpcError as exc:
        events.put(exc)
    finally:
        events.put(_END)


class EventStream(Iterator[types_pb2.Event]):
    """Events from ``WatchEvents``, in order; iterate it, and cancel it when done.

    Without ``idle_timeout`` the stream runs until the server ends it or it is cancelled. With
    ``idle_timeout`` (seconds) iteration also stops once no event has arrived for that long — the
    way to say "replay the log and stop when caught up", since the log has no end marker.
    A stream cancelled by this side (``cancel()``, ``with``, closing the client) ends iteration
    quietly; any other failure raises :class:`ArylError`.
    """

    def __init__(self, call: Any, *, idle_timeout: float | None, client_closed: threading.Event) -> None:
        self._call = call
        self._idle_timeout = idle_timeout
        self._client_closed = client_closed
        self._cancelled = False
        self._done = False
        # A reader thread hands events over through a queue so that the wait for the next event
        # can time out (grpc's own iterator cannot) and Ctrl-C interrupts the wait.
        self._events: SimpleQueue[object] = SimpleQueue()
        threading.Thread(target=_pump, args=(call, self._events), name="aryl-watch-events", daemon=True).start()

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> types_pb2.Event:
        if self._done:
            raise StopIteration
        try:
            item = self._events.get(timeout=self._idle_timeout)
        except Empty:
            self.cancel()
            raise StopIteration from None
        if isinstance(item, types_pb2.Event):
            return item
        self._done = True
        ended_here = self._cancelled or self._client_closed.is_set()
        if isinstance(item, grpc.RpcError) and not ended_here:
            raise aryl_error(item) from item
        raise StopIteration

    def cancel(self) -> None:
        """Stop the stream; iteration then ends. Idempotent, callable from any thread."""
        self._cancelled = True
        self._done = True
        self._call.cancel()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.cancel()

    def __del__(self) -> None:
        # A loop that breaks out and drops the stream must not leave the server streaming forever.
        call = getattr(self, "_call", None)
        if call is not None:
            try:
                call.cancel()
            except Exception:  # noqa: BLE001 - interpreter shutdown; nothing left to clean up
                pass
