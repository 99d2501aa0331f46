"""leader lease: one row, the lease through which exactly one of several schedulers on one
PostgreSQL database leads

``leader_lease`` holds a single row (id 1, created here): the current holder (its advertised
address), the epoch of its term (a ``scheduler_terms`` id), when it took the lease and when the
lease expires, both in seconds since the UNIX epoch by the *database's* clock. A scheduler leads
while the row names it with its epoch and ``expires_at`` is in the future; every write transaction
checks that inside itself (``scheduler_service.store.lease``). SQLite keeps one scheduler and never
reads the row.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'leader_lease',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('holder', sa.String(length=253), nullable=False),
        sa.Column('epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
        sa.Column('acquired_at', sa.Double(), nullable=False),
        sa.Column('expires_at', sa.Double(), nullable=False),
        sa.CheckConstraint('id = 1', name=op.f('ck_leader_lease_single_row')),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_leader_lease')),
    )
    # Expired since 1970: the first scheduler to look takes it.
    op.execute("INSERT INTO leader_lease (id, holder, epoch, acquired_at, expires_at) VALUES (1, '', 0, 0, 0)")


def downgrade() -> None:
    op.drop_table('leader_lease')
