"""The simulated cluster: the scheduling cycle's ``ClusterState`` port, in memory, with simulated agents.

``snapshot()`` and ``apply()`` have the service's semantics (``scheduler_service.app.cluster``);
only the storage differs (dicts instead of tables) and the agents, which are simulated. The policy and
the cycle cannot tell the two apart. The applier's rules are not here but in
``scheduler_service.core.apply_rules``, which the service's applier calls too (they read this module's
records, ``simulator.cluster_records``, through ``RecordFacts``); ``tests/contract/test_apply_contract.py`` holds
the appliers to the same results. What a run records is ``simulator.outcomes``. What this module must
never do: decide anything (placement, loans, sizes are the policy's) or look at which policy runs.

The cluster is three layers, one module each: its state and what the engine drives (here), the plan's
application (``simulator.cluster_apply.PlanApplication``) and the jobs' physics
(``simulator.cluster_progress.SegmentProgress``: segments, checkpoints, GPU-seconds lost, useful spans).

Nouns:
- *Segment*: the stretch of a job's life at one placement (``simulator.cluster_progress``).
- *Simulated agents*, the assumptions (each documented where it is applied):
  - every desired-state change is carried out at once; agents always report converged
    (``agent_converged`` is True), so a RECLAIMING server is vacated at once and returns to serving at
    the next cycle, which its agent's report calls for (``simulator.engine`` runs it as soon as the cycle
    gap allows);
  - a start, restart or resize costs ``restart_overhead_s`` without progress at the segment's start;
  - a job checkpoints every ``checkpoint_interval_s`` after the start of its segment, and at every
    graceful resize (a ScaleJob: checkpoint, stop, restart at the new size -- torchrun elastic);
  - a preemption loses the work done since the last checkpoint; the job resumes from it when placed
    again;
  - the router acknowledges a drain ``drain_ack_s`` after the LOAN step (its in-flight requests
    finish), as the service hears it from the router (``ServerView.drained``); None: no router, the
    policy waits ``drain_timeout_s``;
  - an injected *server failure* (``fail_server``) makes the server LOST, as the service's liveness
    check does when an agent goes silent: its allocations stay in the snapshot until a plan evicts
    them (the policy decides: ``scheduler_service.core.faults``), and an open loan ends. Its workers
    died without a checkpoint, so a job shrunk or requeued off a LOST server falls back to its last
    checkpoint -- told from this cluster's state (a dropped worker was on a LOST server), never from
    the plan's reason. A repair (``repair_server``) brings it back to its home state; a server
    repaired before any cycle evicted its jobs comes back with them (as a service's server whose
    agent reports again first);
  - a GPU's health changes when ``set_gpu_health`` says so (the service hears it in an agent's
    report): an unhealthy GPU shows in the snapshot and takes no new worker; a worker already on it
    runs on;
  - progress reporting is perfect: ``work_done`` in the snapshot is the job's true progress at ``now``.
- *Declared length*: the job's view shows ``TraceJob.declared_work`` / ``declared_runtime_s`` where
  the trace sets them (``simulator.estimates``: a noisy or no user estimate), else its true ``work``;
  the truth alone drives progress and completion.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from math import floor

from scheduler_service.core.apply_rules import DEFAULT_APPLY_SETTINGS, ApplySettings, LoanState
from scheduler_service.core.clock import Clock
from scheduler_service.core.snapshot import (
    AdminState,
    ClusterSnapshot,
    DemandView,
    JobView,
    ServerView,
    WorkerView,
)
from scheduler_service.core.throughput import ThroughputModel
from scheduler_service.lifecycle import (
    JOB_LIFECYCLE,
    JobState,
    Pool,
    ServerState,
    home_state,
)
from simulator.cluster_apply import PlanApplication
from simulator.cluster_records import ON_LOAN_STATES, JobRecord, ServerRecord
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.outcomes import JobOutcome, ServerOutcome, UtilisationSample, same_levels


class SimulatedCluster(PlanApplication):
    """The ``ClusterState`` port (``snapshot`` + ``apply``) over an in-memory cluster, plus what the
    engine drives: ``submit`` (a job arrives), ``set_demand`` (the inference demand changes),
    ``complete_due`` (jobs that finished their work by now)."""

    def __init__(
        self,
        spec: ClusterSpec,
        clock: Clock,
        *,
        restart_overhead_s: float = 30.0,
        checkpoint_interval_s: float = 1800.0,
        drain_ack_s: float | None = 1.0,
        apply_settings: ApplySettings = DEFAULT_APPLY_SETTINGS,
        training_server_ids: Sequence[str] | None = None,
    ) -> None:
        """``training_server_ids``: the training servers' names, one per server (default ``t0000``..)."""
        if restart_overhead_s < 0:
            raise ValueError(f"restart_overhead_s must be >= 0 (got {restart_overhead_s})")
        if not checkpoint_interval_s > 0:
            raise ValueError(f"checkpoint_interval_s must be > 0 (got {checkpoint_interval_s})")
        if spec.gpus_per_server < 1 or spec.training_servers < 0 or spec.inference_servers < 0:
            raise ValueError(f"invalid cluster spec {spec}")
        self.spec = spec
        self._clock = clock
        self.restart_overhead_s = float(restart_overhead_s)
        self.checkpoint_interval_s = float(checkpoint_interval_s)
        # What a plan is applied under, as the service applies it (a RECLAIM step's hard deadline).
        self.apply_settings = apply_settings
        # The router's drain acknowledgement, this long after a LOAN step; None (or < 0): no router.
        self.drain_ack_s = float(drain_ack_s) if drain_ack_s is not None and drain_ack_s >= 0 else None
        self._drain_acks: dict[str, float] = {}  # DRAINING server -> when the router acknowledges it
        gpus = tuple(range(spec.gpus_per_server))
        names = [f"t{k:04d}" for k in range(spec.training_servers)] if training_server_ids is None else \
            list(training_server_ids)
        if len(names) != spec.training_servers or len(set(names)) != len(names):
            raise ValueError(f"{spec.training_servers} training servers need as many distinct names, not {names}")
        servers = [ServerRecord(name, Pool.TRAINING, gpus, home_state(Pool.TRAINING)) for name in names]
        servers += [ServerRecord(f"i{k:04d}", Pool.INFERENCE, gpus, home_state(Pool.INFERENCE),
                            gpu_type=spec.inference_gpu_type)
                    for k in range(spec.inference_servers)]
        if spec.training_gpu_types:  # typed training servers, in id order
            types = [t for t, count in spec.training_gpu_types for _ in range(count)]
            if len(types) != spec.training_servers:
                raise ValueError(f"training_gpu_types name {len(types)} servers; the cluster has "
                                 f"{spec.training_servers} training servers")
            for server, gpu_type in zip(servers[: spec.training_servers], types, strict=True):
                server.gpu_type = gpu_type
        self._speed = dict(spec.gpu_speed)
        servers.sort(key=lambda s: s.server_id)  # the service lists servers by id
        self._servers: dict[str, ServerRecord] = {s.server_id: s for s in servers}
        self.server_outcomes: dict[str, ServerOutcome] = {s.server_id: ServerOutcome(s.server_id, s.pool)
                                                          for s in servers}
        # Active jobs (PENDING, RUNNING, SCALING) by id, kept in id order (the service's snapshot order).
        self._active: dict[int, JobRecord] = {}
        self._active_in_order = True
        self._running: dict[int, JobRecord] = {}
        self.outcomes: dict[int, JobOutcome] = {}
        self._completions: list[tuple[float, int, int]] = []  # heap of (end time, job id, segment version)
        self.useful_spans: list[tuple[float, float, float]] = []  # (from, until, useful GPU-s per s)
        self._demand: DemandView | None = None
        self._demand_rate = 0.0
        self._demand_wanted = 0
        # Levels for the utilisation series, kept up to date as allocations and server states change.
        self._allocated_gpus = {Pool.TRAINING: 0, Pool.INFERENCE: 0}
        self._inference_states = {state: 0 for state in ServerState}
        for s in servers:
            if s.pool == Pool.INFERENCE:
                self._inference_states[s.state] += 1
        self.samples: list[UtilisationSample] = []
        self.rejected_actions = 0
        self.server_failures = 0    # failures that made a server LOST
        self.fault_evictions = 0    # job actions that dropped workers on a LOST server (shrinks, requeues)
        # The snapshot's server views, in id order; entries of servers changed since the last snapshot
        # are rebuilt then (``_stale_servers``), the others reused.
        self._server_views: tuple[ServerView, ...] = tuple(s.build_view() for s in servers)
        self._server_slot = {s.server_id: i for i, s in enumerate(servers)}
        self._stale_servers: set[str] = set()

    @classmethod
    def from_snapshot(
        cls,
        snapshot: ClusterSnapshot,
        traces: Mapping[int, TraceJob],
        clock: Clock,
        *,
        done_since_checkpoint: Mapping[int, float] | None = None,
        restart_overhead_s: float = 30.0,
        checkpoint_interval_s: float = 1800.0,
        drain_ack_s: float | None = 1.0,
        apply_settings: ApplySettings = DEFAULT_APPLY_SETTINGS,
    ) -> SimulatedCluster:
        """The cluster as ``snapshot`` shows it, at ``clock``'s time (its ``now``): its servers (states,
        loans, health, operators' marks, allocations), its demand, and its active jobs, each as
        ``traces`` describes it (a job without a trace is left out, and the GPUs it holds are free).

        A trace's ``work`` is what the job still has to do from its last checkpoint: a pending job resumes
        from that checkpoint; a running one keeps its workers and has done ``done_since_checkpoint`` of
        it already (0 if not given), so a preemption throws that away. A running job still inside its
        restart overhead (``last_resized_at``) spends the rest of it first. ``JobOutcome.start`` of a
        pending job is its next start here (its first start is in the snapshot's ``started_at``)."""
        by_pool = {pool: [s for s in snapshot.servers if s.pool == pool] for pool in Pool}
        gpus = max((len(s.gpu_indices) for s in snapshot.servers), default=1) or 1
        spec = ClusterSpec(len(by_pool[Pool.TRAINING]), len(by_pool[Pool.INFERENCE]), gpus,
                           gpu_speed=snapshot.gpu_speed, queues=snapshot.queues)
        empty = ClusterSpec(0, 0, gpus, gpu_speed=snapshot.gpu_speed, queues=snapshot.queues)
        cluster = cls(empty, clock, restart_overhead_s=restart_overhead_s,
                      checkpoint_interval_s=checkpoint_interval_s, drain_ack_s=drain_ack_s,
                      apply_settings=apply_settings)
        cluster.spec = spec
        now = clock.now()
        servers = []
        for view in sorted(snapshot.servers, key=lambda v: v.server_id):
            on_loan = view.state in ON_LOAN_STATES
            server = ServerRecord(
                view.server_id, view.pool, view.gpu_indices, view.state, state_since=view.state_since,
                loan=(LoanState.RECLAIMING if view.state == ServerState.RECLAIMING else LoanState.ACTIVE)
                if on_loan else None,
                loan_started_at=view.loan_started_at if on_loan else None,
                reclaim_deadline=view.reclaim_deadline, unhealthy=view.unhealthy_gpus, drained=view.drained,
                admin=view.admin, drain_deadline=view.drain_deadline, gpu_type=view.gpu_type,
            )
            servers.append(server)
            if server.pool == Pool.INFERENCE:
                cluster._inference_states[server.state] += 1
            if server.state == ServerState.DRAINING and not server.drained and cluster.drain_ack_s is not None:
                cluster._drain_acks[server.server_id] = now + cluster.drain_ack_s
        cluster._servers = {s.server_id: s for s in servers}
        cluster.server_outcomes = {s.server_id: ServerOutcome(s.server_id, s.pool) for s in servers}
        cluster._server_views = tuple(s.build_view() for s in servers)
        cluster._server_slot = {s.server_id: i for i, s in enumerate(servers)}
        if snapshot.demand is not None:
            demand = snapshot.demand
            cluster.set_demand(DemandPoint(demand.reported_at, demand.servers_needed, demand.observed_rps))
        done = done_since_checkpoint or {}
        for shown in snapshot.jobs:
            trace = traces.get(shown.job_id)
            if trace is None or shown.state.is_terminal:
                continue
            cluster.submit(trace)
            job = cluster._active[shown.job_id]
            job.pending_reason = shown.pending_reason
            job.started_at = shown.started_at
            job.last_resized_at = shown.last_resized_at
            job.checkpoint_at = shown.last_checkpoint_at
            job.disruptions = shown.disruptions
            if not shown.workers or not shown.state.holds_gpus:
                continue
            job.outcome.start = shown.started_at if shown.started_at is not None else now
            job.state = JobState.RUNNING  # SCALING: its resize is under way; it runs at its new size
            workers = tuple(sorted(shown.workers, key=lambda w: w.rank))
            cluster._take(job, workers)
            # The segment began when its restart overhead (still) began: now, less what was spent of it.
            began = shown.last_resized_at if shown.last_resized_at is not None else now - cluster.restart_overhead_s
            cluster._begin_segment(job, max(began, now - cluster.restart_overhead_s), workers,
                                   min(done.get(shown.job_id, 0.0), trace.work))
            job.last_resized_at = shown.last_resized_at  # as the snapshot says (anti-thrashing reads it)
            cluster._running[shown.job_id] = job
        cluster._stale_servers.update(cluster._servers)
        return cluster

    # -- what the engine drives -------------------------------------------------------------------

    @property
    def active_jobs(self) -> int:
        return len(self._active)

    @property
    def running_jobs(self) -> int:
        return len(self._running)

    def submit(self, trace: TraceJob) -> None:
        """A trace job arrives (now): PENDING, like a fresh submission to the service."""
        if trace.job_id in self.outcomes:
            raise ValueError(f"job {trace.job_id} is submitted twice")
        if trace.min_workers < 1 or trace.max_workers < trace.min_workers or trace.gpus_per_worker < 1:
            raise ValueError(f"job {trace.job_id}: invalid shape {trace.gpus_per_worker} GPU(s) x "
                             f"{trace.min_workers}..{trace.max_workers} workers")
        if not trace.work > 0:
            raise ValueError(f"job {trace.job_id}: work must be > 0 (got {trace.work})")
        model = ThroughputModel(points=trace.throughput)
        if model.speed(trace.min_workers) <= 0:
            raise ValueError(f"job {trace.job_id}: no progress at {trace.min_workers} worker(s)")
        outcome = JobOutcome(trace.job_id, trace.name, trace.submit_time, trace.gpus_per_worker,
                             trace.min_workers, trace.max_workers, deadline=trace.deadline)
        self.outcomes[trace.job_id] = outcome
        if self._active and trace.job_id < next(reversed(self._active)):
            self._active_in_order = False
        self._active[trace.job_id] = JobRecord(
            trace, outcome, model,
            reference_cost=trace.min_workers * trace.gpus_per_worker / model.speed(trace.min_workers),
            shown_work=trace.work if trace.declared_work is None else trace.declared_work)

    def set_demand(self, point: DemandPoint) -> None:
        """The router's latest signal: inference needs ``servers_needed`` serving servers."""
        self._demand = DemandView(point.servers_needed, point.rate_rps, point.time)
        self._demand_rate = point.rate_rps
        self._demand_wanted = point.servers_needed if point.servers_wanted is None else point.servers_wanted

    def next_completion(self) -> float | None:
        """When the next running job finishes its work (None: no job is running)."""
        heap = self._completions
        while heap:
            end, job_id, version = heap[0]
            job = self._running.get(job_id)
            if job is not None and job.seg_version == version:
                return end
            heapq.heappop(heap)  # a segment that ended early (resized or preempted)
        return None

    def complete_due(self) -> list[int]:
        """Complete every running job whose work is done by now; returns their ids (ascending)."""
        now, done = self.now, []
        while (end := self.next_completion()) is not None and end <= now:
            _, job_id, _ = heapq.heappop(self._completions)
            self._complete(self._running[job_id], end)
            done.append(job_id)
        return sorted(done)

    def finish(self, job_id: int) -> None:
        """The running job completed now by its job model's own account, not by this cluster's segments:
        a job model that computes progress itself (``simulator.goodput_cluster``) submits its jobs with
        infinite work and says here when each is done. Its GPUs are free from now on."""
        job = self._running.get(job_id)
        if job is None:
            raise ValueError(f"job {job_id} is not running: it cannot complete")
        self._complete(job, self.now)

    def _complete(self, job: JobRecord, end: float) -> None:
        """The running job completed at ``end``: its segment closes, its GPUs are free, it is no longer active."""
        self._end_segment(job, end, kept_until=end)
        JOB_LIFECYCLE.check(job.state, JobState.COMPLETED)
        job.state = JobState.COMPLETED
        self._free(job)
        del self._running[job.trace.job_id]
        del self._active[job.trace.job_id]
        job.outcome.end = end

    def workers_of(self, job_id: int) -> tuple[WorkerView, ...]:
        """The active job's workers now, by rank (none: it is pending)."""
        return self._active[job_id].workers

    def next_drain_ack(self) -> float | None:
        """When the router next acknowledges a drain (None: no drain awaits one)."""
        return min(self._drain_acks.values()) if self._drain_acks else None

    def acknowledge_drains(self) -> list[str]:
        """The router's acknowledgements due by now: those DRAINING servers are ``drained`` (the
        policy may lend them at once). Returns their ids (ascending)."""
        now = self.now
        due = sorted(sid for sid, at in self._drain_acks.items() if at <= now)
        for server_id in due:
            del self._drain_acks[server_id]
            server = self._servers[server_id]
            server.drained = True
            self._server_changed(server)
        return due

    def fail_server(self, server_id: str) -> None:
        """The server dies: LOST, as the service marks a server whose agent went silent. Its
        allocations stay (the next plan evicts them); an open loan ends, as in the service."""
        server = self._servers[server_id]
        self._move_server(server, ServerState.LOST, self.now)
        server.loan, server.loan_started_at, server.reclaim_deadline = None, None, None
        self.server_failures += 1

    def repair_server(self, server_id: str) -> None:
        """The server is back, in its home state (the service: its agent reports again)."""
        server = self._servers[server_id]
        self._move_server(server, home_state(server.pool), self.now)

    def set_admin(self, server_id: str, admin: AdminState, drain_deadline: float | None = None) -> None:
        """An operator cordons, drains or uncordons (NONE) the server, as ``arylctl servers`` does in
        the service: the snapshot shows it (``ServerView.admin``) and the rules refuse new workers
        and loans there (``core.apply_rules``); the policy moves workers off a draining one."""
        server = self._servers[server_id]
        server.admin, server.drain_deadline = admin, drain_deadline
        self._server_changed(server)

    def set_gpu_health(self, server_id: str, index: int, healthy: bool) -> None:
        """A GPU's health as its agent reports it: an unhealthy one shows in the snapshot
        (``ServerView.unhealthy_gpus``) and takes no new worker; a worker already on it runs on."""
        server = self._servers[server_id]
        if index not in server.gpu_indices:
            raise ValueError(f"server {server_id} has no GPU {index}")
        server.unhealthy = server.unhealthy - {index} if healthy else server.unhealthy | {index}
        self._server_changed(server)

    @property
    def server_ids(self) -> tuple[str, ...]:
        return tuple(self._servers)

    def sample(self) -> None:
        """Record the utilisation levels from now on (a new sample only when a level changed)."""
        serving = self._inference_states[ServerState.SERVING]
        needed = self._demand.servers_needed if self._demand else 0
        sample = UtilisationSample(
            time=self.now,
            training_gpus=self._allocated_gpus[Pool.TRAINING],
            inference_gpus=min(max(needed, 0), serving) * self.spec.gpus_per_server,
            loaned_training_gpus=self._allocated_gpus[Pool.INFERENCE],
            loaned_servers=self._inference_states[ServerState.LOANED],
            servers_needed=needed,
            rate_rps=self._demand_rate,
            servers_wanted=self._demand_wanted if self._demand else 0,
        )
        if self.samples:
            last = self.samples[-1]
            if same_levels(sample, last):
                return
            if last.time == sample.time:
                self.samples[-1] = sample  # the last word at one instant holds from then on
                return
        self.samples.append(sample)

    # -- the port: snapshot -----------------------------------------------------------------------

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        """Every server, and the active jobs (PENDING, RUNNING, SCALING) in id order, as the service's
        snapshot shows them; running jobs' progress is exact at ``now``."""
        now = self.now
        if not self._active_in_order:
            self._active = dict(sorted(self._active.items()))
            self._active_in_order = True
        # The hot loop of a simulation (every active job, every cycle): _work_at and _last_checkpoint
        # inlined (same arithmetic, same order), JobView built positionally (its field order; a test
        # compares the result field by field). A job holds workers exactly while it runs.
        overhead, interval, view_of = self.restart_overhead_s, self.checkpoint_interval_s, JobView
        views: list[JobView] = []
        append = views.append
        for job in self._active.values():
            if not job.workers:
                append(job.view or self._idle_view(job))
                continue
            t = job.trace
            since = now - job.seg_start
            productive = since - overhead
            work = job.seg_work + job.seg_speed * productive if productive > 0 else job.seg_work
            periods = floor(since / interval)
            append(view_of(
                t.job_id, job.state, t.gpus_per_worker, t.min_workers, t.max_workers, t.priority, t.submit_time,
                job.workers, t.declared_runtime_s, job.pending_reason, t.throughput, job.shown_work,
                work if work < t.work else t.work,
                job.started_at, job.last_resized_at,
                job.seg_start + periods * interval if periods >= 1 else job.checkpoint_at, "", t.deadline,
                queue=t.queue, user=t.user, priority_class=t.priority_class, gpu_types=t.gpu_types,
                disruptions=job.disruptions,
            ))
        jobs = tuple(views)
        if self._stale_servers:
            server_views = list(self._server_views)
            for server_id in self._stale_servers:
                server_views[self._server_slot[server_id]] = self._servers[server_id].build_view()
            self._server_views = tuple(server_views)
            self._stale_servers.clear()
        return ClusterSnapshot(now=now, servers=self._server_views, jobs=jobs, demand=self._demand, seed=seed,
                               queues=self.spec.queues, gpu_speed=self.spec.gpu_speed)

    def _idle_view(self, job: JobRecord) -> JobView:
        if job.view is None:
            t = job.trace
            job.view = JobView(
                job_id=t.job_id, state=job.state, gpus_per_worker=t.gpus_per_worker,
                min_workers=t.min_workers, max_workers=t.max_workers, priority=t.priority,
                submitted_at=t.submit_time, pending_reason=job.pending_reason,
                throughput_points=t.throughput, total_work=job.shown_work, work_done=job.checkpoint_work,
                estimated_runtime_s=t.declared_runtime_s,
                started_at=job.started_at, last_resized_at=job.last_resized_at,
                last_checkpoint_at=job.checkpoint_at, deadline=t.deadline,
                queue=t.queue, user=t.user, priority_class=t.priority_class, gpu_types=t.gpu_types,
                disruptions=job.disruptions,
            )
        return job.view
