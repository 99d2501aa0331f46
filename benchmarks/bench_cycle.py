"""One full decision of the Aryl policy at scale: 1,250 servers (10,000 GPUs), 5,000 jobs; and the same
cluster with a long queue behind it, of mixed jobs (``aryl_cycle_long_queue``) or a job array
(``aryl_cycle_array_queue``).

The snapshot is synthetic and seeded: 1,000 training and 250 inference servers of 8 GPUs (half of the
inference servers on loan), jobs of 1-8 GPUs per worker, 1-4 base workers, half of them elastic, about
half running and the rest queued, with an inference demand that forces a reclaim of 20 servers. The
figure is ``policy.schedule(snapshot)`` p50/p99 (the pure core: loan cycle, base demands, knapsack);
the reference is the ``fifo`` policy on the same snapshot. Every plan is checked against the invariants
once (outside the timing). ``aryl_cycle`` also times ``pollux`` on the same snapshot (its figure
``pollux_cycle_decide_p50``, with ``aryl``'s as the reference): the peer the allocator is measured against.
``aryl_cycle_equal_values`` is the adversarial case for the sizing's knapsack: every job of one shape and
one estimate, so thousands of items tie and no value separates them.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import statistics
import time

from benchmarks import emit_figure
from benchmarks.harness import QUICK, BenchContext, Benchmark
from scheduler_service.core import ClusterSnapshot, DemandView, JobView, ServerView, WorkerView
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.policies import create_policy

log = logging.getLogger("aryl.bench")
NOW = 1_000_000.0


def synthetic_cluster(servers: int, jobs: int, seed: int = 0, checkpointed_s: float | None = None,
                      gpu_types: tuple[tuple[str, float], ...] = ()) -> ClusterSnapshot:
    """``checkpointed_s``: every running job last checkpointed that long ago (None: never), so that at most
    ``restart_cost_s`` makes each one a candidate of ``aryl``'s preempt-to-admit. ``gpu_types``: (type, declared
    speed) pairs; the training servers, then the inference servers, split into that many equal runs, one type each
    (every job's workers on one type, as placement keeps them). None: one unnamed type."""
    rng = random.Random(seed)
    n_infer = servers // 5

    def kind(k: int, of: int) -> str:
        return gpu_types[k * len(gpu_types) // of][0] if gpu_types else ""

    views = [ServerView(f"t{k:04d}", Pool.TRAINING, ServerState.TRAINING, tuple(range(8)),
                        gpu_type=kind(k, servers - n_infer))
             for k in range(servers - n_infer)]
    for k in range(n_infer):
        loaned = k < n_infer // 2
        views.append(ServerView(f"i{k:04d}", Pool.INFERENCE, ServerState.LOANED if loaned else ServerState.SERVING,
                                tuple(range(8)), state_since=NOW - rng.uniform(600, 7200),
                                loan_started_at=NOW - rng.uniform(600, 7200) if loaned else None,
                                gpu_type=kind(k, n_infer)))
    capacity = FreeCapacity.of(ClusterSnapshot(NOW, tuple(views), ()))
    job_views: list[JobView] = []
    held: dict[str, list[tuple[int, int]]] = {}
    for jid in range(1, jobs + 1):
        gpus = rng.choice([1, 1, 2, 4, 8])
        low = rng.randint(1, 4)
        high = low + (rng.randint(1, 8) if rng.random() < 0.5 else 0)
        runtime = rng.lognormvariate(8, 1.5)
        view = JobView(jid, JobState.PENDING, gpus, low, high, 0, NOW - rng.uniform(0, 20000),
                       estimated_runtime_s=runtime)
        if rng.random() < 0.5:
            placed = capacity.place_gang(view, low)
            if placed:
                workers = tuple(WorkerView(w.rank, w.server_id, w.gpu_indices) for w in placed)
                view = JobView(jid, JobState.RUNNING, gpus, low, high, 0, view.submitted_at, workers=workers,
                               estimated_runtime_s=runtime, started_at=NOW - 3600, last_resized_at=NOW - 3600,
                               last_checkpoint_at=None if checkpointed_s is None else NOW - checkpointed_s)
                for w in placed:
                    held.setdefault(w.server_id, []).extend((g, jid) for g in w.gpu_indices)
        job_views.append(view)
    servers_out = tuple(
        ServerView(s.server_id, s.pool, s.state, s.gpu_indices, s.unhealthy_gpus,
                   tuple(sorted(held.get(s.server_id, []))), s.state_since, s.loan_started_at, gpu_type=s.gpu_type)
        for s in views
    )
    serving = sum(1 for s in views if s.state == ServerState.SERVING)
    return ClusterSnapshot(NOW, servers_out, tuple(job_views), DemandView(serving + 20, 1000.0, NOW),
                           gpu_speed=gpu_types)


def with_finished(snapshot: ClusterSnapshot, share: float, seed: int = 0) -> ClusterSnapshot:
    """``snapshot`` after ``share`` of its running jobs (seeded choice) finished: gone, their GPUs free."""
    rng = random.Random(seed)
    gone = {j.job_id for j in snapshot.jobs if j.workers and rng.random() < share}
    servers = tuple(dataclasses.replace(s, allocated=tuple(a for a in s.allocated if a[1] not in gone))
                    for s in snapshot.servers)
    return dataclasses.replace(snapshot, servers=servers, jobs=tuple(j for j in snapshot.jobs if j.job_id not in gone))


def long_queue_cluster(servers: int, jobs: int, queued: int, seed: int = 0) -> ClusterSnapshot:
    """``synthetic_cluster`` with ``queued`` more jobs waiting behind it, half of them of a higher priority
    class than every running job (a burst of urgent work on a busy cluster), the running jobs started or
    resized 0-600 s ago (about half in their protection window, ``policy.min_resize_interval_s``)."""
    rng = random.Random(seed)
    base = synthetic_cluster(servers, jobs, seed)
    held = tuple(dataclasses.replace(j, last_resized_at=NOW - rng.uniform(0, 600)) if j.workers else j
                 for j in base.jobs)
    waiting = tuple(
        JobView(jid, JobState.PENDING, rng.choice([1, 1, 2, 4, 8]), rng.randint(1, 4), 4, 0,
                NOW - rng.uniform(0, 3000), estimated_runtime_s=rng.lognormvariate(8, 1.5),
                priority_class=100 if rng.random() < 0.5 else 0)
        for jid in range(jobs + 1, jobs + queued + 1)
    )
    return dataclasses.replace(base, jobs=held + waiting)


def array_queue_cluster(servers: int, jobs: int, array: int, seed: int = 0) -> ClusterSnapshot:
    """``synthetic_cluster`` with a job array of ``array`` jobs queued behind it (``arylctl submit
    --array``): one shape (2 workers x 1 GPU), one estimate, submitted at one instant."""
    base = synthetic_cluster(servers, jobs, seed)
    waiting = tuple(JobView(jid, JobState.PENDING, 1, 2, 2, 0, NOW - 60, estimated_runtime_s=3600.0)
                    for jid in range(jobs + 1, jobs + array + 1))
    return dataclasses.replace(base, jobs=base.jobs + waiting)


def equal_values_cluster(servers: int, jobs: int, seed: int = 0) -> ClusterSnapshot:
    """``synthetic_cluster``'s servers and running/queued split, but every job one shape (1 GPU per worker,
    1..8 workers, elastic) with one estimate (1 h) and one submission time: the sizing's values all tie."""
    base = synthetic_cluster(servers, jobs, seed)
    same = tuple(dataclasses.replace(j, gpus_per_worker=1, min_workers=1, max_workers=8, submitted_at=NOW - 600,
                                     estimated_runtime_s=3600.0, workers=(), started_at=None,
                                     last_resized_at=None, state=JobState.PENDING)
                 for j in base.jobs)
    servers_free = tuple(dataclasses.replace(s, allocated=()) for s in base.servers)
    rng = random.Random(seed)
    capacity = FreeCapacity.of(dataclasses.replace(base, servers=servers_free, jobs=()))
    held: dict[str, list[tuple[int, int]]] = {}
    placed_jobs = []
    for job in same:
        if rng.random() < 0.5 and (placed := capacity.place_gang(job, 2)):
            job = dataclasses.replace(job, state=JobState.RUNNING, started_at=NOW - 3600, last_resized_at=NOW - 3600,
                                      workers=tuple(WorkerView(w.rank, w.server_id, w.gpu_indices) for w in placed))
            for w in placed:
                held.setdefault(w.server_id, []).extend((g, job.job_id) for g in w.gpu_indices)
        placed_jobs.append(job)
    servers_out = tuple(dataclasses.replace(s, allocated=tuple(sorted(held.get(s.server_id, []))))
                        for s in servers_free)
    return dataclasses.replace(base, servers=servers_out, jobs=tuple(placed_jobs))


def cycle_bench(ctx: BenchContext) -> None:
    quick = ctx.sizes is QUICK
    servers, jobs, runs = (250, 1000, 5) if quick else (1250, 5000, 20)
    snapshot = synthetic_cluster(servers, jobs)
    aryl_p50 = _decisions(snapshot, runs, "aryl_cycle", dict(servers=servers, jobs=jobs), target=200)
    # The peer on the same snapshot: a few runs (one pollux decision here takes seconds).
    pollux = create_policy("pollux", PolicyParams())
    plan = pollux.schedule(snapshot)
    problems = check_plan(snapshot, plan)
    if problems:
        raise AssertionError(f"pollux plan breaks invariants: {problems[:3]}")
    samples = []
    for _ in range(3 if not quick else 1):
        start = time.perf_counter()
        pollux.schedule(snapshot)
        samples.append((time.perf_counter() - start) * 1e3)
    emit_figure("pollux_cycle_decide_p50", statistics.median(samples), "ms", servers=servers, jobs=jobs,
                gpus=sum(len(s.gpu_indices) for s in snapshot.servers), runs=len(samples),
                reference_name="aryl_cycle_decide_p50", reference_value=aryl_p50, reference_unit="ms")


def preempt_bench(ctx: BenchContext) -> None:
    quick = ctx.sizes is QUICK
    servers, jobs, runs = (250, 1000, 5) if quick else (1250, 5000, 20)
    _decisions(synthetic_cluster(servers, jobs, checkpointed_s=30.0), runs, "aryl_cycle_preempt",
               dict(servers=servers, jobs=jobs), target=200)


def equal_values_bench(ctx: BenchContext) -> None:
    quick = ctx.sizes is QUICK
    servers, jobs, runs = (250, 1000, 5) if quick else (1250, 5000, 20)
    _decisions(equal_values_cluster(servers, jobs), runs, "aryl_cycle_equal_values",
               dict(servers=servers, jobs=jobs), target=200)


def long_queue_bench(ctx: BenchContext) -> None:
    quick = ctx.sizes is QUICK
    servers, jobs, queued, runs = (250, 1000, 4000, 3) if quick else (1250, 5000, 20_000, 5)
    _decisions(long_queue_cluster(servers, jobs, queued), runs, "aryl_cycle_long_queue",
               dict(servers=servers, jobs=jobs + queued, queued=queued))


def array_queue_bench(ctx: BenchContext) -> None:
    quick = ctx.sizes is QUICK
    servers, jobs, array, runs = (250, 1000, 4000, 3) if quick else (1250, 5000, 20_000, 5)
    _decisions(array_queue_cluster(servers, jobs, array), runs, "aryl_cycle_array_queue",
               dict(servers=servers, jobs=jobs + array, queued=array))


# Two GPU types, the second a third as fast as the first (an A100 against an older generation): ``aryl`` values a
# worker by its type's speed, starts a gang on the type where it runs fastest at the room there, and moves a job to
# another type when that pays the cluster (``policies.aryl.base.move_to_faster_types``).
TWO_TYPES = (("fast", 3.0), ("slow", 1.0))


def two_types_bench(ctx: BenchContext) -> None:
    quick = ctx.sizes is QUICK
    servers, jobs, runs = (250, 1000, 5) if quick else (1250, 5000, 10)
    # A quarter of the running jobs finished: free GPUs on both types, so jobs start, grow and move.
    snapshot = with_finished(synthetic_cluster(servers, jobs, gpu_types=TWO_TYPES), 0.25)
    _decisions(snapshot, runs, "aryl_cycle_two_types", dict(servers=servers, jobs=len(snapshot.jobs)), target=200)


def _decisions(snapshot: ClusterSnapshot, runs: int, figure: str, sizes: dict[str, int],
               target: float | None = None) -> float:
    """``aryl`` and ``fifo`` decisions on ``snapshot``, ``runs`` of each: ``<figure>_decide_p50``/``_max``;
    returns ``aryl``'s p50 (ms)."""
    params = PolicyParams()
    gpus = sum(len(s.gpu_indices) for s in snapshot.servers)
    timings = {}
    for name in ("aryl", "fifo"):
        policy = create_policy(name, params)
        plan = policy.schedule(snapshot)  # warm-up: numba kernels load from the on-disk cache
        problems = check_plan(snapshot, plan)
        if problems:
            raise AssertionError(f"{name} plan breaks invariants: {problems[:3]}")
        samples = []
        for _ in range(runs):
            start = time.perf_counter()
            policy.schedule(snapshot)
            samples.append((time.perf_counter() - start) * 1e3)
        timings[name] = (statistics.median(samples), max(samples))
        log.info("%s: %d starts, %d scales, %d preemptions, %d server steps", name, len(plan.starts),
                 len(plan.scales), len(plan.preemptions), len(plan.server_actions))
    common = dict(**sizes, gpus=gpus, runs=runs, reference_name="fifo_schedule_p50",
                  reference_value=timings["fifo"][0], reference_unit="ms")
    emit_figure(f"{figure}_decide_p50", timings["aryl"][0], "ms", target=target, **common)
    emit_figure(f"{figure}_decide_max", timings["aryl"][1], "ms", **common)
    return timings["aryl"][0]


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("aryl_cycle", cycle_bench,
              "one Aryl policy decision at 1,250 servers / 10,000 GPUs / 5,000 jobs: p50 vs fifo on the same snapshot, "
              "and pollux's decision on it beside aryl's"),
    Benchmark("aryl_cycle_preempt", preempt_bench,
              "aryl_cycle's cluster with every running job checkpointed 30 s ago, so every one is a candidate of "
              "preempt-to-admit (its worst case): p50 vs fifo"),
    Benchmark("aryl_cycle_equal_values", equal_values_bench,
              "the same cluster with every job of one shape and estimate (the sizing's values all tie): p50 vs fifo"),
    Benchmark("aryl_cycle_long_queue", long_queue_bench,
              "the same cluster with 20,000 more jobs queued, half of a higher priority class than every running "
              "job: p50 vs fifo on the same snapshot"),
    Benchmark("aryl_cycle_array_queue", array_queue_bench,
              "the same cluster with a job array of 20,000 jobs of one shape queued: p50 vs fifo on the same "
              "snapshot"),
    Benchmark("aryl_cycle_two_types", two_types_bench,
              "the same cluster on two GPU types (one 3x as fast), a quarter of its running jobs finished so that "
              "jobs start, grow and move between types: p50 vs fifo"),
)
