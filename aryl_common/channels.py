"""The gRPC channel a daemon (``aryl-agent``, ``aryl-router``) keeps to the scheduler, and how a
failed call is named in logs.

One set of channel options for both daemons, blocking (``grpc``) or asyncio (``grpc.aio``), so
they notice a dead scheduler and come back after a restart the same way. The scheduler's server
options permit the keepalive rate set here (``scheduler_service/server.py``).
"""

from __future__ import annotations

import grpc

# Keepalive pings notice a dead scheduler (or a silently dropped connection) within ~15 s even
# while a watch stream is idle.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000


def scheduler_channel_options(max_reconnect_backoff_s: float) -> list[tuple[str, int]]:
    """Channel options: gRPC's own reconnect backoff capped like ours, and keepalive pings.

    gRPC's default reconnect backoff grows to 120 s; without the cap a daemon would keep failing
    fast with UNAVAILABLE for up to two minutes after the scheduler came back.
    """
    max_ms = max(1, int(max_reconnect_backoff_s * 1000))
    return [
        ("grpc.initial_reconnect_backoff_ms", min(500, max_ms)),
        ("grpc.min_reconnect_backoff_ms", min(500, max_ms)),
        ("grpc.max_reconnect_backoff_ms", max_ms),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


def scheduler_channel(address: str, max_reconnect_backoff_s: float) -> grpc.Channel:
    """A blocking, insecure channel to the scheduler with ``scheduler_channel_options``."""
    return grpc.insecure_channel(address, options=scheduler_channel_options(max_reconnect_backoff_s))


def scheduler_aio_channel(address: str, max_reconnect_backoff_s: float) -> grpc.aio.Channel:
    """The asyncio twin of ``scheduler_channel`` (same options)."""
    return grpc.aio.insecure_channel(address, options=scheduler_channel_options(max_reconnect_backoff_s))


def describe_rpc_error(exc: grpc.RpcError) -> str:
    """``CODE details`` of a failed call, for logs."""
    if isinstance(exc, grpc.Call):
        return f"{exc.code().name} {exc.details() or ''}".strip()
    return f"UNKNOWN {exc}"
