"""AgentService: what node agents call (register, report status, deregister, watch their server's
desired state).

A server's desired state is streamed from an in-process fan-out fed after commits
(``scheduler_service.notify``): one read per burst of decisions feeds every agent's stream.
Most status reports are answered from memory, on the event loop. What this module must never do: hold
SQL or decide (it validates, calls ``app.agents`` and converts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import structlog

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc
from scheduler_service.api import agent_validation, auth, convert, validation
from scheduler_service.api.servicer_base import ServicerBase
from scheduler_service.api.status import rpc

log = structlog.get_logger("aryl.api")


class AgentServicer(ServicerBase, agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self, *args: Any, report_interval_s: float, grace_period_s: float, desired_state_refresh_s: float = 30.0,
        endpoint_allow: Sequence[str] = (),
    ) -> None:
        super().__init__(*args)
        self._endpoint_allow = tuple(endpoint_allow)  # [inference] endpoint_allow (api.agent_validation)
        self._report_interval = report_interval_s
        self._refresh_s = desired_state_refresh_s
        self._grace = grace_period_s

    @rpc
    async def RegisterServer(
        self, request: agent_pb2.RegisterServerRequest, context: Any
    ) -> agent_pb2.RegisterServerResponse:
        registration = agent_validation.registration(request)
        auth.require_server(registration.hostname)
        agent_validation.allowed_endpoint(registration, self._endpoint_allow, context.peer())
        desired = await self.run(self.app.agents.register, registration)
        log.info("server registered", server=desired.server_id, pool=registration.pool, gpus=len(registration.gpus))
        return agent_pb2.RegisterServerResponse(
            server_id=desired.server_id, scheduler_epoch=desired.epoch,
            report_interval=convert.duration(self._report_interval),
            desired=convert.desired_state(desired, grace_period_s=self._grace),
        )

    @rpc
    async def ReportStatus(
        self, request: agent_pb2.ReportStatusRequest, context: Any
    ) -> agent_pb2.ReportStatusResponse:
        report = agent_validation.status_report(request)
        auth.require_server(report.server_id)
        # Most reports say nothing new and are answered from memory, here on the loop: a thread hop
        # per report would cost more than the answer (1,000s of agents report every few seconds).
        generation = self.app.agents.answer_from_memory(report)
        if generation is None:
            generation = await self.run(self.app.agents.report_status, report)
        return agent_pb2.ReportStatusResponse(
            desired_generation=generation, report_interval=convert.duration(self._report_interval)
        )

    @rpc
    async def Deregister(self, request: agent_pb2.DeregisterRequest, context: Any) -> agent_pb2.DeregisterResponse:
        server_id = validation.server_id("server_id", request.server_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        auth.require_server(server_id)
        await self.run(self.app.agents.deregister, server_id, reason)
        log.info("server deregistered: its agent left", server=server_id, reason=reason)
        return agent_pb2.DeregisterResponse()

    @rpc
    async def WatchDesiredState(
        self, request: agent_pb2.WatchDesiredStateRequest, context: Any
    ) -> AsyncIterator[agent_pb2.DesiredState]:
        server_id = validation.server_id("server_id", request.server_id)
        auth.require_server(server_id)
        assert self.notifier.desired_states is not None, "the service serves desired states before agents"
        async for desired in self.notifier.desired_states.watch(server_id, refresh_s=self._refresh_s):
            yield convert.desired_state(desired, grace_period_s=self._grace)
