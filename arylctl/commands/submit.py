"""``arylctl submit``: queue a job (or a job array) from flags and/or a spec file, retried with its
idempotency key while the scheduler restarts; ``--wait`` then prints its log until it ends. The spec is built
by :mod:`arylctl.spec`; this module sends it and says what happened."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Sequence
from typing import Final

import grpc

from arylctl.args import AddCommand, deadline_time, env_pair, int32, non_negative, positive, uint32
from arylctl.argv_secrets import SECRET_REFERENCE_PREFIX, secret_looking_arguments
from arylctl.arrays import ArraySpecError, element_key, parse_array
from arylctl.client import (
    RESTART_POLICIES,
    SUBMIT_ATTEMPTS,
    SUBMIT_RETRY_S,
    TERMINAL_JOB_STATES,
    ArylClient,
    ArylError,
    NotFound,
    SubmitRetry,
    new_idempotency_key,
)
from arylctl.commands.jobs import is_set, job_display_name, job_summary_table
from arylctl.output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    PROG,
    Output,
    UsageError,
    enum_name,
    format_table,
    printable,
)
from arylctl.spec import job_spec_from_mapping, submit_spec_mapping
from protos.aryl.v1 import types_pb2

# `submit` retrying a submission (the scheduler restarting): a progress line at the first retry and then
# at most this often.
SUBMIT_PROGRESS_EVERY_S: Final = 5.0


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
        if is_set(job.started_at):
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


def add_submit_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``submit [-f FILE] [flags] [-- PROGRAM [ARGS...]]``."""
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
    submit.add_argument("--poll", type=positive, default=1.0, metavar="SECONDS", help=argparse.SUPPRESS)
    submit.add_argument("--name", help="the job's name; required (or 'name' in the -f file)")
    submit.add_argument("--user", help="default: your login name")
    submit.add_argument("--queue", help="default: default")
    submit.add_argument("--gpus-per-worker", type=uint32, metavar="N", help="GPUs each worker gets (default: 1)")
    submit.add_argument("--min-workers", type=uint32, metavar="N",
                        help="workers it needs to run at all, started together (default: 1)")
    submit.add_argument("--max-workers", type=uint32, metavar="N",
                        help="the most workers it may grow to (default: --min-workers, inelastic)")
    submit.add_argument("--priority", type=int32, metavar="N", help="higher runs first among equals (default: 0)")
    submit.add_argument("--priority-class", metavar="NAME",
                        help="its class within the queue (the scheduler's scheduling.priority_classes): higher "
                             "classes go first and may preempt lower ones (default: none, value 0)")
    submit.add_argument("--gpu-type", dest="gpu_types", action="append", metavar="MODEL",
                        help="run only on this GPU type (as `arylctl servers` shows it); repeatable, preferred first "
                             "(default: any type)")
    submit.add_argument("--batch-size", type=uint32, metavar="INIT",
                        help="the job adapts its batch size to its allocation (goodput): INIT is the total batch "
                             "its hyper-parameters were tuned for; its workers get ARYL_LOCAL_BATCH_SIZE and "
                             "ARYL_ACCUM_STEPS (the job contract: docs/jobs.md); default: none, its batch is its own")
    submit.add_argument("--max-batch-size", type=uint32, metavar="N",
                        help="with --batch-size: the largest total batch it accepts (default: INIT, a fixed total)")
    submit.add_argument("--max-local-batch-size", type=uint32, metavar="N",
                        help="with --batch-size: the largest batch one GPU fits in one pass (default: INIT's share "
                             "per GPU at --min-workers)")
    submit.add_argument("--env", type=env_pair, action="append", metavar="NAME=VALUE",
                        help="a variable for the workers; repeatable (default: none; LD_* are refused unless "
                             "the cluster allows them)")
    submit.add_argument("--deadline", type=deadline_time, metavar="TIME",
                        help="when the job should be finished: an ISO 8601 time (2026-11-24T18:00Z; local time "
                             "unless an offset is given) or a time from now (6h, 90m, 1h30m, 2d); the answer says "
                             "whether it looks feasible (default: none)")
    submit.add_argument("--max-runtime", type=non_negative, metavar="SECONDS",
                        help="a run-time limit recorded with the job; the scheduler does not enforce it yet "
                             "(default: none)")
    submit.add_argument("--restart-policy", choices=sorted(RESTART_POLICIES),
                        help="restart a failed job? on_failure restarts it up to --max-restarts times (default: "
                             "on_failure, with --max-restarts 0: never restarted)")
    submit.add_argument("--max-restarts", type=uint32, metavar="N",
                        help="restarts after failures with --restart-policy on_failure (default: 0, none)")
    submit.add_argument(
        "--array", metavar="INDICES",
        help="queue a job array: one job per index, all or none, e.g. 0-999, 0-999:2 (step) or 1,3,5 (at most "
             "10,000 jobs; Slurm's %%N is not supported). Each job's workers get ARYL_ARRAY_INDEX and "
             "ARYL_ARRAY_JOB_ID; arylctl jobs shows NAME[INDEX] (default: one job)",
    )
    submit.add_argument("--estimated-runtime", type=non_negative, metavar="SECONDS",
                        help="how long it runs at --min-workers: what its predicted finish and ETAs rest on until "
                             "it reports progress (default: none; then no predicted finish, never a guess)")
    submit.add_argument(
        "--idempotency-key", default="", metavar="KEY",
        help="default: a random one, printed on stderr if the submit fails. Per user: submitting again with "
             "it returns the job it queued (same spec) or is refused naming that job (other spec), so a "
             "script may always run a failed submit again with the same key",
    )
    submit.add_argument(
        "--retry-for", type=non_negative, default=SUBMIT_RETRY_S, metavar="SECONDS",
        help=f"how long an unanswered submit is retried with its key once the scheduler was reached (a "
             f"restart, a standby taking over), with a progress line on stderr (default: {SUBMIT_RETRY_S:g}); "
             f"a scheduler never reached is tried {SUBMIT_ATTEMPTS} times",
    )
