"""``arylctl queues``: list queues with their quota and usage, and (admins) create, set and delete them.

A queue guarantees its jobs ``--quota`` GPUs; beyond it, it borrows idle GPUs of its ``--cohort``
(queues that lend each other unused quota, and loaned inference servers) up to ``--borrow-limit``.
Borrowed GPUs go back when their owner needs them. "default" always exists: its quota is "the rest",
what the other queues' quotas leave of the training GPUs, until an admin sets a number
(``queues set default --quota N``); ``--quota rest`` or ``queues delete default`` gives it the rest again.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from arylctl.args import AddCommand
from arylctl.client import ArylClient
from arylctl.output import EXIT_OK, PROG, format_table
from protos.aryl.v1 import scheduler_pb2

HEADERS = ("QUEUE", "COHORT", "QUOTA", "USED", "BORROWED", "LIMIT", "PENDING", "RUNNING", "FAIR")


def queue_row(q: scheduler_pb2.Queue) -> tuple[object, ...]:
    """One row of the listing; a "default" whose quota is what the others leave shows it as ``N (rest)``."""
    quota: object = f"{q.quota_gpus} (rest)" if q.quota_is_rest or not q.configured else q.quota_gpus
    limit = q.borrow_limit_gpus if q.HasField("borrow_limit_gpus") else "-"
    return (q.name, q.cohort or "-", quota, q.used_gpus, q.borrowed_gpus, limit, q.pending_jobs, q.running_jobs,
            "yes" if q.fair_share else "no")


def _quota(text: str) -> int | str:
    """``--quota``: a number of GPUs, or ``rest`` (what the other queues leave; "default" only)."""
    if text == "rest":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GPUs (or 'rest', for \"default\")") from None


def default_starved_warning(queues: list[scheduler_pb2.Queue], changed: str) -> str | None:
    """The warning when the quotas leave "default" no GPUs after ``changed`` was created or set: jobs
    submitted without ``--queue`` then wait (WAITING_FOR_QUOTA) on free GPUs."""
    default = next((q for q in queues if q.name == "default"), None)
    if default is None or default.quota_gpus > 0 or changed == "default" or not (default.quota_is_rest
                                                                                   or not default.configured):
        return None
    return (f"warning: this leaves queue `default` no GPUs (its quota is the rest, what the other queues' quotas "
            f"leave of the training GPUs: 0 now): jobs submitted without --queue will wait (WAITING_FOR_QUOTA) on "
            f"idle GPUs, or borrow only what its cohort lends. Give default some with smaller quotas ({PROG} queues "
            f"set {changed} --quota N, or {PROG} queues set default --quota N), or undo with {PROG} queues delete "
            f"{changed}")


def add_queue_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Register ``queues [list|create|set|delete]`` with the CLI's ``add``."""

    def cmd_list(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        queues = client.list_queues()
        out.emit(queues, lambda: format_table(HEADERS, [queue_row(q) for q in queues]))
        return EXIT_OK

    def warn_if_default_starved(client: ArylClient, changed: str, out: Any) -> None:
        warning = default_starved_warning(client.list_queues(), changed)
        if warning:
            out.note(warning)

    def cmd_create(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        q = client.create_queue(args.name, args.quota, cohort=args.cohort or "", borrow_limit_gpus=args.borrow_limit,
                                fair_share=not args.no_fair_share)
        out.emit(q, lambda: format_table(HEADERS, [queue_row(q)]))
        warn_if_default_starved(client, args.name, out)
        return EXIT_OK

    def cmd_set(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        fair = True if args.fair_share else False if args.no_fair_share else None
        rest = args.quota == "rest"
        q = client.update_queue(args.name, quota_gpus=None if rest else args.quota, cohort=args.cohort,
                                borrow_limit_gpus=args.borrow_limit, unlimited_borrowing=args.unlimited_borrowing,
                                fair_share=fair, quota_rest=rest)
        out.emit(q, lambda: format_table(HEADERS, [queue_row(q)]))
        if args.quota is not None:
            warn_if_default_starved(client, args.name, out)
        return EXIT_OK

    def cmd_delete(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        client.delete_queue(args.name)
        default = next((q for q in client.list_queues() if q.name == "default"), None)
        if args.name == "default":
            rest = f" ({default.quota_gpus} GPUs now)" if default is not None else ""
            out.note(f"queue default reset: unconfigured, its quota is the rest again{rest}")
        else:
            out.note(f"queue {args.name} deleted")
            if default is not None and default.configured and not default.quota_is_rest:
                out.note(f"note: queue default keeps its fixed quota of {default.quota_gpus} GPUs; {PROG} queues set "
                         "default --quota rest gives it what the other queues leave")
        return EXIT_OK

    queues = add("queues", cmd_list, "list queues with their GPU quota, usage and borrowing; admins: create, set, "
                                      "delete", epilog=__doc__.split("\n\n")[1] if __doc__ else None)
    commands = queues.add_subparsers(dest="queues_command", metavar="list|create|set|delete")

    def sub(name: str, handler: Callable[..., int], help_text: str) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, help=help_text, description=help_text, parents=[common],
                                     allow_abbrev=False)
        parser.set_defaults(handler=handler)
        if name != "list":
            parser.add_argument("name", metavar="NAME", help="the queue's name (lowercase letters, digits, '-')")
        return parser

    sub("list", cmd_list, "list queues")
    create = sub("create", cmd_create, "create a queue (admin)")
    create.add_argument("--quota", type=int, required=True, metavar="GPUS", help="GPUs guaranteed to the queue")
    create.add_argument("--cohort", metavar="NAME", help="queues of one cohort lend each other idle quota")
    create.add_argument("--borrow-limit", type=int, metavar="GPUS", help="most GPUs beyond the quota (default: "
                                                                         "no limit)")
    create.add_argument("--no-fair-share", action="store_true", help="no fair share between the queue's users")
    update = sub("set", cmd_set, "change a queue's settings (admin); \"default\" too")
    update.add_argument("--quota", type=_quota, metavar="GPUS",
                        help="GPUs guaranteed to the queue; \"default\" also takes 'rest' (what the other queues "
                             "leave, its quota until set)")
    update.add_argument("--cohort", metavar="NAME", help='"" leaves the cohort')
    limit = update.add_mutually_exclusive_group()
    limit.add_argument("--borrow-limit", type=int, metavar="GPUS")
    limit.add_argument("--unlimited-borrowing", action="store_true", help="remove the borrow limit")
    fair = update.add_mutually_exclusive_group()
    fair.add_argument("--fair-share", action="store_true")
    fair.add_argument("--no-fair-share", action="store_true")
    sub("delete", cmd_delete, "delete a queue without active jobs (admin); \"default\" is reset instead: "
                              "unconfigured, its quota the rest again (its jobs stay)")
