"""Who may hold a stream, and for how long (issue 37, items 2, 3 and 7).

- Revocation reaches open streams: a user's WatchEvents and an agent's WatchDesiredState end with
  UNAUTHENTICATED once their token leaves the token file (``api.auth._OpenStreams``).
- So does time: a stream opened with a client certificate that expires while it runs ends with
  UNAUTHENTICATED naming the expiry and the fix; a call on a connection made before the expiry is
  refused after it; a new connection with an expired certificate is refused at the handshake.
- Stream places are counted per principal, whatever addresses it connects from, and the last places
  are reserved for routers and admins: one user cannot starve a router's WatchServingPool
  (``api.stream_limits``).
- An event stream that falls its buffer behind is ended with RESOURCE_EXHAUSTED naming the setting,
  and the others keep receiving (``notify.EventFeed``).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from aryl_common import security
from aryl_common.security import ClientSecurity, Principal
from arylctl import certs
from migrations import upgrade
from protos.aryl.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
from scheduler_service.api.stream_limits import StreamLimits, TooManyStreams
from scheduler_service.notify.event_feed import EventFeed, SlowReader
from scheduler_service.notify.signals import Signal
from scheduler_service.server import ServerHandle, serve_in_background
from tests.harness import pki, scheduler_config, security_section
from tests.helpers import scaled_timeout, wait_until

ALICE, BOB = Principal("user", "alice"), Principal("user", "bob")
ROUTER, ADMIN = Principal("router", "r1"), Principal("admin", "root")


async def _wait(predicate: Any, what: str, timeout: float = 60.0) -> None:
    await wait_until(predicate, what, timeout, poll_s=0.02)


# ---------------------------------------------------------------------------------------------
# Places per principal and per role


def test_a_user_is_bounded_per_principal_whatever_addresses_it_uses() -> None:
    limits = StreamLimits(per_client=64, total=100, per_principal=3, reserved=10)
    with limits.admit("ipv4:127.0.0.1:1", ALICE), limits.admit("ipv4:127.0.0.2:1", ALICE), \
            limits.admit("ipv4:127.0.0.3:1", ALICE):
        with pytest.raises(TooManyStreams, match=r"principal user:alice .*server.max_watch_streams_per_principal"):
            with limits.admit("ipv4:127.0.0.4:1", ALICE):
                pass
        with limits.admit("ipv4:127.0.0.4:1", BOB):  # another user has places of their own
            assert limits.held_by(ALICE) == 3 and limits.held_by(BOB) == 1
    assert limits.open == 0


def test_users_cannot_take_the_places_reserved_for_routers_and_admins() -> None:
    limits = StreamLimits(per_client=64, total=4, per_principal=64, reserved=2)
    with limits.admit("ipv4:127.0.0.1:1", ALICE), limits.admit("ipv4:127.0.0.2:1", BOB):
        for user_or_anonymous in (ALICE, None):
            with pytest.raises(TooManyStreams, match=r"last 2 for routers and admins.*max_watch_streams_reserved"):
                with limits.admit("ipv4:127.0.0.3:1", user_or_anonymous):
                    pass
        with limits.admit("ipv4:127.0.0.1:2", ROUTER), limits.admit("ipv4:127.0.0.1:3", ADMIN):
            with pytest.raises(TooManyStreams, match=r"server\.max_watch_streams "):
                with limits.admit("ipv4:127.0.0.1:4", ADMIN):
                    pass


@pytest.fixture
def live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A TLS scheduler over SQLite whose token file is a copy this test may rewrite."""
    tokens = tmp_path / "tokens"
    shutil.copy(pki().path("tokens"), tokens)
    # The session's ARYL_SECURITY__* variables outrank a config's values: point this one at the copy.
    monkeypatch.setenv("ARYL_SECURITY__TOKENS_FILE", str(tokens))
    url = f"sqlite:///{tmp_path / 'aryl.db'}"
    upgrade(url)
    handle = serve_in_background(scheduler_config(url, security={**security_section(), "tokens_file": str(tokens)}))
    try:
        yield handle, tokens
    finally:
        handle.stop()


def channel_as(handle: ServerHandle, principal: str, *, server_id: str = "") -> grpc.aio.Channel:
    ca = pki()
    cert, key = ca.agent_cert(server_id) if server_id else (ca.path("client.crt"), ca.path("client.key"))
    creds = ClientSecurity(ca_file=ca.path("ca.crt"), cert_file=cert, key_file=key, token=ca.token(principal))
    return security.secure_aio_channel(handle.address, creds, [])


async def _ended(call: Any) -> grpc.aio.AioRpcError:
    """Read ``call`` to its end; the error it ended with."""
    try:
        while await call.read() is not grpc.aio.EOF:
            pass
    except grpc.aio.AioRpcError as exc:
        return exc
    raise AssertionError("the stream ended without an error")


def test_one_user_cannot_starve_a_routers_or_an_admins_stream(live: Any) -> None:
    handle, _ = live
    limits = handle.service.stream_limits
    limits.total, limits.reserved, limits.per_principal = 5, 2, 2  # as server.max_watch_streams* would set them

    async def scenario() -> None:
        async with channel_as(handle, "user:alice") as alice, channel_as(handle, "user:bob") as bob, \
                channel_as(handle, "router:r1", server_id="r1") as router, \
                channel_as(handle, "admin:test-admin") as admin:
            held = [scheduler_pb2_grpc.SchedulerServiceStub(alice).WatchEvents(scheduler_pb2.WatchEventsRequest())
                    for _ in range(2)]
            tasks = [asyncio.create_task(_ended(call)) for call in held]
            await _wait(lambda: limits.open == 2, "alice's two streams")
            refused = await _ended(scheduler_pb2_grpc.SchedulerServiceStub(alice).WatchEvents(
                scheduler_pb2.WatchEventsRequest()))
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_watch_streams_per_principal" in (refused.details() or "")
            bobs = scheduler_pb2_grpc.SchedulerServiceStub(bob).WatchEvents(scheduler_pb2.WatchEventsRequest())
            tasks.append(asyncio.create_task(_ended(bobs)))
            await _wait(lambda: limits.open == 3, "bob's stream: the last place users may take")
            refused = await _ended(scheduler_pb2_grpc.SchedulerServiceStub(bob).WatchEvents(
                scheduler_pb2.WatchEventsRequest()))
            assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_watch_streams_reserved" in (refused.details() or "")

            pool = inference_pb2_grpc.InferenceServiceStub(router).WatchServingPool(
                inference_pb2.WatchServingPoolRequest())
            first = await pool.read()  # the router is served from the reserve
            assert isinstance(first, inference_pb2.ServingPool)
            watch = scheduler_pb2_grpc.SchedulerServiceStub(admin).WatchEvents(scheduler_pb2.WatchEventsRequest())
            tasks.append(asyncio.create_task(_ended(watch)))
            await _wait(lambda: limits.open == 5, "the admin's stream, from the reserve too")
            for call in (*held, bobs, pool, watch):
                call.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------
# Revocation during a stream


async def _desired_state_of_gpu_1(agent: grpc.aio.Channel) -> Any:
    """Register server gpu-1 as its agent on ``agent``; its WatchDesiredState stream, open and served."""
    stub = agent_pb2_grpc.AgentServiceStub(agent)
    registered = await stub.RegisterServer(agent_pb2.RegisterServerRequest(
        hostname="gpu-1", pool=types_pb2.POOL_TRAINING, agent_address="gpu-1", agent_version="test",
        gpus=[agent_pb2.GpuInfo(index=0, uuid="GPU-gpu-1-0", model="Fake", memory_total_bytes=1 << 30)]),
        timeout=scaled_timeout(30))
    desired = stub.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=registered.server_id))
    await desired.read()
    return desired


async def _streams(handle: ServerHandle, alice: grpc.aio.Channel, bob: grpc.aio.Channel,
                   agent: grpc.aio.Channel) -> tuple[list[asyncio.Task[grpc.aio.AioRpcError]], Any,
                                                     asyncio.Task[grpc.aio.AioRpcError]]:
    """Alice's WatchEvents and gpu-1's WatchDesiredState (the streams a test ends: the tasks that read
    them to their end), and Bob's WatchEvents (the stream it keeps, and the task reading it), all open."""
    desired = await _desired_state_of_gpu_1(agent)
    watch = scheduler_pb2_grpc.SchedulerServiceStub(alice).WatchEvents(scheduler_pb2.WatchEventsRequest())
    kept = scheduler_pb2_grpc.SchedulerServiceStub(bob).WatchEvents(scheduler_pb2.WatchEventsRequest())
    ends = [asyncio.create_task(_ended(call)) for call in (watch, desired)]
    bobs = asyncio.create_task(_ended(kept))
    limits = handle.service.stream_limits
    assert limits is not None
    await _wait(lambda: limits.open == 2, "both watch streams")
    return ends, kept, bobs


async def _close_kept(handle: ServerHandle, kept: Any, bobs: asyncio.Task[grpc.aio.AioRpcError]) -> None:
    """Once alice's stream has ended: its place released, and bob's stream closed by bob."""
    limits = handle.service.stream_limits
    assert limits is not None
    await _wait(lambda: limits.open == 1, "alice's place released")
    kept.cancel()
    await asyncio.gather(bobs, return_exceptions=True)


def _revoke(tokens: Path, *principals: str) -> None:
    kept = [line for line in tokens.read_text().splitlines()
            if not any(line.startswith(f"{p.replace(':', ' ')} ") for p in principals)]
    tokens.write_text("".join(f"{line}\n" for line in kept))
    st = tokens.stat()  # a rewrite within one timestamp tick must still look changed
    os.utime(tokens, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_revoking_a_token_ends_its_open_watch_and_desired_state_streams(live: Any) -> None:
    handle, tokens = live

    async def scenario() -> None:
        async with channel_as(handle, "user:alice") as alice, channel_as(handle, "user:bob") as bob, \
                channel_as(handle, "agent:gpu-1", server_id="gpu-1") as agent:
            ends, kept, bobs = await _streams(handle, alice, bob, agent)

            _revoke(tokens, "user:alice", "agent:gpu-1")
            # Bound: auth.STREAM_RECHECK_S + the token file's check interval (about 2 s); generous here.
            for ended in await asyncio.wait_for(asyncio.gather(*ends), timeout=scaled_timeout(60)):
                assert ended.code() == grpc.StatusCode.UNAUTHENTICATED, ended
                assert "revoked" in (ended.details() or "")
            assert not bobs.done()  # a token still in the file keeps its stream
            await _close_kept(handle, kept, bobs)

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------
# A certificate that expires during a stream


def _certificate(tmp_path: Path, who: str, common_name: str, not_after: datetime.datetime) -> tuple[str, str]:
    """A client certificate from the session's CA (``arylctl certs``) valid only until ``not_after``
    (whole seconds: X.509 times carry no fraction); its certificate's and key's paths."""
    cert, key = certs.issue_from(pki().dir, f"{tmp_path.name}-{who}", common_name, (), server=False,
                                 not_after=not_after)
    return str(cert), str(key)


def _channel_with(handle: ServerHandle, principal: str, cert: tuple[str, str]) -> grpc.aio.Channel:
    """A channel presenting ``cert`` and ``principal``'s token; its own connection (no subchannel shared
    with another test's channel to the same address)."""
    creds = ClientSecurity(ca_file=pki().path("ca.crt"), cert_file=cert[0], key_file=cert[1],
                           token=pki().token(principal))
    return security.secure_aio_channel(handle.address, creds, [("grpc.use_local_subchannel_pool", 1)])


def _whole_seconds_from_now(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(time.time() + seconds) + 1, datetime.UTC)


@pytest.mark.timeout(300)
def test_a_certificate_that_expires_ends_its_open_watch_and_desired_state_streams(live: Any, tmp_path: Path) -> None:
    handle, _ = live
    # Long enough to open the streams on a loaded machine (ARYL_TEST_TIMEOUT_FACTOR stretches it), short
    # enough that the test waits for the expiry itself: a real clock and a real TLS connection, no fakes.
    not_after = _whole_seconds_from_now(scaled_timeout(4))
    alices = _certificate(tmp_path, "alice-short", "aryl-client", not_after)
    agents = _certificate(tmp_path, "gpu-1-short", "gpu-1", not_after)

    async def scenario() -> None:
        async with _channel_with(handle, "user:alice", alices) as alice, \
                _channel_with(handle, "agent:gpu-1", agents) as agent, \
                channel_as(handle, "user:bob") as bob:
            ends, kept, bobs = await _streams(handle, alice, bob, agent)
            opened_at = time.time()
            assert opened_at < not_after.timestamp(), (
                f"the streams took {opened_at - not_after.timestamp() + scaled_timeout(4):.1f} s to open, past "
                "the certificates' validity: raise ARYL_TEST_TIMEOUT_FACTOR")

            # Bound: the certificate's notAfter + auth.STREAM_RECHECK_S (1 s); generous here.
            waited = not_after.timestamp() - opened_at + scaled_timeout(30)
            for ended in await asyncio.wait_for(asyncio.gather(*ends), timeout=waited):
                assert ended.code() == grpc.StatusCode.UNAUTHENTICATED, ended
                details = ended.details() or ""
                assert "expired at" in details and not_after.strftime("%Y-%m-%d %H:%M:%S") in details, details
                assert "connect again with a certificate valid now" in details, details  # the fix
                assert "arylctl certs renew DIR" in details, details
            assert time.time() >= not_after.timestamp()  # not before its time
            assert not bobs.done()  # a certificate still valid keeps its stream
            await _close_kept(handle, kept, bobs)

    asyncio.run(scenario())


@pytest.mark.timeout(300)
def test_a_new_connection_with_an_expired_certificate_is_refused(live: Any, tmp_path: Path) -> None:
    handle, _ = live
    expired = _certificate(tmp_path, "alice-expired", "aryl-client",
                           datetime.datetime.now(datetime.UTC).replace(microsecond=0) - datetime.timedelta(minutes=1))

    async def scenario() -> None:
        async with channel_as(handle, "user:alice") as valid:  # the same call is answered with a valid one
            await scheduler_pb2_grpc.SchedulerServiceStub(valid).GetCluster(
                scheduler_pb2.GetClusterRequest(), timeout=scaled_timeout(30))
        async with _channel_with(handle, "user:alice", expired) as alice:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(alice)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=scaled_timeout(30))
            # The TLS handshake fails (UNAVAILABLE), or, had it passed, the call is refused (UNAUTHENTICATED).
            assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED), refused
            watch_refused = await _ended(stub.WatchEvents(scheduler_pb2.WatchEventsRequest()))
            assert watch_refused.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED)
        assert handle.service.stream_limits.open == 0

    asyncio.run(scenario())


@pytest.mark.timeout(300)
def test_a_connection_made_before_its_certificate_expired_is_refused_calls_after(live: Any, tmp_path: Path) -> None:
    """TLS checks a certificate's dates only at the handshake: a connection made while it was valid stays
    up. Every call on it after the notAfter is refused, not only the streams open at the expiry."""
    handle, _ = live
    not_after = _whole_seconds_from_now(scaled_timeout(2))
    alices = _certificate(tmp_path, "alice-short", "aryl-client", not_after)

    async def scenario() -> None:
        async with _channel_with(handle, "user:alice", alices) as alice:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(alice)
            await stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=scaled_timeout(30))  # connected
            await asyncio.sleep(max(0.0, not_after.timestamp() - time.time()) + 0.1)
            assert alice.get_state() == grpc.ChannelConnectivity.READY  # the same connection
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=scaled_timeout(30))
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value
            assert "expired at" in (refused.value.details() or ""), refused.value
            stream_refused = await _ended(stub.WatchEvents(scheduler_pb2.WatchEventsRequest()))
            assert stream_refused.code() == grpc.StatusCode.UNAUTHENTICATED, stream_refused
        assert handle.service.stream_limits.open == 0

    asyncio.run(scenario())


# ---------------------------------------------------------------------------------------------
# A slow reader is dropped, not waited for


@dataclass(frozen=True)
class Entry:
    id: int
    job_id: int | None = None


def test_a_stream_that_falls_its_buffer_behind_ends_and_the_others_keep_receiving() -> None:
    log: list[int] = []
    why: list[str] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        wake = Signal(loop)
        feed: EventFeed[Entry] = EventFeed(
            loop, wake, read_after=lambda after, limit: [Entry(i) for i in log if i > after][:limit],
            last_id=lambda: 0, executor=None, recheck_s=30.0, topics=lambda entry: ("all",), stream_buffer=5,
        )

        async def nothing(after: int, upto: int, limit: int) -> list[Entry]:
            return []

        fast: list[int] = []
        stalled = asyncio.Event()

        async def reader() -> None:
            async for entry in feed.watch(None, topic="all", match=lambda e: True, catch_up=nothing):
                fast.append(entry.id)

        async def slow_reader() -> None:
            async for _ in feed.watch(None, topic="all", match=lambda e: True, catch_up=nothing,
                                      on_overflow=why.append):
                await stalled.wait()  # a client that stopped reading

        fast_task, slow_task = asyncio.create_task(reader()), asyncio.create_task(slow_reader())
        await _wait(lambda: feed.watchers == 2, "both streams")
        for i in range(1, 21):  # 20 events, one read each: the slow stream takes one and then stalls
            log.append(i)
            wake.bump()
            await _wait(lambda i=i: fast and fast[-1] == i, f"event {i} at the fast stream")
        assert why and "raise events.watch_stream_buffer" in why[0]
        assert feed.dropped == 1
        stalled.set()
        with pytest.raises(SlowReader, match=r"more than 5 events behind.*after_event_id"):
            await slow_task
        assert fast == list(range(1, 21))
        fast_task.cancel()
        await asyncio.gather(fast_task, return_exceptions=True)

    asyncio.run(scenario())
