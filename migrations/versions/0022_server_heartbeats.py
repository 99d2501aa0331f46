"""server heartbeats: what status reports write about a server, in a row of its own

``servers.last_seen_at`` and ``servers.observed_generation`` move to ``server_heartbeats`` (one row per server,
deleted with it). A status report wrote them, and so locked its server's row for its whole transaction, every few
seconds per server; a decision's desired-generation bump of the same servers then waited for the report to
commit (``scheduler_service.store.models.ServerHeartbeat``). Existing servers keep their values.

Hand-written for both dialects: ``ALTER TABLE ... DROP COLUMN`` is plain SQL on PostgreSQL and on SQLite 3.35
or newer (neither column is indexed or constrained, so SQLite drops it in place, without a table copy).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-01 09:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'server_heartbeats',
        sa.Column('server_id', sa.String(length=253), nullable=False),
        sa.Column('last_seen_at', sa.Double(), nullable=False),
        sa.Column('observed_generation', sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(['server_id'], ['servers.id'], name=op.f('fk_server_heartbeats_server_id_servers'),
                                ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('server_id', name=op.f('pk_server_heartbeats')),
    )
    op.execute('INSERT INTO server_heartbeats (server_id, last_seen_at, observed_generation) '
               'SELECT id, last_seen_at, observed_generation FROM servers')
    op.execute('ALTER TABLE servers DROP COLUMN last_seen_at')
    op.execute('ALTER TABLE servers DROP COLUMN observed_generation')


def downgrade() -> None:
    op.add_column('servers', sa.Column('last_seen_at', sa.Double(), server_default='0', nullable=False))
    op.add_column('servers', sa.Column('observed_generation', sa.BigInteger(), server_default='0', nullable=False))
    op.execute('UPDATE servers SET last_seen_at = COALESCE((SELECT h.last_seen_at FROM server_heartbeats h '
               'WHERE h.server_id = servers.id), registered_at), observed_generation = COALESCE((SELECT '
               'h.observed_generation FROM server_heartbeats h WHERE h.server_id = servers.id), 0)')
    op.drop_table('server_heartbeats')
