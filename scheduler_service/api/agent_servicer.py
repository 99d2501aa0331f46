"""AgentService: what node agents call (register, report status, deregister, watch their server's
desired state).

A server's desired state is streamed from a fan-out fed after commits (``scheduler_service.notify``):
one read per burst of decisions feeds every agent's stream. Where the service runs the streams in a
process of their own (``scheduler_service.push_process``), ``RegisterServer`` names that process's port in
its initial metadata (``DESIRED_STATE_PORT_KEY``): an agent that knows the key watches there, on the
same host, and a push never waits for this process's interpreter; ``WatchDesiredState`` is served here
too, for agents that do not. Where a live standby's process serves too, it is named first
(``DESIRED_STATE_ADDRESS_KEY``, host:port; ``app.replicas`` chooses which), and this one is the fallback.
``DesiredStateStreams`` is that process's service: the same stream, and nothing else. Most status reports are
answered from memory, on the event loop. What this module must never do: hold SQL or decide (it validates,
calls ``app.agents`` and converts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import structlog

from aryl_common.channels import DESIRED_STATE_ADDRESS_KEY, DESIRED_STATE_PORT_KEY
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc
from scheduler_service.api import agent_validation, auth, convert, validation
from scheduler_service.api.servicer_base import ServicerBase
from scheduler_service.api.status import rpc
from scheduler_service.notify.desired_states import DesiredStateFeed
from scheduler_service.records import DesiredServerState

log = structlog.get_logger("aryl.api")


async def watch_desired_state(
    feed: DesiredStateFeed[DesiredServerState], request: agent_pb2.WatchDesiredStateRequest, *,
    refresh_s: float, grace_period_s: float,
) -> AsyncIterator[agent_pb2.DesiredState]:
    """The desired state of the request's server now and at each new generation (``DesiredStateFeed.watch``);
    only its own agent may watch it (``auth.require_server``)."""
    server_id = validation.server_id("server_id", request.server_id)
    auth.require_server(server_id)
    async for desired in feed.watch(server_id, refresh_s=refresh_s):
        yield convert.desired_state(desired, grace_period_s=grace_period_s)


class AgentServicer(ServicerBase, agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self, *args: Any, report_interval_s: float, grace_period_s: float, desired_state_refresh_s: float = 30.0,
        endpoint_allow: Sequence[str] = (), desired_state_port: Callable[[], int | None] = lambda: None,
        desired_state_address: Callable[[str], str | None] = lambda server_id: None,
    ) -> None:
        super().__init__(*args)
        self._push_port = desired_state_port  # the streams' own process's port, once it serves (push_process)
        self._push_address = desired_state_address  # another replica's process for a server (app.replicas)
        self._watching: dict[str, int] = {}  # streams open here, per server (``watching``)
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
        metadata: list[tuple[str, str]] = []
        if port := self._push_port():
            metadata.append((DESIRED_STATE_PORT_KEY, str(port)))
        if address := self._push_address(desired.server_id):
            metadata.append((DESIRED_STATE_ADDRESS_KEY, address))
        if metadata:
            await context.send_initial_metadata(tuple(metadata))
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
        assert self.notifier.desired_states is not None, "the service serves desired states before agents"
        server_id = request.server_id
        self._watching[server_id] = self._watching.get(server_id, 0) + 1
        try:
            async for desired in watch_desired_state(self.notifier.desired_states, request,
                                                     refresh_s=self._refresh_s, grace_period_s=self._grace):
                yield desired
        finally:
            left = self._watching.pop(server_id, 1) - 1
            if left > 0:
                self._watching[server_id] = left

    def watching(self, server_id: str) -> bool:
        """Whether a desired-state stream of ``server_id`` is open here (from any thread:
        ``Agents.read_in_transaction_only``)."""
        return server_id in self._watching


class DesiredStateStreams(agent_pb2_grpc.AgentServiceServicer):
    """The AgentService of the desired-state streams' own process (``push_process``): ``WatchDesiredState``
    from ``feed``, as ``AgentServicer`` serves it; every other method is UNIMPLEMENTED there (an agent
    registers and reports to the scheduler itself)."""

    def __init__(self, feed: DesiredStateFeed[DesiredServerState], *, refresh_s: float,
                 grace_period_s: float) -> None:
        self._feed = feed
        self._refresh_s = refresh_s
        self._grace = grace_period_s

    @rpc
    async def WatchDesiredState(
        self, request: agent_pb2.WatchDesiredStateRequest, context: Any
    ) -> AsyncIterator[agent_pb2.DesiredState]:
        async for desired in watch_desired_state(self._feed, request, refresh_s=self._refresh_s,
                                                 grace_period_s=self._grace):
            yield desired
