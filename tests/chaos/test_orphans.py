"""No orphans (issue 37, item 6): the real ``aryl-scheduler`` killed with SIGKILL while its ETA forecast runs
in a process of its own (``app.forecast.ForecastProcess``: 1,000 active jobs or more) leaves no process
behind, neither the forecast's process nor its multiprocessing resource tracker.

The scheduler runs on the test's own PostgreSQL database with a forecast after every cycle
(``scheduling.forecast_interval_s = 0``); the 1,000 jobs are one SubmitJobs call, as a user's array would be.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arylctl.client import ArylClient
from tests.chaos.conftest import SchedulerProcess, chaos_job
from tests.helpers import wait_for

pytestmark = pytest.mark.postgres

JOBS = 1000  # app.forecast.FORECAST_PROCESS_MIN_JOBS: a forecast of this many runs in its own process


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2:].split()[:2]
    return state, int(ppid)


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None and stat[1] == pid:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    """Running (a zombie has ended; whether init reaps it is not the scheduler's doing)."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_scheduler_killed_with_sigkill_leaves_no_forecast_process_behind(tmp_path: Path, chaos_db: str) -> None:
    scheduler = SchedulerProcess(chaos_db, tmp_path / "scheduler.log", tmp_path / "kill-at",
                                 ARYL_SCHEDULING__FORECAST_INTERVAL_S="0")
    children: list[int] = []
    try:
        scheduler.start()
        assert scheduler.proc is not None
        with ArylClient(scheduler.address, timeout=60) as client:
            client.submit_jobs([(chaos_job(f"orphan-{i}"), f"key-{i}") for i in range(JOBS)])

        def forecast_process_started() -> list[int]:
            assert scheduler.proc is not None and scheduler.proc.poll() is None, f"scheduler died; {scheduler.logs}"
            pids = children_of(scheduler.proc.pid)
            return pids if any("multiprocessing" in cmdline(p) and "resource_tracker" not in cmdline(p)
                               for p in pids) else []

        children = wait_for(forecast_process_started, timeout=120, interval=0.2,
                            what="the forecast process to start (a forecast of 1,000 jobs)")
        print("children:", {p: cmdline(p) for p in children})

        scheduler.kill9()

        wait_for(lambda: not any(alive(p) for p in children), timeout=30, interval=0.1,
                 what=f"the scheduler's children {children} to end with it")
    finally:
        scheduler.stop()
        for pid in children:  # on failure: leave nothing behind for the next test
            if alive(pid):
                os.kill(pid, 9)
