"""The leader gate: on a scheduler that shares its PostgreSQL database with others (``app.lease``),
only the leader serves the Aryl services; a standby answers every call UNAVAILABLE, naming the leader.

A standby *redirects* rather than answering reads itself: watch streams are fed by the leader's own
commits (``scheduler_service.notify``), GetCluster reports the leader's epoch, and agents must report to
the scheduler that judges their liveness -- one rule for every call (go to the leader) is simpler for
clients than two, and costs them one extra round trip after a failover.

The answer carries the leader's address twice: in the message ("the leader is at HOST:PORT; retry
there") for people, and as the trailing metadata ``aryl-leader`` (``aryl_common.channels``) for
clients, which switch to it. Health checking and reflection stay open on a standby (it is a healthy
process). Streams opened on a leader end UNAVAILABLE as soon as it steps down, so agents and routers
move to the next leader instead of hearing nothing.

Never: decide who leads (``app.lease`` does).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from aryl_common.channels import LEADER_METADATA_KEY
from scheduler_service.app.lease import Leadership, NotLeader

OPEN_PREFIXES = ("/grpc.health.", "/grpc.reflection.")


class LeaderGate(grpc.aio.ServerInterceptor):
    """Pass-through until ``attach`` (SQLite: never attached, one scheduler). ``term_began`` and
    ``term_ended`` are called on the event loop's thread (``loop.call_soon_threadsafe``)."""

    def __init__(self) -> None:
        self._leadership: Leadership | None = None
        self._term_over = asyncio.Event()
        self._term_over.set()

    def attach(self, leadership: Leadership) -> None:
        self._leadership = leadership

    def term_began(self) -> None:
        self._term_over = asyncio.Event()

    def term_ended(self) -> None:
        self._term_over.set()

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        leadership = self._leadership
        method: str = handler_call_details.method
        if leadership is None or handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        if not leadership.leading:
            return _refusing(handler, leadership.not_leader())
        if handler.unary_stream is not None:
            return _ending_with_term(handler, self._term_over, leadership)
        return handler


async def _abort(context: grpc.aio.ServicerContext, refusal: NotLeader) -> None:
    await context.abort(grpc.StatusCode.UNAVAILABLE, str(refusal),
                        trailing_metadata=((LEADER_METADATA_KEY, refusal.leader),) if refusal.leader else ())


def _refusing(handler: grpc.RpcMethodHandler[Any, Any], refusal: NotLeader) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of ``handler``'s kind that answers UNAVAILABLE naming the leader."""

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await _abort(context, refusal)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await _abort(context, refusal)
        yield  # pragma: no cover - abort raises; this makes an async generator

    codec = {"request_deserializer": handler.request_deserializer,
             "response_serializer": handler.response_serializer}
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary, **codec)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming, **codec)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary, **codec)
    return grpc.stream_stream_rpc_method_handler(streaming, **codec)


def _ending_with_term(handler: grpc.RpcMethodHandler[Any, Any], term_over: asyncio.Event,
                      leadership: Leadership) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` (server streaming), ended UNAVAILABLE when this scheduler's term ends. Each item is
    awaited in a task of its own, which copies this call's context (what an outer interceptor set)."""
    behavior: Any = handler.unary_stream

    async def guarded(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        items = behavior(request, context).__aiter__()
        over = asyncio.ensure_future(term_over.wait())
        following: asyncio.Future[Any] | None = None
        try:
            while True:
                following = asyncio.ensure_future(items.__anext__())
                await asyncio.wait({following, over}, return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    await _abort(context, leadership.not_leader())  # the finally ends the servicer's stream
                try:
                    item = following.result()
                except StopAsyncIteration:
                    return
                yield item
        finally:
            # The term ended, the client went away or the stream ended: the servicer's generator is
            # finished here (cancelled mid-item if need be), never left running.
            over.cancel()
            if following is not None and not following.done():
                following.cancel()
                await asyncio.gather(following, return_exceptions=True)
            close = getattr(items, "aclose", None)
            if close is not None:
                await close()

    return grpc.unary_stream_rpc_method_handler(
        guarded, request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
