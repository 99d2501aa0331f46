"""What the scheduler's Prometheus gauges read at each scrape (``scheduler_service.metrics``): job
counts by queue and state, GPUs per server and model, their allocation by queue and utilisation.

Each read is a handful of GROUP BY queries on one consistent view; nothing is cached, so a scrape
shows the database as it is. Never: write.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.store import models as m


@dataclass(frozen=True)
class GpuGroup:
    """The GPUs of one server and model: how many, how many healthy, their mean utilisation (0..1)."""

    server_id: str
    pool: str
    model: str
    gpus: int
    healthy: int
    utilization: float


@dataclass(frozen=True)
class AllocationGroup:
    """The GPUs of one server and model that one queue's jobs hold, and their mean utilisation (0..1)."""

    server_id: str
    model: str
    queue: str
    gpus: int
    utilization: float


@dataclass(frozen=True)
class ClusterGauges:
    jobs: dict[tuple[str, str], int]  # (queue, state) -> jobs
    servers: dict[tuple[str, str], int]  # (pool, state) -> servers
    gpus: list[GpuGroup]
    allocated: list[AllocationGroup]


def cluster_gauges(session: Session) -> ClusterGauges:
    j, s, g, a = m.JOBS.c, m.SERVERS.c, m.GPUS.c, m.ALLOCATIONS.c
    jobs = {(row.queue, row.state): row.n for row in session.execute(
        sa.select(j.queue, j.state, sa.func.count().label("n")).group_by(j.queue, j.state))}
    servers = {(row.pool, row.state): row.n for row in session.execute(
        sa.select(s.pool, s.state, sa.func.count().label("n")).group_by(s.pool, s.state))}
    gpus = [
        GpuGroup(row.server_id, row.pool, row.model, row.n, int(row.healthy or 0), float(row.util or 0.0))
        for row in session.execute(
            sa.select(g.server_id, s.pool, g.model, sa.func.count().label("n"),
                      sa.func.sum(sa.case((g.healthy, 1), else_=0)).label("healthy"),
                      sa.func.avg(g.utilization).label("util"))
            .join(m.SERVERS, s.id == g.server_id)
            .group_by(g.server_id, s.pool, g.model).order_by(g.server_id, g.model))
    ]
    allocated = [
        AllocationGroup(row.server_id, row.model, row.queue, row.n, float(row.util or 0.0))
        for row in session.execute(
            sa.select(a.server_id, g.model, j.queue, sa.func.count().label("n"),
                      sa.func.avg(g.utilization).label("util"))
            .join(m.GPUS, sa.and_(g.server_id == a.server_id, g.index == a.gpu_index))
            .join(m.JOBS, j.id == a.job_id)
            .group_by(a.server_id, g.model, j.queue).order_by(a.server_id, g.model, j.queue))
    ]
    return ClusterGauges(jobs, servers, gpus, allocated)


def first_start_waits(session: Session, job_ids: list[int], since: float) -> list[tuple[str, float]]:
    """(queue, seconds from submission to start) of those of ``job_ids`` that started for the first
    time at or after ``since`` (a restart or a start after preemption keeps its first ``started_at``)."""
    if not job_ids:
        return []
    j = m.JOBS.c
    rows = session.execute(
        sa.select(j.queue, j.submitted_at, j.started_at).where(j.id.in_(job_ids), j.started_at >= since))
    return [(row.queue, max(0.0, row.started_at - row.submitted_at)) for row in rows]
