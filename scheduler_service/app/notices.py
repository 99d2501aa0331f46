"""Announcing committed changes: the ``Notifier`` port, and what every use case tells it after a
commit that changed servers (their desired state, the event log, a cycle trigger).

Never: announce before commit, or decide anything; announcements are wake-ups, and a missed one
only delays a reader until its next poll.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from scheduler_service.app.memory import ReportDigests
from scheduler_service.records import DesiredServerState
from scheduler_service.store.transactions import Transactions


class Notifier(Protocol):
    """Where committed changes are announced. Implementations must be thread-safe and cheap."""

    def events_appended(self) -> None: ...
    def desired_state_changed(self, server_ids: Iterable[str]) -> None: ...
    def desired_states_committed(self, states: Mapping[str, DesiredServerState]) -> None: ...
    def cycle_requested(self) -> None: ...
    # A cycle is wanted for newly queued jobs alone: nothing was freed, nothing else changed (``ServiceLoops``
    # spaces out cycles woken only by this after cycles that could place nothing).
    def jobs_queued(self) -> None: ...


class NullNotifier:
    def events_appended(self) -> None:
        pass

    def desired_state_changed(self, server_ids: Iterable[str]) -> None:
        pass

    def desired_states_committed(self, states: Mapping[str, DesiredServerState]) -> None:
        pass

    def cycle_requested(self) -> None:
        pass

    def jobs_queued(self) -> None:
        pass


class Announcer:
    def __init__(self, notifier: Notifier, db: Transactions, digests: ReportDigests) -> None:
        self.notifier = notifier
        self._db = db
        self._digests = digests

    def servers_changed(self, touched_servers: Iterable[str]) -> None:
        """After a commit that changed ``touched_servers``: their report digests are forgotten, the
        agents of those whose desired state the commit did not publish itself are told to re-read it,
        and the event log and the cycle are woken."""
        touched = list(touched_servers)
        published = self._db.published
        self._digests.forget(touched)
        unread = [server_id for server_id in touched if server_id not in published]
        if unread:
            self.notifier.desired_state_changed(unread)
        self.notifier.events_appended()
        self.notifier.cycle_requested()

    def state_changed(self) -> None:
        """After a commit that appended events the policy may act on."""
        self.notifier.events_appended()
        self.notifier.cycle_requested()

    def jobs_queued(self) -> None:
        """After a commit that queued new jobs and changed nothing else."""
        self.notifier.events_appended()
        self.notifier.jobs_queued()
