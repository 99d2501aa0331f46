"""Protobuf of the forecast (``app.forecast``): a job's ETA fields, and the WhatIf answer.

Never: compute a forecast (the application layer does), or hold SQL.
"""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.timestamp_pb2 import Timestamp

from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.app.forecast import Forecasts, WhatIf, WhatIfRun, changed_params
from scheduler_service.core.params import PolicyParams
from scheduler_service.lifecycle import JobState
from scheduler_service.records import JobInfo

# Jobs whose start the ETA is about (a preempted job is requeued at once: PREEMPTED -> PENDING).
WAITING = frozenset({JobState.PENDING, JobState.PREEMPTED})


def add_eta(message: types_pb2.Job, record: JobInfo, forecasts: Forecasts | None) -> types_pb2.Job:
    """``message`` with ``record``'s ETA from the latest forecast (nothing before the first one, nor for
    a job that has ended)."""
    if forecasts is None or record.state.is_terminal:
        return message
    eta = forecasts.eta(record.id, pending=record.state in WAITING)
    if eta is None:
        return message
    _set(message.eta_made_at, eta.made_at)
    if eta.start is not None:
        _set(message.eta_start, eta.start)
    if eta.finish is not None:
        _set(message.eta_finish, eta.finish)
    message.eta_note = eta.note
    message.eta_after_job_ids.extend(str(j) for j in eta.after)
    return message


def _set(field: Timestamp, seconds: float) -> None:
    field.FromNanoseconds(round(seconds * 1e9))  # as ``convert.timestamp``


def _metrics(summary: Mapping[str, object], prefix: str = "") -> dict[str, float]:
    """The summary's numbers, nested keys joined with a dot (``gpu_utilization.overall``)."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        if isinstance(value, Mapping):
            out.update(_metrics(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = float(value)
    return out


def _run(run: WhatIfRun, live: PolicyParams) -> scheduler_pb2.WhatIfRun:
    return scheduler_pb2.WhatIfRun(
        label=run.label, policy=run.policy, changed_params=changed_params(live, run.params),
        metrics=_metrics(run.summary), stop_reason=str(run.summary["stop_reason"]),
    )


def what_if_response(result: WhatIf, live: PolicyParams) -> scheduler_pb2.WhatIfResponse:
    return scheduler_pb2.WhatIfResponse(
        current=_run(result.current, live), alternative=_run(result.alternative, live), table=result.table,
        horizon_hours=result.horizon_s / 3600.0, wall_seconds=result.wall_s,
    )
