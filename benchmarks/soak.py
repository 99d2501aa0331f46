"""``python -m benchmarks.soak`` (``make soak``; ``make soak-ci`` is its short form): the scheduler
under steady load for a long time, sampled once a minute, to show what grows.

Real parts: the scheduler as a child process (``benchmarks.bench_service.SchedulerProcess``) on a
fresh PostgreSQL database of its own (created, migrated and dropped here), a fleet of simulated
agents of both pools in shard processes (``benchmarks.fake_fleet``, whose workers exit after their
job's run time), and, in this process, a load driver on its own thread.

It runs as a production deployment does (the README's and compose's path): mutual TLS and bearer
tokens from a development CA (``arylctl certs init``, in a temporary folder removed at the end), each
agent with the certificate and token of its own server id, each submitting user with its own token
(ten users, each cancelling only its own jobs), the demand reported by a router with its own; and the
leader lease, which a scheduler on PostgreSQL always holds (``ha.lease_s``/``renew_s`` at their
defaults). ``--insecure`` runs plaintext without identities instead, an explicit opt-in.

The load (``benchmarks.soak_load``): submits and cancels as Poisson streams, from ten users, and the
inference demand as a sine, reported like a router's, so idle inference servers are lent to training
while it is low and reclaimed while it rises.

A **sample** (at the start, then each minute): the scheduler's RSS and open file descriptors
(``/proc/PID``), the database's size (``pg_database_size``), row counts of ``events`` and ``jobs``,
loans and reclaims so far (``loans`` rows), and the p50/p99 of SubmitJob and of the agents'
ReportStatus round-trips answered during the minute before it, and the machine's load average.

The **checks** and the summary (``benchmarks.soak_summary``; exit 1 when one fails): the scheduler's RSS
and descriptors after the warm-up, acknowledged submissions and cancellations against the database,
errors, the scheduler's exit, the leader lease, and the drift of the per-minute p99s.

Never: import from ``tests/``, or touch a database it did not create.
"""

from __future__ import annotations

import argparse
import csv
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from arylctl import certs
from benchmarks.fake_fleet import FakeServer, Fleet, FleetOptions, raise_fd_limit, sigterm_unwinds
from benchmarks.harness import SchedulerProcess, scratch_database
from benchmarks.soak_load import (
    CANCEL_SHARE,
    INFERENCE_SHARE,
    ROUTER,
    SETTINGS,
    SUBMITS_PER_S_PER_1000_AGENTS,
    USERS,
    Driver,
    Regime,
)
from benchmarks.soak_summary import (
    EXPECTED_ERRORS,
    Outcome,
    Sample,
    Summary,
    percent_text,
    percentile_ms,
    render,
    summarize,
    warmup_seconds,
)

log = logging.getLogger("aryl.soak")

DEFAULT_ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
REGISTER_TIMEOUT_S = 600.0  # a thousand agents' TLS handshakes and registrations on a busy machine


def soak_server_name(pool: str, index: int) -> str:
    return f"soak-{pool[:5]}-{index:05d}"


def fleet_options(pki: Path | None) -> FleetOptions:
    """The soak's agents: each with its own certificate and token from ``pki`` (plaintext when None),
    workers that exit after their job's run time, streams reopened after a failure, no push records."""
    return FleetOptions(pki=pki, agent_version="soak", workers_exit=True, record_pushes=False, rewatch=True,
                        process_name="aryl-soak-agents")


# ---------------------------------------------------------------------------------------------
# Sampling, output and the run


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


_DB_SQL = sa.text("""
    SELECT pg_database_size(current_database()),
           (SELECT count(*) FROM events),
           (SELECT count(*) FROM jobs),
           (SELECT count(*) FROM jobs WHERE state IN ('PENDING', 'RUNNING', 'SCALING', 'PREEMPTED')),
           (SELECT count(*) FROM jobs WHERE state = 'COMPLETED'),
           (SELECT count(*) FROM loans),
           (SELECT count(*) FROM loans WHERE state <> 'ACTIVE')
""")


class Recorder:
    """Writes ``soak.csv`` as samples come (a killed run keeps what it had) and the plot."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.samples: list[Sample] = []
        self._csv = (out / "soak.csv").open("w", newline="")
        self._writer = csv.DictWriter(self._csv, fieldnames=[f.name for f in fields(Sample)])
        self._writer.writeheader()

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        self._writer.writerow({k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(sample).items()})
        self._csv.flush()

    def close(self) -> None:
        self._csv.close()

    def plot(self, title: str) -> None:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        t = [s.t_s / 60 for s in self.samples]
        fig, axes = plt.subplots(3, 2, figsize=(12, 10), sharex=True)
        panels: list[tuple[Any, str, list[tuple[str, list[float]]]]] = [
            (axes[0][0], "scheduler RSS (MiB)", [("rss", [s.rss_mib for s in self.samples])]),
            (axes[0][1], "scheduler open fds", [("fds", [float(s.fds) for s in self.samples])]),
            (axes[1][0], "database size (MiB)", [("db", [s.db_mib for s in self.samples])]),
            (axes[1][1], "rows", [("events", [float(s.events_rows) for s in self.samples]),
                                  ("jobs", [float(s.jobs_rows) for s in self.samples]),
                                  ("active jobs", [float(s.jobs_active) for s in self.samples])]),
            (axes[2][0], "SubmitJob latency (ms)", [("p50", [s.submit_p50_ms for s in self.samples]),
                                                   ("p99", [s.submit_p99_ms for s in self.samples])]),
            (axes[2][1], "ReportStatus latency (ms)", [("p50", [s.report_p50_ms for s in self.samples]),
                                                      ("p99", [s.report_p99_ms for s in self.samples])]),
        ]
        for ax, label, series in panels:
            for name, ys in series:
                ax.plot(t, ys, marker=".", label=name)
            ax.set_title(label)
            ax.grid(True, alpha=0.3)
            if len(series) > 1:
                ax.legend()
        for ax in axes[2]:
            ax.set_xlabel("minutes")
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(self.out / "soak.png", dpi=90)
        plt.close(fig)


def _sample(t_s: float, pid: int, engine: sa.Engine, driver: Driver, fleet: Fleet, *, window: bool = True
            ) -> Sample:
    """One sample; ``window``: latencies over the calls answered since the last one (the first
    sample has no window before it: its latencies are NaN)."""
    with engine.connect() as conn:
        db_bytes, events, jobs, active, completed, loans, reclaims = conn.execute(_DB_SQL).one()
    submit = driver.drain_latency()
    drained = fleet.drain()
    report_s, report_errors = [lat for _, lat in drained.reports], drained.errors
    if not window:
        submit, report_s = [], []
    errors = Counter(driver.errors) + Counter(report_errors)
    return Sample(
        t_s=t_s, rss_mib=_rss_mib(pid), fds=_fds(pid), db_mib=db_bytes / 2**20, events_rows=events, jobs_rows=jobs,
        jobs_active=active, submits=len(driver.acked), cancels=len(driver.cancelled), completed=completed, loans=loans,
        reclaims=reclaims, errors=sum(v for k, v in errors.items() if k not in EXPECTED_ERRORS),
        submit_calls=len(submit), submit_p50_ms=percentile_ms(submit, 50), submit_p99_ms=percentile_ms(submit, 99),
        reports=len(report_s), report_p50_ms=percentile_ms(report_s, 50), report_p99_ms=percentile_ms(report_s, 99),
        load1=os.getloadavg()[0],
    )


def _code_version() -> str:
    """The commit the scheduler ran from, and whether the working tree differed from it."""
    repo = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{head}" + (f" with {len(dirty)} modified tracked file(s)" if dirty else "")


def _exit_code(scheduler: SchedulerProcess) -> int | None:
    """The scheduler's exit status once it has exited, else None."""
    proc = scheduler._proc  # SchedulerProcess keeps its Popen private; only read here
    return None if proc is None else proc.poll()


_LEASE_SQL = sa.text("SELECT epoch FROM leader_lease WHERE id = 1")


def _lease_epoch(engine: sa.Engine) -> int | None:
    """The leader lease's current term; None when no scheduler has taken it."""
    with engine.connect() as conn:
        epoch = conn.execute(_LEASE_SQL).scalar_one_or_none()
    return None if epoch is None else int(epoch)


def _database_settings(engine: sa.Engine) -> str:
    """The PostgreSQL server's settings that move a long run's figures: without autovacuum, dead rows
    of the tables updated on every cycle (allocations, jobs, gpus) pile up for the whole run."""
    with engine.connect() as conn:
        got = {name: conn.execute(sa.text(f"SHOW {name}")).scalar_one() for name in ("autovacuum", "jit")}
        version = conn.execute(sa.text("SHOW server_version")).scalar_one()
    return f"PostgreSQL {version}, " + ", ".join(f"{k}={v}" for k, v in got.items())


def _autovacuum_off(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        return str(conn.execute(sa.text("SHOW autovacuum")).scalar_one()).lower() == "off"


def _vacuum(engine: sa.Engine) -> None:
    """VACUUM (ANALYZE) the scratch database: what autovacuum does on a server that runs it (``--vacuum``)."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE)"))


def make_pki(directory: Path, server_ids: Sequence[str]) -> None:
    """A development CA (``arylctl certs init``) with a certificate and token for every agent, the
    router and each user."""
    certs.init(directory, certs.DevCluster(agents=tuple(server_ids), routers=(ROUTER,), users=USERS))


def security_settings(pki: Path | None) -> dict[str, str]:
    """The scheduler's security settings: mutual TLS and the token file from ``pki``; plaintext
    without identities when None."""
    if pki is None:
        return {"ARYL_SECURITY__INSECURE": "true"}
    return {"ARYL_SECURITY__INSECURE": "false", "ARYL_SECURITY__TLS_CERT": str(pki / "scheduler.crt"),
            "ARYL_SECURITY__TLS_KEY": str(pki / "scheduler.key"),
            "ARYL_SECURITY__TLS_CLIENT_CA": str(pki / "ca.crt"),
            "ARYL_SECURITY__TOKENS_FILE": str(pki / certs.TOKENS_FILE)}


def _verify(engine: sa.Engine, driver: Driver, errors: Mapping[str, int], messages: Mapping[str, str],
            scheduler_exit: int | None, lease_epochs: tuple[int | None, int | None]) -> Outcome:
    acked = {int(j) for j in driver.acked}
    cancelled = {int(j) for j in driver.cancelled}
    with engine.connect() as conn:
        states = {int(job_id): str(state) for job_id, state in conn.execute(sa.text("SELECT id, state FROM jobs"))}
    lost = sorted(acked - states.keys())
    not_cancelled = sorted(j for j in cancelled if states.get(j) not in (None, "CANCELLED"))
    if lost:
        log.error("acknowledged jobs missing from the database: %s", lost[:20])
    if not_cancelled:
        log.error("acknowledged cancellations not CANCELLED: %s", [(j, states[j]) for j in not_cancelled[:20]])
    return Outcome(acknowledged=len(acked), lost=len(lost), cancels_not_applied=len(not_cancelled),
                   errors=dict(errors), scheduler_exit=scheduler_exit, messages=dict(messages),
                   lease_epochs=lease_epochs)


def _sample_until(duration_s: float, sample_s: float, scheduler: SchedulerProcess, engine: sa.Engine,
                  driver: Driver, fleet: Fleet, recorder: Recorder, *, vacuum: bool = False) -> int | None:
    """Sample at the start and every ``sample_s`` until ``duration_s``; the scheduler's exit status
    if it exited meanwhile (sampling stops there), else None. ``vacuum``: after each sample, VACUUM the
    scratch database (``_vacuum``)."""
    t0 = time.monotonic()
    recorder.add(_sample(0.0, scheduler.pid, engine, driver, fleet, window=False))
    n = 1
    while True:
        due = t0 + min(n * sample_s, duration_s)
        while time.monotonic() < due:
            time.sleep(min(1.0, due - time.monotonic()))
            if _exit_code(scheduler) is not None or driver.crashed is not None or not fleet.alive():
                break
        if (code := _exit_code(scheduler)) is not None:
            log.error("the scheduler exited with code %s", code)
            return code
        if driver.crashed is not None:
            raise RuntimeError(f"the load driver failed: {driver.crashed!r}")
        if not fleet.alive():
            raise RuntimeError("an agent shard died")
        recorder.add(s := _sample(time.monotonic() - t0, scheduler.pid, engine, driver, fleet))
        if vacuum:
            _vacuum(engine)
        log.info("%.1f min: RSS %.1f MiB, fds %d, db %.1f MiB, submit p99 %.1f ms, report p99 %.1f ms, submits %d, "
                 "cancels %d, completed %d, active %d, loans %d, reclaims %d, errors %d, load %.1f",
                 s.t_s / 60, s.rss_mib, s.fds, s.db_mib, s.submit_p99_ms, s.report_p99_ms, s.submits, s.cancels,
                 s.completed, s.jobs_active, s.loans, s.reclaims, s.errors, s.load1)
        if n % 10 == 0:
            recorder.plot("Aryl soak (in progress)")
        if s.t_s >= duration_s - 1:
            return None
        n += 1


def run(args: argparse.Namespace) -> Summary:
    agents = args.agents
    inference = max(2, round(agents * INFERENCE_SHARE))
    submits = args.submits_per_s or SUBMITS_PER_S_PER_1000_AGENTS * agents / 1000
    regime = Regime(agents=agents, inference_agents=inference, submits_per_s=submits,
                    cancels_per_s=submits * CANCEL_SHARE, demand_period_s=args.demand_period_s)
    described = regime.describe()
    described["security"] = (
        "INSECURE (--insecure): plaintext, no identities" if args.insecure else
        f"mutual TLS + bearer tokens (arylctl certs init: a certificate and token per agent, {len(USERS)} users "
        f"with a token each, router {ROUTER!r})")
    described["leader lease"] = "on (always on PostgreSQL), ha.lease_s and ha.renew_s at their defaults"
    described["duration"] = f"{args.minutes:g} min, sampled every {args.sample_s:g} s"
    described["code"] = _code_version()
    warmup_s = warmup_seconds(args.minutes)
    duration_s = args.minutes * 60.0
    recorder = Recorder(Path(args.out))
    servers = ([FakeServer(soak_server_name("training", i), "training") for i in range(regime.training_agents)]
               + [FakeServer(soak_server_name("inference", i), "inference") for i in range(inference)])
    raise_fd_limit()
    try:
        with sigterm_unwinds(), tempfile.TemporaryDirectory(prefix="aryl-soak-pki-") as tmp, \
                scratch_database(args.database_url) as url:
            pki = None if args.insecure else Path(tmp)
            if pki is not None:
                make_pki(pki, [server.server_id for server in servers])
            engine = sa.create_engine(url, pool_size=1, max_overflow=1)
            try:
                described["database"] = _database_settings(engine)
                vacuum = args.vacuum == "auto" and _autovacuum_off(engine)
                described["vacuum"] = ("by the soak after each sample (the server's autovacuum is off; "
                                       "a production server runs it: docs/operations.md)" if vacuum else "autovacuum's")
                with SchedulerProcess(url, {**SETTINGS, **security_settings(pki)}) as scheduler, \
                        Fleet(scheduler.address, fleet_options(pki)) as fleet:
                    started = time.monotonic()
                    fleet.add(servers, timeout_s=REGISTER_TIMEOUT_S)
                    log.info("%d agents registered and watching in %.0fs", fleet.agents, time.monotonic() - started)
                    lease_began = _lease_epoch(engine)
                    driver = Driver(scheduler.address, regime, args.seed, pki)
                    driver.start()
                    try:
                        scheduler_exit = _sample_until(duration_s, args.sample_s, scheduler, engine, driver, fleet,
                                                       recorder, vacuum=vacuum)
                    finally:
                        driver.stop()  # every call sent has been answered
                    drained = fleet.drain()
                    errors = Counter(driver.errors) + Counter(drained.errors)
                    outcome = _verify(engine, driver, errors, {**drained.messages, **driver.messages}, scheduler_exit,
                                      (lease_began, _lease_epoch(engine)))
            finally:
                engine.dispose()
    finally:
        recorder.close()
    summary = summarize(recorder.samples, outcome, warmup_s=warmup_s)
    text = render(summary, described)
    recorder.plot(f"Aryl soak: {regime.agents} agents, {args.minutes:g} min "
                  f"(RSS {percent_text(summary.rss_growth)} after warm-up)")
    (recorder.out / "summary.txt").write_text(text)
    print(text, end="")
    return summary


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the load (default %(default)s)")
    parser.add_argument("--agents", type=int, default=1000,
                        help="simulated agents, a fifth of them inference servers (default %(default)s)")
    parser.add_argument("--out", default="soak-results", help="folder for soak.csv, soak.png, summary.txt")
    parser.add_argument("--submits-per-s", type=float, default=0.0,
                        help=f"submission rate (default {SUBMITS_PER_S_PER_1000_AGENTS:g}/s per 1,000 agents); "
                             f"cancels come at {CANCEL_SHARE:g} times it")
    parser.add_argument("--demand-period-s", type=float, default=300.0,
                        help="period of the inference demand's sine (default %(default)s)")
    parser.add_argument("--sample-s", type=float, default=60.0, help="seconds between samples (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--insecure", action="store_true",
                        help="plaintext gRPC without certificates or tokens (default: mutual TLS + tokens, as "
                             "a production deployment runs)")
    parser.add_argument("--vacuum", choices=("auto", "never"), default="auto",
                        help="auto (the default): where the PostgreSQL server has autovacuum off, VACUUM the "
                             "soak's database after each sample, as autovacuum would on a production server; "
                             "never: leave its dead rows (what a server without autovacuum does to the scheduler)")
    parser.add_argument(
        "--database-url", default=os.environ.get("ARYL_BENCH_DATABASE_URL", DEFAULT_ADMIN_URL),
        help="PostgreSQL URL allowed to create databases; the soak creates, migrates and drops its own "
             "aryl_bench_<random> next to it (default: $ARYL_BENCH_DATABASE_URL, else %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.agents < 10 or args.minutes <= 0 or args.sample_s <= 0:
        parser.error("--agents must be at least 10, --minutes and --sample-s positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    log.info("soak: %g min, %d agents; load average %.2f on %d CPUs", args.minutes, args.agents,
             os.getloadavg()[0], os.cpu_count() or 0)
    try:
        summary = run(args)
    except Exception:
        log.exception("the soak could not run")
        return 1
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
