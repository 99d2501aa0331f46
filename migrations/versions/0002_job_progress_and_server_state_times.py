"""job progress and resize times; when each server entered its current state

jobs: ``last_resized_at`` (last start or resize: the policy's anti-thrashing input), ``work_done``
(progress, same unit as the throughput hints' total_work), ``last_checkpoint_at`` (work lost on
preemption is counted from here). servers: ``state_changed_at`` (loan/reclaim hysteresis), backfilled
from ``registered_at`` for servers registered before this revision.

Hand-written for both dialects. ``batch_alter_table`` is plain ALTER TABLE on PostgreSQL; on SQLite
adding columns needs no table copy, but dropping them (downgrade) recreates ``jobs`` and ``servers``.
``events`` is never batch-altered: recreating it would drop its append-only triggers.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 10:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Server defaults are plain strings: a SQL expression would force SQLite batch mode to copy the table.
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('last_resized_at', sa.Double(), nullable=True))
        batch.add_column(sa.Column('work_done', sa.Double(), server_default='0', nullable=False))
        batch.add_column(sa.Column('last_checkpoint_at', sa.Double(), nullable=True))
    with op.batch_alter_table('servers') as batch:
        batch.add_column(sa.Column('state_changed_at', sa.Double(), server_default='0', nullable=False))
    # Existing servers: the best known time of their current state is when they registered.
    op.execute('UPDATE servers SET state_changed_at = registered_at')


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # Recreating ``servers`` drops the old table, and with foreign keys on that DELETE would cascade
        # to every GPU row. migrations/env.py connects without them; a caller's own connection must too.
        raise RuntimeError("downgrade 0002 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
    with op.batch_alter_table('servers') as batch:
        batch.drop_column('state_changed_at')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('last_checkpoint_at')
        batch.drop_column('work_done')
        batch.drop_column('last_resized_at')
