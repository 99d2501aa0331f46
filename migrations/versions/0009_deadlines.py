"""deadlines: what a job's predicted finish is measured from (``core.predict``)

jobs: ``progress_at`` (when the scheduler last saw the job's progress change) and the job's *progress
window*: ``window_work`` at ``window_at``, its first progress report in incarnation ``window_incarnation``
(at ``window_workers`` workers), and ``window_reports`` (reports with new progress since). The rate over
the window is the job's own speed at that size. The deadline itself has had its column since 0001.

Hand-written for both dialects, like 0005: plain ADD COLUMN; ``events`` is never batch-altered.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('progress_at', sa.Double(), nullable=True))
        batch.add_column(sa.Column('window_work', sa.Double(), nullable=True))
        batch.add_column(sa.Column('window_at', sa.Double(), nullable=True))
        batch.add_column(sa.Column('window_incarnation', sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column('window_workers', sa.Integer(), server_default='0', nullable=False))
        batch.add_column(sa.Column('window_reports', sa.Integer(), server_default='0', nullable=False))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # Dropping a column on SQLite recreates ``jobs``; with foreign keys on, allocations would refuse it.
        raise RuntimeError("downgrade 0009 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('window_reports')
        batch.drop_column('window_workers')
        batch.drop_column('window_incarnation')
        batch.drop_column('window_at')
        batch.drop_column('window_work')
        batch.drop_column('progress_at')
