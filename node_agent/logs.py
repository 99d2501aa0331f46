"""The worker-log service: lets the scheduler read the logs of this server's workers (GetJobLogs).

Nouns: a *worker log* is ``<work_dir>/logs/<job>/rank-<r>.log`` (``node_agent.workers``), the
output of every incarnation of one (job, rank) on this server, appended, with a header line per
incarnation. A *chunk* is a byte range of it: ``offset >= 0`` counts from the start, a negative
offset that many bytes before the end (clamped to the start); ``max_bytes`` 0 means 64 KiB and is
capped at 1 MiB. Reading never blocks for more output: followers poll with ``next_offset``.

Errors: NOT_FOUND when this server has no log for the (job, rank); INVALID_ARGUMENT for an empty
job id; OUT_OF_RANGE for an offset past the end of the log (a well-formed request that may succeed
once the log has grown, as gRPC's guide has it for reading past end-of-file). Reads only; it never
touches processes.
"""

from __future__ import annotations

from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from aryl_common.security import SCHEDULER_CERT_NAME, ClientSecurityFields, peer_names, server_credentials
from node_agent.workers import WorkDir
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc

DEFAULT_CHUNK_BYTES = 64 * 1024
MAX_CHUNK_BYTES = 1024 * 1024


class LogNotFound(Exception):
    pass


class OffsetPastEnd(ValueError):
    """An offset beyond the log's current end; the log may grow past it later."""


@dataclass(frozen=True)
class LogChunk:
    data: bytes
    offset: int
    next_offset: int
    size: int


def read_chunk(path: Path, offset: int, max_bytes: int) -> LogChunk:
    """The chunk of ``path`` the module doc describes. Raises LogNotFound, or OffsetPastEnd."""
    limit = min(max_bytes or DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES)
    try:
        with path.open("rb") as file:
            size = file.seek(0, 2)
            start = max(0, size + offset) if offset < 0 else offset
            if start > size:
                raise OffsetPastEnd(f"offset {offset} is past the end of the log ({size} bytes)")
            file.seek(start)
            data = file.read(min(limit, size - start))
    except FileNotFoundError as exc:
        raise LogNotFound(str(path)) from exc
    return LogChunk(data=data, offset=start, next_offset=start + len(data), size=size)


class WorkerLogService(agent_pb2_grpc.WorkerLogServiceServicer):
    """Translates ReadWorkerLog calls to ``read_chunk`` on this agent's work directory."""

    def __init__(self, layout: WorkDir, hostname: str, *, tls: bool = False) -> None:
        self._layout = layout
        self._hostname = hostname
        self._tls = tls

    def ReadWorkerLog(self, request, context):  # gRPC's method name
        if self._tls and SCHEDULER_CERT_NAME not in peer_names(context.auth_context()):
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"only the scheduler ({SCHEDULER_CERT_NAME}'s certificate) reads worker logs here")
        if not request.job_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "job_id is required")
        path = self._layout.log_file(request.job_id, request.rank)
        try:
            chunk = read_chunk(path, request.offset, request.max_bytes)
        except LogNotFound:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"server {self._hostname} has no log for job {request.job_id!r} rank {request.rank} "
                "(the worker never ran here, or its log was removed)",
            )
        except OffsetPastEnd as exc:
            context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
        else:
            return agent_pb2.ReadWorkerLogResponse(
                data=chunk.data, offset=chunk.offset, next_offset=chunk.next_offset, size=chunk.size
            )


def serve_worker_logs(layout: WorkDir, hostname: str, host: str, port: int,
                      tls: ClientSecurityFields | None = None) -> tuple[grpc.Server, int]:
    """Start the service on ``host:port`` (0: any free port); returns the server and its port. With
    ``tls`` (the agent's settings, not insecure): mutual TLS with the agent's certificate, and only
    the scheduler's certificate (``aryl-scheduler``, signed by ``tls_ca``) is let in."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="worker-logs"))
    secure = tls is not None and not tls.insecure
    agent_pb2_grpc.add_WorkerLogServiceServicer_to_server(WorkerLogService(layout, hostname, tls=secure), server)
    if tls is not None and secure:
        bound = server.add_secure_port(f"{host}:{port}", server_credentials(tls.tls_cert, tls.tls_key, tls.tls_ca))
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if not bound:
        raise OSError(f"cannot listen on {host}:{port}")
    server.start()
    structlog.get_logger("node_agent.logs").info("serving worker logs", listen=f"{host}:{bound}")
    return server, bound
