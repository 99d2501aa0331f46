"""The router's typed configuration: defaults < config file < ``ARYL_*`` environment < CLI flags.

Same conventions as the scheduler and the agent: sections, ``ARYL_<SECTION>__<KEY>`` variables
(e.g. ``ARYL_ROUTER__SERVERS_NEEDED``), unknown keys are errors. Nothing else in the router reads
the environment.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from pydantic import Field

from scheduler_service.config import (
    ArylSettings,
    ConfigSection,
    ConfigError, LoggingConfig,
    apply_overrides,
    load_settings,
)


def default_source() -> str:
    return f"aryl-router@{socket.gethostname()}"


class RouterSection(ConfigSection):
    scheduler_address: str = Field("127.0.0.1:50051", min_length=1, description="host:port of the scheduler")
    servers_needed: int | None = Field(
        None,
        ge=0,
        description="inference servers that must stay serving (static; required: there is no safe default, "
        "0 would let the scheduler loan every inference server to training)",
    )
    report_interval_s: float = Field(10.0, gt=0, description="how often demand is reported")
    source: str = Field(default_factory=default_source, min_length=1, description="who reports, for the event log")
    rpc_timeout_s: float = Field(5.0, gt=0, description="deadline of each ReportDemand call")
    reconnect_max_backoff_s: float = Field(10.0, gt=0, description="cap of the retry backoff after a failed report")


class RouterConfig(ArylSettings):
    """Everything the router can be told. One instance, built at start-up."""

    router: RouterSection = RouterSection()
    logging: LoggingConfig = LoggingConfig()


def load_router_config(
    path: str | os.PathLike[str] | None = None, overrides: dict[str, dict[str, Any]] | None = None
) -> RouterConfig:
    """File (or ``$ARYL_CONFIG``) + environment, then ``overrides`` (the CLI flags); checks required keys."""
    config = apply_overrides(load_settings(RouterConfig, path), overrides or {})
    if config.router.servers_needed is None:
        raise ConfigError(
            "router.servers_needed is required (ARYL_ROUTER__SERVERS_NEEDED or --servers-needed): "
            "the number of inference servers that must stay serving"
        )
    return config
