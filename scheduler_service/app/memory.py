"""What the application keeps in memory about agents, on this process's monotonic clock only (never
the agents' clocks, never the database's wall times): when each server was last heard from
(``Heartbeats``), and what each server's last fully recorded report said (``ReportDigests``, the
status report's fast path).

Both are thread-safe and lost on restart by design: a restarted scheduler gives every agent a full
grace period, and takes every agent's next report through the full path.

Never: touch the database, or hold anything the database does not also hold (these are caches and
clocks, not state).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from scheduler_service.core.clock import Clock
from scheduler_service.records import StatusReport


class Heartbeats:
    """When each server was last heard from. A server not heard from since this scheduler started
    counts from the start."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._heard_from: dict[str, float] = {}
        self._lock = threading.Lock()
        self._started_mono = clock.monotonic()

    def restart(self) -> None:
        """Forget every server: each counts from now, as in a newly started scheduler (a standby that
        begins to lead heard nothing while it stood by)."""
        with self._lock:
            self._heard_from.clear()
            self._started_mono = self._clock.monotonic()

    def heard(self, server_id: str) -> None:
        with self._lock:
            self._heard_from[server_id] = self._clock.monotonic()

    def silence(self, server_id: str) -> float:
        """Seconds since this scheduler last heard from the server (or since it started)."""
        with self._lock:
            heard = self._heard_from.get(server_id, self._started_mono)
        return self._clock.monotonic() - heard


@dataclass(frozen=True)
class ReportDigest:
    epoch: int
    observed_generation: int
    desired_generation: int
    health: tuple[tuple[int, bool], ...]
    written_at: float  # monotonic


def health_of(report: StatusReport) -> tuple[tuple[int, bool], ...]:
    return tuple((g.index, g.healthy) for g in report.gpus)


class ReportDigests:
    """Per server, the digest of its last fully recorded report. Forgotten whenever the server's state
    or desired generation changes, so its next report takes the full path."""

    def __init__(self) -> None:
        self._digests: dict[str, ReportDigest] = {}
        self._forgets: dict[str, int] = {}  # per server, how often it was forgotten (see ``put``)
        self._lock = threading.Lock()

    def get(self, server_id: str) -> ReportDigest | None:
        with self._lock:
            return self._digests.get(server_id)

    def since(self, server_id: str) -> int:
        """A mark to pass to ``put``: taken before the transaction that records a report."""
        with self._lock:
            return self._forgets.get(server_id, 0)

    def put(self, server_id: str, digest: ReportDigest, since: int) -> bool:
        """``digest`` of a report whose transaction began after ``since`` was taken, kept only if nothing
        forgot the server meanwhile: a commit that changed it (a cycle's start, a new desired generation)
        and announced that while the report was recorded may hold what the report's transaction did not
        see, and a digest put after that announcement would answer the next reports with it. Returns
        whether it was kept."""
        with self._lock:
            if self._forgets.get(server_id, 0) != since:
                return False
            self._digests[server_id] = digest
            return True

    def advance(self, server_id: str, digest: ReportDigest, *, observed: int, desired: int) -> None:
        """The server converged to ``observed`` (desired: ``desired``) since ``digest``: kept as its
        digest only if nothing forgot or replaced it meanwhile (a commit that changed the server)."""
        with self._lock:
            if self._digests.get(server_id) is digest:
                self._digests[server_id] = dataclasses.replace(
                    digest, observed_generation=observed, desired_generation=desired
                )

    def written(self, server_id: str, digest: ReportDigest, at: float) -> None:
        """The server's telemetry counts as written at ``at`` (monotonic; a writer has it queued): kept
        only if nothing forgot or replaced ``digest`` meanwhile, as ``advance``."""
        with self._lock:
            if self._digests.get(server_id) is digest:
                self._digests[server_id] = dataclasses.replace(digest, written_at=at)

    def forget(self, server_ids: Iterable[str]) -> None:
        """Their state or desired generation changed: the next report of each takes the full path."""
        with self._lock:
            for server_id in server_ids:
                self._digests.pop(server_id, None)
                self._forgets[server_id] = self._forgets.get(server_id, 0) + 1
