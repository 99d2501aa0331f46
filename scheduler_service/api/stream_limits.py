"""How many watch streams (``WatchEvents``, ``WatchServingPool``) may be open at once: per principal,
per role and in all.

Watches cost the scheduler little each (they wait on in-process wake-ups, ``scheduler_service.notify``,
and hold no thread while idle: the server is asyncio), but each holds memory, a file descriptor's
share and a place in every fan-out, so one caller must not take them all. Three limits:

- *per principal* (``server.max_watch_streams_per_principal``): an authenticated caller (``role:name``)
  counts as one, whatever addresses and connections it opens streams from. Without identities
  (``security.insecure``) there is no principal, and the caller is its *client*, the peer's host (the
  address without its port), limited by ``server.max_watch_streams_per_client``.
- *reserved* (``server.max_watch_streams_reserved``): the last places of the total are kept for routers
  and admins, so users (and callers without identities) filling every place they may take still leave
  a router's ``WatchServingPool`` and an admin's watch room.
- *total* (``server.max_watch_streams``): all watch streams together.

Agents' ``WatchDesiredState`` streams are not counted, so no user can take their place: there is one
per registered server (each agent may only watch its own server, ``auth.require_server``), and a
simulated fleet may hold 1,000s from one address.

Beyond a limit a new stream is refused with RESOURCE_EXHAUSTED and a message that names the limit hit
and the setting that raises it; clients back off and retry.

Never: block (admission is a counter check on the event loop), or count a stream twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from aryl_common.security import Principal

PER_CLIENT_SETTING = "server.max_watch_streams_per_client (ARYL_SERVER__MAX_WATCH_STREAMS_PER_CLIENT)"
PER_PRINCIPAL_SETTING = "server.max_watch_streams_per_principal (ARYL_SERVER__MAX_WATCH_STREAMS_PER_PRINCIPAL)"
RESERVED_SETTING = "server.max_watch_streams_reserved (ARYL_SERVER__MAX_WATCH_STREAMS_RESERVED)"
TOTAL_SETTING = "server.max_watch_streams (ARYL_SERVER__MAX_WATCH_STREAMS)"

# The roles that may take the reserved places: the router's serving-pool watch and the admins'.
RESERVE_ROLES: Final = frozenset({"router", "admin"})

# Defaults, as in ``scheduler_service.config.ServerConfig``.
DEFAULT_PER_PRINCIPAL = 64
DEFAULT_RESERVED = 64


class TooManyStreams(Exception):
    """A new watch stream would exceed a limit; ``str()`` names the limit and its setting."""


def client_of(peer: str) -> str:
    """The client a gRPC peer string counts for: its host without the port (``ipv4:10.0.0.7:51234`` ->
    ``ipv4:10.0.0.7``, ``ipv6:[::1]:4000`` -> ``ipv6:[::1]``); other forms (``unix:...``) as given."""
    kind, sep, rest = peer.partition(":")
    if not sep:
        return peer
    if kind == "ipv4":
        return f"{kind}:{rest.rpartition(':')[0] or rest}"
    if kind == "ipv6":
        host, bracket, _ = rest.rpartition("]")
        return f"{kind}:{host}]" if bracket else peer
    return peer


class StreamLimits:
    """Counts open watch streams per principal (or, without identities, per client) and in all."""

    def __init__(self, *, per_client: int, total: int, per_principal: int = DEFAULT_PER_PRINCIPAL,
                 reserved: int = DEFAULT_RESERVED) -> None:
        self.per_client = per_client
        self.per_principal = per_principal
        self.total = total
        self.reserved = min(reserved, total)
        self._by_caller: Counter[str] = Counter()
        self._open = 0

    @property
    def open(self) -> int:
        return self._open

    def held_by(self, who: Principal) -> int:
        """The streams ``who`` holds open now."""
        return self._by_caller[f"principal {who}"]

    @contextmanager
    def admit(self, peer: str, who: Principal | None = None) -> Iterator[None]:
        """Hold one stream's place for ``who`` (None: no identities, counted by ``peer``'s host) while the
        ``with`` block runs; TooManyStreams naming the limit hit when none is left."""
        if who is not None:
            key, cap, what, setting = f"principal {who}", self.per_principal, "the limit per principal", \
                PER_PRINCIPAL_SETTING
        else:
            key, cap, what, setting = f"client {client_of(peer)}", self.per_client, "the limit per client", \
                PER_CLIENT_SETTING
        if self._open >= self.total:
            raise TooManyStreams(
                f"the scheduler already serves {self._open} watch streams, its limit; close some or raise "
                f"{TOTAL_SETTING}"
            )
        may_reserve = who is not None and who.role in RESERVE_ROLES
        if not may_reserve and self._open >= self.total - self.reserved:
            raise TooManyStreams(
                f"the scheduler serves {self._open} watch streams and keeps its last {self.reserved} for routers and "
                f"admins; close some or raise {TOTAL_SETTING} (or lower {RESERVED_SETTING})"
            )
        if self._by_caller[key] >= cap:
            raise TooManyStreams(
                f"{key} already holds {self._by_caller[key]} watch streams, {what}; close some or raise {setting}"
            )
        self._open += 1
        self._by_caller[key] += 1
        try:
            yield
        finally:
            self._open -= 1
            self._by_caller[key] -= 1
            if self._by_caller[key] <= 0:
                del self._by_caller[key]
