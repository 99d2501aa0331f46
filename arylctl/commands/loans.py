"""``arylctl loans`` (inference servers loaned to training) and ``arylctl reclaim-preview N`` (a dry run of
reclaiming N of them)."""

from __future__ import annotations

import argparse

from arylctl.args import AddCommand, uint32
from arylctl.client import ArylClient
from arylctl.output import EXIT_OK, Output, enum_name, format_fields, format_table, local_time, printable
from protos.aryl.v1 import scheduler_pb2, types_pb2


def describe_demand_forecast(forecast: scheduler_pb2.DemandForecast) -> str:
    """The inference demand forecast the policy reclaims ahead of, e.g. "Demand forecast (at 12:00:03):
    inference needs 2 serving server(s) now; within the next 130 s 2.4 expected, up to 3.0 (upper band at
    99.9%); lead 130 s: reclaim latency not measured yet (policy.reclaim_deadline_s) + decision lag 10 s"."""
    measured = forecast.HasField("reclaim_latency_s")
    latency = (f"reclaim latency {forecast.reclaim_latency_s:.0f} s (measured)" if measured
               else "reclaim latency not measured yet (policy.reclaim_deadline_s)")
    return printable(
        f"Demand forecast (at {local_time(forecast.made_at)}): inference needs {forecast.servers_needed_now:g} "
        f"serving server(s) now; within the next {forecast.lead_s:.0f} s {forecast.point:.1f} expected, up to "
        f"{forecast.upper:.1f} (upper band at {forecast.quantile:.1%}); lead {forecast.lead_s:.0f} s: {latency} + "
        f"decision lag {forecast.decision_lag_s:.0f} s")


def cmd_loans(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.list_loans_response(include_returned=args.all)
    loans = list(response.loans)
    # The scheduler's standing reason for loaning no (further) server: a non-event, said once per decision.
    why = (printable(f"Not loaning (since {local_time(response.not_loaned_since)}): {response.not_loaned}")
           if response.not_loaned else "")
    if response.HasField("demand_forecast"):
        why = "\n".join(line for line in (why, describe_demand_forecast(response.demand_forecast)) if line)

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

    # -o json|yaml: the whole answer (loans, not_loaned, demand_forecast); a table shows the same.
    out.emit(response, table)
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


def add_loans_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``loans [--all]``."""
    add("loans", cmd_loans, "list loans of inference servers to training").add_argument(
        "--all", action="store_true", help="include returned loans"
    )


def add_reclaim_preview_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``reclaim-preview N``."""
    add("reclaim-preview", cmd_reclaim_preview,
        "dry run: what reclaiming N loaned servers would do now").add_argument("servers", type=uint32, metavar="N")
