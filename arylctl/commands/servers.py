"""``arylctl servers``: list servers (``-w`` to watch), and take one out of service or back: ``cordon``,
``uncordon``, ``drain`` and ``delete``."""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable
from typing import Any, Final

from arylctl.args import WATCH_HELP, AddCommand, global_options_parser, non_negative, pool
from arylctl.client import ArylClient
from arylctl.commands.events import watch
from arylctl.output import EXIT_OK, PROG, Output, age, enum_name, format_table
from protos.aryl.v1 import scheduler_pb2, types_pb2

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
        return watch(client, out, render)
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


def add_servers_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``servers [--pool P] [-w]`` and ``servers cordon|uncordon|drain|delete NAME``."""
    servers = add(
        "servers", cmd_servers, "list servers, or take one out: cordon, uncordon, drain, delete",
        epilog="STATE: the server's state, then what an operator or its agent asked: CORDONED (no new "
               "workers or loans), DRAINING (work moves off), DRAINED (nothing left there), LEFT (its agent "
               "deregistered), DELETING (deleted by force: removed once its jobs are off). LOST servers stay "
               f"listed until deleted ({PROG} servers delete NAME).",
    )
    servers.add_argument("--pool", type=pool, default=types_pb2.POOL_UNSPECIFIED, metavar="training|inference")
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
        parents=[global_options_parser()], conflict_handler="resolve",
    )
    drain.add_argument("--reason", default="", help="shown in the listing and the event log")
    drain_when = drain.add_mutually_exclusive_group()
    drain_when.add_argument("--timeout", dest="drain_timeout", type=non_negative, default=0.0, metavar="SECONDS",
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
