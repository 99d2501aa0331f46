"""``arylctl logs``: a worker's output (stdout and stderr), read from the agent of the server that ran it;
``--tail`` and ``--follow``. Raw text: ``-o`` does not apply."""

from __future__ import annotations

import argparse

from arylctl.args import AddCommand, count, positive, uint32
from arylctl.client import ArylClient
from arylctl.output import EXIT_OK, Output

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


def add_logs_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``logs ID [--rank N] [--tail LINES] [-f]``."""
    logs = add("logs", cmd_logs, "show a worker's output (stdout and stderr), read from its server's agent",
               epilog="Logs stay on the server that ran the worker; each incarnation (start, resize, "
                      "restart) of the job appends to the same per-rank log under a header line.")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("--rank", type=uint32, default=0, metavar="N", help="which worker (default 0)")
    logs.add_argument("--tail", type=count, metavar="LINES", help="only the last LINES lines")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="keep printing new output until the job has finished (or Ctrl-C); a pending or "
                           "preempted job is followed on, since it may run again")
    logs.add_argument("--poll", type=positive, default=1.0, metavar="SECONDS", help=argparse.SUPPRESS)
