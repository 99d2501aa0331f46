"""Which desired states the agent accepts: epoch fencing and generation ordering, with no I/O.

Nouns: the scheduler sends *desired state* for this server (the workers that should run) tagged
with a *scheduler epoch* (one per scheduler leadership term) and a *generation* (increases with
every change, per server). Delivery is at least once and may reorder, so the agent accepts a
desired state only when it is newer than everything it has already accepted:

- an epoch older than the newest one seen is a deposed scheduler talking: refuse it (fencing);
- a newer epoch is a new term: accept it whatever its generation, since a new leader is the
  authority on what the generation is now;
- within the newest epoch, a generation at or below the last accepted one is a duplicate or a
  late delivery: ignore it.

Accepting only *records* the state; converging to it (starting and stopping workers) is the
agent's job, not this module's. The newest epoch survives restarts through ``on_newer_epoch`` (the
agent saves it, ``node_agent.epoch_file``) and ``newest_epoch`` (what it saved last).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import StrEnum

from protos.aryl.v1 import agent_pb2


class Verdict(StrEnum):
    ACCEPTED = "ACCEPTED"
    ACCEPTED_NEW_EPOCH = "ACCEPTED_NEW_EPOCH"  # first state of a newer scheduler term
    STALE_EPOCH = "STALE_EPOCH"  # from a scheduler term older than the newest seen: refused
    OLD_GENERATION = "OLD_GENERATION"  # duplicate or reordered delivery: ignored

    @property
    def accepted(self) -> bool:
        return self in (Verdict.ACCEPTED, Verdict.ACCEPTED_NEW_EPOCH)


class DesiredStateTracker:
    """The newest epoch seen, the last accepted generation and the desired state that came with it.

    Thread-safe: the watch stream offers states while the report loop reads ``observed_generation``.
    ``newest_epoch``: the newest seen before (by an earlier run of the agent); ``on_newer_epoch(epoch)``
    is called, under the lock, before a newer epoch is taken (to save it; if it raises, it is not).
    """

    def __init__(self, *, newest_epoch: int = 0, on_newer_epoch: Callable[[int], None] = lambda epoch: None) -> None:
        self._lock = threading.Lock()
        self._newest_epoch = newest_epoch  # newest seen, from registrations and accepted states
        self._on_newer_epoch = on_newer_epoch
        self._latest: agent_pb2.DesiredState | None = None  # the last accepted state

    @property
    def newest_epoch(self) -> int:
        with self._lock:
            return self._newest_epoch

    @property
    def observed_generation(self) -> int:
        """The generation last accepted (0: none yet); what the agent reports as converged to."""
        with self._lock:
            return self._latest.generation if self._latest is not None else 0

    @property
    def latest(self) -> agent_pb2.DesiredState | None:
        with self._lock:
            return self._latest

    def observe_epoch(self, epoch: int) -> bool:
        """Note the epoch a scheduler answered a registration with; False if it is older than one seen.

        Only raises the fence: the accepted state stays until a desired state of that epoch arrives.
        """
        with self._lock:
            if epoch < self._newest_epoch:
                return False
            self._raise_fence(epoch)
            return True

    def offer(self, desired: agent_pb2.DesiredState) -> Verdict:
        """Accept ``desired`` if it is newer than everything accepted so far (rules in the module doc)."""
        with self._lock:
            epoch, generation = desired.scheduler_epoch, desired.generation
            if epoch < self._newest_epoch:
                return Verdict.STALE_EPOCH
            if generation <= 0:
                return Verdict.OLD_GENERATION  # generation 0 is "no desired state yet"
            previous = self._latest
            if previous is not None and epoch == previous.scheduler_epoch and generation <= previous.generation:
                return Verdict.OLD_GENERATION
            self._raise_fence(epoch)
            self._latest = desired
            if previous is not None and epoch > previous.scheduler_epoch:
                return Verdict.ACCEPTED_NEW_EPOCH
            return Verdict.ACCEPTED

    def _raise_fence(self, epoch: int) -> None:
        if epoch > self._newest_epoch:
            self._on_newer_epoch(epoch)
            self._newest_epoch = epoch
