"""The Prometheus ``/metrics`` endpoint every Aryl daemon can serve: its ``[metrics]`` config
section and the HTTP server around a per-process registry.

Each component (``scheduler_service.metrics``, ``node_agent.metrics``, ``inference_router.metrics``)
owns a ``prometheus_client.CollectorRegistry`` of its own, never the library's global default, so
several components in one process (tests, the demo) do not collide, and serves it here.

Exposure: the metrics say which jobs, users, queues and servers exist; they carry no secrets, but the
endpoint has no authentication. So it binds 127.0.0.1 unless told otherwise, and is off (port 0)
unless a port is configured.

Never: decide or change anything; a metric is read-only.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from pydantic import Field

from aryl_common.config import ConfigSection
from aryl_common.entry import BadInput

METRICS_PATH = "/metrics"


class MetricsConfig(ConfigSection):
    """The ``[metrics]`` section (``ARYL_METRICS__PORT``, ``ARYL_METRICS__LISTEN_HOST``)."""

    port: int = Field(0, ge=0, le=65535, description="HTTP port serving Prometheus /metrics; 0: off")
    listen_host: str = Field(
        "127.0.0.1", min_length=1,
        description="address the metrics port binds; 127.0.0.1 by default (no authentication: widen it only "
                    "where the network is trusted, e.g. 0.0.0.0 inside a compose network)",
    )


class MetricsEndpoint:
    """``GET /metrics`` (any path, in fact: the library serves the registry at every path but
    ``/favicon.ico``) on a daemon thread; ``address`` is "host:port" (the bound port)."""

    def __init__(self, registry: CollectorRegistry, config: MetricsConfig) -> None:
        self._server: WSGIServer
        self._thread: threading.Thread
        self._server, self._thread = start_http_server(config.port, addr=config.listen_host, registry=registry)
        self.port = int(self._server.server_address[1])
        self.address = f"{config.listen_host}:{self.port}"

    @property
    def url(self) -> str:
        host, _, port = self.address.rpartition(":")
        return f"http://{host}:{port}{METRICS_PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, config: MetricsConfig) -> MetricsEndpoint | None:
    """The endpoint, or None when ``config.port`` is 0 (off). ``BadInput`` naming the setting when
    the address cannot be bound (taken, or not this host's)."""
    if not config.port:
        return None
    try:
        return MetricsEndpoint(registry, config)
    except OSError as exc:
        raise BadInput(f"cannot serve metrics on {config.listen_host}:{config.port}: {exc.strerror or exc}; choose "
                       "another metrics.port (ARYL_METRICS__PORT), or 0 to turn metrics off") from exc
