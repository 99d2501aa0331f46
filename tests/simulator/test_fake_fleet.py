"""The benchmarks' one fake agent (benchmarks.fake_fleet.FakeAgent) under the options of its two users, without
a scheduler: ``agent_fleet``'s defaults record every push and keep workers RUNNING and let a broken stream fail;
the soak's let workers exit after their job's run time, record no pushes and reopen a broken stream."""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from benchmarks import fake_fleet
from benchmarks.fake_fleet import RUN_ENV, FakeAgent, FakeServer, FleetOptions, _ShardState
from benchmarks.soak import fleet_options
from protos.aryl.v1 import agent_pb2

RUNNING, EXITED = agent_pb2.WORKER_PHASE_RUNNING, agent_pb2.WORKER_PHASE_EXITED


def desired(generation: int, *jobs: tuple[str, float | None]) -> agent_pb2.DesiredState:
    return agent_pb2.DesiredState(server_id="s", generation=generation, workers=[
        agent_pb2.DesiredWorker(job_id=job_id, rank=0, incarnation=1,
                                env={} if run_s is None else {RUN_ENV: f"{run_s:g}"})
        for job_id, run_s in jobs])


def run_with_agent(options: FleetOptions, body: Any) -> Any:
    """``body(agent, shard, pushes)`` inside an event loop (a gRPC aio channel needs one); nothing is dialled."""
    async def main() -> Any:
        shard, pushes = _ShardState(), queue.Queue[tuple[str, str, str, float]]()
        agent = FakeAgent(FakeServer("bench-agent-00000", "training"), "127.0.0.1:9", shard, options, pushes)
        try:
            return await body(agent, shard, pushes)
        finally:
            await agent.channel.close()
    return asyncio.run(main())


def stopped_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """fake_fleet's monotonic clock, moved by hand (the event loop keeps the real one)."""
    clock = [100.0]
    monkeypatch.setattr(fake_fleet, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time,
                                                            perf_counter=time.perf_counter))
    return clock


def phases(report: agent_pb2.ReportStatusRequest) -> dict[str, int]:
    return {w.job_id: w.phase for w in report.workers}


def test_agent_fleet_records_every_push_and_its_workers_never_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = stopped_clock(monkeypatch)

    async def body(agent: FakeAgent, _shard: _ShardState, pushes: queue.Queue[Any]) -> None:
        agent._desired(desired(1, ("1", None), ("2", 5.0)), arrived=10.0)
        agent._desired(desired(2, ("2", 5.0)), arrived=11.0)
        clock[0] += 3600.0
        report = agent.report()
        assert phases(report) == {"2": RUNNING} and report.observed_generation == 2
        got = sorted(pushes.get_nowait() for _ in range(pushes.qsize()))
        assert got == [("placed", "1", agent.server_id, 10.0), ("placed", "2", agent.server_id, 10.0),
                       ("released", "1", agent.server_id, 11.0)]

    run_with_agent(FleetOptions(), body)


def test_the_soaks_workers_exit_after_their_run_time_and_it_records_no_pushes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = stopped_clock(monkeypatch)

    async def body(agent: FakeAgent, _shard: _ShardState, pushes: queue.Queue[Any]) -> None:
        agent._desired(desired(1, ("short", 5.0), ("forever", None)), arrived=0.0)
        clock[0] += 4.0
        agent._desired(desired(2, ("short", 5.0), ("forever", None), ("late", 5.0)), arrived=0.0)
        assert phases(agent.report()) == {"short": RUNNING, "forever": RUNNING, "late": RUNNING}
        clock[0] += 1.0  # "short" reached the agent 5 s ago, "late" 1 s ago
        assert phases(agent.report()) == {"short": EXITED, "forever": RUNNING, "late": RUNNING}
        assert all(w.exit_code == 0 for w in agent.report().workers)
        assert pushes.empty()

    run_with_agent(fleet_options(None), body)


class _Stream:
    """WatchDesiredState's answers: the first call fails UNAVAILABLE, the next ends as a scheduler's shutdown would."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, _request: agent_pb2.WatchDesiredStateRequest) -> AsyncIterator[agent_pb2.DesiredState]:
        self.calls += 1
        return self._answers(self.calls)

    async def _answers(self, call: int) -> AsyncIterator[agent_pb2.DesiredState]:
        yield desired(call)
        if call == 1:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                       details="the scheduler's database is busy")


@pytest.mark.parametrize("rewatch", [False, True])
def test_a_broken_stream_fails_the_benchmark_and_is_reopened_by_the_soak(
        rewatch: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fake_fleet, "RETRY_S", 0.0)

    async def body(agent: FakeAgent, shard: _ShardState, _pushes: queue.Queue[Any]) -> None:
        stream = _Stream()
        agent._stub.WatchDesiredState = stream
        if not rewatch:
            with pytest.raises(grpc.aio.AioRpcError):
                await agent.watch()
            assert stream.calls == 1 and shard.stats.errors == {}
            return
        await agent.watch()
        assert stream.calls == 2 and agent._generation == 2
        assert shard.stats.errors == {"WatchDesiredState:UNAVAILABLE": 1}
        assert shard.stats.messages == {"WatchDesiredState:UNAVAILABLE": "the scheduler's database is busy"}

    run_with_agent(FleetOptions(rewatch=rewatch), body)
