"""``arylctl jobs``, ``job ID`` and ``cancel``: the list of jobs (its rows and columns), one job described
(its fields, workers, step times and events), and cancelling a job or a job array."""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
from collections.abc import Sequence
from typing import Any, Final

from google.protobuf.timestamp_pb2 import Timestamp

from arylctl.args import WATCH_HELP, AddCommand, job_states, positive_int
from arylctl.client import TERMINAL_JOB_STATES, ArylClient
from arylctl.commands.events import EVENT_HEADERS, event_row, watch
from arylctl.output import (
    EXIT_OK,
    Output,
    duration_text,
    elapsed_text,
    enum_name,
    format_fields,
    format_table,
    local_time,
    printable,
)
from protos.aryl.v1 import scheduler_pb2, types_pb2

LIST_ALL_PAGE_SIZE: Final = 1000  # the server's maximum; fewer round trips for --all


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


def is_set(ts: Timestamp) -> bool:
    return bool(ts.seconds or ts.nanos)


def job_elapsed(job: types_pb2.Job, now: dt.datetime) -> str:
    """The ELAPSED column, squeue's TIME made to say something for every state: a job that has
    not started yet shows how long it has waited since submission; a started one how long since it
    (first) started; a finished one its run time, start to finish (``-`` if it never started)."""
    def seconds(ts: Timestamp, until: dt.datetime) -> float:
        return (until - ts.ToDatetime(tzinfo=dt.UTC)).total_seconds()

    if is_set(job.finished_at):
        if not is_set(job.started_at):
            return "-"
        return elapsed_text(seconds(job.started_at, job.finished_at.ToDatetime(tzinfo=dt.UTC)))
    if is_set(job.started_at):
        return elapsed_text(seconds(job.started_at, now))
    return elapsed_text(seconds(job.submitted_at, now)) if is_set(job.submitted_at) else "-"


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

    if is_set(job.eta_start):
        return f"starts {when(job.eta_start)}"
    if is_set(job.eta_finish) and job.state in (types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_SCALING):
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
    confidence = f", confidence {job.prediction_confidence:.2f}" if is_set(job.predicted_finish) else ""
    if job.state in TERMINAL_JOB_STATES:
        return "-"
    if is_set(job.eta_finish):
        return f"{local_time(job.eta_finish)} (forecast of the cluster{confidence})"
    if not is_set(job.predicted_finish):
        return ("- (no run-time estimate: none declared, e.g. submit --estimated-runtime, and no progress "
                "reported yet)")
    if running:
        return f"{local_time(job.predicted_finish)} (at its current size{confidence})"
    return "- (its start is unknown)" if job.eta_note else "- (no forecast yet)"


def job_display_name(job: types_pb2.Job) -> str:
    """The job's name; an array element's with its index, as ``train[17]``."""
    return f"{job.spec.name}[{job.array_index}]" if job.array_job_id else job.spec.name


def job_summary_table(job: types_pb2.Job) -> str:
    """What submit and cancel print: the job's id, name and state."""
    row = (job.job_id, job.spec.name, enum_name(types_pb2.JobState, job.state))
    return format_table(("ID", "NAME", "STATE"), [row])


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
        return watch(client, out, render)
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
          if is_set(job.eta_start) or job.eta_note else []),
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
        steps = [(t.nodes, t.replicas, t.gpu_type or "-", t.local_batch_size, t.accum_steps, f"{t.pass_time_s:.4g}",
                  f"{t.step_time_s:.4g}", local_time(t.measured_at)) for t in job.step_times]
        sections.append("Step times (measured by rank 0):\n" + format_table(STEP_TIME_HEADERS, steps))
    events = [event_row(e) for e in response.events]
    sections.append("Events:\n" + (format_table(EVENT_HEADERS, events) if events else "(none)"))
    return "\n\n".join(sections)


STEP_TIME_HEADERS: Final = ("SERVERS", "GPUS", "GPU TYPE", "LOCAL BATCH", "ACCUM", "PASS S", "STEP S", "MEASURED")


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
    if job.type_speeds:
        fields.append(("Speed by GPU type", "; ".join(
            f"{s.gpu_type} {s.samples_per_gpu_s:.4g} samples/s per GPU (x{s.relative:.2f}, {s.source})"
            for s in job.type_speeds)))
    return fields


def cmd_job(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.get_job(args.job_id, include_events=True)
    out.emit(response, lambda: describe_job(response))
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


def add_jobs_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``jobs [--state S] [--user U] [--queue Q] [--limit N|--all] [-w]``."""
    jobs = add(
        "jobs", cmd_jobs, "list jobs, newest first",
        epilog="ELAPSED: how long a job has waited since submission until it starts, then how long since it "
               "started; once finished, its run time (start to finish; - if it never started).",
    )
    jobs.add_argument(
        "--state", dest="state_lists", type=job_states, action="append", metavar="STATE",
        help="pending, running, scaling, preempted, completed, failed, cancelled (repeatable, or comma-separated)",
    )
    jobs.add_argument("--user", default="")
    jobs.add_argument("--queue", default="")
    limits = jobs.add_mutually_exclusive_group()
    limits.add_argument("--limit", type=positive_int, metavar="N", help="at most N jobs (following pages)")
    limits.add_argument("--all", action="store_true", help="every matching job (following pages)")
    jobs.add_argument("-w", "--watch", action="store_true", help=WATCH_HELP)


def add_job_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``job ID``."""
    add("job", cmd_job, "describe a job: its fields, workers and events").add_argument("job_id", metavar="ID")


def add_cancel_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``cancel ID [--array] [--reason TEXT]``."""
    cancel = add("cancel", cmd_cancel, "cancel a job, or with --array every job of an array")
    cancel.add_argument("job_id", metavar="ID")
    cancel.add_argument("--array", action="store_true",
                        help="ID is a job array's id (as submit --array printed it): cancel its jobs not ended yet")
    cancel.add_argument("--reason", default="", help="recorded in the event log")
