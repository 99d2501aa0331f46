"""The gRPC channel a daemon (``aryl-agent``, ``aryl-router``) keeps to the scheduler, and how a
failed call is named in logs.

Several schedulers may share one database, one of them leading (``docs/ha.md``): daemons and
clients take a comma-separated list of addresses and follow the leader a standby names
(``SchedulerAddresses``).

One set of channel options for both daemons, blocking (``grpc``) or asyncio (``grpc.aio``), so
they notice a dead scheduler and come back after a restart the same way. The scheduler's server
options permit the keepalive rate set here (``scheduler_service/server.py``).

It also holds the size bounds every hop agrees on: a job spec's cap (``MAX_JOB_SPEC_BYTES``,
enforced by the scheduler's validation) and the largest desired state a server can be sent
(``MAX_DESIRED_STATE_BYTES``), which daemons accept as their receive limit so that no desired
state the scheduler may legitimately send can cut an agent off.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from aryl_common.security import ClientSecurity, secure_aio_channel, secure_channel

# Keepalive pings notice a dead scheduler (or a silently dropped connection) within ~15 s even
# while a watch stream is idle.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000

# A job spec's whole encoded size (name, command, environment, everything), refused above this by
# the scheduler (scheduler_service/api/job_validation.py). Well under what every hop takes: Linux's
# execve accepts ARG_MAX (~2 MiB by default: a quarter of the 8 MiB stack) for argv and envp
# together and 128 KiB for one string, and the scheduler's messages default to 16 MiB.
MAX_JOB_SPEC_BYTES = 256 * 1024
# A server's desired state repeats each of its workers' command and environment. A worker holds at
# least one GPU and a server registers at most this many (agent_validation.MAX_GPUS_PER_SERVER), so that
# is also the most workers one desired state can carry.
MAX_WORKERS_PER_SERVER = 1024
# What a DesiredWorker adds to its job's command and environment (ids, ranks, up to 64 GPU indices,
# master address <= 253 characters, grace period), with room to spare; and the state's own header.
DESIRED_WORKER_OVERHEAD_BYTES = 4 * 1024
DESIRED_STATE_HEADER_BYTES = 64 * 1024
# The largest desired state the scheduler can send a server (~254 MiB at the bounds above). Daemons
# take it as their receive limit: gRPC's default (4 MiB) let an agent refuse its own desired state
# (RESOURCE_EXHAUSTED on every registration), so it never saw another change. The limit only
# bounds what may arrive; nothing is allocated ahead.
MAX_DESIRED_STATE_BYTES = (
    MAX_WORKERS_PER_SERVER * (MAX_JOB_SPEC_BYTES + DESIRED_WORKER_OVERHEAD_BYTES) + DESIRED_STATE_HEADER_BYTES
)


# Trailing metadata of a standby scheduler's UNAVAILABLE answer: the leader's address (host:port),
# where the caller should send the call again (``scheduler_service/api/leader_gate.py``).
LEADER_METADATA_KEY = "aryl-leader"

# Initial metadata of the scheduler's RegisterServer answer: the port, on the scheduler's own host, of the
# process that serves the agents' desired-state streams (``server.desired_state_port``,
# ``scheduler_service/push_process.py``); absent where the scheduler serves them alone. An agent watches
# there, and the scheduler itself where it is absent or unreachable (``node_agent.agent``).
DESIRED_STATE_PORT_KEY = "aryl-desired-state-port"
# Initial metadata of the leader's RegisterServer answer: host:port of another replica's desired-state streams'
# process (a live standby's, ``scheduler_service/app/replicas.py``) for the agent to watch first; the process of
# ``DESIRED_STATE_PORT_KEY`` (then the scheduler itself) is its fallback where that one is unreachable.
DESIRED_STATE_ADDRESS_KEY = "aryl-desired-state-address"


def desired_state_addresses(metadata: Mapping[str, str | bytes], scheduler_address: str) -> list[str]:
    """The desired-state streams' processes a RegisterServer answer's initial ``metadata`` names, in the order to
    watch them: another replica's (``DESIRED_STATE_ADDRESS_KEY``), then the scheduler's own
    (``DESIRED_STATE_PORT_KEY``, on the host of ``scheduler_address``, the one the agent reached); a value that
    is not a host:port or a port is left out. Empty: the scheduler serves the streams alone."""
    named = _host_port(metadata.get(DESIRED_STATE_ADDRESS_KEY))
    out = [named] if named else []
    if port := _port(metadata.get(DESIRED_STATE_PORT_KEY)):
        own = f"{scheduler_address.rpartition(':')[0]}:{port}"
        if own not in out:
            out.append(own)
    return out


def _port(value: str | bytes | None) -> int:
    """A port number from a metadata value; 0 where none, or not a port."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    try:
        port = int(value or 0)
    except ValueError:
        return 0
    return port if 0 < port <= 65535 else 0


def _host_port(value: str | bytes | None) -> str:
    """A host:port from a metadata value; '' where none, or not one."""
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    host, _, port = (value or "").strip().rpartition(":")
    return f"{host}:{port}" if host and _port(port) else ""


def scheduler_addresses(spec: str) -> list[str]:
    """The scheduler addresses of a comma-separated ``spec`` ("a:50051,b:50051"), in order, without
    blanks or repeats: every scheduler sharing one database, of which one leads (``docs/ha.md``)."""
    seen: list[str] = []
    for part in spec.split(","):
        address = part.strip()
        if address and address not in seen:
            seen.append(address)
    return seen


def leader_hint(exc: BaseException) -> str:
    """The leader's address a standby named in its UNAVAILABLE answer (``LEADER_METADATA_KEY``); ''."""
    trailing = getattr(exc, "trailing_metadata", None)
    if not callable(trailing):
        return ""
    try:
        metadata = trailing() or ()
    except Exception:  # noqa: BLE001 - a call that never got an answer has no metadata
        return ""
    for key, value in metadata:
        if key == LEADER_METADATA_KEY:
            return value.decode() if isinstance(value, bytes) else str(value)
    return ""


class SchedulerAddresses:
    """Which of several scheduler addresses to call: the current one until a call to it fails
    UNAVAILABLE; then the leader it named, else the next in the list (round robin). Not thread-safe."""

    def __init__(self, spec: str) -> None:
        self.all = scheduler_addresses(spec) or [spec]
        self.current = self.all[0]

    def __len__(self) -> int:
        return len(self.all)

    def after_failure(self, exc: BaseException) -> str:
        """The address to call next after ``exc``; ``current`` moves there. A named leader that is not
        in the list is followed too (the schedulers know each other's advertised addresses)."""
        hint = leader_hint(exc)
        if hint:
            self.current = hint
        elif self.current not in self.all:  # a named leader that failed: back to the list
            self.current = self.all[0]
        elif len(self.all) > 1:
            index = self.all.index(self.current) if self.current in self.all else -1
            self.current = self.all[(index + 1) % len(self.all)]
        return self.current


def scheduler_channel_options(max_reconnect_backoff_s: float) -> list[tuple[str, int]]:
    """Channel options: gRPC's own reconnect backoff capped like ours, keepalive pings, and a
    receive limit that takes any desired state the scheduler may send (``MAX_DESIRED_STATE_BYTES``).

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
        ("grpc.max_receive_message_length", MAX_DESIRED_STATE_BYTES),
    ]


def scheduler_channel(address: str, max_reconnect_backoff_s: float,
                      security: ClientSecurity | None = None) -> grpc.Channel:
    """A blocking channel to the scheduler with ``scheduler_channel_options``: TLS with the client
    certificate and token of ``security`` (plaintext when it is ``insecure``, or not given)."""
    options: list[tuple[str, int | str]] = list(scheduler_channel_options(max_reconnect_backoff_s))
    return secure_channel(address, security or ClientSecurity(insecure=True), options)


def scheduler_aio_channel(address: str, max_reconnect_backoff_s: float,
                          security: ClientSecurity | None = None) -> grpc.aio.Channel:
    """The asyncio twin of ``scheduler_channel`` (same options)."""
    options: list[tuple[str, int | str]] = list(scheduler_channel_options(max_reconnect_backoff_s))
    return secure_aio_channel(address, security or ClientSecurity(insecure=True), options)


def describe_rpc_error(exc: grpc.RpcError) -> str:
    """``CODE details`` of a failed call, for logs."""
    if isinstance(exc, grpc.Call):
        return f"{exc.code().name} {exc.details() or ''}".strip()
    return f"UNKNOWN {exc}"
