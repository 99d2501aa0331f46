"""What the exits of a job's workers mean for the job: completed, restart, failed, or not yet.

Nouns: a job's *incarnation* is one start of its workers at one world size (a start or a resize
bumps it); an *exit* is the status a worker of the current incarnation ended with, as its agent
reported it, except exits the agent caused itself (a stop asked for by the scheduler is not a
crash). Pure: no I/O, no clock; the service records the verdict.

- Any failed exit (non-zero, or killed by a signal the agent did not send) fails the incarnation:
  the job is restarted (requeued, ``restarts`` + 1) while its restart policy is ON_FAILURE and it
  has restarts left, else it FAILS. Its other workers are stopped because their allocations go.
- A worker that could not start for a reason in the job's spec (``cannot_start``: its working
  directory does not exist on its server) FAILS the job whatever its restart policy: a restart
  would meet the same spec.
- Every rank of the incarnation exited 0: the job COMPLETED.
- Otherwise nothing is decided yet (some ranks still run).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from aryl_common.exits import describe_exit

__all__ = ["Verdict", "describe_exit", "judge_exits"]  # describe_exit: one wording, the agent's too


class Verdict(StrEnum):
    COMPLETED = "COMPLETED"
    RESTART = "RESTART"
    FAILED = "FAILED"


def judge_exits(
    exits: Mapping[int, int], *, num_workers: int, restart_policy: str, restarts: int, max_restarts: int,
    cannot_start: Mapping[int, str] | None = None, reasons: Mapping[int, str] | None = None,
) -> tuple[Verdict | None, str]:
    """The verdict on one incarnation from its exits so far (rank -> status), and why.
    ``cannot_start``: rank -> why, for the workers that could not start (module doc). ``reasons``:
    rank -> what its agent said about the exit (``No space left on device``), added to the failure
    unless it only repeats the status."""
    if cannot_start:
        rank = min(cannot_start)
        return Verdict.FAILED, f"rank {rank} could not start {cannot_start[rank]}; not restarted: the spec must change"
    failed = sorted((rank, code) for rank, code in exits.items() if code != 0)
    if failed:
        rank, code = failed[0]
        said = (reasons or {}).get(rank, "")
        why = f"rank {rank} failed ({describe_exit(code)}{f': {said}' if said and said != describe_exit(code) else ''})"
        if restart_policy == "ON_FAILURE" and restarts < max_restarts:
            return Verdict.RESTART, f"{why}; restart {restarts + 1} of {max_restarts}"
        if restart_policy == "ON_FAILURE":
            return Verdict.FAILED, f"{why}; no restarts left (max_restarts={max_restarts})"
        return Verdict.FAILED, f"{why}; restart policy {restart_policy}"
    if num_workers > 0 and all(rank in exits for rank in range(num_workers)):
        return Verdict.COMPLETED, f"all {num_workers} worker(s) exited 0"
    return None, ""
