"""protection window: reserved for issue 22 anti-thrashing; no change to the schema yet

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-24 06:55:00.000000
"""

from __future__ import annotations

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
