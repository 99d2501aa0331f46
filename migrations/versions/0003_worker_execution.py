"""worker execution: job incarnations, worker exits, where each rank ran; agent endpoints; drain acks

jobs: ``incarnation`` (bumped whenever the job's workers must (re)start: a start or a resize; agents
identify a worker by job, rank and incarnation), ``worker_exits`` (rank -> exit status of the current
incarnation, for completion and the restart policy), ``checkpoint_work`` (progress at the last
reported checkpoint), ``rank_servers`` (rank -> server of the latest
placement, kept after the job ends so its logs can be found). servers: ``logs_address`` (the agent's
WorkerLogService), ``inference_endpoint`` (the model server's URL, for the router), ``drained_at``
(when the router acknowledged that a DRAINING server has no requests in flight).

Hand-written for both dialects, like 0002: plain ADD COLUMN; ``events`` is never batch-altered.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-21 07:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs') as batch:
        batch.add_column(sa.Column('incarnation', sa.BigInteger(), server_default='0', nullable=False))
        batch.add_column(sa.Column('checkpoint_work', sa.Double(), nullable=True))
        batch.add_column(sa.Column('worker_exits', sa.JSON(), nullable=True))
        batch.add_column(sa.Column('rank_servers', sa.JSON(), nullable=True))
    with op.batch_alter_table('servers') as batch:
        batch.add_column(sa.Column('logs_address', sa.String(length=253), nullable=True))
        batch.add_column(sa.Column('inference_endpoint', sa.String(length=512), nullable=True))
        batch.add_column(sa.Column('drained_at', sa.Double(), nullable=True))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError("downgrade 0003 on SQLite needs PRAGMA foreign_keys=OFF (set outside a transaction)")
    with op.batch_alter_table('servers') as batch:
        batch.drop_column('drained_at')
        batch.drop_column('inference_endpoint')
        batch.drop_column('logs_address')
    with op.batch_alter_table('jobs') as batch:
        batch.drop_column('rank_servers')
        batch.drop_column('worker_exits')
        batch.drop_column('checkpoint_work')
        batch.drop_column('incarnation')
