"""identities and audit: reserved for identities, roles and audit (issue 18); no schema change yet

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
