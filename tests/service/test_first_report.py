"""A server's first status report after it registers (``Agents.register`` leaves the digest a first report
would): after a failover or a restart, 1,000s of agents register within seconds, and each first report took
a transaction of its own (the full path). Now a first report that says what the registration recorded (the
GPUs' health, no exit) is answered from memory, one that says more still takes the full path.

On the service's use cases (``SchedulerApp``) and a real database, SQLite and PostgreSQL.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from scheduler_service.app import SchedulerApp
from scheduler_service.lifecycle import Pool
from scheduler_service.records import GpuReport, GpuSample, ServerRegistration, StatusReport
from scheduler_service.store import models as m
from scheduler_service.store.db import create_engine_for, session_factory
from tests.harness import T0, ManualClock

TELEMETRY_WRITE_S = 15.0


def test_a_first_report_saying_what_the_registration_recorded_is_answered_from_memory(database_url: str) -> None:
    engine = create_engine_for(database_url)
    try:
        clock = ManualClock(T0)
        app = SchedulerApp(session_factory(engine), clock, telemetry_write_s=TELEMETRY_WRITE_S)
        app.term.start("test")
        epoch = app.term.epoch
        registration = ServerRegistration(
            "a", Pool.TRAINING, tuple(GpuReport(i, f"GPU-a-{i}", "Fake-GPU", 80 << 30) for i in range(2)),
            "a:7000", "test")

        def report(utilization: float, *, observed: int = 0, unhealthy: tuple[int, ...] = ()) -> int:
            samples = tuple(GpuSample(i, utilization, 0, 40.0, i not in unhealthy, "XID 79" if i in unhealthy else "")
                            for i in range(2))
            return app.agents.report_status(StatusReport("a", epoch, samples, observed))

        def recorded() -> dict[str, Any]:
            g, h = m.GPUS.c, m.HEARTBEATS.c
            with engine.connect() as conn:
                return {
                    "utilization": [row[0] for row in conn.execute(
                        sa.select(g.utilization).where(g.server_id == "a").order_by(g.index))],
                    "healthy": [row[0] for row in conn.execute(
                        sa.select(g.healthy).where(g.server_id == "a").order_by(g.index))],
                    "observed": conn.scalar(sa.select(h.observed_generation).where(h.server_id == "a")),
                }

        desired = app.agents.register(registration).generation
        assert report(0.5) == desired
        assert recorded() == {"utilization": [0.0, 0.0], "healthy": [True, True], "observed": 0}  # from memory
        assert report(0.5, observed=desired) == desired  # the agent applied it: one UPDATE, no telemetry
        assert recorded() == {"utilization": [0.0, 0.0], "healthy": [True, True], "observed": desired}
        clock.advance(TELEMETRY_WRITE_S)
        report(0.25, observed=desired)  # its telemetry due: written (no writer thread here: before the answer)
        assert recorded()["utilization"] == [0.25, 0.25]

        report(0.25, observed=desired, unhealthy=(1,))  # news: the full path
        assert recorded()["healthy"] == [True, False]
        desired = app.agents.register(registration).generation  # the agent restarts; GPU 1 stays unhealthy
        report(0.75, observed=desired, unhealthy=(1,))  # what the registration recorded: from memory
        assert recorded() == {"utilization": [0.25, 0.25], "healthy": [True, False], "observed": desired}
        report(0.75, observed=desired)  # GPU 1 healthy again: the full path
        assert recorded() == {"utilization": [0.75, 0.75], "healthy": [True, True], "observed": desired}
    finally:
        engine.dispose()
