"""Transactions: every unit of work of the service runs through here, as one database transaction.

``Transactions.write`` commits a unit of work, or runs it again when it lost a race that running it
again resolves (an optimistic-concurrency conflict; PostgreSQL aborting it to break a deadlock or a
serialization conflict), up to ``retries`` attempts, each after a short jittered pause (a few
milliseconds, doubling) so that the rivals of a hot row -- a status report and a plan touching the
same server and jobs -- do not collide again in lock-step. ``read`` runs a read-only unit on one consistent
view. Desired states read inside a writing transaction (``stage_desired_states``) are handed to
``publish`` right after its commit, so agents hear of a decision without a second read.

A lost database connection (the server ended it, it went away, a new one is refused) is answered
``Unavailable`` ("the scheduler's database is unreachable; retry"), after one more try on a fresh
connection where that is safe: a read, and a write whose transaction had not reached COMMIT (the
database rolled it back). A connection lost during COMMIT is never retried here: the change may
have been saved. A statement or lock timeout, or a transaction past its bound (``store.db``), is
``Unavailable`` too, and not retried (it would wait as long again).

On PostgreSQL, where several schedulers may share the database, every write passes ``fence`` last,
just before COMMIT (``app.lease``): a scheduler that does not hold the leader lease commits nothing.

The dialect branches of the service live here too (``is_postgresql``, ``commit_without_flush_wait``).

Never: decide anything, or announce anything but the desired states staged here (the use cases
announce their own changes after commit); a unit of work must be safe to run more than once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from aryl_common.backoff import Backoff
from scheduler_service.errors import Aborted, Unavailable
from scheduler_service.kill_points import kill_point
from scheduler_service.records import DesiredServerState
from scheduler_service.store.db import BUSY, UNREACHABLE, connection_lost, database_busy, refusal

T = TypeVar("T")

log = structlog.get_logger("aryl.app")

# PostgreSQL's serialization_failure and deadlock_detected: the transaction lost to a concurrent one,
# and running it again is safe.
_LOST_TO_A_CONCURRENT_TRANSACTION = frozenset({"40001", "40P01"})
# session.info key: desired states read inside a transaction, pushed after its commit (see ``write``).
_DESIRED_STATES = "aryl.desired_states"


# A unit of work that lost a race runs again, up to this many attempts in all, pausing between them
# from CONFLICT_PAUSE_S (jittered, doubling) up to CONFLICT_PAUSE_MAX_S: at most ~0.2 s of pauses.
# (Measured in the hour-long soak at 1,000 agents: three immediate attempts still lost 11 status
# reports to plans touching the same rows.)
CONFLICT_RETRIES = 6
CONFLICT_PAUSE_S = 0.005
CONFLICT_PAUSE_MAX_S = 0.08

class Transactions:
    def __init__(
        self, sessions: sessionmaker[Session], *, publish: Callable[[Mapping[str, DesiredServerState]], None]
    ) -> None:
        self._sessions = sessions
        self._publish = publish
        # Run inside every write transaction, last before COMMIT, raising to roll it back: the leader
        # lease's fence (``app.lease``, PostgreSQL with several schedulers). Not retried here.
        self.fence: Callable[[Session], None] | None = None
        # Per thread: the servers whose desired state the last ``write`` on this thread published.
        self._local = threading.local()

    def write(self, work: Callable[[Session], T], *, retries: int = CONFLICT_RETRIES) -> T:
        """Run ``work`` in one transaction; retry on an optimistic-concurrency conflict, and when
        PostgreSQL aborted it to break a deadlock with a concurrent transaction (which then went on;
        the writers lock jobs before servers, as a status report, an apply and a cancel do, so that
        this stays rare); once more on a fresh connection when the connection was lost before COMMIT. The
        desired states ``stage_desired_states`` staged inside the transaction are handed to
        ``publish`` right after commit (and ``published`` names their servers, so the caller does
        not ask for them again). A write that breaks a unique key the domain names raises that key's
        error (``store.db.refusal``: ``KeyTaken``, ``GpuTaken``), with nothing committed."""
        self._local.published = frozenset()
        attempt = 0
        reconnected = False
        pause = Backoff(CONFLICT_PAUSE_MAX_S, initial_s=CONFLICT_PAUSE_S)
        while True:
            committing = False
            try:
                with self._sessions.begin() as session:
                    result = work(session)
                    session.flush()  # every statement of the unit is sent; what follows is COMMIT
                    if self.fence is not None:
                        self.fence(session)
                    committing = True
                states = session.info.pop(_DESIRED_STATES, None)
                if states:
                    kill_point("commit.before_push")  # tests only (kill_points)
                    self._publish(states)
                    self._local.published = frozenset(states)
                return result
            except StaleDataError:
                if attempt == retries - 1:
                    raise Aborted("a concurrent change modified the same object; retry") from None
                time.sleep(pause.next_delay())
            except IntegrityError as exc:  # never a lost race that running again resolves
                refused = refusal(exc)
                if refused is None:
                    raise
                raise refused from exc
            except DBAPIError as exc:
                if connection_lost(exc):
                    if committing:
                        log.warning("database connection lost during COMMIT", reason=_first_line(exc))
                        raise Unavailable(
                            "the scheduler lost its database connection while saving this change, which may or may "
                            "not have been saved: check before retrying"
                        ) from exc
                    if reconnected:
                        raise Unavailable(UNREACHABLE) from exc
                    # The database rolled the transaction back with the connection: running it again is safe.
                    log.info("database connection lost; running the transaction again", reason=_first_line(exc))
                    reconnected = True
                    continue
                if database_busy(exc):
                    raise Unavailable(BUSY) from exc
                if getattr(exc.orig, "pgcode", None) not in _LOST_TO_A_CONCURRENT_TRANSACTION:
                    raise
                log.info("transaction aborted by the database; retrying", attempt=attempt + 1,
                         reason=_first_line(exc))
                if attempt == retries - 1:
                    raise Aborted("the database aborted this change in favour of a concurrent one; retry") from None
                time.sleep(pause.next_delay())
            attempt += 1

    @property
    def published(self) -> frozenset[str]:
        """The servers whose desired state the last ``write`` on this thread published itself."""
        return getattr(self._local, "published", frozenset())

    def read(self, work: Callable[[Session], T]) -> T:
        """A read-only unit of work on one consistent view (several queries, no torn reads); once
        more on a fresh connection when the connection was lost."""
        for attempt in range(2):
            try:
                with self._sessions() as session:
                    if is_postgresql(session):
                        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                    return work(session)
            except DBAPIError as exc:
                if database_busy(exc):
                    raise Unavailable(BUSY) from exc
                if not connection_lost(exc):
                    raise
                if attempt == 1:
                    raise Unavailable(UNREACHABLE) from exc
                log.info("database connection lost; reading again", reason=_first_line(exc))
        raise AssertionError("unreachable")


def _first_line(exc: DBAPIError) -> str:
    return (str(exc.orig).strip().splitlines() or [""])[0]


def stage_desired_states(session: Session, states: Mapping[str, DesiredServerState]) -> None:
    """Desired states read inside ``session``'s transaction, to publish when (if) it commits."""
    session.info.setdefault(_DESIRED_STATES, {}).update(states)


def is_postgresql(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def commit_without_flush_wait(session: Session) -> None:
    """On PostgreSQL, do not wait for the WAL flush when this transaction commits: for telemetry only,
    whose last few hundred ms may be lost in a crash harmlessly, and not waiting makes 1,000s of
    reports a second affordable. SQLite (one local file) has no such setting."""
    if is_postgresql(session):
        session.execute(sa.text("SET LOCAL synchronous_commit TO OFF"))
