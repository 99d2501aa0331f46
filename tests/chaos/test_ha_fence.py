"""The database side of the leader lease's fence (``docs/ha.md``), on two real ``aryl-scheduler``
processes sharing one PostgreSQL database: a leader that resumes after the database judged its lease
over has its in-flight write refused by the fence's check *in the database*, the only thing that can
refuse it when the leader's own clock did not count the pause.

Why the lease is ended in the database rather than waited out: a leader stopped past its lease with
SIGSTOP has, on resuming, its own monotonic deadline behind it too; its lease thread wakes at once and
steps down without asking the database, before a write can reach the database's check (that case is
``pause_past_the_lease`` in ``tests/chaos/test_ha.py``). The database's check stands alone when the
leader's clock did *not* count the pause (CLOCK_MONOTONIC stands still while a machine or VM is
suspended). Here the stopped leader runs a long lease (its lease thread asleep for minutes, its own
deadline far off) and the test ends the lease in the database while it is stopped, as the database's
clock would have after such a pause; the standby (the bounded run's 4 s / 1 s lease, ``ARYL_CHAOS=full``
8 s / 2 s) takes over.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.store.lease import DB_NOW
from tests.chaos.conftest import SchedulerProcess, chaos_job
from tests.fixtures.chaos_ha import (
    LEASE_S,
    RENEW_S,
    TAKEOVER_BOUND_S,
    db_scalar,
    epoch_at,
    named_leader,
    process_state,
)
from tests.harness import secure_channel
from tests.helpers import wait_for

pytestmark = pytest.mark.postgres

# The leader to be stopped: its lease thread sleeps RESUMING_RENEW_S between rounds and its own
# deadline is RESUMING_LEASE_S after its last renewal, so neither can step it down during the test.
RESUMING_LEASE_S, RESUMING_RENEW_S = 600.0, 300.0
# What the test needs of that sleep: arming, the stop, the takeover and the resumed write take a few
# seconds; the lease thread's next round must come well after them.
ROUND_MARGIN_S = 120.0
# The fence's own reason for stepping down (``app.lease``): only a write's database check gives it.
FENCE_REASON = "a write found the lease no longer this scheduler's"
# The lease thread's reasons: seeing any of them first would mean it, not a write, found the lease gone.
LEASE_THREAD_REASONS = ("was not renewed for", "another scheduler took it", "could not renew the lease")


@pytest.fixture
def schedulers(tmp_path: Path, chaos_db: str) -> Iterator[tuple[SchedulerProcess, SchedulerProcess]]:
    """The leader (long lease) and the standby (the bounded run's lease), on one database."""
    common = {"ARYL_LOGGING__LEVEL": "info"}
    leader = SchedulerProcess(chaos_db, tmp_path / "scheduler-a.log", tmp_path / "kill-a", **common,
                              ARYL_HA__LEASE_S=str(RESUMING_LEASE_S), ARYL_HA__RENEW_S=str(RESUMING_RENEW_S))
    standby = SchedulerProcess(chaos_db, tmp_path / "scheduler-b.log", tmp_path / "kill-b", **common,
                               ARYL_HA__LEASE_S=str(LEASE_S), ARYL_HA__RENEW_S=str(RENEW_S))
    try:
        leader.start()
        wait_for(lambda: epoch_at(leader.address) is not None, timeout=30, what="the first scheduler to lead")
        standby.start()
        wait_for(lambda: named_leader(standby.address) == leader.address, timeout=30,
                 what="the second scheduler to stand by, naming the first")
        yield leader, standby
    finally:
        for scheduler in (leader, standby):
            if scheduler.proc is not None and scheduler.proc.poll() is None:
                scheduler.proc.send_signal(signal.SIGCONT)
            scheduler.stop()


def next_lease_round_in(url: str) -> float:
    """Seconds until the leader's lease thread next wakes: its last round set the lease's expiry."""
    remaining = float(db_scalar(url, f"SELECT expires_at - {DB_NOW} FROM leader_lease WHERE id = 1"))
    return RESUMING_RENEW_S - (RESUMING_LEASE_S - remaining)


def end_lease_in_database(url: str, holder: str) -> None:
    """The lease lapses now by the database's clock (what a pause of its holder past it would do)."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            ended = conn.execute(sa.text(f"UPDATE leader_lease SET expires_at = {DB_NOW} WHERE id = 1 "
                                         "AND holder = :holder"), {"holder": holder}).rowcount
    finally:
        engine.dispose()
    assert ended == 1, "the stopped scheduler no longer held the lease"


@contextmanager
def liveness_sweeps_held(url: str) -> Iterator[None]:
    """Hold back every scheduler's liveness sweep (``app.liveness``), whose write each second
    (``remove_vacated``, even with no servers) would otherwise race the resumed submission to the
    database's check: the sweep reads ``allocations``, a submission does not. Reads of it wait too
    (cycles' snapshots, GetCluster), each at most its lock timeout."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("LOCK TABLE allocations IN ACCESS EXCLUSIVE MODE"))
            yield
    finally:
        engine.dispose()


def lease_holder(url: str) -> str:
    """Who holds the unexpired lease now, by the database ('' when it lapsed)."""
    return str(db_scalar(url, f"SELECT holder FROM leader_lease WHERE id = 1 AND expires_at > {DB_NOW}") or "")


def resume_the_stopped_leader(leader: SchedulerProcess, standby: SchedulerProcess, url: str) -> None:
    """Once the leader has stopped itself: end its lease in the database, wait for the standby to lead,
    resume the old leader."""
    proc = leader.proc
    assert proc is not None
    try:
        wait_for(lambda: process_state(proc.pid) == "T", timeout=15, interval=0.05,
                 what="the leader to stop itself before the database's fence check")
        end_lease_in_database(url, leader.address)
        ended_at = time.monotonic()
        # By the lease row, not GetCluster: that reads ``allocations``, held by the test.
        wait_for(lambda: lease_holder(url) == standby.address, timeout=TAKEOVER_BOUND_S, interval=0.05,
                 what="the standby to take the lease")
        print(f"takeover {time.monotonic() - ended_at:.2f}s after the lease ended in the database")
    finally:
        leader.kill_file.write_text("")
        proc.send_signal(signal.SIGCONT)


def stepping_down_reasons(log: str) -> list[str]:
    return [line for line in log.splitlines() if "stepping down" in line]


def test_a_resumed_leader_s_write_is_refused_by_the_database_fence(
        schedulers: tuple[SchedulerProcess, SchedulerProcess], chaos_db: str) -> None:
    """The leader stops itself (``kill_points`` ``fence.checked_locally:stop``) inside a SubmitJob's
    transaction, after its fence found it leading by its own account and before the database's check;
    the lease ends in the database and the standby takes over, ending the stopped leader's database
    sessions. Resumed, the leader's lease thread is still asleep with minutes left, so nothing local
    refuses: the submission runs its transaction again on a fresh connection (the takeover ended the
    first, which rolled back), passes the local check again and meets the database's, which finds the
    lease another's. The caller hears UNAVAILABLE naming the new leader (the fence's own look), neither
    the job nor its JOB_SUBMITTED event is stored, the old leader's first and only step down gives the
    fence's reason, and it stands by.

    Which write meets the database's check first is made certain, not left to a race: the leader's
    liveness sweep writes every second and, resumed at the same moment, reached the check before the
    submission's re-run in 3 of 3 runs without ``liveness_sweeps_held`` (the submission then met the
    local check, in one run while the leader was not yet known: "no leader is elected right now").
    With no agents and no jobs, cycles write nothing, so the submission is the only write that can
    reach the fence, and so the one stopped."""
    leader, standby = schedulers
    assert leader.proc is not None
    margin = next_lease_round_in(chaos_db)
    assert margin > ROUND_MARGIN_S, f"the leader's lease thread wakes in {margin:.0f}s: too soon for this test"
    answer: dict[str, object] = {}
    with secure_channel(leader.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=10)  # connected: the submission goes at once

        def submit() -> None:
            try:
                answer["ok"] = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=chaos_job("resumed-leader")),
                                              timeout=60)
            except grpc.RpcError as exc:
                answer["error"] = exc

        with liveness_sweeps_held(chaos_db):
            leader.kill_file.write_text("fence.checked_locally:1:stop\n")
            caller = threading.Thread(target=submit, daemon=True)
            caller.start()
            resume_the_stopped_leader(leader, standby, chaos_db)
            caller.join(timeout=60)
            assert not caller.is_alive(), "the stopped SubmitJob never got an answer"
    log = Path(leader.logs).read_text()
    error = answer.get("error")
    assert isinstance(error, grpc.RpcError), (
        f"the resumed leader's write was acknowledged: {answer.get('ok')}\nits log:\n{log[-6000:]}")
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    assert f"the leader is at {standby.address}" in (error.details() or ""), error.details()
    print(f"the resumed write: {error.code().name} {error.details()}")
    engine = sa.create_engine(chaos_db)
    try:
        with engine.connect() as conn:
            # This database is the test's own, and this was its only submission.
            assert conn.scalar(sa.text("SELECT count(*) FROM jobs")) == 0
            assert conn.scalar(sa.text("SELECT count(*) FROM events WHERE kind = 'JOB_SUBMITTED'")) == 0
    finally:
        engine.dispose()
    # Its first and only step down is the fence's: neither its lease thread nor anything else local.
    steps = stepping_down_reasons(log)
    assert len(steps) == 1 and FENCE_REASON in steps[0], f"steps down: {steps}\nits log:\n{log[-6000:]}"
    assert not any(reason in log for reason in LEASE_THREAD_REASONS), log[-6000:]
    print("the old leader:", " ".join(steps[0].split())[:300])
    wait_for(lambda: named_leader(leader.address) == standby.address, timeout=15, what="the old leader to stand by")
    assert epoch_at(leader.address) is None and epoch_at(standby.address) is not None
