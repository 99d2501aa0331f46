"""goodput fit: a reserved revision, no change to the schema

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-24 06:55:00.000000
"""

from __future__ import annotations

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
