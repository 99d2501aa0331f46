"""Submissions exactly once, as users make them (issue 37, item 4): the real ``aryl-scheduler`` SIGKILLs
itself at ``submit.committed`` (the job committed, its caller not answered: ``scheduler_service.kill_points``)
and is started again, as a supervisor would; ``arylctl submit`` and the Python client, given no key,
retry across the restart with the key they made up, and the job is queued once.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from arylctl.client import ArylClient, SubmitRetry
from tests.chaos.conftest import REPO, SchedulerProcess, chaos_job
from tests.helpers import wait_for

pytestmark = pytest.mark.postgres

ARYLCTL = Path(sys.executable).parent / "arylctl"
RETRY_S = 120  # the clients' retry budget here: a restart on a loaded machine may take longer than the 30 s default


@pytest.fixture
def scheduler(tmp_path: Path, chaos_db: str):
    process = SchedulerProcess(chaos_db, tmp_path / "scheduler.log", tmp_path / "kill-at")
    process.start()
    yield process
    process.stop()


def jobs_named(scheduler: SchedulerProcess, name: str) -> list[str]:
    with ArylClient(scheduler.address, timeout=30) as client:
        return [job.job_id for job in client.iter_jobs() if job.spec.name == name]


def restart_once_killed(scheduler: SchedulerProcess) -> None:
    """Wait for the scheduler to die at its kill point, then start it again, disarmed."""
    assert scheduler.proc is not None
    wait_for(lambda: scheduler.proc is not None and scheduler.proc.poll() is not None, timeout=120,
             interval=0.05, what="the scheduler to die at submit.committed")
    assert scheduler.died_by_sigkill()
    scheduler.disarm()
    scheduler.start()


def test_arylctl_submit_without_a_key_queues_the_job_once_across_a_kill_after_commit(
    scheduler: SchedulerProcess,
) -> None:
    scheduler.arm("submit.committed")
    submit = subprocess.Popen(
        [str(ARYLCTL), "--server", scheduler.address, "--timeout", "30", "submit", "--retry-for", str(RETRY_S),
         "--name", "once-ctl", "--user", "chaos", "--", "sleep", "1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        restart_once_killed(scheduler)
        out, err = submit.communicate(timeout=RETRY_S + 60)
    finally:
        if submit.poll() is None:
            submit.kill()
    assert submit.returncode == 0, err
    assert "retrying with idempotency key" in err, err  # the progress line
    assert len(jobs_named(scheduler, "once-ctl")) == 1, out


def test_the_python_client_without_a_key_queues_the_job_once_across_a_kill_after_commit(
    scheduler: SchedulerProcess,
) -> None:
    scheduler.arm("submit.committed")
    retries: list[SubmitRetry] = []
    answered: list[str] = []

    def submit() -> None:
        with ArylClient(scheduler.address, timeout=30) as client:
            job = client.submit_job(chaos_job("once-py"), retry_s=RETRY_S, on_retry=retries.append)
            answered.append(job.job_id)

    submitter = threading.Thread(target=submit, daemon=True)
    submitter.start()
    restart_once_killed(scheduler)
    submitter.join(timeout=RETRY_S + 60)

    assert answered, "the submission was not answered"
    assert retries and len({r.idempotency_key for r in retries}) == 1  # retried, always with the same key
    assert jobs_named(scheduler, "once-py") == answered
