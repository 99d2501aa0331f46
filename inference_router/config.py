"""The router's typed configuration: defaults < config file < ``ARYL_*`` environment < CLI flags.

Same conventions as the scheduler and the agent (one loader, ``aryl_common.config``): sections,
``ARYL_<SECTION>__<KEY>`` variables (e.g. ``ARYL_ROUTER__SERVERS_NEEDED``; lists as JSON, e.g.
``ARYL_ROUTER__STATIC_BACKENDS='["http://10.0.0.7:8000"]'``), unknown keys are errors. Nothing else
in the router reads the environment.

Demand has two modes: *static* (``servers_needed`` set: that number is reported, whatever the load)
and *measured* (``server_capacity_rps`` set: the number is derived from the measured request rate).
One of the two is required when a scheduler is configured; ``servers_needed`` wins when both are set.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from aryl_common.config import (
    ArylSettings,
    ConfigError,
    LoggingConfig,
    apply_overrides,
    load_settings,
)
from aryl_common.metrics import MetricsConfig
from aryl_common.security import ClientSecurityFields


def default_source() -> str:
    return f"aryl-router@{socket.gethostname()}"


def split_host_port(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; ValueError with the reason otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class RouterSection(ClientSecurityFields):
    # --- the scheduler ("" = none: a plain load balancer over static_backends, reporting nothing)
    scheduler_address: str = Field(
        "127.0.0.1:50051",
        description="host:port of the scheduler, or several sharing one database comma-separated (the router "
                    "follows the leader, docs/ha.md); '' for none",
    )
    source: str = Field(default_factory=default_source, min_length=1, description="who reports, for the event log")
    rpc_timeout_s: float = Field(5.0, gt=0, description="deadline of each ReportDemand/ReportDrained call")
    reconnect_max_backoff_s: float = Field(10.0, gt=0, description="cap of the retry backoff after a failed call")

    # --- the data plane: HAProxy (default), programmed by the router, or the router's own Python proxy
    data_plane: Literal["haproxy", "python"] = Field(
        "haproxy",
        description="who carries the requests: 'haproxy' (a HAProxy child process the router programs over its "
        "runtime API and reads the load from) or 'python' (the router's own aiohttp proxy, for hosts without "
        "HAProxy)",
    )
    haproxy_binary: str = Field(
        "haproxy", description="the haproxy executable (a name on PATH or in /usr/sbin, or a path)"
    )
    haproxy_slots: int = Field(
        64, ge=1, le=10_000, description="server slots in HAProxy's pool backend: the most inference servers routed to"
    )
    haproxy_threads: int = Field(
        1, ge=0, le=64,
        description="haproxy: its worker threads; one carries tens of thousands of requests/s and leaves the other "
        "cores to the host (measured on 2 cores: a lower latency tail than one per CPU); 0: one per CPU",
    )
    stats_interval_s: float = Field(
        0.25, gt=0, description="haproxy: how often its statistics (requests, queue, in flight) are read"
    )

    # --- the HTTP proxy
    listen: str = Field("127.0.0.1:8080", description="host:port the HTTP proxy binds (port 0: any free port)")
    static_backends: list[str] = Field(
        default_factory=list,
        description="inference server base URLs to route to instead of the scheduler's serving pool (always SERVING)",
    )
    max_attempts: int = Field(
        3, ge=1, description="backends tried per request; a retry happens only when nothing was sent to the last one"
    )
    connect_timeout_s: float = Field(2.0, gt=0, description="connecting to a backend (a timeout here is retried)")
    request_timeout_s: float = Field(300.0, gt=0, description="longest wait for a backend's next bytes")
    backend_connections: int = Field(256, ge=0, description="pooled keep-alive connections per backend (0: no limit)")
    keepalive_timeout_s: float = Field(
        15.0, gt=0, description="idle pooled connection lifetime; keep it below the backends' own idle timeout"
    )
    shutdown_timeout_s: float = Field(30.0, ge=0, description="time in-flight requests get after SIGTERM")

    # --- backend health
    health_path: str = Field("/healthz", description="active health check: GET <endpoint><health_path> must be 2xx")
    health_check_interval_s: float = Field(5.0, ge=0, description="active health check period (0: off)")
    health_check_timeout_s: float = Field(2.0, gt=0, description="deadline of one active health check")
    unhealthy_after_failures: int = Field(3, ge=1, description="consecutive transport failures that eject a backend")
    unhealthy_cooldown_s: float = Field(10.0, ge=0, description="how long an ejected backend gets no traffic")

    # --- demand: static, or measured
    servers_needed: int | None = Field(
        None,
        ge=0,
        description="static demand: inference servers that must stay serving, whatever the load (there is no safe "
        "default: 0 would let the scheduler loan every inference server to training)",
    )
    server_capacity_rps: float | None = Field(
        None, gt=0, description="measured demand: requests/s one inference server sustains"
    )
    headroom: float = Field(0.2, ge=0, description="spare capacity on top of the rate: need = ceil(rate*(1+h)/cap)")
    min_servers: int = Field(1, ge=0, description="measured demand never goes below this")
    scale_down_delay_s: float = Field(
        300.0, ge=0, description="the need must stay lower this long before it is lowered (to the window's maximum)"
    )
    short_window_s: float = Field(10.0, gt=0, description="rate window that drives the need; latency percentiles")
    long_window_s: float = Field(
        60.0, gt=0, description="rate window reported as observed_rps and learned by the profile"
    )
    evaluate_interval_s: float = Field(1.0, gt=0, description="how often the need is recomputed")
    report_interval_s: float = Field(10.0, gt=0, description="heartbeat: demand is re-reported at least this often")
    forecast_ewma_tau_s: float = Field(
        0.0, ge=0, description="forecast: EWMA of the rate with this time constant; the need covers it (0: off)"
    )
    time_of_day_profile: bool = Field(
        False, description="forecast: learn the rate per time-of-day bucket, day over day"
    )
    profile_buckets_per_hour: int = Field(1, ge=1, le=60, description="time-of-day profile resolution (24 x N)")
    profile_weight: float = Field(0.5, gt=0, le=1, description="weight of the latest day in a profile bucket")
    forecast_horizon_s: float = Field(900.0, ge=0, description="the profile's look-ahead: buckets up to now+horizon")

    @field_validator("listen")
    @classmethod
    def _listen_is_host_port(cls, value: str) -> str:
        split_host_port(value)
        return value

    @field_validator("static_backends")
    @classmethod
    def _backends_are_urls(cls, value: list[str]) -> list[str]:
        for url in value:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{url!r} is not an http(s)://host:port base URL")
        if len(set(value)) != len(value):
            raise ValueError("static_backends lists a URL twice")
        return value

    @field_validator("health_path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class RouterConfig(ArylSettings):
    """Everything the router can be told. One instance, built at start-up."""

    router: RouterSection = RouterSection()
    logging: LoggingConfig = LoggingConfig()
    metrics: MetricsConfig = MetricsConfig()  # Prometheus /metrics (inference_router.metrics); off by default


def load_router_config(
    path: str | os.PathLike[str] | None = None, overrides: dict[str, dict[str, Any]] | None = None
) -> RouterConfig:
    """File (or ``$ARYL_CONFIG``) + environment, then ``overrides`` (the CLI flags); checks required keys."""
    config = apply_overrides(load_settings(RouterConfig, path), overrides or {})
    check_router_section(config.router)
    return config


def check_router_section(router: RouterSection) -> None:
    """The cross-key rules pydantic cannot express per field; ConfigError naming the keys to set."""
    if not router.scheduler_address:
        if not router.static_backends:
            raise ConfigError(
                "router.static_backends is required without a scheduler (router.scheduler_address is empty): "
                "there would be nothing to route to"
            )
        return
    if router.servers_needed is None and router.server_capacity_rps is None:
        raise ConfigError(
            "router.servers_needed is required (ARYL_ROUTER__SERVERS_NEEDED or --servers-needed): the number of "
            "inference servers that must stay serving -- or set router.server_capacity_rps (--capacity-rps) to "
            "derive it from the measured load"
        )
