"""SQLAlchemy models: the scheduler's persistent state.

Nouns:
- ``Job``: a submitted training job, its spec and lifecycle state.
- ``Server`` / ``Gpu``: a GPU server (training- or inference-owned) and its GPUs, as agents report them.
- ``Allocation``: one GPU held by one worker (rank) of a job. The unique key on (server_id, gpu_index)
  makes it impossible for the database to hold one GPU for two workers, whatever Python does.
- ``Loan``: an inference server lent to training; at most one open loan per server (partial index).
- ``Event``: the append-only log of every state change with its reason; triggers refuse UPDATE/DELETE.
- ``DemandReport``: inference demand as each router reported it (history; ``store.inference`` combines the fresh ones).
- ``SchedulerTerm``: one row per scheduler term (a start, or a standby taking over); its id is the epoch
  agents use for fencing.
- ``LeaderLease``: the one row saying which scheduler leads, in which term, until when (PostgreSQL).

The schema is created only by the Alembic migrations in ``migrations/``; these models must match them
(``tests/store/test_migrations.py`` checks). Times are UNIX seconds (float) so SQLite and PostgreSQL agree.
"""

from __future__ import annotations

from typing import Any, ClassVar, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    false,
    func,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments INTEGER PRIMARY KEY; PostgreSQL gets a BIGINT identity.
BigId = BigInteger().with_variant(Integer(), "sqlite")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(253))
    user: Mapped[str] = mapped_column(String(128))
    queue: Mapped[str] = mapped_column(String(128))
    command: Mapped[list[Any]] = mapped_column(JSON)
    env: Mapped[dict[str, Any]] = mapped_column(JSON)
    gpus_per_worker: Mapped[int] = mapped_column(Integer)
    min_workers: Mapped[int] = mapped_column(Integer)
    max_workers: Mapped[int] = mapped_column(Integer)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    deadline: Mapped[float | None] = mapped_column(Double)
    throughput: Mapped[dict[str, Any]] = mapped_column(JSON)
    max_runtime_s: Mapped[float | None] = mapped_column(Double)
    restart_policy: Mapped[str] = mapped_column(String(16))
    max_restarts: Mapped[int] = mapped_column(Integer, default=0)
    # Unique per user (``uq_jobs_user_idempotency_key``): a retry finds its own job, never another user's.
    idempotency_key: Mapped[str | None] = mapped_column(String(128))

    state: Mapped[str] = mapped_column(String(16))
    state_reason: Mapped[str] = mapped_column(String(64), default="")
    state_message: Mapped[str] = mapped_column(String(1024), default="")
    pending_reason: Mapped[str] = mapped_column(String(1024), default="")
    num_workers: Mapped[int] = mapped_column(Integer, default=0)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    preemptions: Mapped[int] = mapped_column(Integer, default=0)
    submitted_at: Mapped[float] = mapped_column(Double)
    started_at: Mapped[float | None] = mapped_column(Double)
    finished_at: Mapped[float | None] = mapped_column(Double)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # Last start, restart or resize: the policy leaves recently resized jobs alone (anti-thrashing).
    last_resized_at: Mapped[float | None] = mapped_column(Double)
    # When its resizes and preemptions of the last hour were applied (core.protection's disruption cap)
    disruptions: Mapped[list[Any] | None] = mapped_column(JSON)
    # Progress as the job reports it, in the unit of its throughput hints' ``total_work``.
    work_done: Mapped[float] = mapped_column(Double, default=0.0, server_default="0")
    # Work since the last checkpoint is what a preemption loses.
    last_checkpoint_at: Mapped[float | None] = mapped_column(Double)
    # Bumped whenever the job's workers must (re)start (a start or a resize); agents identify a worker
    # by (job, rank, incarnation), so reports about an older incarnation are recognised as history.
    incarnation: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Progress at the last checkpoint the workers reported (``last_checkpoint_at`` is when it was seen).
    checkpoint_work: Mapped[float | None] = mapped_column(Double)
    # Exit status per rank (as a string key) of the current incarnation's workers that have exited.
    worker_exits: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Rank (string key) -> server of the latest placement; kept after the job ends, to find its logs.
    rank_servers: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Where the workers start (absolute path on the server; NULL: the agent's per-job directory). With
    # ``working_dir_if_exists`` it is a default used only where it exists; without, a server lacking it fails the job.
    working_dir: Mapped[str | None] = mapped_column(String(4096))
    working_dir_if_exists: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Why a running elastic job keeps its size (``REASON: message``; '' when nothing holds it back).
    # The command as list views show it (``records.command_preview``): a page never reads command or env.
    command_preview: Mapped[list[Any] | None] = mapped_column(JSON)
    size_note: Mapped[str] = mapped_column(String(1024), default="", server_default=text("''"))
    # When the scheduler last saw the job's progress change, and the job's progress window
    # (``core.snapshot.ProgressWindow``): ``window_work`` at ``window_at``, its first report in incarnation
    # ``window_incarnation`` (at ``window_workers`` workers); ``window_reports`` reports with new progress since.
    progress_at: Mapped[float | None] = mapped_column(Double)
    window_work: Mapped[float | None] = mapped_column(Double)
    window_at: Mapped[float | None] = mapped_column(Double)
    window_incarnation: Mapped[int | None] = mapped_column(BigInteger)
    window_workers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    window_reports: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A job array's element (``SubmitJobs`` with array indices): the array's id, the job id of its
    # first element, and this job's index in it; NULL for a job not in an array.
    array_job_id: Mapped[int | None] = mapped_column(BigId)
    array_index: Mapped[int | None] = mapped_column(Integer)

    # Its priority class and the class's value at submission (``core.quota``); its GPU types (NULL: any).
    priority_class: Mapped[str] = mapped_column(String(63), default="", server_default=text("''"))
    priority_value: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    gpu_types: Mapped[list[Any] | None] = mapped_column(JSON)

    # Goodput (migration 0014, issue 17): its declared batch limits (NULL: it does not adapt its batch);
    # the batch it runs with (a policy's choice, else the default) and the GPU count it was set for (NULL:
    # none yet; ``core.batch.job_batch``);
    # what its rank 0 reported (``store.goodput``: step times per configuration, gradient statistics).
    batch_init: Mapped[int | None] = mapped_column(Integer)
    batch_max: Mapped[int | None] = mapped_column(Integer)
    batch_max_local: Mapped[int | None] = mapped_column(Integer)
    batch_local: Mapped[int | None] = mapped_column(Integer)
    batch_accum: Mapped[int | None] = mapped_column(Integer)
    batch_replicas: Mapped[int | None] = mapped_column(Integer)
    goodput_reports: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    __table_args__ = (
        CheckConstraint("gpus_per_worker >= 1", name="gpus_per_worker_positive"),
        CheckConstraint("min_workers >= 1", name="min_workers_positive"),
        CheckConstraint("max_workers >= min_workers", name="max_not_below_min"),
        CheckConstraint("num_workers >= 0 AND num_workers <= max_workers", name="num_workers_in_range"),
        CheckConstraint(
            "state IN ('PENDING','RUNNING','SCALING','PREEMPTED','COMPLETED','FAILED','CANCELLED')",
            name="state_known",
        ),
        UniqueConstraint("user", "idempotency_key"),
        Index("ix_jobs_state_id", "state", "id"),
        Index("ix_jobs_user_id", "user", "id"),
        Index("ix_jobs_queue_id", "queue", "id"),
        Index("ix_jobs_array_job_id", "array_job_id"),
    )
    # Optimistic concurrency: every UPDATE checks and bumps ``version`` (StaleDataError on a race).
    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012 - read once by the mapper


def _registered_at(context: Any) -> float:
    return context.get_current_parameters()["registered_at"]


class Server(Base):
    __tablename__ = "servers"

    id: Mapped[str] = mapped_column(String(253), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(253))
    pool: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    state_reason: Mapped[str] = mapped_column(String(1024), default="")
    # The state a LOST/UNHEALTHY server returns to when it recovers.
    state_before_fault: Mapped[str | None] = mapped_column(String(16))
    agent_address: Mapped[str] = mapped_column(String(253), default="")
    agent_version: Mapped[str] = mapped_column(String(64), default="")
    registered_at: Mapped[float] = mapped_column(Double)
    # When its agent last reported and the newest generation it applied: ``ServerHeartbeat``, a row of
    # their own, so that a report never holds this row's lock (which every decision's generation bump takes).
    desired_generation: Mapped[int] = mapped_column(BigInteger, default=1)
    version: Mapped[int] = mapped_column(Integer, default=1)
    # When it entered its current state (loan hysteresis, drain timeouts). Defaults to its registration
    # time; the server default 0 ("unknown") only serves rows written without the models.
    state_changed_at: Mapped[float] = mapped_column(Double, default=_registered_at, server_default="0")
    # Empty or None: not served / not an inference server (nullable so the migration needs no default).
    logs_address: Mapped[str | None] = mapped_column(String(253))
    inference_endpoint: Mapped[str | None] = mapped_column(String(512))
    # When the router acknowledged that this DRAINING server has nothing in flight (None: not yet).
    drained_at: Mapped[float | None] = mapped_column(Double)
    # What an operator or a leaving agent asked (``core.snapshot.AdminState``: '' schedulable, CORDONED,
    # DRAINING, LEFT, DELETING), why and since when; DRAINING/DELETING: when the jobs that cannot shrink
    # off are preempted (None: they are left to finish).
    admin_state: Mapped[str] = mapped_column(String(16), default="", server_default=text("''"))
    admin_reason: Mapped[str] = mapped_column(String(1024), default="", server_default=text("''"))
    admin_changed_at: Mapped[float | None] = mapped_column(Double)
    drain_deadline: Mapped[float | None] = mapped_column(Double)

    __table_args__ = (
        CheckConstraint("pool IN ('TRAINING','INFERENCE')", name="pool_known"),
        CheckConstraint(
            "state IN ('TRAINING','SERVING','DRAINING','LOANED','RECLAIMING','LOST','UNHEALTHY')",
            name="state_known",
        ),
        # Training-owned servers are never in the inference states, and vice versa.
        CheckConstraint(
            "(pool = 'TRAINING' AND state IN ('TRAINING','LOST','UNHEALTHY')) OR "
            "(pool = 'INFERENCE' AND state <> 'TRAINING')",
            name="state_matches_pool",
        ),
    )
    __mapper_args__ = {"version_id_col": version}  # noqa: RUF012 - read once by the mapper


class ServerHeartbeat(Base):
    """What each status report writes about its server: when it arrived (``last_seen_at``) and the newest
    desired generation the agent says it applied (``observed_generation``). Kept apart from ``servers``
    because a report ran every few seconds per server and locked that row for its whole transaction, so a
    decision's generation bump of 100 servers kept finding one of them held and waited for the report to
    commit: every agent of the decision waited with it. Registration writes the row; a server without one
    (written by other means) reads as generation 0, last seen when it registered."""

    __tablename__ = "server_heartbeats"

    server_id: Mapped[str] = mapped_column(ForeignKey("servers.id", ondelete="CASCADE"), primary_key=True)
    last_seen_at: Mapped[float] = mapped_column(Double)
    observed_generation: Mapped[int] = mapped_column(BigInteger, default=0)


class Gpu(Base):
    __tablename__ = "gpus"

    server_id: Mapped[str] = mapped_column(ForeignKey("servers.id", ondelete="CASCADE"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    uuid: Mapped[str] = mapped_column(String(128), unique=True)
    model: Mapped[str] = mapped_column(String(128), default="")
    memory_total_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    health_reason: Mapped[str] = mapped_column(String(256), default="")
    utilization: Mapped[float] = mapped_column(Double, default=0.0)
    memory_used_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    temperature_c: Mapped[float] = mapped_column(Double, default=0.0)

    __table_args__ = (CheckConstraint('"index" >= 0', name="index_non_negative"),)


class Allocation(Base):
    __tablename__ = "allocations"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="RESTRICT"))
    rank: Mapped[int] = mapped_column(Integer)
    server_id: Mapped[str] = mapped_column(String(253))
    gpu_index: Mapped[int] = mapped_column(Integer)
    allocated_at: Mapped[float] = mapped_column(Double)

    __table_args__ = (
        # The guarantee: one GPU, at most one worker.
        UniqueConstraint("server_id", "gpu_index", name="uq_allocations_one_worker_per_gpu"),
        ForeignKeyConstraint(["server_id", "gpu_index"], ["gpus.server_id", "gpus.index"], ondelete="RESTRICT"),
        CheckConstraint("rank >= 0", name="rank_non_negative"),
        Index("ix_allocations_job_id", "job_id"),
    )


class MasterPort(Base):
    """A job's rendezvous port (``MASTER_PORT``) on the server of its rank 0. The primary key is the
    guarantee: one port of one server, at most one job. A row whose job no longer has rank 0 there is
    stale and reused by the next allocation on that server (``store.ports``)."""

    __tablename__ = "master_ports"

    server_id: Mapped[str] = mapped_column(String(253), primary_key=True)
    port: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    allocated_at: Mapped[float] = mapped_column(Double)

    __table_args__ = (CheckConstraint("port >= 1 AND port <= 65535", name="port_valid"),)


LOANS_TOPIC = "LOANS"  # SchedulerNote: why the last cycle loaned no (further) server


class SchedulerNote(Base):
    """A standing cluster-level decision by topic (``LOANS``: why no server is loaned), with the time
    it was first made; rewritten only when the decision changes."""

    __tablename__ = "scheduler_notes"

    topic: Mapped[str] = mapped_column(String(32), primary_key=True)
    reason: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(String(1024))
    since: Mapped[float] = mapped_column(Double)


class Loan(Base):
    __tablename__ = "loans"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    server_id: Mapped[str] = mapped_column(ForeignKey("servers.id", ondelete="RESTRICT"))
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(1024), default="")
    started_at: Mapped[float] = mapped_column(Double)
    ended_at: Mapped[float | None] = mapped_column(Double)
    hard_deadline: Mapped[float | None] = mapped_column(Double)

    __table_args__ = (
        CheckConstraint("state IN ('ACTIVE','RECLAIMING','RETURNED')", name="state_known"),
        CheckConstraint("(state = 'RETURNED') = (ended_at IS NOT NULL)", name="ended_iff_returned"),
        # At most one open loan per server.
        Index(
            "uq_loans_one_open_per_server",
            "server_id",
            unique=True,
            sqlite_where=text("state <> 'RETURNED'"),
            postgresql_where=text("state <> 'RETURNED'"),
        ),
    )


class Event(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Double)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    server_id: Mapped[str | None] = mapped_column(String(253))
    from_state: Mapped[str] = mapped_column(String(16), default="")
    to_state: Mapped[str] = mapped_column(String(16), default="")
    reason: Mapped[str] = mapped_column(String(64), default="")
    message: Mapped[str] = mapped_column(String(2048), default="")
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # The authenticated caller (role:name) whose RPC wrote it; "" for the scheduler's own (migration 0012).
    actor: Mapped[str] = mapped_column(String(160), default="", server_default=text("''"))

    __table_args__ = (
        Index("ix_events_job_id_id", "job_id", "id"),
        Index("ix_events_server_id_id", "server_id", "id"),
    )


class DemandReport(Base):
    __tablename__ = "demand_reports"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Double)
    servers_needed: Mapped[int] = mapped_column(Integer)
    observed_rps: Mapped[float] = mapped_column(Double)
    source: Mapped[str] = mapped_column(String(253), default="")

    __table_args__ = (
        CheckConstraint("servers_needed >= 0", name="servers_needed_non_negative"),
        CheckConstraint("observed_rps >= 0", name="observed_rps_non_negative"),
    )


class SchedulerTerm(Base):
    __tablename__ = "scheduler_terms"

    epoch: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    started_at: Mapped[float] = mapped_column(Double)
    holder: Mapped[str] = mapped_column(String(253), default="")


class LeaderLease(Base):
    """The one row (id 1) of the leader lease (``store.lease``): who leads, in which term, until when
    (seconds since the UNIX epoch by the database's clock)."""

    __tablename__ = "leader_lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    holder: Mapped[str] = mapped_column(String(253))
    epoch: Mapped[int] = mapped_column(BigId)
    acquired_at: Mapped[float] = mapped_column(Double)
    expires_at: Mapped[float] = mapped_column(Double)

    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)


class SchedulerReplica(Base):
    """One scheduler replica on this database, leader or standby (``store.replicas``): its advertised address
    (``ha.advertise_address``), where its desired-state streams' own process serves ('' while none does), and
    its last heartbeat (seconds since the UNIX epoch by the database's clock). Written by each replica's lease
    thread; read by the leader to spread the agents' streams over the live replicas' processes."""

    __tablename__ = "scheduler_replicas"

    address: Mapped[str] = mapped_column(String(253), primary_key=True)
    push_address: Mapped[str] = mapped_column(String(253), default="")
    started_at: Mapped[float] = mapped_column(Double)
    heartbeat_at: Mapped[float] = mapped_column(Double)


# The models' Core tables, for the store's Core statements (batched INSERT/UPDATE/DELETE without the
# ORM's per-row work). ``Model.__table__`` is typed as any FromClause; these are Tables.
JOBS = cast(Table, Job.__table__)
SERVERS = cast(Table, Server.__table__)
HEARTBEATS = cast(Table, ServerHeartbeat.__table__)
# Servers with their heartbeats, for reads of either (a server that never reported since its registration has
# no heartbeat row: generation 0 observed, last seen when it registered).
SERVERS_WITH_HEARTBEATS = SERVERS.outerjoin(HEARTBEATS, HEARTBEATS.c.server_id == SERVERS.c.id)
OBSERVED_GENERATION = func.coalesce(HEARTBEATS.c.observed_generation, 0)
LAST_SEEN_AT = func.coalesce(HEARTBEATS.c.last_seen_at, SERVERS.c.registered_at)
GPUS = cast(Table, Gpu.__table__)
ALLOCATIONS = cast(Table, Allocation.__table__)
LOANS = cast(Table, Loan.__table__)
MASTER_PORTS = cast(Table, MasterPort.__table__)
SCHEDULER_NOTES = cast(Table, SchedulerNote.__table__)
EVENTS = cast(Table, Event.__table__)
DEMAND_REPORTS = cast(Table, DemandReport.__table__)


class Queue(Base):
    """An admin-configured queue (``core.quota``): guaranteed GPUs (NULL, "default" only: the rest, what
    the other queues leave), a borrow limit (NULL: none), a cohort ('' none) and fair share between its
    users. "default" exists without a row."""

    __tablename__ = "queues"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    cohort: Mapped[str] = mapped_column(String(63), default="", server_default=text("''"))
    quota_gpus: Mapped[int | None] = mapped_column(Integer)
    borrow_limit_gpus: Mapped[int | None] = mapped_column(Integer)
    fair_share: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    created_at: Mapped[float] = mapped_column(Double)
    updated_at: Mapped[float] = mapped_column(Double)

    __table_args__ = (
        CheckConstraint("quota_gpus >= 0", name="quota_not_negative"),
        CheckConstraint("borrow_limit_gpus IS NULL OR borrow_limit_gpus >= 0", name="borrow_limit_not_negative"),
    )


QUEUES = cast(Table, Queue.__table__)
