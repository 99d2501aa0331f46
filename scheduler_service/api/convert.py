"""Plain values (``scheduler_service.records``) -> protobuf messages. Pure translation, no decisions."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from protos.aryl.v1 import agent_pb2, scheduler_pb2, types_pb2
from scheduler_service.app.deadlines import job_view
from scheduler_service.app.demand_forecast import DemandForecastInfo
from scheduler_service.app.explain import JobExplanation
from scheduler_service.app.replicas import ReplicaView
from scheduler_service.core import goodput_fit
from scheduler_service.core.batch import job_batch, noise_scale, prediction_sizes, step_sample
from scheduler_service.core.predict import DeadlineOutlook, DeadlineStatus
from scheduler_service.core.type_speed import type_speeds
from scheduler_service.records import (
    ClusterSummary,
    DemandInfo,
    DesiredServerState,
    DesiredWorkerSpec,
    EventInfo,
    JobInfo,
    LoanInfo,
    QueueStatus,
    ServerInfo,
    command_preview,
)

_RESTART = {"ON_FAILURE": types_pb2.RESTART_POLICY_ON_FAILURE, "NEVER": types_pb2.RESTART_POLICY_NEVER}


# Timestamp's range (``Timestamp.FromNanoseconds`` refuses a time outside it).
_TIMESTAMP_SECONDS = range(-62135596800, 253402300799 + 1)


def timestamp(seconds: float | None) -> timestamp_pb2.Timestamp | None:
    return None if seconds is None else _timestamp(seconds)


def _timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    whole, nanos = divmod(round(seconds * 1e9), 1_000_000_000)
    if whole not in _TIMESTAMP_SECONDS:
        timestamp_pb2.Timestamp().FromNanoseconds(round(seconds * 1e9))  # raises its ValueError
    # FromNanoseconds' fields, set in the constructor: a third of its cost, for every time of every answer.
    return timestamp_pb2.Timestamp(seconds=whole, nanos=nanos)


def duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


# Enum fields are set by label (protobuf checks the label): ``JOB_STATE_RUNNING`` for the state RUNNING.
def job_state(name: str) -> str:
    return f"JOB_STATE_{name}"


def server_state(name: str) -> str:
    return f"SERVER_STATE_{name}"


def job_summary(row: JobInfo, outlook: DeadlineOutlook | None = None) -> types_pb2.Job:
    """``job`` as a list shows it: no environment and the command cut to a short prefix.

    A spec may be up to 256 KiB, nearly all of it command and environment; a page of such jobs
    would be tens of MiB per ListJobs (over the message limit for every caller) though no list
    shows them."""
    return _job(row, command=command_preview(row.command), env={}, outlook=outlook)


def job_ids_view(row: JobInfo) -> types_pb2.Job:
    """``job`` as SubmitJobs answers with SUBMITTED_JOBS_VIEW_IDS: its id, name, state, submission time,
    version and array place, nothing else."""
    return types_pb2.Job(
        job_id=str(row.id), spec=types_pb2.JobSpec(name=row.name), state=job_state(row.state),
        submitted_at=timestamp(row.submitted_at), version=row.version,
        array_job_id=str(row.array_job_id) if row.array_job_id is not None else "", array_index=row.array_index or 0,
    )


def job(row: JobInfo, outlook: DeadlineOutlook | None = None, *,
        gpu_speeds: Mapping[str, float] | None = None) -> types_pb2.Job:
    """The whole job, its spec as submitted (GetJob, SubmitJob, CancelJob); with ``outlook``, its
    predicted finish and deadline status (``app.deadlines``); a goodput job's predicted speed-ups and its
    speed by GPU type (``core.type_speed``: measured, or bootstrapped by the declared ``gpu_speeds``)."""
    message = _job(row, command=row.command, env=row.env, outlook=outlook)
    if row.batch_limits is not None:
        message.predicted_speedups.extend(predicted_speedups(row))
    if row.goodput.step_times:  # speeds by type start from a measured one: none before a first measure
        message.type_speeds.extend(
            types_pb2.TypeSpeed(gpu_type=s.gpu_type, samples_per_gpu_s=s.samples_per_gpu_s,
                                local_batch_size=s.local_batch_size, source=s.source, relative=s.relative)
            for s in type_speeds(row.goodput.step_times, gpu_speeds or {}))
    return message


def predicted_speedups(row: JobInfo) -> list[types_pb2.SpeedupPrediction]:
    """A job with batch limits: its speed-up at other sizes (``core.goodput_fit.predicted_speedups``, from
    its measures once it has some), with the batch for each; none for another job."""
    if row.batch_limits is None:
        return []
    samples = tuple(step_sample(t.nodes, t.replicas, t.local_batch_size, t.accum_steps, t.pass_time_s, t.step_time_s)
                    for t in row.goodput.step_times)
    view = replace(job_view(row), batch_limits=row.batch_limits, step_samples=samples, grad_stats=row.goodput.grad)
    sizes = prediction_sizes(row.min_workers, row.max_workers, row.num_workers)
    out = []
    for p in goodput_fit.predicted_speedups(view, sizes):
        batch = p.batch
        out.append(types_pb2.SpeedupPrediction(
            workers=p.workers, reference_workers=p.reference, speedup=p.speedup, source=p.source,
            local_batch_size=batch.atomic_bsz if batch else 0, accum_steps=batch.accum_steps if batch else 0,
            batch_size=batch.atomic_bsz * (batch.accum_steps + 1) * p.workers * row.gpus_per_worker if batch else 0,
        ))
    return out


def deadline_status(status: DeadlineStatus) -> str:
    return f"DEADLINE_STATUS_{status}"


def prediction_fields(outlook: DeadlineOutlook | None) -> dict[str, Any]:
    """The prediction fields an outlook fills in (the same names on Job and SubmitJobResponse)."""
    if outlook is None:
        return {}
    fields: dict[str, Any] = dict(deadline_status=deadline_status(outlook.status),
                                  workers_needed=outlook.workers_needed or 0)
    if outlook.prediction is not None:
        fields["predicted_finish"] = timestamp(outlook.prediction.finish)
    return fields


def admission_fields(outlook: DeadlineOutlook | None) -> dict[str, Any]:
    """SubmitJobResponse's admission feedback (none with ``scheduling.deadline_admission = off``)."""
    return {**prediction_fields(outlook), "admission_note": outlook.note} if outlook is not None else {}


def _job(row: JobInfo, *, command: Sequence[str], env: Mapping[str, str],
         outlook: DeadlineOutlook | None = None) -> types_pb2.Job:
    throughput = row.throughput
    hints = types_pb2.ThroughputHints(
        points=[types_pb2.ThroughputPoint(workers=w, samples_per_second=s) for w, s in throughput.get("points", [])],
        total_work=throughput.get("total_work", 0.0),
        estimated_runtime=duration(throughput["estimated_runtime_s"]) if "estimated_runtime_s" in throughput else None,
    ) if throughput else None
    spec = types_pb2.JobSpec(
        name=row.name, user=row.user, queue=row.queue, command=command, env=env,
        gpus_per_worker=row.gpus_per_worker, min_workers=row.min_workers, max_workers=row.max_workers,
        priority=row.priority, restart_policy=_RESTART[row.restart_policy], max_restarts=row.max_restarts,
        working_dir=row.working_dir or "", working_dir_if_exists=row.working_dir_if_exists,
        priority_class=row.priority_class, gpu_types=row.gpu_types,
    )
    # The optional messages only where the job has them: an absent one is left unset, as a None
    # argument leaves it, at none of the cost (most jobs have none of them).
    if row.deadline is not None:
        spec.deadline.CopyFrom(_timestamp(row.deadline))
    if hints is not None:
        spec.throughput.CopyFrom(hints)
    if row.max_runtime_s:
        spec.max_runtime.CopyFrom(duration(row.max_runtime_s))
    if row.batch_limits is not None:
        spec.batch.CopyFrom(types_pb2.BatchHints(
            init_batch_size=row.batch_limits.init_bsz, max_batch_size=row.batch_limits.max_bsz,
            max_local_batch_size=row.batch_limits.max_atomic_bsz,
        ))
    message = types_pb2.Job(
        job_id=str(row.id), spec=spec, state=job_state(row.state), reason=row.state_reason,
        message=row.state_message, pending_reason=row.pending_reason, size_note=row.size_note,
        num_workers=row.num_workers, workers=_workers(row) if row.allocations else (),
        submitted_at=timestamp(row.submitted_at), restarts=row.restarts, preemptions=row.preemptions,
        idempotency_key=row.idempotency_key or "", version=row.version,
        progress=row.work_done, incarnation=row.incarnation,
        array_job_id=str(row.array_job_id) if row.array_job_id is not None else "", array_index=row.array_index or 0,
        priority_class_value=row.priority_value,
        **goodput_fields(row),
    )
    if row.started_at is not None:
        message.started_at.CopyFrom(_timestamp(row.started_at))
    if row.finished_at is not None:
        message.finished_at.CopyFrom(_timestamp(row.finished_at))
    if row.last_checkpoint_at is not None:
        message.last_checkpoint_at.CopyFrom(_timestamp(row.last_checkpoint_at))
    if outlook is not None:
        confidence = outlook.prediction.confidence if outlook.prediction is not None else 0.0
        message.MergeFrom(types_pb2.Job(**prediction_fields(outlook), deadline_note=outlook.note,
                                        prediction_confidence=confidence))
    return message


def _workers(row: JobInfo) -> list[types_pb2.WorkerAllocation]:
    """The job's workers: one per rank (and server), its GPUs in index order."""
    gpus_by_rank: dict[tuple[int, str], list[int]] = defaultdict(list)
    for a in row.allocations:
        gpus_by_rank[(a.rank, a.server_id)].append(a.gpu_index)
    return [types_pb2.WorkerAllocation(rank=rank, server_id=sid, gpu_indices=sorted(g))
            for (rank, sid), g in sorted(gpus_by_rank.items())]


def goodput_fields(row: JobInfo) -> dict[str, Any]:
    """A job's goodput fields (Job 50-57): the batch it runs with now (``core.batch.job_batch``), what its
    rank 0 measured, and its gradient noise scale; none for a job without batch limits."""
    limits = row.batch_limits
    if limits is None:
        return {}
    gpus = len(row.allocations)
    batch = job_batch(limits, row.batch_chosen, row.batch_replicas, gpus)
    info = row.goodput
    fields: dict[str, Any] = dict(
        step_times=[
            types_pb2.StepTime(nodes=t.nodes, replicas=t.replicas, local_batch_size=t.local_batch_size,
                               accum_steps=t.accum_steps, pass_time_s=t.pass_time_s, step_time_s=t.step_time_s,
                               measured_at=timestamp(t.measured_at), gpu_type=t.gpu_type)
            for t in info.step_times
        ],
        samples=info.samples, noise_scale=noise_scale(info.grad, limits.init_bsz),
    )
    if info.grad is not None:
        fields.update(grad_sqr=info.grad.sqr, grad_var=info.grad.var)
    if batch is not None:
        fields.update(local_batch_size=batch.atomic_bsz, accum_steps=batch.accum_steps, batch_size=batch.total(gpus))
    return fields


def event(row: EventInfo) -> types_pb2.Event:
    return types_pb2.Event(
        event_id=row.id, time=timestamp(row.time), kind=f"EVENT_KIND_{row.kind}",
        job_id=str(row.job_id) if row.job_id is not None else "", server_id=row.server_id or "",
        from_state=row.from_state, to_state=row.to_state, reason=row.reason, message=row.message,
        details={str(k): str(v) for k, v in (row.details or {}).items()},
    )


def explanation(explained: JobExplanation, job_message: types_pb2.Job) -> scheduler_pb2.ExplainJobResponse:
    """ExplainJob's answer (``app.explain``); ``job_message``: the job as ``job`` converts it, with its ETA
    (``api.forecast.add_eta``), whose note is the answer's ``eta`` too."""
    return scheduler_pb2.ExplainJobResponse(
        job=job_message, summary=explained.summary, eta=job_message.eta_note,
        protection=explained.protection, disruptions_last_hour=explained.disruptions_last_hour,
        decisions=[event(e) for e in explained.decisions],
        deadline=explained.outlook.note if explained.job.deadline is not None else "",
        queue_status=explained.queue_status,
    )


def pool(name: str) -> str:
    return f"POOL_{name}"


def server(row: ServerInfo) -> types_pb2.Server:
    gpus = [
        types_pb2.Gpu(
            index=g.index, uuid=g.uuid, model=g.model, memory_total_bytes=g.memory_total_bytes, healthy=g.healthy,
            health_reason=g.health_reason, job_id=str(g.job_id) if g.job_id is not None else "",
            utilization=g.utilization, memory_used_bytes=g.memory_used_bytes, temperature_c=g.temperature_c,
        )
        for g in row.gpus
    ]
    return types_pb2.Server(
        server_id=row.id, hostname=row.hostname, pool=pool(row.pool),
        state=server_state(row.state), state_reason=row.state_reason, gpus=gpus,
        gpus_total=len(gpus), gpus_used=row.gpus_used, gpus_healthy=sum(1 for g in row.gpus if g.healthy),
        registered_at=timestamp(row.registered_at), last_seen_at=timestamp(row.last_seen_at),
        desired_generation=row.desired_generation, observed_generation=row.observed_generation,
        agent_address=row.agent_address, admin_state=row.admin_shown, admin_reason=row.admin_reason,
        gpu_type=min((g.model for g in row.gpus), default=""),
    )


def queue(status: QueueStatus) -> scheduler_pb2.Queue:
    return scheduler_pb2.Queue(
        name=status.name, cohort=status.cohort, quota_gpus=status.quota_gpus,
        borrow_limit_gpus=status.borrow_limit_gpus, fair_share=status.fair_share, used_gpus=status.used_gpus,
        borrowed_gpus=status.borrowed_gpus, pending_jobs=status.pending_jobs, running_jobs=status.running_jobs,
        configured=status.configured, quota_is_rest=status.quota_is_rest,
    )


def demand_forecast(info: DemandForecastInfo | None) -> scheduler_pb2.DemandForecast | None:
    if info is None:
        return None
    return scheduler_pb2.DemandForecast(
        made_at=timestamp(info.made_at), servers_needed_now=info.needed_now, point=info.point, upper=info.upper,
        lead_s=info.lead_s, quantile=info.quantile, reclaim_latency_s=info.reclaim_latency_s,
        decision_lag_s=info.decision_lag_s, anchors=info.anchors, trend_per_hour=info.trend_per_h,
    )


def loan(row: LoanInfo) -> types_pb2.Loan:
    return types_pb2.Loan(
        loan_id=str(row.id), server_id=row.server_id, state=f"LOAN_STATE_{row.state}",
        reason=row.reason, started_at=timestamp(row.started_at), ended_at=timestamp(row.ended_at),
        hard_deadline=timestamp(row.hard_deadline),
    )


def demand(row: DemandInfo | None) -> types_pb2.InferenceDemand | None:
    if row is None:
        return None
    return types_pb2.InferenceDemand(
        servers_needed=row.servers_needed, observed_rps=row.observed_rps, source=row.source,
        reported_at=timestamp(row.time),
    )


def cluster(summary: ClusterSummary, *, policy: str, epoch: int) -> scheduler_pb2.GetClusterResponse:
    return scheduler_pb2.GetClusterResponse(
        pools=[
            scheduler_pb2.PoolSummary(
                pool=pool(p.pool), servers=p.servers, gpus_total=p.gpus_total, gpus_used=p.gpus_used,
                gpus_loaned=p.gpus_loaned, gpus_unavailable=p.gpus_unavailable,
            )
            for p in summary.pools
        ],
        jobs=[
            scheduler_pb2.JobStateCount(state=job_state(state), count=count)
            for state, count in sorted(summary.jobs_by_state.items())
        ],
        demand=demand(summary.demand), policy=policy, scheduler_epoch=epoch, active_loans=summary.active_loans,
        not_loaned=summary.not_loaned.summary if summary.not_loaned is not None else "",
    )


def scheduler_replica(replica: ReplicaView, *, live: bool, leader: bool) -> scheduler_pb2.SchedulerReplica:
    return scheduler_pb2.SchedulerReplica(
        address=replica.address, push_address=replica.push_address, heartbeat_age_seconds=replica.age_s,
        up_seconds=replica.up_s, leader=leader, live=live,
    )


def desired_state(state: DesiredServerState, *, grace_period_s: float) -> agent_pb2.DesiredState:
    return agent_pb2.DesiredState(
        server_id=state.server_id, scheduler_epoch=state.epoch, generation=state.generation,
        server_state=server_state(state.server_state),
        workers=[
            agent_pb2.DesiredWorker(
                job_id=str(w.job_id), rank=w.rank, world_size=w.world_size, local_rank=w.local_rank,
                gpu_indices=w.gpu_indices, command=w.command, env=w.env, master_addr=w.master_addr,
                master_port=w.master_port, grace_period=duration(grace_period_s), incarnation=w.incarnation,
                working_dir=w.working_dir, working_dir_if_exists=w.working_dir_if_exists, user=w.user,
                **desired_batch(w),
            )
            for w in state.workers
        ],
    )


def desired_batch(worker: DesiredWorkerSpec) -> dict[str, int]:
    """A desired worker's batch fields (DesiredWorker 20-24); none for a job without batch limits."""
    if worker.batch is None or worker.batch_limits is None:
        return {}
    limits = worker.batch_limits
    return dict(local_batch_size=worker.batch.atomic_bsz, accum_steps=worker.batch.accum_steps,
                init_batch_size=limits.init_bsz, max_batch_size=limits.max_bsz,
                max_local_batch_size=limits.max_atomic_bsz)
