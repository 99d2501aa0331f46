"""The serving pool as the router sees it: backends, their routing state and health, and the choice
of the backend for the next request.

Nouns:
- A *backend* is one inference server (``server_id``, base URL ``endpoint``) with a routing state:
  ``SERVING`` (routable) or ``DRAINING`` (no new requests; its in-flight ones finish, then it is
  reported drained). A server missing from the latest pool update is *gone*: it is no longer a
  backend and gets nothing (requests already in flight there still finish).
- *Health*: passive -- ``unhealthy_after_failures`` consecutive transport failures eject the backend
  for ``unhealthy_cooldown_s``, after which it is tried again (one more failure ejects it again, a
  success clears the count); active -- the last periodic ``GET <endpoint><health_path>`` failed.
  Either one makes a SERVING backend unroutable; neither changes its pool state.
- *Least outstanding requests*: the next request goes to the routable backend with the fewest
  requests in flight through this router; ties go round robin in ``server_id`` order (the first id
  after the one picked last), which is deterministic.

Everything here runs on one asyncio event loop and never awaits between choosing a backend and
counting the request against it, so a pool update cannot slip in between: the invariant "a request
is only ever dispatched to a backend that is SERVING at that moment" holds by construction.
This module does no I/O; the proxy and the pool sources do.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol


class RoutingState(enum.Enum):
    SERVING = "SERVING"
    DRAINING = "DRAINING"


@dataclass(frozen=True)
class PoolMember:
    """One server in a pool update."""

    server_id: str
    endpoint: str
    state: RoutingState


@dataclass(frozen=True)
class PoolUpdate:
    """The full set of routable servers (every update replaces the previous one)."""

    members: tuple[PoolMember, ...]
    version: int = 0


class PoolSource(Protocol):
    """Where the pool comes from (the scheduler's watch, or a static list).

    Contract: ``run`` calls ``apply`` with the full current set first and again after every change,
    on the router's event loop, and runs until cancelled. Losing the upstream must not clear the pool
    (the router keeps routing to the last known set); reconnecting is the source's job.
    """

    async def run(self, apply: Callable[[PoolUpdate], None]) -> None: ...


class StaticPoolSource:
    """A fixed list of base URLs, all SERVING, each its own ``server_id``."""

    def __init__(self, endpoints: Iterable[str]) -> None:
        self.update = PoolUpdate(tuple(PoolMember(url, url, RoutingState.SERVING) for url in endpoints), version=1)

    async def run(self, apply: Callable[[PoolUpdate], None]) -> None:
        apply(self.update)
        await asyncio.Event().wait()  # nothing ever changes


@dataclass
class Backend:
    server_id: str
    endpoint: str
    state: RoutingState
    in_flight: int = 0
    requests: int = 0                  # dispatched to it through this router
    failures: int = 0                  # transport failures (connect, reset, timeout)
    consecutive_failures: int = 0
    ejected_until: float | None = None  # passive health: no traffic before this (monotonic s)
    active_ok: bool = True              # active health: the last health check passed (optimistic start)
    drained_reported: bool = False
    reporting_drained: bool = False     # a ReportDrained call is in flight
    left_pool: bool = False
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def url(self) -> str:
        return self.endpoint.rstrip("/")

    def healthy(self, now: float) -> bool:
        return self.active_ok and (self.ejected_until is None or now >= self.ejected_until)

    def routable(self, now: float) -> bool:
        return self.state is RoutingState.SERVING and self.healthy(now)


class BackendPool:
    """The current backends; the proxy's only view of the pool.

    ``on_change(backend, previous_state)`` hooks are called after an update for every backend that
    appeared (``previous_state`` None), changed state, or disappeared (``backend.state`` unchanged,
    ``gone`` True in the call) -- the router starts drains and health checks from them.
    """

    def __init__(self, *, unhealthy_after_failures: int, unhealthy_cooldown_s: float) -> None:
        self.unhealthy_after_failures = unhealthy_after_failures
        self.unhealthy_cooldown_s = unhealthy_cooldown_s
        self.backends: dict[str, Backend] = {}
        self.version = 0
        self.updates_applied = 0
        self.serving = 0  # backends SERVING after the last update (the serving pool's size)
        self._last_picked: str | None = None
        self.listeners: list[Callable[[Backend, RoutingState | None, bool], None]] = []
        self._changed = asyncio.Condition()

    # -- updates ---------------------------------------------------------------------------------

    def apply(self, update: PoolUpdate) -> None:
        """Replace the pool with ``update`` (synchronously: no request can be routed half-way)."""
        seen: set[str] = set()
        changes: list[tuple[Backend, RoutingState | None, bool]] = []
        for member in update.members:
            seen.add(member.server_id)
            backend = self.backends.get(member.server_id)
            if backend is not None and backend.endpoint != member.endpoint:
                # A new address is a new backend: forget the old one's health and counters.
                backend.left_pool = True
                changes.append((self.backends.pop(member.server_id), backend.state, True))
                backend = None
            if backend is None:
                backend = Backend(member.server_id, member.endpoint, member.state)
                self.backends[member.server_id] = backend
                changes.append((backend, None, False))
            elif backend.state is not member.state:
                was, backend.state = backend.state, member.state
                if member.state is RoutingState.SERVING:
                    backend.drained_reported = False
                changes.append((backend, was, False))
        for server_id in [s for s in self.backends if s not in seen]:
            backend = self.backends.pop(server_id)
            backend.left_pool = True
            changes.append((backend, backend.state, True))
        self.version = update.version
        self.updates_applied += 1
        self.serving = sum(1 for b in self.backends.values() if b.state is RoutingState.SERVING)
        for backend, previous, gone in changes:
            for listener in self.listeners:
                listener(backend, previous, gone)
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_for(self, predicate: Callable[[BackendPool], bool]) -> None:
        """Return once ``predicate(self)`` holds (checked after every update)."""
        async with self._changed:
            await self._changed.wait_for(lambda: predicate(self))

    # -- routing ---------------------------------------------------------------------------------

    def pick(self, now: float, exclude: AbstractSet[str] = frozenset()) -> Backend | None:
        """The routable backend with the fewest requests in flight (ties: round robin by id)."""
        candidates = [b for b in self.backends.values() if b.server_id not in exclude and b.routable(now)]
        if not candidates:
            return None
        fewest = min(b.in_flight for b in candidates)
        tied = sorted((b for b in candidates if b.in_flight == fewest), key=lambda b: b.server_id)
        after = [b for b in tied if self._last_picked is not None and b.server_id > self._last_picked]
        chosen = after[0] if after else tied[0]
        self._last_picked = chosen.server_id
        return chosen

    def begin(self, backend: Backend) -> None:
        """Count a request against ``backend`` (call right after ``pick``, with no await between)."""
        assert backend.state is RoutingState.SERVING, f"dispatch to {backend.state.value} {backend.server_id}"
        backend.in_flight += 1
        backend.requests += 1
        backend.idle.clear()

    def end(self, backend: Backend) -> None:
        backend.in_flight -= 1
        if backend.in_flight == 0:
            backend.idle.set()

    # -- health ----------------------------------------------------------------------------------

    def record_success(self, backend: Backend) -> None:
        backend.consecutive_failures = 0
        backend.ejected_until = None

    def record_failure(self, backend: Backend, now: float) -> None:
        backend.failures += 1
        backend.consecutive_failures += 1
        if backend.consecutive_failures >= self.unhealthy_after_failures:
            backend.ejected_until = now + self.unhealthy_cooldown_s

    def why_none_routable(self, now: float) -> str:
        """Why ``pick`` found nothing, for the 503 body."""
        if not self.backends:
            return "the serving pool is empty"
        counts: dict[str, int] = {}
        for b in self.backends.values():
            reason = (
                "draining" if b.state is RoutingState.DRAINING
                else "failing health checks" if not b.active_ok
                else "ejected after failures" if not b.healthy(now)
                else "routable"
            )
            counts[reason] = counts.get(reason, 0) + 1
        return "no routable backend: " + ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))

