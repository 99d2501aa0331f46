"""Reading a worker's log from the agent that ran it (for ``GetJobLogs``).

Logs stay on the GPU server that ran the worker; each agent serves them with WorkerLogService at
the ``logs_address`` it registered. The scheduler only locates the right agent and relays one
bounded read: it never stores logs. Channels to agents are cached per address and closed on shutdown.

The agent's answers are relayed as typed errors that name the server: NOT_FOUND (no log for the
rank there), OUT_OF_RANGE (an offset past the end of the log, which may grow), INVALID_ARGUMENT;
any other failure means the agent could not answer, UNAVAILABLE.
"""

from __future__ import annotations

import grpc

from aryl_common.security import ClientSecurity, secure_aio_channel
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc
from scheduler_service.errors import InvalidArgument, NotFound, OutOfRange, Unavailable

DEFAULT_READ_BYTES = 64 * 1024
MAX_READ_BYTES = 1024 * 1024


class AgentLogReader:
    """With TLS (``security`` not insecure) the reader presents the scheduler's certificate and accepts an
    agent only when its certificate names the server id the log was asked of (docs/security.md)."""

    def __init__(self, *, timeout_s: float, security: ClientSecurity | None = None) -> None:
        self._timeout = timeout_s
        self._security = security or ClientSecurity(insecure=True)
        self._channels: dict[tuple[str, str], grpc.aio.Channel] = {}

    def _stub(self, address: str, server_id: str = "") -> agent_pb2_grpc.WorkerLogServiceStub:
        channel = self._channels.get((address, server_id))
        if channel is None:
            options: list[tuple[str, int | str]] = [("grpc.max_receive_message_length", 2 * MAX_READ_BYTES)]
            if not self._security.insecure and server_id:
                options.append(("grpc.ssl_target_name_override", server_id))
            channel = self._channels[(address, server_id)] = secure_aio_channel(address, self._security, options)
        return agent_pb2_grpc.WorkerLogServiceStub(channel)

    async def read(
        self, server_id: str, address: str, job_id: int, rank: int, offset: int, max_bytes: int
    ) -> agent_pb2.ReadWorkerLogResponse:
        if max_bytes > MAX_READ_BYTES:
            raise InvalidArgument("max_bytes", f"must be at most {MAX_READ_BYTES} (got {max_bytes})")
        request = agent_pb2.ReadWorkerLogRequest(
            job_id=str(job_id), rank=rank, offset=offset, max_bytes=max_bytes or DEFAULT_READ_BYTES
        )
        try:
            return await self._stub(address, server_id).ReadWorkerLog(request, timeout=self._timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(f"server {server_id}: {exc.details()}") from None
            if exc.code() == grpc.StatusCode.OUT_OF_RANGE:
                # The agent's words carry the log's size ("offset 99 is past the end of the log (6 bytes)").
                past_end = exc.details() or f"offset {offset} is past the end of the log"
                raise OutOfRange(
                    "offset",
                    f"job {job_id} rank {rank} on server {server_id}: {past_end}; read from an offset within "
                    "the log (a negative one counts back from its end), or retry once the worker has written more",
                ) from None
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # agents before OUT_OF_RANGE sent it for offsets
                raise InvalidArgument("offset", exc.details() or "refused by the agent") from None
            raise Unavailable(
                f"cannot read the log from the agent of server {server_id} at {address}: "
                f"{exc.code().name} {exc.details() or ''}".rstrip()
            ) from None

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
