"""Injected server failures: where they come from (a trace file or a rate) and the schedule of
failures and repairs the engine replays.

Nouns:
- *Failure*: a server dies at an instant; the scheduler sees it LOST (as the service's liveness
  check marks a server whose agent went silent). What becomes of its jobs is the policy's decision
  (``scheduler_service.core.faults``), never this module's.
- *Repair*: the server is back ``down_s`` (trace) or ``repair_s`` (rate) later, in its home state.
- *Failure trace*: a CSV file with the header ``time_s,server_id,down_s``, one failure per row;
  server ids are the simulated cluster's (``t0000``.. training, ``i0000``.. inference).
- *Failure rate*: ``FailureRate(mtbf_s, repair_s)``: every server, from the start and again from each
  repair, fails after an exponential time with mean ``mtbf_s``.

Reproducible: the draws of a rate come from one generator per server, seeded by the run's seed and
the server id (``random.Random`` seeds strings through SHA-512, not the process's hash seed), so the
same seed gives the same failures whatever the policy, and another seed other failures.

Must never: touch the cluster or decide anything about jobs; it only says when servers fail and
come back.
"""

from __future__ import annotations

import csv
import gzip
import heapq
import math
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from simulator.model import FailureRate, ServerFailure

FAILURE_TRACE_COLUMNS = ("time_s", "server_id", "down_s")

FAIL, REPAIR = "FAIL", "REPAIR"
# At one instant repairs come first: a server back at t may fail again at t.
_ORDER = {REPAIR: 0, FAIL: 1}


class FailureTraceError(ValueError):
    """A failure trace that cannot be read; the message names the file, the row and the field."""


def load_failure_trace(path: Path) -> list[ServerFailure]:
    """The failures of a ``time_s,server_id,down_s`` CSV (plain or .gz), in file order."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in FAILURE_TRACE_COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise FailureTraceError(f"{path}: missing column(s) {', '.join(missing)}; expected the header "
                                    f"{','.join(FAILURE_TRACE_COLUMNS)}")
        failures = []
        for line, row in enumerate(reader, start=2):
            try:
                time_s, down_s = float(row["time_s"]), float(row["down_s"])
            except (TypeError, ValueError):
                raise FailureTraceError(f"{path}:{line}: time_s and down_s must be numbers "
                                        f"(got {row['time_s']!r}, {row['down_s']!r})") from None
            server_id = (row["server_id"] or "").strip()
            if not server_id:
                raise FailureTraceError(f"{path}:{line}: server_id is empty")
            if not (math.isfinite(time_s) and time_s >= 0):
                raise FailureTraceError(f"{path}:{line}: time_s must be >= 0 (got {time_s})")
            if not (math.isfinite(down_s) and down_s > 0):
                raise FailureTraceError(f"{path}:{line}: down_s must be > 0 (got {down_s})")
            failures.append(ServerFailure(time_s, server_id, down_s))
    return failures


class FailureSchedule:
    """The failures and repairs to replay, in time order (``next_time``, ``pop_due``). A failure of
    a server that is down already is dropped (with its repair): a server fails only while up."""

    def __init__(self, source: FailureRate | Sequence[ServerFailure] | None, server_ids: Iterable[str],
                 *, seed: int) -> None:
        servers = sorted(server_ids)
        self._events: list[tuple[float, int, str, float]] = []  # (time, _ORDER, server id, down_s)
        self._down: set[str] = set()
        self._rate: FailureRate | None = None
        self._draws: dict[str, random.Random] = {}
        if isinstance(source, FailureRate):
            if not source.mtbf_s > 0 or not source.repair_s > 0:
                raise ValueError(f"server failures need mtbf_s > 0 and repair_s > 0 (got {source})")
            self._rate = source
            for server_id in servers:
                self._draws[server_id] = random.Random(f"aryl-sim server failures:{seed}:{server_id}")
                self._push_failure(server_id, 0.0)
        elif source is not None:
            known = set(servers)
            for failure in source:
                if failure.server_id not in known:
                    raise ValueError(f"failure at t={failure.time}: no server {failure.server_id!r} in the "
                                     f"cluster (servers: {servers[0]}..{servers[-1]})" if servers else
                                     f"failure at t={failure.time}: the cluster has no servers")
                if not (failure.time >= 0 and failure.down_s > 0):
                    raise ValueError(f"failure {failure}: time must be >= 0 and down_s > 0")
                self._events.append((failure.time, _ORDER[FAIL], failure.server_id, failure.down_s))
            heapq.heapify(self._events)

    def _push_failure(self, server_id: str, up_since: float) -> None:
        assert self._rate is not None
        uptime = self._draws[server_id].expovariate(1.0 / self._rate.mtbf_s)
        heapq.heappush(self._events, (up_since + uptime, _ORDER[FAIL], server_id, self._rate.repair_s))

    def next_time(self) -> float:
        """When the next failure or repair happens (infinity: none)."""
        return self._events[0][0] if self._events else math.inf

    def pop_due(self, now: float) -> list[tuple[str, str]]:
        """The failures and repairs due by ``now``, in order: (``FAIL`` or ``REPAIR``, server id)."""
        due = []
        while self._events and self._events[0][0] <= now:
            when, order, server_id, down_s = heapq.heappop(self._events)
            if order == _ORDER[REPAIR]:
                self._down.discard(server_id)
                due.append((REPAIR, server_id))
                if self._rate is not None:
                    self._push_failure(server_id, when)
            elif server_id not in self._down:
                self._down.add(server_id)
                due.append((FAIL, server_id))
                heapq.heappush(self._events, (when + down_s, _ORDER[REPAIR], server_id, 0.0))
        return due

    @property
    def any_down(self) -> bool:
        """Is some server down now (a repair is still to come)?"""
        return bool(self._down)
