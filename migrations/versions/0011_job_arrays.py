"""job arrays: which array a job belongs to, and its index in it

jobs: ``array_job_id`` (the job id of the array's first element; NULL: not in an array) and
``array_index`` (the job's index in its array, as ``arylctl submit --array`` numbered it), with an
index on ``array_job_id`` so cancelling a whole array finds its jobs without a scan.

Hand-written for both dialects, like 0005: plain ADD COLUMN.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('array_job_id', sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                                   nullable=True))
        batch.add_column(sa.Column('array_index', sa.Integer(), nullable=True))
    op.create_index('ix_jobs_array_job_id', 'jobs', ['array_job_id'])


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # Dropping a column on SQLite recreates ``jobs``; with foreign keys on, allocations would refuse it.
        raise RuntimeError("downgrade 0011 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
    op.drop_index('ix_jobs_array_job_id', table_name='jobs')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('array_index')
        batch.drop_column('array_job_id')
