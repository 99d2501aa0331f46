"""Rows -> the plain values of ``scheduler_service.records``, built inside the store's transactions
so that no row (and no session) leaves the store.

The converters take a row's mapping (``row._mapping`` of a Core row, column name -> value): reads
that return many rows (a page of jobs, the event log, every server's GPUs) select Core rows, and a
mapping lookup costs a fraction of an ORM or named attribute access, which matters at 1,000 rows.

Never: query (the callers read the rows), or change a value on the way (a value is the row as read).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from scheduler_service.core.goodput import BatchSplit
from scheduler_service.core.snapshot import BatchLimits
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.records import (
    AllocationInfo,
    DemandInfo,
    EventInfo,
    GpuInfo,
    JobInfo,
    LoanInfo,
    ServerInfo,
)
from scheduler_service.store.goodput import goodput_info

_Record = TypeVar("_Record")

# A row as column name -> value (a Core row's ``_mapping``, whose keys SQLAlchemy types loosely).
Values = Mapping[Any, Any]


def job_info(row: Values, allocations: Iterable[Values] = ()) -> JobInfo:
    """``allocations``: the job's ``allocations`` rows, in rank then GPU order. A list page's row has no
    ``env`` and the command's preview as ``command`` (``store.jobs._LIST_COLUMNS``)."""
    return _frozen(JobInfo, dict(
        id=row["id"], name=row["name"], user=row["user"], queue=row["queue"], command=tuple(row["command"] or ()),
        env=row.get("env") or {}, gpus_per_worker=row["gpus_per_worker"], min_workers=row["min_workers"],
        max_workers=row["max_workers"], priority=row["priority"], deadline=row["deadline"],
        throughput=row["throughput"] or {}, max_runtime_s=row["max_runtime_s"], restart_policy=row["restart_policy"],
        max_restarts=row["max_restarts"], idempotency_key=row["idempotency_key"], state=_job_state(row["state"]),
        state_reason=row["state_reason"], state_message=row["state_message"], pending_reason=row["pending_reason"],
        num_workers=row["num_workers"], restarts=row["restarts"], preemptions=row["preemptions"],
        submitted_at=row["submitted_at"], started_at=row["started_at"], finished_at=row["finished_at"],
        version=row["version"], last_resized_at=row["last_resized_at"], work_done=row["work_done"],
        last_checkpoint_at=row["last_checkpoint_at"], incarnation=row["incarnation"],
        checkpoint_work=row["checkpoint_work"], worker_exits=row["worker_exits"], rank_servers=row["rank_servers"],
        working_dir=row["working_dir"], working_dir_if_exists=row["working_dir_if_exists"],
        disruptions=tuple(row.get("disruptions") or ()),
        size_note=row["size_note"], priority_class=row.get("priority_class") or "",
        priority_value=row.get("priority_value") or 0, gpu_types=tuple(row.get("gpu_types") or ()),
        array_job_id=row.get("array_job_id"), array_index=row.get("array_index"),
        progress_at=row.get("progress_at"), window_work=row.get("window_work"), window_at=row.get("window_at"),
        window_workers=row.get("window_workers") or 0, window_reports=row.get("window_reports") or 0,
        allocations=tuple(
            AllocationInfo(rank=a["rank"], server_id=a["server_id"], gpu_index=a["gpu_index"],
                           allocated_at=a["allocated_at"])
            for a in allocations
        ) if allocations else (),  # most jobs hold none (a new job, a queued one, a list page's rows)
        batch_limits=batch_limits(row.get("batch_init"), row.get("batch_max"), row.get("batch_max_local")),
        batch_chosen=BatchSplit(row["batch_local"], row.get("batch_accum") or 0) if row.get("batch_local") else None,
        batch_replicas=row.get("batch_replicas"), goodput=goodput_info(row.get("goodput_reports")),
    ))


def _frozen(cls: type[_Record], values: dict[str, Any]) -> _Record:
    """``cls(**values)`` for a frozen dataclass without slots given every one of its fields, without the
    generated ``__init__``, which sets each field through ``object.__setattr__``: a JobInfo (53 fields)
    in 1 microsecond instead of 8, for answers of 10,000 jobs and list pages of 1,000s."""
    record = object.__new__(cls)
    record.__dict__.update(values)
    return record


def _job_state(value: str) -> JobState:
    """A row's state as the enum: a member as it is (calling the enum class costs several microseconds a
    row, which a page of 1,000s of jobs notices)."""
    return value if type(value) is JobState else JobState(value)


def batch_limits(init: int | None, largest: int | None, largest_local: int | None) -> BatchLimits | None:
    """A job's batch limits from its three columns (migration 0014); None for a job without."""
    return BatchLimits(init, largest, largest_local) if init and largest and largest_local else None


def event_info(row: Values) -> EventInfo:
    return EventInfo(
        id=row["id"], time=row["time"], kind=row["kind"], job_id=row["job_id"], server_id=row["server_id"],
        from_state=row["from_state"], to_state=row["to_state"], reason=row["reason"], message=row["message"],
        details=row["details"] or {},
    )


def server_info(row: Values, gpus: Iterable[Values], holders: Mapping[int, int]) -> ServerInfo:
    """``gpus``: the server's ``gpus`` rows in index order; ``holders``: GPU index -> the job holding it."""
    return ServerInfo(
        id=row["id"], hostname=row["hostname"], pool=Pool(row["pool"]), state=ServerState(row["state"]),
        state_reason=row["state_reason"], state_before_fault=row["state_before_fault"],
        agent_address=row["agent_address"], agent_version=row["agent_version"], registered_at=row["registered_at"],
        last_seen_at=row["last_seen_at"], desired_generation=row["desired_generation"],
        observed_generation=row["observed_generation"], state_changed_at=row["state_changed_at"],
        logs_address=row["logs_address"], inference_endpoint=row["inference_endpoint"], drained_at=row["drained_at"],
        admin_state=row["admin_state"], admin_reason=row["admin_reason"], drain_deadline=row["drain_deadline"],
        gpus=tuple(
            GpuInfo(
                index=g["index"], uuid=g["uuid"], model=g["model"], memory_total_bytes=g["memory_total_bytes"],
                healthy=g["healthy"], health_reason=g["health_reason"], utilization=g["utilization"],
                memory_used_bytes=g["memory_used_bytes"], temperature_c=g["temperature_c"],
                job_id=holders.get(g["index"]),
            )
            for g in gpus
        ),
    )


def loan_info(row: Values) -> LoanInfo:
    return LoanInfo(
        id=row["id"], server_id=row["server_id"], state=row["state"], reason=row["reason"],
        started_at=row["started_at"], ended_at=row["ended_at"], hard_deadline=row["hard_deadline"],
    )


def demand_info(row: Values) -> DemandInfo:
    return DemandInfo(
        time=row["time"], servers_needed=row["servers_needed"], observed_rps=row["observed_rps"], source=row["source"]
    )
