"""``arylctl cluster`` (capacity per pool, jobs per state, inference demand, the policy, the scheduler replicas on
PostgreSQL) and ``arylctl demand set|get`` (the inference demand an operator or the router reports)."""

from __future__ import annotations

import argparse

from arylctl.args import AddCommand, non_negative, uint32
from arylctl.client import ArylClient
from arylctl.output import EXIT_OK, Output, enum_name, format_fields, format_table, local_time
from protos.aryl.v1 import scheduler_pb2, types_pb2


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
    return "\n\n".join([summary, pools, jobs, *([_replicas_table(cluster)] if cluster.replicas else [])])


def _replicas_table(cluster: scheduler_pb2.GetClusterResponse) -> str:
    """The schedulers sharing the database (docs/ha.md): which leads, where each serves desired-state streams."""
    def role(r: scheduler_pb2.SchedulerReplica) -> str:
        return "leader" if r.leader else "standby" if r.live else "stale"

    return format_table(
        ("SCHEDULER", "ROLE", "DESIRED-STATE STREAMS", "HEARTBEAT", "UP"),
        [(r.address, role(r), r.push_address or "-", f"{r.heartbeat_age_seconds:.1f}s ago", f"{r.up_seconds:.0f}s")
         for r in cluster.replicas],
    )


def cmd_cluster(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    cluster = client.get_cluster()
    out.emit(cluster, lambda: describe_cluster(cluster))
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


def add_cluster_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``cluster``."""
    add("cluster", cmd_cluster, "capacity per pool, jobs per state, inference demand, policy, scheduler replicas")


def add_demand_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``demand set N [--rps X] [--source WHO]`` and ``demand get``."""
    demand = add("demand", None, "report or show inference demand")
    demand_commands = demand.add_subparsers(dest="demand_command", metavar="set|get", required=True)
    demand_set = demand_commands.add_parser(
        "set", parents=[common], help="report how many inference servers must be serving", allow_abbrev=False
    )
    demand_set.set_defaults(handler=cmd_demand_set)
    demand_set.add_argument("servers_needed", type=uint32, metavar="N")
    demand_set.add_argument("--rps", type=non_negative, default=0.0, metavar="X", help="observed requests per second")
    demand_set.add_argument("--source", default="arylctl", help="who reports (default: arylctl)")
    demand_get = demand_commands.add_parser(
        "get", parents=[common], help="show the last reported demand", allow_abbrev=False
    )
    demand_get.set_defaults(handler=cmd_demand_get)
