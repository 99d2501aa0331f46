"""Waiting and process helpers for tests that run real servers and processes.

Standard library only (and ``aryl_common.ports``' free ports): what a test *builds* (domain values, fake
registrations, job specs, fakes) is in ``tests/harness.py``; this module is about the machine the test
runs on: polling until a condition holds, finding a free port, finding the processes a test left behind.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from aryl_common.ports import free_loopback_port as free_port  # noqa: F401 (tests import it from here)

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05,
             what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes whose environment or command line mentions ``marker``."""
    needle = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            proc = Path("/proc", entry)
            if needle in (proc / "environ").read_bytes() or needle in (proc / "cmdline").read_bytes():
                status = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if status != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found
