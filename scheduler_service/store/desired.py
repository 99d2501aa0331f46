"""Desired state: what each server's agent must run, read from the allocations, and the generation
bump that tells an agent its desired state changed.

A bump is a transaction's last change to its servers: it returns their part of the desired state,
whose workers are read at once, in the same transaction, and staged for ``Transactions`` to publish
right after commit (each round trip here is time every agent of the decision waits).

Never: decide what runs where (the plan did), or push anything itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.batch import job_batch
from scheduler_service.core.goodput import BatchSplit
from scheduler_service.records import DesiredServerState, DesiredWorkerSpec
from scheduler_service.store import models as m
from scheduler_service.store.change_feed import notice_column
from scheduler_service.store.changes import index_list
from scheduler_service.store.rows import batch_limits
from scheduler_service.store.transactions import is_postgresql, stage_desired_states

# A server's part of its desired state (``DesiredStates.of``).
DESIRED_SERVER_COLUMNS = tuple(
    m.SERVERS.c[name] for name in ("id", "agent_address", "desired_generation", "state")
)


class DesiredStates:
    """``epoch``: the scheduler's current epoch (agents fence on it); None where the reader holds no term
    of its own (the desired-state streams' process, ``push_process``): each read then takes the newest
    term's epoch in its own transaction, which is the leader's (a term begins only with a start or with
    the leader lease). A job's workers meet on the port ``store.ports`` assigned it on its rank 0's server."""

    def __init__(self, *, epoch: Callable[[], int] | None) -> None:
        self._epoch = epoch
        # Whose desired state ``bump`` reads inside the transaction, for ``Transactions`` to publish after
        # commit: every server's, unless told otherwise (``app.agents.Agents.read_in_transaction_only``).
        self.read_in_transaction: Callable[[str], bool] = lambda server_id: True
        # Whether ``bump`` announces each new generation on the change feed (PostgreSQL; ``store.change_feed``),
        # for the desired-state streams' processes of every replica (``app.agents.Agents.announce_changes``).
        self.announce = False

    def bump(self, session: Session, server_ids: Iterable[str]) -> None:
        """One desired-generation bump per server, in one statement. The version moves too, so a
        concurrent writer that read a server before this commit fails its optimistic check."""
        ids = sorted(server_ids)
        if not ids:
            return
        s = m.SERVERS
        session.flush()  # pending ORM changes to these rows first, with their own version checks
        # What the agents must be told is read now, in this transaction (bumping is a transaction's last
        # change to these servers), and pushed right after commit, so a push never waits for a second
        # read after commit; ``Transactions.write`` hands it over. The bump returns the servers' part of
        # it: each round trip here is time every agent of the decision waits.
        # Where asked, on PostgreSQL, each bumped server is also announced on the change feed (``store.change_feed``)
        # by this statement (no round trip of its own), delivered at commit: other replicas' streams follow it.
        announce = self.announce and is_postgresql(session)
        notice = (notice_column(s.c.id, s.c.desired_generation),) if announce else ()
        bumped = session.execute(
            sa.update(s).where(s.c.id.in_(ids))
            .values(desired_generation=s.c.desired_generation + 1, version=s.c.version + 1)
            .returning(*DESIRED_SERVER_COLUMNS, *notice)
        ).all()
        for server_id in ids:  # objects of these rows in this session are reloaded on next use
            server = session.identity_map.get(session.identity_key(m.Server, server_id))
            if server is not None:
                session.expire(server)
        # A server left out here is announced as changed after commit (``app.notices``) and read by whoever
        # streams it: the desired-state streams' own process reads it in its own interpreter (``push_process``).
        read_now = [row for row in bumped if self.read_in_transaction(row.id)]
        if read_now:
            stage_desired_states(session, self.of(session, read_now))

    def read(self, session: Session, ids: Sequence[str]) -> dict[str, DesiredServerState]:
        """The desired state of each registered server among ``ids``. Core rows with only the columns
        an agent needs: three queries however many servers."""
        s = m.SERVERS.c
        return self.of(session, session.execute(sa.select(*DESIRED_SERVER_COLUMNS).where(s.id.in_(ids))).all())

    @staticmethod
    def generations(session: Session, ids: Sequence[str]) -> dict[str, int]:
        """The desired generation of each registered server among ``ids``: one narrow read, for re-reads that
        need the whole state only where it moved (``notify.DesiredStateFeed.generations``)."""
        s = m.SERVERS.c
        return {row.id: row.desired_generation
                for row in session.execute(sa.select(s.id, s.desired_generation).where(s.id.in_(ids)))}

    def of(self, session: Session, servers: Sequence[Any]) -> dict[str, DesiredServerState]:
        """The desired state of each server row (``DESIRED_SERVER_COLUMNS``), with its workers read in one
        query (also inside a writing transaction, before its commit: this runs for every decision)."""
        if not servers:
            return {}
        a, j = m.ALLOCATIONS.c, m.JOBS.c
        a0, s0 = m.ALLOCATIONS.alias("rank0"), m.SERVERS.alias("rank0_server")
        # MASTER_ADDR: the server of rank 0 of each job.
        master = (
            sa.select(s0.c.agent_address).join(a0, s0.c.id == a0.c.server_id)
            .where(a0.c.job_id == a.job_id, a0.c.rank == 0).limit(1).scalar_subquery()
        )
        # MASTER_PORT: the job's port on that server (store.ports; 0 if it has none: the agent's default).
        p = m.MASTER_PORTS.c
        port = sa.select(p.port).where(p.job_id == a.job_id).limit(1).scalar_subquery()
        # One row per worker (its GPUs aggregated): a job's command and environment are decoded once
        # per worker, not once per GPU.
        here = session.execute(
            sa.select(a.server_id, a.job_id, a.rank,
                      sa.func.aggregate_strings(sa.cast(a.gpu_index, sa.String), ",").label("gpus"),
                      j.num_workers, j.command, j.env, j.incarnation, j.working_dir, j.working_dir_if_exists,
                      j.array_job_id, j.array_index, j.user, j.gpus_per_worker,
                      j.batch_init, j.batch_max, j.batch_max_local, j.batch_local, j.batch_accum, j.batch_replicas,
                      master.label("master_addr"), port.label("master_port"))
            .join(m.JOBS, j.id == a.job_id)
            .where(a.server_id.in_(sorted(row.id for row in servers)))
            .group_by(a.server_id, a.job_id, a.rank, j.id)
            .order_by(a.server_id, a.job_id, a.rank)
        ).all()
        workers: dict[str, list[Any]] = defaultdict(list)
        for row in here:
            workers[row.server_id].append(row)
        epoch = self._epoch() if self._epoch is not None else newest_epoch(session)
        states = {}
        for server in sorted(servers, key=lambda row: row.id):
            specs = []
            local_rank: dict[int, int] = defaultdict(int)
            for w in workers[server.id]:
                specs.append(
                    DesiredWorkerSpec(
                        job_id=w.job_id, rank=w.rank, world_size=w.num_workers, local_rank=local_rank[w.job_id],
                        gpu_indices=index_list(w.gpus), command=tuple(w.command),
                        env=_worker_env(w.env, w.array_job_id, w.array_index),
                        master_addr=w.master_addr or server.agent_address,
                        master_port=w.master_port or 0, incarnation=w.incarnation,
                        working_dir=w.working_dir or "", working_dir_if_exists=w.working_dir_if_exists,
                        user=w.user, **_batch_fields(w),
                    )
                )
                local_rank[w.job_id] += 1
            states[server.id] = DesiredServerState(
                server.id, epoch, server.desired_generation, server.state, tuple(specs)
            )
        return states


def newest_epoch(session: Session) -> int:
    """The epoch of the newest scheduler term (0 before the first)."""
    return int(session.execute(sa.select(sa.func.max(m.SchedulerTerm.epoch))).scalar() or 0)


def _batch_fields(row: Any) -> dict[str, Any]:
    """A worker's batch (``core.batch.job_batch``: the policy's choice for the job's GPUs, else the
    default) and its job's limits; none for a job without batch limits."""
    limits = batch_limits(row.batch_init, row.batch_max, row.batch_max_local)
    if limits is None:
        return {}
    chosen = BatchSplit(row.batch_local, row.batch_accum or 0) if row.batch_local else None
    return dict(batch=job_batch(limits, chosen, row.batch_replicas, row.num_workers * row.gpus_per_worker),
                batch_limits=limits)


def _worker_env(env: dict[str, str], array_job_id: int | None, array_index: int | None) -> dict[str, str]:
    """The job's environment, plus its place in its job array for an array's element (the job
    contract, ``node_agent.contract``: ``ARYL_ARRAY_JOB_ID``, ``ARYL_ARRAY_INDEX``). Carried in the
    desired state's env because they are per job, like the env itself; a spec cannot set ``ARYL_*``
    names (``api.job_validation``), so nothing a user wrote is overridden."""
    if array_job_id is None:
        return dict(env)
    return {**env, "ARYL_ARRAY_JOB_ID": str(array_job_id), "ARYL_ARRAY_INDEX": str(array_index or 0)}
