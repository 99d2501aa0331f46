"""``arylctl``: the command line over the scheduler's gRPC API (kubectl/squeue-like).

Every command is a thin layer over :class:`arylctl.client.ArylClient`: it parses flags, makes
one or a few calls, and prints the result as an aligned table (default), or as JSON/YAML
(``-o json|yaml``: the protobuf messages as ``MessageToDict`` writes them with the proto field
names and every field, zero values included; a list for list commands). It never decides anything
and never retries a call; the one exception is ``events --follow``, a stream meant to outlive a
scheduler restart, which reconnects (with ``aryl_common.backoff.Backoff``) and resumes after the
last event it printed.

A job as ``-o json|yaml`` prints it (``arylctl job ID``, ``submit``, ``cancel``) is a valid
``submit -f`` file: its ``spec`` is submitted, in the protobuf JSON spelling
(``arylctl.spec.normalize_job_spec_mapping``), and the job's read-only fields (``job_id``,
``state``, ``events``, ...) are ignored with a note on stderr.

Exit codes (those of every Aryl program, ``aryl_common.entry``): 0 success; 1 the server refused or
failed (``error: <server message> (CODE)`` on stderr), or an unexpected error (a bug: one line,
``--debug`` or ``ARYL_DEBUG=1`` adds the traceback); 2 bad usage or INVALID_ARGUMENT; 3 the
scheduler is unreachable; 130 interrupted.
OUT_OF_RANGE (a read past the end of a worker's log) is 1, not 2: ``logs`` reads from the start, the
end (``--tail``) or where the previous answer ended, so it meets one only when the log changed under
it (the rank moved to a server with a shorter log); the command line is fine and running it again
works, which 2 would deny.
An RPC failure never prints a Python traceback.

Examples::

    arylctl submit --name bert --gpus-per-worker 8 --min-workers 1 --max-workers 4 -- python train.py
    arylctl submit -f job.yaml --priority 5
    arylctl jobs --state pending --state running
    arylctl events --job 42 --follow
    arylctl job 42 -o yaml > job.yaml && arylctl submit -f job.yaml
    arylctl -o json cluster
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from queue import Empty, SimpleQueue
from typing import Any, Final, TextIO

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from aryl_common.backoff import Backoff
from aryl_common.entry import add_debug_flag, package_version, run_guarded
from aryl_common.security import ENV_INSECURE, ENV_TLS_CERT, SECURE_BY_DEFAULT, ClientSecurity, default_token_file
from arylctl import certs, completion
from arylctl.argv_secrets import SECRET_REFERENCE_PREFIX, secret_looking_arguments
from arylctl.arrays import ArraySpecError, element_key, parse_array
from arylctl.client import (
    DEFAULT_ADDRESS,
    RESTART_POLICIES,
    SUBMIT_ATTEMPTS,
    SUBMIT_RETRY_S,
    TERMINAL_JOB_STATES,
    ArylClient,
    ArylError,
    DeadlineExceeded,
    NotFound,
    SubmitRetry,
    Unavailable,
    default_address,
    job_spec_from_mapping,
    new_idempotency_key,
    parse_deadline,
)
from arylctl.login import UnsafeTokenPath, store_token
from arylctl.output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    NAME_COMMANDS,
    PROG,
    Output,
    UsageError,
    age,
    duration_text,
    elapsed_text,
    enum_name,
    format_fields,
    format_table,
    local_time,
    printable,
    short_state,
)
from arylctl.queues import add_queue_commands
from arylctl.spec import submit_directory, submit_spec_mapping, submit_spec_problems
from arylctl.what_if import add_what_if_command
from protos.aryl.v1 import scheduler_pb2, types_pb2

# Some of these live in arylctl.output and arylctl.spec now; they stay importable from here.
__all__ = [
    "UsageError",
    "build_parser",
    "elapsed_text",
    "enum_name",
    "format_table",
    "main",
    "parse_args",
    "printable",
    "submit_directory",
    "submit_spec_mapping",
]

# `events` without --follow: the log has no end marker, so "caught up" means the stream was
# quiet this long (the connection is established before the clock starts). A busy scheduler paces its
# fan-out to streams (``scheduler_service.notify``): 0.5 s returned an empty log under load.
EVENTS_IDLE_S: Final = 2.0
LIST_ALL_PAGE_SIZE: Final = 1000  # the server's maximum; fewer round trips for --all
# `events --follow` after losing its stream: the longest wait between reconnection attempts. It
# retries until Ctrl-C: following is meant to outlive a scheduler restart or upgrade.
EVENTS_RECONNECT_MAX_S: Final = 5.0
# How a stream ends when its scheduler goes away (killed, restarted, stopped: its server cancels
# open streams) rather than because the request is wrong.
EVENTS_RECONNECT_CODES: Final = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # the scheduler's watch-stream limit: a place frees up later
})

# `submit` retrying a submission (the scheduler restarting): a progress line at the first retry and then
# at most this often.
SUBMIT_PROGRESS_EVERY_S: Final = 5.0
# ---------------------------------------------------------------------------------------------
# Rows


def _workers_text(job: types_pb2.Job) -> str:
    spec = job.spec
    wanted = str(spec.min_workers) if spec.max_workers <= spec.min_workers else f"{spec.min_workers}-{spec.max_workers}"
    return f"{job.num_workers}/{wanted}"


def _job_reason(job: types_pb2.Job) -> str:
    if job.state == types_pb2.JOB_STATE_PENDING and job.pending_reason:
        return job.pending_reason
    return job.reason


JOB_HEADERS: Final = (
    "ID", "NAME", "USER", "QUEUE", "STATE", "WORKERS", "GPUS/W", "PRIO", "COMMAND", "SUBMITTED", "DEADLINE",
    "ETA", "ELAPSED", "REASON",
)
# The COMMAND column of `jobs`: a longer command is cut to this many characters, ending in "...";
# `arylctl job ID` shows it whole.
COMMAND_COLUMN_CHARS: Final = 40
ELLIPSIS: Final = "..."


def command_cell(command: Sequence[str]) -> str:
    """``command`` as ``arylctl job`` shows it, escaped (:func:`printable`) before it is cut to
    ``COMMAND_COLUMN_CHARS``, so an escape cannot make the cell longer."""
    text = printable(" ".join(command))
    return text if len(text) <= COMMAND_COLUMN_CHARS else text[: COMMAND_COLUMN_CHARS - len(ELLIPSIS)] + ELLIPSIS


def _is_set(ts: Timestamp) -> bool:
    return bool(ts.seconds or ts.nanos)


def job_elapsed(job: types_pb2.Job, now: dt.datetime) -> str:
    """The ELAPSED column, squeue's TIME made to say something for every state: a job that has
    not started yet shows how long it has waited since submission; a started one how long since it
    (first) started; a finished one its run time, start to finish (``-`` if it never started)."""
    def seconds(ts: Timestamp, until: dt.datetime) -> float:
        return (until - ts.ToDatetime(tzinfo=dt.UTC)).total_seconds()

    if _is_set(job.finished_at):
        if not _is_set(job.started_at):
            return "-"
        return elapsed_text(seconds(job.started_at, job.finished_at.ToDatetime(tzinfo=dt.UTC)))
    if _is_set(job.started_at):
        return elapsed_text(seconds(job.started_at, now))
    return elapsed_text(seconds(job.submitted_at, now)) if _is_set(job.submitted_at) else "-"


def _job_row(job: types_pb2.Job, now: dt.datetime) -> list[object]:
    spec = job.spec
    return [
        job.job_id,
        job_display_name(job),
        spec.user,
        spec.queue,
        enum_name(types_pb2.JobState, job.state),
        _workers_text(job),
        spec.gpus_per_worker,
        spec.priority,
        command_cell(spec.command),
        local_time(job.submitted_at),
        deadline_cell(job),
        eta_cell(job),
        job_elapsed(job, now),
        _job_reason(job),
    ]


def eta_cell(job: types_pb2.Job) -> str:
    """The scheduler's forecast (``Job.eta_*``), local ``MM-DD HH:MM``: a waiting job's predicted start,
    a running one's predicted finish (``ends ...``); ``-`` without one (never a guess: ``arylctl job ID``
    says why)."""
    def when(ts: Timestamp) -> str:
        return ts.ToDatetime(tzinfo=dt.UTC).astimezone().strftime("%m-%d %H:%M")

    if _is_set(job.eta_start):
        return f"starts {when(job.eta_start)}"
    if _is_set(job.eta_finish) and job.state in (types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_SCALING):
        return f"ends {when(job.eta_finish)}"
    return "-"


# The DEADLINE column's word for where a job stands against its deadline (``arylctl job`` says more).
DEADLINE_WORDS: Final = {
    types_pb2.DEADLINE_STATUS_UNKNOWN: "(no prediction)",
    types_pb2.DEADLINE_STATUS_ON_TRACK: "on track",
    types_pb2.DEADLINE_STATUS_AT_RISK: "at risk",
    types_pb2.DEADLINE_STATUS_WILL_MISS: "will miss",
    types_pb2.DEADLINE_STATUS_MET: "met",
    types_pb2.DEADLINE_STATUS_MISSED: "missed",
}


def deadline_cell(job: types_pb2.Job) -> str:
    """``MM-DD HH:MM`` (local) and where the job stands against it, e.g. ``11-24 18:00 at risk``; ``-``: none."""
    if not job.spec.HasField("deadline"):
        return "-"
    when = job.spec.deadline.ToDatetime(tzinfo=dt.UTC).astimezone().strftime("%m-%d %H:%M")
    word = DEADLINE_WORDS.get(job.deadline_status, "")
    return f"{when} {word}" if word else when


def restart_text(spec: types_pb2.JobSpec) -> str:
    """What happens when the job fails, in words: ON_FAILURE with at most 0 restarts is never restarted."""
    on_failure = spec.restart_policy != types_pb2.RESTART_POLICY_NEVER  # UNSPECIFIED is ON_FAILURE
    if on_failure and spec.max_restarts > 0:
        times = "once" if spec.max_restarts == 1 else f"up to {spec.max_restarts} times"
        return f"restarted on failure, {times} (ON_FAILURE, max {spec.max_restarts})"
    return f"never restarted: a failure ends it ({'ON_FAILURE, max 0' if on_failure else 'NEVER'})"


def prediction_text(job: types_pb2.Job) -> str:
    """The predicted finish, one line (the one name for it): the forecast's (``eta_finish``: the queue, the
    policy's resizes) where there is one, else the prediction at its current size while it runs; ``-``
    with why when nothing says, never a guess."""
    running = job.state in (types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_SCALING)
    confidence = f", confidence {job.prediction_confidence:.2f}" if _is_set(job.predicted_finish) else ""
    if job.state in TERMINAL_JOB_STATES:
        return "-"
    if _is_set(job.eta_finish):
        return f"{local_time(job.eta_finish)} (forecast of the cluster{confidence})"
    if not _is_set(job.predicted_finish):
        return ("- (no run-time estimate: none declared, e.g. submit --estimated-runtime, and no progress "
                "reported yet)")
    if running:
        return f"{local_time(job.predicted_finish)} (at its current size{confidence})"
    return "- (its start is unknown)" if job.eta_note else "- (no forecast yet)"


EVENT_HEADERS: Final = ("ID", "TIME", "KIND", "JOB", "SERVER", "CHANGE", "REASON", "MESSAGE")
# Streamed rows cannot be aligned on the widest cell; these widths fit typical values.
EVENT_STREAM_WIDTHS: Final = (6, 19, 22, 12, 12, 22, 20, 0)


def _change_text(event: types_pb2.Event) -> str:
    if not event.from_state and not event.to_state:
        return ""
    return f"{short_state(event.from_state) or '-'} -> {short_state(event.to_state) or '-'}"


def _event_row(event: types_pb2.Event) -> list[object]:
    return [
        event.event_id,
        local_time(event.time),
        enum_name(types_pb2.EventKind, event.kind),
        event.job_id,
        event.server_id,
        _change_text(event),
        event.reason,
        event.message,
    ]


def _stream_line(row: Sequence[object], widths: Sequence[int]) -> str:
    return "  ".join(printable(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()


# ---------------------------------------------------------------------------------------------
# Commands. Each takes (client, parsed args, output) and returns an exit code.




def job_summary_table(job: types_pb2.Job) -> str:
    """What submit and cancel print: the job's id, name and state."""
    row = (job.job_id, job.spec.name, enum_name(types_pb2.JobState, job.state))
    return format_table(("ID", "NAME", "STATE"), [row])


def cmd_submit(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    if args.wait and out.fmt != "table":
        raise UsageError("--wait prints the job's log, not the job: leave out -o (or use arylctl job ID -o ...)")
    try:
        spec = job_spec_from_mapping(submit_spec_mapping(args, out.note))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    warn_of_secrets_in_command(spec.command, out.note)
    if args.array is not None:
        return _submit_array(client, spec, args, out)
    key = args.idempotency_key or new_idempotency_key()
    try:
        answer = client.submit(spec, idempotency_key=key, retry_s=args.retry_for, on_retry=_retry_progress(out))
    except ArylError as exc:
        _say_key(key, exc, out)
        raise
    job = answer.job
    if answer.admission_note:  # the scheduler's feedback on the job's deadline (or its predicted finish)
        late = answer.deadline_status in (types_pb2.DEADLINE_STATUS_WILL_MISS, types_pb2.DEADLINE_STATUS_UNKNOWN)
        out.note(f"{'warning' if late else 'note'}: job {job.job_id} {printable(answer.admission_note)}")
    if args.wait:
        out.note(f"job {job.job_id} ({printable(job.spec.name)}) submitted; its log (rank 0) follows until it ends "
                 "(Ctrl-C detaches, the job keeps running)")
        return wait_for_job(client, job.job_id, args, out)
    out.emit(job, lambda: job_summary_table(job))
    return EXIT_OK


def _retry_progress(out: Output) -> Callable[[SubmitRetry], None]:
    """``submit``'s progress line on stderr while a submission is retried (a scheduler restarting)."""
    said = [-math.inf]

    def progress(retry: SubmitRetry) -> None:
        if retry.waited_s - said[0] >= SUBMIT_PROGRESS_EVERY_S:  # the first retry, then every few seconds
            said[0] = retry.waited_s
            out.note(f"{PROG}: no answer from the scheduler ({retry.error.code.name}); retrying with idempotency key "
                     f"{retry.idempotency_key} ({retry.waited_s:.0f}s of up to {retry.retry_s:g}s)")
    return progress


# Answers to a submission that say it was not queued: no key to retry with is worth printing.
_REFUSED: Final = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE,
})


def _say_key(key: str, error: ArylError, out: Output) -> None:
    """After a submission that may have been queued: the key it was sent with, so that running it again is safe."""
    if error.code in _REFUSED:
        return
    out.note(f"note: the submission was sent with idempotency key {key}; if unsure whether it was queued, run the "
             f"same command with --idempotency-key {key} (it never queues the job twice)")


def warn_of_secrets_in_command(command: Sequence[str], note: Callable[[str], None]) -> None:
    """One warning line (stderr) when the command line looks like it carries a secret: every user can read
    a job's command (``arylctl jobs``), while an environment variable may name a secret the agent fills in.
    Submitted all the same: the warning never stops a job."""
    suspects = secret_looking_arguments(command)
    if suspects:
        note(f"warning: the command's {', '.join(suspects)} may carry a secret, and every user can read a job's "
             f"command ({PROG} jobs); pass it in an environment variable that names a secret instead: --env "
             f"NAME={SECRET_REFERENCE_PREFIX}SECRET (the agent fills it in from its secrets file; docs/security.md, "
             "Secrets)")


def _submit_array(client: ArylClient, spec: types_pb2.JobSpec, args: argparse.Namespace, out: Output) -> int:
    """``submit --array``: one job per index, queued in one SubmitJobs call (all or none, one array
    id); each element's key is the array's key and its index, so the same command run again with
    ``--idempotency-key`` queues nothing new."""
    if args.wait:
        raise UsageError("--wait follows one job; with --array use: arylctl jobs -w")
    try:
        indices = parse_array(args.array)
    except ArraySpecError as exc:
        raise UsageError(str(exc)) from exc
    base = args.idempotency_key or new_idempotency_key()
    if len(element_key(base, max(indices))) > 128:
        raise UsageError(f"--idempotency-key is too long for an array: at most {128 - len(str(max(indices))) - 1} "
                         "characters with these indices (each element's key is KEY.INDEX)")
    try:
        jobs = client.submit_jobs([(spec, element_key(base, i)) for i in indices], array_indices=indices,
                                  retry_s=args.retry_for, on_retry=_retry_progress(out))
    except ArylError as exc:
        _say_key(base, exc, out)
        raise

    def table() -> str:
        first = jobs[0]
        out.note(f"job array {first.array_job_id}: {len(jobs)} job(s) {jobs[0].job_id}..{jobs[-1].job_id} queued "
                 f"(cancel them all: {PROG} cancel --array {first.array_job_id})")
        return format_table(("ID", "NAME", "STATE"),
                            [(j.job_id, job_display_name(j), enum_name(types_pb2.JobState, j.state)) for j in jobs])

    out.emit(jobs, table, lambda: [j.job_id for j in jobs])
    return EXIT_OK


def job_display_name(job: types_pb2.Job) -> str:
    """The job's name; an array element's with its index, as ``train[17]``."""
    return f"{job.spec.name}[{job.array_index}]" if job.array_job_id else job.spec.name


def wait_for_job(client: ArylClient, job_id: str, args: argparse.Namespace, out: Output) -> int:
    """``submit --wait``: the log of rank 0 as ``logs -f`` prints it, from when the job starts until it
    ends, then its outcome on stderr. 0 COMPLETED, 1 FAILED or CANCELLED; Ctrl-C detaches (130)
    and says how to follow or cancel the job."""
    try:
        job = _follow_until_finished(client, job_id, args.poll, out)
    except KeyboardInterrupt:
        ctl = PROG + (f" --server {args.server}" if args.server else "")
        out.note(f"\ndetached: job {job_id} keeps running. Follow it again: {ctl} logs -f {job_id}; "
                 f"cancel it: {ctl} cancel {job_id}")
        return EXIT_INTERRUPTED
    state = enum_name(types_pb2.JobState, job.state)
    out.note(f"job {job_id} {state}: {printable(job.message or job.reason)}")
    return EXIT_OK if job.state == types_pb2.JOB_STATE_COMPLETED else EXIT_FAILED


def _follow_until_finished(client: ArylClient, job_id: str, poll_s: float, out: Output) -> types_pb2.Job:
    """Print rank 0's log once the job has started, until it has finished; return the finished job.
    A job that ends without ever starting (cancelled while pending) has no log to print."""
    offset, said_pending = 0, False
    while True:
        job = client.get_job(job_id).job
        finished = job.state in TERMINAL_JOB_STATES
        if _is_set(job.started_at):
            try:
                # Ends at the end of the log once the job has finished, like logs -f.
                for data in client.follow_job_log(job_id, offset=offset, poll_s=poll_s, until_finished=True):
                    out.stream.write(data.decode("utf-8", "replace"))
                    out.stream.flush()
                    offset += len(data)
                return client.get_job(job_id).job
            except NotFound:
                pass  # placed, but its agent has not started the worker (and its log) yet
        elif not said_pending and not finished:
            out.note(f"job {job_id} is {enum_name(types_pb2.JobState, job.state)}: "
                     f"{printable(job.pending_reason or job.message or 'waiting to be scheduled')}")
            said_pending = True
        if finished:
            return job
        time.sleep(poll_s)


def cmd_jobs(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    filters: dict[str, Any] = {"states": args.states or (), "user": args.user, "queue": args.queue}

    def render(current: ArylClient, first: bool) -> None:
        if args.all:
            jobs = list(current.iter_jobs(page_size=LIST_ALL_PAGE_SIZE, **filters))
        elif args.limit is not None:
            pages = current.iter_jobs(page_size=min(args.limit, LIST_ALL_PAGE_SIZE), **filters)
            jobs = list(itertools.islice(pages, args.limit))
        else:
            page = current.list_jobs(**filters)
            jobs = list(page.jobs)
            if page.next_page_token and first:
                out.note(f"(showing the newest {len(jobs)} jobs; --all for every job, --limit N for N)")
        now = dt.datetime.now(dt.UTC)

        def table() -> str:
            if not jobs:
                out.note("No jobs found.")
                return ""
            return format_table(JOB_HEADERS, [_job_row(job, now) for job in jobs])

        def names() -> list[str]:
            return [job.job_id for job in jobs]

        if args.watch:
            out.emit_snapshot(jobs, table, names)
        else:
            out.emit(jobs, table, names)

    if args.watch:
        return _watch(client, out, render)
    render(client, True)
    return EXIT_OK


def working_dir_text(spec: types_pb2.JobSpec) -> str:
    if not spec.working_dir:
        return "- (the agent's directory for the job)"
    if spec.working_dir_if_exists:
        return f"{spec.working_dir} (where it exists on the server, else the agent's directory for the job)"
    return spec.working_dir


def describe_job(response: scheduler_pb2.GetJobResponse) -> str:
    job, spec = response.job, response.job.spec
    fields: list[tuple[str, object]] = [
        ("Job", job.job_id),
        ("Name", spec.name),
        *([("Array", f"{job.array_job_id}, index {job.array_index}")] if job.array_job_id else []),
        ("User", spec.user),
        ("Queue", spec.queue),
        ("State", enum_name(types_pb2.JobState, job.state)),
        ("Reason", job.reason or "-"),
        ("Message", job.message or "-"),
    ]
    if job.pending_reason:
        fields.append(("Pending reason", job.pending_reason))
    if job.size_note and job.state in (types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_SCALING):
        fields.append(("Size held", job.size_note))  # why it runs below max_workers (explain has the history)
    fields += [
        ("Command", " ".join(spec.command)),
        ("Working dir", working_dir_text(spec)),
        ("Workers", f"{job.num_workers} running (min {spec.min_workers}, max {spec.max_workers})"),
        ("GPUs per worker", spec.gpus_per_worker),
        ("Priority", spec.priority),
        ("Restart policy", restart_text(spec)),
        ("Deadline", local_time(spec.deadline) if spec.HasField("deadline") else "-"),
        *([("Deadline outlook", job.deadline_note)] if job.deadline_note and spec.HasField("deadline") else []),
        *([("Predicted start", job.eta_note or local_time(job.eta_start))]
          if _is_set(job.eta_start) or job.eta_note else []),
        ("Predicted finish", prediction_text(job)),
        ("Max runtime", duration_text(spec.max_runtime)),
        ("Estimated runtime", duration_text(spec.throughput.estimated_runtime)),
    ]
    if spec.throughput.points:
        points = ", ".join(f"{p.workers}w: {p.samples_per_second:g}/s" for p in spec.throughput.points)
        fields.append(("Throughput", points))
    if spec.throughput.total_work:
        fields.append(("Total work", f"{spec.throughput.total_work:g}"))
    fields += goodput_fields(job)
    if spec.env:
        fields.append(("Env", " ".join(f"{k}={v}" for k, v in sorted(spec.env.items()))))
    fields += [
        ("Submitted", local_time(job.submitted_at)),
        ("Started", local_time(job.started_at)),
        ("Finished", local_time(job.finished_at)),
        ("Restarts", job.restarts),
        ("Preemptions", job.preemptions),
        ("Progress",
         f"{job.progress:g}" + (f" of {spec.throughput.total_work:g}" if spec.throughput.total_work else "")),
        ("Incarnation", job.incarnation),
        ("Last checkpoint", local_time(job.last_checkpoint_at)),
    ]
    if job.idempotency_key:
        fields.append(("Idempotency key", job.idempotency_key))
    sections = [format_fields(fields)]
    if job.workers:
        rows = [(w.rank, w.server_id, ",".join(str(i) for i in w.gpu_indices)) for w in job.workers]
        sections.append("Workers:\n" + format_table(("RANK", "SERVER", "GPUS"), rows))
    if job.step_times:
        steps = [(t.nodes, t.replicas, t.local_batch_size, t.accum_steps, f"{t.pass_time_s:.4g}",
                  f"{t.step_time_s:.4g}", local_time(t.measured_at)) for t in job.step_times]
        sections.append("Step times (measured by rank 0):\n" + format_table(STEP_TIME_HEADERS, steps))
    events = [_event_row(e) for e in response.events]
    sections.append("Events:\n" + (format_table(EVENT_HEADERS, events) if events else "(none)"))
    return "\n\n".join(sections)


STEP_TIME_HEADERS: Final = ("SERVERS", "GPUS", "LOCAL BATCH", "ACCUM", "PASS S", "STEP S", "MEASURED")


def goodput_fields(job: types_pb2.Job) -> list[tuple[str, object]]:
    """A job with batch limits: its limits, the batch it runs with now, its gradient noise scale."""
    batch = job.spec.batch
    if not job.spec.HasField("batch"):
        return []
    fields: list[tuple[str, object]] = [
        ("Batch limits", f"init {batch.init_batch_size}, max {batch.max_batch_size}, "
                         f"max per GPU per pass {batch.max_local_batch_size}"),
        ("Batch", f"{job.batch_size} = {job.local_batch_size} per GPU per pass x {job.accum_steps + 1} pass(es) "
                  "per step" if job.batch_size else "- (not running)"),
    ]
    if job.noise_scale:
        fields.append(("Gradient noise", f"noise scale {job.noise_scale:.4g} samples (grad_sqr {job.grad_sqr:.4g}, "
                                         f"grad_var {job.grad_var:.4g}, at batch {batch.init_batch_size})"))
    if job.samples:
        fields.append(("Samples", f"{job.samples:g}"))
    if job.predicted_speedups:
        first = job.predicted_speedups[0]
        points = ", ".join(f"{p.workers}w {p.speedup:.2f}x (batch {p.batch_size})" for p in job.predicted_speedups)
        fields.append(("Predicted speed-up", f"{points}; {first.source}, over {first.reference_workers} worker(s)"))
    return fields


def cmd_job(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.get_job(args.job_id, include_events=True)
    out.emit(response, lambda: describe_job(response))
    return EXIT_OK


LOG_TAIL_WINDOW = 1024 * 1024  # bytes read from the end to find the last --tail lines


def cmd_logs(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    """A worker's stdout/stderr (raw text; -o does not apply), from the agent that ran it."""

    def write(data: bytes) -> None:
        out.stream.write(data.decode("utf-8", "replace"))
        out.stream.flush()

    offset = 0
    if args.tail is not None:
        chunk = client.read_job_log(args.job_id, rank=args.rank, offset=-LOG_TAIL_WINDOW, max_bytes=LOG_TAIL_WINDOW)
        lines = chunk.data.decode("utf-8", "replace").splitlines(keepends=True)
        write("".join(lines[-args.tail:] if args.tail else []).encode())
        offset = chunk.next_offset
    if args.follow:
        # Ends once the job has finished and its log is read to the end (a PENDING or PREEMPTED
        # job may run again, so it is followed on), or with Ctrl-C.
        try:
            for data in client.follow_job_log(
                args.job_id, rank=args.rank, offset=offset, poll_s=args.poll, until_finished=True
            ):
                write(data)
        except KeyboardInterrupt:
            pass
        return EXIT_OK
    if args.tail is not None:
        return EXIT_OK
    while True:
        chunk = client.read_job_log(args.job_id, rank=args.rank, offset=offset)
        write(chunk.data)
        offset = chunk.next_offset
        if not chunk.data or offset >= chunk.size:
            break
    return EXIT_OK


def cmd_cancel(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    if args.array:
        cancelled = client.cancel_job_array(args.job_id, reason=args.reason)
        out.emit(scheduler_pb2.CancelJobArrayResponse(cancelled_job_ids=cancelled),
                 lambda: f"job array {args.job_id}: {len(cancelled)} job(s) cancelled"
                 + (f" ({', '.join(cancelled)})" if 0 < len(cancelled) <= 20 else ""),
                 lambda: cancelled)
        return EXIT_OK
    job = client.cancel_job(args.job_id, reason=args.reason)
    out.emit(job, lambda: job_summary_table(job))
    return EXIT_OK


def _demand_text(demand: types_pb2.InferenceDemand) -> str:
    if not demand.source and not demand.servers_needed and not demand.HasField("reported_at"):
        return "none reported"
    return (
        f"{demand.servers_needed} server(s) needed, {demand.observed_rps:g} rps "
        f"(from {demand.source or '?'} at {local_time(demand.reported_at)})"
    )


def describe_cluster(cluster: scheduler_pb2.GetClusterResponse) -> str:
    summary = format_fields(
        [
            ("Policy", cluster.policy or "-"),
            ("Scheduler epoch", cluster.scheduler_epoch),
            ("Active loans", cluster.active_loans),
            *([("Not loaning", cluster.not_loaned)] if cluster.not_loaned else []),
            ("Inference demand", _demand_text(cluster.demand)),
        ]
    )
    pools = format_table(
        ("POOL", "SERVERS", "GPUS", "USED", "LOANED", "UNAVAILABLE"),
        [
            (enum_name(types_pb2.Pool, p.pool), p.servers, p.gpus_total, p.gpus_used, p.gpus_loaned, p.gpus_unavailable)
            for p in cluster.pools
        ],
    )
    jobs = format_table(("STATE", "JOBS"), [(enum_name(types_pb2.JobState, c.state), c.count) for c in cluster.jobs])
    return "\n\n".join([summary, pools, jobs])


def cmd_cluster(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    cluster = client.get_cluster()
    out.emit(cluster, lambda: describe_cluster(cluster))
    return EXIT_OK


SERVER_HEADERS: Final = ("ID", "POOL", "STATE", "GPUS", "HEALTHY", "LAST SEEN", "REASON")


def _server_row(server: types_pb2.Server, now: dt.datetime) -> list[object]:
    state = enum_name(types_pb2.ServerState, server.state)
    lost = server.state == types_pb2.SERVER_STATE_LOST
    return [
        server.server_id,
        enum_name(types_pb2.Pool, server.pool),
        f"{state},{server.admin_state}" if server.admin_state else state,  # e.g. TRAINING,CORDONED
        f"{server.gpus_used}/{server.gpus_total}",
        server.gpus_healthy,
        age(server.last_seen_at, now) + (" ago" if server.HasField("last_seen_at") else ""),
        "; ".join([server.state_reason] * bool(server.state_reason) + [server.admin_reason] * (
            bool(server.admin_reason) and server.admin_reason != server.state_reason
        ) + [
            f"GPU {g.index}: {g.health_reason or 'unhealthy'}" for g in server.gpus if not g.healthy
        ] + [f"listed until deleted: {PROG} servers delete {server.server_id}"] * lost),
    ]


def cmd_servers(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    def render(current: ArylClient, first: bool) -> None:
        servers = current.list_servers(pool=args.pool)
        now = dt.datetime.now(dt.UTC)

        def table() -> str:
            if not servers:
                out.note("No servers registered.")
                return ""
            return format_table(SERVER_HEADERS, [_server_row(s, now) for s in servers])

        def names() -> list[str]:
            return [server.server_id for server in servers]

        if args.watch:
            out.emit_snapshot(servers, table, names)
        else:
            out.emit(servers, table, names)

    if args.watch:
        return _watch(client, out, render)
    render(client, True)
    return EXIT_OK


def _server_admin_done(out: Output, response: scheduler_pb2.ServerAdminResponse) -> int:
    """What a cordon, uncordon or drain did: the message, then the server's row (``-o``: the server)."""
    now = dt.datetime.now(dt.UTC)
    out.emit(response.server, lambda: response.message + "\n" + format_table(
        SERVER_HEADERS, [_server_row(response.server, now)]), lambda: [response.server.server_id])
    return EXIT_OK


def cmd_server_cordon(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    return _server_admin_done(out, client.cordon_server(args.server_id, reason=args.reason))


def cmd_server_uncordon(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    return _server_admin_done(out, client.uncordon_server(args.server_id))


def cmd_server_drain(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    return _server_admin_done(out, client.drain_server(args.server_id, reason=args.reason,
                                                       timeout_s=args.drain_timeout, force=args.force))


def cmd_server_delete(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.delete_server(args.server_id, force=args.force)
    out.emit(response, lambda: response.message, lambda: [args.server_id])
    return EXIT_OK


# `-w`: events that arrive within this long of each other are one change, rendered once (a
# scheduling cycle writes several events in one transaction).
WATCH_SETTLE_S: Final = 0.2
_STREAM_END: Final = object()


def _watch(client: ArylClient, out: Output, render: Callable[[ArylClient, bool], None]) -> int:
    """``-w``: render now, then again after each change the event stream reports, until Ctrl-C
    (exit 0). A lost stream (a scheduler restart) is reopened as ``events --follow`` does, and the
    list rendered again once it is back, since changes may have happened meanwhile."""
    client.wait_until_connected()
    backoff = Backoff.capped(EVENTS_RECONNECT_MAX_S)
    current = client
    first = True
    try:
        while True:
            try:
                # Opened before the list is read, so that a change made after that read is not missed.
                with current.watch_events() as stream:
                    render(current, first)
                    first = False
                    for _ in _changes(stream):
                        backoff.reset()
                        render(current, first)
                lost = "the scheduler ended the stream"
            except ArylError as exc:
                if exc.code not in EVENTS_RECONNECT_CODES:
                    raise
                lost = f"{exc.message} ({exc.code.name})"
            out.note(f"{PROG}: lost the event stream from {current.address} ({lost}); reconnecting (Ctrl-C to stop)")
            current = _reconnect(current, backoff)
    except KeyboardInterrupt:
        pass  # -w ends with Ctrl-C; that is success
    finally:
        if current is not client:
            current.close()
    return EXIT_OK


def _changes(stream: Iterable[types_pb2.Event]) -> Iterator[None]:
    """One item per burst of events (events within ``WATCH_SETTLE_S`` of each other); ends with
    the stream, raising its error. A reader thread lets the wait for the burst's end time out."""
    queue: SimpleQueue[object] = SimpleQueue()

    def pump() -> None:
        try:
            for event in stream:
                queue.put(event)
        except ArylError as exc:
            queue.put(exc)
        finally:
            queue.put(_STREAM_END)

    threading.Thread(target=pump, name="arylctl-watch", daemon=True).start()
    while True:
        item = queue.get()
        while isinstance(item, types_pb2.Event):
            try:
                item = queue.get(timeout=WATCH_SETTLE_S)
            except Empty:
                item = None
        if isinstance(item, ArylError):
            raise item
        if item is _STREAM_END:
            return
        yield None


def cmd_loans(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.list_loans_response(include_returned=args.all)
    loans = list(response.loans)
    # The scheduler's standing reason for loaning no (further) server: a non-event, said once per decision.
    why = (printable(f"Not loaning (since {local_time(response.not_loaned_since)}): {response.not_loaned}")
           if response.not_loaned else "")

    def table() -> str:
        if not loans:
            out.note("No loans." if args.all else "No active loans (--all includes returned ones).")
            return why
        rows = [
            (
                loan.loan_id,
                loan.server_id,
                enum_name(types_pb2.LoanState, loan.state),
                local_time(loan.started_at),
                local_time(loan.ended_at),
                local_time(loan.hard_deadline),
                loan.reason,
            )
            for loan in loans
        ]
        listed = format_table(("LOAN", "SERVER", "STATE", "STARTED", "ENDED", "HARD DEADLINE", "REASON"), rows)
        return f"{listed}\n\n{why}" if why else listed

    out.emit(loans, table)
    return EXIT_OK


def cmd_events(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    if args.follow:
        return _follow_events(client, args, out)
    stream = client.watch_events(
        after_event_id=args.since, job_id=args.job, server_id=args.server_id, idle_timeout=EVENTS_IDLE_S
    )
    with stream:
        events = list(stream)

    def table() -> str:
        if not events:
            out.note(f"No events after event {args.since}.")
            return ""
        return format_table(EVENT_HEADERS, [_event_row(e) for e in events])

    out.emit(events, table)
    return EXIT_OK


def _follow_events(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    """Stream events until Ctrl-C. A lost stream (the scheduler stopped, restarted or went out of
    reach) is reopened after the last event printed, so a restart costs neither duplicates nor
    gaps; one line on stderr says so. A scheduler unreachable at the start is an error (exit 3)."""
    client.wait_until_connected()
    after = args.since
    backoff = Backoff.capped(EVENTS_RECONNECT_MAX_S)
    current = client
    announced = False  # the reconnection line of this outage is printed
    try:
        if out.fmt == "table":
            print(_stream_line(EVENT_HEADERS, EVENT_STREAM_WIDTHS), file=out.stream, flush=True)
        while True:
            opened = time.monotonic()
            try:
                with current.watch_events(after_event_id=after, job_id=args.job, server_id=args.server_id) as stream:
                    for event in stream:
                        backoff.reset()
                        announced = False
                        if out.fmt == "table":
                            print(_stream_line(_event_row(event), EVENT_STREAM_WIDTHS), file=out.stream, flush=True)
                        else:
                            out.emit_stream_item(event)
                        after = event.event_id
                lost = "the scheduler ended the stream"
            except ArylError as exc:
                if exc.code not in EVENTS_RECONNECT_CODES:
                    raise
                lost = f"{exc.message} ({exc.code.name})"
            if time.monotonic() - opened > EVENTS_RECONNECT_MAX_S:
                announced = False  # the stream was up: this is a new outage
            if not announced:
                out.note(f"{PROG}: lost the event stream from {current.address} ({lost}); reconnecting, "
                         f"resuming after event {after} (Ctrl-C to stop)")
                announced = True
            current = _reconnect(current, backoff)
    except KeyboardInterrupt:
        pass  # --follow ends with Ctrl-C; that is success
    finally:
        if current is not client:
            current.close()
    return EXIT_OK


def _reconnect(current: ArylClient, backoff: Backoff) -> ArylClient:
    """A connected client to the same address, after as many backed-off attempts as it takes.

    Each attempt is a new client: a fresh connection now, not gRPC's own reconnection schedule."""
    while True:
        time.sleep(backoff.next_delay())
        current.close()
        current = ArylClient(current.address, timeout=current.timeout)
        try:
            current.wait_until_connected()
        except (Unavailable, DeadlineExceeded):
            continue
        return current


def describe_explanation(response: scheduler_pb2.ExplainJobResponse) -> str:
    job = response.job
    summary = response.summary or enum_name(types_pb2.JobState, job.state)
    head = printable(f"Job {job.job_id} ({job.spec.name}): {summary}")
    if response.queue_status:  # its queue's quota and usage
        head += "\n" + printable(response.queue_status[0].upper() + response.queue_status[1:])
    if response.eta:  # when it is expected to start, after which jobs (the scheduler's forecast)
        head += "\n" + printable(response.eta[0].upper() + response.eta[1:])
    if response.deadline:  # where it stands against its deadline, and why
        head += "\n" + printable(f"Deadline {local_time(job.spec.deadline)}: {response.deadline}")
    if response.protection or response.disruptions_last_hour:  # its anti-thrashing window (core.protection)
        head += "\n" + printable(f"Protection: {response.protection or 'none'} ({response.disruptions_last_hour} "
                                  "resize(s)/preemption(s) in the last hour)")
    if not response.decisions:
        return head + "\n\nNo decisions recorded."
    rows = [(local_time(e.time), e.reason, e.message) for e in response.decisions]
    return head + "\n\n" + format_table(("TIME", "REASON", "MESSAGE"), rows)


def cmd_explain(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.explain_job(args.job_id)
    out.emit(response, lambda: describe_explanation(response))
    return EXIT_OK


def describe_reclaim_preview(response: scheduler_pb2.PreviewReclaimResponse) -> str:
    fields = format_fields(
        [
            ("Loaned servers", response.loaned_servers),
            ("Would reclaim", ", ".join(response.server_ids) or "-"),
            ("Would preempt", ", ".join(f"job {j}" for j in response.preempted_job_ids) or "none"),
            ("Cost", f"{response.cost_gpu_seconds:.0f} GPU-seconds"),
        ]
    )
    if not response.scaled_in:
        return fields
    rows = [(s.job_id, s.workers_before, s.workers_after) for s in response.scaled_in]
    return fields + "\n\nScaled in:\n" + format_table(("JOB", "WORKERS", "AFTER"), rows)


def cmd_reclaim_preview(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.preview_reclaim(args.servers)
    out.emit(response, lambda: describe_reclaim_preview(response))
    return EXIT_OK


def cmd_demand_set(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.report_demand(args.servers_needed, observed_rps=args.rps, source=args.source)
    out.emit(
        response,
        lambda: format_fields(
            [
                ("Inference demand", _demand_text(response.demand)),
                ("Servers serving", response.servers_serving),
                ("Servers loaned", response.servers_loaned),
            ]
        ),
    )
    return EXIT_OK


def cmd_demand_get(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    demand = client.get_demand()
    out.emit(demand, lambda: format_fields([("Inference demand", _demand_text(demand))]))
    return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Argument parsing


def _job_state(text: str) -> list[int]:
    states = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        try:
            states.append(types_pb2.JobState.Value("JOB_STATE_" + name.upper()))
        except ValueError:
            names = [enum_name(types_pb2.JobState, v).lower() for v in types_pb2.JobState.values() if v]
            close = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise argparse.ArgumentTypeError(
                f"unknown job state {name!r} ({hint}choose from {', '.join(names)})") from None
    return states


def _pool(text: str) -> int:
    try:
        return types_pb2.Pool.Value("POOL_" + text.upper())
    except ValueError:
        raise argparse.ArgumentTypeError(f"unknown pool {text!r} (choose from training, inference)") from None


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _deadline(text: str) -> dt.datetime:
    try:
        return parse_deadline(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def _positive(text: str) -> float:
    value = _non_negative(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


UINT32_MAX: Final = 2**32 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _uint32(text: str) -> int:
    """A count the API carries as uint32 (workers, GPUs, servers, a rank)."""
    value = _count(text)
    if value > UINT32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {UINT32_MAX}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    value = _count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _int32(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not INT32_MIN <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer from {INT32_MIN} to {INT32_MAX}, got {text!r}")
    return value


# What users of Slurm and Kubernetes type, and arylctl's flag for it: `submit --gpus 2` is answered with
# the flag that exists (and what it means here) instead of the top-level usage.
FLAG_ALIASES: Final[Mapping[str, tuple[str, str]]] = {
    **dict.fromkeys(("--gpus", "--gres", "--gpus-per-node", "--gpus-per-task", "--gpu", "--nvidia.com/gpu"),
                    ("--gpus-per-worker", "GPUs of each worker; the number of workers is --min-workers/--max-workers")),
    **dict.fromkeys(("--nodes", "-N", "--ntasks", "-n", "--replicas", "--workers", "--num-workers", "--nproc"),
                    ("--min-workers", "and --max-workers for an elastic job; GPUs of each: --gpus-per-worker")),
    **dict.fromkeys(("--job-name", "-J"), ("--name", "")),
    **dict.fromkeys(("--partition", "-p", "--namespace"), ("--queue", "")),
    **dict.fromkeys(("--time", "-t", "--time-limit", "--active-deadline-seconds"), ("--max-runtime", "in seconds")),
    **dict.fromkeys(("--export",), ("--env", "NAME=VALUE, repeatable")),
    **dict.fromkeys(("--workdir", "-D", "--working-dir", "--cwd"), ("--chdir", "")),
}


def did_you_mean(option: str, parser: argparse.ArgumentParser) -> str:
    """`` (did you mean --x?)`` for an option ``parser`` does not know, or "" when nothing is close: a
    Slurm or Kubernetes spelling (``FLAG_ALIASES``), an option it begins (``--stat``: ``--state``), or
    one spelled alike."""
    known = [o for o in parser._option_string_actions if o.startswith("-")]  # argparse's own table of options
    name = option.split("=", 1)[0]
    alias = FLAG_ALIASES.get(name)
    if alias is not None and alias[0] in known:
        return f" (did you mean {alias[0]}?{' ' + alias[1] if alias[1] else ''})"
    begun = sorted(o for o in known if o.startswith(name) and len(name) > 2)
    close = begun or difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


# Where ``ArylArgumentParser.parse_known_args`` leaves the bad values it met (argparse stops at the first).
_BAD_VALUES = "_aryl_bad_values"


class ArylArgumentParser(argparse.ArgumentParser):
    """argparse that answers a mistyped choice (a command, ``--restart-policy``...) with the closest one,
    and that reports every bad value of a command line at once: a value its type refuses is noted and
    parsing goes on, and ``parse_args`` reports them all with the unrecognised arguments (argparse's own
    stops at the first). Whoever calls ``parse_known_args`` reports ``bad_values(namespace)`` itself."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._bad_values: list[str] = []
        parsed, extras = super().parse_known_args(args, namespace)
        setattr(parsed, _BAD_VALUES, [*getattr(parsed, _BAD_VALUES, []), *self._bad_values])  # a command's too
        return parsed, extras

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        problems = bad_values(parsed) + _unknown_arguments(unknown, _chosen_parser(self, parsed), "")
        if problems:
            report_usage_errors(_chosen_parser(self, parsed), problems)
        return parsed

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            self._bad_values.append(str(exc))  # reported with every other error of the command line
            return None

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in action.choices], n=1, cutoff=0.6)
            if close:
                choices = ", ".join(repr(str(c)) for c in action.choices)
                raise argparse.ArgumentError(
                    action, f"invalid choice: {value!r} (did you mean {close[0]!r}? choose from {choices})")
        super()._check_value(action, value)


def bad_values(args: argparse.Namespace) -> list[str]:
    """The values ``ArylArgumentParser`` refused while parsing ``args`` (each "argument --x: why")."""
    return list(getattr(args, _BAD_VALUES, []))


def report_usage_errors(parser: argparse.ArgumentParser, problems: Sequence[str]) -> None:
    """``parser``'s usage, then one ``error:`` line per problem; exits 2, as argparse does for one."""
    parser.print_usage(sys.stderr)
    parser.exit(EXIT_USAGE, "".join(f"{parser.prog}: error: {problem}\n" for problem in problems))


def _chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's own parser that ``args`` came through, e.g. ``queues create``'s."""
    while True:
        for action in parser._actions:  # argparse keeps its subcommands there
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(args, action.dest or "", None)
                if chosen in action.choices:
                    parser = action.choices[chosen]
                    break
        else:
            return parser


def _unknown_arguments(unknown: Sequence[str], parser: argparse.ArgumentParser, command: str) -> list[str]:
    """One problem a line for what ``parser`` did not recognise: each option with what the user may have
    meant (the values that follow an unknown option go with it); stray words once."""
    problems: list[str] = []
    stray: list[str] = []
    after_option = False
    for arg in unknown:
        if arg.startswith("-") and arg != "-":
            problems.append(f"unrecognized argument {arg.split('=', 1)[0]}{did_you_mean(arg, parser)}")
            after_option = "=" not in arg
        elif after_option:
            after_option = False  # the unknown option's value
        else:
            stray.append(arg)
    if stray:
        where = (f"; a job's command goes after --: {PROG} submit [flags] -- PROGRAM [ARGS...]"
                 if command == "submit" else "")
        problems.append(f"unrecognized arguments: {' '.join(stray)}{where}")
    return problems


def _add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    # Accepted before and after the subcommand. On subcommands the defaults are SUPPRESSed so
    # that an option left out there does not overwrite the one given before the subcommand.
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--server",
        default=default(None),
        metavar="HOST:PORT",
        help=f"scheduler address, or several comma-separated (HA: the leader is followed; default: $ARYL_SERVER, "
             f"else {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml", "name"), default=default("table"),
        help="output format (name: one id per line, for jobs and servers)",
    )
    parser.add_argument(
        "--timeout", type=_positive, default=default(10.0), metavar="SECONDS", help="deadline of each call"
    )
    parser.add_argument(
        "--insecure", action="store_true", default=default(False),
        help="plaintext, no certificate or token: only for a scheduler run with security.insecure "
             "(default: TLS and a token, docs/security.md; also ARYL_INSECURE=1)",
    )
    add_debug_flag(parser, default=default(False))


WATCH_HELP: Final = (
    "print the list, then again after each change the event log reports, until Ctrl-C "
    "(-o json: one JSON list per line; -o yaml: one document per change)"
)


def _global_options_parser() -> argparse.ArgumentParser:
    """The global options as a parent for a command's parser (they then work after it too)."""
    common = ArylArgumentParser(add_help=False, allow_abbrev=False)
    _add_global_options(common, defaults=False)
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = ArylArgumentParser(
        prog=PROG,
        description="Command line for the Aryl elastic GPU scheduler.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    _add_global_options(parser, defaults=True)
    common = ArylArgumentParser(add_help=False, allow_abbrev=False)
    _add_global_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    def add(name: str, handler: Callable[..., int] | None, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=help_text, description=help_text, parents=[common], allow_abbrev=False, **kwargs
        )
        if handler is not None:
            sub.set_defaults(handler=handler)
        return sub

    submit = add(
        "submit",
        cmd_submit,
        "queue a job",
        usage=f"{PROG} submit [-f FILE] [flags] [-- PROGRAM [ARGS...]]",
        epilog="Flags given with -f override the file's values; --env entries are merged into its env. "
               "Working directory: with --chdir DIR (or working_dir in the file) the workers start in DIR, "
               "which must exist on the servers: where it does not, the worker does not start and the job "
               "FAILS, naming the directory and the server. Without either, the submit directory is sent "
               "as a default (working_dir_if_exists): used where it exists on the server, else the worker "
               "starts in the agent's directory for the job and its log says so. "
               "--wait exit codes: 0 the job COMPLETED, 1 it FAILED or was CANCELLED, 130 detached "
               "(Ctrl-C; the job keeps running), 2 and 3 as for every command.",
    )
    submit.add_argument("-f", "--file", help="job spec file (YAML, or JSON when named *.json; - for stdin); "
                                              "default: none, the flags alone")
    submit.add_argument(
        "--chdir", metavar="DIR",
        help="where the workers start, a path on the servers (relative: to the current directory); "
             "required to exist there. Default: the current directory where it exists on the server",
    )
    submit.add_argument(
        "--wait", action="store_true",
        help="then print the job's log (rank 0) until the job ends; exit 0 if it COMPLETED, 1 if it FAILED "
             "or was CANCELLED. Ctrl-C detaches without cancelling",
    )
    submit.add_argument("--poll", type=_positive, default=1.0, metavar="SECONDS", help=argparse.SUPPRESS)
    submit.add_argument("--name", help="the job's name; required (or 'name' in the -f file)")
    submit.add_argument("--user", help="default: your login name")
    submit.add_argument("--queue", help="default: default")
    submit.add_argument("--gpus-per-worker", type=_uint32, metavar="N", help="GPUs each worker gets (default: 1)")
    submit.add_argument("--min-workers", type=_uint32, metavar="N",
                        help="workers it needs to run at all, started together (default: 1)")
    submit.add_argument("--max-workers", type=_uint32, metavar="N",
                        help="the most workers it may grow to (default: --min-workers, inelastic)")
    submit.add_argument("--priority", type=_int32, metavar="N", help="higher runs first among equals (default: 0)")
    submit.add_argument("--priority-class", metavar="NAME",
                        help="its class within the queue (the scheduler's scheduling.priority_classes): higher "
                             "classes go first and may preempt lower ones (default: none, value 0)")
    submit.add_argument("--gpu-type", dest="gpu_types", action="append", metavar="MODEL",
                        help="run only on this GPU type (as `arylctl servers` shows it); repeatable, preferred first "
                             "(default: any type)")
    submit.add_argument("--batch-size", type=_uint32, metavar="INIT",
                        help="the job adapts its batch size to its allocation (goodput): INIT is the total batch "
                             "its hyper-parameters were tuned for; its workers get ARYL_LOCAL_BATCH_SIZE and "
                             "ARYL_ACCUM_STEPS (the job contract: docs/jobs.md); default: none, its batch is its own")
    submit.add_argument("--max-batch-size", type=_uint32, metavar="N",
                        help="with --batch-size: the largest total batch it accepts (default: INIT, a fixed total)")
    submit.add_argument("--max-local-batch-size", type=_uint32, metavar="N",
                        help="with --batch-size: the largest batch one GPU fits in one pass (default: INIT's share "
                             "per GPU at --min-workers)")
    submit.add_argument("--env", type=_env_pair, action="append", metavar="NAME=VALUE",
                        help="a variable for the workers; repeatable (default: none; LD_* are refused unless "
                             "the cluster allows them)")
    submit.add_argument("--deadline", type=_deadline, metavar="TIME",
                        help="when the job should be finished: an ISO 8601 time (2026-11-24T18:00Z; local time "
                             "unless an offset is given) or a time from now (6h, 90m, 1h30m, 2d); the answer says "
                             "whether it looks feasible (default: none)")
    submit.add_argument("--max-runtime", type=_non_negative, metavar="SECONDS",
                        help="a run-time limit recorded with the job; the scheduler does not enforce it yet "
                             "(default: none)")
    submit.add_argument("--restart-policy", choices=sorted(RESTART_POLICIES),
                        help="restart a failed job? on_failure restarts it up to --max-restarts times (default: "
                             "on_failure, with --max-restarts 0: never restarted)")
    submit.add_argument("--max-restarts", type=_uint32, metavar="N",
                        help="restarts after failures with --restart-policy on_failure (default: 0, none)")
    submit.add_argument(
        "--array", metavar="INDICES",
        help="queue a job array: one job per index, all or none, e.g. 0-999, 0-999:2 (step) or 1,3,5 (at most "
             "10,000 jobs; Slurm's %%N is not supported). Each job's workers get ARYL_ARRAY_INDEX and "
             "ARYL_ARRAY_JOB_ID; arylctl jobs shows NAME[INDEX] (default: one job)",
    )
    submit.add_argument("--estimated-runtime", type=_non_negative, metavar="SECONDS",
                        help="how long it runs at --min-workers: what its predicted finish and ETAs rest on until "
                             "it reports progress (default: none; then no predicted finish, never a guess)")
    submit.add_argument(
        "--idempotency-key", default="", metavar="KEY",
        help="default: a random one, printed on stderr if the submit fails. Per user: submitting again with "
             "it returns the job it queued (same spec) or is refused naming that job (other spec), so a "
             "script may always run a failed submit again with the same key",
    )
    submit.add_argument(
        "--retry-for", type=_non_negative, default=SUBMIT_RETRY_S, metavar="SECONDS",
        help=f"how long an unanswered submit is retried with its key once the scheduler was reached (a "
             f"restart, a standby taking over), with a progress line on stderr (default: {SUBMIT_RETRY_S:g}); "
             f"a scheduler never reached is tried {SUBMIT_ATTEMPTS} times",
    )

    jobs = add(
        "jobs", cmd_jobs, "list jobs, newest first",
        epilog="ELAPSED: how long a job has waited since submission until it starts, then how long since it "
               "started; once finished, its run time (start to finish; - if it never started).",
    )
    jobs.add_argument(
        "--state", dest="state_lists", type=_job_state, action="append", metavar="STATE",
        help="pending, running, scaling, preempted, completed, failed, cancelled (repeatable, or comma-separated)",
    )
    jobs.add_argument("--user", default="")
    jobs.add_argument("--queue", default="")
    limits = jobs.add_mutually_exclusive_group()
    limits.add_argument("--limit", type=_positive_int, metavar="N", help="at most N jobs (following pages)")
    limits.add_argument("--all", action="store_true", help="every matching job (following pages)")
    jobs.add_argument("-w", "--watch", action="store_true", help=WATCH_HELP)

    add("job", cmd_job, "describe a job: its fields, workers and events").add_argument("job_id", metavar="ID")

    cancel = add("cancel", cmd_cancel, "cancel a job, or with --array every job of an array")
    cancel.add_argument("job_id", metavar="ID")
    cancel.add_argument("--array", action="store_true",
                        help="ID is a job array's id (as submit --array printed it): cancel its jobs not ended yet")
    cancel.add_argument("--reason", default="", help="recorded in the event log")

    add("cluster", cmd_cluster, "capacity per pool, jobs per state, inference demand, policy")
    add_queue_commands(add, common, format_table, EXIT_OK)
    add_what_if_command(add, EXIT_OK)

    servers = add(
        "servers", cmd_servers, "list servers, or take one out: cordon, uncordon, drain, delete",
        epilog="STATE: the server's state, then what an operator or its agent asked: CORDONED (no new "
               "workers or loans), DRAINING (work moves off), DRAINED (nothing left there), LEFT (its agent "
               "deregistered), DELETING (deleted by force: removed once its jobs are off). LOST servers stay "
               f"listed until deleted ({PROG} servers delete NAME).",
    )
    servers.add_argument("--pool", type=_pool, default=types_pb2.POOL_UNSPECIFIED, metavar="training|inference")
    servers.add_argument("-w", "--watch", action="store_true", help=WATCH_HELP)
    server_commands = servers.add_subparsers(dest="servers_command", metavar="cordon|uncordon|drain|delete")

    def add_server_command(name: str, handler: Callable[..., int], help_text: str,
                           **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("parents", [common])
        sub = server_commands.add_parser(name, help=help_text, description=help_text, allow_abbrev=False, **kwargs)
        sub.set_defaults(handler=handler)
        sub.add_argument("server_id", metavar="NAME", help="the server's name (its hostname)")
        return sub

    cordon = add_server_command("cordon", cmd_server_cordon,
                                "place no new workers or loans on a server; what runs there keeps running")
    cordon.add_argument("--reason", default="", help="shown in the listing and the event log")
    add_server_command("uncordon", cmd_server_uncordon, "let a cordoned or drained server take new work again")
    drain = add_server_command(
        "drain", cmd_server_drain,
        "cordon a server and move work off it: elastic jobs shrink off it (or requeue below their minimum), "
        "other jobs finish there (or are requeued after --timeout, or now with --force); a loaned inference "
        "server is reclaimed. It shows DRAINED once nothing runs there",
        # Its own --timeout (kubectl drain's) replaces the global one here (give that before the command),
        # on its own copy of the global options: "resolve" edits the actions it inherits.
        parents=[_global_options_parser()], conflict_handler="resolve",
    )
    drain.add_argument("--reason", default="", help="shown in the listing and the event log")
    drain_when = drain.add_mutually_exclusive_group()
    drain_when.add_argument("--timeout", dest="drain_timeout", type=_non_negative, default=0.0, metavar="SECONDS",
                            help="requeue the jobs still there after this long (default 0: wait for them; the "
                                 f"call's own deadline: {PROG} --timeout S servers drain ...)")
    drain_when.add_argument("--force", action="store_true", help="requeue the jobs that cannot shrink off now")
    delete = add_server_command(
        "delete", cmd_server_delete,
        "remove a server from the cluster and the listing; refused while workers run there unless it is LOST "
        "or --force (drain it first). A deleted server whose agent still runs registers again",
    )
    delete.add_argument("--force", action="store_true",
                        help="delete although workers run there: their jobs shrink off it or are requeued first")

    add("loans", cmd_loans, "list loans of inference servers to training").add_argument(
        "--all", action="store_true", help="include returned loans"
    )

    events = add(
        "events",
        cmd_events,
        "show the event log",
        epilog=(
            "Replays the events after --since (default 0: the whole log). Without --follow it stops once "
            f"the log has been quiet for {EVENTS_IDLE_S:g}s (caught up); with --follow it keeps streaming "
            "new events until Ctrl-C (-o json then prints one JSON object per line, -o yaml one document "
            "per event). A followed stream that loses its scheduler (a restart) says so on stderr and "
            f"reconnects, waiting up to {EVENTS_RECONNECT_MAX_S:g}s between attempts, until Ctrl-C; it "
            "resumes after the last event it printed, so nothing is printed twice or skipped."
        ),
    )
    events.add_argument("--job", default="", metavar="ID", help="only this job's events")
    events.add_argument("--server-id", default="", metavar="ID", help="only this server's events")
    events.add_argument("-f", "--follow", action="store_true", help="keep streaming new events (reconnecting)")
    events.add_argument("--since", type=_count, default=0, metavar="EVENT_ID", help="replay events after this id")

    add("explain", cmd_explain, "why a job is pending, was preempted, or keeps its size").add_argument(
        "job_id", metavar="ID")

    logs = add("logs", cmd_logs, "show a worker's output (stdout and stderr), read from its server's agent",
               epilog="Logs stay on the server that ran the worker; each incarnation (start, resize, "
                      "restart) of the job appends to the same per-rank log under a header line.")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("--rank", type=_uint32, default=0, metavar="N", help="which worker (default 0)")
    logs.add_argument("--tail", type=_count, metavar="LINES", help="only the last LINES lines")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new output until the job has finished (or Ctrl-C); a pending or "
                           "preempted job is followed on, since it may run again")
    logs.add_argument("--poll", type=_positive, default=1.0, metavar="SECONDS", help=argparse.SUPPRESS)
    add("reclaim-preview", cmd_reclaim_preview,
        "dry run: what reclaiming N loaned servers would do now").add_argument("servers", type=_uint32, metavar="N")

    demand = add("demand", None, "report or show inference demand")
    demand_commands = demand.add_subparsers(dest="demand_command", metavar="set|get", required=True)
    demand_set = demand_commands.add_parser(
        "set", parents=[common], help="report how many inference servers must be serving", allow_abbrev=False
    )
    demand_set.set_defaults(handler=cmd_demand_set)
    demand_set.add_argument("servers_needed", type=_uint32, metavar="N")
    demand_set.add_argument("--rps", type=_non_negative, default=0.0, metavar="X", help="observed requests per second")
    demand_set.add_argument("--source", default="arylctl", help="who reports (default: arylctl)")
    demand_get = demand_commands.add_parser(
        "get", parents=[common], help="show the last reported demand", allow_abbrev=False
    )
    demand_get.set_defaults(handler=cmd_demand_get)

    login = add("login", None, "store your token for later commands (a file only you can read)",
                epilog="The token is read from stdin (or --token) and kept in $XDG_CONFIG_HOME/aryl/token "
                       "(~/.config/aryl/token), mode 0600; ARYL_TOKEN overrides it. docs/security.md.")
    login.add_argument("--token", help="the token (default: read from stdin, so it stays out of shell history)")
    login.add_argument("--file", help="where to keep it (default: ~/.config/aryl/token)")
    certs.add_certs_commands(add, common)
    add("completion", None, "print a shell completion script",
        epilog=f"bash: source <({PROG} completion bash), or save it in /etc/bash_completion.d/{PROG}. "
               f"zsh: source <({PROG} completion zsh). Job ids and server names are completed from what "
               f"the scheduler lists ({PROG} jobs|servers -o name).").add_argument("shell", choices=completion.SHELLS)
    return parser


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: what follows is the job's argv, untouched by argparse."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line parsed; every usage error found is reported at once (one ``error:`` line each,
    after the usage of the command that has them) and exits 2, as argparse does for one."""
    parser = build_parser()
    own, command = _split_command(argv)
    args, unknown = parser.parse_known_args(own)
    args.command = command
    chosen = _chosen_parser(parser, args)
    problems = bad_values(args) + _unknown_arguments(unknown, chosen, args.command_name)
    if command and args.command_name != "submit":
        problems.append(f"{args.command_name} takes no arguments after --")
    if args.output == "name" and args.command_name not in NAME_COMMANDS:
        problems.append(f"-o name applies only to {' and '.join(sorted(NAME_COMMANDS))}")
    if problems and args.command_name == "submit" and not args.file:
        problems += submit_spec_problems({"name": args.name, "command": command})  # the rest of its errors
    if problems:
        report_usage_errors(chosen, problems)
    if args.command_name == "jobs":
        args.states = [state for states in args.state_lists or () for state in states]
    return args


# ---------------------------------------------------------------------------------------------
# Entry point


def _plaintext(args: argparse.Namespace) -> bool:
    """Whether arylctl talks plaintext: ``--insecure`` or ``ARYL_INSECURE`` (as ``ClientSecurity.from_env``)."""
    flag = os.environ.get(ENV_INSECURE, "").lower()
    return bool(args.insecure) or (flag in ("1", "true", "yes") if flag else not SECURE_BY_DEFAULT)


def _tls_hint(message: str, address: str, plaintext: bool) -> str | None:
    """The fix for a connection that failed at TLS, or None when ``message`` is not about TLS."""
    if not any(word in message for word in ("ssl", "SSL", "handshake", "Socket closed")):
        return None
    tls_env = "ARYL_TLS_CA, ARYL_TLS_CERT and ARYL_TLS_KEY (absolute paths: the cluster's ca.crt and a client " \
              "certificate and key, as 'arylctl certs init' printed them; docs/security.md)"
    if plaintext:  # a TLS scheduler closes a plaintext connection at once
        return (f"hint: arylctl spoke plaintext (--insecure or ARYL_INSECURE) and {address} closed the connection: "
                f"a scheduler with TLS does that. Leave out --insecure, unset ARYL_INSECURE, and export {tls_env}")
    if "CERTIFICATE_VERIFY_FAILED" in message:
        return (f"hint: the certificate of {address} is not signed by a CA arylctl trusts: export {tls_env}; "
                "ARYL_TLS_CA must be the CA that signed the scheduler's certificate")
    expired = _client_certificate_expiry()
    if expired is not None:  # the scheduler's TLS refuses it at the handshake: it closes the socket
        path, not_after = expired
        return (f"hint: the client certificate {path} (ARYL_TLS_CERT) expired at {not_after:%Y-%m-%d %H:%M:%S} UTC; "
                "a development CA re-issues its certificates with 'arylctl certs renew DIR' (same keys), "
                "otherwise ask the cluster's admin for a new one (docs/security.md)")
    return (f"hint: the TLS handshake with {address} failed: export {tls_env}; for a scheduler started with "
            "--insecure (plaintext), pass --insecure or set ARYL_INSECURE=1 instead")


def _client_certificate_expiry() -> tuple[str, dt.datetime] | None:
    """(path, notAfter) of the client certificate ARYL_TLS_CERT names, when it has expired; None otherwise
    (none set, unreadable, or still valid)."""
    path = os.environ.get(ENV_TLS_CERT)
    if not path:
        return None
    try:
        from cryptography import x509

        not_after = x509.load_pem_x509_certificate(Path(path).read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None
    return (path, not_after) if not_after <= dt.datetime.now(dt.UTC) else None


def _report_rpc_error(exc: ArylError, address: str, timeout: float, stderr: TextIO, *, plaintext: bool = False) -> int:
    print(f"error: {exc.message} ({exc.code.name})", file=stderr)
    if exc.code == grpc.StatusCode.UNAVAILABLE and not exc.from_scheduler:
        hint = _tls_hint(exc.message, address, plaintext)
        if hint is not None:
            print(hint, file=stderr)
            return EXIT_UNAVAILABLE
        print(
            f"hint: no scheduler answered at {address}; check --server or the ARYL_SERVER environment variable",
            file=stderr,
        )
        return EXIT_UNAVAILABLE
    if exc.code == grpc.StatusCode.UNAUTHENTICATED:
        print("hint: log in with 'arylctl login' (the token is read from stdin), or set ARYL_TOKEN", file=stderr)
    if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        print(f"hint: the call took longer than {timeout:g}s; raise --timeout if the scheduler is busy", file=stderr)
    if exc.code == grpc.StatusCode.OUT_OF_RANGE:
        print("hint: the log became shorter than where arylctl was reading (the worker may have moved to "
              "another server); run the command again to read it from the start", file=stderr)
    return EXIT_USAGE if exc.code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILED


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run one arylctl command; returns the exit code (see the module docstring).

    ``stdout``/``stderr`` (default: the process's) receive the command's results and its
    errors; argparse's usage and help text always go to the process's streams.
    """
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    err = stderr or sys.stderr
    if args.command_name == "completion":  # no scheduler involved
        (stdout or sys.stdout).write(completion.script(build_parser(), args.shell))
        return EXIT_OK
    if args.command_name in ("login", "certs"):  # local files only
        return run_guarded(PROG, lambda: _run_local(args, stdout or sys.stdout, err), debug=args.debug, stderr=err)
    return run_guarded(PROG, lambda: _run(args, stdout or sys.stdout, err), debug=args.debug, stderr=err)


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """One command, its expected failures reported as ``error: ...`` lines; the unexpected ones
    (bugs) reach ``main``'s handler."""
    address = args.server or default_address()
    out = Output(args.output, stdout, stderr)
    try:
        security = ClientSecurity(insecure=True) if args.insecure else None
        with ArylClient(address, timeout=args.timeout, security=security) as client:
            return args.handler(client, args, out)
    except ArylError as exc:
        return _report_rpc_error(exc, address, args.timeout, stderr, plaintext=_plaintext(args))
    except UsageError as exc:
        print(f"error: {exc}", file=stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `arylctl jobs | head`: the reader left; not an error worth a trace
        _silence_stdout()
        return EXIT_OK


def _run_local(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """``login`` and ``certs init|add``: files on this machine, no scheduler."""
    if args.command_name == "login":
        token = (args.token if args.token is not None else sys.stdin.readline()).strip()
        if not token or any(c.isspace() for c in token):
            print("error: the token is empty or has spaces; paste it as issued (token-NAME of arylctl certs init)",
                  file=stderr)
            return EXIT_USAGE
        path = Path(args.file) if args.file else default_token_file()
        try:
            store_token(path, token)
        except UnsafeTokenPath as exc:
            print(f"error: {exc}", file=stderr)
            return EXIT_USAGE
        print(f"token stored in {path} (mode 0600)", file=stdout)
        return EXIT_OK
    return certs.run_command(args, stdout, stderr)


def _silence_stdout() -> None:
    # Python flushes stdout again at exit and would report the broken pipe; point it at devnull.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":  # pragma: no cover - `python -m arylctl.cli`
    sys.exit(main())
