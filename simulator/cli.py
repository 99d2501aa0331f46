"""``aryl-sim``: replay a job trace and an inference-load series through the scheduler's own cycle.

Subcommands:
- ``run``: one policy;
- ``compare``: several policies on the same inputs, side by side, with ratios to the first;
- ``train-dl2``: train the ``dl2`` policy's network (``simulator.dl2_train``).

Both print a table to stdout (progress and timings go to stderr) and, with ``--out DIR``, write
``jobs-<policy>.csv``, ``utilization-<policy>.csv``, ``summary.json`` and the plots (``jct_cdf.png``,
``utilization.png``, ``loans.png``); see ``simulator.results`` for the metrics.

This module only translates arguments into calls of the loaders, ``simulate`` and the result
writers; it never decides anything about scheduling.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aryl_common.entry import BadInput, add_standard_flags, run_guarded
from scheduler_service.core.params import ParamError, PolicyParams, params_from_text
from scheduler_service.core.registry import policies
from simulator.deadlines import DEADLINE_SETTINGS, assign_deadlines
from simulator.dl2_train import add_train_dl2_parser, train_dl2_command
from simulator.engine import SimulationResult, simulate
from simulator.estimates import EXACT, Estimates, EstimatesError
from simulator.failures import FailureTraceError, load_failure_trace
from simulator.generic_trace import load_generic_csv
from simulator.goodput_profiles import ProfileError
from simulator.goodput_sim import (
    GOODPUT_POLICIES,
    WorkloadError,
    format_summaries,
    load_workload,
    parameterised,
    run_workload,
)
from simulator.goodput_sim import summary as goodput_summary
from simulator.load import demand_from_rate, diurnal_demand, load_request_times_rate, load_servegen_rate
from simulator.model import ClusterSpec, DemandPoint, FailureRate, ServerFailure, TraceJob
from simulator.results import format_table, summarize, write_outputs
from simulator.trace_csv import TraceFormatError
from simulator.traces import JobMapping, load_philly, load_pollux_workload

PROG = "aryl-sim"
DEFAULT_COMPARE = "fifo,aryl-noloan,aryl-noelastic,aryl"
LOAD_MARGIN_DAYS = 30  # the inference load covers the trace's span plus this (then holds its last value)


class UsageError(Exception):
    """A bad argument value; the message says which and what is allowed."""


def _params_help() -> str:
    defaults = PolicyParams()
    lines = ["policy parameters (--param KEY=VALUE; defaults):"]
    for f in dataclasses.fields(PolicyParams):
        lines.append(f"  {f.name} = {getattr(defaults, f.name)}")
    return "\n".join(lines)


def parse_params(items: Sequence[str]) -> PolicyParams:
    """``KEY=VALUE`` strings into a validated PolicyParams (``core.params.params_from_text``)."""
    changes: dict[str, str] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--param {item!r}: expected KEY=VALUE")
        changes[key] = text
    try:
        return params_from_text(PolicyParams(), changes)
    except ParamError as exc:
        raise UsageError(f"--param {exc.key.strip()}: {exc.problem}") from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def _estimates(text: str) -> Estimates:
    try:
        return Estimates.parse(text)
    except EstimatesError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_common(parser: argparse.ArgumentParser) -> None:
    trace = parser.add_argument_group("job trace")
    trace.add_argument("--trace-format", choices=("philly", "pollux", "generic"), required=True,
                       help="philly: the Pollux-preprocessed Philly CSV; pollux: a Pollux workload CSV "
                            "(needs --profiles-dir); generic: the job CSV of docs/simulator.md")
    trace.add_argument("--trace", type=Path, required=True, help="the trace file (plain or .gz)")
    trace.add_argument("--job-model", choices=("throughput", "goodput", "hetero"), default="throughput",
                       help="throughput: jobs as the scheduler sees them (the default); goodput: a Pollux workload "
                            "under the Pollux goodput model (simulator.goodput_sim: --profiles-dir is "
                            "pollux-data/traces, the cluster --training-servers x --gpus-per-server, a decision every "
                            "--cycle-interval s, --restart-overhead per reallocation; policies tiresias, optimus); "
                            "hetero: a Sia workload on GPUs of several types (simulator.hetero: --profiles-dir holds "
                            "placements-<type>.csv per model, the cluster --gpu-pools, the study's rounds)")
    trace.add_argument("--gpu-pools", default="aws:6x4,dgx-ext:2x8,rtx:3x8",
                       help="--job-model hetero: TYPE:NODESxGPUS,... (default: the Sia study's cluster, %(default)s)")
    trace.add_argument("--limit", type=_positive_int, default=None,
                       help="keep only the first N jobs of the trace (default: all)")
    trace.add_argument("--seed", type=int, default=0,
                       help="seed of the job mapping's keyed draws, the diurnal noise and every snapshot "
                            "(default: 0)")
    trace.add_argument("--elastic-share", type=float, default=0.5,
                       help="fraction of jobs made elastic (default: 0.5)")
    trace.add_argument("--max-scale", type=int, default=4,
                       help="elastic jobs: max_workers = min_workers x this, then capped (default: 4)")
    trace.add_argument("--throughput-model", default="amdahl",
                       help="amdahl | pollux-gputime | pollux-random | a Pollux profile name (default: amdahl; "
                            "Pollux profiles need --profiles-dir)")
    trace.add_argument("--profiles-dir", type=Path, default=None,
                       help="the Pollux throughput profiles directory (default: none)")
    trace.add_argument("--deadlines", choices=("trace", "none", *DEADLINE_SETTINGS), default="trace",
                       help="jobs' deadlines: trace (the trace's own, the generic deadline_s column; the default), "
                            "none (no job has one), or assigned by the seeded rule of simulator/deadlines.py, "
                            "submit + U(a, b) x the run time at the requested size: tight U(1, 2), loose U(2, 4)")
    trace.add_argument("--philly-time-origin", choices=("first_job", "midnight"), default="first_job",
                       help="philly: t = 0 at the first job, or at midnight of its day (default: first_job)")

    load = parser.add_argument_group("inference load (one of; default: --diurnal)")
    source = load.add_mutually_exclusive_group()
    source.add_argument("--servegen", type=Path, default=None,
                        help="ServeGen's servegen_total_rate_10min.csv: request rate -> servers needed")
    source.add_argument("--request-trace", type=Path, default=None,
                        help="a per-request CSV (the Alibaba GenAI trace's lora_request_trace.csv.gz: one row per "
                             "request, its time in gmt_create), counted in 10-minute bins -> servers needed")
    source.add_argument("--diurnal", action="store_true",
                        help="a synthetic daily curve (20%%..100%% of the inference servers, peak at 20h, "
                             "5%% noise; the default)")
    source.add_argument("--no-inference-load", action="store_true",
                        help="inference needs no servers at all: every inference server beyond the loan "
                             "buffer may be loaned")
    load.add_argument("--servegen-model", default="m-small", help="ServeGen model (default: m-small)")
    load.add_argument("--servegen-category", default="language", help="ServeGen category (default: language)")
    load.add_argument("--request-trace-start-day", type=int, default=0,
                      help="--request-trace: drop the days before this one (the Alibaba trace's first 4 are "
                           "light; default: 0)")
    load.add_argument("--peak-quantile", type=float, default=1.0,
                      help="ServeGen, --request-trace: the rate quantile that needs the whole inference cluster "
                           "(default: 1.0; below it, the need beyond the cluster counts as shortfall)")
    load.add_argument("--headroom", type=float, default=0.2,
                      help="ServeGen, --request-trace: servers needed = ceil(rate x (1 + headroom) / per-server "
                           "rate) (default: 0.2)")

    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--training-servers", type=_positive_int, default=100,
                         help="training-owned servers (default: 100)")
    cluster.add_argument("--inference-servers", type=_positive_int, default=25,
                         help="inference servers (default: 25)")
    cluster.add_argument("--gpus-per-server", type=int, default=8, help="GPUs per server (default: 8)")

    sim = parser.add_argument_group("simulation")
    sim.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="a policy parameter (repeatable; see the list below)")
    sim.add_argument("--cycle-interval", type=float, default=300.0,
                     help="periodic cycle tick, virtual seconds; events also trigger cycles (default: 300)")
    sim.add_argument("--min-cycle-gap", type=float, default=0.0,
                     help="least virtual time between two cycles; events in between are batched into the "
                          "next cycle (default: 0 = a cycle at every event instant)")
    sim.add_argument("--restart-overhead", type=float, default=30.0,
                     help="seconds without progress after every start, restart and resize (default: 30)")
    sim.add_argument("--checkpoint-interval", type=float, default=1800.0,
                     help="seconds between a running job's checkpoints; a preemption loses the work since "
                          "the last one (default: 1800)")
    sim.add_argument("--drain-ack", type=float, default=1.0,
                     help="seconds after a loan begins at which the router acknowledges the drain (its "
                          "in-flight requests done), so the loan is active at once; negative: no router, "
                          "loans wait the policy's drain_timeout_s (default: 1)")
    sim.add_argument("--max-time", type=float, default=None,
                     help="stop at this virtual time, seconds (default: none; runs end when every job "
                          "completed, or when the remaining jobs can never be placed)")
    sim.add_argument("--estimates", type=_estimates, default=EXACT, metavar="exact|lognormal:SIGMA|none",
                     help="what policies see of a job's length: exact (its true work; the default), "
                          "lognormal:SIGMA (a user's run-time estimate, the truth x exp(SIGMA x z), z drawn per "
                          "job from --seed), none (no estimate: the policy's default_runtime_s); "
                          "simulator/estimates.py. The true work drives completion")
    sim.add_argument("--check", action="store_true",
                     help="assert that every plan passes the core's invariant checker (slower)")
    sim.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                     help="a progress bar on stderr, shown only on a terminal (default: on)")

    faults = parser.add_argument_group("server failures (default: none)")
    failure_source = faults.add_mutually_exclusive_group()
    failure_source.add_argument("--server-mtbf-h", type=float, default=None,
                                help="random failures: each server fails after an exponential time with this "
                                     "mean, in hours, from the start and again from each repair; drawn from "
                                     "--seed, the same for every policy")
    failure_source.add_argument("--failure-trace", type=Path, default=None,
                                help="failures from a CSV with the header time_s,server_id,down_s (server ids "
                                     "t0000.. training, i0000.. inference)")
    faults.add_argument("--server-repair-s", type=float, default=600.0,
                        help="with --server-mtbf-h: seconds a failed server stays down (default: 600)")

    out = parser.add_argument_group("output")
    out.add_argument("--out", type=Path, default=None,
                     help="write CSVs, summary.json and plots into this directory (default: print only)")
    out.add_argument("--no-plots", action="store_true", help="with --out: skip the PNG plots")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Trace-driven simulation of the Aryl scheduler: the service's own scheduling cycle and "
                    "policies, a virtual clock and simulated agents.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_standard_flags(parser)
    sub = parser.add_subparsers(dest="command", required=True)
    epilog = _params_help() + f"\n\npolicies: {', '.join(policies.names())}"
    run = sub.add_parser("run", help="simulate one policy", epilog=epilog,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--policy", default="aryl",
                     help=f"the policy (default: aryl; one of {', '.join(policies.names())})")
    _add_common(run)
    compare = sub.add_parser("compare", help="simulate several policies on the same inputs", epilog=epilog,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    compare.add_argument("--policies", default=DEFAULT_COMPARE,
                         help=f"comma-separated policies; ratios are to the first (default: {DEFAULT_COMPARE})")
    _add_common(compare)
    add_train_dl2_parser(sub)
    return parser


def load_jobs(args: argparse.Namespace) -> list[TraceJob]:
    """The trace's jobs, with the deadlines ``--deadlines`` asks for."""
    jobs = _trace_jobs(args)
    setting = getattr(args, "deadlines", "trace")
    if setting == "none":
        return [dataclasses.replace(job, deadline=None) for job in jobs]
    if setting in DEADLINE_SETTINGS:
        return assign_deadlines(jobs, setting, args.seed)
    return jobs


def _trace_jobs(args: argparse.Namespace) -> list[TraceJob]:
    mapping = JobMapping(seed=args.seed, elastic_share=args.elastic_share, max_scale=args.max_scale,
                         throughput_model=args.throughput_model, gpus_per_server=args.gpus_per_server)
    if args.trace_format == "philly":
        return load_philly(args.trace, mapping=mapping, profiles_dir=args.profiles_dir, limit=args.limit,
                           time_origin=args.philly_time_origin)
    if args.trace_format == "pollux":
        if args.profiles_dir is None:
            raise UsageError("--trace-format pollux needs --profiles-dir")
        return load_pollux_workload(args.trace, profiles_dir=args.profiles_dir, mapping=mapping, limit=args.limit)
    return load_generic_csv(args.trace, mapping=mapping, profiles_dir=args.profiles_dir, limit=args.limit)


def load_demand(args: argparse.Namespace, jobs: Sequence[TraceJob]) -> list[DemandPoint]:
    """The inference demand over the trace's span plus LOAD_MARGIN_DAYS (then held at its last value)."""
    if args.no_inference_load:
        return [DemandPoint(0.0, 0, 0.0)]
    if args.inference_servers == 0:
        return []
    span_s = (max((j.submit_time for j in jobs), default=0.0)) + LOAD_MARGIN_DAYS * 86400.0
    series = (load_servegen_rate(args.servegen, category=args.servegen_category, model=args.servegen_model)
              if args.servegen is not None else
              load_request_times_rate(args.request_trace, start_day=args.request_trace_start_day)
              if args.request_trace is not None else None)
    if series is not None:
        return demand_from_rate(series, inference_servers=args.inference_servers, headroom=args.headroom,
                                peak_quantile=args.peak_quantile, duration_s=span_s)
    return diurnal_demand(inference_servers=args.inference_servers, days=math.ceil(span_s / 86400.0), seed=args.seed)


def load_failures(args: argparse.Namespace) -> FailureRate | list[ServerFailure] | None:
    """The server failures to inject: a rate, a trace, or none."""
    if args.failure_trace is not None:
        return load_failure_trace(args.failure_trace)
    if args.server_mtbf_h is None:
        return None
    if not (math.isfinite(args.server_mtbf_h) and args.server_mtbf_h > 0):
        raise UsageError(f"--server-mtbf-h must be > 0 (got {args.server_mtbf_h})")
    if not (math.isfinite(args.server_repair_s) and args.server_repair_s > 0):
        raise UsageError(f"--server-repair-s must be > 0 (got {args.server_repair_s})")
    return FailureRate(mtbf_s=args.server_mtbf_h * 3600.0, repair_s=args.server_repair_s)


def _policy_names(args: argparse.Namespace) -> list[str]:
    names = [args.policy] if args.command == "run" else [n.strip() for n in args.policies.split(",") if n.strip()]
    known = set(policies.names())
    for name in names:
        if name not in known:
            raise UsageError(f"unknown policy {name!r}; registered: {', '.join(policies.names())}")
    if len(set(names)) != len(names):
        raise UsageError(f"a policy is listed twice in {names}")
    if not names:
        raise UsageError("no policy given")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status (``aryl_common.entry``): 0 done, 2 bad input (flags, a trace or failure file, a
    policy parameter), 1 an unexpected error; one line on stderr (``--debug`` adds the traceback)."""
    args = build_parser().parse_args(argv)
    if args.command == "train-dl2":
        return run_guarded(PROG, lambda: train_dl2_command(args), debug=args.debug)
    return run_guarded(PROG, lambda: run(args), debug=args.debug)


def run(args: argparse.Namespace) -> int:
    if args.job_model == "goodput":
        return _run_goodput(args)
    if args.job_model == "hetero":
        return _run_hetero(args)
    try:
        names = _policy_names(args)
        params = parse_params(args.param)
        if args.gpus_per_server < 1:
            raise UsageError("--gpus-per-server must be >= 1")
        if args.training_servers + args.inference_servers == 0:
            raise UsageError("the cluster has no servers")
        started = time.perf_counter()
        jobs = load_jobs(args)
        demand = load_demand(args, jobs)
        failures = load_failures(args)
        print(f"loaded {len(jobs)} job(s) and {len(demand)} demand point(s) in "
              f"{time.perf_counter() - started:.1f}s", file=sys.stderr)
        spec = ClusterSpec(args.training_servers, args.inference_servers, args.gpus_per_server)
        results: list[SimulationResult] = []
        for name in names:
            result = simulate(
                jobs, demand, spec, name, params, seed=args.seed, cycle_interval_s=args.cycle_interval,
                restart_overhead_s=args.restart_overhead, checkpoint_interval_s=args.checkpoint_interval,
                min_cycle_gap_s=args.min_cycle_gap, max_time_s=args.max_time,
                drain_ack_s=args.drain_ack if args.drain_ack >= 0 else None, failures=failures,
                check_plans=args.check,
                progress=args.progress, estimates=args.estimates,
            )
            print(f"{name}: {result.cycles} cycles, {result.stop_reason}, {result.wall_s:.1f}s", file=sys.stderr)
            results.append(result)
    except (UsageError, TraceFormatError, FailureTraceError, ValueError, OSError) as exc:
        raise BadInput(f"error: {exc}") from exc
    if args.out is not None:
        summaries = write_outputs(results, args.out, plots=not args.no_plots)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        summaries = {r.policy: summarize(r) for r in results}
    sys.stdout.write(format_table(summaries))
    return 0


def _run_hetero(args: argparse.Namespace) -> int:
    """``--job-model hetero``: a Sia workload through ``simulator.hetero`` (each policy at its study's rounds)."""
    from simulator.hetero import parse_pools, run_hetero
    from simulator.hetero import summary as hetero_summary

    try:
        names = _policy_names(args)
        if args.trace_format != "pollux" or args.profiles_dir is None:
            raise UsageError("--job-model hetero needs --trace-format pollux (a Sia workload CSV) and --profiles-dir")
        params = parse_params(args.param)
        pools = parse_pools(args.gpu_pools)
        workload = load_workload(args.trace)[: args.limit]
        summaries = []
        for name in names:
            result = run_hetero(workload, args.profiles_dir, name, pools=pools, params=params, check_plans=args.check)
            print(f"{name}: {len(result.jcts)} jobs, {result.cycles} cycles, {result.wall_s:.1f}s", file=sys.stderr)
            summaries.append(hetero_summary(result))
    except (UsageError, WorkloadError, ProfileError, ValueError, OSError) as exc:
        raise BadInput(f"error: {exc}") from exc
    return _write_summaries(args, summaries)


def _write_summaries(args: argparse.Namespace, summaries: list[dict[str, object]]) -> int:
    """The policies' summaries as a table on stdout and, with ``--out``, as ``summary.json`` there."""
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "summary.json").write_text(json.dumps({s["policy"]: s for s in summaries}, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    sys.stdout.write(format_summaries(summaries))
    return 0


def _run_goodput(args: argparse.Namespace) -> int:
    """``--job-model goodput``: the Pollux workload through ``simulator.goodput_sim``."""
    try:
        names = _policy_names(args)
        if args.trace_format != "pollux" or args.profiles_dir is None:
            raise UsageError("--job-model goodput needs --trace-format pollux and --profiles-dir (pollux-data/traces)")
        if any(name not in GOODPUT_POLICIES for name in names):
            raise UsageError(f"--job-model goodput runs the policies {', '.join(GOODPUT_POLICIES)}")
        params = parse_params(args.param) if args.param else None
        if params is not None and (unread := [n for n in names if n not in parameterised()]):
            raise UsageError(f"--param is read by {', '.join(parameterised())} under --job-model goodput; "
                             f"{', '.join(unread)} there run the authors' rules and read none")
        workload = load_workload(args.trace)[: args.limit]
        settings = {"nodes": args.training_servers, "gpus_per_node": args.gpus_per_server,
                    "interval_s": args.cycle_interval, "restart_s": args.restart_overhead}
        summaries = []
        for name in names:
            result = run_workload(workload, args.profiles_dir, name, nodes=args.training_servers,
                                  gpus_per_node=args.gpus_per_server, interval_s=args.cycle_interval,
                                  restart_s=args.restart_overhead, params=params)
            print(f"{name}: {len(result.jcts)} jobs, {result.wall_s:.1f}s", file=sys.stderr)
            summaries.append(goodput_summary(result, settings))
    except (UsageError, WorkloadError, ProfileError, ValueError, OSError) as exc:
        raise BadInput(f"error: {exc}") from exc
    return _write_summaries(args, summaries)


if __name__ == "__main__":
    sys.exit(main())
