"""The scheduler service's typed configuration, built once at start-up from a file (TOML or YAML)
plus the environment.

The sections below are the scheduler's own; how they are loaded is shared by every Aryl program
(``aryl_common.config``). Precedence, highest first: environment variables, the config file, the
defaults below. Environment variables are ``ARYL_<SECTION>__<KEY>`` (e.g. ``ARYL_DATABASE__URL``);
the file is named by ``--config`` or ``ARYL_CONFIG``. Unknown keys are errors, so a typo never
silently falls back to a default. Nothing else in the service reads the environment.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import ClassVar, Literal, get_type_hints

from pydantic import Field, create_model, field_validator, model_validator

from aryl_common.config import ArylSettings, ConfigSection, LoggingConfig, load_settings
from aryl_common.metrics import MetricsConfig
from aryl_common.security import SECURE_BY_DEFAULT
from scheduler_service.core.demand_forecast import DAY_S, ForecastSettings
from scheduler_service.core.params import PolicyParams


class ServerConfig(ConfigSection):
    listen: str = Field("127.0.0.1:50051", description="host:port the gRPC server binds")
    max_message_bytes: int = Field(16 * 1024 * 1024, gt=0, description="max gRPC message size, both ways")
    worker_threads: int = Field(16, gt=0, description="threads serving unary RPCs")
    accept_loops: int = Field(
        4, ge=1, le=64,
        description="gRPC servers sharing server.listen's port (SO_REUSEPORT; connections spread over them), each "
                    "taking new calls on its own: grpc's asyncio server takes one call per turn of the event loop, so "
                    "with one, calls wait inside gRPC under load (status reports for seconds) before any handler "
                    "sees them; 1: one server, the port not shared",
    )
    max_concurrent_streams: int = Field(
        4096, gt=0,
        description="concurrent calls per client connection (gRPC's HTTP/2 stream limit); watch streams have "
                    "their own limits below",
    )
    shutdown_grace_s: float = Field(5.0, ge=0, description="time in-flight RPCs get on shutdown")
    max_watch_streams: int = Field(
        1024, gt=0,
        description="WatchEvents and WatchServingPool streams open at once, from all clients; beyond it a new one is "
                    "refused with RESOURCE_EXHAUSTED (agents' WatchDesiredState streams are not counted)",
    )
    max_watch_streams_per_client: int = Field(
        64, gt=0,
        description="WatchEvents and WatchServingPool streams open at once per client (the peer's host, every port "
                    "and connection together); beyond it a new one is refused with RESOURCE_EXHAUSTED",
    )
    max_watch_streams_per_principal: int = Field(
        64, gt=0,
        description="WatchEvents and WatchServingPool streams open at once per authenticated caller (role:name), "
                    "whatever addresses it connects from; beyond it a new one is refused with RESOURCE_EXHAUSTED "
                    "(max_watch_streams_per_client counts callers without identities, security.insecure)",
    )
    max_watch_streams_reserved: int = Field(
        64, ge=0,
        description="the last places of max_watch_streams, kept for routers (WatchServingPool) and admins: users, "
                    "and callers without identities, are refused RESOURCE_EXHAUSTED once the rest are taken",
    )
    desired_state_port: int = Field(
        -1, ge=-1, le=65535,
        description="the agents' desired-state streams (WatchDesiredState) served by a process of their own as well, "
                    "on this port of server.listen's host, so that a push never waits for the scheduler's "
                    "interpreter (its cycles, commits and status reports); RegisterServer names the port to agents, "
                    "which watch the scheduler itself where it is unreachable. 0: a port the OS picks (kept when the "
                    "process is started again); -1: off, the scheduler serves the streams alone",
    )

    @model_validator(mode="after")
    def _desired_state_port_of_its_own(self) -> ServerConfig:
        listen_port = self.listen.rpartition(":")[2]
        if self.desired_state_port > 0 and listen_port == str(self.desired_state_port):
            raise ValueError(
                f"server.desired_state_port ({self.desired_state_port}) must differ from server.listen's port "
                f"({self.listen}): the desired-state streams' process listens beside the scheduler, on the same "
                "host; use another port, 0 (any free port) or -1 (off)"
            )
        return self


def default_database_url() -> str:
    """The embedded default: a SQLite file under ``./.aryl`` (a one-machine try-out)."""
    return f"sqlite:///{Path('.aryl') / 'aryl.db'}"


class DatabaseConfig(ConfigSection):
    url: str = Field(default_factory=default_database_url, description="SQLAlchemy URL")
    auto_migrate: bool = Field(True, description="run Alembic migrations to head at start-up")
    statement_timeout_ms: int = Field(5000, gt=0, description="per-statement deadline (PostgreSQL)")
    lock_timeout_ms: int = Field(
        5000, gt=0, description="longest a statement waits for a row or table lock before giving up (PostgreSQL)"
    )
    transaction_timeout_ms: int = Field(
        30000, gt=0,
        description="bound on every transaction, so none holds its locks for long: a statement issued past it is "
                    "refused and the transaction rolled back (both databases); PostgreSQL also ends a session left "
                    "idle inside a transaction this long",
    )
    pool_size: int = Field(20, gt=0)


class SchedulingConfig(ConfigSection):
    policy: str = Field("aryl", description="a registered policy's name (docs/policies.md lists every one; an "
                                            "unknown name is refused at start-up, naming them all)")
    cycle_interval_s: float = Field(2.0, gt=0, description="periodic cycle tick; events also trigger cycles")
    min_cycle_gap_s: float = Field(
        0.05, ge=0, description="least time between two cycles: a burst of events is batched into one cycle"
    )
    max_cycle_duty: float = Field(
        0.5, gt=0, le=1,
        description="during a burst of events, cycles take at most this share of the time: after a cycle that "
                    "took T seconds the next starts no sooner than T x (1/share - 1) later (and min_cycle_gap_s), "
                    "leaving the rest to status reports and pushes on a large cluster; after cycles that placed "
                    "none of the waiting jobs, newly queued jobs alone wake the next one later still, the pause "
                    "doubling up to cycle_interval_s (any other event ends that wait)",
    )
    seed: int = Field(0, description="seed handed to the policy; same snapshot + seed -> same plan")
    forecast_interval_s: float = Field(
        10.0, ge=0,
        description="the ETA forecast (Job.eta_start/eta_finish: the policy run forward on the cluster as it is) "
                    "follows a cycle no sooner than this after the previous forecast began; 0: after every cycle "
                    "(one at a time, on a thread of its own)",
    )
    deadline_admission: Literal["off", "warn", "reject"] = Field(
        "warn",
        description="what SubmitJob does with a job's deadline: off (nothing), warn (answers with the predicted "
                    "finish and whether the deadline looks feasible), reject (as warn, and refuses with "
                    "FAILED_PRECONDITION a job that would miss it even at its most workers)",
    )
    default_grace_period_s: float = Field(30.0, ge=0, description="SIGTERM -> SIGKILL for workers")
    master_port_min: int = Field(
        29500, gt=0, lt=65536,
        description="lowest MASTER_PORT a job may get; each job gets one port of master_port_min..master_port_max "
                    "not used by another job whose rank 0 runs on the same server",
    )
    master_port_max: int = Field(
        29999, gt=0, lt=32768,
        description="highest MASTER_PORT; below 32768, where Linux's ephemeral (client source) ports begin",
    )
    priority_classes: dict[str, int] = Field(
        default_factory=lambda: {"low": -100, "normal": 0, "high": 100},
        description="priority classes a job may name (spec.priority_class) and their values: within a queue a "
                    "higher class goes first and may preempt lower classes; a job keeps the value it was "
                    "submitted with; no class is 0",
    )

    gpu_speeds: dict[str, float] = Field(
        default_factory=dict,
        description="declared relative speed of each GPU model, as NVML names it (e.g. {\"NVIDIA A100-SXM4-80GB\": "
                    "1.0, \"Tesla T4\": 0.25}): policies that weigh GPU types read it (sia, gavel), and a job's "
                    "speed on a model it has not run on is bootstrapped from it (arylctl job: Speed by GPU type)",
    )

    @field_validator("gpu_speeds")
    @classmethod
    def _speeds_positive(cls, speeds: dict[str, float]) -> dict[str, float]:
        bad = {name: value for name, value in speeds.items() if not (value > 0 and math.isfinite(value)) or not name}
        if bad:
            raise ValueError(f"scheduling.gpu_speeds needs a GPU model name and a finite speed > 0 for each entry "
                             f"(got {bad})")
        return speeds

    @model_validator(mode="after")
    def _master_ports_ordered(self) -> SchedulingConfig:
        if self.master_port_max < self.master_port_min:
            raise ValueError(f"master_port_max ({self.master_port_max}) is below master_port_min "
                             f"({self.master_port_min})")
        return self

    @property
    def master_ports(self) -> range:
        return range(self.master_port_min, self.master_port_max + 1)


# The policies' tunables, as a config section with exactly PolicyParams' fields and defaults.
PolicyConfig = create_model(  # type: ignore[call-overload]  # field definitions built from a dataclass
    "PolicyConfig",
    __base__=ConfigSection,
    __doc__="Tunables of the scheduling policy (scheduler_service.core.params.PolicyParams).",
    **{f.name: (get_type_hints(PolicyParams)[f.name], f.default) for f in fields(PolicyParams)},
)


class AgentsConfig(ConfigSection):
    report_interval_s: float = Field(5.0, gt=0, description="how often agents report status")
    lost_after_s: float = Field(30.0, gt=0, description="silence after which a server is LOST")
    telemetry_write_s: float = Field(
        15.0, ge=0, description="reports that change nothing are written at most this often (GPU load, progress), "
                                "behind their answers on a thread of their own (many servers' in one transaction); "
                                "0: every report, before its answer"
    )
    rpc_timeout_s: float = Field(5.0, gt=0, description="deadline on internal calls")
    desired_state_refresh_s: float = Field(
        30.0, gt=0,
        description="each agent stream checks its desired generation at least this often (jittered), and re-reads "
                    "its whole desired state where it moved, covering writes this process was not told about; pushes "
                    "after this scheduler's own commits are immediate, and an agent whose stream lags the generation "
                    "in its report replies resynchronises by itself",
    )


class EventsConfig(ConfigSection):
    retention_days: int = Field(
        30, ge=0,
        description="events older than this many days are deleted, in chunks, by the housekeeping loop (0: kept "
                    "forever); at least 2, since the database refuses to delete events younger than a day",
    )
    prune_interval_s: float = Field(600.0, gt=0, description="how often the housekeeping loop prunes old events")
    prune_chunk: int = Field(
        5000, gt=0,
        description="events deleted per transaction when pruning: short transactions, short locks (was prune_batch, "
                    "still read under that name)",
    )
    watch_recheck_s: float = Field(
        30.0, gt=0,
        description="event and serving-pool streams are fed by one read after each change this scheduler commits; "
                    "while any stream watches, that read also runs at least this often (covers writes by other "
                    "processes; idle streams cost no database work of their own)",
    )
    watch_buffer: int = Field(
        10000, gt=0,
        description="recent events held in memory for event streams; a stream further behind reads the database",
    )
    watch_stream_buffer: int = Field(
        1000, gt=0,
        description="events queued for one event stream at most: a stream whose client reads more slowly than "
                    "events come falls behind, and beyond this it is ended with RESOURCE_EXHAUSTED (it may resume "
                    "from its last event id) rather than slowing the scheduler or the other streams",
    )

    @field_validator("retention_days")
    @classmethod
    def _retention_above_the_floor(cls, days: int) -> int:
        if days == 1:
            raise ValueError(
                "must be 0 (keep forever) or at least 2: the database refuses to delete events younger than a day, "
                "and a day's margin covers a clock difference between the scheduler and the database"
            )
        return days


class HaConfig(ConfigSection):
    """High availability (``docs/ha.md``), on PostgreSQL only: several schedulers share one database and
    the one holding the leader lease leads; SQLite keeps one scheduler and ignores this section."""

    lease_s: float = Field(
        8.0, gt=0,
        description="how long the leader lease lasts after each renewal, by the database's clock; a standby takes "
                    "over at most about lease_s + renew_s after the leader dies or loses the database",
    )
    renew_s: float = Field(
        2.0, gt=0,
        description="how often the leader renews its lease, and how often a standby looks whether it lapsed",
    )
    advertise_address: str = Field(
        "",
        description="host:port under which this scheduler is named in the lease and to which standbys send "
                    "clients; unique per scheduler; empty: server.listen, its host replaced by this machine's "
                    "hostname when it is a wildcard (0.0.0.0, ::)",
    )
    replica_stale_s: float = Field(
        0.0, ge=0,
        description="a scheduler replica whose heartbeat (written every renew_s, by the database's clock) is older "
                    "than this is no longer named to agents as the desired-state streams' process to watch; "
                    "0: lease_s",
    )

    @model_validator(mode="after")
    def _renewals_fit_in_the_lease(self) -> HaConfig:
        if self.renew_s * 2 > self.lease_s:
            raise ValueError(
                f"ha.renew_s ({self.renew_s:g}) must be at most half of ha.lease_s ({self.lease_s:g}), so that one "
                "late or failed renewal does not cost the leader its lease"
            )
        if self.replica_stale_s and self.renew_s * 2 > self.replica_stale_s:
            raise ValueError(
                f"ha.renew_s ({self.renew_s:g}) must be at most half of ha.replica_stale_s "
                f"({self.replica_stale_s:g}), so that one late or failed heartbeat does not drop a live replica"
            )
        return self

    @property
    def replica_stale_after_s(self) -> float:
        """``replica_stale_s``, or ``lease_s`` where it is 0."""
        return self.replica_stale_s or self.lease_s


class SecurityConfig(ConfigSection):
    """Identities, TLS and secrets (docs/security.md). Secure unless ``insecure`` is set explicitly."""

    insecure: bool = Field(
        not SECURE_BY_DEFAULT,
        description="plaintext gRPC and no identities: any caller may do anything (a development mode; the "
                    "default is TLS + tokens)",
    )
    tls_cert: str = Field("", description="PEM certificate the scheduler presents (arylctl certs init: scheduler.crt)")
    tls_key: str = Field("", description="its PEM private key (scheduler.key)")
    tls_client_ca: str = Field(
        "", description="PEM CA that signs every client certificate (ca.crt); clients without one are refused"
    )
    tokens_file: str = Field(
        "", description="bearer tokens, 'ROLE NAME sha256:HEX' a line, roles user, admin, agent, router (tokens)"
    )
    max_user_priority: int = Field(
        100, description="the highest job priority a user may ask for; above it only an admin may submit"
    )
    allow_loader_env: bool = Field(
        False, description="accept dynamic-loader variables (LD_PRELOAD, LD_LIBRARY_PATH: any LD_*) in a job's env; "
                           "else SubmitJob refuses them, as the agents do unless their [users] allow_loader_env"
    )

    def missing(self) -> list[str]:
        """The settings a secure start lacks (the service refuses to start without them)."""
        if self.insecure:
            return []
        keys = ("tls_cert", "tls_key", "tls_client_ca", "tokens_file")
        return [f"security.{k}" for k in keys if not getattr(self, k)]


class InferenceConfig(ConfigSection):
    """Inference safety (docs/security.md, "Inference safety"): where inference servers may point the
    routers, and how several routers' demand counts (``store.inference``)."""

    endpoint_allow: list[str] = Field(
        default_factory=list,
        description="where a registering inference server's endpoint may point: CIDRs ('10.0.0.0/8', for an "
                    "IP address) and host name patterns ('*.svc.local'); empty: only the registering agent's own "
                    "address or hostname",
    )
    demand_ttl_s: float = Field(
        60.0, gt=0, description="a router's demand report stops counting this long after it was made"
    )
    demand_combine: Literal["max", "sum"] = Field(
        "max", description="several fresh routers: the largest report counts (routers that each see all the "
        "traffic) or their sum (routers that split it)",
    )


class DemandForecastConfig(ConfigSection):
    """The inference demand forecast (``core.demand_forecast``) that the aryl policy reclaims ahead of: one
    per scheduler process, fed by every cycle from the routers' reported need. The defaults are
    ``ForecastSettings``'s; short bins (bin_s = 1, trend_window_s = 20) suit tests and the demo."""

    bin_s: float = Field(
        ForecastSettings.bin_s, gt=0,
        description="seconds per bin of the need's history (a bin holds the highest need seen in it)",
    )
    history_s: float = Field(
        ForecastSettings.history_s, ge=DAY_S,
        description="seconds of history kept (at least a day: the time-of-day anchors need one)",
    )
    season_window_s: float = Field(
        ForecastSettings.season_window_s, gt=0,
        description="the band is learned from the bins within this many seconds of now's time of day on past "
                    "days, and from the last this many seconds",
    )
    trend_window_s: float = Field(
        ForecastSettings.trend_window_s, gt=0,
        description="the need's recent slope is fitted over this many seconds and carried ahead when rising; the "
                    "band never falls below it",
    )
    min_anchors: int = Field(
        ForecastSettings.min_anchors, ge=0,
        description="fewer past moments than this to learn from (the first minutes): the band is the need now "
                    "or its trend",
    )

    def settings(self) -> ForecastSettings:
        return ForecastSettings(**self.model_dump())


class SchedulerConfig(ArylSettings):
    """Everything the scheduler service can be told. One instance, built at start-up."""

    renamed_keys: ClassVar[Mapping[str, str]] = {"events.prune_batch": "events.prune_chunk"}

    server: ServerConfig = ServerConfig()
    database: DatabaseConfig = DatabaseConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    policy: PolicyConfig = PolicyConfig()
    agents: AgentsConfig = AgentsConfig()
    events: EventsConfig = EventsConfig()
    security: SecurityConfig = SecurityConfig()
    ha: HaConfig = HaConfig()
    inference: InferenceConfig = InferenceConfig()
    demand_forecast: DemandForecastConfig = DemandForecastConfig()
    logging: LoggingConfig = LoggingConfig()
    metrics: MetricsConfig = MetricsConfig()  # Prometheus /metrics (scheduler_service.metrics); off by default


def load_config(path: str | os.PathLike[str] | None = None) -> SchedulerConfig:
    """File (or ``$ARYL_CONFIG``) + environment; ``aryl_common.config.ConfigError`` on bad input."""
    return load_settings(SchedulerConfig, path)
