"""Job requests checked: a ``JobSpec`` turned into a ``JobSubmission`` (SubmitJob, every job of a
SubmitJobs call) and ListJobs' filter; every refusal names the field and the reason.

The rules of a spec: its whole encoded size, names, command and environment (the character rule of
``validation``, reserved and dynamic-loader variables), worker and GPU counts, deadline, throughput
hints, batch limits, GPU types and working directory. Validation runs before anything touches the
database, so a rejected request changes nothing. What this module must never do: read or write
state, or decide whether a valid job fits the cluster (admission is ``app.deadlines``'s, placement the policy's).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from aryl_common.channels import MAX_JOB_SPEC_BYTES
from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.api.validation import (
    CONTROL_CHARS,
    DATA_CONTROL_CHARS,
    IDENT,
    NAME_MAX,
    count,
    duration,
    enum_value,
    finite,
    refuse_controls,
    text,
    timestamp,
)
from scheduler_service.core.snapshot import BatchLimits
from scheduler_service.errors import InvalidArgument
from scheduler_service.lifecycle import JobState
from scheduler_service.records import JobFilter, JobSubmission

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Set by the agent for every worker (the job contract); a job may not override them.
RESERVED_ENV = frozenset({"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"})
MAX_WORKERS = 4096
MAX_GPUS_PER_WORKER = 64
MAX_ARGS = 1024
MAX_ARG_LEN = 4096
MAX_ENV = 256
MAX_ENV_VALUE = 32 * 1024
MAX_RESTARTS = 1000
MAX_WORKING_DIR = 4096  # Linux's PATH_MAX, terminating NUL included
MAX_BATCH_SIZE = 1 << 24  # samples: far above any batch trained with (Pollux's largest is 2^17)
JOB_STATE_NAMES = {v: JobState(n.removeprefix("JOB_STATE_")) for n, v in types_pb2.JobState.items() if v}
RESTART_POLICIES: dict[int, str] = {
    types_pb2.RESTART_POLICY_UNSPECIFIED: "ON_FAILURE",
    types_pb2.RESTART_POLICY_ON_FAILURE: "ON_FAILURE",
    types_pb2.RESTART_POLICY_NEVER: "NEVER",
}


def _utc(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 172800 else f"{seconds / 86400:.0f} days"


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
    command = tuple(spec.command)
    if not command:
        raise InvalidArgument("spec.command", "is required: the program and its arguments")
    if len(command) > MAX_ARGS:
        raise InvalidArgument("spec.command", f"must have at most {MAX_ARGS} arguments")
    text("spec.command[0]", command[0], max_len=MAX_ARG_LEN, required=True)
    # All arguments at once (tab is data, so the joined text holds a refused character only where an
    # argument does); argument by argument, to name the first bad one, only when something is wrong.
    if max(map(len, command)) > MAX_ARG_LEN or DATA_CONTROL_CHARS.search("\t".join(command)):
        for i, arg in enumerate(command):
            if len(arg) > MAX_ARG_LEN:
                raise InvalidArgument(f"spec.command[{i}]", f"must be at most {MAX_ARG_LEN} characters")
            refuse_controls(f"spec.command[{i}]", arg, DATA_CONTROL_CHARS, _DATA_ALLOWED)
    if len(spec.env) > MAX_ENV:
        raise InvalidArgument("spec.env", f"must have at most {MAX_ENV} variables")
    env = dict(spec.env) if spec.env else {}  # an empty protobuf map's dict() costs as much as the rest
    for key, value in env.items():
        # repr() writes the refused characters as escapes, so the field name is safe to print.
        refuse_controls(f"spec.env[{key[:40]!r}]", key, CONTROL_CHARS)
        if not ENV_KEY.fullmatch(key):
            raise InvalidArgument(f"spec.env[{key[:40]!r}]", "is not a valid variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if key in RESERVED_ENV or key.startswith("ARYL_"):
            raise InvalidArgument(f"spec.env[{key!r}]", "is set by Aryl for every worker and cannot be overridden")
        if key.startswith(LOADER_ENV_PREFIX) and not allow_loader_env:
            raise InvalidArgument(f"spec.env[{key!r}]", LOADER_ENV_REFUSAL)
        if len(value) > MAX_ENV_VALUE:
            raise InvalidArgument(f"spec.env[{key!r}]", f"must be at most {MAX_ENV_VALUE} characters")
        refuse_controls(f"spec.env[{key!r}]", value, DATA_CONTROL_CHARS, _DATA_ALLOWED)
    gpus = count("spec.gpus_per_worker", spec.gpus_per_worker, 1, MAX_GPUS_PER_WORKER)
    low = count("spec.min_workers", spec.min_workers, 1, MAX_WORKERS)
    high = spec.max_workers or low  # 0: inelastic, same as min_workers
    if high < low:
        raise InvalidArgument("spec.max_workers", f"must be >= min_workers ({low}) (got {high}); 0 means min_workers")
    count("spec.max_workers", high, low, MAX_WORKERS)
    deadline = None
    if spec.HasField("deadline"):
        deadline = timestamp("spec.deadline", spec.deadline)
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
            count(f"spec.throughput.points[{i}].workers", p.workers, 1, MAX_WORKERS)
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
            throughput["estimated_runtime_s"] = duration("spec.throughput.estimated_runtime", hints.estimated_runtime)
    max_runtime = None
    if spec.HasField("max_runtime"):
        max_runtime = duration("spec.max_runtime", spec.max_runtime) or None
    policy = RESTART_POLICIES[
        enum_value("spec.restart_policy", spec.restart_policy, RESTART_POLICIES, types_pb2.RestartPolicy)
    ]
    restarts = count("spec.max_restarts", spec.max_restarts, 0, MAX_RESTARTS)
    submission_key = text("idempotency_key", idempotency_key, max_len=128) or None
    working_dir = _working_dir(spec)
    priority_class = text("spec.priority_class", spec.priority_class, max_len=63, pattern=IDENT,
                          hint="letters, digits and . _ @ + -")
    gpu_types = _gpu_types(spec.gpu_types)
    limits = _batch_limits(spec.batch, high * gpus) if spec.HasField("batch") else None
    return JobSubmission(
        name=name, user=user, queue=queue, command=command, env=env,
        gpus_per_worker=gpus, min_workers=low, max_workers=high, priority=spec.priority, deadline=deadline,
        throughput=throughput, max_runtime_s=max_runtime, restart_policy=policy, max_restarts=restarts,
        idempotency_key=submission_key, working_dir=working_dir,
        working_dir_if_exists=spec.working_dir_if_exists, priority_class=priority_class, gpu_types=gpu_types,
        batch_limits=limits,
    )


def _batch_limits(batch: types_pb2.BatchHints, most_gpus: int) -> BatchLimits:
    """``spec.batch``: all three sizes required; the largest batch at least the init one and at least
    one sample per GPU of the job's largest allocation (``most_gpus``: max_workers x gpus_per_worker)."""
    init = count("spec.batch.init_batch_size", batch.init_batch_size, 1, MAX_BATCH_SIZE)
    if not batch.max_batch_size:
        raise InvalidArgument("spec.batch.max_batch_size", f"is required: the largest total batch the job accepts "
                                                           f"(at least init_batch_size, {init}; equal: a fixed batch)")
    if batch.max_batch_size < init:
        raise InvalidArgument("spec.batch.max_batch_size",
                              f"must be >= init_batch_size ({init}) (got {batch.max_batch_size})")
    largest = count("spec.batch.max_batch_size", batch.max_batch_size, init, MAX_BATCH_SIZE)
    if largest < most_gpus:
        raise InvalidArgument("spec.batch.max_batch_size",
                              f"must be >= {most_gpus}: at its largest (max_workers x gpus_per_worker = {most_gpus} "
                              f"GPUs) the job runs at least one sample per GPU (got {largest}); raise it or "
                              "lower max_workers")
    if not batch.max_local_batch_size:
        raise InvalidArgument("spec.batch.max_local_batch_size",
                              "is required: the largest batch one GPU fits in one forward/backward pass")
    local = count("spec.batch.max_local_batch_size", batch.max_local_batch_size, 1, MAX_BATCH_SIZE)
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


# The most jobs one SubmitJobs call may carry: 10,000 make one transaction of about a second here
# (benchmarks/bench_submit.py); a larger array is submitted in several calls (arylctl does).
MAX_BATCH_JOBS = 10_000


def submitted_jobs_view(value: int) -> int:
    """``SubmitJobsRequest.view``: the default (UNSPECIFIED) is the list view."""
    view = enum_value("view", value, scheduler_pb2.SubmittedJobsView.values(), scheduler_pb2.SubmittedJobsView)
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
