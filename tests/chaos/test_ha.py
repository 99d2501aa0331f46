"""Two real ``aryl-scheduler`` processes on one PostgreSQL database (``docs/ha.md``), with real agents
given both addresses: one leads, the other names it; kill -9 the leader under a submission load and the standby leads
within 15 s, the agents follow it, no acknowledged job is lost, no GPU is held twice and no running
job is restarted (its incarnation unchanged); a leader paused with SIGSTOP past its lease and resumed
has its next write refused and stands by.

One pair of processes serves both cases (each pair costs two scheduler starts): the pause first,
after which the paused scheduler stands by, then the kill of the new leader. Bounded form
(``make test``): a 4 s lease renewed every 1 s, one kill. ``ARYL_CHAOS=full``: the default 8 s / 2 s
lease, and three kills in a row (each new leader killed in turn, the killed one restarted as the
standby).
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.chaos.conftest import Agents, RetryingClient, SchedulerProcess, _end_processes, chaos_job, scaled
from tests.chaos.invariants import check_invariants, wait_workers_match
from tests.fixtures.chaos_ha import LEASE_S, RENEW_S, TAKEOVER_BOUND_S, db_scalar, epoch_at, named_leader, process_state
from tests.harness import secure_channel
from tests.helpers import wait_for

pytestmark = pytest.mark.postgres

# Agents silent this long are LOST: longer than their reconnect backoff (10 s) while they look for
# the new leader, so that a takeover costs no server.
LOST_AFTER_S = 20.0
SETTINGS = {"ARYL_HA__LEASE_S": str(LEASE_S), "ARYL_HA__RENEW_S": str(RENEW_S),
            "ARYL_AGENTS__LOST_AFTER_S": str(LOST_AFTER_S), "ARYL_LOGGING__LEVEL": "info"}


class Pair:
    def __init__(self, tmp: Path, url: str) -> None:
        self.url = url
        self.schedulers = [SchedulerProcess(url, tmp / f"scheduler-{name}.log", tmp / f"kill-{name}", **SETTINGS)
                           for name in ("a", "b")]
        self.marker = f"aryl-chaos-{tmp.name}-ha"
        self.agents = Agents(tmp, self.marker)

    @property
    def addresses(self) -> str:
        return ",".join(s.address for s in self.schedulers)

    def leader(self) -> SchedulerProcess | None:
        leading = [s for s in self.schedulers if s.proc is not None and s.proc.poll() is None
                   and epoch_at(s.address) is not None]
        assert len(leading) <= 1, f"two schedulers lead: {[s.address for s in leading]}"
        return leading[0] if leading else None

    def close(self) -> None:
        self.agents.close()
        for scheduler in self.schedulers:
            if scheduler.proc is not None and scheduler.proc.poll() is None:
                scheduler.proc.send_signal(signal.SIGCONT)
            scheduler.stop()
        _end_processes(self.marker)


@pytest.fixture
def pair(tmp_path: Path, chaos_db: str):
    made = Pair(tmp_path, chaos_db)
    try:
        first, second = made.schedulers
        first.start()
        wait_for(lambda: epoch_at(first.address) is not None, timeout=30, what="the first scheduler to lead")
        second.start()
        yield made
    finally:
        made.close()


def incarnations(url: str) -> dict[int, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT id, incarnation FROM jobs WHERE state IN ('RUNNING', 'SCALING')"))
            return {int(job_id): int(incarnation) for job_id, incarnation in rows}
    finally:
        engine.dispose()


def count_lost(url: str) -> int:
    return int(db_scalar(url, "SELECT count(*) FROM events WHERE kind = 'SERVER_STATE' AND reason = 'AGENT_SILENT'")
               or 0)


class SubmitLoad:
    """Submissions in a thread, each retried with its idempotency key until acknowledged, through a
    client given both schedulers' addresses."""

    def __init__(self, addresses: str) -> None:
        self.client = RetryingClient(addresses)
        self.acknowledged: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.errors: list[BaseException] = []

    def submit(self, name: str) -> str:
        job_id = self.client.submit(chaos_job(name), key=name)
        self.acknowledged[name] = job_id
        return job_id

    def _run(self) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                self.submit(f"load-{i}")
                i += 1
                self._stop.wait(0.1)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=120)
        assert not self._thread.is_alive(), "a submission never got an answer"
        assert not self.errors, self.errors


def standby_leads(standby: SchedulerProcess, *, since: float, what: str) -> None:
    """Wait until ``standby`` leads; it must within ``TAKEOVER_BOUND_S`` of ``since`` (monotonic)."""
    wait_for(lambda: epoch_at(standby.address) is not None, timeout=TAKEOVER_BOUND_S + 15, interval=0.1,
             what=f"the standby to lead ({what})")
    took = time.monotonic() - since
    print(f"{what} in {took:.2f}s (lease {LEASE_S:g}s, renew {RENEW_S:g}s)")
    assert took < TAKEOVER_BOUND_S


def pause_past_the_lease(pair: Pair) -> None:
    """SIGSTOP the leader until the standby leads; SIGCONT it and send it a write at once: refused, not
    stored; it stands by, naming the new leader."""
    first, second = pair.schedulers
    assert pair.leader() is first and first.proc is not None
    first.proc.send_signal(signal.SIGSTOP)
    try:
        standby_leads(second, since=time.monotonic(), what="takeover from a paused leader")
    finally:
        first.proc.send_signal(signal.SIGCONT)
    # Straight to it (a raw stub: ArylClient would follow the leader it names).
    with secure_channel(first.address) as channel, pytest.raises(grpc.RpcError) as refused:
        scheduler_pb2_grpc.SchedulerServiceStub(channel).SubmitJob(
            scheduler_pb2.SubmitJobRequest(spec=chaos_job("from-the-paused-leader"), idempotency_key="paused"),
            timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    print(f"its next write: {refused.value.code().name} {refused.value.details()}")
    engine = sa.create_engine(pair.url)
    try:
        with engine.connect() as conn:
            assert conn.scalar(sa.text("SELECT count(*) FROM jobs WHERE name = 'from-the-paused-leader'")) == 0
    finally:
        engine.dispose()
    wait_for(lambda: named_leader(first.address) == second.address, timeout=10, what="the old leader to stand by")
    assert pair.leader() is second
    assert "stepping down" in Path(first.logs).read_text()


def test_paused_leader_is_refused_then_a_killed_leader_loses_nothing(pair: Pair) -> None:
    """One pair of processes for both cases (each pair costs two scheduler starts): first the leader is
    paused past its lease (it stands by afterwards), then the new leader is killed -9 under load."""
    pause_past_the_lease(pair)
    leader: SchedulerProcess | None  # the one leading; each round finds it again
    standby, leader = pair.schedulers  # after the pause, the second leads
    for i in range(2):
        pair.agents.start(pair.addresses, f"ha-{i}", gpus=4)
    # The load's client is given the standby first: each of its calls starts there and follows the leader.
    load = SubmitLoad(f"{standby.address},{leader.address}")
    for i in range(4):
        load.submit(f"before-{i}")
    wait_for(lambda: len(incarnations(pair.url)) == 4, timeout=30, what="the first jobs to run")
    wait_workers_match(pair.url, pair.marker, timeout=30)
    load.start()

    kills = scaled(1, 3)
    for round_no in range(kills):
        leader = pair.leader()
        assert leader is not None
        standby = next(s for s in pair.schedulers if s is not leader)
        running = incarnations(pair.url)
        old_epoch = epoch_at(leader.address)
        assert old_epoch is not None
        time.sleep(1.0)  # under load
        killed_at = time.monotonic()
        leader.kill9()
        def leading(address: str = standby.address) -> bool:
            return epoch_at(address) is not None
        wait_for(leading, timeout=TAKEOVER_BOUND_S + 15, interval=0.1, what="the standby to lead")
        took = time.monotonic() - killed_at
        new_epoch = epoch_at(standby.address)
        print(f"kill {round_no}: takeover in {took:.2f}s (lease {LEASE_S:g}s, renew {RENEW_S:g}s), "
              f"epoch {old_epoch} -> {new_epoch}")
        assert took < TAKEOVER_BOUND_S
        assert new_epoch is not None and new_epoch > old_epoch
        time.sleep(2.0)  # the load goes on against the new leader
        # The agents follow: the workers the database wants (including jobs placed by the new leader)
        # run, and each server reports its desired generation applied.
        wait_workers_match(pair.url, pair.marker, timeout=60)
        still = incarnations(pair.url)
        assert set(running) <= set(still), "a job that ran before the kill does not run any more"
        assert {job: still[job] for job in running} == running, "a job was restarted (new incarnation)"
        if round_no + 1 < kills:
            leader.start()  # back, as the standby
    load.stop()
    check_invariants(pair.url, load.acknowledged.values(), submitted_names=load.acknowledged.keys())
    wait_workers_match(pair.url, pair.marker, timeout=60)
    assert count_lost(pair.url) == 0, "a server was marked LOST during a takeover"
    print(f"{len(load.acknowledged)} jobs acknowledged, all stored; {len(incarnations(pair.url))} running")


def test_a_leader_paused_between_its_fence_and_its_commit_does_not_commit(pair: Pair) -> None:
    """The database side of the fence, on real processes: the leader stops itself (``kill_points``
    ``fence.passed:stop``) in a SubmitJob's transaction after the fence passed, its COMMIT not sent, the
    lease row held ``FOR KEY SHARE``. The standby still takes over once the lease lapses by the
    database's clock (it ends the old leader's sessions, rolling that transaction back), and the
    resumed leader's COMMIT fails: the caller hears UNAVAILABLE, and neither the job nor its event is
    stored. A paused leader's own timer cannot be what refuses here: the write had already passed it."""
    first, second = pair.schedulers
    assert pair.leader() is first and first.proc is not None
    # No agents and no jobs yet: the submission is the leader's only write, so it is the one stopped.
    first.kill_file.write_text("fence.passed:1:stop\n")
    answer: dict[str, object] = {}

    def submit() -> None:
        try:
            with secure_channel(first.address) as channel:
                answer["ok"] = scheduler_pb2_grpc.SchedulerServiceStub(channel).SubmitJob(
                    scheduler_pb2.SubmitJobRequest(spec=chaos_job("paused-at-commit")), timeout=60)
        except grpc.RpcError as exc:
            answer["error"] = exc

    caller = threading.Thread(target=submit, daemon=True)
    caller.start()
    first_proc = first.proc
    assert first_proc is not None
    wait_for(lambda: process_state(first_proc.pid) == "T", timeout=15, interval=0.05,
             what="the leader to stop itself between its fence and its commit")
    try:
        standby_leads(second, since=time.monotonic(), what="takeover past a paused write")
    finally:
        first.kill_file.write_text("")
        first.proc.send_signal(signal.SIGCONT)
    caller.join(timeout=60)
    assert not caller.is_alive(), "the paused SubmitJob never got an answer"
    error = answer.get("error")
    assert isinstance(error, grpc.RpcError), (
        f"the paused write was acknowledged: {answer.get('ok')}\nold leader's log:\n"
        f"{Path(first.logs).read_text()[-6000:]}\nnew leader's log:\n{Path(second.logs).read_text()[-3000:]}")
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    print(f"the paused write: {error.code().name} {error.details()}")
    assert db_scalar(pair.url, "SELECT count(*) FROM jobs WHERE name = 'paused-at-commit'") == 0
    assert db_scalar(pair.url, "SELECT count(*) FROM events WHERE kind = 'JOB_SUBMITTED' "
                               "AND message LIKE 'paused-at-commit %'") == 0
    assert "ended the database sessions of the previous leader" in Path(second.logs).read_text()
    assert "database connection lost during COMMIT" in Path(first.logs).read_text()
    wait_for(lambda: named_leader(first.address) == second.address, timeout=15, what="the old leader to stand by")
    assert pair.leader() is second
