"""queues and gpu types: reserved for queues, priority classes, GPU types (issue 20); no schema change yet

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
