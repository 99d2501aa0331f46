"""goodput reports: a job's batch limits, the batch chosen for it, and what its workers measured
(the goodput job contract)

- ``jobs.batch_init`` / ``batch_max`` / ``batch_max_local``: its declared batch limits (``JobSpec.batch``;
  NULL: the job does not adapt its batch size).
- ``jobs.batch_local`` / ``batch_accum`` / ``batch_replicas``: the batch the job runs with -- a
  goodput-aware policy's choice (``Plan.batches``), else the default -- and the GPU count it was set
  for (NULL: none yet; ``core.batch.job_batch`` gives the default for any other count).
- ``jobs.goodput_reports``: what its rank 0 reported (``store.goodput``): one step-time sample per
  configuration (bounded), its latest gradient statistics and samples processed.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-24 06:55:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None

_INTEGERS = ("batch_init", "batch_max", "batch_max_local", "batch_local", "batch_accum", "batch_replicas")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        for name in _INTEGERS:
            batch.add_column(sa.Column(name, sa.Integer(), nullable=True))
        batch.add_column(sa.Column("goodput_reports", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("goodput_reports")
        for name in reversed(_INTEGERS):
            batch.drop_column(name)
