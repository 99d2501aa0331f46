"""The simulated cluster's ``apply``: ``PlanApplication``, the applier ``simulator.cluster``'s
``SimulatedCluster`` is built on, with the service's semantics (``store.applier.Applier.apply``).

Each action of a plan is re-checked by ``scheduler_service.core.apply_rules`` (the rules both appliers
share; they read this cluster's records through ``simulator.cluster_records.RecordFacts``) against the
state the earlier ones left, and carried out on the records: allocations taken and freed, jobs and
servers moved through their lifecycle tables, loans begun and ended, the job's segments ended and begun
(``simulator.cluster_progress``). A preemption, or a resize that drops a worker on a LOST server, falls
back to the last checkpoint; a graceful resize checkpoints first.

Never: decide anything (the plan did: this only re-checks and carries out), or look at which policy
made the plan.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_service.core.apply_rules import (
    ApplySettings,
    LoanState,
    RefusalCode,
    RefusalLog,
    Refused,
    check_loan_step,
    check_preemption,
    check_scale,
    check_start,
)
from scheduler_service.core.plan import (
    ApplyLog,
    ApplyResult,
    KeepPending,
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
    apply_order,
)
from scheduler_service.core.snapshot import WorkerView
from scheduler_service.lifecycle import (
    JOB_LIFECYCLE,
    SERVER_LIFECYCLE,
    IllegalTransition,
    JobState,
    Pool,
    ServerState,
)
from simulator.cluster_progress import SegmentProgress
from simulator.cluster_records import JobRecord, RecordFacts, ServerRecord, disrupted, worker_views
from simulator.outcomes import JobOutcome, ServerOutcome


class PlanApplication(SegmentProgress):
    """``apply`` (the ``ClusterState`` port's writer) and the state changes it is made of: allocations
    (``_take``, ``_free``), lifecycle moves (``_set_job_state``, ``_move_server``)."""

    # The cluster's state this reads and writes (``SimulatedCluster.__init__`` sets it).
    apply_settings: ApplySettings
    drain_ack_s: float | None
    outcomes: dict[int, JobOutcome]
    server_outcomes: dict[str, ServerOutcome]
    rejected_actions: int
    fault_evictions: int
    _active: dict[int, JobRecord]
    _drain_acks: dict[str, float]
    _allocated_gpus: dict[Pool, int]
    _inference_states: dict[ServerState, int]
    _stale_servers: set[str]

    def apply(self, plan: Plan) -> ApplyResult:
        """Apply ``plan`` as the service's applier does (``store.applier.Applier.apply``), in the shared
        ``core.plan.apply_order``; then pending reasons. Each action is re-checked by
        ``core.apply_rules`` against the state the earlier ones left and refused alone
        (``ApplyResult.rejected``, reason STALE_PLAN, the rule's code in ``rejected_codes``) when that
        state does not allow it."""
        if plan.is_empty:
            return ApplyResult((), (), frozenset())
        now = self.now
        log = ApplyLog()
        held = {
            s.job_id: [(w.server_id, g) for w in self._active[s.job_id].workers for g in w.gpu_indices]
            for s in plan.scales
            if s.job_id in self._active
        }
        refusals = RefusalLog(log, plan, held)
        facts = RecordFacts(self._servers, self._active, self.outcomes)
        for action in apply_order(plan, held):
            try:
                if isinstance(action, ServerAction):
                    servers = self._apply_server_step(facts, action, now)
                elif isinstance(action, PreemptJob):
                    servers = self._apply_preemption(facts, action, now)
                elif isinstance(action, ScaleJob):
                    servers = self._apply_scale(facts, action, now)
                else:
                    servers = self._apply_start(facts, action, now)
            except Refused as refusal:
                refusals.refused(action, refusal)
                continue
            except IllegalTransition as exc:  # the rules check the lifecycles first: never expected
                refusals.refused(action, Refused(RefusalCode.ILLEGAL_TRANSITION, str(exc)))
                continue
            log.applied(action, servers)
        self._apply_pending(plan.pending)
        self.rejected_actions += len(log.rejected)
        return log.result()

    def _set_job_state(self, job: JobRecord, target: JobState) -> None:
        JOB_LIFECYCLE.check(job.state, target)
        job.state = target
        job.view = None

    def _apply_preemption(self, facts: RecordFacts, action: PreemptJob, now: float) -> set[str]:
        """Stop every worker and requeue (RUNNING -> PREEMPTED -> PENDING). The job falls back to its
        last checkpoint; the work since is lost."""
        check_preemption(facts, action)
        job = self._active[action.job_id]
        if self._on_lost_server(w.server_id for w in job.workers):
            self.fault_evictions += 1
        checkpoint_at, checkpoint_work = self._last_checkpoint(job, now)
        self._lose_work_since(job, checkpoint_work, now)
        self._end_segment(job, now, kept_until=job.seg_start if checkpoint_at is None else checkpoint_at)
        servers = self._free(job)
        job.checkpoint_at, job.checkpoint_work = checkpoint_at, checkpoint_work
        job.outcome.preemptions += 1
        disrupted(job, now)
        if action.reason == Reason.PREEMPTED_FOR_RECLAIM:
            job.outcome.reclaim_preemptions += 1
        job.pending_reason = f"{action.reason}: {action.message}"[:1024]
        self._set_job_state(job, JobState.PREEMPTED)
        self._set_job_state(job, JobState.PENDING)
        del self._running[action.job_id]
        return servers

    def _apply_scale(self, facts: RecordFacts, action: ScaleJob, now: float) -> set[str]:
        """Restart the job at its new placement (RUNNING -> SCALING -> RUNNING): a graceful resize
        checkpoints first, so no work is lost; the new segment pays the restart overhead. A resize
        that drops a worker on a LOST server is not graceful: that worker died, so the job restarts
        from its last checkpoint and the work since is lost."""
        check_scale(facts, action)
        job = self._active[action.job_id]
        held_pairs = {(w.server_id, g) for w in job.workers for g in w.gpu_indices}
        before = len(job.workers)
        dropped = held_pairs - {(w.server_id, g) for w in action.workers for g in w.gpu_indices}
        if self._on_lost_server(s for s, _ in dropped):
            self.fault_evictions += 1
            checkpoint_at, work = self._last_checkpoint(job, now)
            self._lose_work_since(job, work, now)
        else:
            checkpoint_at, work = now, self._work_at(job, now)  # the graceful resize's checkpoint
        self._end_segment(job, now, kept_until=job.seg_start if checkpoint_at is None else checkpoint_at)
        old_servers = self._free(job)
        workers = worker_views(action.workers)
        self._take(job, workers)
        self._set_job_state(job, JobState.SCALING)
        job.checkpoint_at, job.checkpoint_work = checkpoint_at, work
        self._begin_segment(job, now, workers, work)
        self._set_job_state(job, JobState.RUNNING)
        disrupted(job, now)
        after = len(workers)
        if after > before:
            job.outcome.scale_outs += 1
        elif after < before:
            job.outcome.scale_ins += 1
            if action.reason == Reason.SCALED_IN_FOR_RECLAIM:
                job.outcome.reclaim_scale_ins += 1
        else:
            job.outcome.moves += 1
        # Every worker restarts at the new world size, so every server it ran or runs on changes.
        return old_servers | {w.server_id for w in workers}

    def _on_lost_server(self, server_ids: Iterable[str]) -> bool:
        return any(self._servers[sid].state == ServerState.LOST for sid in server_ids)

    def _apply_start(self, facts: RecordFacts, action: StartJob, now: float) -> set[str]:
        """Place a pending job's gang; it resumes from its last checkpoint (from scratch the first time)."""
        check_start(facts, action)
        job = self._active[action.job_id]
        workers = worker_views(action.workers)
        self._take(job, workers)
        if job.started_at is None:
            job.started_at = now
        if job.outcome.start is None:  # a restored job's first start here (``from_snapshot``)
            job.outcome.start = now
        job.pending_reason = ""
        self._set_job_state(job, JobState.RUNNING)
        self._begin_segment(job, now, workers, job.checkpoint_work)
        self._running[action.job_id] = job
        return {w.server_id for w in workers}

    def _apply_server_step(self, facts: RecordFacts, action: ServerAction, now: float) -> set[str]:
        """One step of the loan cycle (``core.apply_rules.LOAN_STEPS``): the server's transition and
        its loan (begun, moved on, or closed), as the service records them."""
        rule = check_loan_step(facts, action)
        server = self._servers[action.server_id]
        self._move_server(server, rule.target, now)
        if rule.loan_before is None:
            server.loan_started_at = now
        if rule.starts_reclaim_deadline:
            server.reclaim_deadline = self.apply_settings.reclaim_deadline(now)
        server.loan = None if rule.loan_after == LoanState.RETURNED else rule.loan_after
        if server.loan is None:
            server.loan_started_at = server.reclaim_deadline = None
        server.view = None
        self._stale_servers.add(server.server_id)
        if action.kind == LoanStep.LOAN:
            self.server_outcomes[server.server_id].loans += 1
        elif action.kind == LoanStep.RECLAIM:
            self.server_outcomes[server.server_id].reclaims += 1
        return {server.server_id}

    def _apply_pending(self, pending: tuple[KeepPending, ...]) -> None:
        """Record the pending reasons of jobs that are still pending after this plan."""
        for p in pending:
            job = self._active.get(p.job_id)
            if job is not None and job.state == JobState.PENDING:
                job.pending_reason = p.summary
                job.view = None

    # -- allocations ------------------------------------------------------------------------------

    def _free(self, job: JobRecord) -> set[str]:
        servers = set()
        for w in job.workers:
            server = self._servers[w.server_id]
            for gpu in w.gpu_indices:
                if server.allocated.get(gpu) == job.trace.job_id:
                    del server.allocated[gpu]
                    self._allocated_gpus[server.pool] -= 1
            server.view = None
            servers.add(w.server_id)
        self._stale_servers.update(servers)
        job.workers = ()
        return servers

    def _take(self, job: JobRecord, workers: Iterable[WorkerView]) -> None:
        for w in workers:
            server = self._servers[w.server_id]
            for gpu in w.gpu_indices:
                server.allocated[gpu] = job.trace.job_id
                self._allocated_gpus[server.pool] += 1
            server.view = None
            self._stale_servers.add(w.server_id)

    # -- server states ----------------------------------------------------------------------------

    def _move_server(self, server: ServerRecord, target: ServerState, now: float) -> None:
        """A server's state change through the lifecycle table, with what follows from it: the pool
        levels, the drain acknowledgement (one per DRAINING spell), a stale view."""
        SERVER_LIFECYCLE.check(server.state, target)
        if server.pool == Pool.INFERENCE:
            self._inference_states[server.state] -= 1
            self._inference_states[target] += 1
        server.state = target
        server.state_since = now
        server.drained = False
        self._drain_acks.pop(server.server_id, None)
        if target == ServerState.DRAINING and self.drain_ack_s is not None:
            self._drain_acks[server.server_id] = now + self.drain_ack_s
        self._server_changed(server)

    def _server_changed(self, server: ServerRecord) -> None:
        server.view = None
        self._stale_servers.add(server.server_id)
