"""Typed configuration, built once at start-up from a file (TOML or YAML) plus the environment.

Precedence, highest first: environment variables, the config file, the defaults below.
Environment variables are ``ARYL_<SECTION>__<KEY>`` (e.g. ``ARYL_DATABASE__URL``); the file is
named by ``--config`` or ``ARYL_CONFIG``. Unknown keys are errors, so a typo never silently falls
back to a default. Nothing else in the service reads the environment.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from dataclasses import fields
from typing import Any, Literal, TypeVar, get_type_hints

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from scheduler_service.core.params import PolicyParams

ENV_PREFIX = "ARYL_"
T = TypeVar("T", bound="BaseSettings")
ENV_NESTED_DELIMITER = "__"


class ConfigError(Exception):
    """The configuration file or environment is invalid; the message says which key and why."""


class ConfigSection(BaseModel):
    """One section of a config: unknown keys are errors, values never change after start-up."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class ArylSettings(BaseSettings):
    """Base of every Aryl program's config (scheduler, agent, router): ``ARYL_<SECTION>__<KEY>``
    variables override the file's values (passed as init values), which override the defaults."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, extra="forbid", frozen=True
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)


class ServerConfig(ConfigSection):
    listen: str = Field("127.0.0.1:50051", description="host:port the gRPC server binds")
    max_message_bytes: int = Field(16 * 1024 * 1024, gt=0, description="max gRPC message size, both ways")
    worker_threads: int = Field(16, gt=0, description="threads serving unary RPCs")
    max_concurrent_streams: int = Field(4096, gt=0, description="WatchEvents/WatchDesiredState streams")
    shutdown_grace_s: float = Field(5.0, ge=0, description="time in-flight RPCs get on shutdown")


def default_database_url() -> str:
    """The embedded default: a SQLite file under ``./.aryl`` (a one-machine try-out)."""
    return f"sqlite:///{Path('.aryl') / 'aryl.db'}"


class DatabaseConfig(ConfigSection):
    url: str = Field(default_factory=default_database_url, description="SQLAlchemy URL")
    auto_migrate: bool = Field(True, description="run Alembic migrations to head at start-up")
    statement_timeout_ms: int = Field(5000, gt=0, description="per-statement deadline (PostgreSQL)")
    pool_size: int = Field(20, gt=0)


class SchedulingConfig(ConfigSection):
    policy: str = Field("aryl", description="registered policy name: aryl, aryl-noloan, aryl-noelastic, sjf, fifo")
    cycle_interval_s: float = Field(2.0, gt=0, description="periodic cycle tick; events also trigger cycles")
    min_cycle_gap_s: float = Field(
        0.05, ge=0, description="least time between two cycles: a burst of events is batched into one cycle"
    )
    max_cycle_duty: float = Field(
        0.5, gt=0, le=1,
        description="during a burst of events, cycles take at most this share of the time: after a cycle that "
                    "took T seconds the next starts no sooner than T x (1/share - 1) later (and min_cycle_gap_s), "
                    "leaving the rest to status reports and pushes on a large cluster",
    )
    seed: int = Field(0, description="seed handed to the policy; same snapshot + seed -> same plan")
    default_grace_period_s: float = Field(30.0, ge=0, description="SIGTERM -> SIGKILL for workers")
    worker_base_port: int = Field(29500, gt=0, lt=65536, description="MASTER_PORT base for jobs")


# The policies' tunables, as a config section with exactly PolicyParams' fields and defaults.
PolicyConfig = create_model(
    "PolicyConfig",
    __base__=ConfigSection,
    __doc__="Tunables of the scheduling policy (scheduler_service.core.params.PolicyParams).",
    **{f.name: (get_type_hints(PolicyParams)[f.name], f.default) for f in fields(PolicyParams)},
)


class AgentsConfig(ConfigSection):
    report_interval_s: float = Field(5.0, gt=0, description="how often agents report status")
    lost_after_s: float = Field(30.0, gt=0, description="silence after which a server is LOST")
    telemetry_write_s: float = Field(
        15.0, ge=0, description="reports that change nothing are written at most this often (GPU load, progress)"
    )
    rpc_timeout_s: float = Field(5.0, gt=0, description="deadline on internal calls")
    desired_state_refresh_s: float = Field(
        30.0, gt=0,
        description="each agent stream re-reads its desired state at least this often (jittered), covering writes "
                    "this process was not told about; pushes after this scheduler's own commits are immediate, and an "
                    "agent whose stream lags the generation in its report replies resynchronises by itself",
    )


class LoggingConfig(ConfigSection):
    format: Literal["console", "json"] = "console"
    level: Literal["debug", "info", "warning", "error"] = "info"


class SchedulerConfig(ArylSettings):
    """Everything the scheduler service can be told. One instance, built at start-up."""

    server: ServerConfig = ServerConfig()
    database: DatabaseConfig = DatabaseConfig()
    scheduling: SchedulingConfig = SchedulingConfig()
    policy: PolicyConfig = PolicyConfig()  # type: ignore[valid-type]
    agents: AgentsConfig = AgentsConfig()
    logging: LoggingConfig = LoggingConfig()


def read_config_file(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """Parse a TOML (``.toml``) or YAML (anything else) config file into a dict."""
    if path is None:
        return {}
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {p} is not valid {p.suffix.lstrip('.') or 'YAML'}: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {p} must hold a mapping of sections, not {type(data).__name__}")
    return data


def load_settings(cls: type[T], path: str | os.PathLike[str] | None = None) -> T:
    """Build ``cls`` from ``path`` (or ``$ARYL_CONFIG``) and the environment; ConfigError on bad input."""
    path = path if path is not None else os.environ.get(f"{ENV_PREFIX}CONFIG") or None
    try:
        return cls(**read_config_file(path))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from exc


def load_config(path: str | os.PathLike[str] | None = None) -> SchedulerConfig:
    return load_settings(SchedulerConfig, path)


def apply_overrides(config: T, overrides: dict[str, dict[str, Any]]) -> T:
    """``config`` with ``{section: {key: value}}`` laid over it, validated; ConfigError on bad values.

    Used for command-line flags, which must beat the environment: rebuilding a settings object
    would let ``ARYL_*`` variables win again, so each touched section is re-validated on its own.
    ``None`` values (flags not given) are ignored.
    """
    updates: dict[str, BaseModel] = {}
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        current = getattr(config, section, None)
        if not isinstance(current, BaseModel):
            raise ConfigError(f"unknown configuration section {section!r}")
        if not given:
            continue
        try:
            updates[section] = type(current).model_validate({**current.model_dump(), **given})
        except ValidationError as exc:
            problems = "; ".join(
                f"{section}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
            )
            raise ConfigError(f"invalid command-line option: {problems}") from exc
    return config.model_copy(update=updates)


def env_var_names(cls: type[BaseSettings]) -> set[str]:
    """Every ``ARYL_SECTION__KEY`` variable ``cls`` understands (for docs and the compose check)."""
    names = set()
    for section, field in cls.model_fields.items():
        sub = field.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            names.update(
                f"{ENV_PREFIX}{section.upper()}{ENV_NESTED_DELIMITER}{key.upper()}" for key in sub.model_fields
            )
        else:
            names.add(f"{ENV_PREFIX}{section.upper()}")
    return names
