"""default queue rest: a configured "default" queue may keep "the rest" as its quota (quota_gpus NULL)

``queues.quota_gpus`` NULL: the queue's quota is what the other queues' quotas leave of the training
GPUs, as "default" has without a row. Only "default" is ever written so (``store.queues``): setting its
cohort, borrow limit or fair share no longer freezes the rest it had into a fixed number, which
deleting the other queues would not give back.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-28 19:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('queues') as batch:
        batch.alter_column('quota_gpus', existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    # A "default" with the rest loses its row (its cohort, borrow limit, fair share) rather than its quota:
    # unconfigured, it has the rest again; a fixed 0 would hold its jobs for good once the others go.
    op.execute("DELETE FROM queues WHERE quota_gpus IS NULL")
    with op.batch_alter_table('queues') as batch:
        batch.alter_column('quota_gpus', existing_type=sa.Integer(), nullable=False)
