#!/usr/bin/env python3
"""``aryl-healthcheck ROLE``: the container HEALTHCHECK of each Aryl image (exit 0 healthy, 1 not).

- ``scheduler``: the standard gRPC health check (grpc.health.v1) on the port of ``ARYL_SERVER__LISTEN``
  (default 50051) answers SERVING;
- ``router``: ``GET /aryl/healthz`` on the port of ``ARYL_ROUTER__LISTEN`` (default 8080) answers 2xx;
- ``agent``: the agent's worker-log service (gRPC, ``ARYL_AGENT__LOGS_PORT``, 50052 in the images'
  compose file) accepts a connection: the agent process is up and serving. With no fixed logs port
  (0 or -1) the check only asks that an ``aryl-agent`` process exists.

One line on stderr says why a check failed (``docker inspect`` shows it).
"""

from __future__ import annotations

import os
import sys
import urllib.request
from pathlib import Path
from typing import Any

TIMEOUT_S = 3.0


def port_of(variable: str, default: int) -> int:
    listen = os.environ.get(variable, "")
    return int(listen.rsplit(":", 1)[1]) if ":" in listen else default


def channel_to(address: str, prefix: str, ca_key: str) -> Any:
    """A channel to a daemon of this container: mutual TLS with its own certificate (``<prefix>TLS_CERT``,
    ``TLS_KEY``, the CA of ``<prefix><ca_key>``) unless ``<prefix>INSECURE`` is true (docs/security.md)."""
    import grpc

    if os.environ.get(f"{prefix}INSECURE", "").lower() in ("1", "true", "yes"):
        return grpc.insecure_channel(address)

    def read(key: str) -> bytes:
        return Path(os.environ[prefix + key]).read_bytes()

    credentials = grpc.ssl_channel_credentials(read(ca_key), read("TLS_KEY"), read("TLS_CERT"))
    return grpc.secure_channel(address, credentials)


def check_scheduler() -> str | None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = f"127.0.0.1:{port_of('ARYL_SERVER__LISTEN', 50051)}"
    # With TLS (security.insecure not set) the check presents the scheduler's own certificate.
    with channel_to(address, "ARYL_SECURITY__", "TLS_CLIENT_CA") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        return f"scheduler at {address} is {health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)}"
    return None


def check_router() -> str | None:
    url = f"http://127.0.0.1:{port_of('ARYL_ROUTER__LISTEN', 8080)}/aryl/healthz"
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as reply:
        return None if 200 <= reply.status < 300 else f"{url} answered {reply.status}"


def agent_running() -> bool:
    for stat in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"aryl-agent" in stat.read_bytes():
                return True
        except OSError:
            continue
    return False


def check_agent() -> str | None:
    port = int(os.environ.get("ARYL_AGENT__LOGS_PORT") or 0)
    if port <= 0:
        return None if agent_running() else "no aryl-agent process"
    import grpc

    with channel_to(f"127.0.0.1:{port}", "ARYL_AGENT__", "TLS_CA") as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=TIMEOUT_S)
        except grpc.FutureTimeoutError:
            return f"the agent's log service on port {port} does not answer"
    return None


CHECKS = {"scheduler": check_scheduler, "router": check_router, "agent": check_agent}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in CHECKS:
        print(f"usage: aryl-healthcheck {{{','.join(CHECKS)}}}", file=sys.stderr)
        return 2
    try:
        problem = CHECKS[argv[0]]()
    except Exception as exc:  # noqa: BLE001 - any failure to ask is an unhealthy answer, said in one line
        problem = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if problem:
        print(f"aryl-healthcheck {argv[0]}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
