"""queues and gpu types: admin-configured queues, a job's priority class and GPU types

- ``queues``: one row per configured queue (``core.quota``): its guaranteed GPU quota, its borrow
  limit (NULL: none), its cohort ('' none) and whether its users share it fairly. "default" exists
  without a row (what the other quotas leave); a row for it configures it.
- ``jobs.priority_class`` / ``jobs.priority_value``: the class a job was submitted with and the class's
  value then (fixed at submission, as Kubernetes copies a PriorityClass's value into the pod).
- ``jobs.gpu_types``: the GPU types a job may run on, preferred first (NULL: any).

A server's GPU type is its GPUs' ``model`` (already stored), so servers need no column.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 03:45:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queues",
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("cohort", sa.String(63), nullable=False, server_default=sa.text("''")),
        sa.Column("quota_gpus", sa.Integer(), nullable=False),
        sa.Column("borrow_limit_gpus", sa.Integer(), nullable=True),
        sa.Column("fair_share", sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column("created_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.CheckConstraint("quota_gpus >= 0", name=op.f("ck_queues_quota_not_negative")),
        sa.CheckConstraint("borrow_limit_gpus IS NULL OR borrow_limit_gpus >= 0",
                           name=op.f("ck_queues_borrow_limit_not_negative")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_queues")),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("priority_class", sa.String(63), nullable=False, server_default=sa.text("''")))
        batch.add_column(sa.Column("priority_value", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("gpu_types", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("gpu_types")
        batch.drop_column("priority_value")
        batch.drop_column("priority_class")
    op.drop_table("queues")
