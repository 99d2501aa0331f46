"""identities and audit: who did it, in the event log

events: ``actor``, the authenticated caller (``role:name``) whose RPC wrote the event; "" for the
scheduler's own decisions and for a scheduler run without identities (``security.insecure``).

Hand-written for both dialects: a plain ADD COLUMN (no table rebuild, so the append-only triggers of
0008 stay as they are).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('events', sa.Column('actor', sa.String(160), nullable=False, server_default=''))


def downgrade() -> None:
    # SQLite (3.35+) and PostgreSQL both drop a column in place.
    op.execute("ALTER TABLE events DROP COLUMN actor")
