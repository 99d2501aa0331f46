"""Status reports cannot starve (issue 37): the reports of one multi-worker job's agents, arriving together
with cycle applies that change the same job and servers, are all recorded; none answers ABORTED.

Seen in ``soak-ci``: a report lost its optimistic version check CONFLICT_RETRIES times in a row and the agent
heard ABORTED. A report of a worker's exit writes the job's row under its version; the reports of the job's
other ranks, from other servers, and the cycle's applies write the same row, and each commit of theirs made
the report's read stale. On PostgreSQL a report now locks the rows it may change (its server's, then the
job rows it names, in id order) before reading them, so it waits for its rivals instead of losing to them.
SQLite serialises writers anyway (``BEGIN IMMEDIATE``), so this runs on both.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.clock import SystemClock
from scheduler_service.errors import Aborted
from scheduler_service.lifecycle import JobState
from scheduler_service.records import StatusReport, WorkerReport
from scheduler_service.store import models as m
from scheduler_service.store.agents import AgentStore
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.transactions import Transactions

EPOCH = 1
RANKS = 6  # one worker per server; ranks 1.. report their exits over and over, rank 0 keeps running
ROUNDS = 40  # reports per reporting server
NOW = 1_700_000_000.0


def _cluster(session: Session) -> int:
    """RANKS servers with one GPU each, and one RUNNING job with a worker on each; returns its id."""
    for rank in range(RANKS):
        session.add(m.Server(id=f"s{rank}", hostname=f"s{rank}", pool="TRAINING", state="TRAINING",
                             registered_at=NOW))
    session.flush()
    session.add_all(m.Gpu(server_id=f"s{rank}", index=0, uuid=f"GPU-s{rank}-0") for rank in range(RANKS))
    job = m.Job(name="wide", user="alice", queue="default", command=["python", "train.py"], env={},
                gpus_per_worker=1, min_workers=RANKS, max_workers=RANKS, throughput={}, restart_policy="NEVER",
                state=JobState.RUNNING, submitted_at=NOW, num_workers=RANKS, incarnation=1)
    session.add(job)
    session.flush()
    session.add_all(m.Allocation(job_id=job.id, rank=rank, server_id=f"s{rank}", gpu_index=0, allocated_at=NOW)
                    for rank in range(RANKS))
    return job.id


def test_concurrent_reports_of_one_job_never_abort_against_each_other_and_cycle_applies(database_url: str) -> None:
    engine = create_engine_for(database_url)
    try:
        transactions = Transactions(session_factory(engine), publish=lambda _states: None)
        clock = SystemClock()
        changes, desired = StateChanges(clock), DesiredStates(epoch=lambda: EPOCH)
        store = AgentStore(changes, desired, clock)
        job_id = transactions.write(_cluster)
        aborted: list[str] = []
        recorded = [0]
        done = threading.Event()
        start = threading.Barrier(RANKS)  # the reporting servers and the cycle begin together

        def report(rank: int) -> None:
            exited = WorkerReport(job_id=job_id, rank=rank, incarnation=1, phase="EXITED", exit_code=0)
            status = StatusReport(server_id=f"s{rank}", scheduler_epoch=EPOCH, gpus=(), observed_generation=0,
                                  workers=(exited,))
            start.wait()
            for _ in range(ROUNDS):
                try:
                    transactions.write(lambda session: store.record_report(session, status, clock.now(),
                                                                           epoch=EPOCH))
                    recorded[0] += 1
                except Aborted as exc:
                    aborted.append(f"s{rank}: {exc}")
                except Exception as exc:  # noqa: BLE001 - any other failure fails the test too, by name
                    aborted.append(f"s{rank}: {type(exc).__name__}: {exc}")

        def cycle() -> None:
            """What an apply does to a running job and its servers: a versioned change of the job (here it
            forgets the exits, so every report carries news again) and a desired-generation bump."""

            def apply(session: Session) -> None:
                job = session.get(m.Job, job_id)
                assert job is not None
                job.worker_exits = None
                job.last_resized_at = clock.now()
                session.flush()
                desired.bump(session, [f"s{rank}" for rank in range(RANKS)])

            start.wait()
            while not done.is_set():
                try:
                    transactions.write(apply)
                except Aborted:
                    pass  # an apply that lost is refused and planned again; only reports must not lose
                except Exception as exc:  # noqa: BLE001 - reported by the test, not lost in a thread
                    aborted.append(f"cycle: {type(exc).__name__}: {exc}")
                    return
                time.sleep(0.001)

        reporters = [threading.Thread(target=report, args=(rank,)) for rank in range(1, RANKS)]
        applier = threading.Thread(target=cycle)
        for thread in [*reporters, applier]:
            thread.start()
        for thread in reporters:
            thread.join()
        done.set()
        applier.join()

        assert aborted == [], f"{len(aborted)} of {(RANKS - 1) * ROUNDS} reports failed, first: {aborted[0]}"
        assert recorded[0] == (RANKS - 1) * ROUNDS
        with engine.connect() as conn:  # the job never ended: rank 0 was never reported as exited
            assert conn.scalar(sa.select(m.JOBS.c.state).where(m.JOBS.c.id == job_id)) == JobState.RUNNING
    finally:
        engine.dispose()

