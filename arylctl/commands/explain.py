"""``arylctl explain ID``: why a job is pending, was preempted, or keeps its size (the scheduler's
decisions about it, with their reason codes)."""

from __future__ import annotations

import argparse

from arylctl.args import AddCommand
from arylctl.client import ArylClient
from arylctl.output import EXIT_OK, Output, enum_name, format_table, local_time, printable
from protos.aryl.v1 import scheduler_pb2, types_pb2


def describe_explanation(response: scheduler_pb2.ExplainJobResponse) -> str:
    job = response.job
    summary = response.summary or enum_name(types_pb2.JobState, job.state)
    head = printable(f"Job {job.job_id} ({job.spec.name}): {summary}")
    if response.queue_status:  # its queue's quota and usage
        head += "\n" + printable(response.queue_status[0].upper() + response.queue_status[1:])
    if response.eta:  # when it is expected to start, after which jobs (the scheduler's forecast)
        head += "\n" + printable(response.eta[0].upper() + response.eta[1:])
    if response.deadline:  # where it stands against its deadline, and why
        head += "\n" + printable(f"Deadline {local_time(job.spec.deadline)}: {response.deadline}")
    if response.protection or response.disruptions_last_hour:  # its anti-thrashing window (core.protection)
        head += "\n" + printable(f"Protection: {response.protection or 'none'} ({response.disruptions_last_hour} "
                                  "resize(s)/preemption(s) in the last hour)")
    if not response.decisions:
        return head + "\n\nNo decisions recorded."
    rows = [(local_time(e.time), e.reason, e.message) for e in response.decisions]
    return head + "\n\n" + format_table(("TIME", "REASON", "MESSAGE"), rows)


def cmd_explain(client: ArylClient, args: argparse.Namespace, out: Output) -> int:
    response = client.explain_job(args.job_id)
    out.emit(response, lambda: describe_explanation(response))
    return EXIT_OK


def add_explain_command(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """``explain ID``."""
    add("explain", cmd_explain, "why a job is pending, was preempted, or keeps its size").add_argument(
        "job_id", metavar="ID")
