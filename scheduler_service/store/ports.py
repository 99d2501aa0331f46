"""Rendezvous ports: each running job's ``MASTER_PORT`` on the server of its rank 0.

A job's workers meet at ``MASTER_ADDR:MASTER_PORT`` (rank 0's server). Two jobs whose rank 0 share a
server must not share a port, and the port should not be one the kernel hands out as a client's
source port (Linux's ephemeral range starts at 32768). So ports come from a configured range below it
(``scheduling.master_port_min``..``master_port_max``, default 29500-29999) and are stored per
(server, port) in ``master_ports``, whose primary key makes a second job on the same server and port
impossible, as ``uq_allocations_one_worker_per_gpu`` does for GPUs.

A port is assigned when a job's rank 0 is placed (a start, or a resize that moves rank 0) and kept
while rank 0 stays on that server. Rows are not deleted when a job stops (a cancel, a preemption, a
failure: many paths free allocations); a row whose job no longer has rank 0 on its server is *stale*
and reused by the next assignment on that server. A full range refuses the start or resize
(``RefusalCode.MASTER_PORT_RANGE_FULL``), never a shared port.

Never: decide where a job runs (the plan did), or commit (the caller's transaction does).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.apply_rules import RefusalCode, Refused
from scheduler_service.store import models as m

DEFAULT_MASTER_PORTS = range(29500, 30000)


def port_range_full(server_id: str, ports: range) -> Refused:
    return Refused(
        RefusalCode.MASTER_PORT_RANGE_FULL,
        f"no free rendezvous port on server {server_id}: all {len(ports)} of MASTER_PORT "
        f"{ports.start}-{ports.stop - 1} are held by jobs whose rank 0 runs there "
        "(widen scheduling.master_port_min/master_port_max)",
    )


class MasterPorts:
    """Assigns ports from ``ports`` (a ``range``)."""

    def __init__(self, ports: range = DEFAULT_MASTER_PORTS) -> None:
        if not ports:
            raise ValueError("the MASTER_PORT range is empty")
        self.ports = ports

    def assign(self, session: Session, masters: Iterable[tuple[int, str]], now: float) -> None:
        """Give each (job id, server of its rank 0) a port on that server, keeping the one it has there.
        Call after the job's allocations are written (they tell live rows from stale ones). Raises
        ``Refused`` (MASTER_PORT_RANGE_FULL) when a server has no free port left; the caller's
        savepoint then undoes the whole action."""
        wanted = dict(masters)
        if not wanted:
            return
        p = m.MASTER_PORTS.c
        kept = {
            row.job_id for row in session.execute(
                sa.select(p.job_id, p.server_id).where(p.job_id.in_(sorted(wanted)))
            ) if wanted[row.job_id] == row.server_id
        }
        moved = sorted(set(wanted) - kept)
        if not moved:
            return
        session.execute(sa.delete(m.MASTER_PORTS).where(p.job_id.in_(moved)))
        by_server: dict[str, list[int]] = defaultdict(list)
        for job_id in moved:
            by_server[wanted[job_id]].append(job_id)
        taken = self._taken_on(session, sorted(by_server))
        rows = []
        for server_id, job_ids in sorted(by_server.items()):
            free = [port for port in self.ports if port not in taken[server_id]][: len(job_ids)]
            if len(free) < len(job_ids):
                raise port_range_full(server_id, self.ports)
            rows += [dict(server_id=server_id, port=port, job_id=job_id, allocated_at=now)
                     for job_id, port in zip(job_ids, free, strict=True)]
        session.execute(sa.insert(m.MASTER_PORTS), rows)

    @staticmethod
    def _taken_on(session: Session, server_ids: list[str]) -> dict[str, set[int]]:
        """The ports live jobs hold on each of ``server_ids``, in one query; stale rows there are
        deleted (their ports are free again)."""
        p, a = m.MASTER_PORTS.c, m.ALLOCATIONS.c
        rank0_here = sa.exists().where(a.job_id == p.job_id, a.server_id == p.server_id, a.rank == 0)
        rows = session.execute(
            sa.select(p.server_id, p.port, rank0_here.label("live")).where(p.server_id.in_(server_ids))
        ).all()
        stale = [(row.server_id, row.port) for row in rows if not row.live]
        if stale:
            session.execute(sa.delete(m.MASTER_PORTS).where(sa.tuple_(p.server_id, p.port).in_(stale)))
        taken: dict[str, set[int]] = {server_id: set() for server_id in server_ids}
        for row in rows:
            if row.live:
                taken[row.server_id].add(row.port)
        return taken
