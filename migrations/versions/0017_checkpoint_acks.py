"""checkpoint acks: a reserved revision, no change to the schema

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-24 06:55:00.000000
"""

from __future__ import annotations

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
