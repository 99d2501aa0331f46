"""The scheduler's database misbehaving under load, on the test's own PostgreSQL database, with real
agents running workers:

- its connections are ended (``pg_terminate_backend``, only the backends of this test's database)
  at seeded moments while clients submit and cancel and cycles place jobs: every call is answered
  or refused UNAVAILABLE/ABORTED (retry), never INTERNAL or UNKNOWN, and afterwards nothing is
  half-written and the scheduler serves on;
- the database made slow: a rival transaction holds the row locks of the servers and of a job the
  scheduler must write for longer than the scheduler's lock timeout: the writes that need them
  answer UNAVAILABLE ("busy; retry"), the rest go on, and once the rival ends the same calls
  succeed.

Each ends with the invariants (``tests.chaos.invariants``).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
import sqlalchemy as sa
from grpc_health.v1 import health_pb2

from arylctl.client import ArylClient, ArylError, FailedPrecondition, Unavailable
from protos.aryl.v1 import types_pb2
from tests.chaos.conftest import InProcessCluster, RetryingClient, chaos_job, scaled, serving
from tests.chaos.invariants import check_invariants, database_workers, live_workers, violations, wait_workers_match
from tests.harness import health_stub, secure_channel
from tests.helpers import processes_mentioning, wait_for

pytestmark = pytest.mark.postgres

T = TypeVar("T")

CATCH_UP_S = 60.0
BUSY = "the scheduler's database is busy (a lock or statement timed out); retry"


def terminate_backends(url: str) -> int:
    """End every other session on this test's database (the scheduler's); returns how many."""
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            return int(conn.execute(sa.text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )).scalar_one())
    finally:
        admin.dispose()


class CheckedClient(RetryingClient):
    """A retrying client that also records every refusal it met, by status code."""

    def __init__(self, address: str) -> None:
        super().__init__(address)
        self.refusals: dict[str, int] = {}

    def call(self, do: Callable[[ArylClient], T], *, give_up: Callable[[], bool] = lambda: False) -> T:
        def recorded(client: ArylClient) -> T:
            try:
                return do(client)
            except ArylError as exc:
                self.refusals[exc.code.name] = self.refusals.get(exc.code.name, 0) + 1
                raise
            except grpc.RpcError as exc:  # not one a client knows: recorded, and the test fails below
                self.refusals[exc.code().name] = self.refusals.get(exc.code().name, 0) + 1
                raise
        return super().call(recorded, give_up=give_up)


def _submit(client: RetryingClient, batch: list[tuple[str, tuple[int, int]]], acknowledged: dict[str, str]) -> None:
    for name, (low, high) in batch:
        acknowledged[name] = client.submit(chaos_job(name, workers=low, max_workers=high), f"key-{name}")


def _cancel_running(client: RetryingClient, stop: threading.Event) -> None:
    """Keep at most 3 jobs running: each cancel frees GPUs, and the next cycle places a waiting job."""
    while not stop.is_set():
        jobs = client.call(lambda c: list(c.iter_jobs()))
        assert isinstance(jobs, list)
        live = [j for j in jobs if j.state == types_pb2.JOB_STATE_RUNNING]
        for job in live[: max(0, len(live) - 3)]:
            client.cancel(job.job_id)
        stop.wait(0.1)


def test_connections_terminated_under_load_leave_nothing_half_written(
    inprocess_cluster: InProcessCluster, rng: random.Random,
) -> None:
    rounds = scaled(3, 30)
    cluster = inprocess_cluster
    cluster.start(agents=2, gpus=4)
    clients = [CheckedClient(cluster.address) for _ in range(3)]
    acknowledged: dict[str, str] = {}
    names: list[str] = []
    terminated = 0
    try:
        for round_no in range(rounds):
            batch = [(f"r{round_no}-j{i}", rng.choice(((1, 1), (1, 2), (2, 2)))) for i in range(rng.randint(4, 8))]
            names += [name for name, _ in batch]
            stop = threading.Event()

            threads = [threading.Thread(target=_submit, args=(clients[i], batch[i::2], acknowledged), daemon=True)
                       for i in (0, 1)]
            threads.append(threading.Thread(target=_cancel_running, args=(clients[2], stop), daemon=True))
            for t in threads:
                t.start()
            for _ in range(rng.randint(1, 3)):  # seeded moments, whatever is running then
                time.sleep(rng.uniform(0.05, 0.6))
                terminated += terminate_backends(cluster.url)
            for t in threads[:2]:
                t.join(timeout=120)
                assert not t.is_alive(), "a submission was never answered"
            stop.set()
            threads[2].join(timeout=120)
            check_invariants(cluster.url, acknowledged.values(), submitted_names=names)
        assert terminated > 0
        assert serving(cluster.address)
        wait_workers_match(cluster.url, cluster.marker, timeout=CATCH_UP_S)
    finally:
        for client in clients:
            client.close()
    refusals = {code: n for client in clients for code, n in client.refusals.items()}
    print(f"{terminated} backends terminated; refusals met: {refusals}")
    assert set(refusals) <= {"UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED"}, refusals


class Rival:
    """A transaction of its own that locks rows (``SELECT ... FOR UPDATE``) until ``release``."""

    def __init__(self, url: str) -> None:
        self._engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        self._conn = self._engine.connect()
        self._tx = self._conn.begin()

    def lock(self, sql: str, **params: object) -> int:
        return len(self._conn.execute(sa.text(sql + " FOR UPDATE"), params).all())

    def release(self) -> None:
        self._tx.rollback()
        self._conn.close()
        self._engine.dispose()


def test_rows_locked_past_the_lock_timeout_answer_unavailable_and_the_service_recovers(
    inprocess_cluster: InProcessCluster, rng: random.Random,
) -> None:
    cluster = inprocess_cluster
    # A short lock timeout, so a rival holding a lock longer than it is quick to stage.
    cluster.start(agents=2, gpus=2, database={"lock_timeout_ms": 300, "statement_timeout_ms": 2000})
    client = RetryingClient(cluster.address)
    plain = ArylClient(cluster.address, timeout=10)
    acknowledged: dict[str, str] = {}
    try:
        for i in range(scaled(3, 12)):
            acknowledged[f"held-{i}"] = client.submit(chaos_job(f"held-{i}"), f"key-held-{i}")
        running = wait_for(lambda: [j for j in plain.list_jobs().jobs if j.state == types_pb2.JOB_STATE_RUNNING],
                           timeout=CATCH_UP_S, what="a job running")
        wait_workers_match(cluster.url, cluster.marker, timeout=CATCH_UP_S)
        # Both agents registered (a job may run before the second has: the rival locks both rows).
        wait_for(lambda: len(plain.list_servers()) == 2, timeout=CATCH_UP_S, what="both servers registered")
        victim = rng.choice(running).job_id

        for _ in range(scaled(2, 10)):  # the rival comes and goes; each time, the same outcome
            rival = Rival(cluster.url)
            try:
                assert rival.lock("SELECT id FROM servers") == 2
                assert rival.lock("SELECT id FROM jobs WHERE id = :id", id=int(victim)) == 1
                # A write to the locked job waits out the lock timeout and is refused, retryable.
                with pytest.raises(Unavailable) as refused:
                    plain.cancel_job(victim, reason="chaos")
                assert refused.value.message == BUSY
                # What needs no locked row goes on: reads, and queueing new jobs.
                name = f"during-{len(acknowledged)}"
                acknowledged[name] = plain.submit_job(chaos_job(name), idempotency_key=f"key-{name}").job_id
                assert plain.get_job(victim).job.state == types_pb2.JOB_STATE_RUNNING
                assert serving(cluster.address)
                check_invariants(cluster.url, acknowledged.values())
            finally:
                rival.release()
        # The rival gone: the refused call succeeds, the freed GPUs go to a waiting job, agents follow.
        assert client.call(lambda c: c.cancel_job(victim, reason="chaos")).state == types_pb2.JOB_STATE_CANCELLED
        with pytest.raises(FailedPrecondition):
            plain.cancel_job(victim)
        with secure_channel(cluster.address) as channel:
            health = health_stub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        check_invariants(cluster.url, acknowledged.values())
        wait_workers_match(cluster.url, cluster.marker, timeout=CATCH_UP_S)
    finally:
        client.close()
        plain.close()


def test_the_invariants_catch_what_they_claim_to(inprocess_cluster: InProcessCluster) -> None:
    """The checks of every case above, shown to fail: a job lost, a submission stored twice, GPUs
    held by an ended job, a worker that died unseen."""
    cluster = inprocess_cluster
    cluster.start(agents=1, gpus=2)
    client = RetryingClient(cluster.address)
    try:
        ids = [client.submit(chaos_job(f"j{i}"), f"key-j{i}") for i in range(2)]
        wait_for(lambda: len(database_workers(cluster.url)) == 2, timeout=CATCH_UP_S, what="both jobs placed")
        running = wait_workers_match(cluster.url, cluster.marker, timeout=CATCH_UP_S)
        assert violations(cluster.url, ids, submitted_names=["j0", "j1"]) == []
        client.submit(chaos_job("j0"), "another-key")  # what a retry without its key would do
    finally:
        client.close()
    assert cluster.handle is not None
    cluster.handle.stop()  # from here the database is changed behind the scheduler's back

    engine = sa.create_engine(cluster.url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET state = 'CANCELLED' WHERE id = :id"), {"id": int(ids[1])})
    finally:
        engine.dispose()
    broken = violations(cluster.url, [*ids, "424242"], submitted_names=["j0", "j1"])
    assert broken == ["1 acknowledged job(s) lost: 424242", "1 submission(s) stored more than once: j0 x2",
                      f"job {ids[1]} is CANCELLED but holds 1 GPU(s)"], broken
    with pytest.raises(AssertionError, match="invariants broken"):
        check_invariants(cluster.url, ids, submitted_names=["j0", "j1"])

    # The worker dies unseen: its agent is frozen first (SIGSTOP), so that nothing it does while its scheduler is
    # gone (reconnecting, maybe to another test's scheduler that took the freed port) can change what runs.
    agent = cluster.agents.procs["chaos-0"]
    agent.send_signal(signal.SIGSTOP)
    try:
        victim = next(iter(live_workers(cluster.marker)))
        assert victim in running
        pids = _worker_pids(cluster.marker, victim.job_id)
        assert pids, f"no process of {victim}"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        # A SIGKILLed process lives on until the kernel runs it again to end it: on a loaded machine, long enough
        # for the check below to see it and match at once. So wait until it is gone first; nothing starts it
        # again (the scheduler is stopped, the agent frozen), so from then on the check can only fail.
        wait_for(lambda: victim not in live_workers(cluster.marker), timeout=CATCH_UP_S, what=f"{victim} gone")
        try:
            wait_workers_match(cluster.url, cluster.marker, timeout=1.0)
        except AssertionError as exc:
            assert "wanted, not running" in str(exc) and str(victim) in str(exc), exc
        else:
            pytest.fail(f"the check matched after {victim} was killed: the database wants "
                        f"{sorted(database_workers(cluster.url))}, running {sorted(live_workers(cluster.marker))}")
    finally:
        agent.send_signal(signal.SIGCONT)


def _worker_pids(marker: str, job_id: str) -> list[int]:
    """The (non-shim) worker processes of ``job_id`` among those marked ``marker``."""
    found = []
    for pid in processes_mentioning(marker):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            if f"ARYL_JOB_ID={job_id}\0".encode() in environ and b"shim.py" not in Path(
                    f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found
