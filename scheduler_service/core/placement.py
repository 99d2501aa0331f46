"""Placement: where a job's workers go, declared in one place and shared by every policy, so that
comparisons between policies isolate their queueing and scaling mechanisms, not placement.

The pipeline, in order (each step with its reason):
1. *Runs training* (filter, when the capacity is built): training runs only on training-owned
   servers and on inference servers while loaned; and *not cordoned*: an operator took the server
   out (``ServerView.cordoned``: cordoned, draining, left); the workers there stay, none is added.
2. *Not reserved* (filter, per call): servers held for a starving job are skipped.
3. *One GPU type* (filter, per gang): a job that names GPU types runs on those only, the first that
   fits its whole gang, in its order; every job's workers share one type (a gang on mixed GPUs runs at
   the slowest one's pace), so on a cluster of several types a gang is placed type by type, the type
   with the most free GPUs first. On a cluster of one type this step does nothing.
4. *Fits one worker* (filter): a worker needs all its GPUs on one server (NCCL within a host; one
   failure domain), healthy and free.
5. *Pool preference* (rank): base and inelastic workers prefer training-owned servers (a reclaim
   cannot touch them); elastic extras prefer loaned servers (a reclaim only shrinks their job).
6. *Best fit* (rank): the server left with the fewest free GPUs, so large free blocks stay intact
   for large workers; the server id breaks ties deterministically.

A gang is placed whole or not at all. ``FreeCapacity`` keeps servers bucketed by (pool, free GPUs),
so a placement costs O(distinct free counts), not O(servers): a cycle places thousands of jobs.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from scheduler_service.core.plan import Reason, WorkerPlacement
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, ServerView
from scheduler_service.lifecycle import Pool

# Preferred pool first (step 4). None: no preference.
TRAINING_FIRST = (Pool.TRAINING, Pool.INFERENCE)  # base workers, inelastic jobs
LOANED_FIRST = (Pool.INFERENCE, Pool.TRAINING)    # elastic extra workers
_ALL_POOLS = tuple(Pool)  # (iterating an enum is slow: placement asks for every pool thousands of times a cycle)
ANY_POOL = (None,)


class FreeCapacity:
    """Free healthy GPUs per schedulable server, as a plan consumes and releases them."""

    def __init__(self, free: dict[str, list[int]], servers: dict[str, ServerView]) -> None:
        self.servers = servers
        self._free = {sid: sorted(g) for sid, g in free.items()}
        self._index()

    def _index(self) -> None:
        """Buckets and total from ``_free`` (each list ascending)."""
        buckets: dict[tuple[Pool, int], list[str]] = {}
        total, free, servers = 0, self._free, self.servers
        for sid in sorted(free):  # each bucket in server-id order
            count = len(free[sid])
            if count:
                total += count
                bucket = buckets.get((servers[sid].pool, count))
                if bucket is None:
                    buckets[(servers[sid].pool, count)] = [sid]
                else:
                    bucket.append(sid)
        self._buckets = buckets
        self._counts: list[int] | None = None  # the free counts of the non-empty buckets, ascending (``_best_server``)
        self.total = total
        self._biggest: int | None = None
        self._explained: dict[tuple[int, int, tuple[str, ...]], tuple[Reason, str]] = {}  # explain_unplaceable's
        self._index_types()

    def _index_types(self) -> None:
        """The GPU types of the servers (step 3); the free GPUs of each (kept as GPUs are taken and released:
        placement asks for them with every gang on a cluster of several types); per type, the servers of other
        types (on first use)."""
        self.gpu_types = tuple(sorted({s.gpu_type for s in self.servers.values()}))
        self._by_type = dict.fromkeys(self.gpu_types, 0)
        for sid, gpus in self._free.items():
            self._by_type[self.servers[sid].gpu_type] += len(gpus)
        self._other_types: dict[str, frozenset[str]] = {}

    @classmethod
    def of(cls, snapshot: ClusterSnapshot) -> FreeCapacity:
        schedulable = {s.server_id: s for s in snapshot.servers if s.runs_training and not s.cordoned}  # step 1
        return cls({sid: list(s.free_gpus) for sid, s in schedulable.items()}, schedulable)

    @classmethod
    def without(cls, servers: Iterable[ServerView], held: dict[str, set[int]]) -> FreeCapacity:
        """The healthy GPUs of ``servers`` (the schedulable ones; cordoned ones are left out: step 1)
        except those in ``held`` (by server)."""
        capacity = object.__new__(cls)
        capacity.servers, capacity._free = {}, {}
        for s in servers:
            if s.cordoned:
                continue
            taken = held.get(s.server_id)
            capacity.servers[s.server_id] = s
            if not taken:
                capacity._free[s.server_id] = sorted(s.healthy_gpus)
            elif taken == s.allocated_gpus:  # as the snapshot shows it (the usual case): its own free list
                capacity._free[s.server_id] = sorted(s.free_gpus)
            else:
                capacity._free[s.server_id] = sorted(g for g in s.healthy_gpus if g not in taken)
        capacity._index()
        return capacity

    @property
    def _biggest_server(self) -> int:
        """Healthy GPUs of the largest schedulable server (worked out when an explanation needs it)."""
        if self._biggest is None:
            self._biggest = max((len(s.gpu_indices) - len(s.unhealthy_gpus) for s in self.servers.values()),
                                default=0)
        return self._biggest

    def free(self, server_id: str) -> tuple[int, ...]:
        return tuple(self._free.get(server_id, ()))

    def free_set(self, server_id: str) -> set[int] | None:
        """The server's free GPUs as a new set (None: the server cannot run training now)."""
        gpus = self._free.get(server_id)
        return None if gpus is None else set(gpus)

    def free_on(self, server_ids: Iterable[str]) -> int:
        return sum(len(self._free.get(sid, ())) for sid in server_ids)

    def largest_block(self) -> int:
        counts = self._free_counts()
        return counts[-1] if counts else 0

    def _free_counts(self) -> list[int]:
        """The distinct free-GPU counts of servers with any free, ascending (kept until a bucket empties or fills:
        placement asks for them with every worker)."""
        counts = self._counts
        if counts is None:
            counts = self._counts = sorted({count for (_, count), sids in self._buckets.items() if sids})
        return counts

    def servers_with_free(self) -> int:
        return sum(len(sids) for sids in self._buckets.values())

    def copy(self) -> FreeCapacity:
        twin = object.__new__(FreeCapacity)
        twin.servers = self.servers
        twin._free = {sid: list(gpus) for sid, gpus in self._free.items()}
        # Each bucket is kept sorted by server id (insort), so this is what a rebuild would give.
        twin._buckets = {key: list(sids) for key, sids in self._buckets.items() if sids}
        twin._counts = self._counts
        twin.total = self.total
        twin._biggest = self._biggest
        twin._explained = dict(self._explained)  # the same free GPUs: the same answers, until either changes
        twin.gpu_types = self.gpu_types
        twin._by_type = dict(self._by_type)
        twin._other_types = self._other_types
        return twin

    # -- taking and giving back -------------------------------------------------------------------

    def _move(self, server_id: str, new_free: list[int]) -> None:
        pool = self.servers[server_id].pool
        old = self._free[server_id]
        if old:
            bucket = self._buckets[(pool, len(old))]
            bucket.remove(server_id)
            if not bucket:
                self._counts = None
        if new_free:
            bucket = self._buckets.setdefault((pool, len(new_free)), [])
            if not bucket:
                self._counts = None
            insort(bucket, server_id)
        self.total += len(new_free) - len(old)
        self._by_type[self.servers[server_id].gpu_type] += len(new_free) - len(old)
        self._free[server_id] = new_free
        if self._explained:
            self._explained.clear()

    def take(self, server_id: str, gpus: Iterable[int]) -> None:
        taken = set(gpus)
        self._move(server_id, [g for g in self._free[server_id] if g not in taken])

    def take_free(self, workers: Iterable[tuple[str, Iterable[int]]]) -> list[tuple[str, frozenset[int]]]:
        """Take those of the (server, GPUs) given that are free here now; what was taken, by server, for the caller
        to give back with ``release_many`` (GPUs kept out of a placement for a while)."""
        taken = []
        for server_id, gpus in workers:
            free = self._free.get(server_id)
            hit = frozenset(gpus).intersection(free) if free else frozenset()
            if hit:
                self.take(server_id, hit)
                taken.append((server_id, hit))
        return taken

    def set_free(self, server_id: str, gpus: Iterable[int]) -> None:
        """Make ``gpus`` the server's free GPUs: the net effect of several takes and releases at once."""
        new_free = sorted(gpus)
        if server_id in self._free and new_free != self._free[server_id]:
            self._move(server_id, new_free)

    def release_many(self, workers: Iterable[tuple[str, Iterable[int]]]) -> None:
        """``release`` of several workers' (server, GPUs) at once: one update per server."""
        union: dict[str, set[int]] = {}
        for server_id, gpus in workers:
            if server_id in self._free:
                free = union.get(server_id)
                if free is None:
                    free = union[server_id] = set(self._free[server_id])
                free.update(gpus)
        for server_id, free in union.items():
            self.set_free(server_id, free)

    def release(self, server_id: str, gpus: Iterable[int]) -> None:
        """Give GPUs back (a worker removed by this plan)."""
        if server_id in self._free:
            self._move(server_id, sorted({*self._free[server_id], *gpus}))

    # -- placing ----------------------------------------------------------------------------------

    def _best_server(self, gpus: int, pools: tuple[Pool | None, ...], exclude: frozenset[str]) -> str | None:
        counts = self._free_counts()
        counts = counts[bisect_left(counts, gpus):]
        for pool in pools:  # step 4: preferred pool first
            group = _ALL_POOLS if pool is None else (pool,)
            for count in counts:  # step 5: best fit, the fewest free GPUs that still fit
                best = None
                for p in group:
                    for sid in self._buckets.get((p, count), ()):
                        if sid not in exclude:  # step 2
                            best = sid if best is None else min(best, sid)
                            break
                if best is not None:
                    return best
        return None

    def place_gang(
        self, job: JobView, num_workers: int, first_rank: int = 0, *,
        pools: tuple[Pool | None, ...] = ANY_POOL, exclude: frozenset[str] = frozenset(),
        gpu_types: tuple[str, ...] | None = None,
    ) -> tuple[WorkerPlacement, ...] | None:
        """Place ``num_workers`` workers of ``job``, one at a time; all or nothing, all on one GPU type
        (step 3): one of ``gpu_types`` (default: the job's own request; (): any). On success the GPUs
        are taken from this capacity; on failure nothing changes."""
        types = job.gpu_types if gpu_types is None else gpu_types
        present = self.gpu_types
        if len(present) <= 1:  # one type (the usual cluster): the job's request either holds or not
            if types and not (present and present[0] in types):
                return None
            return self._place_gang(job, num_workers, first_rank, pools, exclude)
        for gpu_type in self.type_order(types):
            placed = self._place_gang(job, num_workers, first_rank, pools, exclude | self._not_of_type(gpu_type))
            if placed is not None:
                return placed
        return None

    def type_order(self, types: tuple[str, ...]) -> list[str]:
        """The GPU types to try a gang on: those asked for, in the job's order, or (none asked) every
        type here, the most free GPUs first."""
        if types:
            return [t for t in types if t in self.gpu_types]
        free = self.free_by_type()
        return sorted(free, key=lambda t: (-free[t], t))

    def free_by_type(self) -> dict[str, int]:
        """Free GPUs of each GPU type here (0 for a type with none free)."""
        return dict(self._by_type)

    def _not_of_type(self, gpu_type: str) -> frozenset[str]:
        others = self._other_types.get(gpu_type)
        if others is None:
            others = self._other_types[gpu_type] = frozenset(
                sid for sid, s in self.servers.items() if s.gpu_type != gpu_type)
        return others

    def free_of_types(self, types: tuple[str, ...]) -> int:
        return sum(len(g) for sid, g in self._free.items() if self.servers[sid].gpu_type in types)

    def _place_gang(self, job: JobView, num_workers: int, first_rank: int, pools: tuple[Pool | None, ...],
                    exclude: frozenset[str]) -> tuple[WorkerPlacement, ...] | None:
        if num_workers * job.gpus_per_worker > self.total:
            return None
        placed: list[WorkerPlacement] = []
        for rank in range(first_rank, first_rank + num_workers):
            sid = self._best_server(job.gpus_per_worker, pools, exclude)
            if sid is None:
                for w in placed:  # roll back
                    self.release(w.server_id, w.gpu_indices)
                return None
            gpus = tuple(self._free[sid][: job.gpus_per_worker])
            self.take(sid, gpus)
            placed.append(WorkerPlacement(rank=rank, server_id=sid, gpu_indices=gpus))
        return tuple(placed)

    def explain_unplaceable(self, job: JobView, num_workers: int) -> tuple[Reason, str]:
        """Why ``place_gang`` failed, in the numbers a user can act on. Kept per gang shape until the
        capacity next changes: a long queue asks it of 10,000s of jobs of a few shapes, and each answer
        counts over every server."""
        shape = (job.gpus_per_worker, num_workers, job.gpu_types)
        known = self._explained.get(shape)
        if known is None:
            known = self._explained[shape] = self._explain(*shape)
        return known

    def _explain(self, gpus_per_worker: int, num_workers: int, gpu_types: tuple[str, ...]) -> tuple[Reason, str]:
        need = f"needs {num_workers} worker(s) x {gpus_per_worker} GPU(s) as a gang"
        if not self.servers:
            return Reason.NO_TRAINING_CAPACITY, f"{need}; no server can run training right now"
        if self._biggest_server < gpus_per_worker:
            return (
                Reason.WORKER_TOO_LARGE,
                f"{need}; the largest schedulable server has {self._biggest_server} healthy GPU(s)",
            )
        if gpu_types:
            kinds = ", ".join(gpu_types)
            of_type = [s for s in self.servers.values() if s.gpu_type in gpu_types]
            if not of_type:
                return (Reason.WAITING_FOR_GPU_TYPE, f"{need} on GPU type(s) {kinds}; no schedulable server has "
                        f"that type (types here: {', '.join(t or '(unknown)' for t in self.gpu_types)})")
            return (Reason.WAITING_FOR_GPU_TYPE, f"{need} on GPU type(s) {kinds}; free now: "
                    f"{self.free_of_types(gpu_types)} GPU(s) of that type on {len(of_type)} server(s)")
        return (
            Reason.WAITING_FOR_GANG,
            f"{need}; free now: {self.total} GPU(s) on {self.servers_with_free()} server(s), "
            f"largest block {self.largest_block()}",
        )
