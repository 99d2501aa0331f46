"""Forwarding one HTTP request to a backend and streaming the answer back.

What is copied: the method, the raw path and query, the headers minus the hop-by-hop ones (RFC 9110
section 7.6.1: ``Connection`` and the headers it names, ``Keep-Alive``, ``TE``, ``Trailer``,
``Transfer-Encoding``, ``Upgrade``, ``Proxy-*``), ``Expect`` (answered by the router itself) and
``Host`` (set to the backend's), plus
``X-Forwarded-For`` (the client's address appended), ``X-Forwarded-Proto`` and ``X-Forwarded-Host``.
Bodies are streamed both ways; only small ones with a known length (``SMALL_BODY_BYTES``) are
relayed in one piece, which saves system calls. Content encodings pass through untouched.

When a request is retried on another backend -- only when nothing of it can have reached the last
one, so retrying is safe even for a non-idempotent POST:
- the connection could not be opened (refused, unreachable, DNS, TLS, connect timeout); aiohttp
  opens the connection before it reads the first byte of the request body, so the body is intact;
- or the request is a GET/HEAD/OPTIONS without a body and the connection broke before any response
  byte (e.g. a pooled keep-alive connection the backend had just closed).
A POST whose connection breaks after it was sent is *not* retried (the backend may have acted on it):
the client gets 502. A response that breaks after its headers went out aborts the client's
connection, as the backend's would have. Protocol upgrades (WebSocket, h2c) are not proxied.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, MultiMapping
from yarl import URL

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "transfer-encoding", "upgrade",
})
# Bodies up to this size with a known length are relayed in one piece (one write instead of three);
# larger or chunked ones are streamed chunk by chunk.
SMALL_BODY_BYTES = 64 * 1024
IDEMPOTENT_WITHOUT_BODY = frozenset({"GET", "HEAD", "OPTIONS"})
# Failures that prove the request never reached the backend.
NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
# Failures of the connection after it was open (reset, EOF, read timeout, malformed response).
BROKEN = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError,
          asyncio.TimeoutError)
# The client's side of the relay went away.
CLIENT_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)


def _without_hop_by_hop(headers: MultiMapping[str]) -> CIMultiDict[str]:
    items = list(headers.items())
    named = {
        token.strip().lower()
        for key, value in items
        if key.lower() == "connection"
        for token in value.split(",")
    }
    return CIMultiDict((k, v) for k, v in items if k.lower() not in HOP_BY_HOP and k.lower() not in named)


def request_headers(request: web.Request) -> CIMultiDict[str]:
    """The headers to send upstream for ``request``."""
    headers = _without_hop_by_hop(request.headers)
    headers.popall("Expect", None)   # the router's own server already answered any "100-continue"
    original_host = headers.popall("Host", [request.host])[0]
    peer = request.remote or "unknown"
    previous = headers.popall("X-Forwarded-For", [])
    headers["X-Forwarded-For"] = ", ".join([*previous, peer])
    headers.setdefault("X-Forwarded-Proto", request.scheme)
    headers.setdefault("X-Forwarded-Host", original_host)
    return headers


def response_headers(upstream: aiohttp.ClientResponse) -> CIMultiDict[str]:
    return _without_hop_by_hop(upstream.headers)


class Outcome(enum.Enum):
    OK = "ok"                        # the backend answered (any status) and the answer was relayed
    NOT_SENT = "not_sent"            # nothing reached the backend: retry elsewhere
    FAILED = "failed"                # the backend may have seen the request; not retried
    ABORTED = "aborted"              # broke after the response headers went out (client connection aborted)
    CLIENT_GONE = "client_gone"      # the client went away; not the backend's fault


@dataclass
class Attempt:
    outcome: Outcome
    response: web.StreamResponse | None = None
    error: str = ""
    response_started: bool = False   # the backend's response headers arrived (it is alive)
    timed_out: bool = False          # the backend went silent for longer than request_timeout_s


async def forward(session: aiohttp.ClientSession, request: web.Request, base_url: str) -> Attempt:
    """Send ``request`` to ``base_url`` and relay the answer to the client."""
    method = request.method
    has_body = request.body_exists
    data: object = None
    if has_body:
        length = request.content_length
        # A small body of known length is read whole (once: a retry reuses the bytes), so that it leaves
        # in the same write as the headers; anything else is streamed.
        data = await request.read() if length is not None and length <= SMALL_BODY_BYTES else request.content
    url = URL(base_url + request.raw_path, encoded=True)
    try:
        async with session.request(
            method, url, headers=request_headers(request), data=data, allow_redirects=False,
        ) as upstream:
            length = upstream.content_length
            if length is not None and length <= SMALL_BODY_BYTES and method != "HEAD":
                try:
                    body = await upstream.read()
                except BROKEN as exc:
                    return Attempt(Outcome.FAILED, error=describe(exc), response_started=True,
                                   timed_out=isinstance(exc, asyncio.TimeoutError))
                return Attempt(Outcome.OK, web.Response(status=upstream.status, reason=upstream.reason,
                                                        headers=response_headers(upstream), body=body),
                               response_started=True)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                          headers=response_headers(upstream))
            try:
                await response.prepare(request)
                while chunk := await _read_upstream(upstream):
                    await response.write(chunk)
                await response.write_eof()
            except CLIENT_GONE as exc:
                return Attempt(Outcome.CLIENT_GONE, response, describe(exc), response_started=True)
            except _UpstreamBroke as broke:
                # Relaying broke mid-body: cut the client off too (it must not take a prefix for the answer).
                if request.transport is not None:
                    request.transport.close()
                return Attempt(Outcome.ABORTED, response, describe(broke.__cause__ or broke), response_started=True)
            return Attempt(Outcome.OK, response, response_started=True)
    except NOT_SENT as exc:
        return Attempt(Outcome.NOT_SENT, error=describe(exc))
    except BROKEN as exc:
        timed_out = isinstance(exc, asyncio.TimeoutError)
        retry_safe = method in IDEMPOTENT_WITHOUT_BODY and not has_body and not timed_out
        return Attempt(Outcome.NOT_SENT if retry_safe else Outcome.FAILED, error=describe(exc), timed_out=timed_out)


class _UpstreamBroke(Exception):
    """The backend's side broke while its body was being relayed (the cause is chained)."""


async def _read_upstream(upstream: aiohttp.ClientResponse) -> bytes:
    try:
        return await upstream.content.readany()
    except BROKEN as exc:
        raise _UpstreamBroke() from exc


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def json_error(status: int, error: str, detail: str, **extra: object) -> web.Response:
    """The router's own error answer: ``{"error": code, "detail": why, ...}``."""
    headers = {"Retry-After": "1"} if status == 503 else None
    return web.json_response({"error": error, "detail": detail, **extra}, status=status, headers=headers)
