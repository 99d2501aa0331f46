"""How many watch streams (``WatchEvents``, ``WatchServingPool``) may be open at once: per client and in all.

Watches cost the scheduler little each (they wait on in-process wake-ups, ``scheduler_service.notify``,
and hold no thread while idle: the server is asyncio), but each holds memory, a file descriptor's
share and a place in every fan-out, so one client must not open an unbounded number. A *client* is
the peer's host (the address without its port: every connection of one machine counts together),
and the user a request names where it names one (none of the watch requests does today).
Agents' ``WatchDesiredState`` streams are not counted: there is one per registered server, and a
simulated fleet may hold 1,000s from one address.

Beyond a limit a new stream is refused with RESOURCE_EXHAUSTED and a message that names the limit
and the setting that raises it; clients back off and retry.

Never: block (admission is a counter check on the event loop), or count a stream twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

PER_CLIENT_SETTING = "server.max_watch_streams_per_client (ARYL_SERVER__MAX_WATCH_STREAMS_PER_CLIENT)"
TOTAL_SETTING = "server.max_watch_streams (ARYL_SERVER__MAX_WATCH_STREAMS)"


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
    """Counts open watch streams per client (and per user, where named) and in all."""

    def __init__(self, *, per_client: int, total: int) -> None:
        self.per_client = per_client
        self.total = total
        self._by_client: Counter[str] = Counter()
        self._open = 0

    @property
    def open(self) -> int:
        return self._open

    @contextmanager
    def admit(self, peer: str, user: str = "") -> Iterator[None]:
        """Hold one stream's place while the ``with`` block runs; TooManyStreams when none is left."""
        keys = [f"client {client_of(peer)}"] + ([f"user {user}"] if user else [])
        if self._open >= self.total:
            raise TooManyStreams(
                f"the scheduler already serves {self._open} watch streams, its limit; close some or raise "
                f"{TOTAL_SETTING}"
            )
        for key in keys:
            if self._by_client[key] >= self.per_client:
                raise TooManyStreams(
                    f"{key} already holds {self._by_client[key]} watch streams, the limit per client; close some "
                    f"or raise {PER_CLIENT_SETTING}"
                )
        self._open += 1
        self._by_client.update(keys)
        try:
            yield
        finally:
            self._open -= 1
            self._by_client.subtract(keys)
            for key in keys:
                if self._by_client[key] <= 0:
                    del self._by_client[key]
