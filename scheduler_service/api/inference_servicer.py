"""InferenceService: what the inference router calls (report demand, read it, watch the serving pool,
report a server drained).

The serving pool is streamed from an in-process fan-out fed after commits (``scheduler_service.notify``);
its streams count in the watch-stream limits (``stream_limits``). What this module must never do: hold
SQL or decide loans and reclaims (the cycle does; it validates, calls ``app.inference`` and converts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import structlog

from protos.aryl.v1 import inference_pb2, inference_pb2_grpc
from scheduler_service.api import auth, convert, validation
from scheduler_service.api.servicer_base import ServicerBase, refuse_stream
from scheduler_service.api.status import rpc
from scheduler_service.api.stream_limits import TooManyStreams

log = structlog.get_logger("aryl.api")


class InferenceServicer(ServicerBase, inference_pb2_grpc.InferenceServiceServicer):
    @rpc
    async def ReportDemand(
        self, request: inference_pb2.ReportDemandRequest, context: Any
    ) -> inference_pb2.ReportDemandResponse:
        # More than the inference pool's servers: InvalidArgument from the store, which counts them.
        rps = validation.finite("observed_rps", request.observed_rps)
        source = auth.require_router() or validation.text("source", request.source, max_len=253) or context.peer()[:253]
        report, serving, loaned = await self.run(self.app.inference.report_demand, request.servers_needed, rps, source)
        return inference_pb2.ReportDemandResponse(
            demand=convert.demand(report), servers_serving=serving, servers_loaned=loaned
        )

    @rpc
    async def GetDemand(self, request: inference_pb2.GetDemandRequest, context: Any) -> inference_pb2.GetDemandResponse:
        return inference_pb2.GetDemandResponse(demand=convert.demand(await self.run(self.app.inference.latest_demand)))

    @rpc
    async def WatchServingPool(
        self, request: inference_pb2.WatchServingPoolRequest, context: Any
    ) -> AsyncIterator[inference_pb2.ServingPool]:
        source = auth.require_router() or validation.text("source", request.source, max_len=253) or context.peer()[:253]
        pool = self.notifier.serving_pool
        assert pool is not None, "the service serves the serving pool before streams"
        try:
            with self.stream_limits.admit(context.peer(), auth.principal()):
                log.info("serving pool watched", source=source)
                # One shared read per change (every server state change appends an event), yielded when
                # the servers changed.
                async for version, servers in pool.watch():
                    yield inference_pb2.ServingPool(
                        version=version,
                        servers=[
                            inference_pb2.RoutableServer(
                                server_id=sid, endpoint=endpoint, state=convert.server_state(state)
                            )
                            for sid, endpoint, state in servers
                        ],
                    )
        except TooManyStreams as exc:
            await refuse_stream(context, exc)

    @rpc
    async def ReportDrained(
        self, request: inference_pb2.ReportDrainedRequest, context: Any
    ) -> inference_pb2.ReportDrainedResponse:
        server_id = validation.server_id("server_id", request.server_id)
        source = auth.require_router() or validation.text("source", request.source, max_len=253) or context.peer()[:253]
        state = await self.run(self.app.inference.report_drained, server_id, source)
        return inference_pb2.ReportDrainedResponse(state=convert.server_state(state))
