"""The scheduler's gRPC server: bound to ``server.listen`` with its options, the auth interceptor and
TLS, the three Aryl services added beside health checking and server reflection (so generic gRPC tools,
grpcurl and grpc_health_probe, work without the .proto files), and health's NOT_SERVING once a
group-commit worker stops.

It is ``server.accept_loops`` gRPC servers on one port (``ServerGroup``), each serving the same servicer
objects: grpc's asyncio server takes a new call only once per turn of the event loop (it asks its core for
one call, waits for it, then asks for the next). When the loop is busy, each turn is milliseconds, and calls
beyond a few hundred a second wait inside gRPC before any handler sees them: measured with 1,000 agents
reporting every 5 s while jobs were placed and cancelled, status reports took 0.3 s at first and 7.5 s after
30 s, and the wait grew for as long as the load lasted (``benchmarks/README.md``). With several servers on the
port (SO_REUSEPORT: the kernel spreads connections over their sockets), each takes calls on its own.

``server.py`` builds the servicers and runs the process; this module only puts them on a server.
What it must never do: build or hold the service's state (the app, the policy, the leadership), or
start and stop the server (``SchedulerService.run`` does both).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from aryl_common.channels import KEEPALIVE_TIME_MS, MAX_DESIRED_STATE_BYTES
from aryl_common.entry import BadInput
from aryl_common.security import TokenFile, server_credentials
from protos.aryl.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from scheduler_service.api.agent_servicer import AgentServicer
from scheduler_service.api.auth import AuthInterceptor
from scheduler_service.api.inference_servicer import InferenceServicer
from scheduler_service.api.leader_gate import LeaderGate
from scheduler_service.api.scheduler_servicer import SchedulerServicer
from scheduler_service.config import SchedulerConfig
from scheduler_service.group_commit import GroupCommitter

log = structlog.get_logger("aryl.scheduler")

SERVICE_NAMES = (
    scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name,
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    inference_pb2.DESCRIPTOR.services_by_name["InferenceService"].full_name,
)


class ListenError(BadInput):
    """``server.listen`` cannot be bound: taken, or not this machine's (exit 2: the fix is the address)."""


LISTEN_HINT = "choose another address with --listen or server.listen (ARYL_SERVER__LISTEN)"


def host_and_port(listen: str) -> tuple[str, int] | None:
    """``host:port``'s host and port; None for another form (``unix:...``), which is left to gRPC."""
    host, sep, port = listen.rpartition(":")
    return (host, int(port)) if sep and port.isdigit() else None


def probe_listen_address(listen: str) -> None:
    """ListenError, naming the reason (in use, not this machine's), when ``host:port`` cannot be bound.

    gRPC's own bind failure is a bare error on stderr from its C core plus an exception without the
    reason, so the address is tried with a plain socket first (SO_REUSEADDR as gRPC sets it: a port
    left in TIME_WAIT by a previous run is free). Forms other than ``host:port`` are left to gRPC."""
    split = host_and_port(listen)
    if split is None:
        return
    host, port = split
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:  # socket.gaierror included: a host name that does not resolve
        if exc.errno == errno.EAFNOSUPPORT:
            return  # e.g. [::] on a host without IPv6, where gRPC falls back to IPv4
        raise ListenError(f"cannot listen on {listen}: {exc.strerror or exc}; {LISTEN_HINT}") from exc


class ServerGroup:
    """gRPC servers on one port, serving the same servicers (the module's docstring says why): added to
    each with ``add``, started and stopped together."""

    def __init__(self, servers: Sequence[grpc.aio.Server], port: int) -> None:
        self.servers = tuple(servers)
        self.port = port

    def add(self, register: Callable[[grpc.aio.Server], Any]) -> None:
        """``register(server)`` (e.g. a generated ``add_..._to_server``) for every server of the group."""
        for server in self.servers:
            register(server)

    async def start(self) -> None:
        for server in self.servers:
            await server.start()

    async def stop(self, grace: float | None) -> None:
        await asyncio.gather(*(server.stop(grace) for server in self.servers))


def bind_servers(config: SchedulerConfig, gate: LeaderGate | None) -> ServerGroup:
    """``server.accept_loops`` servers on ``server.listen``'s port (``bind_server``), the first binding it
    (a port of 0: a free one, then shared) and the others joining it with SO_REUSEPORT; one server where
    ``server.listen`` is not ``host:port``. ListenError when the address cannot be bound."""
    listen = config.server.listen
    split = host_and_port(listen)
    loops = config.server.accept_loops if split is not None else 1
    first, port = bind_server(config, gate, share_port=loops > 1)
    servers = [first]
    joined = f"{split[0]}:{port}" if split is not None else listen
    for _ in range(loops - 1):
        # Joins the first server's socket (both SO_REUSEPORT), so no probe here: it would find the port taken.
        try:
            servers.append(bind_server(config, gate, listen=joined, share_port=True, probe=False)[0])
        except ListenError as exc:
            raise ListenError(f"cannot open server.accept_loops={loops} servers on {listen}'s port {port}; set "
                              "server.accept_loops = 1 (ARYL_SERVER__ACCEPT_LOOPS=1)") from exc
    return ServerGroup(servers, port)


def bind_server(config: SchedulerConfig, gate: LeaderGate | None, *, listen: str | None = None,
                share_port: bool = False, probe: bool = True) -> tuple[grpc.aio.Server, int]:
    """A gRPC server bound to ``listen`` (``server.listen`` unless given), with ``gate`` (None: every
    replica serves, as the desired-state streams' process does), its services not added yet, and the port it
    is bound to; ListenError when the address cannot be bound (in use, or not an address of this machine).
    ``share_port``: with SO_REUSEPORT, so that more servers of this process may join the port
    (``bind_servers``). The probe first (``probe_listen_address``) binds without it, so a port some other
    process listens on is refused either way."""
    listen = listen or config.server.listen
    if probe:
        probe_listen_address(listen)
    options = [
        # A server's desired state may be larger than any request (workers x job specs at the
        # cap), and agents accept up to MAX_DESIRED_STATE_BYTES; sending less would cut the
        # server off. What the scheduler sends it builds itself, so this bounds nothing a client controls.
        ("grpc.max_send_message_length", max(config.server.max_message_bytes, MAX_DESIRED_STATE_BYTES)),
        ("grpc.max_receive_message_length", config.server.max_message_bytes),
        ("grpc.max_concurrent_streams", config.server.max_concurrent_streams),
        ("grpc.so_reuseport", 1 if share_port else 0),
        # Daemons ping every KEEPALIVE_TIME_MS (aryl_common.channels), also between calls; allow
        # twice that rate so their pings are never taken for abuse.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
        ("grpc.http2.max_ping_strikes", 0),
    ]
    sec = config.security
    interceptors = [] if sec.insecure else [AuthInterceptor(
        TokenFile(sec.tokens_file, on_error=lambda problem: log.error("token file not reloaded", reason=problem)),
        tls=True, max_user_priority=sec.max_user_priority)]
    credentials = None if sec.insecure else server_credentials(sec.tls_cert, sec.tls_key, sec.tls_client_ca)
    server = grpc.aio.server(options=options, interceptors=[*interceptors, *([gate] if gate is not None else [])])
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:  # grpc's "Failed to bind to address ..."
        port = 0
    if port == 0:  # taken between the probe and here, or a form only gRPC understands
        raise ListenError(f"cannot listen on {listen}; {LISTEN_HINT}")
    return server, port


def add_services(servers: ServerGroup, scheduler: SchedulerServicer, agent: AgentServicer,
                 inference: InferenceServicer) -> health.aio.HealthServicer:
    """The three Aryl services on every server of ``servers``, with health checking and server reflection;
    returns the health servicer, one for all of them (the caller sets each service, and the server as a
    whole, SERVING once they start)."""
    health_servicer = health.aio.HealthServicer()

    def register(server: grpc.aio.Server) -> None:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(scheduler, server)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(agent, server)
        inference_pb2_grpc.add_InferenceServiceServicer_to_server(inference, server)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)

    servers.add(register)
    return health_servicer


def watch_committer(committer: GroupCommitter[Any, Any], health_servicer: health.aio.HealthServicer,
                    loop: asyncio.AbstractEventLoop, stopping: Callable[[], bool]) -> None:
    """Once ``committer``'s worker stops while the service runs (``stopping`` false), health says
    NOT_SERVING (overall and for SchedulerService): every later SubmitJob or CancelJob is refused until a
    restart, which a probe can now order. Its callers are refused at once by the committer itself."""

    async def not_serving() -> None:
        for name in ("", SERVICE_NAMES[0]):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)

    def stopped(error: BaseException | None) -> None:  # on the committer's thread
        if stopping():
            return  # shutting down: health already says so
        log.critical("a group-commit worker stopped; health says NOT_SERVING until a restart",
                     committer=committer.name, error=repr(error))
        try:
            asyncio.run_coroutine_threadsafe(not_serving(), loop)
        except RuntimeError:
            pass  # the loop closed meanwhile: the service has stopped

    committer.add_stop_callback(stopped)
