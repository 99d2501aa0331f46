"""scheduler replicas: each scheduler on the database, with where its desired-state streams' process serves
and its last heartbeat

``scheduler_replicas`` has a row per scheduler replica (leader or standby), keyed by its advertised address: the
address (host:port) of its desired-state streams' own process ('' while none serves) and when it started and
last beat, in seconds since the UNIX epoch by the *database's* clock. Each replica's lease thread renews its
row every ``ha.renew_s`` (``scheduler_service.store.replicas``); the leader names a live standby's process to
the agents that register (``docs/ha.md``). A clean stop deletes the row; a replica silent for
``ha.replica_stale_s`` is no longer named.

Revision ID: 0021
Revises: 0020
Create Date: 2026-11-30 07:15:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'scheduler_replicas',
        sa.Column('address', sa.String(length=253), nullable=False),
        sa.Column('push_address', sa.String(length=253), nullable=False),
        sa.Column('started_at', sa.Double(), nullable=False),
        sa.Column('heartbeat_at', sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint('address', name=op.f('pk_scheduler_replicas')),
    )


def downgrade() -> None:
    op.drop_table('scheduler_replicas')
