"""Configurations on a heterogeneous cluster: (GPU type, nodes, GPUs) per job, and the plan that places them.

Shared by the policies that decide a job's *configuration* -- which GPU type, how many GPUs -- and leave
the nodes to placement (``sia``, ``gavel``; issue 33). Nouns:

- a *pool* is the servers of one GPU type that may run training now (training-owned or loaned, not
  cordoned), with their GPUs per node (the largest server's count);
- a *configuration* of a pool is ``(gpu_type, nodes, gpus)``: Sia's list (SOSP'23, sec. 3.3): 1, 2, 4 ...
  GPUs (powers of two below a node's size) on one node, then 1, 2, ... whole nodes, up to
  ``MAX_CONFIG_GPUS`` GPUs;
- *one type per job* (the placement constraint this module enforces): every GPU of a job is of one type.
  Sia assumes this for data-parallel jobs (its configurations are per type), as Gavel does.

``plan_configurations`` turns decided configurations into a ``Plan``: a job whose configuration is
unchanged keeps its GPUs (no restart); one decided none is preempted; the others are placed, largest
first: a multi-node configuration on whole free nodes of its type, a one-node one on the free node of its
type that fits it most tightly (best fit), a gang split over the freest nodes only where no node fits it
whole. What this module must never do: decide a configuration (the policies do), or write anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scheduler_service.core.plan import KeepPending, Plan, PreemptJob, Reason, ScaleJob, StartJob, WorkerPlacement
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.lifecycle import JobState

MAX_CONFIG_GPUS = 64  # the largest configuration Sia considers (its simulator's limit)

Config = tuple[str, int, int]  # (GPU type, nodes, GPUs)


@dataclass(frozen=True, slots=True)
class GpuPool:
    """The servers of one GPU type that may run training now, in id order."""

    gpu_type: str
    gpus_per_node: int
    servers: tuple[str, ...]

    @property
    def nodes(self) -> int:
        return len(self.servers)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


def gpu_pools(snapshot: ClusterSnapshot) -> tuple[GpuPool, ...]:
    """The snapshot's pools, by GPU type name ("" for servers of no declared type)."""
    by_type: dict[str, list[tuple[str, int]]] = {}
    for server in snapshot.servers:
        if server.runs_training and not server.cordoned and server.healthy_gpus:
            by_type.setdefault(server.gpu_type, []).append((server.server_id, len(server.gpu_indices)))
    return tuple(GpuPool(t, max(n for _, n in members), tuple(sorted(s for s, _ in members)))
                 for t, members in sorted(by_type.items()))


def configurations(pool: GpuPool, max_nodes: int | None = None) -> tuple[Config, ...]:
    """Sia's configurations of ``pool`` (module doc), at most ``max_nodes`` nodes (default: the pool's)."""
    nodes = pool.nodes if max_nodes is None else min(pool.nodes, max_nodes)
    if nodes < 1:
        return ()
    per = pool.gpus_per_node
    out: list[Config] = []
    size = 1
    while size < per:
        out.append((pool.gpu_type, 1, size))
        size *= 2
    for k in range(1, nodes + 1):
        if k * per > MAX_CONFIG_GPUS:
            break
        out.append((pool.gpu_type, k, k * per))
    return tuple(out)


def fits_job(job: JobView, config: Config) -> bool:
    """Whether ``job`` may run in ``config``: a type it accepts, whole workers within its range, and a
    one-node configuration for a worker of several GPUs only where the worker fits a node."""
    gpu_type, _, gpus = config
    if job.gpu_types and gpu_type not in job.gpu_types:
        return False
    per = max(1, job.gpus_per_worker)
    return gpus % per == 0 and job.min_workers <= gpus // per <= job.max_workers


def current_config(job: JobView, type_of: Mapping[str, str]) -> Config | None:
    """The configuration ``job`` runs in now (None: it holds no GPU)."""
    if not job.workers:
        return None
    servers = {w.server_id for w in job.workers}
    gpus = sum(len(w.gpu_indices) for w in job.workers)
    return type_of.get(job.workers[0].server_id, ""), len(servers), gpus


def server_types(snapshot: ClusterSnapshot) -> dict[str, str]:
    return {s.server_id: s.gpu_type for s in snapshot.servers}


def plan_configurations(snapshot: ClusterSnapshot, active: Sequence[JobView], decided: Mapping[int, Config | None],
                        *, who: str, why_waiting: str, why_preempted: str) -> Plan:
    """The plan that runs each of ``active`` (PENDING and RUNNING jobs) in its decided configuration
    (a job missing from ``decided`` keeps what it has). See the module doc for the placement rules.

    Never a GPU swap: a plan in which two resized jobs take each other's GPUs has no apply order
    (``core.plan.apply_order``), so a resized job caught in such a cycle is preempted instead (it
    restarts at its configuration next cycle)."""
    type_of = server_types(snapshot)
    pools = {p.gpu_type: p for p in gpu_pools(snapshot)}
    free: dict[str, set[int]] = {}
    for server in snapshot.servers:
        if server.runs_training and not server.cordoned:
            free[server.server_id] = set(server.free_gpus)
    moving: list[tuple[JobView, Config]] = []
    preempt: list[JobView] = []
    pending: list[KeepPending] = []
    for job in active:
        now_config = current_config(job, type_of)
        want = decided.get(job.job_id, now_config)
        if want == now_config or (want is not None and now_config is not None and _same(want, now_config)):
            if job.state == JobState.PENDING:
                pending.append(KeepPending(job.job_id, Reason.WAITING_FOR_GANG, f"{who}: {why_waiting}"))
            continue
        if want is None:
            if job.state == JobState.RUNNING:
                preempt.append(job)
            else:
                pending.append(KeepPending(job.job_id, Reason.WAITING_FOR_GANG, f"{who}: {why_waiting}"))
            continue
        if job.state == JobState.RUNNING:  # its own GPUs are free for its new configuration
            for w in job.workers:
                free.setdefault(w.server_id, set()).update(w.gpu_indices)
        moving.append((job, want))
    for job in preempt:
        for w in job.workers:
            free.setdefault(w.server_id, set()).update(w.gpu_indices)
    starts: list[StartJob] = []
    scales: list[ScaleJob] = []
    # Largest configurations first (whole nodes are scarce), then arrival.
    for job, (gpu_type, nodes, gpus) in sorted(moving, key=lambda m: (-m[1][2], m[0].submitted_at, m[0].job_id)):
        pool = pools.get(gpu_type)
        per_worker = max(1, job.gpus_per_worker)
        chosen = _place(pool, free, nodes, gpus, per_worker) if pool is not None else None
        if chosen is None:
            if job.state == JobState.RUNNING:  # its GPUs stay released: stopped, it queues again
                preempt.append(job)
            else:
                pending.append(KeepPending(job.job_id, Reason.WAITING_FOR_GPU_TYPE,
                                           f"{who}: no placement of {gpus} {gpu_type or 'GPU'} GPU(s) "
                                           f"on {nodes} node(s) fits the free GPUs"))
            continue
        workers = _workers(chosen, per_worker)
        message = f"{who}: {gpus} {gpu_type or 'GPU'} GPU(s) on {len(chosen)} node(s)"
        if job.state == JobState.PENDING:
            starts.append(StartJob(job.job_id, workers, Reason.PLACED, message))
        else:
            scales.append(ScaleJob(job.job_id, workers, Reason.SCALED_OUT if gpus > job.num_workers * per_worker
                                   else Reason.SCALED_IN, message))
    plan = Plan(starts=tuple(starts), scales=tuple(scales),
                preemptions=tuple(PreemptJob(j.job_id, Reason.PREEMPTED_BY_POLICY, f"{who}: {why_preempted}")
                                  for j in sorted(preempt, key=lambda j: j.job_id)),
                pending=tuple(pending))
    return _without_swaps(plan, active, who)


def _same(a: Config, b: Config) -> bool:
    return a[0] == b[0] and a[2] == b[2]  # its type and GPU count: however its GPUs are spread


def _place(pool: GpuPool, free: dict[str, set[int]], nodes: int, gpus: int,
           per_worker: int) -> list[tuple[str, list[int]]] | None:
    """GPUs for a configuration, taken from ``free`` (None, and nothing taken, if none fits)."""
    per = pool.gpus_per_node
    servers = [s for s in pool.servers if s in free]
    chosen: list[tuple[str, list[int]]] = []
    if (gpus >= per and nodes > 1) or gpus == per:
        whole = [s for s in servers if len(free[s]) >= per]
        if len(whole) >= math.ceil(gpus / per):
            left = gpus
            for s in whole:
                take = sorted(free[s])[:min(per, left)]
                chosen.append((s, take))
                left -= len(take)
                if left == 0:
                    break
    else:  # one node: the tightest fit
        fits = sorted((len(free[s]), s) for s in servers if len(free[s]) >= gpus)
        if fits:
            s = fits[0][1]
            chosen.append((s, sorted(free[s])[:gpus]))
    if not chosen:  # split over the freest nodes, whole workers each
        left = gpus
        for s in sorted(servers, key=lambda s: (-len(free[s]), s)):
            count = (min(len(free[s]), left) // per_worker) * per_worker
            if count:
                chosen.append((s, sorted(free[s])[:count]))
                left -= count
            if left == 0:
                break
        if left:
            return None
    for s, taken in chosen:
        free[s].difference_update(taken)
    return chosen


def _workers(chosen: list[tuple[str, list[int]]], per_worker: int) -> tuple[WorkerPlacement, ...]:
    out: list[WorkerPlacement] = []
    for server, gpus in chosen:
        for i in range(0, len(gpus), per_worker):
            out.append(WorkerPlacement(len(out), server, tuple(gpus[i:i + per_worker])))
    return tuple(out)


def _without_swaps(plan: Plan, active: Sequence[JobView], who: str) -> Plan:
    """Break each cycle of GPU moves by stopping one of its resized jobs (the lowest id), until the plan
    has an apply order (a swap of two jobs: one moves now, the other at the next cycle)."""
    from scheduler_service.core.plan import unorderable

    held = {j.job_id: [(w.server_id, g) for w in j.workers for g in w.gpu_indices] for j in active if j.workers}
    while True:
        stuck = sorted(a.job_id for a in unorderable(plan, held) if isinstance(a, ScaleJob))
        if not stuck:
            return plan
        key = stuck[0]
        plan = Plan(starts=plan.starts, scales=tuple(s for s in plan.scales if s.job_id != key),
                    preemptions=plan.preemptions + (PreemptJob(key, Reason.PREEMPTED_TO_MOVE,
                                                               f"{who}: to move to GPUs freed by this plan"),),
                    pending=plan.pending)
