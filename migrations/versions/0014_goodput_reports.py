"""goodput reports: reserved for issue 17 contract (H17a); no change to the schema yet

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24 06:55:00.000000
"""

from __future__ import annotations

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
