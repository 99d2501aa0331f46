"""The scheduler process killed with SIGKILL at seeded points, on PostgreSQL with real agents.

Each round sends a burst of submissions from several clients (each retrying with its idempotency
key until answered, as ``arylctl`` does) and cancels some running jobs, so that scheduling cycles
apply plans and desired states are pushed to the agents. In each round the scheduler dies once:

- ``burst``: killed after a seeded delay into the burst (wherever that falls);
- ``submit.committed``, ``apply.written``, ``commit.before_push``: the process kills itself the
  n-th time (n seeded) it reaches that point (``scheduler_service.kill_points``: a batch of
  submissions committed but not answered; a plan written but not committed; a commit whose
  desired states are not pushed yet), points random timing cannot hit reliably.

It is started again on the same port and database; the round's clients finish; then the
invariants hold (``tests.chaos.invariants``): every acknowledged job is stored once, no GPU is held
twice, and the agents run exactly the workers the database holds once they have caught up.
100 kill points under ARYL_CHAOS=full, a few otherwise.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest

from arylctl.client import NotFound
from protos.aryl.v1 import types_pb2
from tests.chaos.conftest import FULL, ChaosCluster, GaveUp, RetryingClient, chaos_job, scaled
from tests.chaos.invariants import check_invariants, wait_workers_match

pytestmark = pytest.mark.postgres

KILL_POINTS = ("burst", "submit.committed", "apply.written", "commit.before_push")
LIVE = (types_pb2.JOB_STATE_PENDING, types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_SCALING)
# A bound on waiting for the agents after a restart (reconnect backoff, re-registration, a cycle):
# a failure bound, never a measurement.
CATCH_UP_S = 60.0


class Workload:
    """Submissions with unique names (one per logical job) and their acknowledged ids."""

    def __init__(self, address: str, rng: random.Random, clients: int = 3) -> None:
        self.rng = rng
        self.clients = [RetryingClient(address) for _ in range(clients)]  # one per submitting thread
        self.canceller = RetryingClient(address)
        self.acknowledged: dict[str, str] = {}  # name -> job id
        self.names: list[str] = []
        self._unfinished: list[tuple[str, types_pb2.JobSpec]] = []
        self._lock = threading.Lock()

    def burst(self, round_no: int, jobs: int) -> list[threading.Thread]:
        """Start ``jobs`` submissions spread over the clients (threads); returns the threads."""
        specs = []
        for i in range(jobs):
            name = f"r{round_no}-j{i}"
            shape = self.rng.choice(((1, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2)))  # min, max workers, GPUs
            specs.append((name, chaos_job(name, workers=shape[0], max_workers=shape[1], gpus=shape[2])))
            self.names.append(name)
        threads = []
        for c, client in enumerate(self.clients):
            mine = specs[c::len(self.clients)]
            threads.append(threading.Thread(target=self._submit_all, args=(client, mine), daemon=True))
        for t in threads:
            t.start()
        return threads

    def _submit_all(self, client: RetryingClient, specs: list[tuple[str, types_pb2.JobSpec]]) -> None:
        for name, spec in specs:
            job_id = client.submit(spec, key=f"key-{name}")
            with self._lock:
                assert self.acknowledged.setdefault(name, job_id) == job_id
                # (one acknowledgement per logical job: its loop ends at the first answer)

    def cancel_some(self, keep_active: int, *, give_up: Callable[[], bool] = lambda: False) -> None:
        """Cancel the oldest live jobs until at most ``keep_active`` remain (cycles then start others)."""
        client = self.canceller
        listed = client.call(lambda c: list(c.iter_jobs(states=LIVE)), give_up=give_up)
        assert isinstance(listed, list)
        live = sorted(listed, key=lambda j: int(j.job_id))
        for job in live[: max(0, len(live) - keep_active)]:
            try:
                client.cancel(job.job_id, give_up=give_up)
            except NotFound as exc:  # every listed job exists: losing one is what this suite looks for
                raise AssertionError(f"job {job.job_id} listed, then not found") from exc

    def churn(self, name: str, give_up: Callable[[], bool]) -> None:
        """Queue one job and cancel the oldest running one: the next cycle has a plan to apply (the
        new job, or a waiting one, on the freed GPUs) and desired states to push. A submission cut off
        by the scheduler's death is finished by ``finish_churn`` (same key) after its restart."""
        self.names.append(name)
        spec = chaos_job(name, workers=1, max_workers=self.rng.choice((1, 2)))
        try:
            self.acknowledged[name] = self.canceller.submit(spec, f"key-{name}", give_up=give_up)
            running = self.canceller.call(
                lambda c: list(c.iter_jobs(states=(types_pb2.JOB_STATE_RUNNING,))), give_up=give_up)
            assert isinstance(running, list)
            if running:
                self.canceller.cancel(min(running, key=lambda j: int(j.job_id)).job_id, give_up=give_up)
        except GaveUp:
            if name not in self.acknowledged:
                self._unfinished.append((name, spec))
            raise

    def finish_churn(self) -> None:
        for name, spec in self._unfinished:
            self.acknowledged[name] = self.canceller.submit(spec, f"key-{name}")
        self._unfinished.clear()

    def close(self) -> None:
        for client in [*self.clients, self.canceller]:
            client.close()


def _killer(cluster: ChaosCluster, delay: float) -> threading.Thread:
    def kill() -> None:
        time.sleep(delay)
        cluster.scheduler.kill9()
    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_scheduler_killed_at_random_points_loses_duplicates_and_double_books_nothing(
    chaos_cluster: ChaosCluster, rng: random.Random,
) -> None:
    points = scaled(len(KILL_POINTS), 100)
    chaos_cluster.start(agents=2, gpus=4)
    scheduler = chaos_cluster.scheduler
    work = Workload(scheduler.address, rng)
    done: list[str] = []
    try:
        for round_no in range(points):
            # The first rounds take each kind in turn (so the bounded run hits every one), then seeded.
            kind = KILL_POINTS[round_no] if round_no < len(KILL_POINTS) else rng.choice(KILL_POINTS)
            nth = rng.randint(1, 3) if FULL else 1
            began = time.monotonic()  # (phase durations are printed for whoever reads the log; never asserted)
            if kind != "burst":
                scheduler.arm(kind, nth)
            killer = _killer(chaos_cluster, rng.uniform(0.0, 1.5)) if kind == "burst" else None
            threads = work.burst(round_no, rng.randint(4, 8))
            if kind != "burst":
                # Churn (a new job, a running one cancelled) makes cycles apply plans and push desired
                # states until the point is hit.
                def dead() -> bool:
                    return scheduler.proc is not None and scheduler.proc.poll() is not None
                for step in range(300):
                    try:
                        work.churn(f"r{round_no}-c{step}", give_up=dead)
                    except GaveUp:
                        break
                    if dead():
                        break
                    time.sleep(0.1)
                else:
                    raise AssertionError(f"the scheduler never reached kill point {kind} {nth} time(s)")
            else:
                assert killer is not None
                killer.join()
            assert scheduler.proc is not None and scheduler.proc.poll() is not None
            done.append(f"{kind}:{nth}" + ("" if scheduler.died_by_sigkill() else f" (exit {scheduler.proc.poll()})"))
            died = time.monotonic()
            scheduler.disarm()
            scheduler.start()
            restarted = time.monotonic()
            work.finish_churn()
            for t in threads:
                t.join(timeout=120)
                assert not t.is_alive(), "a client never got its submission answered"
            work.cancel_some(keep_active=6)
            check_invariants(chaos_cluster.url, work.acknowledged.values(), submitted_names=work.names)
            checked = time.monotonic()
            wait_workers_match(chaos_cluster.url, chaos_cluster.marker, timeout=CATCH_UP_S)
            print(f"round {round_no} {done[-1]}: died after {died - began:.1f}s, restarted in {restarted - died:.1f}s, "
                  f"clients done in {checked - restarted:.1f}s, workers matched in {time.monotonic() - checked:.1f}s",
                  flush=True)
        assert len(work.acknowledged) == len(work.names)
    finally:
        work.close()
        print(f"kill points ({len(done)}): {', '.join(done)}")
    # Every death was a SIGKILL (a kill point reached, or the test's own): none ended the process otherwise.
    assert all("exit" not in d for d in done), done
