"""leader lease: reserved for leader lease and fencing (issue 18); no schema change yet

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
