"""In-process wake-ups from committed changes to the asyncio streams that wait for them.

A ``Signal`` is a version counter: writers (any thread) bump it after commit; readers remember the
version they saw, re-read the database, and wait for a newer one. A missed wake-up only delays a
reader until its poll timeout; it never loses data, because the database is re-read every time.

A ``DesiredStateFeed`` fans the desired state of servers out to the agent streams that watch them:
after a commit, one batched read serves every touched server, however many streams wait. An
``EventFeed`` does the same for the event log (WatchEvents: one read of the new entries per change,
recent entries held in memory and filtered per stream), and a ``SharedRead`` for one answer that
many streams watch (WatchServingPool). Streams with nothing new cost no database work; each feed
re-reads at least every ``recheck_s`` while watched (writes by other processes), and nothing when not.

Never: hold domain state of its own beyond the last state read for a watched server, or decide
anything; the database stays the single source of truth.
"""

from __future__ import annotations

import asyncio
import bisect
import random
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Generic, Protocol, TypeVar

import structlog

from scheduler_service.errors import NotFound

log = structlog.get_logger("aryl.notify")


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


class Generational(Protocol):
    @property
    def generation(self) -> int: ...


S = TypeVar("S", bound=Generational)


@dataclass
class _Slot(Generic[S]):
    """What the feed knows of one watched server: its last read state, or why the read failed."""

    signal: Signal
    state: S | None = None
    error: BaseException | None = None
    watchers: int = 0


@dataclass
class DesiredStateFeed(Generic[S]):
    """Serves ``watch(server_id)`` streams from batched reads.

    ``load(server_ids)`` reads the desired state of each registered server among ``server_ids`` in
    one consistent read (a server missing from its answer is not registered). It runs on
    ``executor``. Reads are sequential: servers touched while one runs are read together by the
    next, so a burst of decisions costs a few reads, not one per server, and a stream never reads
    the database itself. A stream's periodic re-read (``refresh_s``) joins the next batch the same
    way. A state never replaces a newer generation of the same server."""

    loop: asyncio.AbstractEventLoop
    load: Callable[[Sequence[str]], Mapping[str, S]]
    executor: Executor | None = None
    _slots: dict[str, _Slot[S]] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    _reader: asyncio.Task[None] | None = None

    def changed_threadsafe(self, server_ids: Iterable[str]) -> None:
        """After commit, from any thread: these servers' desired state may have changed."""
        ids = tuple(server_ids)
        if ids:
            try:
                self.loop.call_soon_threadsafe(self._request, ids)
            except RuntimeError:
                pass  # the loop is closed: the service is shutting down, nobody is waiting

    def publish_threadsafe(self, states: Mapping[str, S]) -> None:
        """After commit, from any thread: these are the servers' desired states as committed (read in
        the committing transaction); watchers get them without another read."""
        if states:
            try:
                self.loop.call_soon_threadsafe(self._publish, dict(states))
            except RuntimeError:
                pass  # the loop is closed: the service is shutting down, nobody is waiting

    def _publish(self, states: Mapping[str, S]) -> None:
        for server_id, state in states.items():
            slot = self._slots.get(server_id)
            if slot is None:
                continue  # nobody watches it
            if slot.state is None or state.generation >= slot.state.generation:
                slot.state, slot.error = state, None
                slot.signal.bump()

    def _request(self, server_ids: Iterable[str]) -> None:
        self._dirty.update(s for s in server_ids if s in self._slots)  # unwatched servers cost nothing
        if self._dirty and (self._reader is None or self._reader.done()):
            self._reader = self.loop.create_task(self._read_dirty())

    async def _read_dirty(self) -> None:
        while self._dirty:
            batch = sorted(self._dirty)
            self._dirty.clear()
            error: Exception | None = None
            try:
                states = await self.loop.run_in_executor(self.executor, self.load, batch)
            except Exception as exc:  # noqa: BLE001 - handed to the streams that waited for this read
                log.warning("desired-state read failed", servers=len(batch), error=repr(exc))
                states, error = {}, exc
            for server_id in batch:
                slot = self._slots.get(server_id)
                if slot is None:
                    continue  # its last stream closed during the read
                state = states.get(server_id)
                if error is not None:
                    slot.error = error
                elif state is None:
                    slot.error = NotFound(f"server {server_id} is not registered")
                elif slot.state is None or state.generation >= slot.state.generation:
                    slot.state, slot.error = state, None
                slot.signal.bump()

    async def watch(self, server_id: str, *, refresh_s: float) -> AsyncIterator[S]:
        """Yield the server's desired state now and whenever its generation changes; re-read it
        every ``refresh_s`` or so (covers writes this process was not told about; each wait is drawn
        from 0.5..1.0 x ``refresh_s`` so 1,000s of streams do not re-read in step). Raises what the
        read raised, or ``NotFound`` for a server that is not registered."""
        slot = self._slots.get(server_id)
        if slot is None:
            slot = self._slots[server_id] = _Slot(Signal(self.loop))
        slot.watchers += 1
        try:
            seen = slot.signal.version
            self._request((server_id,))
            sent: int | None = None
            while True:
                await slot.signal.wait_newer(seen, timeout=refresh_s * random.uniform(0.5, 1.0))
                if slot.signal.version == seen:  # nothing read meanwhile: ask for a re-read
                    self._request((server_id,))
                    continue
                seen = slot.signal.version
                if slot.error is not None:
                    raise slot.error
                if slot.state is not None and slot.state.generation != sent:
                    sent = slot.state.generation
                    yield slot.state
        finally:
            slot.watchers -= 1
            if slot.watchers == 0:
                del self._slots[server_id]


class Identified(Protocol):
    @property
    def id(self) -> int: ...


E = TypeVar("E", bound=Identified)
T = TypeVar("T")


class SlowReader(Exception):
    """A stream fell more than its buffer behind the events meant for it; ``str()`` names the setting."""


STREAM_BUFFER_SETTING = "events.watch_stream_buffer (ARYL_EVENTS__WATCH_STREAM_BUFFER)"
DEFAULT_STREAM_BUFFER = 1000  # as in scheduler_service.config.EventsConfig
DISPATCH_SLICE = 64  # streams served between two turns of the loop: submissions' callbacks wait behind no more
PACE_WAIT_S = 1.0  # a slice whose sends take longer (a client that stopped reading) is not waited for
FANOUT_PAUSE = 1.0  # after each slice's sends, the loop is left to others this many times as long


class _Subscriber(Generic[E]):
    """One live stream of an ``EventFeed``: what the dispatcher queued for it, at most ``limit`` entries."""

    __slots__ = ("limit", "match", "on_overflow", "overflowed", "pending", "waiter")

    def __init__(self, match: Callable[[E], bool] | None, limit: int,
                 on_overflow: Callable[[str], None] | None) -> None:
        self.match = match
        self.limit = limit
        self.on_overflow = on_overflow
        self.pending: deque[E] = deque()
        self.overflowed = False
        self.waiter: asyncio.Future[None] | None = None

    def why(self) -> str:
        return (f"this stream fell more than {self.limit} events behind (its client reads too slowly, or more "
                f"streams take every event than the scheduler sends to while it serves its calls) and is ended "
                f"rather than slowing the scheduler: read faster, filter by job or server, resume from the last "
                f"event id seen (after_event_id), or raise {STREAM_BUFFER_SETTING}")

    def offer(self, rows: Sequence[E]) -> None:
        if self.overflowed:
            return
        match = self.match
        if match is None:  # every entry of its topic: no call per entry (2,000 unfiltered streams)
            self.pending.extend(rows)
        else:
            self.pending.extend(row for row in rows if match(row))
        if len(self.pending) > self.limit:
            self.overflowed = True
            self.pending.clear()
            if self.on_overflow is not None:
                self.on_overflow(self.why())
            self.wake()  # at once: it ends, whatever the pacing

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class EventFeed(Generic[E]):
    """Fans the event log's new entries out to every ``WatchEvents`` stream from one read per change.

    While at least one stream watches, one reader (a task on the loop) reads the entries after the
    newest it holds (``read_after(after_id, limit)``, on ``executor``) after each wake-up of
    ``wake`` (published after every commit that appends events: the committing thread only bumps a
    counter), and at least every ``recheck_s`` (the slow safety re-check: it covers writes this
    process was not told about, e.g. by another process on the same database; a missed wake-up
    delays streams by at most that long). Wake-ups during a read are coalesced into the next read.

    The reader is also the *dispatcher*: it queues each new entry on the live streams whose *topic*
    (e.g. "every event", or one job's) is among the entry's ``topics(entry)`` and whose ``match``
    takes it. A *pacer* (a task) then wakes the streams with entries queued, ``DISPATCH_SLICE`` at a
    time; each sends all it holds, and the next slice waits until those sends completed and as long
    again (``FANOUT_PAUSE``). So fan-out takes at most about half of the event loop (and of the
    interpreter lock its threads share) however many streams watch, and when there is more to send
    than that allows, the streams lag rather than the unary calls (SubmitJob): issue 37 measured
    2,000 unfiltered streams (4,000 sends a submit) at 40x SubmitJob's median unpaced. Each stream
    holds at most ``stream_buffer`` queued entries: a stream further behind (its client reads too
    slowly, or there is more to send than the pacer allows) is not waited for; it ends with
    ``SlowReader`` (and ``on_overflow`` is called at once, so a stream stuck in a send can be ended
    from outside).

    The last ``capacity`` or so entries stay in memory for streams that start: a stream whose
    position is older than what memory holds (a replay from ``after_event_id``) pages through the
    database by itself (``catch_up``) until it reaches memory, then goes live. With no stream the
    feed reads nothing and holds nothing; the first stream makes it read the log's newest id."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, wake: Signal, *, read_after: Callable[[int, int], Sequence[E]],
        last_id: Callable[[], int], executor: Executor | None, recheck_s: float,
        topics: Callable[[E], Iterable[Hashable]], capacity: int = 10_000, page: int = 500,
        stream_buffer: int = DEFAULT_STREAM_BUFFER,
    ) -> None:
        self._loop = loop
        self._wake = wake
        self._read_after = read_after
        self._last_id = last_id
        self._executor = executor
        self.recheck_s = recheck_s
        self._capacity = capacity
        self._page = page
        self._topics = topics
        self.stream_buffer = stream_buffer
        self._live: dict[Hashable, dict[_Subscriber[E], None]] = {}  # live streams by topic, in arrival order
        self._due: dict[_Subscriber[E], None] = {}  # waiting streams with entries to send, in order
        self._pacer: asyncio.Task[None] | None = None
        self._sending: set[_Subscriber[E]] = set()  # woken by the pacer, not yet back (their sends under way)
        self._sent: asyncio.Future[None] | None = None  # done once _sending is empty
        self.reads = 0  # database reads by the reader (tests and metrics: one per change, not per stream)
        self.dropped = 0  # streams ended for falling stream_buffer behind
        self._events: list[E] = []
        self._ids: list[int] = []
        self.floor = 0  # memory holds every entry with floor < id <= head
        self.head = 0
        self.watchers = 0
        self._reader: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._gap: tuple[int, float] | None = None  # the first missing id after head, since when (loop time)

    async def watch(
        self, after: int | None, *, topic: Hashable, match: Callable[[E], bool] | None,
        catch_up: Callable[[int, int, int], Awaitable[Sequence[E]]],
        on_overflow: Callable[[str], None] | None = None,
    ) -> AsyncIterator[E]:
        """``watch_batches``, one entry at a time."""
        async for rows in self.watch_batches(after, topic=topic, match=match, catch_up=catch_up,
                                             on_overflow=on_overflow):
            for row in rows:
                yield row

    async def watch_batches(
        self, after: int | None, *, topic: Hashable, match: Callable[[E], bool] | None,
        catch_up: Callable[[int, int, int], Awaitable[Sequence[E]]],
        on_overflow: Callable[[str], None] | None = None,
    ) -> AsyncIterator[Sequence[E]]:
        """Yield the entries with id > ``after`` (None: from now on) that ``match``, in id order, then
        new ones as they are read: each batch is everything there was to send when the stream woke
        (a page of the past, or what the dispatcher queued meanwhile), so a stream that fell behind
        catches up with one wake-up, not one per entry. Every entry that ``match``es must have
        ``topic`` among its ``topics``; ``match`` None takes every entry that has.
        ``catch_up(after_id, upto_id, limit)`` reads up to ``limit`` matching entries with
        after_id < id <= upto_id from the database, oldest first. Raises ``SlowReader`` once the
        stream falls more than ``stream_buffer`` entries behind (``on_overflow(why)`` called first,
        from the dispatcher)."""
        self.watchers += 1
        subscriber: _Subscriber[E] = _Subscriber(match, self.stream_buffer, on_overflow)
        try:
            await self._started()
            position = self.head if after is None else after  # every entry <= position was considered
            while True:  # the past, from the database and from memory, until nothing is left before head
                if position < self.floor:
                    upto = self.floor
                    rows = await catch_up(position, upto, self._page)
                    if rows:
                        yield rows
                    position = rows[-1].id if len(rows) >= self._page else upto
                    continue
                head = self.head
                start = bisect.bisect_right(self._ids, position)
                takes = match if match is not None else (lambda e: topic in self._topics(e))
                fresh = [e for e in self._events[start:] if e.id <= head and takes(e)]
                position = max(position, head)
                if not fresh:
                    break
                yield fresh
            # Live from here: no wait since memory was looked at, so the dispatcher queues every later entry.
            self._live.setdefault(topic, {})[subscriber] = None
            pending = subscriber.pending
            woken = False
            while True:
                if subscriber.overflowed:
                    raise SlowReader(subscriber.why())
                if pending and woken:  # the pacer's turn for this stream: send what it holds
                    woken = False
                    batch = [row for row in pending if row.id > position]  # a replayed entry may have been queued too
                    pending.clear()
                    if batch:
                        position = batch[-1].id
                        yield batch
                    self._back(subscriber)
                    continue
                self._back(subscriber)
                if pending:  # queued while it sent: wait for its next turn, not ahead of the others
                    self._mark_ready(subscriber)
                subscriber.waiter = self._loop.create_future()
                try:
                    await subscriber.waiter
                finally:
                    subscriber.waiter = None
                woken = True
        finally:
            self._due.pop(subscriber, None)
            self._back(subscriber)
            self.watchers -= 1
            live = self._live.get(topic)
            if live is not None:
                live.pop(subscriber, None)
                if not live:
                    del self._live[topic]

    async def _started(self) -> None:
        """Once the reader runs and knows the log's newest id (raises what that read raised)."""
        if self._reader is None or self._reader.done():
            self._ready = self._loop.create_future()
            self._reader = self._loop.create_task(self._run(self._ready))
        assert self._ready is not None
        await asyncio.shield(self._ready)

    async def _run(self, ready: asyncio.Future[None]) -> None:
        try:
            newest = await self._loop.run_in_executor(self._executor, self._last_id)
        except Exception as exc:  # noqa: BLE001 - handed to the streams that wait for the start
            ready.set_exception(exc)
            ready.exception()  # retrieved: a start nobody waits for any more must not be logged as lost
            return
        self._events, self._ids = [], []
        self.floor = self.head = newest
        ready.set_result(None)
        retry_s = min(1.0, self.recheck_s)
        try:
            while self.watchers:
                seen = self._wake.version
                try:
                    held = await self._read_new()
                    wait = GAP_RECHECK_S if held else self.recheck_s
                except Exception as exc:  # noqa: BLE001 - streams wait; the next wake-up or retry reads again
                    log.warning("event log read failed; retrying", error=repr(exc), retry_s=retry_s)
                    wait = retry_s
                await self._wake.wait_newer(seen, timeout=wait)
        finally:
            self._events, self._ids = [], []  # nobody watches: hold nothing

    async def _read_new(self) -> bool:
        """Read what is new and dispatch it; True when held at a gap in the ids (read again soon)."""
        while True:
            rows = await self._loop.run_in_executor(self._executor, self._read_after, self.head, self._page)
            self.reads += 1
            rows, held = self._up_to_a_gap(rows)
            if not rows:
                return held
            self._events.extend(rows)
            self._ids.extend(row.id for row in rows)
            self.head = rows[-1].id
            if len(self._events) > 2 * self._capacity:  # trimmed in halves: amortised, and bisect stays valid
                drop = len(self._events) - self._capacity
                self.floor = self._ids[drop - 1]
                del self._events[:drop], self._ids[:drop]
            await self._dispatch(rows)
            if held or len(rows) < self._page:
                return held

    async def _dispatch(self, rows: Sequence[E]) -> None:
        """Queue ``rows`` on every live stream of their topics, a slice of streams per turn of the loop."""
        by_topic: dict[Hashable, list[E]] = {}
        for row in rows:
            for topic in self._topics(row):
                if topic in self._live:
                    by_topic.setdefault(topic, []).append(row)
        for topic, topic_rows in by_topic.items():
            for subscriber in list(self._live.get(topic, ())):
                was_overflowed = subscriber.overflowed
                subscriber.offer(topic_rows)
                if subscriber.overflowed and not was_overflowed:
                    self.dropped += 1
                elif subscriber.pending and subscriber.waiter is not None:
                    self._mark_ready(subscriber)

    def _mark_ready(self, subscriber: _Subscriber[E]) -> None:
        self._due[subscriber] = None
        if self._pacer is None or self._pacer.done():
            self._pacer = self._loop.create_task(self._pace())

    def _back(self, subscriber: _Subscriber[E]) -> None:
        """``subscriber`` is done with the turn the pacer gave it (sent, or had nothing, or ended)."""
        if subscriber in self._sending:
            self._sending.discard(subscriber)
            if not self._sending and self._sent is not None and not self._sent.done():
                self._sent.set_result(None)

    async def _pace(self) -> None:
        """Wake the streams with entries to send, ``DISPATCH_SLICE`` per turn of the loop, then leave the
        loop to everything else for ``FANOUT_PAUSE`` times as long as their sends took: fan-out takes at
        most about half of the loop, however many streams wait, and streams lag rather than submits."""
        while self._due:
            started = self._loop.time()
            self._sent = self._loop.create_future()
            for subscriber in list(islice(self._due, DISPATCH_SLICE)):
                del self._due[subscriber]
                self._sending.add(subscriber)
                subscriber.wake()
            if self._sending:  # until every woken stream's sends completed (gRPC finishes them later)
                await asyncio.wait({self._sent}, timeout=PACE_WAIT_S)
            self._sending.clear()
            await asyncio.sleep((self._loop.time() - started) * FANOUT_PAUSE)

    def _up_to_a_gap(self, rows: Sequence[E]) -> tuple[Sequence[E], bool]:
        """``rows`` up to the first id missing after ``head``, and whether any were held back.

        Ids are taken when an entry is written and become visible when its transaction commits, so
        id 11 may commit after id 12: moving past 11 would lose it for every stream. The entries after
        a missing id are held until it shows up, or for at most GAP_WAIT_S (a rolled-back write leaves
        a gap for good; no transaction outlives database.transaction_timeout_ms, but waiting that long
        on every rollback would stall streams)."""
        expected = self.head + 1
        for count, row in enumerate(rows):
            if row.id != expected + count:
                break
        else:
            self._gap = None
            return rows, False
        missing = expected + count
        now = self._loop.time()
        if self._gap is None or self._gap[0] != missing:
            self._gap = (missing, now)
        if now - self._gap[1] < GAP_WAIT_S:
            return rows[:count], True
        log.info("event ids skipped: their writes were rolled back or are still uncommitted", first_missing=missing)
        self._gap = None
        return rows, False


# An event feed holds entries after a missing id (an uncommitted or rolled-back write) for at most
# this long, reading again every GAP_RECHECK_S meanwhile.
GAP_WAIT_S = 2.0
GAP_RECHECK_S = 0.05


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


class AsyncNotifier:
    """The service's ``Notifier``: event-log and cycle-trigger signals, and the desired-state feed."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.events = Signal(loop)
        self.cycle = Signal(loop)
        self.desired_states: DesiredStateFeed[Any] | None = None  # set by serve_desired_states()
        self.event_log: EventFeed[Any] | None = None  # set by serve_event_log()
        self.serving_pool: SharedRead[Any] | None = None  # set by serve_serving_pool()
        self._servers: dict[str, Signal] = {}
        self._lock = threading.Lock()

    def serve_desired_states(
        self, load: Callable[[Sequence[str]], Mapping[str, S]], executor: Executor | None
    ) -> DesiredStateFeed[S]:
        """Start fanning desired state out to watchers; ``load`` as in ``DesiredStateFeed``."""
        self.desired_states = DesiredStateFeed(self._loop, load, executor)
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
        self.cycle.bump_threadsafe()
