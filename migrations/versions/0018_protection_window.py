"""protection window: when each job's recent resizes and preemptions were applied (anti-thrashing)

``jobs.disruptions``: a JSON list of the times (seconds since the UNIX epoch) of the job's resizes and
preemptions within the last hour, oldest first; the applier appends one at each scale or preemption and
drops those older than an hour (``core.protection.record_disruption``). The snapshot hands them to the
policy (``JobView.disruptions``), whose disruption cap (``policy.max_disruptions_per_hour``) counts them.
NULL (jobs from before this revision): none recorded.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-24 06:55:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('disruptions', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('disruptions')
