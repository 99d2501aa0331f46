"""``DesiredStateFeed``: the desired state of servers fanned out to the agent streams that watch them.

After a commit, one read serves every touched server together, however many streams wait; a server's
*slot* holds its last read state (or why the read failed) while any stream watches it.
Never: hold a state for a server nobody watches, replace a newer generation by an older one, or
decide anything; the database stays the single source of truth.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import structlog

from scheduler_service.errors import NotFound, Unavailable
from scheduler_service.notify.signals import Signal

log = structlog.get_logger("aryl.notify")


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
    """Serves ``watch(server_id)`` streams from shared reads (one read for many servers).

    ``load(server_ids)`` reads the desired state of each registered server among ``server_ids`` in
    one consistent read (a server missing from its answer is not registered). It runs on
    ``executor``. Reads are sequential: servers touched while one runs are read together by the
    next, so a burst of decisions costs a few reads, not one per server, and a stream never reads
    the database itself. A stream's periodic re-read (``refresh_s``) joins the next read the same
    way. A state never replaces a newer generation of the same server.

    A read the database refused for now (``Unavailable``: a statement or lock timed out) is retried after
    ``retry_base_s``, doubling up to ``retry_max_s``, ``retries`` times in a row before the streams that wait
    get the error: meanwhile they keep the state they have (the agent keeps what it runs), so a few slow
    reads do not end every stream waiting on them (1,000s, each reconnecting at once). Any other failure, and
    ``Unavailable`` once the retries are spent, goes to those streams at once, as before."""

    loop: asyncio.AbstractEventLoop
    load: Callable[[Sequence[str]], Mapping[str, S]]
    executor: Executor | None = None
    retries: int = 5
    retry_base_s: float = 0.5
    retry_max_s: float = 8.0
    # ``generations(server_ids)``: each registered server's desired generation alone, one narrow read (None: none).
    # A periodic re-read (``watch``'s ``refresh_s``, ``reread_watched``) reads these first, then the whole state of
    # only the servers whose generation moved: a stream yields a state only at a new generation, so reading the
    # others' whole states was work for nothing (at 1,000 agents, 12% of the scheduler's interpreter, 2026-12-01).
    generations: Callable[[Sequence[str]], Mapping[str, int]] | None = None
    # Re-checks are gathered this long and read together (a change read starts at once and takes them along): 1,000
    # streams re-checking every 15-30 s each then cost one narrow read a second, not 40-70 transactions.
    recheck_gather_s: float = 1.0
    _slots: dict[str, _Slot[S]] = field(default_factory=dict)
    _dirty: set[str] = field(default_factory=set)
    _recheck: set[str] = field(default_factory=set)  # watched servers to re-read if their generation moved
    _gathering: asyncio.TimerHandle | None = None
    _reader: asyncio.Task[None] | None = None
    _failures: int = 0  # reads refused as Unavailable in a row

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

    def noticed(self, generations: Mapping[str, int]) -> None:
        """On the feed's loop: these servers' desired state reached these generations (the change feed,
        ``store.change_feed``); a watched one held at an older generation is read again, the others cost nothing."""
        behind = [server_id for server_id, generation in generations.items()
                  if (slot := self._slots.get(server_id)) is not None
                  and (slot.state is None or slot.state.generation < generation)]
        if behind:
            self._request(behind)

    def reread_watched(self) -> None:
        """On the feed's loop: read every watched server's state again (changes may have gone unannounced); with
        ``generations``, only those whose generation moved."""
        self._request(list(self._slots), recheck=True)

    def _publish(self, states: Mapping[str, S]) -> None:
        for server_id, state in states.items():
            slot = self._slots.get(server_id)
            if slot is None:
                continue  # nobody watches it
            if slot.state is None or state.generation >= slot.state.generation:
                slot.state, slot.error = state, None
                slot.signal.bump()

    def _request(self, server_ids: Iterable[str], *, recheck: bool = False) -> None:
        """Read these servers' states (``recheck``: those whose generation moved, where ``generations`` is set)."""
        if recheck and self.generations is not None:
            self._recheck.update(s for s in server_ids if s in self._slots)  # unwatched servers cost nothing
            if self._recheck and self._gathering is None:
                self._gathering = self.loop.call_later(self.recheck_gather_s, self._gathered)
            return
        self._dirty.update(s for s in server_ids if s in self._slots)
        self._read_soon()

    def _gathered(self) -> None:
        self._gathering = None
        self._read_soon()

    def _read_soon(self) -> None:
        if (self._dirty or self._recheck) and (self._reader is None or self._reader.done()):
            self._reader = self.loop.create_task(self._read_dirty())

    async def _moved(self, servers: list[str]) -> list[str]:
        """Of ``servers`` (to recheck), those whose whole state must be read: not held yet, failed before, or at
        another generation now; all of them when the generations cannot be read (the whole read then says why)."""
        assert self.generations is not None
        try:
            now = await self.loop.run_in_executor(self.executor, self.generations, servers)
        except Exception:  # noqa: BLE001 - the whole read retries, or hands the failure to the streams
            return servers
        return [s for s in servers if (slot := self._slots.get(s)) is not None
                and (slot.state is None or slot.error is not None or now.get(s) != slot.state.generation)]

    async def _read_dirty(self) -> None:
        while self._dirty or self._recheck:
            if self._recheck:
                recheck = sorted(self._recheck - self._dirty)
                self._recheck.clear()
                if recheck:  # those also to be read whole for a change are read whole anyway
                    self._dirty.update(await self._moved(recheck))
                if not self._dirty:
                    continue
            servers = sorted(self._dirty)
            self._dirty.clear()
            error: Exception | None = None
            try:
                states = await self.loop.run_in_executor(self.executor, self.load, servers)
            except Unavailable as exc:
                self._failures += 1
                if self._failures <= self.retries:
                    delay = min(self.retry_base_s * 2 ** (self._failures - 1), self.retry_max_s)
                    log.warning("desired-state read refused for now; retrying", servers=len(servers),
                                attempt=self._failures, retry_in_s=delay, error=repr(exc))
                    self.loop.call_later(delay, self._request, servers)
                    continue  # its streams keep their last state meanwhile
                log.warning("desired-state read failed", servers=len(servers), error=repr(exc))
                states, error = {}, exc
            except Exception as exc:  # noqa: BLE001 - handed to the streams that waited for this read
                log.warning("desired-state read failed", servers=len(servers), error=repr(exc))
                states, error = {}, exc
            else:
                self._failures = 0
            for server_id in servers:
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

    async def watch(self, server_id: str, *, refresh_s: float) -> AsyncGenerator[S, None]:
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
                    self._request((server_id,), recheck=True)
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
