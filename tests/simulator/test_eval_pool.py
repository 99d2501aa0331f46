"""The evaluation's process pool (``evaluation.report.process_pool``): a worker exits when the evaluation
does, however it ends. A killed evaluation (SIGKILL: no cleanup of its own) left its workers running a
simulation each, reparented to init, holding the machine's cores for the next run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]

# An evaluation in miniature: a pool of two, each worker busy with a task that would run for ten minutes;
# prints the workers' pids once both run.
EVALUATION = textwrap.dedent("""
    import os, sys, time
    from evaluation.report import process_pool

    def busy(_):
        print(os.getpid(), flush=True)
        time.sleep(600)

    if __name__ == "__main__":
        pool = process_pool(2)
        for i in range(2):
            pool.submit(busy, i)
        time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in "ZX"  # a zombie has exited (init reaps it when it gets to it)


def test_the_pools_workers_exit_when_the_evaluation_is_killed(tmp_path) -> None:
    script = tmp_path / "evaluation_in_miniature.py"
    script.write_text(EVALUATION)
    parent = subprocess.Popen([sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    workers: list[int] = []
    try:
        assert parent.stdout is not None
        while len(workers) < 2:
            line = parent.stdout.readline()
            assert line, "the evaluation ended before its workers ran"
            workers.append(int(line))
        assert all(_alive(pid) for pid in workers)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        wait_for(lambda: not any(_alive(pid) for pid in workers), timeout=60, what="the workers gone with it")
    finally:
        parent.kill()
        parent.wait()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
