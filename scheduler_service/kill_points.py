"""A test-only fault hook: named points where the scheduler process can be made to die by SIGKILL,
for the fault-injection suite (``tests/chaos``, docs/chaos.md), where random timing cannot hit a
point reliably.

``ARYL_FAULT_KILL_AT=<point>[:<n>]`` in the scheduler's environment: the process SIGKILLs itself the
``n``-th time (default: the first) it reaches ``<point>``. Points:

- ``submit.committed``: a batch of SubmitJobs is committed, its callers not answered yet;
- ``apply.written``: a scheduling plan is written in its transaction, not committed yet;
- ``commit.before_push``: a transaction that changed desired states is committed, the agents not
  told yet.

Unset (always, outside tests), ``kill_point`` is one string comparison. This is the one place the
service reads the environment besides its configuration; it is not configuration and is never
documented as such.
"""

from __future__ import annotations

import os
import signal
import threading

_point, _, _nth = os.environ.get("ARYL_FAULT_KILL_AT", "").partition(":")
_kill_at = int(_nth or "1") if _point else 0
_hits = 0
_lock = threading.Lock()


def kill_point(name: str) -> None:
    """Die here by SIGKILL if ``ARYL_FAULT_KILL_AT`` names this point and its count is reached."""
    if name != _point:
        return
    global _hits  # noqa: PLW0603 - one counter per process, by design
    with _lock:
        _hits += 1
        if _hits >= _kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
