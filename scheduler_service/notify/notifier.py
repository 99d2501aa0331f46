"""``AsyncNotifier``: the service's ``Notifier`` -- what the use cases call after commit (events appended,
desired states changed or committed, a cycle requested), turned into wake-ups of the feeds and
signals the streams wait on.

Nouns: the *events*, *cycle* and *capacity* signals (a cycle trigger other than newly queued jobs bumps
*capacity* too); per-server signals; the three feeds it serves once the
service starts them (``serve_desired_states``, ``serve_event_log``, ``serve_serving_pool``).
Never: read the database itself or decide anything; every call returns at once, from any thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, TypeVar

from scheduler_service.notify.desired_states import DesiredStateFeed, S
from scheduler_service.notify.event_feed import DEFAULT_STREAM_BUFFER, E, EventFeed
from scheduler_service.notify.shared_read import SharedRead
from scheduler_service.notify.signals import Signal

T = TypeVar("T")


class AsyncNotifier:
    """The service's ``Notifier``: event-log and cycle-trigger signals, and the desired-state feed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.events = Signal(loop)
        self.cycle = Signal(loop)
        # Bumped with ``cycle`` by every trigger but ``jobs_queued``: something other than the queue changed.
        self.capacity = Signal(loop)
        self.desired_states: DesiredStateFeed[Any] | None = None  # set by serve_desired_states()
        self.event_log: EventFeed[Any] | None = None  # set by serve_event_log()
        self.serving_pool: SharedRead[Any] | None = None  # set by serve_serving_pool()
        self._servers: dict[str, Signal] = {}
        self._lock = threading.Lock()

    def serve_desired_states(
        self, load: Callable[[Sequence[str]], Mapping[str, S]], executor: Executor | None,
        generations: Callable[[Sequence[str]], Mapping[str, int]] | None = None,
    ) -> DesiredStateFeed[S]:
        """Start fanning desired state out to watchers; ``load`` and ``generations`` as in ``DesiredStateFeed``."""
        self.desired_states = DesiredStateFeed(self._loop, load, executor, generations=generations)
        return self.desired_states

    def serve_event_log(
        self, read_after: Callable[[int, int], Sequence[E]], last_id: Callable[[], int], executor: Executor | None,
        *, recheck_s: float, topics: Callable[[E], Iterable[Hashable]], capacity: int = 10_000,
        stream_buffer: int = DEFAULT_STREAM_BUFFER,
    ) -> EventFeed[E]:
        """Start fanning the event log out to watchers, woken by ``events_appended``; as in ``EventFeed``."""
        feed = EventFeed(self._loop, self.events, read_after=read_after, last_id=last_id, executor=executor,
                         recheck_s=recheck_s, topics=topics, capacity=capacity, stream_buffer=stream_buffer)
        self.event_log = feed
        return feed

    def serve_serving_pool(
        self, read: Callable[[], T], executor: Executor | None, *, recheck_s: float, key: Callable[[T], object]
    ) -> SharedRead[T]:
        """Share one read of the serving pool among its watchers, re-read after every event-log change
        (every server state change appends an event)."""
        shared = SharedRead(self._loop, self.events, read, executor=executor, recheck_s=recheck_s, key=key)
        self.serving_pool = shared
        return shared

    def server(self, server_id: str) -> Signal:
        with self._lock:
            signal = self._servers.get(server_id)
            if signal is None:
                signal = self._servers[server_id] = Signal(self._loop)
            return signal

    def events_appended(self) -> None:
        self.events.bump_threadsafe()

    def desired_state_changed(self, server_ids: Iterable[str]) -> None:
        ids = tuple(server_ids)
        if self.desired_states is not None:
            self.desired_states.changed_threadsafe(ids)
        self._bump_servers(ids)

    def _bump_servers(self, ids: Sequence[str]) -> None:
        with self._lock:
            signals = [s for s in map(self._servers.get, ids) if s is not None]
        if signals:

            def bump_all() -> None:
                for signal in signals:
                    signal.bump()

            try:  # one wake-up of the loop for the whole commit, not one per server
                self._loop.call_soon_threadsafe(bump_all)
            except RuntimeError:
                pass  # the loop is closed: the service is shutting down, nobody is waiting

    def desired_states_committed(self, states: Mapping[str, Any]) -> None:
        if self.desired_states is not None:
            self.desired_states.publish_threadsafe(states)
        self._bump_servers(tuple(states))

    def cycle_requested(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._capacity_changed)
        except RuntimeError:
            pass  # the loop is closed: the service is shutting down, nobody is waiting

    def _capacity_changed(self) -> None:
        self.capacity.bump()
        self.cycle.bump()

    def jobs_queued(self) -> None:
        self.cycle.bump_threadsafe()
