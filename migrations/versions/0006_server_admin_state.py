"""servers' admin state: cordon, drain and deregistration, as an operator or a leaving agent sets them

servers: ``admin_state`` ('' = schedulable, 'CORDONED', 'DRAINING', 'LEFT'), ``admin_reason`` (who/why,
shown by ``arylctl servers``), ``admin_changed_at`` and ``drain_deadline`` (DRAINING: when workers that
cannot shrink off are preempted; NULL = wait for them). Existing servers are schedulable.

Hand-written for both dialects. Adding columns needs no table copy on SQLite; dropping them
(downgrade) recreates ``servers``, which needs foreign keys off like 0002's downgrade.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 01:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Server defaults are plain strings: a SQL expression would force SQLite batch mode to copy the table.
    with op.batch_alter_table('servers') as batch:
        batch.add_column(sa.Column('admin_state', sa.String(length=16), server_default='', nullable=False))
        batch.add_column(sa.Column('admin_reason', sa.String(length=1024), server_default='', nullable=False))
        batch.add_column(sa.Column('admin_changed_at', sa.Double(), nullable=True))
        batch.add_column(sa.Column('drain_deadline', sa.Double(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("downgrade 0006 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
    with op.batch_alter_table('servers') as batch:
        batch.drop_column('drain_deadline')
        batch.drop_column('admin_changed_at')
        batch.drop_column('admin_reason')
        batch.drop_column('admin_state')
