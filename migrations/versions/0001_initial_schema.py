"""initial schema: jobs, servers, GPUs, allocations, loans, demand, scheduler terms, event log

The event log is append-only: triggers refuse UPDATE and DELETE on ``events`` in both dialects.

Revision ID: 0001
Revises: 
Create Date: 2026-11-21 03:48:24.827194
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('demand_reports',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('time', sa.Double(), nullable=False),
    sa.Column('servers_needed', sa.Integer(), nullable=False),
    sa.Column('observed_rps', sa.Double(), nullable=False),
    sa.Column('source', sa.String(length=253), nullable=False),
    sa.CheckConstraint('observed_rps >= 0', name=op.f('ck_demand_reports_observed_rps_non_negative')),
    sa.CheckConstraint('servers_needed >= 0', name=op.f('ck_demand_reports_servers_needed_non_negative')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_demand_reports'))
    )
    op.create_table('events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('time', sa.Double(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=True),
    sa.Column('server_id', sa.String(length=253), nullable=True),
    sa.Column('from_state', sa.String(length=16), nullable=False),
    sa.Column('to_state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.String(length=64), nullable=False),
    sa.Column('message', sa.String(length=2048), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_events'))
    )
    op.create_index('ix_events_job_id_id', 'events', ['job_id', 'id'], unique=False)
    op.create_index('ix_events_server_id_id', 'events', ['server_id', 'id'], unique=False)
    op.create_table('jobs',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=253), nullable=False),
    sa.Column('user', sa.String(length=128), nullable=False),
    sa.Column('queue', sa.String(length=128), nullable=False),
    sa.Column('command', sa.JSON(), nullable=False),
    sa.Column('env', sa.JSON(), nullable=False),
    sa.Column('gpus_per_worker', sa.Integer(), nullable=False),
    sa.Column('min_workers', sa.Integer(), nullable=False),
    sa.Column('max_workers', sa.Integer(), nullable=False),
    sa.Column('priority', sa.Integer(), nullable=False),
    sa.Column('deadline', sa.Double(), nullable=True),
    sa.Column('throughput', sa.JSON(), nullable=False),
    sa.Column('max_runtime_s', sa.Double(), nullable=True),
    sa.Column('restart_policy', sa.String(length=16), nullable=False),
    sa.Column('max_restarts', sa.Integer(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=128), nullable=True),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('state_reason', sa.String(length=64), nullable=False),
    sa.Column('state_message', sa.String(length=1024), nullable=False),
    sa.Column('pending_reason', sa.String(length=1024), nullable=False),
    sa.Column('num_workers', sa.Integer(), nullable=False),
    sa.Column('restarts', sa.Integer(), nullable=False),
    sa.Column('preemptions', sa.Integer(), nullable=False),
    sa.Column('submitted_at', sa.Double(), nullable=False),
    sa.Column('started_at', sa.Double(), nullable=True),
    sa.Column('finished_at', sa.Double(), nullable=True),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.CheckConstraint("state IN ('PENDING','RUNNING','SCALING','PREEMPTED','COMPLETED','FAILED','CANCELLED')", name=op.f('ck_jobs_state_known')),
    sa.CheckConstraint('gpus_per_worker >= 1', name=op.f('ck_jobs_gpus_per_worker_positive')),
    sa.CheckConstraint('max_workers >= min_workers', name=op.f('ck_jobs_max_not_below_min')),
    sa.CheckConstraint('min_workers >= 1', name=op.f('ck_jobs_min_workers_positive')),
    sa.CheckConstraint('num_workers >= 0 AND num_workers <= max_workers', name=op.f('ck_jobs_num_workers_in_range')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs')),
    sa.UniqueConstraint('idempotency_key', name=op.f('uq_jobs_idempotency_key'))
    )
    op.create_index('ix_jobs_queue_id', 'jobs', ['queue', 'id'], unique=False)
    op.create_index('ix_jobs_state_id', 'jobs', ['state', 'id'], unique=False)
    op.create_index('ix_jobs_user_id', 'jobs', ['user', 'id'], unique=False)
    op.create_table('scheduler_terms',
    sa.Column('epoch', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('started_at', sa.Double(), nullable=False),
    sa.Column('holder', sa.String(length=253), nullable=False),
    sa.PrimaryKeyConstraint('epoch', name=op.f('pk_scheduler_terms'))
    )
    op.create_table('servers',
    sa.Column('id', sa.String(length=253), nullable=False),
    sa.Column('hostname', sa.String(length=253), nullable=False),
    sa.Column('pool', sa.String(length=16), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('state_reason', sa.String(length=1024), nullable=False),
    sa.Column('state_before_fault', sa.String(length=16), nullable=True),
    sa.Column('agent_address', sa.String(length=253), nullable=False),
    sa.Column('agent_version', sa.String(length=64), nullable=False),
    sa.Column('registered_at', sa.Double(), nullable=False),
    sa.Column('last_seen_at', sa.Double(), nullable=False),
    sa.Column('desired_generation', sa.BigInteger(), nullable=False),
    sa.Column('observed_generation', sa.BigInteger(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.CheckConstraint("(pool = 'TRAINING' AND state IN ('TRAINING','LOST','UNHEALTHY')) OR (pool = 'INFERENCE' AND state <> 'TRAINING')", name=op.f('ck_servers_state_matches_pool')),
    sa.CheckConstraint("pool IN ('TRAINING','INFERENCE')", name=op.f('ck_servers_pool_known')),
    sa.CheckConstraint("state IN ('TRAINING','SERVING','DRAINING','LOANED','RECLAIMING','LOST','UNHEALTHY')", name=op.f('ck_servers_state_known')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_servers'))
    )
    op.create_table('gpus',
    sa.Column('server_id', sa.String(length=253), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('uuid', sa.String(length=128), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('memory_total_bytes', sa.BigInteger(), nullable=False),
    sa.Column('healthy', sa.Boolean(), nullable=False),
    sa.Column('health_reason', sa.String(length=256), nullable=False),
    sa.Column('utilization', sa.Double(), nullable=False),
    sa.Column('memory_used_bytes', sa.BigInteger(), nullable=False),
    sa.Column('temperature_c', sa.Double(), nullable=False),
    sa.CheckConstraint('"index" >= 0', name=op.f('ck_gpus_index_non_negative')),
    sa.ForeignKeyConstraint(['server_id'], ['servers.id'], name=op.f('fk_gpus_server_id_servers'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('server_id', 'index', name=op.f('pk_gpus')),
    sa.UniqueConstraint('uuid', name=op.f('uq_gpus_uuid'))
    )
    op.create_table('loans',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('server_id', sa.String(length=253), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.String(length=1024), nullable=False),
    sa.Column('started_at', sa.Double(), nullable=False),
    sa.Column('ended_at', sa.Double(), nullable=True),
    sa.Column('hard_deadline', sa.Double(), nullable=True),
    sa.CheckConstraint("(state = 'RETURNED') = (ended_at IS NOT NULL)", name=op.f('ck_loans_ended_iff_returned')),
    sa.CheckConstraint("state IN ('ACTIVE','RECLAIMING','RETURNED')", name=op.f('ck_loans_state_known')),
    sa.ForeignKeyConstraint(['server_id'], ['servers.id'], name=op.f('fk_loans_server_id_servers'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_loans'))
    )
    op.create_index('uq_loans_one_open_per_server', 'loans', ['server_id'], unique=True, sqlite_where=sa.text("state <> 'RETURNED'"), postgresql_where=sa.text("state <> 'RETURNED'"))
    op.create_table('allocations',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('job_id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('server_id', sa.String(length=253), nullable=False),
    sa.Column('gpu_index', sa.Integer(), nullable=False),
    sa.Column('allocated_at', sa.Double(), nullable=False),
    sa.CheckConstraint('rank >= 0', name=op.f('ck_allocations_rank_non_negative')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_allocations_job_id_jobs'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['server_id', 'gpu_index'], ['gpus.server_id', 'gpus.index'], name=op.f('fk_allocations_server_id_gpu_index_gpus'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_allocations')),
    sa.UniqueConstraint('server_id', 'gpu_index', name='uq_allocations_one_worker_per_gpu')
    )
    op.create_index('ix_allocations_job_id', 'allocations', ['job_id'], unique=False)
    _create_append_only_guard()


def downgrade() -> None:
    _drop_append_only_guard()
    op.drop_index('ix_allocations_job_id', table_name='allocations')
    op.drop_table('allocations')
    op.drop_index('uq_loans_one_open_per_server', table_name='loans', sqlite_where=sa.text("state <> 'RETURNED'"), postgresql_where=sa.text("state <> 'RETURNED'"))
    op.drop_table('loans')
    op.drop_table('gpus')
    op.drop_table('servers')
    op.drop_table('scheduler_terms')
    op.drop_index('ix_jobs_user_id', table_name='jobs')
    op.drop_index('ix_jobs_state_id', table_name='jobs')
    op.drop_index('ix_jobs_queue_id', table_name='jobs')
    op.drop_table('jobs')
    op.drop_index('ix_events_server_id_id', table_name='events')
    op.drop_index('ix_events_job_id_id', table_name='events')
    op.drop_table('events')
    op.drop_table('demand_reports')


def _create_append_only_guard() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE FUNCTION aryl_events_append_only() RETURNS trigger AS $$
            BEGIN
                RAISE EXCEPTION 'events is append-only: % refused', TG_OP;
            END;
            $$ LANGUAGE plpgsql
            """
        )
        op.execute(
            "CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events "
            "FOR EACH ROW EXECUTE FUNCTION aryl_events_append_only()"
        )
    else:
        for operation in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER events_no_{operation.lower()} BEFORE {operation} ON events "
                f"BEGIN SELECT RAISE(ABORT, 'events is append-only: {operation} refused'); END"
            )


def _drop_append_only_guard() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_append_only ON events")
        op.execute("DROP FUNCTION IF EXISTS aryl_events_append_only()")
    else:
        for operation in ("update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS events_no_{operation}")
