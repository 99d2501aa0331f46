"""``arylctl what-if``: the next hours of the live cluster, simulated under the configured policy and
under another policy, other parameters or more (or fewer) inference servers, side by side.

The scheduler runs both simulations (its own engine, on its cluster as it is now, no arrivals) and
answers with ``aryl-sim compare``'s table; nothing in the cluster changes. Admins only. Examples:

  arylctl what-if --policy pollux --hours 12
  arylctl what-if --param loan_buffer_servers=0
  arylctl what-if --inference-servers +8
"""

from __future__ import annotations

import argparse
from typing import Any

from arylctl.args import AddCommand
from arylctl.client import ArylClient
from arylctl.output import EXIT_OK
from protos.aryl.v1 import scheduler_pb2


def parse_param(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (the scheduler checks the key and the value)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def parse_servers(text: str) -> int:
    """``+8``, ``8`` (more) or ``-2`` (fewer idle serving servers)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number such as +8 or -2, got {text!r}") from None


def parse_hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected hours, got {text!r}") from None
    if not 0 < hours <= 168:
        raise argparse.ArgumentTypeError(f"expected 0 < hours <= 168, got {text}")
    return hours


def describe(response: scheduler_pb2.WhatIfResponse) -> str:
    """The comparison table, under a line on what each column ran."""
    lines = []
    for run in (response.current, response.alternative):
        settings = ", ".join(run.changed_params) or "the live parameters"
        lines.append(f"{run.label}: {settings}; stopped: {run.stop_reason}")
    head = "\n".join(lines)
    return (f"Next {response.horizon_hours:g} h from now, no new jobs (simulated in {response.wall_seconds:.1f} s; "
            f"nothing in the cluster changed)\n{head}\n\n{response.table.rstrip()}")


def add_what_if_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Register ``what-if`` with the CLI's ``add``."""

    def cmd_what_if(client: ArylClient, args: argparse.Namespace, out: Any) -> int:
        response = client.what_if(policy=args.policy or "", params=dict(args.param),
                                  inference_servers=args.inference_servers, horizon_hours=args.hours)
        out.emit(response, lambda: describe(response))
        return EXIT_OK

    parser = add("what-if", cmd_what_if, "simulate the next hours under another policy or setting (admin; "
                                         "changes nothing)", epilog=__doc__.split("\n\n")[1] if __doc__ else None,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", metavar="NAME", help="a registered policy (default: the configured one)")
    parser.add_argument("--param", type=parse_param, action="append", default=[], metavar="KEY=VALUE",
                        help="a policy parameter to change ([policy] names; repeatable)")
    parser.add_argument("--inference-servers", type=parse_servers, default=0, metavar="+N|-N",
                        help="inference servers added (+N) or idle serving ones removed (-N)")
    parser.add_argument("--hours", type=parse_hours, default=24.0, metavar="H",
                        help="how far ahead, at most 168 (default: 24)")
