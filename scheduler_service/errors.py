"""Typed application errors. Each maps to one gRPC status and carries what the user must fix."""

from __future__ import annotations


class AppError(Exception):
    """Base: ``str(err)`` is the message a user reads (via the gRPC status details)."""


class FieldError(AppError):
    """An error about one field of the request: ``field`` names it, ``reason`` says what is wrong."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidArgument(FieldError):
    """A malformed request: it fails again until the field is fixed."""


class OutOfRange(FieldError):
    """A well-formed request past the current end of something that may grow (e.g. an offset past
    the end of a worker's log): unlike ``InvalidArgument``, the same request may succeed later."""


class NotFound(AppError):
    pass


class AlreadyExists(AppError):
    pass


class PermissionDenied(AppError):
    """The caller is known but may not do this (``scheduler_service.api.auth``); the message names what
    was missing."""


class FailedPrecondition(AppError):
    pass


class Aborted(AppError):
    """A concurrent change won the race; retrying the request is safe."""


class Unavailable(AppError):
    """A part the request needs (e.g. a server's agent) cannot be reached now; retry later."""


# -- the store's refusals: a write broke one of its unique keys ---------------------------------------
# Raised by ``scheduler_service.store`` (``Transactions.write``, ``store.db.refusal``) in place of the
# database driver's integrity error, so the use cases never see SQL. Not answers by themselves (no gRPC
# status): the use case that wrote decides what its caller reads, and one that reaches the API
# unanswered is an internal error, as the driver's was.


class KeyTaken(Exception):
    """A job being inserted repeats the idempotency key its user gave an earlier job (the unique key
    ``uq_jobs_user_idempotency_key``; or two submissions of one insert). Nothing was written; the
    caller finds out which key and which job (``JobStore.by_key``)."""


class GpuTaken(Exception):
    """A server reports a GPU whose UUID is registered to another server (the unique key ``uq_gpus_uuid``).
    Nothing was written."""
