"""The failures of a call to the scheduler, as the client raises them: :class:`ArylError` and one subclass
per gRPC status a caller may want to catch (``NotFound``, ``Unavailable``...), each carrying the status
``code`` and the server's ``message`` — never a raw ``grpc.RpcError``.

What this module must never do: call the scheduler, or decide whether a failed call may be retried.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import grpc
from google.rpc import error_details_pb2, status_pb2

# ResourceInfo.resource_type of the job an ALREADY_EXISTS answer to SubmitJob names.
_JOB_RESOURCE_TYPE: Final = "aryl.v1.Job"


class ArylError(Exception):
    """A call to the scheduler failed. ``code`` is the gRPC status, ``message`` the server's words."""

    def __init__(self, code: grpc.StatusCode, message: str, *, from_scheduler: bool = False) -> None:
        super().__init__(f"{message} ({code.name})")
        self.code = code
        self.message = message
        # The scheduler itself answered with this status (as opposed to gRPC failing to reach it).
        self.from_scheduler = from_scheduler
        # From a submission: the idempotency key it was sent with (submitting again with it is safe).
        self.idempotency_key = ""


class InvalidArgument(ArylError):
    """The request is malformed (e.g. ``min_workers=0``); the message names the bad field."""


class NotFound(ArylError):
    """The job (or other object) does not exist."""


class OutOfRange(ArylError):
    """A well-formed request past the current end of something that grows (an offset past the end
    of a worker's log): unlike :class:`InvalidArgument`, the same call may succeed later."""


class AlreadyExists(ArylError):
    """The object exists already. From ``submit_job``: the user's idempotency key was used for
    another spec, and ``job_id`` is the job that holds it (read from the status details)."""

    job_id: str = ""


class FailedPrecondition(ArylError):
    """The object is in a state that refuses the call (e.g. cancelling a finished job)."""


class Unavailable(ArylError):
    """The scheduler cannot be reached (wrong address, not running, network down)."""


class DeadlineExceeded(ArylError):
    """The call did not finish within the client's timeout."""


class Aborted(ArylError):
    """A concurrent change won a race on the server; retrying the call is safe."""


_ERROR_BY_CODE: Final[Mapping[grpc.StatusCode, type[ArylError]]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.OUT_OF_RANGE: OutOfRange,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.ABORTED: Aborted,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def aryl_error(exc: grpc.RpcError) -> ArylError:
    """The typed exception for a failed call (``grpc.RpcError`` raised by calls is a ``grpc.Call``)."""
    # Seen as a plain object: grpc's type stubs give every RpcError a Call's methods, but at run time only
    # the errors that calls raise have them.
    call: object = exc
    code: grpc.StatusCode | None = None
    details: str | None = None
    trailing: Sequence[tuple[str, str | bytes]] | None = None
    if isinstance(call, grpc.Call):
        code, details, trailing = call.code(), call.details(), call.trailing_metadata()
    code = code or grpc.StatusCode.UNKNOWN
    answered = any(key == "aryl-answered-by" for key, _ in trailing or ())
    error = _ERROR_BY_CODE.get(code, ArylError)(code, details or code.name, from_scheduler=answered)
    if isinstance(error, AlreadyExists):
        error.job_id = _existing_job_id(trailing or ())
    return error


def _existing_job_id(trailing: Sequence[tuple[str, str | bytes]]) -> str:
    """The job an ALREADY_EXISTS status names in a google.rpc.ResourceInfo detail ("" if none)."""
    for key, value in trailing:
        if key != "grpc-status-details-bin" or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            info = error_details_pb2.ResourceInfo()
            if detail.Unpack(info) and info.resource_type == _JOB_RESOURCE_TYPE:
                return info.resource_name
    return ""
