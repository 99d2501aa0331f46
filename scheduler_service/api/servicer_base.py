"""What the three gRPC services share: a use case run in a worker thread with the caller's context
(``api.auth``, recorded by events), the job-owner check, and the refusal of a watch stream beyond a
limit (``stream_limits``).

Each method of a service: validate -> call the use case it needs (``scheduler_service.app``) in a worker
thread -> convert the answer. What this module must never do: hold state of its own beyond the shared
stream limits, or decide anything (the use cases do).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import structlog

from scheduler_service.api import auth
from scheduler_service.api.status import ANSWERED_BY_KEY
from scheduler_service.api.stream_limits import StreamLimits, TooManyStreams
from scheduler_service.app import SchedulerApp
from scheduler_service.notify.notifier import AsyncNotifier

T = TypeVar("T")
log = structlog.get_logger("aryl.api")


class ServicerBase:
    """The use cases (``app``), the RPC threads, the post-commit fan-outs (``notifier``) and the watch-stream
    limits that a service's methods share."""

    def __init__(
        self, app: SchedulerApp, executor: ThreadPoolExecutor, notifier: AsyncNotifier, *,
        stream_limits: StreamLimits | None = None,
    ) -> None:
        self.app = app
        self._executor = executor
        self.notifier = notifier
        # Shared by the services whose watch streams count together (server.max_watch_streams*).
        self.stream_limits = stream_limits or StreamLimits(per_client=64, total=1024)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the caller (api.auth) goes along: events record it
        return await loop.run_in_executor(self._executor, lambda: context.run(fn, *args, **kwargs))

    async def require_job_owner(self, job_id: int, what: str = "") -> None:
        """PermissionDenied unless the caller owns job ``job_id`` or is an admin (api.auth)."""
        if auth.needs_owner_check():
            record, _ = await self.run(self.app.jobs.get, job_id)
            auth.require_owner(record.user, what or f"job {job_id}")


async def refuse_stream(context: Any, exc: TooManyStreams) -> None:
    """RESOURCE_EXHAUSTED for a watch stream beyond a limit; the message names the limit and its setting."""
    log.warning("watch stream refused", peer=context.peer(), reason=str(exc))
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc),
                        trailing_metadata=((ANSWERED_BY_KEY, "aryl-scheduler"),))
