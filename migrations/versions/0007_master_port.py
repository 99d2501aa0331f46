"""rendezvous ports per (master server, job); why a running job keeps its size; cluster-level notes

``master_ports``: the ``MASTER_PORT`` of each job, on the server of its rank 0, from the configured
range (``scheduling.master_port_range``). The primary key (server_id, port) makes it impossible for
two jobs to be given the same port on the same server, as ``uq_allocations_one_worker_per_gpu`` does
for GPUs; ``job_id`` is unique (one rendezvous per job). Rows of jobs that no longer run there are
reused by the next allocation on that server. Jobs running when this revision is applied get the
lowest free ports of the default range 29500-29999 on their rank 0's server.

jobs: ``size_note`` -- why a running elastic job keeps its size this cycle (``REASON: message``, ''
when nothing holds it back), as ``pending_reason`` is for a queued job; ``command_preview`` -- the
command as list views show it (``records.command_preview``: whole arguments up to 256 characters),
so a page of jobs never reads ``command`` or ``env`` (up to 256 KiB each); backfilled here.

``scheduler_notes``: the scheduler's standing cluster-level decisions by topic (``LOANS``: why no
server is loaned now), shown by ``arylctl loans``.

Hand-written for both dialects. New tables and an added column need no table copy on SQLite;
dropping the column (downgrade) recreates ``jobs``, which needs foreign keys off like 0002's.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 01:10:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

_BACKFILL_RANGE = range(29500, 30000)


def upgrade() -> None:
    op.create_table(
        'master_ports',
        sa.Column('server_id', sa.String(length=253), nullable=False),
        sa.Column('port', sa.Integer(), nullable=False),
        sa.Column('job_id', sa.BigInteger(), nullable=False),
        sa.Column('allocated_at', sa.Double(), nullable=False),
        sa.CheckConstraint('port >= 1 AND port <= 65535', name=op.f('ck_master_ports_port_valid')),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_master_ports_job_id_jobs'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('server_id', 'port', name=op.f('pk_master_ports')),
        sa.UniqueConstraint('job_id', name=op.f('uq_master_ports_job_id')),
    )
    op.create_table(
        'scheduler_notes',
        sa.Column('topic', sa.String(length=32), nullable=False),
        sa.Column('reason', sa.String(length=64), nullable=False),
        sa.Column('message', sa.String(length=1024), nullable=False),
        sa.Column('since', sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint('topic', name=op.f('pk_scheduler_notes')),
    )
    bind = op.get_bind()
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('size_note', sa.String(length=1024), server_default='', nullable=False))
        batch.add_column(sa.Column('command_preview', sa.JSON(), nullable=True))
    jobs = sa.table('jobs', sa.column('id', sa.BigInteger()), sa.column('command', sa.JSON()),
                    sa.column('command_preview', sa.JSON()))
    for job_id, command in bind.execute(sa.select(jobs.c.id, jobs.c.command)).all():
        bind.execute(sa.update(jobs).where(jobs.c.id == job_id).values(command_preview=_preview(command or [])))
    # Running jobs keep meeting where they do now only until their next restart; give each a port that
    # no other job on its master server has, so the agents' next desired state is collision-free.
    rows = bind.execute(sa.text(
        "SELECT job_id, server_id, MIN(allocated_at) FROM allocations WHERE rank = 0 "
        "GROUP BY job_id, server_id ORDER BY server_id, job_id"
    )).all()
    used: dict[str, int] = {}
    for job_id, server_id, allocated_at in rows:
        index = used.get(server_id, 0)
        if index >= len(_BACKFILL_RANGE):
            raise RuntimeError(f"upgrade 0007: server {server_id!r} runs more than {len(_BACKFILL_RANGE)} jobs' "
                               "rank 0; stop some first")
        bind.execute(
            sa.text("INSERT INTO master_ports (server_id, port, job_id, allocated_at) VALUES (:s, :p, :j, :t)"),
            {"s": server_id, "p": _BACKFILL_RANGE[index], "j": job_id, "t": allocated_at},
        )
        used[server_id] = index + 1


def _preview(command: list[str], chars: int = 256) -> list[str]:
    """``scheduler_service.records.command_preview`` as of this revision (migrations import no app code)."""
    kept: list[str] = []
    used = 0
    for arg in command:
        if kept and used + len(arg) > chars:
            break
        kept.append(arg[:chars])
        used += len(arg)
    return kept


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("downgrade 0007 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('command_preview')
        batch.drop_column('size_note')
    op.drop_table('scheduler_notes')
    op.drop_table('master_ports')
