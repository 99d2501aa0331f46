"""Request validation: every field checked, every refusal names the field and the reason.

Validation runs before anything touches the database, so a rejected request changes nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import fnmatch
import ipaddress
import math
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from aryl_common.channels import MAX_JOB_SPEC_BYTES, MAX_WORKERS_PER_SERVER
from protos.aryl.v1 import agent_pb2, scheduler_pb2, types_pb2
from scheduler_service.core.snapshot import BatchLimits
from scheduler_service.errors import InvalidArgument, PermissionDenied
from scheduler_service.lifecycle import JobState, Pool
from scheduler_service.records import (
    GpuReport,
    GpuSample,
    JobFilter,
    JobSubmission,
    ServerRegistration,
    StatusReport,
    WorkerReport,
)

NAME_MAX = 253
# Matched with fullmatch: "$" would also accept a trailing newline.
IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")
HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by the agent for every worker (the job contract); a job may not override them.
RESERVED_ENV = frozenset({"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"})
MAX_WORKERS = 4096
# A registration's inventory; a status report has at most one sample per GPU. Also the most
# workers a server's desired state can carry, which sizes the agents' receive limit.
MAX_GPUS_PER_SERVER = MAX_WORKERS_PER_SERVER
MAX_GPUS_PER_WORKER = 64
MAX_ARGS = 1024
MAX_ARG_LEN = 4096
MAX_ENV = 256
MAX_ENV_VALUE = 32 * 1024
MAX_RESTARTS = 1000
MAX_WORKING_DIR = 4096  # Linux's PATH_MAX, terminating NUL included
MAX_JOB_ID = 2**63 - 1
MAX_BATCH_SIZE = 1 << 24  # samples: far above any batch trained with (Pollux's largest is 2^17)
JOB_STATE_NAMES = {v: JobState(n.removeprefix("JOB_STATE_")) for n, v in types_pb2.JobState.items() if v}
POOL_NAMES: dict[int, Pool] = {types_pb2.POOL_TRAINING: Pool.TRAINING, types_pb2.POOL_INFERENCE: Pool.INFERENCE}
RESTART_POLICIES: dict[int, str] = {
    types_pb2.RESTART_POLICY_UNSPECIFIED: "ON_FAILURE",
    types_pb2.RESTART_POLICY_ON_FAILURE: "ON_FAILURE",
    types_pb2.RESTART_POLICY_NEVER: "NEVER",
}


# The character rule. Names and identifiers (a job's name, user and queue, environment variable
# names, and every other short text field checked by ``text``) are shown to other people in
# terminals, tables and logs, so they may contain none of: C0 controls (U+0000-U+001F, tab and
# newline included), DEL (U+007F), C1 controls (U+0080-U+009F; U+009B is a one-byte ESC [ to many
# terminals) and the Unicode bidirectional overrides, embeddings and isolates (U+202A-U+202E,
# U+2066-U+2069), which make a string display in a different order from what it holds
# ("Trojan Source"). Command arguments and environment VALUES are data handed to the program:
# they may hold tab, newline and carriage return (a `bash -c` or `python -c` script, a PEM key),
# and nothing else from that list (NUL cannot pass execve; a raw ESC or bidi control in a command
# line only serves to make it display differently from what runs: a program that needs one can
# write it as an escape, e.g. printf '\033'). Output (arylctl) escapes what it prints as well.
_BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROLS = "".join(chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))) + _BIDI_CONTROLS
CONTROL_CHARS = re.compile(f"[{re.escape(_CONTROLS)}]")
# The same set less tab, newline and carriage return: for command arguments and environment values.
DATA_CONTROL_CHARS = re.compile(f"[{re.escape(_CONTROLS.translate({9: None, 10: None, 13: None}))}]")


def _refuse_controls(field: str, value: str, pattern: re.Pattern[str], allowed: str = "") -> None:
    found = pattern.search(value)
    if found is not None:
        raise InvalidArgument(
            field, f"must not contain control or bidirectional-override characters{allowed} "
            f"(found U+{ord(found.group()):04X} at position {found.start()})",
        )


def text(field: str, value: str, *, max_len: int, required: bool = False, pattern: re.Pattern[str] | None = None,
         hint: str = "") -> str:
    """A printable string: none of ``CONTROL_CHARS`` (PostgreSQL refuses NUL; the rest display
    misleadingly), bounded length."""
    if not value:
        if required:
            raise InvalidArgument(field, "is required")
        return value
    if len(value) > max_len:
        raise InvalidArgument(field, f"must be at most {max_len} characters (got {len(value)})")
    _refuse_controls(field, value, CONTROL_CHARS)
    if pattern is not None and not pattern.fullmatch(value):
        raise InvalidArgument(field, f"{value!r} is not valid{': ' + hint if hint else ''}")
    return value


def job_id(field: str, value: str) -> int:
    if not value:
        raise InvalidArgument(field, "is required")
    if not value.isascii() or not value.isdigit() or len(value) > 19 or not 0 < int(value) <= MAX_JOB_ID:
        raise InvalidArgument(field, f"{value[:40]!r} is not a job id (job ids are positive numbers, e.g. '42')")
    return int(value)


def _count(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be between {low} and {high} (got {value})")
    return value


def finite(field: str, value: float, *, positive: bool = False) -> float:
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InvalidArgument(field, f"must be a finite number {'>' if positive else '>='} 0 (got {value})")
    return value


def _duration(field: str, value: duration_pb2.Duration) -> float:
    if (value.nanos and (value.seconds < 0) != (value.nanos < 0)) or abs(value.nanos) >= 10**9:
        raise InvalidArgument(field, "is not a valid duration")
    seconds = value.seconds + value.nanos / 1e9
    if seconds < 0:
        raise InvalidArgument(field, f"must not be negative (got {seconds}s)")
    if seconds > 10 * 365 * 86400:
        raise InvalidArgument(field, "must be at most 10 years")
    return seconds


# Times are stored as float seconds; the last second of 9999 would round past Timestamp's range.
MAX_TIMESTAMP_S = 253402300798  # 9999-12-31T23:59:58Z
MAX_INT64 = 2**63 - 1


def _timestamp(field: str, value: timestamp_pb2.Timestamp) -> float:
    if not -62135596800 <= value.seconds <= MAX_TIMESTAMP_S or not 0 <= value.nanos < 10**9:
        raise InvalidArgument(field, "is not a valid timestamp (0001-01-01 .. 9999-12-31T23:59:58Z)")
    return value.seconds + value.nanos / 1e9


def _utc(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172800 else f"{seconds / 86400:.0f} days"


def _bytes(field: str, value: int) -> int:
    if value > MAX_INT64:
        raise InvalidArgument(field, f"must be at most {MAX_INT64} (got {value})")
    return value


def _enum(field: str, value: int, allowed: Iterable[int], enum_type: EnumTypeWrapper) -> int:
    if value not in allowed:
        names = ", ".join(enum_type.Name(v) for v in allowed if v)
        raise InvalidArgument(field, f"unknown value {value}; use one of {names}")
    return value


def _spec_size(spec: types_pb2.JobSpec) -> None:
    """The whole spec within ``MAX_JOB_SPEC_BYTES`` (encoded: UTF-8 bytes plus protobuf framing, a
    little more than execve's argv + envp bytes for the same command and environment).

    Each worker's desired state repeats its job's command and environment, so this cap is what
    keeps a server's desired state, and the worker's execve, within what every hop accepts. The
    refusal names the field that adds the most to the encoded spec (any field of it: an 8 MiB
    ``working_dir`` is named, not the command beside it), where shrinking helps most."""
    total = spec.ByteSize()
    if total <= MAX_JOB_SPEC_BYTES:
        return
    parts = {f"spec.{field.name}": _alone(field, value).ByteSize() for field, value in spec.ListFields()}
    field = max(parts, key=lambda f: parts[f])
    raise InvalidArgument(
        field,
        f"makes the job spec {total} bytes; a spec may be at most {MAX_JOB_SPEC_BYTES} bytes "
        f"({MAX_JOB_SPEC_BYTES // 1024} KiB) in all, command and environment included ({field}: {parts[field]} bytes)",
    )


def _alone(field: FieldDescriptor, value: Any) -> types_pb2.JobSpec:
    """A spec holding ``field`` (of value ``value``) alone: what that field adds to the encoded spec."""
    alone = types_pb2.JobSpec()
    if isinstance(value, (str, bytes, int, float)):  # a scalar (bool and enums are ints)
        setattr(alone, field.name, value)
    else:
        getattr(alone, field.name).MergeFrom(value)  # lists, maps and messages cannot be assigned
    return alone


_DATA_ALLOWED = " other than tab, newline and carriage return"


# A dynamic-loader variable (LD_PRELOAD, LD_LIBRARY_PATH: any LD_* name) loads code into every process of
# the job. The agents refuse such a job when it is to start unless their [users] allow_loader_env
# (``node_agent.identity``); it is refused here, at submission, where its owner learns it at once, unless the
# scheduler's security.allow_loader_env says the agents take them.
LOADER_ENV_PREFIX = "LD_"
LOADER_ENV_REFUSAL = ("is a dynamic-loader variable (LD_*), which the agents refuse: set it inside the job's command "
                      "(e.g. env LD_LIBRARY_PATH=... python3 train.py), or an agent passes its own with [users] "
                      "pass_env; a cluster that allows them sets security.allow_loader_env on the scheduler and "
                      "[users] allow_loader_env on the agents")


def job_submission(spec: types_pb2.JobSpec, idempotency_key: str, *, now: float,
                   allow_loader_env: bool = False) -> JobSubmission:
    """``spec`` checked and turned into a submission; InvalidArgument names the first bad field.
    ``allow_loader_env``: LD_* variables are accepted (security.allow_loader_env)."""
    # First: it bounds the work every other check does.
    _spec_size(spec)
    name = text("spec.name", spec.name, max_len=NAME_MAX, required=True)
    user = text("spec.user", spec.user, max_len=128, required=True, pattern=IDENT,
                hint="letters, digits and . _ @ + -")
    queue = text("spec.queue", spec.queue or "default", max_len=128, pattern=IDENT,
                 hint="letters, digits and . _ @ + -")
    if not spec.command:
        raise InvalidArgument("spec.command", "is required: the program and its arguments")
    if len(spec.command) > MAX_ARGS:
        raise InvalidArgument("spec.command", f"must have at most {MAX_ARGS} arguments")
    text("spec.command[0]", spec.command[0], max_len=MAX_ARG_LEN, required=True)
    for i, arg in enumerate(spec.command):
        if len(arg) > MAX_ARG_LEN:
            raise InvalidArgument(f"spec.command[{i}]", f"must be at most {MAX_ARG_LEN} characters")
        _refuse_controls(f"spec.command[{i}]", arg, DATA_CONTROL_CHARS, _DATA_ALLOWED)
    if len(spec.env) > MAX_ENV:
        raise InvalidArgument("spec.env", f"must have at most {MAX_ENV} variables")
    env = dict(spec.env) if spec.env else {}  # an empty protobuf map's dict() costs as much as the rest
    for key, value in env.items():
        # repr() writes the refused characters as escapes, so the field name is safe to print.
        _refuse_controls(f"spec.env[{key[:40]!r}]", key, CONTROL_CHARS)
        if not ENV_KEY.fullmatch(key):
            raise InvalidArgument(f"spec.env[{key[:40]!r}]", "is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if key in RESERVED_ENV or key.startswith("ARYL_"):
            raise InvalidArgument(f"spec.env[{key!r}]", "is set by Aryl for every worker and cannot be overridden")
        if key.startswith(LOADER_ENV_PREFIX) and not allow_loader_env:
            raise InvalidArgument(f"spec.env[{key!r}]", LOADER_ENV_REFUSAL)
        if len(value) > MAX_ENV_VALUE:
            raise InvalidArgument(f"spec.env[{key!r}]", f"must be at most {MAX_ENV_VALUE} characters")
        _refuse_controls(f"spec.env[{key!r}]", value, DATA_CONTROL_CHARS, _DATA_ALLOWED)
    gpus = _count("spec.gpus_per_worker", spec.gpus_per_worker, 1, MAX_GPUS_PER_WORKER)
    low = _count("spec.min_workers", spec.min_workers, 1, MAX_WORKERS)
    high = spec.max_workers or low  # 0: inelastic, same as min_workers
    if high < low:
        raise InvalidArgument("spec.max_workers", f"must be >= min_workers ({low}) (got {high}); 0 means min_workers")
    _count("spec.max_workers", high, low, MAX_WORKERS)
    deadline = None
    if spec.HasField("deadline"):
        deadline = _timestamp("spec.deadline", spec.deadline)
        if deadline <= now:
            # A deadline before the submission (in the past) can only be missed: refused, with both times.
            raise InvalidArgument("spec.deadline", f"must be after the submission time {_utc(now)} (got "
                                                   f"{_utc(deadline)}, {_ago(now - deadline)} before it); give a "
                                                   "time in the future")
    throughput: dict[str, object] = {}
    if spec.HasField("throughput"):
        hints = spec.throughput
        seen: set[int] = set()
        points = []
        for i, p in enumerate(hints.points):
            _count(f"spec.throughput.points[{i}].workers", p.workers, 1, MAX_WORKERS)
            if p.workers in seen:
                raise InvalidArgument(f"spec.throughput.points[{i}].workers", f"{p.workers} is listed twice")
            seen.add(p.workers)
            points.append([p.workers, finite(f"spec.throughput.points[{i}].samples_per_second",
                                              p.samples_per_second, positive=True)])
        if points:
            throughput["points"] = sorted(points)
        if hints.total_work:
            throughput["total_work"] = finite("spec.throughput.total_work", hints.total_work)
        if hints.HasField("estimated_runtime"):
            throughput["estimated_runtime_s"] = _duration("spec.throughput.estimated_runtime", hints.estimated_runtime)
    max_runtime = None
    if spec.HasField("max_runtime"):
        max_runtime = _duration("spec.max_runtime", spec.max_runtime) or None
    policy = RESTART_POLICIES[
        _enum("spec.restart_policy", spec.restart_policy, RESTART_POLICIES, types_pb2.RestartPolicy)
    ]
    restarts = _count("spec.max_restarts", spec.max_restarts, 0, MAX_RESTARTS)
    submission_key = text("idempotency_key", idempotency_key, max_len=128) or None
    working_dir = _working_dir(spec)
    priority_class = text("spec.priority_class", spec.priority_class, max_len=63, pattern=IDENT,
                          hint="letters, digits and . _ @ + -")
    gpu_types = _gpu_types(spec.gpu_types)
    limits = _batch_limits(spec.batch, high * gpus) if spec.HasField("batch") else None
    return JobSubmission(
        name=name, user=user, queue=queue, command=tuple(spec.command), env=env,
        gpus_per_worker=gpus, min_workers=low, max_workers=high, priority=spec.priority, deadline=deadline,
        throughput=throughput, max_runtime_s=max_runtime, restart_policy=policy, max_restarts=restarts,
        idempotency_key=submission_key, working_dir=working_dir,
        working_dir_if_exists=spec.working_dir_if_exists, priority_class=priority_class, gpu_types=gpu_types,
        batch_limits=limits,
    )


def _batch_limits(batch: types_pb2.BatchHints, most_gpus: int) -> BatchLimits:
    """``spec.batch``: all three sizes required; the largest batch at least the init one and at least
    one sample per GPU of the job's largest allocation (``most_gpus``: max_workers x gpus_per_worker)."""
    init = _count("spec.batch.init_batch_size", batch.init_batch_size, 1, MAX_BATCH_SIZE)
    if not batch.max_batch_size:
        raise InvalidArgument("spec.batch.max_batch_size", f"is required: the largest total batch the job accepts "
                                                           f"(at least init_batch_size, {init}; equal: a fixed batch)")
    if batch.max_batch_size < init:
        raise InvalidArgument("spec.batch.max_batch_size",
                              f"must be >= init_batch_size ({init}) (got {batch.max_batch_size})")
    largest = _count("spec.batch.max_batch_size", batch.max_batch_size, init, MAX_BATCH_SIZE)
    if largest < most_gpus:
        raise InvalidArgument("spec.batch.max_batch_size",
                              f"must be >= {most_gpus}: at its largest (max_workers x gpus_per_worker = {most_gpus} "
                              f"GPUs) the job runs at least one sample per GPU (got {largest}); raise it or "
                              "lower max_workers")
    if not batch.max_local_batch_size:
        raise InvalidArgument("spec.batch.max_local_batch_size",
                              "is required: the largest batch one GPU fits in one forward/backward pass")
    local = _count("spec.batch.max_local_batch_size", batch.max_local_batch_size, 1, MAX_BATCH_SIZE)
    return BatchLimits(init_bsz=init, max_bsz=largest, max_atomic_bsz=local)


MAX_GPU_TYPES = 16


def _gpu_types(types: Sequence[str]) -> tuple[str, ...]:
    """A job's GPU types: at most 16 model names (as agents report them), each listed once."""
    if len(types) > MAX_GPU_TYPES:
        raise InvalidArgument("spec.gpu_types", f"must name at most {MAX_GPU_TYPES} types (got {len(types)})")
    for i, t in enumerate(types):
        text(f"spec.gpu_types[{i}]", t, max_len=128, required=True)
        if t in types[:i]:
            raise InvalidArgument(f"spec.gpu_types[{i}]", f"{t!r} is listed twice")
    return tuple(types)


# A queue's name: a DNS label (1-63 lowercase letters, digits and '-', starting with a letter).
QUEUE_NAME = re.compile(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?")
MAX_QUEUE_GPUS = 1_000_000


def queue_name(field: str, value: str) -> str:
    if not value:
        raise InvalidArgument(field, "is required")
    if not QUEUE_NAME.fullmatch(value):
        raise InvalidArgument(field, f"{value[:70]!r} is not a queue name: 1-63 lowercase letters, digits and '-', "
                                     "starting with a letter and not ending with '-'")
    return value


def cohort_name(field: str, value: str) -> str:
    return queue_name(field, value) if value else ""


def gpu_count(field: str, value: int) -> int:
    """A quota or borrow limit in GPUs: 0 or more."""
    if value < 0 or value > MAX_QUEUE_GPUS:
        raise InvalidArgument(field, f"must be between 0 and {MAX_QUEUE_GPUS} GPUs (got {value}); a negative "
                                     "number is refused")
    return value


# The most jobs one SubmitJobs call may carry: 10,000 make one transaction of about a second here
# (benchmarks/bench_submit.py); a larger array is submitted in several calls (arylctl does).
MAX_BATCH_JOBS = 10_000


def submitted_jobs_view(value: int) -> int:
    """``SubmitJobsRequest.view``: the default (UNSPECIFIED) is the list view."""
    view = _enum("view", value, scheduler_pb2.SubmittedJobsView.values(), scheduler_pb2.SubmittedJobsView)
    return view or scheduler_pb2.SUBMITTED_JOBS_VIEW_LIST


def job_submissions(
    jobs: Sequence[scheduler_pb2.SubmitJobRequest], array_indices: Sequence[int], *, now: float,
    allow_loader_env: bool = False,
) -> list[JobSubmission]:
    """Every job of a ``SubmitJobs`` call, checked as ``SubmitJob`` checks one; the first bad one
    refuses the call, its field named ``jobs[i].<field>``. With ``array_indices`` (one per job,
    distinct) each submission carries its index. Two jobs of one user may not share a key."""
    if not jobs:
        raise InvalidArgument("jobs", "is required: at least one job")
    if len(jobs) > MAX_BATCH_JOBS:
        raise InvalidArgument("jobs", f"must hold at most {MAX_BATCH_JOBS} jobs per call (got {len(jobs)}); "
                                      "submit the rest in further calls")
    if array_indices and len(array_indices) != len(jobs):
        raise InvalidArgument("array_indices", f"must hold one index per job ({len(jobs)}), or none "
                                               f"(got {len(array_indices)})")
    if len(set(array_indices)) != len(array_indices):
        seen: set[int] = set()
        for i, index in enumerate(array_indices):
            if index in seen:
                raise InvalidArgument(f"array_indices[{i}]", f"{index} is listed twice; array indices are distinct")
            seen.add(index)
    subs = []
    keys: dict[tuple[str, str], int] = {}
    for i, request in enumerate(jobs):
        try:
            sub = job_submission(request.spec, request.idempotency_key, now=now, allow_loader_env=allow_loader_env)
        except InvalidArgument as exc:
            raise InvalidArgument(f"jobs[{i}].{exc.field}", exc.reason) from None
        if sub.idempotency_key:
            first = keys.setdefault((sub.user, sub.idempotency_key), i)
            if first != i:
                raise InvalidArgument(f"jobs[{i}].idempotency_key",
                                      f"{sub.idempotency_key!r} is also jobs[{first}]'s (same user {sub.user!r}); "
                                      "each job needs its own key")
        if array_indices:
            sub = dataclasses.replace(sub, array_index=array_indices[i])
        subs.append(sub)
    return subs


def _working_dir(spec: types_pb2.JobSpec) -> str | None:
    """An absolute path on the servers, or None (the agent's per-job directory). Not checked for
    existence: that is each server's to say when it starts a worker."""
    if not spec.working_dir:
        if spec.working_dir_if_exists:
            raise InvalidArgument("spec.working_dir_if_exists",
                                  "needs spec.working_dir: the directory to use where it exists")
        return None
    # The path goes to chdir() as it is: control characters (NUL above all) could not name it faithfully.
    path = text("spec.working_dir", spec.working_dir, max_len=MAX_WORKING_DIR)
    if not path.startswith("/"):
        raise InvalidArgument(
            "spec.working_dir", f"{path[:80]!r} is not an absolute path: give it from the root, e.g. '/home/alice/proj'"
        )
    return path


def job_filter(states: Iterable[int], user: str, queue: str) -> JobFilter:
    parsed = []
    for i, s in enumerate(states):
        if s not in JOB_STATE_NAMES:
            raise InvalidArgument(f"states[{i}]", f"unknown job state {s}")
        parsed.append(JOB_STATE_NAMES[s])
    return JobFilter(
        states=tuple(sorted(set(parsed))),
        user=text("user", user, max_len=128),
        queue=text("queue", queue, max_len=128),
    )


def pool(field: str, value: int, *, required: bool) -> Pool | None:
    if value == types_pb2.POOL_UNSPECIFIED and not required:
        return None
    if value not in POOL_NAMES:
        raise InvalidArgument(field, f"unknown pool {value}; use POOL_TRAINING or POOL_INFERENCE")
    return POOL_NAMES[value]


def server_id(field: str, value: str, *, required: bool = True) -> str:
    return text(field, value, max_len=NAME_MAX, required=required, pattern=HOSTNAME,
                hint="a hostname: letters, digits, '.', '_' and '-'")


def registration(req: agent_pb2.RegisterServerRequest) -> ServerRegistration:
    hostname = server_id("hostname", req.hostname)
    server_pool = pool("pool", req.pool, required=True)
    assert server_pool is not None
    if len(req.gpus) > MAX_GPUS_PER_SERVER:
        raise InvalidArgument("gpus", f"at most {MAX_GPUS_PER_SERVER} GPUs per server")
    indices: set[int] = set()
    uuids: set[str] = set()
    gpus = []
    for i, g in enumerate(req.gpus):
        if g.index >= MAX_GPUS_PER_SERVER:
            raise InvalidArgument(f"gpus[{i}].index", f"must be below {MAX_GPUS_PER_SERVER} (got {g.index})")
        if g.index in indices:
            raise InvalidArgument(f"gpus[{i}].index", f"GPU index {g.index} is listed twice")
        uuid = text(f"gpus[{i}].uuid", g.uuid, max_len=128, required=True)
        if uuid in uuids:
            raise InvalidArgument(f"gpus[{i}].uuid", f"GPU UUID {uuid} is listed twice")
        indices.add(g.index)
        uuids.add(uuid)
        gpus.append(GpuReport(g.index, uuid, text(f"gpus[{i}].model", g.model, max_len=128),
                              _bytes(f"gpus[{i}].memory_total_bytes", g.memory_total_bytes)))
    return ServerRegistration(
        hostname=hostname, pool=server_pool, gpus=tuple(gpus),
        agent_address=text("agent_address", req.agent_address, max_len=NAME_MAX) or hostname,
        agent_version=text("agent_version", req.agent_version, max_len=64),
        logs_address=text("logs_address", req.logs_address, max_len=NAME_MAX, pattern=_HOST_PORT,
                          hint="expected host:port"),
        inference_endpoint=text("inference_endpoint", req.inference_endpoint, max_len=512, pattern=_HTTP_URL,
                                hint="expected an http(s):// URL"),
    )


_HOST_PORT = re.compile(r"[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5}")
_HTTP_URL = re.compile(r"https?://[^\s]+")
_PHASES = {
    agent_pb2.WORKER_PHASE_STARTING: "STARTING",
    agent_pb2.WORKER_PHASE_RUNNING: "RUNNING",
    agent_pb2.WORKER_PHASE_STOPPING: "STOPPING",
    agent_pb2.WORKER_PHASE_EXITED: "EXITED",
}
MAX_WORKERS_PER_REPORT = 4096


def worker_report(field: str, w: agent_pb2.WorkerStatus) -> WorkerReport:
    if w.phase not in _PHASES:
        raise InvalidArgument(f"{field}.phase", f"must be STARTING, RUNNING, STOPPING or EXITED (got {w.phase})")
    return WorkerReport(
        job_id=job_id(f"{field}.job_id", w.job_id), rank=w.rank, incarnation=w.incarnation,
        phase=_PHASES[w.phase], exit_code=w.exit_code,
        progress=finite(f"{field}.progress", w.progress),
        samples_per_second=finite(f"{field}.samples_per_second", w.samples_per_second),
        checkpoint_progress=finite(f"{field}.checkpoint_progress", w.checkpoint_progress),
        # Free text from a worker's environment: bounded, control characters replaced, never refused.
        message="".join(c if c.isprintable() else " " for c in w.message[:512]),
        stop_requested=w.stop_requested, cannot_start=w.cannot_start,
        step_time_s=finite(f"{field}.step_time_s", w.step_time_s),
        pass_time_s=finite(f"{field}.pass_time_s", w.pass_time_s),
        local_batch_size=w.local_batch_size, accum_steps=w.accum_steps,
        grad_sqr=finite(f"{field}.grad_sqr", w.grad_sqr), grad_var=finite(f"{field}.grad_var", w.grad_var),
        samples=finite(f"{field}.samples", w.samples),
        checkpoint_acked=w.checkpoint_acked,
        ack_checkpoint_progress=finite(f"{field}.ack_checkpoint_progress", w.ack_checkpoint_progress),
        ack_checkpoint_age_s=_duration(f"{field}.ack_checkpoint_age", w.ack_checkpoint_age),
        stop_acknowledged=w.stop_acknowledged,
    )


def status_report(req: agent_pb2.ReportStatusRequest) -> StatusReport:
    # At most one sample per GPU, checked before anything else looks at the samples: the store
    # writes each changed one (an UPDATE and an event) with the server's row locked, so 100,000
    # samples in a 200 KB report would hold that lock for minutes. (The store checks the samples
    # against the server's registered GPUs.)
    if len(req.gpus) > MAX_GPUS_PER_SERVER:
        raise InvalidArgument(
            "gpus", f"at most one sample per GPU, and a server has at most {MAX_GPUS_PER_SERVER} (got {len(req.gpus)})"
        )
    samples = []
    indices: set[int] = set()
    for i, g in enumerate(req.gpus):
        if g.index in indices:
            raise InvalidArgument(f"gpus[{i}].index", f"GPU {g.index} is reported twice; one sample per GPU")
        indices.add(g.index)
        if not (math.isfinite(g.utilization) and math.isfinite(g.temperature_c)):
            raise InvalidArgument(f"gpus[{i}]", "utilization and temperature must be finite numbers")
        samples.append(
            GpuSample(g.index, min(max(g.utilization, 0.0), 1.0),
                      _bytes(f"gpus[{i}].memory_used_bytes", g.memory_used_bytes), g.temperature_c, g.healthy,
                      text(f"gpus[{i}].health_reason", g.health_reason, max_len=256))
        )
    if len(req.workers) > MAX_WORKERS_PER_REPORT:
        raise InvalidArgument("workers", f"at most {MAX_WORKERS_PER_REPORT} workers per report")
    workers = tuple(worker_report(f"workers[{i}]", w) for i, w in enumerate(req.workers))
    return StatusReport(server_id("server_id", req.server_id), req.scheduler_epoch, tuple(samples),
                        req.observed_generation, workers)


def peer_host(peer: str) -> str:
    """The IP address of a gRPC peer string (``ipv4:10.0.0.7:5000``, ``ipv6:[::1]:5000``); "" if none."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return ""


def allowed_endpoint(registration: ServerRegistration, allow: Sequence[str], peer: str = "") -> None:
    """PermissionDenied unless the registration's inference endpoint (if any) points where
    ``[inference] endpoint_allow`` allows: its host an IP address in one of the CIDRs or a name matching
    one of the patterns (names are not resolved); with no patterns, only the registering agent's own:
    its address, its hostname, or the IP address it connects from (``peer``, ``peer_host``). A router
    forwards users' requests there, so nobody may point it elsewhere."""
    endpoint = registration.inference_endpoint
    if not endpoint:
        return
    host = (urllib.parse.urlsplit(endpoint).hostname or "").lower()
    if not allow:
        own = {registration.agent_address.lower(), registration.hostname.lower(), peer_host(peer).lower()} - {""}
        if host in own:
            return
        raise PermissionDenied(
            f"inference_endpoint {endpoint!r}: host {host!r} is not this server's own address "
            f"({', '.join(sorted(own))}); an operator allows other hosts with inference.endpoint_allow"
        )
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for pattern in allow:
        try:
            network = ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            if address is None and fnmatch.fnmatchcase(host, pattern.lower()):
                return
            continue
        if address is not None and address.version == network.version and address in network:
            return
    raise PermissionDenied(
        f"inference_endpoint {endpoint!r}: host {host!r} matches none of inference.endpoint_allow "
        f"({', '.join(allow)})"
    )
