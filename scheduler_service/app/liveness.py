"""Liveness: servers whose agents have been silent too long are marked LOST, and a cycle is requested:
its plan shrinks or requeues the jobs that ran there (``core.faults``, before any policy step).

Silence is measured on this scheduler's monotonic clock only (``Heartbeats``), never on the agents'
clocks or the database's wall times, so a clock jump is not silence and a restarted scheduler (or a
standby that begins to lead, ``begin_term``) gives every agent a full grace period. Only the leader
sweeps (``scheduler_service.service_loops``).

Never: hold SQL (``store.liveness`` marks the server), or move jobs (the policy does).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from scheduler_service.app.memory import Heartbeats
from scheduler_service.app.notices import Announcer
from scheduler_service.store.liveness import LivenessStore
from scheduler_service.store.transactions import Transactions


class Liveness:
    def __init__(self, db: Transactions, store: LivenessStore, heartbeats: Heartbeats, notices: Announcer, *,
                 remove_deleted: Callable[[], list[str]] | None = None) -> None:
        self._db = db
        # Each sweep also removes the servers deleted by force (or while LOST) that nothing runs on any
        # more (``ServerAdmin.remove_vacated``): their jobs were moved off by the cycles since.
        self._remove_deleted = remove_deleted
        self._store = store
        self._heartbeats = heartbeats
        self._notices = notices

    def begin_term(self) -> None:
        """This scheduler begins to lead (``app.lease``): every agent gets a full grace period from now,
        as after a restart, since a standby hears from no agent. Only the leader sweeps."""
        self._heartbeats.restart()

    def sweep_lost(self, lost_after_s: float) -> list[str]:
        """Mark LOST every server whose agent has been silent for more than ``lost_after_s`` on this
        scheduler's monotonic clock, and request a cycle, whose plan shrinks or requeues the jobs that
        ran there. Returns their ids."""
        candidates = self._db.read(self._store.servers_not_lost)
        lost: list[str] = []
        for server_id in candidates:
            silence = self._heartbeats.silence(server_id)
            if silence <= lost_after_s:
                continue
            touched = self._db.write(functools.partial(
                self._store.mark_lost, server_id=server_id, silence=silence, lost_after_s=lost_after_s,
                silence_now=self._heartbeats.silence,
            ))
            if touched is not None:
                lost.append(server_id)
                self._notices.servers_changed(touched)
        if lost:
            self._notices.notifier.cycle_requested()
        if self._remove_deleted is not None:
            self._remove_deleted()
        return lost
