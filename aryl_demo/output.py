"""What ``aryl-demo`` prints: a clock since the start, timeline lines and headings, ``arylctl`` run as a
user would type it, and the scheduler's event log streamed as the timeline.

Nouns: a *line* is one timeline entry under the demo's clock; a *heading* (``say``) opens a part
of the story; the *timeline* is the scheduler's events of the kinds in ``SHOWN_EVENTS``.
Every print goes through ``PRINT_LOCK``, so the threads' lines never interleave. This module never
starts a process nor changes the cluster: it only reads and prints.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from arylctl import cli
from arylctl.client import ArylClient
from protos.aryl.v1 import types_pb2


class Clock:
    """Seconds since the demo started, for the timeline."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def __str__(self) -> str:
        return f"{time.monotonic() - self.start:6.1f}s"


CLOCK = Clock()
PRINT_LOCK = threading.Lock()


def line(text: str) -> None:
    with PRINT_LOCK:
        print(f"[{CLOCK}] {text}", flush=True)


def say(text: str) -> None:
    with PRINT_LOCK:
        print(f"\n[{CLOCK}] == {text}", flush=True)


# What arylctl (``show``) presents to the demo's scheduler: its CA, the client certificate, the admin's token.
CLI_ENV: dict[str, str] = {}


def show(address: str, *args: str) -> None:
    with PRINT_LOCK:
        print(f"$ arylctl {' '.join(args)}", flush=True)
        saved = {key: os.environ.get(key) for key in (*CLI_ENV, "ARYL_TOKEN")}
        os.environ.pop("ARYL_TOKEN", None)
        os.environ.update(CLI_ENV)
        try:
            cli.main(["--server", address, *args])
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


SHOWN_EVENTS = {"JOB_STATE_CHANGED", "LOAN_STARTED", "LOAN_ENDED", "DEMAND_CHANGED", "SERVER_STATE_CHANGED",
                "SERVER_DRAINED", "WORKER_EXITED", "JOB_BATCH_CHANGED"}


@dataclass
class Timeline:
    """The newest event id the timeline has printed (or skipped), so the story can wait for it."""

    seen: int = 0

    def caught_up(self, client: ArylClient) -> bool:
        return not list(client.watch_events(after_event_id=self.seen, idle_timeout=0.2))


def timeline(client: ArylClient, names: dict[str, str], stop: threading.Event, shown: Timeline) -> None:
    try:
        for event in client.watch_events(after_event_id=0):
            if stop.is_set():
                return
            shown.seen = max(shown.seen, event.event_id)
            kind = types_pb2.EventKind.Name(event.kind).removeprefix("EVENT_KIND_")
            if kind not in SHOWN_EVENTS:
                continue
            who = names.get(event.job_id, f"job {event.job_id}") if event.job_id else event.server_id or "scheduler"
            change = f"{event.from_state}->{event.to_state}" if event.to_state else kind.lower()
            line(f"  event  {who:<11} {change:<22} {event.reason:<24} {event.message[:120]}")
    except Exception:  # noqa: BLE001 - the stream ends when the scheduler stops
        return

