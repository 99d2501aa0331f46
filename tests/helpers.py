"""Waiting and process helpers for tests that run real servers and processes.

Standard library only (and ``aryl_common.ports``' free ports): what a test *builds* (domain values, fake
registrations, job specs, fakes) is in ``tests/harness.py``; this module is about the machine the test
runs on: polling until a condition holds (within a wait that ARYL_TEST_TIMEOUT_FACTOR stretches on a loaded
machine), finding a free port, finding the processes a test left behind.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TypeVar

from aryl_common.ports import free_loopback_port as free_port  # noqa: F401 (tests import it from here)

T = TypeVar("T")

TIMEOUT_FACTOR_ENV = "ARYL_TEST_TIMEOUT_FACTOR"


def _timeout_factor() -> float:
    text = os.environ.get(TIMEOUT_FACTOR_ENV, "").strip() or "1"
    try:
        factor = float(text)
    except ValueError:
        factor = 0.0
    if not factor >= 1:
        raise ValueError(f"{TIMEOUT_FACTOR_ENV}={text!r}: give a number, 1 (the default) or more")
    return factor


# Every wait a test sizes for an idle machine is multiplied by this: CI on a loaded machine raises it
# (`make test-under-load`), so that a slow machine makes a test slower, never red. Waits only: a test
# that checks something happens *within* a bound (a lease's expiry, a reclaim's deadline) keeps its bound.
TIMEOUT_FACTOR = _timeout_factor()


def scaled_timeout(seconds: float) -> float:
    """A wait of ``seconds`` on an idle machine, as long as this run allows (ARYL_TEST_TIMEOUT_FACTOR)."""
    return seconds * TIMEOUT_FACTOR


def wait_for(predicate: Callable[[], T | Literal[False, ""] | None], *, timeout: float = 10.0,
             interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``
    (sized for an idle machine: ``scaled_timeout``). The value returned is the truthy one: never None,
    False or "" (the type says so, so ``wait_for(lambda: ready and job)`` gives the job)."""
    timeout = scaled_timeout(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def processes_mentioning(marker: str, command: str | None = None) -> list[int]:
    """Pids of live processes whose environment or command line mentions ``marker`` (and, given
    ``command``, whose command line contains it). A process that ends while it is read is left out."""
    needle = marker.encode()
    wanted = command.encode() if command is not None else b""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            proc = Path("/proc", entry)
            argv = (proc / "cmdline").read_bytes()
            if wanted not in argv:
                continue
            if needle in (proc / "environ").read_bytes() or needle in argv:
                status = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if status != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found


async def wait_until(predicate: Callable[[], object], what: str, timeout: float = 30.0, poll_s: float = 0.05) -> None:
    """``wait_for`` for a coroutine: poll without blocking the event loop, within ``timeout`` as
    ARYL_TEST_TIMEOUT_FACTOR stretches it."""
    timeout = scaled_timeout(timeout)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(poll_s)


@contextmanager
def terminating(proc: subprocess.Popen[Any], *, timeout: float = 30.0) -> Iterator[Callable[[], Any]]:
    """``with terminating(proc) as stop:`` ... ``output = stop()``: ``stop`` sends SIGTERM and returns the
    process's whole output once it exited (within ``timeout``, scaled); leaving the block kills it if it
    is still running (the block failed before ``stop``, or ``stop`` timed out)."""
    def stop() -> Any:
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=scaled_timeout(timeout))
        return output

    try:
        yield stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
