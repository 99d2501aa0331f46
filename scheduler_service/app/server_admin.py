"""Servers taken out of the cluster: an operator's cordon, uncordon, drain and delete
(``arylctl servers ...``), and the removal of deleted servers once nothing runs there.

Each request is one transaction that marks the server and writes its event, then asks for a
cycle: the policy moves work off a draining server (``core.faults``), and places nothing on a
cordoned one (``core.placement``, checked again by ``core.apply_rules``).

Never: decide what moves (the policy does), or hold SQL (``store.server_admin`` does).
"""

from __future__ import annotations

from scheduler_service.app.notices import Announcer
from scheduler_service.errors import InvalidArgument
from scheduler_service.records import AdminChange, ServerInfo
from scheduler_service.store import views
from scheduler_service.store.server_admin import ServerAdminStore
from scheduler_service.store.transactions import Transactions


class ServerAdmin:
    def __init__(self, db: Transactions, store: ServerAdminStore, notices: Announcer) -> None:
        self._db = db
        self._store = store
        self._notices = notices

    def cordon(self, server_id: str, reason: str = "") -> AdminChange:
        return self._changed(self._db.write(lambda session: self._store.cordon(session, server_id, reason)))

    def uncordon(self, server_id: str) -> AdminChange:
        return self._changed(self._db.write(lambda session: self._store.uncordon(session, server_id)))

    def drain(self, server_id: str, reason: str = "", *, timeout_s: float = 0.0, force: bool = False) -> AdminChange:
        """``timeout_s``: seconds until jobs that cannot shrink off are requeued (0: never)."""
        if timeout_s < 0:
            raise InvalidArgument("timeout_seconds", "must not be negative (0: wait for the jobs to finish)")
        return self._changed(self._db.write(
            lambda session: self._store.drain(session, server_id, reason, timeout_s=timeout_s, force=force)))

    def delete(self, server_id: str, *, force: bool = False) -> AdminChange:
        return self._changed(self._db.write(lambda session: self._store.delete(session, server_id, force=force)))

    def remove_vacated(self) -> list[str]:
        """Remove the servers being deleted that nothing runs on any more (called periodically)."""
        removed = self._db.write(self._store.remove_vacated)
        if removed:
            self._notices.servers_changed(removed)
        return removed

    def server(self, server_id: str) -> ServerInfo | None:
        """The server as it is now (None: not registered, e.g. deleted)."""
        return next((s for s in self._db.read(views.servers) if s.id == server_id), None)

    def _changed(self, change: AdminChange) -> AdminChange:
        self._notices.servers_changed({change.server_id, *change.touched})  # events and a cycle
        return change
