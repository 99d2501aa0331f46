"""SIGTERM and SIGINT turned into a clean stop, for a daemon run in threads or on an asyncio loop.

Both forms only *request* the stop: the daemon's own code finishes in-flight work and returns.
Nothing here decides what stopping means for workers, requests or RPCs.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run_until_signalled(run: Callable[[], None], stop: Callable[[], None], *, poll_s: float = 0.2) -> None:
    """Run ``run()`` in a worker thread until it returns; on SIGTERM or SIGINT, call ``stop()``.

    Must be called from the main thread (Python delivers signals there). The handler only records
    the signal; ``stop()`` is then called from the main thread's normal flow, because taking a lock
    inside a handler (``Event.set`` does) can deadlock against the very code it interrupted.
    An exception from ``run()`` is re-raised here.
    """
    received: list[int] = []
    errors: list[BaseException] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)  # no locks in here

    def target() -> None:
        try:
            run()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, re-raised there
            errors.append(exc)

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    worker = threading.Thread(target=target, name="daemon-main")
    stopped = False
    try:
        worker.start()
        while worker.is_alive():
            if received and not stopped:
                stopped = True
                stop()
            worker.join(poll_s)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if errors:
        raise errors[0]


def stop_on_signals(loop: asyncio.AbstractEventLoop, stop: Callable[[], None]) -> None:
    """Call ``stop()`` on ``loop`` when SIGTERM or SIGINT arrives (Unix; the loop's own safe handler)."""
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop)
