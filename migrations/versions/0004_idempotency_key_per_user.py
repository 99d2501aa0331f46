"""idempotency keys are per user: unique on (user, idempotency_key), no longer on the key alone

Two users may pick the same key (``run-1``) without one's submission being refused, or answered with
the other's job. The lookup of a retried submission reads by (user, key), which the new unique
index serves. Jobs without a key (NULL) never collide, as before.

Hand-written for both dialects. On SQLite a table's UNIQUE constraint can only go by recreating
``jobs`` (batch mode, both ways), which needs foreign keys off like 0002's downgrade;
``events`` is never batch-altered.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 23:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    _refuse_sqlite_foreign_keys("upgrade")
    with op.batch_alter_table('jobs') as batch:
        batch.drop_constraint('uq_jobs_idempotency_key', type_='unique')
        batch.create_unique_constraint('uq_jobs_user_idempotency_key', ['user', 'idempotency_key'])


def downgrade() -> None:
    _refuse_sqlite_foreign_keys("downgrade")
    # Checked before anything changes (SQLite would leave a half-built table copy behind): which of
    # two users' jobs keeps a shared key is not this migration's to decide.
    shared = op.get_bind().execute(sa.text(
        "SELECT idempotency_key FROM jobs WHERE idempotency_key IS NOT NULL "
        "GROUP BY idempotency_key HAVING COUNT(*) > 1"
    )).scalars().first()
    if shared is not None:
        raise RuntimeError(
            f"downgrade 0004: idempotency_key {shared!r} is used by more than one user's jobs; "
            "clear all but one (UPDATE jobs SET idempotency_key = NULL ...) first"
        )
    with op.batch_alter_table('jobs') as batch:
        batch.drop_constraint('uq_jobs_user_idempotency_key', type_='unique')
        batch.create_unique_constraint('uq_jobs_idempotency_key', ['idempotency_key'])


def _refuse_sqlite_foreign_keys(step: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        # Recreating ``jobs`` drops the old table; with foreign keys on, allocations would refuse it.
        raise RuntimeError(f"{step} 0004 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
