"""GPU telemetry in a status report (``AgentStore._record_gpus``; one UPDATE from arrays on PostgreSQL, a read and an
executemany on SQLite; each test runs on both): every sample's figures are written, a health change is written with
its reason and an event, an unchanged health keeps its reason and writes no event, and a sample of a GPU the
server did not register is refused with nothing written."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.clock import SystemClock
from scheduler_service.errors import InvalidArgument
from scheduler_service.lifecycle import ServerState
from scheduler_service.records import GpuSample, StatusReport
from scheduler_service.store import models as m
from scheduler_service.store.agents import AgentStore
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.transactions import Transactions

EPOCH = 1
NOW = 1_700_000_000.0


def _server(session: Session) -> None:
    session.add(m.Server(id="s0", hostname="s0", pool="TRAINING", state=ServerState.TRAINING,
                         registered_at=NOW))
    session.flush()
    session.add_all(m.Gpu(server_id="s0", index=i, uuid=f"GPU-s0-{i}", health_reason="") for i in range(3))


def _sample(index: int, utilization: float, *, healthy: bool = True, reason: str = "") -> GpuSample:
    return GpuSample(index=index, utilization=utilization, memory_used_bytes=1000 * index + 7,
                     temperature_c=40.0 + index, healthy=healthy, health_reason=reason)


def test_gpu_samples_their_health_changes_and_a_gpu_never_registered(database_url: str) -> None:
    engine = create_engine_for(database_url)
    try:
        db = Transactions(session_factory(engine), publish=lambda _states: None)
        clock = SystemClock()
        store = AgentStore(StateChanges(clock), DesiredStates(epoch=lambda: EPOCH), clock)
        db.write(_server)

        def report(*samples: GpuSample) -> bool:
            status = StatusReport(server_id="s0", scheduler_epoch=EPOCH, gpus=samples, observed_generation=0)
            return db.write(lambda session: store.record_report(session, status, clock.now(), epoch=EPOCH)).cycle_needed

        def gpus() -> list[tuple[object, ...]]:
            g = m.GPUS.c
            with engine.connect() as conn:
                return [tuple(row) for row in conn.execute(
                    sa.select(g.index, g.utilization, g.memory_used_bytes, g.temperature_c, g.healthy,
                              g.health_reason).where(g.server_id == "s0").order_by(g.index))]

        def events() -> list[tuple[str, str]]:
            e = m.EVENTS.c
            with engine.connect() as conn:
                return [(row.reason, row.message) for row in conn.execute(
                    sa.select(e.reason, e.message).where(e.kind == "GPU_HEALTH_CHANGED").order_by(e.id))]

        assert not report(_sample(2, 0.5), _sample(0, 0.25))  # any order, not every GPU: no health changed
        assert gpus() == [(0, 0.25, 7, 40.0, True, ""), (1, 0.0, 0, 0.0, True, ""), (2, 0.5, 2007, 42.0, True, "")]
        assert report(_sample(1, 0.75, healthy=False, reason="XID 79"))
        assert gpus()[1] == (1, 0.75, 1007, 41.0, False, "XID 79")
        assert not report(_sample(1, 0.5, healthy=False, reason="XID 48"))  # still unhealthy: reason kept, no event
        assert gpus()[1] == (1, 0.5, 1007, 41.0, False, "XID 79")
        assert report(_sample(1, 0.0))
        assert gpus()[1][4] is True
        assert events() == [("GPU_UNHEALTHY", "GPU 1: XID 79"), ("GPU_HEALTHY", "GPU 1: healthy again")]
        with pytest.raises(InvalidArgument, match="GPU 5 was not registered"):
            report(_sample(0, 0.9), _sample(5, 0.9))
        assert gpus()[0][1] == 0.25  # nothing of the refused report was written
    finally:
        engine.dispose()
