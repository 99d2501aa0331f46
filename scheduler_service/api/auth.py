"""Authentication and authorisation of every RPC (docs/security.md).

``AuthInterceptor`` (one gRPC server interceptor) authenticates each call by its bearer token
(``authorization: Bearer TOKEN``, looked up in the token file), checks the method's roles
(``METHOD_ROLES``), and makes the caller available to the servicer (``caller()``) for the checks
that need the request: a job's owner, an agent's own server id (``require_server``). Missing or
unknown credentials: UNAUTHENTICATED; a role or object not allowed: PERMISSION_DENIED naming what
was missing. Health checking and reflection stay open (they name no job and change nothing).

Streams (``WatchEvents``, ``WatchServingPool``, the agents' ``WatchDesiredState``) are authorised
again while they run, not only when they open (``_OpenStreams``): about every ``STREAM_RECHECK_S``
the token file is looked at (``TokenFile`` reads it again when it changed), and a stream whose token
no longer names the same principal (revoked, or given another role or name), or whose client
certificate has expired, ends with UNAUTHENTICATED. Bound: within STREAM_RECHECK_S + the token
file's check interval (1 s each: about 2 s) of the change or the expiry. Every call is refused
(UNAUTHENTICATED) once its client certificate is past its notAfter: TLS checks the dates only at the
handshake, so a connection made before the expiry would otherwise go on being served.

With ``security.insecure`` the interceptor is not installed and ``caller()`` is None: every check
here then allows (the development mode without identities).
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import grpc
import structlog
from cryptography import x509

from aryl_common.security import (
    AUTH_METADATA_KEY,
    BEARER,
    Principal,
    TokenFile,
    hash_token,
    lookup_token,
    peer_names,
)
from scheduler_service.audit import ACTOR
from scheduler_service.errors import PermissionDenied

log = structlog.get_logger("aryl.auth")

_SCHED = "/aryl.v1.SchedulerService/"
_AGENT = "/aryl.v1.AgentService/"
_INFER = "/aryl.v1.InferenceService/"
USER_ROLES: Final = frozenset({"user", "admin"})
ADMIN: Final = frozenset({"admin"})
AGENT: Final = frozenset({"agent", "admin"})
ROUTER: Final = frozenset({"router", "admin"})
READERS: Final = frozenset({"user", "admin", "router"})

# The roles allowed to call each method; a method not listed is refused to all but admins (so a new
# RPC is closed until someone decides who may call it). Checks of the request's objects (own job,
# own server) are the servicer's, through ``require_owner``/``require_server``.
METHOD_ROLES: Final[Mapping[str, frozenset[str]]] = {
    _SCHED + "SubmitJob": USER_ROLES,
    _SCHED + "SubmitJobs": USER_ROLES,
    _SCHED + "GetJob": USER_ROLES,
    _SCHED + "ListJobs": USER_ROLES,
    _SCHED + "CancelJob": USER_ROLES,
    _SCHED + "CancelJobArray": USER_ROLES,
    _SCHED + "WatchEvents": USER_ROLES,
    _SCHED + "ExplainJob": USER_ROLES,
    _SCHED + "GetJobLogs": USER_ROLES,
    _SCHED + "GetCluster": READERS,
    _SCHED + "ListServers": READERS,
    _SCHED + "ListLoans": READERS,
    _SCHED + "PreviewReclaim": ADMIN,
    _SCHED + "CordonServer": ADMIN,
    _SCHED + "UncordonServer": ADMIN,
    _SCHED + "DrainServer": ADMIN,
    _SCHED + "DeleteServer": ADMIN,
    _SCHED + "CreateQueue": ADMIN,
    _SCHED + "UpdateQueue": ADMIN,
    _SCHED + "DeleteQueue": ADMIN,
    _SCHED + "ListQueues": READERS,
    _SCHED + "WhatIf": ADMIN,  # the whole cluster's future, other users' jobs included; seconds of CPU
    _AGENT + "RegisterServer": AGENT,
    _AGENT + "ReportStatus": AGENT,
    _AGENT + "Deregister": AGENT,
    _AGENT + "WatchDesiredState": AGENT,
    _INFER + "ReportDemand": ROUTER,
    _INFER + "ReportDrained": ROUTER,
    _INFER + "WatchServingPool": ROUTER,
    _INFER + "GetDemand": READERS,
}
OPEN_PREFIXES: Final = ("/grpc.health.v1.Health/", "/grpc.reflection.")

# How often open streams are authorised again (the token file looked at, certificates' expiry checked).
# A look at an unchanged file is one stat(); a changed file costs one dictionary lookup per open stream.
STREAM_RECHECK_S: Final = 1.0


class Caller:
    """An authenticated call's principal and the names of its client certificate (empty without TLS)."""

    __slots__ = ("cert_names", "max_user_priority", "principal")

    def __init__(self, principal: Principal, cert_names: frozenset[str] | None, max_user_priority: int) -> None:
        self.principal = principal
        self.cert_names = cert_names  # None without TLS
        self.max_user_priority = max_user_priority

    @property
    def name(self) -> str:
        return self.principal.name

    @property
    def is_admin(self) -> bool:
        return self.principal.role == "admin"


_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("aryl_caller", default=None)


def caller() -> Caller | None:
    """The current call's caller; None when the scheduler runs without identities (``security.insecure``)."""
    return _CALLER.get()


def actor() -> str:
    """``role:name`` of the current call's caller ("" without identities): the event log's ``actor``."""
    who = _CALLER.get()
    return str(who.principal) if who is not None else ""


def principal() -> Principal | None:
    """The current call's principal; None without identities."""
    who = _CALLER.get()
    return who.principal if who is not None else None


def require_owner(owner: str, what: str) -> None:
    """PermissionDenied unless the caller owns ``what`` (its ``owner``) or is an admin."""
    who = _CALLER.get()
    if who is None or who.is_admin or who.name == owner:
        return
    raise PermissionDenied(f"{what} belongs to another user; only its owner or an admin may do this "
                           f"(you are {who.principal})")


def require_server(server_id: str) -> None:
    """PermissionDenied unless the caller is the agent of ``server_id`` (token and, with TLS, its client
    certificate both naming it) or an admin."""
    who = _CALLER.get()
    if who is None or who.is_admin:
        return
    if who.name != server_id:
        raise PermissionDenied(f"agent {who.name!r} may only act for its own server, not {server_id!r}")
    if who.cert_names is not None and server_id not in who.cert_names:
        raise PermissionDenied(f"the client certificate does not name server {server_id!r} "
                               f"(it names {', '.join(sorted(who.cert_names)) or 'nothing'}); an agent presents "
                               "a certificate issued for its own server id")


def require_router() -> str:
    """The calling router's id, which its reports are recorded under; "" without identities and for an
    admin (whose request then names the source)."""
    who = _CALLER.get()
    if who is None:
        return ""
    if who.principal.role == "router" and who.cert_names is not None and who.name not in who.cert_names:
        raise PermissionDenied(f"the client certificate does not name router {who.name!r}; a router presents a "
                               "certificate issued for its own router id")
    return who.name if who.principal.role == "router" else ""


def needs_owner_check() -> bool:
    """Whether the caller's access to a job depends on who owns it (a non-admin with identities on)."""
    who = _CALLER.get()
    return who is not None and not who.is_admin


def own_spec(spec: Any, where: str = "spec") -> None:
    """Set ``spec.user`` to the owner (``owner_for``) and refuse a priority above the caller's ceiling
    (security.max_user_priority) unless the caller is an admin. Changes ``spec`` in place."""
    who = _CALLER.get()
    if who is None:
        return
    spec.user = owner_for(spec.user, where)
    if not who.is_admin and spec.priority > who.max_user_priority:
        raise PermissionDenied(f"{where}.priority {spec.priority} is above {who.max_user_priority} "
                               "(security.max_user_priority); only an admin may submit above it")


def owner_for(requested_user: str, where: str = "spec") -> str:
    """The owner of a submission: the caller. A ``user`` field naming someone else is refused unless the
    caller is an admin (who submits on that user's behalf); an empty field means the caller."""
    who = _CALLER.get()
    if who is None:
        return requested_user
    if not requested_user or requested_user == who.name:
        return who.name
    if who.is_admin:
        return requested_user
    raise PermissionDenied(f"{where}.user {requested_user!r} is not you ({who.principal}); a job's owner is the "
                           "authenticated caller: leave user empty or name yourself (only an admin submits for others)")


def _details(token_problem: str) -> str:
    return (f"{token_problem}; send 'authorization: Bearer TOKEN' (arylctl login, ARYL_TOKEN; the token file is "
            "security.tokens_file on the scheduler)")


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates every call but health and reflection, and checks the method's roles."""

    def __init__(self, tokens: Mapping[str, Principal] | TokenFile, *, tls: bool, max_user_priority: int = 100,
                 stream_recheck_s: float = STREAM_RECHECK_S) -> None:
        # A TokenFile is read again when it changes (revocation without a restart); a mapping is fixed.
        if isinstance(tokens, TokenFile):
            self._tokens: Callable[[], Mapping[str, Principal]] = tokens.current
        else:
            fixed = dict(tokens)
            self._tokens = lambda: fixed
        self._tls = tls
        self._max_priority = max_user_priority
        self.streams = _OpenStreams(self._tokens, stream_recheck_s)

    def _authenticate(self, method: str, context: Any) -> tuple[Caller, str, float | None]:
        """The caller, the hash of the token it presented, and when its client certificate expires
        (None without TLS). A certificate past its notAfter is refused here, on every call: TLS checks
        the dates only at the handshake, and a connection made before the expiry stays up."""
        token = ""
        for key, value in context.invocation_metadata() or ():
            if key == AUTH_METADATA_KEY and isinstance(value, str):
                token = value[len(BEARER):].strip() if value.startswith(BEARER) else ""
                break
        else:
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED, _details("no credentials"))
        principal = lookup_token(self._tokens(), token) if token else None
        if principal is None:
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED, _details("unknown or malformed bearer token"))
        roles = METHOD_ROLES.get(method, ADMIN)
        if principal.role not in roles:
            raise _Refused(grpc.StatusCode.PERMISSION_DENIED,
                           f"{method.rsplit('/', 1)[-1]} needs role {' or '.join(sorted(roles))}; "
                           f"you are {principal}")
        names = expires = None
        if self._tls:
            auth_context = context.auth_context()
            expires = certificate_expiry(auth_context)
            if expires is not None and _now() >= expires:
                raise _Refused(grpc.StatusCode.UNAUTHENTICATED, certificate_expired(principal, expires))
            names = peer_names(auth_context)
        return Caller(principal, names, self._max_priority), hash_token(token), expires

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        authenticate = self._authenticate

        async def admit(context: Any) -> tuple[Caller, str, float | None]:
            try:
                return authenticate(method, context)
            except _Refused as refused:
                await refused.abort(context, method)
                raise  # not reached: abort raises

        if handler.unary_unary is not None:
            inner_uu: Any = handler.unary_unary

            async def unary_unary(request: Any, context: Any) -> Any:
                who, _, _ = await admit(context)
                token, actor_token = _CALLER.set(who), ACTOR.set(str(who.principal))
                try:
                    return await inner_uu(request, context)
                finally:
                    _CALLER.reset(token)
                    ACTOR.reset(actor_token)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.unary_stream is not None:
            inner_us: Any = handler.unary_stream

            streams = self.streams

            async def unary_stream(request: Any, context: Any) -> AsyncIterator[Any]:
                who, token_hash, expires = await admit(context)
                _CALLER.set(who)  # this stream's own task: nothing to reset
                ACTOR.set(str(who.principal))
                stream = streams.opened(method, context, who.principal, token_hash, expires)
                items = inner_us(request, context)
                try:
                    while not stream.ended:
                        stream.waiting = True  # ending it now may interrupt this wait
                        try:
                            item = await anext(items)
                        except StopAsyncIteration:
                            return
                        finally:
                            stream.waiting = False
                        if stream.ended:
                            return  # its status is sent: nothing more goes out
                        yield item
                except asyncio.CancelledError:
                    if stream.ended:
                        return  # ended by _OpenStreams, which sent its status
                    raise
                finally:
                    streams.closed(stream)
                    await items.aclose()  # its own clean-up (stream places, watcher counts) now, not at collection

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        raise TypeError(f"{method}: client-streaming methods are not authenticated by this interceptor")


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    async def abort(self, context: Any, method: str) -> None:
        log.info("call refused", method=method, code=self.code.name, peer=context.peer(), reason=self.message)
        await context.abort(self.code, self.message)


def certificate_expiry(auth_context: Mapping[str, Any]) -> float | None:
    """When the peer's verified client certificate expires (Unix time), or None without one."""
    pems = auth_context.get("x509_pem_cert") or ()
    for pem in pems:
        return _not_after(bytes(pem))
    return None


@functools.lru_cache(maxsize=16_384)
def _not_after(pem: bytes) -> float | None:
    # Parsed once per certificate, not once per call: a connection presents the same one on every call. Sized
    # for a fleet of up to ~16,000 agents with a certificate each (a PEM of ~1-2 KB a key: tens of MB at most):
    # at 1,024, a fleet of more than ~1,000 cycled the cache and parsed a certificate on every call (~40 us).
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    except ValueError:
        return None


def _now() -> float:
    """The wall clock's Unix time: certificates' notAfter is a wall-clock time."""
    return datetime.datetime.now(datetime.UTC).timestamp()


def certificate_expired(who: Principal, expires: float) -> str:
    """Why a call of ``who`` is refused, or its stream ended, after its client certificate expired (at
    ``expires``), and the fix."""
    when = datetime.datetime.fromtimestamp(expires, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"the client certificate of {who} expired at {when} (its notAfter); connect again with a "
            "certificate valid now, issued by the cluster's CA (a development CA: arylctl certs renew DIR issues "
            "its certificates again, same keys; docs/security.md)")


class _Stream:
    __slots__ = ("context", "ended", "expires", "method", "principal", "task", "token_hash", "waiting")

    def __init__(self, method: str, context: Any, principal: Principal, token_hash: str,
                 expires: float | None) -> None:
        self.method = method
        self.context = context
        self.principal = principal
        self.token_hash = token_hash
        self.expires = expires
        self.task = asyncio.current_task()
        self.waiting = False  # suspended in the servicer (not in a send): cancelling it ends it there
        self.ended = False


class _OpenStreams:
    """The open streams' principals, authorised again about every ``recheck_s`` by one task on the loop
    (while any stream is open; none otherwise). A stream whose token no longer names its principal, or
    whose certificate has expired, is ended with UNAUTHENTICATED: its status is sent at once, and the
    servicer's generator is cancelled where it waits (or stops at its next item, if it was sending)."""

    def __init__(self, tokens: Callable[[], Mapping[str, Principal]], recheck_s: float) -> None:
        self._tokens = tokens
        self.recheck_s = recheck_s
        self._open: set[_Stream] = set()
        self._checker: asyncio.Task[None] | None = None
        self.ended = 0  # streams ended by a re-check (tests, logs)

    def opened(self, method: str, context: Any, principal: Principal, token_hash: str,
               expires: float | None) -> _Stream:
        stream = _Stream(method, context, principal, token_hash, expires)
        self._open.add(stream)
        if self._checker is None or self._checker.done():
            self._checker = asyncio.get_running_loop().create_task(self._recheck())
        return stream

    def closed(self, stream: _Stream) -> None:
        self._open.discard(stream)

    async def _recheck(self) -> None:
        seen = self._tokens()
        while self._open:
            await asyncio.sleep(self.recheck_s)
            tokens = self._tokens()  # read again when the file changed (TokenFile)
            now = _now()
            changed, seen = tokens is not seen, tokens
            for stream in list(self._open):
                if stream.ended:
                    continue
                if changed and tokens.get(stream.token_hash) != stream.principal:
                    await self._end(stream, f"the token of {stream.principal} was revoked or changed in the token "
                                            "file (security.tokens_file); authenticate again to watch")
                elif stream.expires is not None and now >= stream.expires:
                    await self._end(stream, certificate_expired(stream.principal, stream.expires))

    async def _end(self, stream: _Stream, reason: str) -> None:
        stream.ended = True
        self.ended += 1
        self._open.discard(stream)
        log.info("stream ended: no longer authorised", method=stream.method, principal=str(stream.principal),
                 reason=reason)
        try:
            await stream.context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)
        except grpc.aio.AbortError:
            pass  # abort raises in its caller; the status went to the client
        except Exception as exc:  # noqa: BLE001 - the call ended meanwhile: nothing to end
            log.debug("stream already over", method=stream.method, error=repr(exc))
        if stream.waiting and stream.task is not None:
            stream.task.cancel()  # out of its wait; unary_stream returns quietly
