import datetime

from protos.aryl.v1 import types_pb2 as _types_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmittedJobsView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SUBMITTED_JOBS_VIEW_UNSPECIFIED: _ClassVar[SubmittedJobsView]
    SUBMITTED_JOBS_VIEW_LIST: _ClassVar[SubmittedJobsView]
    SUBMITTED_JOBS_VIEW_IDS: _ClassVar[SubmittedJobsView]
SUBMITTED_JOBS_VIEW_UNSPECIFIED: SubmittedJobsView
SUBMITTED_JOBS_VIEW_LIST: SubmittedJobsView
SUBMITTED_JOBS_VIEW_IDS: SubmittedJobsView

class SubmitJobRequest(_message.Message):
    __slots__ = ("spec", "idempotency_key")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    spec: _types_pb2.JobSpec
    idempotency_key: str
    def __init__(self, spec: _Optional[_Union[_types_pb2.JobSpec, _Mapping]] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class SubmitJobResponse(_message.Message):
    __slots__ = ("job", "predicted_finish", "deadline_status", "admission_note", "workers_needed")
    JOB_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FINISH_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_STATUS_FIELD_NUMBER: _ClassVar[int]
    ADMISSION_NOTE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    predicted_finish: _timestamp_pb2.Timestamp
    deadline_status: _types_pb2.DeadlineStatus
    admission_note: str
    workers_needed: int
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., predicted_finish: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deadline_status: _Optional[_Union[_types_pb2.DeadlineStatus, str]] = ..., admission_note: _Optional[str] = ..., workers_needed: _Optional[int] = ...) -> None: ...

class SubmitJobsRequest(_message.Message):
    __slots__ = ("jobs", "array_indices", "view")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDICES_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[SubmitJobRequest]
    array_indices: _containers.RepeatedScalarFieldContainer[int]
    view: SubmittedJobsView
    def __init__(self, jobs: _Optional[_Iterable[_Union[SubmitJobRequest, _Mapping]]] = ..., array_indices: _Optional[_Iterable[int]] = ..., view: _Optional[_Union[SubmittedJobsView, str]] = ...) -> None: ...

class SubmitJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]] = ...) -> None: ...

class CancelJobArrayRequest(_message.Message):
    __slots__ = ("array_job_id", "reason")
    ARRAY_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    array_job_id: str
    reason: str
    def __init__(self, array_job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobArrayResponse(_message.Message):
    __slots__ = ("cancelled_job_ids",)
    CANCELLED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    cancelled_job_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cancelled_job_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id", "include_events")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_EVENTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    include_events: bool
    def __init__(self, job_id: _Optional[str] = ..., include_events: _Optional[bool] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job", "events")
    JOB_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    events: _containers.RepeatedCompositeFieldContainer[_types_pb2.Event]
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_types_pb2.Event, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("states", "user", "queue", "page_size", "page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[_types_pb2.JobState]
    user: str
    queue: str
    page_size: int
    page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[_types_pb2.JobState, str]]] = ..., user: _Optional[str] = ..., queue: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_types_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_types_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("after_event_id", "job_id", "server_id")
    AFTER_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    after_event_id: int
    job_id: str
    server_id: str
    def __init__(self, after_event_id: _Optional[int] = ..., job_id: _Optional[str] = ..., server_id: _Optional[str] = ...) -> None: ...

class GetClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PoolSummary(_message.Message):
    __slots__ = ("pool", "servers", "gpus_total", "gpus_used", "gpus_loaned", "gpus_unavailable")
    POOL_FIELD_NUMBER: _ClassVar[int]
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_USED_FIELD_NUMBER: _ClassVar[int]
    GPUS_LOANED_FIELD_NUMBER: _ClassVar[int]
    GPUS_UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    pool: _types_pb2.Pool
    servers: int
    gpus_total: int
    gpus_used: int
    gpus_loaned: int
    gpus_unavailable: int
    def __init__(self, pool: _Optional[_Union[_types_pb2.Pool, str]] = ..., servers: _Optional[int] = ..., gpus_total: _Optional[int] = ..., gpus_used: _Optional[int] = ..., gpus_loaned: _Optional[int] = ..., gpus_unavailable: _Optional[int] = ...) -> None: ...

class JobStateCount(_message.Message):
    __slots__ = ("state", "count")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    state: _types_pb2.JobState
    count: int
    def __init__(self, state: _Optional[_Union[_types_pb2.JobState, str]] = ..., count: _Optional[int] = ...) -> None: ...

class GetClusterResponse(_message.Message):
    __slots__ = ("pools", "jobs", "demand", "policy", "scheduler_epoch", "active_loans", "not_loaned", "queues", "replicas")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LOANS_FIELD_NUMBER: _ClassVar[int]
    NOT_LOANED_FIELD_NUMBER: _ClassVar[int]
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolSummary]
    jobs: _containers.RepeatedCompositeFieldContainer[JobStateCount]
    demand: _types_pb2.InferenceDemand
    policy: str
    scheduler_epoch: int
    active_loans: int
    not_loaned: str
    queues: _containers.RepeatedCompositeFieldContainer[Queue]
    replicas: _containers.RepeatedCompositeFieldContainer[SchedulerReplica]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolSummary, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[JobStateCount, _Mapping]]] = ..., demand: _Optional[_Union[_types_pb2.InferenceDemand, _Mapping]] = ..., policy: _Optional[str] = ..., scheduler_epoch: _Optional[int] = ..., active_loans: _Optional[int] = ..., not_loaned: _Optional[str] = ..., queues: _Optional[_Iterable[_Union[Queue, _Mapping]]] = ..., replicas: _Optional[_Iterable[_Union[SchedulerReplica, _Mapping]]] = ...) -> None: ...

class SchedulerReplica(_message.Message):
    __slots__ = ("address", "push_address", "heartbeat_age_seconds", "up_seconds", "leader", "live")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PUSH_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    address: str
    push_address: str
    heartbeat_age_seconds: float
    up_seconds: float
    leader: bool
    live: bool
    def __init__(self, address: _Optional[str] = ..., push_address: _Optional[str] = ..., heartbeat_age_seconds: _Optional[float] = ..., up_seconds: _Optional[float] = ..., leader: _Optional[bool] = ..., live: _Optional[bool] = ...) -> None: ...

class ListServersRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: _types_pb2.Pool
    def __init__(self, pool: _Optional[_Union[_types_pb2.Pool, str]] = ...) -> None: ...

class ListServersResponse(_message.Message):
    __slots__ = ("servers",)
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    servers: _containers.RepeatedCompositeFieldContainer[_types_pb2.Server]
    def __init__(self, servers: _Optional[_Iterable[_Union[_types_pb2.Server, _Mapping]]] = ...) -> None: ...

class ListLoansRequest(_message.Message):
    __slots__ = ("include_returned",)
    INCLUDE_RETURNED_FIELD_NUMBER: _ClassVar[int]
    include_returned: bool
    def __init__(self, include_returned: _Optional[bool] = ...) -> None: ...

class ListLoansResponse(_message.Message):
    __slots__ = ("loans", "not_loaned", "not_loaned_since", "demand_forecast")
    LOANS_FIELD_NUMBER: _ClassVar[int]
    NOT_LOANED_FIELD_NUMBER: _ClassVar[int]
    NOT_LOANED_SINCE_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FORECAST_FIELD_NUMBER: _ClassVar[int]
    loans: _containers.RepeatedCompositeFieldContainer[_types_pb2.Loan]
    not_loaned: str
    not_loaned_since: _timestamp_pb2.Timestamp
    demand_forecast: DemandForecast
    def __init__(self, loans: _Optional[_Iterable[_Union[_types_pb2.Loan, _Mapping]]] = ..., not_loaned: _Optional[str] = ..., not_loaned_since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., demand_forecast: _Optional[_Union[DemandForecast, _Mapping]] = ...) -> None: ...

class DemandForecast(_message.Message):
    __slots__ = ("made_at", "servers_needed_now", "point", "upper", "lead_s", "quantile", "reclaim_latency_s", "decision_lag_s", "anchors", "trend_per_hour")
    MADE_AT_FIELD_NUMBER: _ClassVar[int]
    SERVERS_NEEDED_NOW_FIELD_NUMBER: _ClassVar[int]
    POINT_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    LEAD_S_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    RECLAIM_LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    DECISION_LAG_S_FIELD_NUMBER: _ClassVar[int]
    ANCHORS_FIELD_NUMBER: _ClassVar[int]
    TREND_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    made_at: _timestamp_pb2.Timestamp
    servers_needed_now: float
    point: float
    upper: float
    lead_s: float
    quantile: float
    reclaim_latency_s: float
    decision_lag_s: float
    anchors: int
    trend_per_hour: float
    def __init__(self, made_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., servers_needed_now: _Optional[float] = ..., point: _Optional[float] = ..., upper: _Optional[float] = ..., lead_s: _Optional[float] = ..., quantile: _Optional[float] = ..., reclaim_latency_s: _Optional[float] = ..., decision_lag_s: _Optional[float] = ..., anchors: _Optional[int] = ..., trend_per_hour: _Optional[float] = ...) -> None: ...

class ExplainJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ExplainJobResponse(_message.Message):
    __slots__ = ("job", "summary", "decisions", "deadline", "queue_status", "eta", "protection", "disruptions_last_hour")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_STATUS_FIELD_NUMBER: _ClassVar[int]
    ETA_FIELD_NUMBER: _ClassVar[int]
    PROTECTION_FIELD_NUMBER: _ClassVar[int]
    DISRUPTIONS_LAST_HOUR_FIELD_NUMBER: _ClassVar[int]
    job: _types_pb2.Job
    summary: str
    decisions: _containers.RepeatedCompositeFieldContainer[_types_pb2.Event]
    deadline: str
    queue_status: str
    eta: str
    protection: str
    disruptions_last_hour: int
    def __init__(self, job: _Optional[_Union[_types_pb2.Job, _Mapping]] = ..., summary: _Optional[str] = ..., decisions: _Optional[_Iterable[_Union[_types_pb2.Event, _Mapping]]] = ..., deadline: _Optional[str] = ..., queue_status: _Optional[str] = ..., eta: _Optional[str] = ..., protection: _Optional[str] = ..., disruptions_last_hour: _Optional[int] = ...) -> None: ...

class WhatIfRequest(_message.Message):
    __slots__ = ("policy", "params", "inference_servers", "horizon_hours")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_SERVERS_FIELD_NUMBER: _ClassVar[int]
    HORIZON_HOURS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    params: _containers.ScalarMap[str, str]
    inference_servers: int
    horizon_hours: float
    def __init__(self, policy: _Optional[str] = ..., params: _Optional[_Mapping[str, str]] = ..., inference_servers: _Optional[int] = ..., horizon_hours: _Optional[float] = ...) -> None: ...

class WhatIfRun(_message.Message):
    __slots__ = ("label", "policy", "changed_params", "metrics", "stop_reason")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    LABEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CHANGED_PARAMS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STOP_REASON_FIELD_NUMBER: _ClassVar[int]
    label: str
    policy: str
    changed_params: _containers.RepeatedScalarFieldContainer[str]
    metrics: _containers.ScalarMap[str, float]
    stop_reason: str
    def __init__(self, label: _Optional[str] = ..., policy: _Optional[str] = ..., changed_params: _Optional[_Iterable[str]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., stop_reason: _Optional[str] = ...) -> None: ...

class WhatIfResponse(_message.Message):
    __slots__ = ("current", "alternative", "table", "horizon_hours", "wall_seconds")
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVE_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    HORIZON_HOURS_FIELD_NUMBER: _ClassVar[int]
    WALL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    current: WhatIfRun
    alternative: WhatIfRun
    table: str
    horizon_hours: float
    wall_seconds: float
    def __init__(self, current: _Optional[_Union[WhatIfRun, _Mapping]] = ..., alternative: _Optional[_Union[WhatIfRun, _Mapping]] = ..., table: _Optional[str] = ..., horizon_hours: _Optional[float] = ..., wall_seconds: _Optional[float] = ...) -> None: ...

class PreviewReclaimRequest(_message.Message):
    __slots__ = ("servers",)
    SERVERS_FIELD_NUMBER: _ClassVar[int]
    servers: int
    def __init__(self, servers: _Optional[int] = ...) -> None: ...

class ScaleInPreview(_message.Message):
    __slots__ = ("job_id", "workers_before", "workers_after")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    WORKERS_BEFORE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_AFTER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    workers_before: int
    workers_after: int
    def __init__(self, job_id: _Optional[str] = ..., workers_before: _Optional[int] = ..., workers_after: _Optional[int] = ...) -> None: ...

class PreviewReclaimResponse(_message.Message):
    __slots__ = ("server_ids", "preempted_job_ids", "scaled_in", "cost_gpu_seconds", "loaned_servers")
    SERVER_IDS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    SCALED_IN_FIELD_NUMBER: _ClassVar[int]
    COST_GPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LOANED_SERVERS_FIELD_NUMBER: _ClassVar[int]
    server_ids: _containers.RepeatedScalarFieldContainer[str]
    preempted_job_ids: _containers.RepeatedScalarFieldContainer[str]
    scaled_in: _containers.RepeatedCompositeFieldContainer[ScaleInPreview]
    cost_gpu_seconds: float
    loaned_servers: int
    def __init__(self, server_ids: _Optional[_Iterable[str]] = ..., preempted_job_ids: _Optional[_Iterable[str]] = ..., scaled_in: _Optional[_Iterable[_Union[ScaleInPreview, _Mapping]]] = ..., cost_gpu_seconds: _Optional[float] = ..., loaned_servers: _Optional[int] = ...) -> None: ...

class GetJobLogsRequest(_message.Message):
    __slots__ = ("job_id", "rank", "offset", "max_bytes")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    offset: int
    max_bytes: int
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class GetJobLogsResponse(_message.Message):
    __slots__ = ("data", "offset", "next_offset", "size", "server_id")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    next_offset: int
    size: int
    server_id: str
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., size: _Optional[int] = ..., server_id: _Optional[str] = ...) -> None: ...

class CordonServerRequest(_message.Message):
    __slots__ = ("server_id", "reason")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    reason: str
    def __init__(self, server_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class UncordonServerRequest(_message.Message):
    __slots__ = ("server_id",)
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    def __init__(self, server_id: _Optional[str] = ...) -> None: ...

class DrainServerRequest(_message.Message):
    __slots__ = ("server_id", "reason", "timeout_seconds", "force")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    reason: str
    timeout_seconds: float
    force: bool
    def __init__(self, server_id: _Optional[str] = ..., reason: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., force: _Optional[bool] = ...) -> None: ...

class ServerAdminResponse(_message.Message):
    __slots__ = ("server", "message")
    SERVER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    server: _types_pb2.Server
    message: str
    def __init__(self, server: _Optional[_Union[_types_pb2.Server, _Mapping]] = ..., message: _Optional[str] = ...) -> None: ...

class DeleteServerRequest(_message.Message):
    __slots__ = ("server_id", "force")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    force: bool
    def __init__(self, server_id: _Optional[str] = ..., force: _Optional[bool] = ...) -> None: ...

class DeleteServerResponse(_message.Message):
    __slots__ = ("deleted", "message", "server")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SERVER_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    message: str
    server: _types_pb2.Server
    def __init__(self, deleted: _Optional[bool] = ..., message: _Optional[str] = ..., server: _Optional[_Union[_types_pb2.Server, _Mapping]] = ...) -> None: ...

class Queue(_message.Message):
    __slots__ = ("name", "cohort", "quota_gpus", "borrow_limit_gpus", "fair_share", "used_gpus", "borrowed_gpus", "pending_jobs", "running_jobs", "configured", "quota_is_rest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_GPUS_FIELD_NUMBER: _ClassVar[int]
    BORROW_LIMIT_GPUS_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_FIELD_NUMBER: _ClassVar[int]
    USED_GPUS_FIELD_NUMBER: _ClassVar[int]
    BORROWED_GPUS_FIELD_NUMBER: _ClassVar[int]
    PENDING_JOBS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_FIELD_NUMBER: _ClassVar[int]
    QUOTA_IS_REST_FIELD_NUMBER: _ClassVar[int]
    name: str
    cohort: str
    quota_gpus: int
    borrow_limit_gpus: int
    fair_share: bool
    used_gpus: int
    borrowed_gpus: int
    pending_jobs: int
    running_jobs: int
    configured: bool
    quota_is_rest: bool
    def __init__(self, name: _Optional[str] = ..., cohort: _Optional[str] = ..., quota_gpus: _Optional[int] = ..., borrow_limit_gpus: _Optional[int] = ..., fair_share: _Optional[bool] = ..., used_gpus: _Optional[int] = ..., borrowed_gpus: _Optional[int] = ..., pending_jobs: _Optional[int] = ..., running_jobs: _Optional[int] = ..., configured: _Optional[bool] = ..., quota_is_rest: _Optional[bool] = ...) -> None: ...

class CreateQueueRequest(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class UpdateQueueRequest(_message.Message):
    __slots__ = ("name", "cohort", "quota_gpus", "borrow_limit_gpus", "unlimited_borrowing", "fair_share", "quota_rest")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    QUOTA_GPUS_FIELD_NUMBER: _ClassVar[int]
    BORROW_LIMIT_GPUS_FIELD_NUMBER: _ClassVar[int]
    UNLIMITED_BORROWING_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARE_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REST_FIELD_NUMBER: _ClassVar[int]
    name: str
    cohort: str
    quota_gpus: int
    borrow_limit_gpus: int
    unlimited_borrowing: bool
    fair_share: bool
    quota_rest: bool
    def __init__(self, name: _Optional[str] = ..., cohort: _Optional[str] = ..., quota_gpus: _Optional[int] = ..., borrow_limit_gpus: _Optional[int] = ..., unlimited_borrowing: _Optional[bool] = ..., fair_share: _Optional[bool] = ..., quota_rest: _Optional[bool] = ...) -> None: ...

class QueueResponse(_message.Message):
    __slots__ = ("queue",)
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    queue: Queue
    def __init__(self, queue: _Optional[_Union[Queue, _Mapping]] = ...) -> None: ...

class DeleteQueueRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteQueueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListQueuesResponse(_message.Message):
    __slots__ = ("queues",)
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[Queue]
    def __init__(self, queues: _Optional[_Iterable[_Union[Queue, _Mapping]]] = ...) -> None: ...
