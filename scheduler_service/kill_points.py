"""A test-only fault hook: named points where the scheduler process can be made to die by SIGKILL,
for the fault-injection suite (``tests/chaos``, docs/chaos.md), where random timing cannot hit a
point reliably.

``ARYL_FAULT_KILL_AT=<point>[:<n>]`` in the scheduler's environment: the process SIGKILLs itself the
``n``-th time (default: the first) it reaches ``<point>``. ``ARYL_FAULT_KILL_AT=@<file>``: the same,
read from the file's first line at every point reached, so a test can arm a running scheduler (an
empty or missing file: disarmed); hits are counted from when the process first sees the file's
current content (its whole content: a test writes a new second line to arm the same point again).
``<point>[:<n>]:stop``: the process SIGSTOPs itself there instead (every thread stops, as a paused
VM's would), once per armed content; a test resumes it with SIGCONT and it goes on from the point.

Points:

- ``submit.committed``: submitted jobs are committed (a group commit of SubmitJob calls, or a SubmitJobs
  call), their callers not answered yet;
- ``apply.written``: a scheduling plan is written in its transaction, not committed yet;
- ``commit.before_push``: a transaction that changed desired states is committed, the agents not
  told yet;
- ``fence.checked_locally``: a write transaction's fence (``app.lease``) found this process still
  leading by its own account, the database not asked yet (with ``stop``: a leader paused before the
  database's check, so that on resuming its write meets that check, not the local one);
- ``fence.passed``: a write transaction passed the leader lease's fence (``app.lease``), its COMMIT
  not sent yet (with ``stop``: a leader paused between its fence and its commit).

Unset (always, outside tests), ``kill_point`` is one string comparison. This is the one place the
service reads the environment besides its configuration; it is not configuration and is never
documented as such.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

_SETTING = os.environ.get("ARYL_FAULT_KILL_AT", "")
_FILE = Path(_SETTING[1:]) if _SETTING.startswith("@") else None
_lock = threading.Lock()
_armed = "" if _FILE else _SETTING  # the setting in force; with a file, its content when last read
_hits = 0
_stopped = False  # a stop fired for the content armed now (it fires once)


def kill_point(name: str) -> None:
    """Die here by SIGKILL (or stop by SIGSTOP) if ``ARYL_FAULT_KILL_AT`` names this point and its count
    is reached."""
    if not _SETTING:
        return
    global _armed, _hits, _stopped  # noqa: PLW0603 - one counter per process, by design
    with _lock:
        if _FILE is not None:
            try:
                content = _FILE.read_text()
            except OSError:
                content = ""
            if content != _armed:
                _armed, _hits, _stopped = content, 0, False
        point, *options = (_armed.splitlines() or [""])[0].strip().split(":")
        if name != point:
            return
        _hits += 1
        if _hits < int(next((o for o in options if o.isdigit()), "1")):
            return
        if "stop" not in options:
            os.kill(os.getpid(), signal.SIGKILL)
        if _stopped:
            return
        _stopped = True
    # To this thread: it stops on the way back from the call (a SIGSTOP to the process may be taken by
    # another thread, and this one could send its COMMIT before the stop reached it); every other thread
    # of the process stops with it. Outside the lock: resumed, other threads may pass their points.
    signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
