"""``EventFeed``: the event log's new entries fanned out to every ``WatchEvents`` stream from one read per
change, paced so that fan-out never starves the unary calls.

Nouns: a *topic* is what a stream watches (every event, one job's, one server's); a *subscriber* is
one live stream with the entries queued for it (at most its *stream buffer*: a stream further behind
ends with ``SlowReader``); the *dispatcher* queues new entries on the streams of their topics, and the
*pacer* wakes those streams a slice at a time; a *gap* is an id not yet visible after the newest held.
Never: lose an entry at a gap that may still commit, hold entries while no stream watches, or decide
anything; the database stays the single source of truth.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterable, Sequence
from concurrent.futures import Executor
from itertools import islice
from typing import Generic, Protocol, TypeVar

import structlog

from scheduler_service.notify.signals import Signal

log = structlog.get_logger("aryl.notify")


class Identified(Protocol):
    @property
    def id(self) -> int: ...


E = TypeVar("E", bound=Identified)


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
        """``watch_chunks``, one entry at a time."""
        async for rows in self.watch_chunks(after, topic=topic, match=match, catch_up=catch_up,
                                            on_overflow=on_overflow):
            for row in rows:
                yield row

    async def watch_chunks(
        self, after: int | None, *, topic: Hashable, match: Callable[[E], bool] | None,
        catch_up: Callable[[int, int, int], Awaitable[Sequence[E]]],
        on_overflow: Callable[[str], None] | None = None,
    ) -> AsyncIterator[Sequence[E]]:
        """Yield the entries with id > ``after`` (None: from now on) that ``match``, in id order, then
        new ones as they are read: each chunk is everything there was to send when the stream woke
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
                    chunk = [row for row in pending if row.id > position]  # a replayed entry may have been queued too
                    pending.clear()
                    if chunk:
                        position = chunk[-1].id
                        yield chunk
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
