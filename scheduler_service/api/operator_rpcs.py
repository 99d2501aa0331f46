"""SchedulerService's operators' RPCs: servers an operator takes out (``arylctl servers
cordon|uncordon|drain|delete``) and queues (admin-only), as a part of ``SchedulerServicer``.

What this module must never do: hold SQL or decide (it validates, calls ``app.server_admin`` and
``app.queues``, and converts), or be served on its own (it is a part of SchedulerService).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from protos.aryl.v1 import scheduler_pb2
from scheduler_service.api import convert, queue_validation, validation
from scheduler_service.api.servicer_base import ServicerBase
from scheduler_service.api.status import rpc
from scheduler_service.core.quota import DEFAULT_QUEUE
from scheduler_service.errors import InvalidArgument
from scheduler_service.records import AdminChange, QueueSettings


class OperatorRpcs(ServicerBase):
    """CordonServer, UncordonServer, DrainServer, DeleteServer and the queues' RPCs of ``SchedulerServicer``."""

    @rpc
    async def CordonServer(
        self, request: scheduler_pb2.CordonServerRequest, context: Any
    ) -> scheduler_pb2.ServerAdminResponse:
        server_id = validation.server_id("server_id", request.server_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        return await self.run(self._admin_answer, lambda: self.app.server_admin.cordon(server_id, reason))

    @rpc
    async def UncordonServer(
        self, request: scheduler_pb2.UncordonServerRequest, context: Any
    ) -> scheduler_pb2.ServerAdminResponse:
        server_id = validation.server_id("server_id", request.server_id)
        return await self.run(self._admin_answer, lambda: self.app.server_admin.uncordon(server_id))

    @rpc
    async def DrainServer(
        self, request: scheduler_pb2.DrainServerRequest, context: Any
    ) -> scheduler_pb2.ServerAdminResponse:
        server_id = validation.server_id("server_id", request.server_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        timeout_s = validation.finite("timeout_seconds", request.timeout_seconds)
        return await self.run(self._admin_answer, lambda: self.app.server_admin.drain(
            server_id, reason, timeout_s=timeout_s, force=request.force))

    @rpc
    async def DeleteServer(
        self, request: scheduler_pb2.DeleteServerRequest, context: Any
    ) -> scheduler_pb2.DeleteServerResponse:
        server_id = validation.server_id("server_id", request.server_id)

        def answer() -> scheduler_pb2.DeleteServerResponse:
            before = self.app.server_admin.server(server_id)
            change = self.app.server_admin.delete(server_id, force=request.force)
            now = self.app.server_admin.server(server_id) if not change.deleted else before
            return scheduler_pb2.DeleteServerResponse(
                deleted=change.deleted, message=change.message,
                server=convert.server(now) if now is not None else None,
            )

        return await self.run(answer)

    # Queues: admin-only (not listed in ``auth.METHOD_ROLES``, so only admins may call them).

    @rpc
    async def CreateQueue(self, request: scheduler_pb2.CreateQueueRequest, context: Any) -> scheduler_pb2.QueueResponse:
        q = request.queue
        settings = QueueSettings(
            name=queue_validation.queue_name("queue.name", q.name),
            quota_gpus=queue_validation.gpu_count("queue.quota_gpus", q.quota_gpus),
            borrow_limit_gpus=(queue_validation.gpu_count("queue.borrow_limit_gpus", q.borrow_limit_gpus)
                               if q.HasField("borrow_limit_gpus") else None),
            cohort=queue_validation.cohort_name("queue.cohort", q.cohort), fair_share=q.fair_share,
        )
        return await self.run(
            lambda: scheduler_pb2.QueueResponse(queue=convert.queue(self.app.queues.create(settings))))

    @rpc
    async def UpdateQueue(self, request: scheduler_pb2.UpdateQueueRequest, context: Any) -> scheduler_pb2.QueueResponse:
        name = queue_validation.queue_name("name", request.name)
        change: dict[str, object] = {}
        if request.HasField("cohort"):
            change["cohort"] = queue_validation.cohort_name("cohort", request.cohort)
        if request.HasField("quota_gpus"):
            change["quota_gpus"] = queue_validation.gpu_count("quota_gpus", request.quota_gpus)
        if request.quota_rest:
            if name != DEFAULT_QUEUE:
                raise InvalidArgument("quota_rest", f'only "default" may have the rest as its quota, not {name!r}')
            if "quota_gpus" in change:
                raise InvalidArgument("quota_rest", "contradicts quota_gpus: give one of them")
            change["quota_gpus"] = None  # the rest (``core.quota``)
        if request.HasField("borrow_limit_gpus") and request.unlimited_borrowing:
            raise InvalidArgument("unlimited_borrowing", "contradicts borrow_limit_gpus: give one of them")
        if request.HasField("borrow_limit_gpus"):
            change["borrow_limit_gpus"] = queue_validation.gpu_count("borrow_limit_gpus", request.borrow_limit_gpus)
        if request.unlimited_borrowing:
            change["borrow_limit_gpus"] = None
        if request.HasField("fair_share"):
            change["fair_share"] = request.fair_share
        return await self.run(
            lambda: scheduler_pb2.QueueResponse(queue=convert.queue(self.app.queues.update(name, change))))

    @rpc
    async def DeleteQueue(
        self, request: scheduler_pb2.DeleteQueueRequest, context: Any
    ) -> scheduler_pb2.DeleteQueueResponse:
        name = queue_validation.queue_name("name", request.name)
        await self.run(self.app.queues.delete, name)
        return scheduler_pb2.DeleteQueueResponse()

    @rpc
    async def ListQueues(
        self, request: scheduler_pb2.ListQueuesRequest, context: Any
    ) -> scheduler_pb2.ListQueuesResponse:
        return await self.run(
            lambda: scheduler_pb2.ListQueuesResponse(queues=[convert.queue(s) for s in self.app.queues.all()]))

    def _admin_answer(self, change: Callable[[], AdminChange]) -> scheduler_pb2.ServerAdminResponse:
        done = change()
        server = self.app.server_admin.server(done.server_id)
        return scheduler_pb2.ServerAdminResponse(
            server=convert.server(server) if server is not None else None, message=done.message)
