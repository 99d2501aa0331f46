"""Numeric solvers behind the Aryl policy: arrays in, arrays out.

Nouns:
- A *kernel* is a numba-jitted function over NumPy arrays (``cache=True``: compiled code is kept on disk
  next to the source, or under ``$NUMBA_CACHE_DIR``). Each kernel has a plain-Python *reference* that
  computes the same answer the obvious way; tests compare the two, and compare both with *brute force*
  on small cases.
- A *wrapper* is the typed Python function the policy calls: it checks the arrays, calls the kernel and
  returns a frozen result object.
- ``knapsack``: the multiple-choice knapsack that hands spare GPUs to elastic jobs (Phase 2).
- ``reclaim``: the greedy that picks which loaned servers to give back to inference.

What this package must never do: import grpc, SQLAlchemy or the wall clock, or know about jobs and
servers as domain objects. Encoding a snapshot into arrays (and decoding the answer) is the policy's job.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

# The dtypes the kernels compute in (the wrappers convert their inputs to them). Annotations only: numba
# reads the arrays it is given, not these.
IntArray: TypeAlias = npt.NDArray[np.int64]
FloatArray: TypeAlias = npt.NDArray[np.float64]
BoolArray: TypeAlias = npt.NDArray[np.bool_]


class SolverInputError(ValueError):
    """The arrays handed to a solver are malformed. ``field`` names the argument, ``reason`` says what
    is wrong with it. This is a bug in the caller's encoding, never a user's input."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


# Defined before the submodules are imported: they import SolverInputError and the array types from here.
from scheduler_service.solvers.knapsack import (  # noqa: E402
    KnapsackSolution,
    solve_knapsack,
    solve_knapsack_brute_force,
    solve_knapsack_reference,
)
from scheduler_service.solvers.reclaim import (  # noqa: E402
    ReclaimInstance,
    ReclaimOutcome,
    reclaim_cost_of,
    reclaim_exact,
    reclaim_exhaustive,
    reclaim_greedy,
    reclaim_greedy_reference,
    reclaim_most_recent_first,
    reclaim_solve,
)

__all__ = [
    "KnapsackSolution",
    "ReclaimInstance",
    "ReclaimOutcome",
    "SolverInputError",
    "reclaim_cost_of",
    "reclaim_exact",
    "reclaim_exhaustive",
    "reclaim_greedy",
    "reclaim_greedy_reference",
    "reclaim_most_recent_first",
    "reclaim_solve",
    "solve_knapsack",
    "solve_knapsack_brute_force",
    "solve_knapsack_reference",
]


def warm_up() -> None:
    """Compile (or load from the on-disk cache) every kernel with a tiny instance, so that the first
    scheduling cycle does not pay numba's compile time (seconds on a cold cache)."""
    solve_knapsack(np.ones((1, 1), np.int64), np.ones((1, 1)), np.ones(1, np.int64), 1)
    instance = ReclaimInstance.from_triples([(0, 0, 1)], n_servers=1, job_workers=[1], job_min=[1],
                                            job_cost=[1.0], scale_in_cost=[1.0])
    reclaim_greedy(instance, 1)
    # The exact reclaim too: compiled on a cold cache in the middle of a run, it once added ~60 MiB to the
    # scheduler's memory at its first reclaim (make soak-ci's memory check failed on it).
    reclaim_exact(instance, 1)
