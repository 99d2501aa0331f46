"""The invariants every fault-injection case asserts after its faults, read from the database (and,
for workers, from ``/proc``): what a user relies on whatever failed.

- *No acknowledged job lost*: every job id a client was given (``SubmitJob`` answered) is a row.
- *No duplicate*: each logical submission (a name the test used once, however often its client
  retried it) is at most one row; each (user, idempotency key) at most one row.
- *No GPU double-booked*: one allocation per (server, GPU) at most; only RUNNING/SCALING jobs hold
  GPUs, each exactly ``num_workers`` ranks 0..n-1 of ``gpus_per_worker`` GPUs on one server each;
  at most one open loan per server.
- *Workers match the database*: the worker processes the agents run (found through ``/proc`` by the
  ``MARKER_ENV`` variable a test sets in its agents' environment, which their workers inherit) are
  exactly the allocations of the database, job, rank, incarnation and GPUs, once the agents have
  caught up (``wait_workers_match``).

API (shared by every ``tests/chaos`` module):

    check_invariants(db_url, acknowledged_job_ids, submitted_names=...)   # raises AssertionError
    wait_workers_match(db_url, marker, servers=..., timeout=...)        # raises AssertionError
    database_workers(db_url), live_workers(marker)                        # the two sides, to print

Never: wait on the wall clock for anything but the bounded poll of ``wait_workers_match`` (its
timeout is a failure bound, not a measurement), or change the database.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from tests.helpers import scaled_timeout

# Set in an agent's environment (its workers inherit it): the test's marker, and the agent's server id.
MARKER_ENV = "ARYL_CHAOS_MARKER"
SERVER_ENV = "ARYL_CHAOS_SERVER"

_HOLDING_STATES = ("RUNNING", "SCALING")


@dataclass(frozen=True, order=True)
class Worker:
    """One worker as the database wants it or as it runs: server, job id, rank, incarnation, GPUs."""

    server_id: str
    job_id: str
    rank: int
    incarnation: int
    gpus: tuple[int, ...]


def _engine(db_url: str) -> sa.Engine:
    return sa.create_engine(db_url, poolclass=sa.pool.NullPool)


def violations(db_url: str, acknowledged_job_ids: Iterable[str | int] = (), *,
               submitted_names: Iterable[str] | None = None) -> list[str]:
    """Every invariant broken in the database at ``db_url``, one line each (empty: all hold).
    ``submitted_names``: the names of the test's logical submissions (each used once by the test);
    None checks every name in the jobs table."""
    engine = _engine(db_url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))  # one consistent view
            jobs = conn.execute(sa.text(
                'SELECT id, name, "user", idempotency_key, state, num_workers, gpus_per_worker FROM jobs')).all()
            allocations = conn.execute(sa.text(
                "SELECT job_id, rank, server_id, gpu_index FROM allocations")).all()
            gpus = {(r.server_id, r.index) for r in conn.execute(sa.text('SELECT server_id, "index" FROM gpus'))}
            open_loans = conn.execute(sa.text(
                "SELECT server_id, count(*) AS n FROM loans WHERE state <> 'RETURNED' GROUP BY server_id")).all()
    finally:
        engine.dispose()

    found: list[str] = []
    ids = {str(j.id) for j in jobs}
    lost = sorted({str(i) for i in acknowledged_job_ids} - ids, key=lambda i: (len(i), i))
    if lost:
        found.append(f"{len(lost)} acknowledged job(s) lost: {', '.join(lost[:20])}")

    names = Counter(j.name for j in jobs)
    wanted = set(names) if submitted_names is None else set(submitted_names)
    duplicated = sorted(n for n in wanted if names[n] > 1)
    if duplicated:
        found.append(f"{len(duplicated)} submission(s) stored more than once: "
                     + ", ".join(f"{n} x{names[n]}" for n in duplicated[:20]))
    keys = Counter((j.user, j.idempotency_key) for j in jobs if j.idempotency_key)
    found += [f"idempotency key {key!r} of {user} on {n} jobs" for (user, key), n in keys.items() if n > 1]

    per_gpu = Counter((a.server_id, a.gpu_index) for a in allocations)
    found += [f"GPU {s}/{g} held {n} times" for (s, g), n in sorted(per_gpu.items()) if n > 1]
    found += [f"GPU {s}/{g} allocated but not registered" for (s, g) in sorted(set(per_gpu) - gpus)]
    found += [f"server {r.server_id} has {r.n} open loans" for r in open_loans if r.n > 1]

    by_job: dict[int, list[sa.Row]] = defaultdict(list)
    for a in allocations:
        by_job[a.job_id].append(a)
    for job in jobs:
        held = by_job.pop(job.id, [])
        if job.state not in _HOLDING_STATES:
            if held:
                found.append(f"job {job.id} is {job.state} but holds {len(held)} GPU(s)")
            continue
        ranks: dict[int, list[sa.Row]] = defaultdict(list)
        for a in held:
            ranks[a.rank].append(a)
        if sorted(ranks) != list(range(job.num_workers)):
            found.append(f"job {job.id} ({job.state}, {job.num_workers} workers) holds ranks {sorted(ranks)}")
        for rank, rows in sorted(ranks.items()):
            if len(rows) != job.gpus_per_worker or len({a.server_id for a in rows}) != 1:
                found.append(f"job {job.id} rank {rank} holds {[(a.server_id, a.gpu_index) for a in rows]}, "
                             f"not {job.gpus_per_worker} GPU(s) on one server")
    found += [f"allocations of unknown job {job_id}" for job_id in sorted(by_job)]
    return found


def check_invariants(db_url: str, acknowledged_job_ids: Iterable[str | int] = (), *,
                     submitted_names: Iterable[str] | None = None) -> None:
    """Assert the database invariants (module doc); the message lists every violation."""
    broken = violations(db_url, acknowledged_job_ids, submitted_names=submitted_names)
    assert not broken, "invariants broken:\n  " + "\n  ".join(broken)


def database_workers(db_url: str, servers: Collection[str] | None = None) -> set[Worker]:
    """The workers the database wants run (its allocations), on ``servers`` (None: every server)."""
    engine = _engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT a.server_id, a.job_id, a.rank, a.gpu_index, j.incarnation "
                "FROM allocations a JOIN jobs j ON j.id = a.job_id")).all()
    finally:
        engine.dispose()
    gpus: dict[tuple[str, str, int, int], list[int]] = defaultdict(list)
    for r in rows:
        if servers is None or r.server_id in servers:
            gpus[(r.server_id, str(r.job_id), r.rank, r.incarnation)].append(r.gpu_index)
    return {Worker(s, j, rank, inc, tuple(sorted(g))) for (s, j, rank, inc), g in gpus.items()}


def _environ(pid: str) -> dict[str, str]:
    raw = Path("/proc", pid, "environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def live_workers(marker: str, servers: Collection[str] | None = None) -> set[Worker]:
    """The worker processes running for agents started with ``MARKER_ENV=marker`` (their shims and
    zombies left out), on ``servers`` (None: all)."""
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = _environ(pid)
            if env.get(MARKER_ENV) != marker or "ARYL_JOB_ID" not in env:
                continue
            if b"shim.py" in Path("/proc", pid, "cmdline").read_bytes():
                continue
            if Path("/proc", pid, "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
        server = env.get(SERVER_ENV, "")
        if servers is not None and server not in servers:
            continue
        devices = env.get("CUDA_VISIBLE_DEVICES", "")
        found.add(Worker(server, env["ARYL_JOB_ID"], int(env.get("RANK", "0")), int(env.get("ARYL_INCARNATION", "0")),
                         tuple(sorted(int(i) for i in devices.split(",") if i))))
    return found


def _converged(db_url: str, servers: Collection[str] | None) -> bool:
    """Every (listed) server that is not LOST has caught up with its desired state."""
    engine = _engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT id, state, desired_generation, COALESCE(h.observed_generation, 0) AS observed_generation "
                "FROM servers LEFT JOIN server_heartbeats h ON h.server_id = servers.id")).all()
    finally:
        engine.dispose()
    return all(r.desired_generation == r.observed_generation for r in rows
               if r.state != "LOST" and (servers is None or r.id in servers))


def wait_workers_match(db_url: str, marker: str, *, servers: Collection[str] | None = None,
                       timeout: float = 30.0, interval: float = 0.1) -> set[Worker]:
    """Wait until the agents (marked ``marker``) run exactly the workers the database wants on
    ``servers`` (None: every server) and each such server reports its desired generation applied;
    returns the workers. ``timeout`` bounds the wait (a few report intervals after recovery, on an idle
    machine: ``scaled_timeout``; its length is never asserted). Fails with both sides and their differences.
    A match returns at once: a caller that killed a worker waits until it is gone from ``live_workers``
    before it asks, or this may still see the dying process."""
    timeout = scaled_timeout(timeout)
    deadline = time.monotonic() + timeout
    while True:
        wanted = database_workers(db_url, servers)
        running = live_workers(marker, servers)
        if wanted == running and _converged(db_url, servers) and database_workers(db_url, servers) == wanted:
            return wanted
        if time.monotonic() > deadline:
            jobs = {w.job_id for w in wanted ^ running}
            raise AssertionError(
                f"workers do not match the database after {timeout:g}s:\n"
                f"  wanted, not running: {sorted(wanted - running)}\n"
                f"  running, not wanted: {sorted(running - wanted)}\n" + _diagnosis(db_url, jobs))
        time.sleep(interval)


def _diagnosis(db_url: str, job_ids: Collection[str]) -> str:
    """The servers' states and generations, and the last events of ``job_ids``: what a failure needs."""
    engine = _engine(db_url)
    try:
        with engine.connect() as conn:
            servers = conn.execute(sa.text(
                "SELECT id, state, desired_generation, COALESCE(h.observed_generation, 0) AS observed_generation, "
                "COALESCE(h.last_seen_at, registered_at) AS last_seen_at "
                "FROM servers LEFT JOIN server_heartbeats h ON h.server_id = servers.id ORDER BY id")).all()
            lines = [f"  server {r.id}: {r.state}, generation desired {r.desired_generation} observed "
                     f"{r.observed_generation}, last seen {r.last_seen_at:.1f}" for r in servers]
            for job_id in sorted(job_ids, key=int)[:5]:
                job = conn.execute(sa.text("SELECT state, num_workers, incarnation, restarts FROM jobs WHERE id = :id"),
                                   {"id": int(job_id)}).first()
                lines.append(f"  job {job_id}: {job and tuple(job)}")
                events = conn.execute(sa.text(
                    "SELECT time, kind, from_state, to_state, reason, message FROM events WHERE job_id = :id "
                    "ORDER BY id DESC LIMIT 8"), {"id": int(job_id)}).all()
                lines += [f"    {e.time:.1f} {e.kind} {e.from_state}->{e.to_state} {e.reason}: {e.message[:160]}"
                          for e in reversed(events)]
    finally:
        engine.dispose()
    return "\n".join(lines)
