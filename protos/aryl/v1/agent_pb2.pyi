import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from protos.aryl.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_PHASE_UNSPECIFIED: _ClassVar[WorkerPhase]
    WORKER_PHASE_STARTING: _ClassVar[WorkerPhase]
    WORKER_PHASE_RUNNING: _ClassVar[WorkerPhase]
    WORKER_PHASE_STOPPING: _ClassVar[WorkerPhase]
    WORKER_PHASE_EXITED: _ClassVar[WorkerPhase]
WORKER_PHASE_UNSPECIFIED: WorkerPhase
WORKER_PHASE_STARTING: WorkerPhase
WORKER_PHASE_RUNNING: WorkerPhase
WORKER_PHASE_STOPPING: WorkerPhase
WORKER_PHASE_EXITED: WorkerPhase

class GpuInfo(_message.Message):
    __slots__ = ("index", "uuid", "model", "memory_total_bytes")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ...) -> None: ...

class RegisterServerRequest(_message.Message):
    __slots__ = ("hostname", "pool", "gpus", "agent_address", "agent_version", "logs_address", "inference_endpoint")
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOGS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    hostname: str
    pool: _types_pb2.Pool
    gpus: _containers.RepeatedCompositeFieldContainer[GpuInfo]
    agent_address: str
    agent_version: str
    logs_address: str
    inference_endpoint: str
    def __init__(self, hostname: _Optional[str] = ..., pool: _Optional[_Union[_types_pb2.Pool, str]] = ..., gpus: _Optional[_Iterable[_Union[GpuInfo, _Mapping]]] = ..., agent_address: _Optional[str] = ..., agent_version: _Optional[str] = ..., logs_address: _Optional[str] = ..., inference_endpoint: _Optional[str] = ...) -> None: ...

class RegisterServerResponse(_message.Message):
    __slots__ = ("server_id", "scheduler_epoch", "report_interval", "desired")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    scheduler_epoch: int
    report_interval: _duration_pb2.Duration
    desired: DesiredState
    def __init__(self, server_id: _Optional[str] = ..., scheduler_epoch: _Optional[int] = ..., report_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., desired: _Optional[_Union[DesiredState, _Mapping]] = ...) -> None: ...

class GpuStatus(_message.Message):
    __slots__ = ("index", "utilization", "memory_used_bytes", "temperature_c", "healthy", "health_reason", "ecc_uncorrectable", "retired_pages")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    HEALTH_REASON_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTABLE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PAGES_FIELD_NUMBER: _ClassVar[int]
    index: int
    utilization: float
    memory_used_bytes: int
    temperature_c: float
    healthy: bool
    health_reason: str
    ecc_uncorrectable: int
    retired_pages: int
    def __init__(self, index: _Optional[int] = ..., utilization: _Optional[float] = ..., memory_used_bytes: _Optional[int] = ..., temperature_c: _Optional[float] = ..., healthy: _Optional[bool] = ..., health_reason: _Optional[str] = ..., ecc_uncorrectable: _Optional[int] = ..., retired_pages: _Optional[int] = ...) -> None: ...

class WorkerStatus(_message.Message):
    __slots__ = ("job_id", "rank", "phase", "exit_code", "progress", "samples_per_second", "incarnation", "checkpoint_progress", "message", "stop_requested", "cannot_start", "step_time_s", "pass_time_s", "local_batch_size", "accum_steps", "grad_sqr", "grad_var", "samples", "checkpoint_acked", "ack_checkpoint_progress", "ack_checkpoint_age", "stop_acknowledged")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STOP_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    CANNOT_START_FIELD_NUMBER: _ClassVar[int]
    STEP_TIME_S_FIELD_NUMBER: _ClassVar[int]
    PASS_TIME_S_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    GRAD_SQR_FIELD_NUMBER: _ClassVar[int]
    GRAD_VAR_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_ACKED_FIELD_NUMBER: _ClassVar[int]
    ACK_CHECKPOINT_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    ACK_CHECKPOINT_AGE_FIELD_NUMBER: _ClassVar[int]
    STOP_ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    phase: WorkerPhase
    exit_code: int
    progress: float
    samples_per_second: float
    incarnation: int
    checkpoint_progress: float
    message: str
    stop_requested: bool
    cannot_start: bool
    step_time_s: float
    pass_time_s: float
    local_batch_size: int
    accum_steps: int
    grad_sqr: float
    grad_var: float
    samples: float
    checkpoint_acked: bool
    ack_checkpoint_progress: float
    ack_checkpoint_age: _duration_pb2.Duration
    stop_acknowledged: bool
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., phase: _Optional[_Union[WorkerPhase, str]] = ..., exit_code: _Optional[int] = ..., progress: _Optional[float] = ..., samples_per_second: _Optional[float] = ..., incarnation: _Optional[int] = ..., checkpoint_progress: _Optional[float] = ..., message: _Optional[str] = ..., stop_requested: _Optional[bool] = ..., cannot_start: _Optional[bool] = ..., step_time_s: _Optional[float] = ..., pass_time_s: _Optional[float] = ..., local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., grad_sqr: _Optional[float] = ..., grad_var: _Optional[float] = ..., samples: _Optional[float] = ..., checkpoint_acked: _Optional[bool] = ..., ack_checkpoint_progress: _Optional[float] = ..., ack_checkpoint_age: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., stop_acknowledged: _Optional[bool] = ...) -> None: ...

class ReportStatusRequest(_message.Message):
    __slots__ = ("server_id", "scheduler_epoch", "gpus", "workers", "observed_generation")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    scheduler_epoch: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuStatus]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    observed_generation: int
    def __init__(self, server_id: _Optional[str] = ..., scheduler_epoch: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuStatus, _Mapping]]] = ..., workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ..., observed_generation: _Optional[int] = ...) -> None: ...

class ReportStatusResponse(_message.Message):
    __slots__ = ("desired_generation", "report_interval")
    DESIRED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REPORT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    desired_generation: int
    report_interval: _duration_pb2.Duration
    def __init__(self, desired_generation: _Optional[int] = ..., report_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WatchDesiredStateRequest(_message.Message):
    __slots__ = ("server_id",)
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    def __init__(self, server_id: _Optional[str] = ...) -> None: ...

class DesiredWorker(_message.Message):
    __slots__ = ("job_id", "rank", "world_size", "local_rank", "gpu_indices", "command", "env", "master_addr", "master_port", "grace_period", "incarnation", "working_dir", "working_dir_if_exists", "local_batch_size", "accum_steps", "init_batch_size", "max_batch_size", "max_local_batch_size", "user")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_RANK_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDR_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    GRACE_PERIOD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_FIELD_NUMBER: _ClassVar[int]
    WORKING_DIR_IF_EXISTS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    ACCUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    INIT_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    rank: int
    world_size: int
    local_rank: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    command: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    master_addr: str
    master_port: int
    grace_period: _duration_pb2.Duration
    incarnation: int
    working_dir: str
    working_dir_if_exists: bool
    local_batch_size: int
    accum_steps: int
    init_batch_size: int
    max_batch_size: int
    max_local_batch_size: int
    user: str
    def __init__(self, job_id: _Optional[str] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., local_rank: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., command: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., master_addr: _Optional[str] = ..., master_port: _Optional[int] = ..., grace_period: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., incarnation: _Optional[int] = ..., working_dir: _Optional[str] = ..., working_dir_if_exists: _Optional[bool] = ..., local_batch_size: _Optional[int] = ..., accum_steps: _Optional[int] = ..., init_batch_size: _Optional[int] = ..., max_batch_size: _Optional[int] = ..., max_local_batch_size: _Optional[int] = ..., user: _Optional[str] = ...) -> None: ...

class DesiredState(_message.Message):
    __slots__ = ("server_id", "scheduler_epoch", "generation", "server_state", "workers")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    SERVER_STATE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    scheduler_epoch: int
    generation: int
    server_state: _types_pb2.ServerState
    workers: _containers.RepeatedCompositeFieldContainer[DesiredWorker]
    def __init__(self, server_id: _Optional[str] = ..., scheduler_epoch: _Optional[int] = ..., generation: _Optional[int] = ..., server_state: _Optional[_Union[_types_pb2.ServerState, str]] = ..., workers: _Optional[_Iterable[_Union[DesiredWorker, _Mapping]]] = ...) -> None: ...

class ReadWorkerLogRequest(_message.Message):
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

class ReadWorkerLogResponse(_message.Message):
    __slots__ = ("data", "offset", "next_offset", "size")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    next_offset: int
    size: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class DeregisterRequest(_message.Message):
    __slots__ = ("server_id", "reason")
    SERVER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    server_id: str
    reason: str
    def __init__(self, server_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
