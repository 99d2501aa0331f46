"""Plumbing shared by the long-running Aryl daemons that call the scheduler (``aryl-agent``, ``aryl-router``).

Reconnect backoff, the gRPC channel to the scheduler, and SIGTERM/SIGINT handling (their typed
configs build on ``scheduler_service.config``). Nothing here knows about GPUs,
desired state or demand, and nothing here decides anything. (It lives in ``node_agent`` because
that is the first daemon; the router imports it.)
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable
from importlib import metadata

import grpc


class Backoff:
    """Exponential backoff with jitter: ``initial * multiplier**n``, capped, each delay drawn from [d/2, d].

    Jitter keeps a fleet of agents that lost the scheduler together from reconnecting in lock-step.
    ``reset()`` after a success, so the next outage starts short again.
    """

    def __init__(
        self,
        max_delay_s: float,
        *,
        initial_s: float = 0.5,
        multiplier: float = 2.0,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial_s <= max_delay_s:
            raise ValueError(f"need 0 < initial_s ({initial_s}) <= max_delay_s ({max_delay_s})")
        self.max_delay_s = max_delay_s
        self.initial_s = initial_s
        self.multiplier = multiplier
        self._rng = rng or random.Random()
        self._failures = 0

    @property
    def failures(self) -> int:
        """Consecutive failures since the last ``reset()``."""
        return self._failures

    def next_delay(self) -> float:
        """Record one more failure; return how long to wait before trying again."""
        ceiling = min(self.max_delay_s, self.initial_s * self.multiplier**self._failures)
        self._failures += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._failures = 0


KEEPALIVE_TIME_MS = 10_000


def scheduler_channel(address: str, max_reconnect_backoff_s: float) -> grpc.Channel:
    """An insecure channel to the scheduler whose own reconnect backoff is capped like ours.

    gRPC's default reconnect backoff grows to 120 s; without the cap a daemon would keep failing
    fast with UNAVAILABLE for up to two minutes after the scheduler came back.
    """
    max_ms = max(1, int(max_reconnect_backoff_s * 1000))
    return grpc.insecure_channel(
        address,
        options=[
            ("grpc.initial_reconnect_backoff_ms", min(500, max_ms)),
            ("grpc.min_reconnect_backoff_ms", min(500, max_ms)),
            ("grpc.max_reconnect_backoff_ms", max_ms),
            # Keepalive pings notice a dead scheduler (or a silently dropped connection) within ~15 s
            # even while the desired-state stream is idle; the scheduler permits this ping rate.
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ],
    )


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
        except BaseException as exc:  # handed to the main thread below
            errors.append(exc)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
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


def describe_rpc_error(exc: grpc.RpcError) -> str:
    """``CODE details`` of a failed call, for logs."""
    if isinstance(exc, grpc.Call):
        return f"{exc.code().name} {exc.details() or ''}".strip()
    return f"UNKNOWN {exc}"


def aryl_version() -> str:
    """The installed package's version, reported to the scheduler by agents."""
    try:
        return metadata.version("aryl")
    except metadata.PackageNotFoundError:
        return "0+unknown"

