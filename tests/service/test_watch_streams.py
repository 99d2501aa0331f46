"""Watch streams (WatchEvents, WatchServingPool) on a real scheduler over real gRPC: idle streams cost
no database work of their own (one read per change feeds them all), a change still reaches every
stream, unary calls still answer, and streams beyond the per-principal or total limit are refused with
RESOURCE_EXHAUSTED naming the setting; arylctl's follow mode backs off and retries instead of failing.

Database work is counted as transactions begun on the scheduler's own engine, so nothing else using
the database counts; the windows are only where the counting happens, nothing asserts on time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from structlog.testing import capture_logs

from inference_router.scheduler_link import SchedulerLink
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.api.stream_limits import StreamLimits, TooManyStreams, client_of
from scheduler_service.notify import event_feed
from scheduler_service.notify.event_feed import EventFeed
from scheduler_service.notify.signals import Signal
from scheduler_service.server import ServerHandle, serve_in_background
from tests.harness import client_security, job_spec, scheduler_config, secure_aio_channel, secure_channel
from tests.helpers import wait_for, wait_until

STREAMS = 200
WINDOW_S = 2.0  # how long transactions are counted, idle; the assertion is on the counts


class TransactionCounter:
    """Transactions begun on an engine (every read and write of the scheduler begins one)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        sa.event.listen(engine, "begin", self._begun)

    def _begun(self, _connection: Any) -> None:
        self.count += 1

    async def during(self, seconds: float) -> int:
        before = self.count
        await asyncio.sleep(seconds)
        return self.count - before


@pytest.fixture
def start_scheduler(database_url: str) -> Iterator[Any]:
    handles: list[ServerHandle] = []

    def start(**sections: dict[str, Any]) -> ServerHandle:
        handle = serve_in_background(scheduler_config(database_url, **sections))
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


def set_limits(handle: ServerHandle, **limits: int) -> None:
    """Set the running scheduler's stream limits (``StreamLimits`` attributes, read at each admission),
    as the ``server.max_watch_streams_*`` settings do at start."""
    held = handle.service.stream_limits
    assert held is not None
    for name, value in limits.items():
        setattr(held, name, value)


def open_streams(handle: ServerHandle) -> int:
    limits = handle.service.stream_limits
    assert limits is not None
    return limits.open


async def _collect(call: Any, into: list[Any]) -> None:
    try:
        async for message in call:
            into.append(message)
    except (grpc.aio.AioRpcError, asyncio.CancelledError):
        pass


async def _wait(predicate: Any, what: str, timeout: float = 30.0) -> None:
    await wait_until(predicate, what, timeout, poll_s=0.05)


def test_idle_watch_streams_cost_no_database_work_and_a_change_reaches_every_stream(start_scheduler: Any) -> None:
    # Few RPC threads: idle streams must not hold them (the server is asyncio; streams wait on the loop).
    handle = start_scheduler(server={"worker_threads": 4, "max_watch_streams_per_principal": STREAMS + 50})
    set_limits(handle, per_principal=STREAMS + 50)
    counter = TransactionCounter(handle.service.engine)

    async def scenario() -> None:
        async with secure_aio_channel(handle.address) as channel:
            scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            inference = inference_pb2_grpc.InferenceServiceStub(channel)
            baseline = await counter.during(WINDOW_S)  # cycles and liveness checks: no stream open

            received: list[list[Any]] = [[] for _ in range(STREAMS)]
            calls = [scheduler.WatchEvents(scheduler_pb2.WatchEventsRequest()) for _ in range(STREAMS)]
            pools: list[list[Any]] = [[] for _ in range(20)]
            calls += [inference.WatchServingPool(inference_pb2.WatchServingPoolRequest(source="test"))
                      for _ in pools]
            tasks = [asyncio.create_task(_collect(call, into))
                     for call, into in zip(calls, received + pools, strict=True)]
            await _wait(lambda: open_streams(handle) == STREAMS + len(pools), "every stream to be admitted")
            await _wait(lambda: all(pools), "every serving-pool stream's first pool")

            idle = await counter.during(WINDOW_S)
            # Polling streams read the database about once a second each (400+ here); fed streams read
            # nothing of their own, so the count stays where it was without them.
            assert idle <= baseline + 20, (idle, baseline)

            answer = await scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("after-streams")),
                                               timeout=30)
            job_id = answer.job.job_id
            await _wait(lambda: all(any(e.job_id == job_id for e in got) for got in received),
                        "the new job's event on every stream")
            for call in calls:
                call.cancel()
            await asyncio.gather(*tasks)
            await _wait(lambda: open_streams(handle) == 0, "every stream to be released")

    asyncio.run(scenario())


def test_streams_filtered_or_replayed_get_exactly_their_events(start_scheduler: Any) -> None:
    """The fan-out keeps WatchEvents' contract: a replay from after_event_id (read from the database),
    then live events, each once and in order; a job filter sees only that job's events."""
    handle = start_scheduler()

    async def scenario() -> None:
        async with secure_aio_channel(handle.address) as channel:
            scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            first = await scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("first")), timeout=30)
            everything: list[Any] = []
            only_first: list[Any] = []
            tasks = [
                asyncio.create_task(_collect(scheduler.WatchEvents(
                    scheduler_pb2.WatchEventsRequest(after_event_id=0)), everything)),
                asyncio.create_task(_collect(scheduler.WatchEvents(
                    scheduler_pb2.WatchEventsRequest(after_event_id=0, job_id=first.job.job_id)), only_first)),
            ]
            await _wait(lambda: bool(only_first), "the replay of the first job's events")
            second = await scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("second")), timeout=30)
            await _wait(lambda: any(e.job_id == second.job.job_id for e in everything), "the second job's event")
            replayed = len(only_first)
            await scheduler.CancelJob(scheduler_pb2.CancelJobRequest(job_id=first.job.job_id), timeout=30)
            await _wait(lambda: len(only_first) > replayed, "the first job's live event on its filtered stream")
            await _wait(lambda: any(e.to_state == only_first[-1].to_state and e.job_id == first.job.job_id
                                    for e in everything[-5:]), "the cancellation on the unfiltered stream")
            ids = [e.event_id for e in everything]
            assert ids == sorted(set(ids)), "each event once, in order"
            assert {e.job_id for e in only_first} == {first.job.job_id}
            assert [e.event_id for e in only_first] == [e.event_id for e in everything
                                                         if e.job_id == first.job.job_id]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())


@pytest.mark.parametrize("limit", ["per_principal", "total"])
def test_streams_beyond_a_limit_are_refused_with_resource_exhausted_naming_the_setting(
    start_scheduler: Any, limit: str
) -> None:
    setting = f"max_watch_streams_{limit}" if limit == "per_principal" else "max_watch_streams"
    handle = start_scheduler(server={setting: 3})
    set_limits(handle, **{limit: 3})

    async def scenario() -> None:
        async with secure_aio_channel(handle.address) as channel:
            scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channel)
            inference = inference_pb2_grpc.InferenceServiceStub(channel)
            held = [scheduler.WatchEvents(scheduler_pb2.WatchEventsRequest()) for _ in range(2)]
            held.append(inference.WatchServingPool(inference_pb2.WatchServingPoolRequest(source="test")))
            tasks = [asyncio.create_task(_collect(call, [])) for call in held]
            await _wait(lambda: open_streams(handle) == 3, "three streams to be admitted")

            for refused in (scheduler.WatchEvents(scheduler_pb2.WatchEventsRequest()),
                            inference.WatchServingPool(inference_pb2.WatchServingPoolRequest(source="test"))):
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    async for _ in refused:
                        pass
                assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert f"server.{setting}" in (caught.value.details() or "")
                assert f"ARYL_SERVER__{setting.upper()}" in (caught.value.details() or "")

            held[0].cancel()  # a place is free again: the next stream is admitted
            await _wait(lambda: open_streams(handle) == 2, "the cancelled stream to be released")
            again: list[Any] = []
            tasks.append(asyncio.create_task(_collect(scheduler.WatchEvents(scheduler_pb2.WatchEventsRequest()),
                                                      again)))
            await _wait(lambda: open_streams(handle) == 3, "a new stream to be admitted")
            for call in held:
                call.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())


def test_stream_limits_count_a_client_by_host_and_release_places() -> None:
    assert client_of("ipv4:10.0.0.7:51234") == client_of("ipv4:10.0.0.7:40000") == "ipv4:10.0.0.7"
    assert client_of("ipv6:[::1]:4000") == "ipv6:[::1]"
    assert client_of("unix:/tmp/sock") == "unix:/tmp/sock"
    limits = StreamLimits(per_client=1, total=2, reserved=0)
    with limits.admit("ipv4:10.0.0.7:1"):
        with pytest.raises(TooManyStreams, match=r"max_watch_streams_per_client"):
            with limits.admit("ipv4:10.0.0.7:2"):
                pass
        with limits.admit("ipv4:10.0.0.8:1"):
            with pytest.raises(TooManyStreams, match=r"server\.max_watch_streams "):
                with limits.admit("ipv4:10.0.0.9:1"):
                    pass
    assert limits.open == 0
    with limits.admit("ipv4:10.0.0.7:3"):
        assert limits.open == 1


def test_arylctl_follow_backs_off_and_retries_while_the_stream_limit_is_reached(
    start_scheduler: Any, tmp_path: Path
) -> None:
    handle = start_scheduler(server={"max_watch_streams_per_principal": 1})
    set_limits(handle, per_principal=1)
    channel = secure_channel(handle.address)
    scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    holder = scheduler.WatchEvents(scheduler_pb2.WatchEventsRequest())
    wait_for(lambda: open_streams(handle) == 1, what="the holding stream to be admitted")
    stdout, stderr = tmp_path / "out", tmp_path / "err"
    with open(stdout, "w") as out, open(stderr, "w") as err:
        follow = subprocess.Popen(
            [str(Path(sys.executable).parent / "arylctl"), "--server", handle.address, "events", "-f"],
            stdout=out, stderr=err, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for(lambda: "RESOURCE_EXHAUSTED" in stderr.read_text(), timeout=30, what="arylctl's retry note")
        assert "max_watch_streams_per_principal" in stderr.read_text()
        assert follow.poll() is None, f"arylctl exited: {stderr.read_text()}"
        holder.cancel()  # the place is free: arylctl's next attempt gets the stream
        wait_for(lambda: open_streams(handle) == 1 and follow.poll() is None, timeout=30,
                 what="arylctl's stream to be admitted")
        job = scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("seen-by-follow")), timeout=30).job
        wait_for(lambda: f" {job.job_id} " in stdout.read_text() or job.job_id in stdout.read_text(), timeout=30,
                 what="the job's event in arylctl's output")
        assert "Traceback" not in stderr.read_text()
    finally:
        follow.send_signal(signal.SIGINT)
        assert follow.wait(timeout=30) == 0, stderr.read_text()
        channel.close()


def test_the_router_s_pool_watch_backs_off_and_retries_while_the_stream_limit_is_reached(
    start_scheduler: Any
) -> None:
    handle = start_scheduler(server={"max_watch_streams_per_principal": 1})
    set_limits(handle, per_principal=1)

    async def scenario() -> None:
        async with secure_aio_channel(handle.address) as channel:
            holder = scheduler_pb2_grpc.SchedulerServiceStub(channel).WatchEvents(scheduler_pb2.WatchEventsRequest())
            holding = asyncio.create_task(_collect(holder, []))
            await _wait(lambda: open_streams(handle) == 1, "the holding stream to be admitted")
            updates: list[Any] = []
            with capture_logs() as logs:
                async with SchedulerLink(handle.address, source="test-router", rpc_timeout_s=5,
                                         max_backoff_s=0.2, security=client_security()) as link:
                    watching = asyncio.create_task(link.run(updates.append))
                    await _wait(lambda: sum("RESOURCE_EXHAUSTED" in str(e.get("error")) for e in logs) >= 2,
                                "two refused attempts")
                    assert not watching.done() and not updates
                    holder.cancel()  # the place is free: the link's next attempt gets the pool
                    await _wait(lambda: bool(updates), "the serving pool")
                    watching.cancel()
                    await asyncio.gather(watching, holding, return_exceptions=True)
            assert any("max_watch_streams_per_principal" in str(e.get("error")) for e in logs)

    asyncio.run(scenario())


@dataclass(frozen=True)
class Entry:
    id: int
    job_id: int | None = None


def _feed_scenario(committed: list[int], steps: Any) -> list[int]:
    """Run an EventFeed over a fake log (``committed``: the ids visible so far) with one unfiltered
    stream from the newest id (10); ``steps(committed, wake, got)`` changes the log and waits."""
    got: list[int] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        wake = Signal(loop)
        feed: EventFeed[Entry] = EventFeed(
            loop, wake, read_after=lambda after, limit: [Entry(i) for i in sorted(committed) if i > after][:limit],
            last_id=lambda: 10, executor=None, recheck_s=30.0, topics=lambda entry: ("all",),
        )

        async def nothing(after: int, upto: int, limit: int) -> list[Entry]:
            return []

        async def stream() -> None:
            async for entry in feed.watch(None, topic="all", match=lambda entry: True, catch_up=nothing):
                got.append(entry.id)

        task = asyncio.create_task(stream())
        await _wait(lambda: feed.head == 10, "the feed to start")
        await steps(committed, wake, got, feed)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    return got


def test_an_event_committed_after_a_newer_one_still_reaches_the_streams_in_order() -> None:
    """Ids are taken at insert and seen at commit: id 11 may commit after 12. The feed holds 12 back
    until 11 shows up instead of moving past 11 (which would lose it for every stream)."""

    async def steps(committed: list[int], wake: Signal, got: list[int], feed: Any) -> None:
        committed.append(12)  # 11's transaction is still open
        wake.bump()
        await _wait(lambda: feed.reads >= 1, "a read that sees 12 alone")
        committed.append(11)
        wake.bump()
        await _wait(lambda: len(got) >= 2, "both events")

    assert _feed_scenario([], steps) == [11, 12]


def test_a_gap_left_by_a_rolled_back_write_is_passed_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(event_feed, "GAP_WAIT_S", 0.2)

    async def steps(committed: list[int], wake: Signal, got: list[int], feed: Any) -> None:
        committed.extend([12, 13])  # 11 was rolled back: it never commits
        wake.bump()
        await _wait(lambda: len(got) >= 2, "the events after the gap")

    assert _feed_scenario([], steps) == [12, 13]
