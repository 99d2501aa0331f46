"""Telemetry written behind its answer: a status report whose only news is telemetry (GPU load,
progress) is answered from memory and written on a thread of its own (issue 37's one-hour soak:
ReportStatus p99 2.0 -> 9.7 s, 65-85% of full-path reports being such writes on the RPC pool).

The writer (``scheduler_service.write_behind.LatestWriter``) with real threads and a write function written
here; the service over real gRPC on loopback and a real database (SQLite and PostgreSQL), whose server
row the test locks as a slow write would.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from scheduler_service.app.agents import _ReportOrder
from scheduler_service.store import models as m
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.write_behind import LatestWriter
from tests.fixtures.workers import Agent, get_job, running, submit, worker
from tests.harness import job_spec, register_fake_server, scheduler_stub
from tests.helpers import wait_for


class _GatedWrites:
    """A write function that records what it wrote and holds its first write until ``gate`` opens."""

    def __init__(self) -> None:
        self.written: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.in_flight = threading.Event()

    def __call__(self, item: tuple[str, int]) -> None:
        self.in_flight.set()
        assert self.gate.wait(30), "the test never opened the gate"
        if item[1] < 0:
            raise ValueError(f"bad item {item}")
        self.written.append(item)


def _writer(writes: _GatedWrites) -> LatestWriter[tuple[str, int]]:
    return LatestWriter(writes, key=lambda item: item[0], name="test-writer")


def test_the_latest_item_per_key_is_written_in_its_place_in_line() -> None:
    writes = _GatedWrites()
    writer = _writer(writes)
    try:
        assert writer.offer(("a", 1))
        assert writes.in_flight.wait(30)  # ("a", 1) is being written: what follows waits
        for item in (("b", 1), ("c", 1), ("b", 2), ("a", 2), ("b", 3)):
            assert writer.offer(item)
        assert writer.backlog() == 3  # b, c, a: one each, b's latest replacing its older ones
        writes.gate.set()
        wait_for(lambda: writer.backlog() == 0 and len(writes.written) == 4, timeout=30, what="the backlog written")
        assert writes.written == [("a", 1), ("b", 3), ("c", 1), ("a", 2)]
    finally:
        writes.gate.set()
        writer.close()


def test_a_withdrawn_item_is_not_written_and_a_failing_one_does_not_stop_the_writer() -> None:
    writes = _GatedWrites()
    writer = _writer(writes)
    try:
        writer.offer(("a", 1))
        assert writes.in_flight.wait(30)
        writer.offer(("b", -1))  # its write raises: logged, and the next is served
        writer.offer(("c", 1))
        writer.offer(("d", 1))
        writer.withdraw("c")  # something newer of c was written elsewhere
        writes.gate.set()
        wait_for(lambda: len(writes.written) == 2, timeout=30, what="a and d written")
        assert writes.written == [("a", 1), ("d", 1)]
        assert writer.offer(("e", 1))
        wait_for(lambda: len(writes.written) == 3, timeout=30, what="e written")
    finally:
        writes.gate.set()
        writer.close()


def test_close_writes_what_waits_and_later_offers_are_refused() -> None:
    writes = _GatedWrites()
    writer = _writer(writes)
    writer.offer(("a", 1))
    assert writes.in_flight.wait(30)
    writer.offer(("b", 1))
    closing = threading.Thread(target=writer.close)
    closing.start()
    wait_for(lambda: not writer.offer(("c", 1)), timeout=30, what="offers refused once closing")
    writes.gate.set()
    closing.join(30)
    assert not closing.is_alive()
    assert writes.written == [("a", 1), ("b", 1)]
    assert not writer.offer(("d", 1))


def test_waiting_items_are_written_as_one_batch_and_a_failing_batch_item_by_item() -> None:
    writes = _GatedWrites()
    batches: list[list[tuple[str, int]]] = []

    def write_many(items: list[tuple[str, int]]) -> None:
        batches.append(list(items))
        if any(item[1] < 0 for item in items):
            raise ValueError("a bad item in the batch")
        writes.written.extend(items)

    writer = LatestWriter(writes, key=lambda item: item[0], name="test-writer", write_many=write_many, batch=3,
                          gather_s=0.2)  # f and g below are offered well within it
    try:
        writer.offer(("a", 1))
        assert writes.in_flight.wait(30)  # alone after its gather: written by ``write``, held at the gate
        for item in (("b", 1), ("c", 1), ("b", 2), ("d", 1), ("e", 1)):
            writer.offer(item)
        writes.gate.set()
        wait_for(lambda: len(writes.written) == 5, timeout=30, what="the backlog written")
        assert batches == [[("b", 2), ("c", 1), ("d", 1)]]  # at most 3, oldest first, b's latest
        assert writes.written == [("a", 1), ("b", 2), ("c", 1), ("d", 1), ("e", 1)]  # e alone: ``write``
        writer.offer(("f", -1))  # the batch fails: each item on its own, f's failure its own
        writer.offer(("g", 1))
        wait_for(lambda: len(writes.written) == 6, timeout=30, what="g written after the failed batch")
        assert batches[-1] == [("f", -1), ("g", 1)] and writes.written[-1] == ("g", 1)
    finally:
        writes.gate.set()
        writer.close()


def test_a_report_written_behind_never_overwrites_what_a_later_report_recorded() -> None:
    order = _ReportOrder()
    behind, later = order.ticket(), order.ticket()  # offered to the writer, then a report with news
    with order.recording("gpu-1", later, behind=False) as record:
        assert record
    with order.recording("gpu-1", behind, behind=True) as record:
        assert not record  # its progress would go back
    with order.recording("gpu-2", behind, behind=True) as record:
        assert record  # another server's turn is its own
    with order.recording("gpu-1", behind, behind=False) as record:
        assert record  # a report with news is always recorded


# --------------------------------------------------------------------------------------------------
# The service

TELEMETRY_WRITE_S = 0.2


def _reporting_job(scheduler_factory):
    scheduler = scheduler_factory(agents={"telemetry_write_s": TELEMETRY_WRITE_S, "lost_after_s": 1e6})
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "gpu-1", gpus=2).scheduler_epoch
    agent = Agent(scheduler.address, "gpu-1", epoch)
    job_id = submit(stub, job_spec("telemetry"))
    running(stub, job_id)
    agent.report(worker(job_id, 0, 1, progress=1.0))  # the first report: the full path
    assert get_job(stub, job_id).progress == 1.0
    time.sleep(TELEMETRY_WRITE_S * 1.5)  # at least the interval: the next report's telemetry is due
    return scheduler, channel, stub, agent, job_id


def test_a_report_whose_telemetry_is_due_is_written_behind_its_answer(scheduler_factory) -> None:
    scheduler, channel, stub, agent, job_id = _reporting_job(scheduler_factory)
    try:
        agent.report(worker(job_id, 0, 1, progress=2.0))
        # No further report: only the writer can write it.
        wait_for(lambda: get_job(stub, job_id).progress == 2.0, timeout=60, what="the progress written behind")
        assert scheduler.service.metrics.registry.get_sample_value("aryl_scheduler_telemetry_backlog") == 0.0
    finally:
        agent.close()
        channel.close()


def test_a_report_is_answered_while_its_telemetry_write_waits_on_a_lock(scheduler_factory) -> None:
    """The server's row locked (PostgreSQL: FOR UPDATE; SQLite: the write lock, BEGIN IMMEDIATE), as a
    slow transaction holds it: the report is answered at once, its progress written once the lock is
    gone. Before the write-behind, the report waited for the lock (up to lock_timeout_ms, then BUSY)."""
    scheduler, channel, stub, agent, job_id = _reporting_job(scheduler_factory)
    engine = create_engine_for(scheduler.service.config.database.url)
    try:
        with session_factory(engine)() as session, session.begin():
            session.execute(sa.select(m.SERVERS.c.id).where(m.SERVERS.c.id == "gpu-1").with_for_update()).one()
            answer = agent.stub.ReportStatus(
                agent.request(worker(job_id, 0, 1, progress=2.0)), timeout=60
            )
            assert answer.desired_generation > 0
            # The write waits on the lock (read here: SQLite's readers wait on its write lock too).
            assert session.execute(sa.select(m.JOBS.c.work_done).where(m.JOBS.c.id == job_id)).scalar_one() == 1.0
        # The writer's write may have run out of lock_timeout_ms meanwhile on a loaded machine (then the
        # next report takes the full path): reports go on, as an agent's do.
        wait_for(lambda: agent.report(worker(job_id, 0, 1, progress=2.0)) and get_job(stub, job_id).progress == 2.0,
                 timeout=60, what="the progress written once the lock is gone")
    finally:
        engine.dispose()
        agent.close()
        channel.close()
