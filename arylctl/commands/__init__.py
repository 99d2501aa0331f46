"""``arylctl``'s commands, one module per group, each registering its own parser and its handlers.

A handler takes ``(client, parsed args, output)`` and returns an exit code (``arylctl.output``); it makes one
or a few calls through :class:`arylctl.client.ArylClient` and prints the result, never deciding anything.
A registration, ``add_X_command(add, common)``, builds the command's parser with ``add`` (which gives it the
global options, ``common``) and names its handler. To add a command: write both in its group's module, and
name the registration in ``REGISTRATIONS`` below, whose order is the order of ``arylctl --help``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Final

from arylctl import certs
from arylctl.args import AddCommand
from arylctl.commands import cluster, events, explain, jobs, loans, local, logs, queues, servers, submit, what_if

REGISTRATIONS: Final[tuple[Callable[[AddCommand, argparse.ArgumentParser], None], ...]] = (
    submit.add_submit_command,
    jobs.add_jobs_command,
    jobs.add_job_command,
    jobs.add_cancel_command,
    cluster.add_cluster_command,
    queues.add_queue_commands,
    what_if.add_what_if_command,
    servers.add_servers_command,
    loans.add_loans_command,
    events.add_events_command,
    explain.add_explain_command,
    logs.add_logs_command,
    loans.add_reclaim_preview_command,
    cluster.add_demand_command,
    local.add_login_command,
    certs.add_certs_commands,
    local.add_completion_command,
)


def add_commands(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """Every command, in the order ``arylctl --help`` lists them."""
    for register in REGISTRATIONS:
        register(add, common)
