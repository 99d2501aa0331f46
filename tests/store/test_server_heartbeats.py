"""What a status report writes about its server lives in a row of its own (``server_heartbeats``), so a report
never holds the server's row, which every decision's desired-generation bump takes.

On PostgreSQL a report in progress and a decision's bump of the same server each commit while the other's
transaction is still open (before, the bump waited for the report's lock on the server's row: every agent of a
decision of 100 servers waited for whichever report held one of them). On both databases the heartbeat says
what the server's row said before: registration writes it, a report advances the observed generation and never
moves it back, a server made without one gets one at its first report, a LOST server is brought back by a full
report only, and the server listing and the snapshot read it. The migration moves existing servers' values.
"""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from migrations import upgrade
from scheduler_service.clock import SystemClock
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.records import GpuReport, ServerRegistration, StatusReport
from scheduler_service.store import models as m
from scheduler_service.store import views
from scheduler_service.store.agents import AgentStore
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.transactions import Transactions

EPOCH = 1
NOW = 1_700_000_000.0


def _registration(hostname: str) -> ServerRegistration:
    return ServerRegistration(hostname=hostname, pool=Pool.TRAINING, agent_address="127.0.0.1:1",
                              agent_version="t", gpus=(GpuReport(0, f"GPU-{hostname}-0", "A100", 1 << 30),))


def _report(server_id: str, observed: int) -> StatusReport:
    return StatusReport(server_id=server_id, scheduler_epoch=EPOCH, gpus=(), observed_generation=observed)


def _heartbeat(engine: sa.Engine, server_id: str) -> tuple[float, int] | None:
    h = m.HEARTBEATS.c
    with engine.connect() as conn:
        row = conn.execute(sa.select(h.last_seen_at, h.observed_generation).where(h.server_id == server_id)).first()
    return None if row is None else (row.last_seen_at, row.observed_generation)


def test_heartbeats_say_what_the_servers_row_said(database_url: str) -> None:
    engine = create_engine_for(database_url)
    try:
        db = Transactions(session_factory(engine), publish=lambda _states: None)
        clock = SystemClock()
        store = AgentStore(StateChanges(clock), DesiredStates(epoch=lambda: EPOCH), clock)

        db.write(lambda session: store.register(session, _registration("a"), NOW))
        assert _heartbeat(engine, "a") == (NOW, 0)

        recorded = db.write(lambda session: store.record_report(session, _report("a", 1), NOW + 5, epoch=EPOCH))
        assert (recorded.observed_generation, recorded.state) == (1, ServerState.TRAINING)
        assert _heartbeat(engine, "a") == (NOW + 5, 1)
        # A report of an older generation (delivered late) moves the time, never the generation back.
        recorded = db.write(lambda session: store.record_report(session, _report("a", 0), NOW + 6, epoch=EPOCH))
        assert recorded.observed_generation == 1 and _heartbeat(engine, "a") == (NOW + 6, 1)

        fast = db.write(lambda session: store.record_observed_generation(session, _report("a", 3)))
        assert fast is not None and (fast.state, fast.observed) == (ServerState.TRAINING, 3)
        assert _heartbeat(engine, "a") is not None and _heartbeat(engine, "a")[1] == 3  # type: ignore[index]

        # Registering again keeps the generation the agent applied and says when it was heard.
        db.write(lambda session: store.register(session, _registration("a"), NOW + 10))
        assert _heartbeat(engine, "a") == (NOW + 10, 3)

        # A server made without a heartbeat (an older writer): the listing says when it registered, the fast
        # path leaves it to the full one, and its first full report makes the row.
        def bare(session: Session) -> None:
            session.add(m.Server(id="b", hostname="b", pool="TRAINING", state="TRAINING", registered_at=NOW))

        db.write(bare)
        listed = {s.id: s for s in db.read(views.servers)}
        assert (listed["b"].last_seen_at, listed["b"].observed_generation) == (NOW, 0)
        assert (listed["a"].last_seen_at, listed["a"].observed_generation) == (NOW + 10, 3)
        assert db.write(lambda session: store.record_observed_generation(session, _report("b", 2))) is None
        db.write(lambda session: store.record_report(session, _report("b", 2), NOW + 7, epoch=EPOCH))
        assert _heartbeat(engine, "b") == (NOW + 7, 2)

        # A LOST server: the fast path leaves it to the full one, which brings it back with a new generation.
        def lose(session: Session) -> None:
            server = session.get(m.Server, "b")
            assert server is not None
            server.state = ServerState.LOST

        db.write(lose)
        assert db.write(lambda session: store.record_observed_generation(session, _report("b", 2))) is None
        recorded = db.write(lambda session: store.record_report(session, _report("b", 2), NOW + 8, epoch=EPOCH))
        assert recorded.state == ServerState.TRAINING and recorded.touched == {"b"}

        # Deleting a server deletes its heartbeat.
        def delete(session: Session) -> None:
            session.execute(sa.delete(m.GPUS).where(m.GPUS.c.server_id == "a"))
            session.execute(sa.delete(m.SERVERS).where(m.SERVERS.c.id == "a"))

        db.write(delete)
        assert _heartbeat(engine, "a") is None
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_a_report_in_progress_never_holds_a_decisions_generation_bump(postgres_url: str) -> None:
    """Each side commits while the other's transaction is open: neither waits for a lock the other holds
    (``lock_timeout`` turns a wait into an error instead of a hang; no wait at all is the expected case,
    however slow the machine)."""
    engine = create_engine_for(postgres_url)
    try:
        sessions = session_factory(engine)
        clock = SystemClock()
        desired = DesiredStates(epoch=lambda: EPOCH)
        store = AgentStore(StateChanges(clock), desired, clock)
        db = Transactions(sessions, publish=lambda _states: None)
        db.write(lambda session: store.register(session, _registration("a"), NOW))

        def bump_elsewhere() -> None:
            errors: list[BaseException] = []

            def bump() -> None:
                try:
                    with sessions() as session, session.begin():
                        session.execute(sa.text("SET LOCAL lock_timeout = '1s'"))
                        desired.bump(session, ["a"])
                except BaseException as exc:  # noqa: BLE001 - reported by the test below
                    errors.append(exc)

            thread = threading.Thread(target=bump)
            thread.start()
            thread.join()
            assert not errors, f"the generation bump waited for the report's transaction: {errors[0]!r}"

        with sessions() as report_session, report_session.begin():
            store.record_report(report_session, _report("a", 1), NOW + 5, epoch=EPOCH)
            bump_elsewhere()  # the report's transaction is still open
        with sessions() as bump_session, bump_session.begin():
            desired.bump(bump_session, ["a"])
            with sessions() as report_session, report_session.begin():
                report_session.execute(sa.text("SET LOCAL lock_timeout = '1s'"))
                store.record_report(report_session, _report("a", 2), NOW + 6, epoch=EPOCH)
                store.record_observed_generation(report_session, _report("a", 3))
        assert _heartbeat(engine, "a") is not None and _heartbeat(engine, "a")[1] == 3  # type: ignore[index]
        s = m.SERVERS.c
        with engine.connect() as conn:
            assert conn.scalar(sa.select(s.desired_generation).where(s.id == "a")) == 3  # registered at 1, two bumps
    finally:
        engine.dispose()


def test_the_migration_moves_each_servers_heartbeat(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'aryl.db'}"
    upgrade(url, "0021")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO servers (id, hostname, pool, state, state_reason, agent_address, agent_version, "
                "registered_at, last_seen_at, desired_generation, observed_generation, version, state_changed_at) "
                "VALUES ('a', 'a', 'TRAINING', 'TRAINING', '', '', '', 1.0, 42.5, 7, 6, 1, 1.0)"))
        upgrade(url)
        assert _heartbeat(engine, "a") == (42.5, 6)
        with engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("servers")}
        assert not columns & {"last_seen_at", "observed_generation"}
    finally:
        engine.dispose()
