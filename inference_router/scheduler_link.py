"""The router's calls to the scheduler's ``InferenceService`` (grpc.aio, one channel).

- ``watch_pool`` -- a ``PoolSource``: ``WatchServingPool``; every message is the full set, applied as
  it arrives. When the stream breaks it reconnects with backoff and keeps the last known pool in the
  meantime (routing to a stale pool beats refusing every request; a server that was drained and
  loaned meanwhile fails its connections or health checks and is ejected).
- ``report_drained`` / ``report_demand`` -- one call each, with a deadline; failures are mapped to
  ``Retryable`` (try again later) and ``Refused`` (the scheduler said no; do not retry).

Several schedulers sharing one database (``address`` "a:50051,b:50051", ``docs/ha.md``): after an
UNAVAILABLE answer or a missed deadline the link moves its channel to the leader a standby named,
else to the next address, and the call is retried as usual (``Retryable``).

It decides nothing: when to report is the router's business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import structlog

from aryl_common.backoff import Backoff
from aryl_common.channels import SchedulerAddresses, leader_hint, scheduler_aio_channel
from aryl_common.security import ClientSecurity
from inference_router.pool import PoolMember, PoolUpdate, RoutingState
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

# Codes after which a call may be sent again as it is; anything else is the scheduler refusing it.
RETRYABLE = frozenset({
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
})
ROUTING_STATES = {
    types_pb2.SERVER_STATE_SERVING: RoutingState.SERVING,
    types_pb2.SERVER_STATE_DRAINING: RoutingState.DRAINING,
}


class SchedulerCallError(Exception):
    """A call to the scheduler failed; ``code`` is the gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name} {details}".strip())
        self.code = code


class Retryable(SchedulerCallError):
    """Try again after a backoff (the scheduler is unreachable, overloaded or restarting)."""


class Refused(SchedulerCallError):
    """The scheduler rejected the call (e.g. FAILED_PRECONDITION: the server is no longer DRAINING)."""


def _call_error(exc: grpc.aio.AioRpcError) -> SchedulerCallError:
    kind = Retryable if exc.code() in RETRYABLE else Refused
    return kind(exc.code(), exc.details() or "")


def pool_update(message: inference_pb2.ServingPool) -> PoolUpdate:
    """Protobuf -> domain; servers in any state but SERVING/DRAINING are left out (not routable)."""
    members = tuple(
        PoolMember(s.server_id, s.endpoint, ROUTING_STATES[s.state])
        for s in message.servers
        if s.state in ROUTING_STATES and s.endpoint
    )
    return PoolUpdate(members, message.version)


class SchedulerLink:
    """``async with SchedulerLink(...)`` owns the channel; safe to share between the router's tasks."""

    def __init__(self, address: str, *, source: str, rpc_timeout_s: float, max_backoff_s: float,
                 security: ClientSecurity | None = None) -> None:
        self._security = security  # mutual TLS and the router's token (docs/security.md); None: plaintext
        self.address = address
        self.source = source
        self.rpc_timeout_s = rpc_timeout_s
        self.max_backoff_s = max_backoff_s
        self._addresses = SchedulerAddresses(address)
        # The agent's channel options: gRPC's reconnect backoff capped like ours, keepalive pings so
        # an idle pool watch notices a dead scheduler.
        self._channel = scheduler_aio_channel(self._addresses.current, max_backoff_s, self._security)
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._log = structlog.get_logger("inference_router").bind(scheduler=address)
        self.pool_messages = 0

    async def close(self) -> None:
        await self._channel.close()

    async def _follow_leader(self, exc: grpc.aio.AioRpcError) -> None:
        """After ``exc``: point the channel at the leader a standby named, else the next address."""
        if exc.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return
        if not leader_hint(exc) and len(self._addresses) < 2:
            return
        before = self._addresses.current
        after = self._addresses.after_failure(exc)
        if after == before:
            return
        old, self._channel = self._channel, scheduler_aio_channel(after, self.max_backoff_s, self._security)
        self._stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._log.warning("trying another scheduler", previous=before, scheduler=after)
        await old.close()

    async def __aenter__(self) -> SchedulerLink:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the pool watch (a PoolSource) -------------------------------------------------------------

    async def run(self, apply: Callable[[PoolUpdate], None]) -> None:
        """Watch the serving pool until cancelled, reconnecting with backoff."""
        backoff = Backoff.capped(self.max_backoff_s)
        while True:
            call = self._stub.WatchServingPool(inference_pb2.WatchServingPoolRequest(source=self.source))
            try:
                async for message in call:
                    if backoff.failures or self.pool_messages == 0:
                        self._log.info("serving pool watch connected", servers=len(message.servers),
                                       version=message.version)
                    backoff.reset()
                    self.pool_messages += 1
                    apply(pool_update(message))
                self._log.warning("serving pool watch ended by the scheduler; reconnecting")
            except grpc.aio.AioRpcError as exc:
                await self._follow_leader(exc)
                delay = 0.05 if leader_hint(exc) else backoff.next_delay()
                level = self._log.warning if backoff.failures <= 1 or backoff.failures % 10 == 0 else self._log.debug
                level("serving pool watch failed; keeping the last known pool and reconnecting",
                      error=str(_call_error(exc)), retry_in_s=round(delay, 2), attempt=backoff.failures)
                await asyncio.sleep(delay)
            finally:
                call.cancel()

    # -- unary calls -------------------------------------------------------------------------------

    async def report_drained(self, server_id: str) -> int:
        """ReportDrained; the server's state afterwards. Raises Retryable or Refused."""
        try:
            response = await self._stub.ReportDrained(
                inference_pb2.ReportDrainedRequest(server_id=server_id, source=self.source),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            await self._follow_leader(exc)
            raise _call_error(exc) from exc
        return response.state

    async def report_demand(self, servers_needed: int, observed_rps: float) -> inference_pb2.ReportDemandResponse:
        """ReportDemand. Raises Retryable or Refused. The scheduler refuses more servers than its
        inference pool has (INVALID_ARGUMENT): then the pool's size is reported instead (and a warning
        logged), so a load beyond the whole pool still holds every inference server rather than
        leaving the router's report to expire."""
        try:
            return await self._stub.ReportDemand(
                inference_pb2.ReportDemandRequest(
                    servers_needed=servers_needed, observed_rps=max(0.0, observed_rps), source=self.source
                ),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            await self._follow_leader(exc)
            if exc.code() is grpc.StatusCode.INVALID_ARGUMENT and servers_needed > 0:
                pool = await self._inference_pool_size()
                if pool is not None and pool < servers_needed:
                    self._log.warning("demand above the inference pool's size: reporting the pool's size",
                                      servers_needed=servers_needed, inference_servers=pool)
                    return await self.report_demand(pool, observed_rps)
            raise _call_error(exc) from exc

    async def _inference_pool_size(self) -> int | None:
        """The number of inference servers registered (GetCluster); None when it cannot be read."""
        try:
            cluster = await scheduler_pb2_grpc.SchedulerServiceStub(self._channel).GetCluster(
                scheduler_pb2.GetClusterRequest(), timeout=self.rpc_timeout_s
            )
        except grpc.aio.AioRpcError:
            return None
        return sum(p.servers for p in cluster.pools if p.pool == types_pb2.POOL_INFERENCE)
