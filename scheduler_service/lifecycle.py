"""Job and server lifecycles as data: transition tables that refuse illegal moves.

A state changes only through ``JOB_LIFECYCLE.check(from, to)`` / ``SERVER_LIFECYCLE.check``; the
store records every accepted move in the event log with its reason (the history).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Generic, TypeVar


class JobState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SCALING = "SCALING"
    PREEMPTED = "PREEMPTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_JOB_STATES

    @property
    def holds_gpus(self) -> bool:
        return self in (JobState.RUNNING, JobState.SCALING)


TERMINAL_JOB_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class Pool(StrEnum):
    TRAINING = "TRAINING"
    INFERENCE = "INFERENCE"


class ServerState(StrEnum):
    TRAINING = "TRAINING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    LOANED = "LOANED"
    RECLAIMING = "RECLAIMING"
    LOST = "LOST"
    UNHEALTHY = "UNHEALTHY"


class IllegalTransition(Exception):
    """A state change the lifecycle does not allow; ``str()`` names both states."""

    def __init__(self, kind: str, current: str, target: str) -> None:
        super().__init__(f"{kind} cannot go from {current} to {target}")
        self.current = current
        self.target = target


_State = TypeVar("_State", bound=StrEnum)


class TransitionTable(Generic[_State]):
    """Allowed moves ``from -> {to, ...}``. ``check`` raises IllegalTransition for anything else."""

    def __init__(self, kind: str, moves: Mapping[_State, frozenset[_State]]) -> None:
        self.kind = kind
        # Keyed as plain strings: callers pass states read back from the store as ``str``, and a StrEnum
        # member hashes and compares like its value, so either finds the same entry.
        self._moves: dict[str, frozenset[_State]] = {state: targets for state, targets in moves.items()}

    def allows(self, current: str, target: str) -> bool:
        return target in self._moves.get(current, frozenset())

    def check(self, current: str, target: str) -> None:
        if not self.allows(current, target):
            raise IllegalTransition(self.kind, current, target)

    def targets(self, current: str) -> frozenset[_State]:
        return self._moves.get(current, frozenset())


J = JobState
JOB_LIFECYCLE = TransitionTable(
    "job",
    {
        J.PENDING: frozenset({J.RUNNING, J.CANCELLED, J.FAILED}),
        J.RUNNING: frozenset({J.SCALING, J.PREEMPTED, J.COMPLETED, J.FAILED, J.CANCELLED, J.PENDING}),
        J.SCALING: frozenset({J.RUNNING, J.PREEMPTED, J.COMPLETED, J.FAILED, J.CANCELLED}),
        # A preempted job is requeued; it resumes from its checkpoint when placed again.
        J.PREEMPTED: frozenset({J.PENDING, J.CANCELLED}),
    },
)

S = ServerState
_FAULTS = frozenset({S.LOST, S.UNHEALTHY})
SERVER_LIFECYCLE = TransitionTable(
    "server",
    {
        S.TRAINING: _FAULTS,
        S.SERVING: frozenset({S.DRAINING}) | _FAULTS,
        S.DRAINING: frozenset({S.LOANED, S.SERVING}) | _FAULTS,
        S.LOANED: frozenset({S.RECLAIMING}) | _FAULTS,
        S.RECLAIMING: frozenset({S.SERVING}) | _FAULTS,
        # Coming back from a fault: training servers to TRAINING, inference servers to SERVING.
        S.LOST: frozenset({S.TRAINING, S.SERVING, S.UNHEALTHY}),
        S.UNHEALTHY: frozenset({S.TRAINING, S.SERVING, S.LOST}),
    },
)


def home_state(pool: str) -> ServerState:
    """The state a server of ``pool`` starts in and returns to after a fault."""
    return ServerState.TRAINING if pool == Pool.TRAINING else ServerState.SERVING
