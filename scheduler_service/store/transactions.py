"""Transactions: every unit of work of the service runs through here, as one database transaction.

``Transactions.write`` commits a unit of work, or runs it again when it lost a race that running it
again resolves (an optimistic-concurrency conflict; PostgreSQL aborting it to break a deadlock or a
serialization conflict), up to ``retries`` attempts. ``read`` runs a read-only unit on one consistent
view. Desired states read inside a writing transaction (``stage_desired_states``) are handed to
``publish`` right after its commit, so agents hear of a decision without a second read.

The dialect branches of the service live here too (``is_postgresql``, ``commit_without_flush_wait``).

Never: decide anything, or announce anything but the desired states staged here (the use cases
announce their own changes after commit); a unit of work must be safe to run more than once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TypeVar

import sqlalchemy as sa
import structlog
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from scheduler_service.errors import Aborted
from scheduler_service.records import DesiredServerState

T = TypeVar("T")

log = structlog.get_logger("aryl.app")

# PostgreSQL's serialization_failure and deadlock_detected: the transaction lost to a concurrent one,
# and running it again is safe.
_LOST_TO_A_CONCURRENT_TRANSACTION = frozenset({"40001", "40P01"})
# session.info key: desired states read inside a transaction, pushed after its commit (see ``write``).
_DESIRED_STATES = "aryl.desired_states"


class Transactions:
    def __init__(
        self, sessions: sessionmaker[Session], *, publish: Callable[[Mapping[str, DesiredServerState]], None]
    ) -> None:
        self._sessions = sessions
        self._publish = publish
        # Per thread: the servers whose desired state the last ``write`` on this thread published.
        self._local = threading.local()

    def write(self, work: Callable[[Session], T], *, retries: int = 3) -> T:
        """Run ``work`` in one transaction; retry on an optimistic-concurrency conflict, and when
        PostgreSQL aborted it to break a deadlock with a concurrent transaction (which then went on:
        e.g. a status report locks a server, then a job; an apply or a cancel locks jobs, then their
        servers). The desired states ``stage_desired_states`` staged inside the transaction are handed
        to ``publish`` right after commit (and ``published`` names their servers, so the caller does
        not ask for them again)."""
        self._local.published = frozenset()
        for attempt in range(retries):
            try:
                with self._sessions.begin() as session:
                    result = work(session)
                states = session.info.pop(_DESIRED_STATES, None)
                if states:
                    self._publish(states)
                    self._local.published = frozenset(states)
                return result
            except StaleDataError:
                if attempt == retries - 1:
                    raise Aborted("a concurrent change modified the same object; retry") from None
            except DBAPIError as exc:
                if getattr(exc.orig, "pgcode", None) not in _LOST_TO_A_CONCURRENT_TRANSACTION:
                    raise
                log.info("transaction aborted by the database; retrying", attempt=attempt + 1,
                         reason=str(exc.orig).splitlines()[0])
                if attempt == retries - 1:
                    raise Aborted("the database aborted this change in favour of a concurrent one; retry") from None
        raise AssertionError("unreachable")

    @property
    def published(self) -> frozenset[str]:
        """The servers whose desired state the last ``write`` on this thread published itself."""
        return getattr(self._local, "published", frozenset())

    def read(self, work: Callable[[Session], T]) -> T:
        """A read-only unit of work on one consistent view (several queries, no torn reads)."""
        with self._sessions() as session:
            if is_postgresql(session):
                session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            return work(session)


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
