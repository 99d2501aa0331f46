"""Leadership: which of several schedulers on one PostgreSQL database leads, through the leader lease
(``store.lease``), and the fence every write transaction of this scheduler passes.

A scheduler starts as a *standby*. Every ``renew_s`` it looks at the lease; once the lease lapses
(by the database's clock) it takes it, in a new term whose epoch is higher than every earlier one,
and leads: it renews the lease every ``renew_s`` for ``lease_s`` more. A leader *steps down* (and is
a standby again, which may lead again later in a newer term) when

- a renewal finds the lease lapsed or taken over;
- it could not renew for ``lease_s`` on this process's monotonic clock, counted from the sending of
  its last successful renewal (the database's expiry is no earlier than that), e.g. it lost the
  database: by then a standby may lead;
- a write transaction's fence finds the lease no longer its own (e.g. after a SIGSTOP past the lease).

The fence (``fence``, installed on the application's transactions) makes the lease authoritative
whatever this process believes: a write commits only if, inside its own transaction, the lease still
names this scheduler at its epoch and has not lapsed; otherwise it rolls back with ``NotLeader``.

The lease also names the leader, by its advertised address (``ha.advertise_address``), which a standby
passes on to clients. The lease held by this very address is taken at once, lapsed or not: the address
is this process's bound port, so the process that held it has ended (a restart on the same address
does not wait out its predecessor's lease). Addresses must therefore be unique among the schedulers.

Never: decide anything but who leads; judge liveness of agents (``app.liveness`` does, on the leader).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

import structlog
from sqlalchemy.orm import Session

from scheduler_service.app.term import Term
from scheduler_service.core.clock import Clock
from scheduler_service.errors import Aborted, Unavailable
from scheduler_service.kill_points import kill_point
from scheduler_service.store import lease as store
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.transactions import Transactions

log = structlog.get_logger("aryl.scheduler")


class NotLeader(Unavailable):
    """This scheduler does not lead (any more): the change was not made; ``leader`` is the address of the
    scheduler that does, when known ('' otherwise)."""

    def __init__(self, message: str, leader: str) -> None:
        super().__init__(message)
        self.leader = leader


class Leadership:
    """``me``: this scheduler's advertised address, its name in the lease. ``db``: transactions on a
    connection pool of the lease's own, so that renewals never queue behind a burst of RPCs.
    ``on_elected(epoch)`` and ``on_deposed(reason)`` are called on the thread that noticed; ``heartbeat()`` after
    each round of ``run``, once the lease's own work is done (a renewal never waits behind it in its round)."""

    def __init__(self, db: Transactions, changes: StateChanges, clock: Clock, term: Term, *, me: str,
                 lease_s: float, renew_s: float, on_elected: Callable[[int], None] = lambda epoch: None,
                 on_deposed: Callable[[str], None] = lambda reason: None,
                 close: Callable[[], None] = lambda: None, heartbeat: Callable[[], None] = lambda: None) -> None:
        self._db = db
        self._heartbeat = heartbeat  # after each round, leading or not: this replica's row (``app.replicas``)
        self.close = close  # gives the lease's connections back (after ``release``)
        self._changes = changes
        self._clock = clock
        self._term = term
        self.me = me
        self.lease_s = lease_s
        self.renew_s = renew_s
        self._on_elected = on_elected
        self._on_deposed = on_deposed
        self._lock = threading.Lock()
        self._leading = False
        self._epoch = 0
        self._deadline = 0.0  # monotonic: past it, the lease may have lapsed in the database
        self._leader = ""  # the holder last seen in the lease ('' when lapsed or never looked)

    @property
    def leading(self) -> bool:
        with self._lock:
            return self._leading

    @property
    def epoch(self) -> int:
        """The epoch of this scheduler's current (or last) term; 0 before it first led."""
        with self._lock:
            return self._epoch

    @property
    def leader(self) -> str:
        """The leader's address as last seen ('' when unknown): ``me`` while leading."""
        with self._lock:
            return self.me if self._leading else self._leader

    def not_leader(self) -> NotLeader:
        leader = self.leader
        where = f"the leader is at {leader}" if leader else "no leader is elected right now"
        return NotLeader(f"this scheduler ({self.me}) is a standby: {where}; retry there", leader)

    # -- the fence ---------------------------------------------------------------------------------

    def fence(self, session: Session) -> None:
        """Inside a write transaction, just before its commit: NotLeader (and the transaction rolls
        back) unless this scheduler holds the unexpired lease at its epoch."""
        with self._lock:
            leading, epoch = self._leading, self._epoch
        if not leading:
            raise self.not_leader()
        kill_point("fence.checked_locally")  # tests only (kill_points)
        if not store.holds(session, me=self.me, epoch=epoch):
            # Who holds it now, looked up first: deposed and told the new leader at once, so a call refused
            # meanwhile names it instead of "no leader is elected".
            now = store.look(session)
            self._depose(epoch, "a write found the lease no longer this scheduler's (lapsed or taken over)",
                         leader="" if now.lapsed or now.holder == self.me else now.holder)
            raise self.not_leader()
        kill_point("fence.passed")  # tests only (kill_points)

    # -- the lease loop ----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Thread body: a round every ``renew_s`` (sooner when the local deadline comes first) until
        ``stop`` is set."""
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # a failed round is retried at the next, never fatal
                log.exception("leader lease round failed; retrying")
            try:
                self._heartbeat()
            except Exception:  # the same: the next round beats again
                log.exception("the replica's heartbeat failed; retrying")
            with self._lock:
                wait = self.renew_s
                if self._leading:
                    wait = max(0.0, min(wait, self._deadline - self._clock.monotonic()))
            stop.wait(wait)

    def step(self) -> None:
        """One round: renew while leading (stepping down once the lease is lost), else take the lease
        if it lapsed."""
        with self._lock:
            leading, epoch, deadline = self._leading, self._epoch, self._deadline
        if leading:
            self._renew(epoch, deadline)
        else:
            self._try_take()

    def _renew(self, epoch: int, deadline: float) -> None:
        sent = self._clock.monotonic()
        if sent >= deadline:
            self._depose(epoch, f"the lease was not renewed for {self.lease_s:g}s (lease_s): it may have lapsed")
            self._try_take()  # learns who leads now (and leads again if nobody took over)
            return
        try:
            renewed = self._db.write(functools.partial(store.renew, me=self.me, epoch=epoch, lease_s=self.lease_s))
        except (Unavailable, Aborted) as exc:
            log.warning("could not renew the leader lease; retrying", reason=str(exc),
                        left_s=round(deadline - self._clock.monotonic(), 2))
            if self._clock.monotonic() >= deadline:
                self._depose(epoch, f"could not renew the lease for {self.lease_s:g}s (lease_s): {exc}")
            return
        if not renewed:
            self._depose(epoch, "the lease lapsed or another scheduler took it")
            self._try_take()  # learns the new holder; takes the lease back if it merely lapsed
            return
        with self._lock:
            if self._leading and self._epoch == epoch:
                self._deadline = sent + self.lease_s

    def _try_take(self) -> None:
        try:
            view = self._db.read(store.look)
        except Unavailable as exc:
            log.warning("cannot read the leader lease; retrying", reason=str(exc))
            return
        with self._lock:
            self._leader = "" if view.lapsed else view.holder
        if not view.lapsed and view.holder != self.me:
            return
        if view.holder and view.holder != self.me:
            # Its sessions may hold the lease row (a write between its fence and its commit) or other
            # rows (a paused or cut-off process): ended, they hold nothing back.
            ended = self._db.write(functools.partial(store.end_sessions_of, holder=view.holder, me=self.me))
            if ended:
                log.warning("ended the database sessions of the previous leader", holder=view.holder, sessions=ended)
        sent = self._clock.monotonic()
        try:
            epoch = self._db.write(functools.partial(
                store.take, changes=self._changes, clock=self._clock, me=self.me, lease_s=self.lease_s))
        except (Unavailable, Aborted) as exc:
            log.warning("could not take the leader lease; retrying", reason=str(exc))
            return
        if epoch is None:
            return
        self._term.begin(epoch)  # before anything may write: desired states carry the new epoch
        with self._lock:
            self._epoch, self._leading, self._deadline = epoch, True, sent + self.lease_s
        log.warning("leading: took the leader lease", epoch=epoch, me=self.me, lease_s=self.lease_s,
                    previous=view.holder or None)
        self._on_elected(epoch)

    def _depose(self, epoch: int, reason: str, *, leader: str = "") -> None:
        """Stop leading in ``epoch`` (if this scheduler still does), naming ``leader`` as the one to
        follow ('' when unknown)."""
        with self._lock:
            if not self._leading or self._epoch != epoch:
                if not self._leading and leader:
                    self._leader = leader  # deposed already (its timer): the new leader is known now
                return
            self._leading = False
            self._leader = leader
        log.warning("stepping down: no longer the leader", epoch=epoch, reason=reason)
        self._on_deposed(reason)

    def release(self) -> None:
        """Step down and let the lease lapse now (a clean shutdown): a standby takes over at its next
        look instead of after the lease."""
        with self._lock:
            leading, epoch = self._leading, self._epoch
        if not leading:
            return
        self._depose(epoch, "shutting down")
        try:
            self._db.write(functools.partial(store.release, me=self.me, epoch=epoch))
        except (Unavailable, Aborted) as exc:
            log.warning("could not release the leader lease; it lapses by itself", reason=str(exc))
