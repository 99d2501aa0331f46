"""Placement: where a job's workers go, as a short pipeline declared in one place.

Feasibility checks filter servers, then a scorer ranks the survivors; every policy shares this so
comparisons between policies isolate their queueing and scaling mechanisms, not placement.
A worker never spans servers; a gang is placed whole or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from scheduler_service.core.plan import Reason, WorkerPlacement
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView
from scheduler_service.lifecycle import Pool

# (server, its GPUs still free in this plan, gpus_per_worker) -> may a worker go there?
ServerCheck = Callable[[ServerView, Sequence[int], int], bool]

# The feasibility pipeline, in order.
FEASIBILITY: tuple[tuple[str, ServerCheck], ...] = (
    # Training may run only on training-owned servers and on inference servers while loaned.
    ("runs_training", lambda server, free, gpus: server.runs_training),
    # A worker needs all its GPUs on one server (NCCL within a host; simpler failure domain).
    ("fits_one_worker", lambda server, free, gpus: len(free) >= gpus),
)


# Which servers a worker should prefer (lower is better), before best fit.
Preference = Callable[[ServerView], int]


def no_preference(server: ServerView) -> int:
    return 0


def prefer_training_owned(server: ServerView) -> int:
    """Inelastic jobs and base workers: stay off loaned servers, so a reclaim cannot kill them."""
    return 0 if server.pool == Pool.TRAINING else 1


def prefer_loaned(server: ServerView) -> int:
    """Elastic extra workers: go to loaned servers first, so a reclaim only shrinks their jobs."""
    return 0 if server.pool == Pool.INFERENCE else 1


def best_fit_score(free_after: int, server: ServerView, preference: Preference = no_preference) -> tuple[int, int, str]:
    """Lower is better. The pool preference first; then best fit: leave the fewest GPUs free on the
    chosen server, so large free blocks stay intact for large workers; the server id breaks ties."""
    return (preference(server), free_after, server.server_id)


@dataclass
class FreeCapacity:
    """A mutable working copy of free GPUs per schedulable server, for planning several jobs."""

    free: dict[str, list[int]]
    servers: dict[str, ServerView]

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> FreeCapacity:
        schedulable = {s.server_id: s for s in snapshot.servers if s.runs_training}
        return cls(free={sid: list(s.free_gpus) for sid, s in schedulable.items()}, servers=schedulable)

    def total_free(self) -> int:
        return sum(len(g) for g in self.free.values())

    def largest_block(self) -> int:
        return max((len(g) for g in self.free.values()), default=0)

    def copy(self) -> FreeCapacity:
        return FreeCapacity({sid: list(g) for sid, g in self.free.items()}, self.servers)

    def release(self, server_id: str, gpus: Iterable[int]) -> None:
        """Give GPUs back (a worker removed in this plan)."""
        if server_id in self.free:
            self.free[server_id] = sorted({*self.free[server_id], *gpus})

    def place_gang(
        self, job: JobView, num_workers: int, first_rank: int = 0, *,
        preference: Preference = no_preference, exclude: frozenset[str] = frozenset(),
    ) -> tuple[WorkerPlacement, ...] | None:
        """Place ``num_workers`` workers of ``job`` (best fit, one at a time); all or nothing.
        On success the GPUs are taken from this capacity; on failure nothing changes.
        ``exclude``: servers held for someone else (a reservation)."""
        trial = {sid: list(g) for sid, g in self.free.items()}
        placed: list[WorkerPlacement] = []
        for rank in range(first_rank, first_rank + num_workers):
            candidates = [
                self.servers[sid]
                for sid in sorted(trial)
                if sid not in exclude and _feasible(self.servers[sid], trial[sid], job.gpus_per_worker)
            ]
            if not candidates:
                return None
            best = min(
                candidates,
                key=lambda s: best_fit_score(len(trial[s.server_id]) - job.gpus_per_worker, s, preference),
            )
            taken, trial[best.server_id] = trial[best.server_id][: job.gpus_per_worker], trial[best.server_id][job.gpus_per_worker :]
            placed.append(WorkerPlacement(rank=rank, server_id=best.server_id, gpu_indices=tuple(taken)))
        self.free = trial
        return tuple(placed)

    def explain_unplaceable(self, job: JobView, num_workers: int) -> tuple[Reason, str]:
        """Why ``place_gang`` failed, in the numbers a user can act on."""
        need = f"needs {num_workers} worker(s) x {job.gpus_per_worker} GPU(s) as a gang"
        if not self.servers:
            return Reason.NO_TRAINING_CAPACITY, f"{need}; no server can run training right now"
        biggest_server = max(len(s.gpu_indices) - len(s.unhealthy_gpus) for s in self.servers.values())
        if biggest_server < job.gpus_per_worker:
            return (
                Reason.WORKER_TOO_LARGE,
                f"{need}; the largest schedulable server has {biggest_server} healthy GPU(s)",
            )
        return (
            Reason.WAITING_FOR_GANG,
            f"{need}; free now: {self.total_free()} GPU(s) on {sum(1 for g in self.free.values() if g)} "
            f"server(s), largest block {self.largest_block()}",
        )


def _feasible(server: ServerView, free: Sequence[int], gpus_per_worker: int) -> bool:
    return all(check(server, free, gpus_per_worker) for _, check in FEASIBILITY)
