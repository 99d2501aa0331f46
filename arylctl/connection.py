"""The typed client's connection to its schedulers (``arylctl.client.ArylClient`` is this plus one method per
RPC): the channel and stubs to the address calls go to now, the unary call with its deadline (``_unary``),
and where a call goes next when that scheduler is unavailable (``_follow_leader``, ``_next_address``).

Nouns: the *given* addresses are those the caller passed (comma-separated for several schedulers sharing one
database, ``docs/ha.md``); the *current* one is where calls go now; a *named leader* is the address a standby's
UNAVAILABLE answer names (``aryl_common.channels.leader_hint``). A named leader that failed to answer is not
followed again for ``DEAD_LEADER_S``, and from a named leader outside the given addresses the next try goes
back to the first given one at once, so the client is never pinned to a leader that stopped answering.

What this module must never do: send a call again unless it came back UNAVAILABLE (a standby refused it, or
no scheduler received it), and then at most once per address and once more for a named leader; retrying
anything else (a submission: ``arylctl.retries``) is the caller's to decide. It knows no RPC's messages.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Final

import grpc

from aryl_common.channels import SchedulerAddresses, leader_hint
from aryl_common.security import ClientSecurity, secure_channel
from arylctl.errors import aryl_error
from arylctl.retries import never_connected
from protos.aryl.v1 import inference_pb2_grpc, scheduler_pb2_grpc

# Where calls go when no address is given (``default_address``).
DEFAULT_ADDRESS: Final = "127.0.0.1:50051"
SERVER_ENV_VAR: Final = "ARYL_SERVER"
# Same as the server's default (scheduler_service.config.ServerConfig.max_message_bytes): a
# ListJobs page of 1000 jobs with long commands and env must not trip gRPC's 4 MiB default.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
# A leader that stopped answering is not followed again, when a standby still names it, for this long:
# the client stays with the addresses it was given, one of which is about to lead.
DEAD_LEADER_S: Final = 5.0
# A channel's reconnect backoff (gRPC's grows to 2 minutes): a scheduler back after a restart is
# reached at the next try, not after the channel's backoff.
RECONNECT_BACKOFF_MS: Final = 1000


def default_address() -> str:
    """The scheduler address used when none is given: ``$ARYL_SERVER``, else 127.0.0.1:50051."""
    return os.environ.get(SERVER_ENV_VAR) or DEFAULT_ADDRESS


class SchedulerConnection:
    """Channel and stubs to the scheduler calls go to now, and the unary call (``_unary``) that follows the
    leader a standby names and fails over among the addresses it knows (module doc). Thread-safe."""

    def __init__(
        self, address: str | None = None, *, timeout: float = 10.0,
        interceptors: Sequence[grpc.UnaryUnaryClientInterceptor] = (), security: ClientSecurity | None = None,
    ) -> None:
        """``interceptors`` wrap every unary call (e.g. to add metadata, or to inject faults in tests).
        ``security``: the TLS files and token to present; by default from the environment
        (``ARYL_TLS_CA``/``_CERT``/``_KEY``, ``ARYL_TOKEN`` or ``arylctl login``'s token file;
        ``ARYL_INSECURE=1`` for a scheduler run without TLS), see docs/security.md."""
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.address = address or default_address()
        self.timeout = timeout
        self.security = security if security is not None else ClientSecurity.from_env()
        # Several schedulers sharing one database ("a:50051,b:50051", docs/ha.md): calls go to one of
        # them, and move to the leader a standby names (or the next address) when it is unavailable.
        self._addresses = SchedulerAddresses(self.address)
        self._interceptors = tuple(interceptors)
        self._closed = threading.Event()
        self._switch = threading.Lock()
        # Set once a call of this client got past connecting (answered, or lost on the way): a scheduler
        # was reached, and a submission is retried for long (``submit``).
        self._reached = threading.Event()
        self._unreachable: dict[str, float] = {}  # address -> monotonic time its last call failed to reach it
        self._connect(self._addresses.current)

    def _connect(self, address: str) -> None:
        """Channel and stubs to ``address``; ``_calls`` names each stub method for ``_unary``'s retry."""
        self._channel = secure_channel(
            address, self.security,
            [
                # A connection of its own, not one shared with other channels to the same address:
                # a new client then really tries to connect (``arylctl events -f`` reconnects with
                # its own backoff) instead of inheriting a shared connection's backoff (up to 2 min).
                ("grpc.use_local_subchannel_pool", 1),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
                ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
                ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
            ],
        )
        calls = grpc.intercept_channel(self._channel, *self._interceptors) if self._interceptors else self._channel
        self._scheduler = scheduler_pb2_grpc.SchedulerServiceStub(calls)
        self._inference = inference_pb2_grpc.InferenceServiceStub(calls)
        self._calls = {id(method): (stub, name) for stub in ("_scheduler", "_inference")
                       for name, method in vars(getattr(self, stub)).items()}

    def _follow_leader(self, method: Any, exc: grpc.RpcError) -> Any:
        """After ``method`` failed UNAVAILABLE: the same method on the scheduler to try next, or None
        when there is none to try (``_next_address``)."""
        with self._switch:
            where = self._calls.get(id(method))
            if where is None or self._closed.is_set():
                return None
            before = self._addresses.current
            if not (aryl_error(exc).from_scheduler or leader_hint(exc)):  # not reached: not followed again for a while
                self._unreachable[before] = time.monotonic()
            after = self._next_address(exc)
            if after is None:
                return None
            if after != before:
                self._addresses.current = after
                self._channel.close()
                self._connect(after)
            return getattr(getattr(self, where[0]), where[1])

    def _next_address(self, exc: grpc.RpcError) -> str | None:
        """Where to send a call that ``current`` failed UNAVAILABLE: the leader a standby named (unless it
        failed to answer in the last ``DEAD_LEADER_S``); else, from a named leader outside the given
        addresses, the first given one (at once: never pinned to a dead leader); else the next given one."""
        given, current = self._addresses.all, self._addresses.current
        hint = leader_hint(exc)
        failed_at = self._unreachable.get(hint)
        if hint and hint != current and (failed_at is None or time.monotonic() - failed_at >= DEAD_LEADER_S):
            return hint
        if current not in given:
            return given[0]
        if len(given) > 1:
            return given[(given.index(current) + 1) % len(given)]
        return None

    def _unary(self, method: Any, request: Any) -> Any:
        # Each address once, and a named leader once more: a call that a standby refused or an
        # unreachable scheduler never received is safe to send again.
        tries = len(self._addresses) + 1
        while True:
            try:
                answer = method(request, timeout=self.timeout)
            except grpc.RpcError as exc:
                if not never_connected(exc):
                    self._reached.set()
                tries -= 1
                unavailable = isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE
                method = self._follow_leader(method, exc) if unavailable and tries > 0 else None
                if method is None:
                    raise aryl_error(exc) from exc
            else:
                self._reached.set()
                return answer
