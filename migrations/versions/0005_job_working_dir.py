"""job working directory: where the agent starts the job's workers

jobs: ``working_dir`` (absolute path on the servers; NULL: none given, the workers run in the agent's
per-job directory) and ``working_dir_if_exists`` (true: the path is only a default, such as the
directory ``arylctl submit`` ran in, used where it exists on the server; false: the path is required and
a server without it fails the job).

Hand-written for both dialects, like 0003: plain ADD COLUMN; ``events`` is never batch-altered.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24 00:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('working_dir', sa.String(length=4096), nullable=True))
        batch.add_column(sa.Column('working_dir_if_exists', sa.Boolean(), server_default=sa.false(),
                                   nullable=False))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # Dropping a column on SQLite recreates ``jobs``; with foreign keys on, allocations would refuse it.
        raise RuntimeError("downgrade 0005 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('working_dir_if_exists')
        batch.drop_column('working_dir')
