"""security rest: a reserved revision, no change to the schema

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-24 06:55:00.000000
"""

from __future__ import annotations

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
