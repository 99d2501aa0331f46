"""deadlines: reserved for deadlines (issue 15); no schema change yet

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
