"""Which replica's desired-state streams' process an agent watches (issue 35 item 2: the leader alone decides;
any replica may serve the streams).

Nouns:
- A *replica* is one scheduler on the database, leader or standby, in the registry (``store.replicas``): each
  *beats* every ``ha.renew_s`` on its lease thread (``Replicas.beat``), naming where its desired-state streams'
  own process serves (``server.desired_state_port``). A replica whose last beat is older than
  ``ha.replica_stale_s`` (by the database's clock) is not *live*.
- The *choice* (``push_address_for``), made by the leader when an agent registers: the live *standbys* with a
  push process, each server going to one by rendezvous hashing of its id (``choose_push_address``); none
  (no live standby) leaves the agent on the leader's own process, which its registration names anyway.

Why standbys, and why rendezvous hashing (``docs/ha.md``): the leader's host runs the cycles, the group commits
and every agent's status reports, the very work a push must not queue behind; a standby's host does nothing
else. Hashing the server id gives the same replica at every registration of an agent (its stream does not move
when it registers again) and spreads the servers evenly; when a standby joins or drops out, only the servers
it gains or held move.

The view is kept in memory, refreshed at each beat, so a registration reads no table. Never: decide anything
of the cluster, or write anything but this replica's own row.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import threading
from collections.abc import Callable, Iterable

import structlog
from sqlalchemy.orm import Session

from scheduler_service.core.clock import Clock
from scheduler_service.errors import Aborted, Unavailable
from scheduler_service.store import replicas as store
from scheduler_service.store.replicas import ReplicaView  # the value it hands out (api converts it)
from scheduler_service.store.transactions import Transactions

log = structlog.get_logger("aryl.scheduler")

__all__ = ["ReplicaView", "Replicas", "choose_push_address"]


def _weight(server_id: str, address: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{server_id}\0{address}".encode()).digest()[:8], "big")


def choose_push_address(server_id: str, replicas: Iterable[ReplicaView], *, leader: str) -> str | None:
    """The push process ``server_id``'s agent should watch: among ``replicas`` other than ``leader`` with a push
    process, the one of highest rendezvous weight (the same for the same replicas, whatever their order);
    None when there is none (the agent watches the leader's own)."""
    standbys = [r for r in replicas if r.address != leader and r.push_address]
    if not standbys:
        return None
    return max(standbys, key=lambda r: (_weight(server_id, r.address), r.address)).push_address


class Replicas:
    """This replica's row in the registry and its view of the others. ``me``: its advertised address;
    ``push_address()``: where its push process serves now ('' while none does); ``db``: transactions on the
    lease's own connections (unfenced: a standby beats too)."""

    def __init__(self, db: Transactions, clock: Clock, *, me: str, push_address: Callable[[], str],
                 stale_s: float) -> None:
        self._db = db
        self._clock = clock
        self.me = me
        self._push_address = push_address
        self.stale_s = stale_s
        self._lock = threading.Lock()
        self._listed: tuple[ReplicaView, ...] = ()  # every row at the last beat, stale ones too
        self._live: tuple[ReplicaView, ...] = ()
        self._beat_at = 0.0  # monotonic, when they were read

    def beat(self) -> None:
        """Write this replica's heartbeat and read every replica's row (one transaction)."""
        push = self._push_address()

        def work(session: Session) -> list[ReplicaView]:
            store.beat(session, address=self.me, push_address=push)
            return store.listed(session)

        try:
            listed = self._db.write(work)
        except (Unavailable, Aborted) as exc:
            log.warning("could not write this replica's heartbeat; retrying at the next round", reason=str(exc))
            return
        live = tuple(r for r in listed if r.age_s <= self.stale_s)
        with self._lock:
            before = {r.address for r in self._live}
            self._listed, self._live, self._beat_at = tuple(listed), live, self._clock.monotonic()
        after = {r.address for r in live}
        if before and before != after:
            log.info("the live scheduler replicas changed", joined=sorted(after - before), left=sorted(before - after))

    def live(self) -> tuple[ReplicaView, ...]:
        """The live replicas at the last beat (this one included once it beat)."""
        with self._lock:
            return self._live

    def push_address_for(self, server_id: str) -> str | None:
        """The push process ``server_id``'s agent should watch, this replica leading (``choose_push_address``)."""
        return choose_push_address(server_id, self.live(), leader=self.me)

    def known(self) -> list[tuple[ReplicaView, bool]]:
        """Every replica in the registry at the last beat, stale ones too, each with whether it was live then;
        its ages as of now (for display: no table is read)."""
        with self._lock:
            listed, live, since = self._listed, {r.address for r in self._live}, self._clock.monotonic() - self._beat_at
        return [(dataclasses.replace(r, age_s=r.age_s + since, up_s=r.up_s + since), r.address in live)
                for r in listed]

    def leave(self) -> None:
        """Delete this replica's row (a clean stop): it is no longer named to agents."""
        try:
            self._db.write(functools.partial(store.leave, address=self.me))
        except (Unavailable, Aborted) as exc:
            log.warning("could not remove this replica from the registry; it goes stale by itself", reason=str(exc))
