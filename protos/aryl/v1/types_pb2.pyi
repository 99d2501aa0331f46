import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SCALING: _ClassVar[JobState]
    JOB_STATE_PREEMPTED: _ClassVar[JobState]
    JOB_STATE_COMPLETED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class RestartPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESTART_POLICY_UNSPECIFIED: _ClassVar[RestartPolicy]
    RESTART_POLICY_NEVER: _ClassVar[RestartPolicy]
    RESTART_POLICY_ON_FAILURE: _ClassVar[RestartPolicy]

class DeadlineStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEADLINE_STATUS_UNSPECIFIED: _ClassVar[DeadlineStatus]
    DEADLINE_STATUS_NONE: _ClassVar[DeadlineStatus]
    DEADLINE_STATUS_UNKNOWN: _ClassVar[DeadlineStatus]
    DEADLINE_STATUS_ON_TRACK: _ClassVar[DeadlineStatus]
    DEADLINE_STATUS_AT_RISK: _ClassVar[DeadlineStatus]
    DEADLINE_STATUS_WILL_MISS: _ClassVar[DeadlineStatus]
    DEADLINE_STATUS_MET: _ClassVar[DeadlineStatus]
    DEADLINE_STATUS_MISSED: _ClassVar[DeadlineStatus]

class Pool(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOL_UNSPECIFIED: _ClassVar[Pool]
    POOL_TRAINING: _ClassVar[Pool]
    POOL_INFERENCE: _ClassVar[Pool]

class ServerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVER_STATE_UNSPECIFIED: _ClassVar[ServerState]
    SERVER_STATE_TRAINING: _ClassVar[ServerState]
    SERVER_STATE_SERVING: _ClassVar[ServerState]
    SERVER_STATE_DRAINING: _ClassVar[ServerState]
    SERVER_STATE_LOANED: _ClassVar[ServerState]
    SERVER_STATE_RECLAIMING: _ClassVar[ServerState]
    SERVER_STATE_LOST: _ClassVar[ServerState]
    SERVER_STATE_UNHEALTHY: _ClassVar[ServerState]

class LoanState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOAN_STATE_UNSPECIFIED: _ClassVar[LoanState]
    LOAN_STATE_ACTIVE: _ClassVar[LoanState]
    LOAN_STATE_RECLAIMING: _ClassVar[LoanState]
    LOAN_STATE_RETURNED: _ClassVar[LoanState]

class EventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EVENT_KIND_UNSPECIFIED: _ClassVar[EventKind]
    EVENT_KIND_JOB_SUBMITTED: _ClassVar[EventKind]
    EVENT_KIND_JOB_STATE_CHANGED: _ClassVar[EventKind]
    EVENT_KIND_JOB_PENDING_REASON: _ClassVar[EventKind]
    EVENT_KIND_SERVER_REGISTERED: _ClassVar[EventKind]
    EVENT_KIND_SERVER_STATE_CHANGED: _ClassVar[EventKind]
    EVENT_KIND_LOAN_STARTED: _ClassVar[EventKind]
    EVENT_KIND_LOAN_ENDED: _ClassVar[EventKind]
    EVENT_KIND_DEMAND_CHANGED: _ClassVar[EventKind]
    EVENT_KIND_GPU_HEALTH_CHANGED: _ClassVar[EventKind]
    EVENT_KIND_SCHEDULER_STARTED: _ClassVar[EventKind]
    EVENT_KIND_WORKER_EXITED: _ClassVar[EventKind]
    EVENT_KIND_SERVER_DRAINED: _ClassVar[EventKind]
    EVENT_KIND_SERVER_ADMIN_CHANGED: _ClassVar[EventKind]
    EVENT_KIND_JOB_SIZE_HELD: _ClassVar[EventKind]
    EVENT_KIND_LOAN_DECISION: _ClassVar[EventKind]
    EVENT_KIND_JOB_BATCH_CHANGED: _ClassVar[EventKind]
    EVENT_KIND_WORKER_STOP_ACKNOWLEDGED: _ClassVar[EventKind]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SCALING: JobState
JOB_STATE_PREEMPTED: JobState
JOB_STATE_COMPLETED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
RESTART_POLICY_UNSPECIFIED: RestartPolicy
RESTART_POLICY_NEVER: RestartPolicy
RESTART_POLICY_ON_FAILURE: RestartPolicy
DEADLINE_STATUS_UNSPECIFIED: DeadlineStatus
DEADLINE_STATUS_NONE: DeadlineStatus
DEADLINE_STATUS_UNKNOWN: DeadlineStatus
DEADLINE_STATUS_ON_TRACK: DeadlineStatus
DEADLINE_STATUS_AT_RISK: DeadlineStatus
DEADLINE_STATUS_WILL_MISS: DeadlineStatus
DEADLINE_STATUS_MET: DeadlineStatus
DEADLINE_STATUS_MISSED: DeadlineStatus
POOL_UNSPECIFIED: Pool
POOL_TRAINING: Pool
POOL_INFERENCE: Pool
SERVER_STATE_UNSPECIFIED: ServerState
SERVER_STATE_TRAINING: ServerState
SERVER_STATE_SERVING: ServerState
SERVER_STATE_DRAINING: ServerState
SERVER_STATE_LOANED: ServerState
SERVER_STATE_RECLAIMING: ServerState
SERVER_STATE_LOST: ServerState
SERVER_STATE_UNHEALTHY: ServerState
LOAN_STATE_UNSPECIFIED: LoanState
LOAN_STATE_ACTIVE: LoanState
LOAN_STATE_RECLAIMING: LoanState
LOAN_STATE_RETURNED: LoanState
EVENT_KIND_UNSPECIFIED: EventKind
EVENT_KIND_JOB_SUBMITTED: EventKind
EVENT_KIND_JOB_STATE_CHANGED: EventKind
EVENT_KIND_JOB_PENDING_REASON: EventKind
EVENT_KIND_SERVER_REGISTERED: EventKind
EVENT_KIND_SERVER_STATE_CHANGED: EventKind
EVENT_KIND_LOAN_STARTED: EventKind
EVENT_KIND_LOAN_ENDED: EventKind
EVENT_KIND_DEMAND_CHANGED: EventKind
EVENT_KIND_GPU_HEALTH_CHANGED: EventKind
EVENT_KIND_SCHEDULER_STARTED: EventKind
EVENT_KIND_WORKER_EXITED: EventKind
EVENT_KIND_SERVER_DRAINED: EventKind
EVENT_KIND_SERVER_ADMIN_CHANGED: EventKind
EVENT_KIND_JOB_SIZE_HELD: EventKind
EVENT_KIND_LOAN_DECISION: EventKind
EVENT_KIND_JOB_BATCH_CHANGED: EventKind
EVENT_KIND_WORKER_STOP_ACKNOWLEDGED: EventKind

class ThroughputPoint(_message.Message):
    __slots__ = ("workers", "samples_per_second")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    workers: int
    samples_per_second: float
    def __init__(self, workers: _Optional[int] = ..., samples_per_second: _Optional[float] = ...) -> None: ...

class ThroughputHints(_message.Message):
    __slots__ = ("points", "total_work", "estimated_runtime")
    POINTS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_WORK_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    points: _containers.RepeatedCompositeFieldContainer[ThroughputPoint]
    total_work: float
    estimated_runtime: _duration_pb2.Duration
    def __init__(self, points: _Optional[_Iterable[_Union[ThroughputPoint, _Mapping]]] = ..., total_work: _Optional[float] = ..., estimated_runtime: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class BatchHints(_message.Message):
    __slots__ = ("init_batch_size", "max_batch_size", "max_local_batch_size")
    INIT_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    init_batch_size: int
    max_batch_size: int
    max_local_batch_size: int
    def __init__(self, init_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_local_batch_size: _Optional[int] = ...) -> None: ...

class StepTime(_message.Message):
    __slots__ = ("nodes", "replicas", "local_batch_size", "accum_steps", "pass_time_s", "step_time_s", "measured_at", "gpu_type")
    NODES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    PASS_TIME_S_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    nodes: int
    replicas: int
    local_batch_size: int
    accum_steps: int
    pass_time_s: float
    step_time_s: float
    measured_at: _timestamp_pb2.Timestamp
    gpu_type: str
    def __init__(self, nodes: _Optional[int] = ..., replicas: _Optional[int] = ..., local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., pass_time_s: _Optional[float] = ..., step_time_s: _Optional[float] = ..., measured_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., gpu_type: _Optional[str] = ...) -> None: ...

class TypeSpeed(_message.Message):
    __slots__ = ("gpu_type", "samples_per_gpu_s", "local_batch_size", "source", "relative")
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_GPU_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    RELATIVE_FIELD_NUMBER: _ClassVar[int]
    gpu_type: str
    samples_per_gpu_s: float
    local_batch_size: int
    source: str
    relative: float
    def __init__(self, gpu_type: _Optional[str] = ..., samples_per_gpu_s: _Optional[float] = ..., local_batch_size: _Optional[int] = ..., source: _Optional[str] = ..., relative: _Optional[float] = ...) -> None: ...

class SpeedupPrediction(_message.Message):
    __slots__ = ("workers", "reference_workers", "speedup", "local_batch_size", "accum_steps", "batch_size", "source")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_WORKERS_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    workers: int
    reference_workers: int
    speedup: float
    local_batch_size: int
    accum_steps: int
    batch_size: int
    source: str
    def __init__(self, workers: _Optional[int] = ..., reference_workers: _Optional[int] = ..., speedup: _Optional[float] = ..., local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., batch_size: _Optional[int] = ..., source: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "user", "queue", "command", "env", "gpus_per_worker", "min_workers", "max_workers", "priority", "deadline", "throughput", "max_runtime", "restart_policy", "max_restarts", "working_dir", "working_dir_if_exists", "priority_class", "gpu_types", "batch")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    GPUS_PER_WORKER_FIELD_NUMBER: _ClassVar[int]
    MIN_WORKERS_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNTIME_FIELD_NUMBER: _ClassVar[int]
    RESTART_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_RESTARTS_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_IF_EXISTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPES_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    user: str
    queue: str
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    gpus_per_worker: int
    min_workers: int
    max_workers: int
    priority: int
    deadline: _timestamp_pb2.Timestamp
    throughput: ThroughputHints
    max_runtime: _duration_pb2.Duration
    restart_policy: RestartPolicy
    max_restarts: int
    working_dir: str
    working_dir_if_exists: bool
    priority_class: str
    gpu_types: _containers.RepeatedScalarFieldContainer[str]
    batch: BatchHints
    def __init__(self, name: _Optional[str] = ..., user: _Optional[str] = ..., queue: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., gpus_per_worker: _Optional[int] = ..., min_workers: _Optional[int] = ..., max_workers: _Optional[int] = ..., priority: _Optional[int] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., throughput: _Optional[_Union[ThroughputHints, _Mapping]] = ..., max_runtime: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., restart_policy: _Optional[_Union[RestartPolicy, str]] = ..., max_restarts: _Optional[int] = ..., working_dir: _Optional[str] = ..., working_dir_if_exists: _Optional[bool] = ..., priority_class: _Optional[str] = ..., gpu_types: _Optional[_Iterable[str]] = ..., batch: _Optional[_Union[BatchHints, _Mapping]] = ...) -> None: ...

class WorkerAllocation(_message.Message):
    __slots__ = ("rank", "server_id", "gpu_indices")
    RANK_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    rank: int
    server_id: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, rank: _Optional[int] = ..., server_id: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "spec", "state", "reason", "message", "pending_reason", "num_workers", "workers", "submitted_at", "started_at", "finished_at", "restarts", "preemptions", "idempotency_key", "version", "progress", "incarnation", "last_checkpoint_at", "size_note", "predicted_finish", "prediction_confidence", "deadline_status", "deadline_note", "workers_needed", "priority_class_value", "array_job_id", "array_index", "local_batch_size", "accum_steps", "batch_size", "step_times", "grad_sqr", "grad_var", "noise_scale", "samples", "predicted_speedups", "type_speeds", "eta_start", "eta_finish", "eta_note", "eta_after_job_ids", "eta_made_at")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PENDING_REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_WORKERS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_AT_FIELD_NUMBER: _ClassVar[int]
    SIZE_NOTE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_FINISH_FIELD_NUMBER: _ClassVar[int]
    PREDICTION_CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_STATUS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_NOTE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_CLASS_VALUE_FIELD_NUMBER: _ClassVar[int]
    ARRAY_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ARRAY_INDEX_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMES_FIELD_NUMBER: _ClassVar[int]
    GRAD_SQR_FIELD_NUMBER: _ClassVar[int]
    GRAD_VAR_FIELD_NUMBER: _ClassVar[int]
    NOISE_SCALE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_SPEEDUPS_FIELD_NUMBER: _ClassVar[int]
    TYPE_SPEEDS_FIELD_NUMBER: _ClassVar[int]
    ETA_START_FIELD_NUMBER: _ClassVar[int]
    ETA_FINISH_FIELD_NUMBER: _ClassVar[int]
    ETA_NOTE_FIELD_NUMBER: _ClassVar[int]
    ETA_AFTER_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ETA_MADE_AT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spec: JobSpec
    state: JobState
    reason: str
    message: str
    pending_reason: str
    num_workers: int
    workers: _containers.RepeatedCompositeFieldContainer[WorkerAllocation]
    submitted_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    restarts: int
    preemptions: int
    idempotency_key: str
    version: int
    progress: float
    incarnation: int
    last_checkpoint_at: _timestamp_pb2.Timestamp
    size_note: str
    predicted_finish: _timestamp_pb2.Timestamp
    prediction_confidence: float
    deadline_status: DeadlineStatus
    deadline_note: str
    workers_needed: int
    priority_class_value: int
    array_job_id: str
    array_index: int
    local_batch_size: int
    accum_steps: int
    batch_size: int
    step_times: _containers.RepeatedCompositeFieldContainer[StepTime]
    grad_sqr: float
    grad_var: float
    noise_scale: float
    samples: float
    predicted_speedups: _containers.RepeatedCompositeFieldContainer[SpeedupPrediction]
    type_speeds: _containers.RepeatedCompositeFieldContainer[TypeSpeed]
    eta_start: _timestamp_pb2.Timestamp
    eta_finish: _timestamp_pb2.Timestamp
    eta_note: str
    eta_after_job_ids: _containers.RepeatedScalarFieldContainer[str]
    eta_made_at: _timestamp_pb2.Timestamp
    def __init__(self, job_id: _Optional[str] = ..., spec: _Optional[_Union[JobSpec, _Mapping]] = ..., state: _Optional[_Union[JobState, str]] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., pending_reason: _Optional[str] = ..., num_workers: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[WorkerAllocation, _Mapping]]] = ..., submitted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., restarts: _Optional[int] = ..., preemptions: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., version: _Optional[int] = ..., progress: _Optional[float] = ..., incarnation: _Optional[int] = ..., last_checkpoint_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., size_note: _Optional[str] = ..., predicted_finish: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., prediction_confidence: _Optional[float] = ..., deadline_status: _Optional[_Union[DeadlineStatus, str]] = ..., deadline_note: _Optional[str] = ..., workers_needed: _Optional[int] = ..., priority_class_value: _Optional[int] = ..., array_job_id: _Optional[str] = ..., array_index: _Optional[int] = ..., local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., batch_size: _Optional[int] = ..., step_times: _Optional[_Iterable[_Union[StepTime, _Mapping]]] = ..., grad_sqr: _Optional[float] = ..., grad_var: _Optional[float] = ..., noise_scale: _Optional[float] = ..., samples: _Optional[float] = ..., predicted_speedups: _Optional[_Iterable[_Union[SpeedupPrediction, _Mapping]]] = ..., type_speeds: _Optional[_Iterable[_Union[TypeSpeed, _Mapping]]] = ..., eta_start: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., eta_finish: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., eta_note: _Optional[str] = ..., eta_after_job_ids: _Optional[_Iterable[str]] = ..., eta_made_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "memory_total_bytes", "healthy", "health_reason", "job_id", "utilization", "memory_used_bytes", "temperature_c")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    healthy: bool
    health_reason: str
    job_id: str
    utilization: float
    memory_used_bytes: int
    temperature_c: float
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., healthy: _Optional[bool] = ..., health_reason: _Optional[str] = ..., job_id: _Optional[str] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., temperature_c: _Optional[float] = ...) -> None: ...

class Server(_message.Message):
    __slots__ = ("server_id", "hostname", "pool", "state", "state_reason", "gpus", "gpus_total", "gpus_used", "gpus_healthy", "registered_at", "last_seen_at", "desired_generation", "observed_generation", "agent_address", "admin_state", "admin_reason", "gpu_type")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STATE_REASON_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_USED_FIELD_NUMBER: _ClassVar[int]
    GPUS_HEALTHY_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AT_FIELD_NUMBER: _ClassVar[int]
    DESIRED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    ADMIN_STATE_FIELD_NUMBER: _ClassVar[int]
    ADMIN_REASON_FIELD_NUMBER: _ClassVar[int]
    GPU_TYPE_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    hostname: str
    pool: Pool
    state: ServerState
    state_reason: str
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    gpus_total: int
    gpus_used: int
    gpus_healthy: int
    registered_at: _timestamp_pb2.Timestamp
    last_seen_at: _timestamp_pb2.Timestamp
    desired_generation: int
    observed_generation: int
    agent_address: str
    admin_state: str
    admin_reason: str
    gpu_type: str
    def __init__(self, server_id: _Optional[str] = ..., hostname: _Optional[str] = ..., pool: _Optional[_Union[Pool, str]] = ..., state: _Optional[_Union[ServerState, str]] = ..., state_reason: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., gpus_total: _Optional[int] = ..., gpus_used: _Optional[int] = ..., gpus_healthy: _Optional[int] = ..., registered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_seen_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., desired_generation: _Optional[int] = ..., observed_generation: _Optional[int] = ..., agent_address: _Optional[str] = ..., admin_state: _Optional[str] = ..., admin_reason: _Optional[str] = ..., gpu_type: _Optional[str] = ...) -> None: ...

class Loan(_message.Message):
    __slots__ = ("loan_id", "server_id", "state", "reason", "started_at", "ended_at", "hard_deadline")
    LOAN_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    HARD_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    loan_id: str
    server_id: str
    state: LoanState
    reason: str
    started_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    hard_deadline: _timestamp_pb2.Timestamp
    def __init__(self, loan_id: _Optional[str] = ..., server_id: _Optional[str] = ..., state: _Optional[_Union[LoanState, str]] = ..., reason: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., hard_deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("event_id", "time", "kind", "job_id", "server_id", "from_state", "to_state", "reason", "message", "details")
    class DetailsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_STATE_FIELD_NUMBER: _ClassVar[int]
    TO_STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAILS_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    time: _timestamp_pb2.Timestamp
    kind: EventKind
    job_id: str
    server_id: str
    from_state: str
    to_state: str
    reason: str
    message: str
    details: _containers.ScalarMap[str, str]
    def __init__(self, event_id: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., kind: _Optional[_Union[EventKind, str]] = ..., job_id: _Optional[str] = ..., server_id: _Optional[str] = ..., from_state: _Optional[str] = ..., to_state: _Optional[str] = ..., reason: _Optional[str] = ..., message: _Optional[str] = ..., details: _Optional[_Mapping[str, str]] = ...) -> None: ...

class InferenceDemand(_message.Message):
    __slots__ = ("servers_needed", "observed_rps", "source", "reported_at")
    SERVERS_NEEDED_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_RPS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    servers_needed: int
    observed_rps: float
    source: str
    reported_at: _timestamp_pb2.Timestamp
    def __init__(self, servers_needed: _Optional[int] = ..., observed_rps: _Optional[float] = ..., source: _Optional[str] = ..., reported_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
