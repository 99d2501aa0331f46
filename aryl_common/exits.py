"""One wording for how a worker's process ended, used by the agent (worker status messages and
logs) and by the scheduler (a job's failure reason and its WORKER_EXITED events).

An *exit status* follows the Popen convention: ``>= 0`` is the process's exit code, ``< 0`` the
number of the signal that killed it. Pure: no I/O.
"""

from __future__ import annotations

import signal


def describe_exit(exit_status: int) -> str:
    """``exited with status 3`` / ``killed by SIGKILL`` (``killed by signal 99`` for a number with no name)."""
    if exit_status >= 0:
        return f"exited with status {exit_status}"
    try:
        return f"killed by {signal.Signals(-exit_status).name}"
    except ValueError:
        return f"killed by signal {-exit_status}"
