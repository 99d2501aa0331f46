"""``arylctl queues``: list queues with their quota and usage, and (admins) create, set and delete them.

A queue guarantees its jobs ``--quota`` GPUs; beyond it, it borrows idle GPUs of its ``--cohort``
(queues that lend each other unused quota, and loaned inference servers) up to ``--borrow-limit``.
Borrowed GPUs go back when their owner needs them. "default" always exists.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from arylctl.client import ArylClient
from protos.aryl.v1 import scheduler_pb2

HEADERS = ("QUEUE", "COHORT", "QUOTA", "USED", "BORROWED", "LIMIT", "PENDING", "RUNNING", "FAIR")


def queue_row(q: scheduler_pb2.Queue) -> tuple[object, ...]:
    """One row of the listing; an unconfigured "default" shows its quota as what the others leave."""
    quota: object = q.quota_gpus if q.configured else f"{q.quota_gpus} (rest)"
    limit = q.borrow_limit_gpus if q.HasField("borrow_limit_gpus") else "-"
    return (q.name, q.cohort or "-", quota, q.used_gpus, q.borrowed_gpus, limit, q.pending_jobs, q.running_jobs,
            "yes" if q.fair_share else "no")


def add_queue_commands(add: Callable[..., argparse.ArgumentParser], common: argparse.ArgumentParser,
                       format_table: Callable[..., str], ok: int) -> None:
    """Register ``queues [list|create|set|delete]`` with the CLI's ``add`` (its handlers print with
    ``format_table`` and return ``ok``)."""

    def cmd_list(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        queues = client.list_queues()
        out.emit(queues, lambda: format_table(HEADERS, [queue_row(q) for q in queues]))
        return ok

    def cmd_create(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        q = client.create_queue(args.name, args.quota, cohort=args.cohort or "", borrow_limit_gpus=args.borrow_limit,
                                fair_share=not args.no_fair_share)
        out.emit(q, lambda: format_table(HEADERS, [queue_row(q)]))
        return ok

    def cmd_set(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        fair = True if args.fair_share else False if args.no_fair_share else None
        q = client.update_queue(args.name, quota_gpus=args.quota, cohort=args.cohort,
                                borrow_limit_gpus=args.borrow_limit, unlimited_borrowing=args.unlimited_borrowing,
                                fair_share=fair)
        out.emit(q, lambda: format_table(HEADERS, [queue_row(q)]))
        return ok

    def cmd_delete(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        client.delete_queue(args.name)
        out.note(f"queue {args.name} deleted")
        return ok

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
    update.add_argument("--quota", type=int, metavar="GPUS")
    update.add_argument("--cohort", metavar="NAME", help='"" leaves the cohort')
    limit = update.add_mutually_exclusive_group()
    limit.add_argument("--borrow-limit", type=int, metavar="GPUS")
    limit.add_argument("--unlimited-borrowing", action="store_true", help="remove the borrow limit")
    fair = update.add_mutually_exclusive_group()
    fair.add_argument("--fair-share", action="store_true")
    fair.add_argument("--no-fair-share", action="store_true")
    sub("delete", cmd_delete, "delete a queue without active jobs (admin)")
