"""Typed errors -> gRPC statuses, for every servicer method (unary and streaming).

An error about one request field (``FieldError``: INVALID_ARGUMENT, OUT_OF_RANGE) carries a
google.rpc.BadRequest naming the field (the detail Google's error model gives both), so generic
clients can read it; the plain details string always says the same for humans. A lost or refused
database connection, or a database statement or lock timeout, that reaches here is UNAVAILABLE
(retry), never INTERNAL. Unexpected exceptions are logged with a reference and answered INTERNAL --
never a crash, never a Python traceback on the wire.
"""

from __future__ import annotations

import functools
import inspect
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import structlog
from google.rpc import error_details_pb2, status_pb2

from scheduler_service.app.failures import database_unavailable
from scheduler_service.errors import (
    Aborted,
    AlreadyExists,
    FailedPrecondition,
    FieldError,
    InvalidArgument,
    NotFound,
    OutOfRange,
    PermissionDenied,
    Unavailable,
)
from scheduler_service.lifecycle import IllegalTransition

log = structlog.get_logger("aryl.api")

ANSWERED_BY_KEY = "aryl-answered-by"  # trailing metadata on every error the scheduler itself returns

_CODES: dict[type[Exception], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    OutOfRange: grpc.StatusCode.OUT_OF_RANGE,
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    PermissionDenied: grpc.StatusCode.PERMISSION_DENIED,
    FailedPrecondition: grpc.StatusCode.FAILED_PRECONDITION,
    IllegalTransition: grpc.StatusCode.FAILED_PRECONDITION,
    Aborted: grpc.StatusCode.ABORTED,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
}


async def _abort(context: grpc.aio.ServicerContext, exc: Exception, method: str) -> None:
    # ``store.transactions`` already answers these as Unavailable; this catches any database access
    # outside it, so the client reads "retry" instead of "internal error".
    unavailable = database_unavailable(exc)
    if unavailable is not None:
        log.warning("database unavailable", method=method, reason=(str(exc).splitlines() or [""])[0])
        exc = unavailable
    code = next((c for t, c in _CODES.items() if isinstance(exc, t)), None)
    if code is None:
        ref = uuid.uuid4().hex[:12]
        log.error("rpc failed", method=method, ref=ref, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error (reference {ref}); see the scheduler log")
        return
    message = str(exc)
    # Marks an answer of the scheduler itself, so a client can tell "the scheduler says a part it
    # needs is UNAVAILABLE" from "no scheduler answered" (gRPC's own UNAVAILABLE).
    trailing: tuple[tuple[str, str | bytes], ...] = ((ANSWERED_BY_KEY, "aryl-scheduler"),)
    if isinstance(exc, FieldError):
        detail = error_details_pb2.BadRequest(
            field_violations=[error_details_pb2.BadRequest.FieldViolation(field=exc.field, description=exc.reason)]
        )
        # gRPC's status codes and google.rpc.Code share their numbers (INVALID_ARGUMENT = 3, OUT_OF_RANGE = 11).
        status = status_pb2.Status(code=code.value[0], message=message)
        status.details.add().Pack(detail)
        trailing += (("grpc-status-details-bin", status.SerializeToString()),)
    await context.abort(code, message, trailing_metadata=trailing)


def rpc(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a servicer method (coroutine or async generator) with the error mapping."""
    name = method.__name__
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                async for item in method(self, request, context):
                    yield item
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - mapped, never leaked
                await _abort(context, exc, name)

        return stream

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped, never leaked
            await _abort(context, exc, name)

    return unary
