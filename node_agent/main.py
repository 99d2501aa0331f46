"""``aryl-agent``: the node agent daemon, one per GPU server.

    aryl-agent [--config FILE] [--scheduler HOST:PORT] [--hostname NAME] [--advertise-address HOST]
               [--pool training|inference] [--fake-gpus N | --gpu-backend auto|nvml|fake] [--work-dir DIR]
               [--keep-workers]

``--hostname`` is the server's name (its server id); ``--advertise-address`` is where others reach
it: the scheduler reads worker logs there and workers of a job get it as ``MASTER_ADDR``. Without
it the hostname is used, which must then resolve on the scheduler and on every other server.

On SIGTERM/SIGINT the agent leaves the cluster: it tells the scheduler (which shrinks or requeues
the server's jobs at once, not as failures, and places nothing more there until an agent registers
again) and stops its workers with their grace periods. With ``--keep-workers``
(``agent.keep_workers_on_exit``) it exits leaving its workers running instead: the next agent started
with the same work directory adopts them, so upgrading the agent does not interrupt training.

A root agent that runs workers as their owners' uids (``[users]``, ``node_agent.identity``) refuses to
start when its work directory or checkpoint root lies under a directory those uids cannot enter (a
checkout under root's 0700 home): every worker would fail.

Flags beat ``ARYL_<SECTION>__<KEY>`` environment variables, which beat the config file. Exit status
(``aryl_common.entry``): 0 after a clean shutdown (SIGTERM/SIGINT), 2 for invalid configuration, 3
when the GPU backend cannot start (no NVML driver); one line on stderr says why (``--debug`` or
``ARYL_DEBUG=1`` adds the traceback).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from aryl_common.entry import EXIT_OK, BadInput, Unreachable, add_standard_flags, run_guarded
from aryl_common.logs import configure_logging
from aryl_common.metrics import serve_metrics
from aryl_common.signals import run_until_signalled
from node_agent.agent import Agent
from node_agent.config import AgentConfig, load_agent_config
from node_agent.gpus import GpuBackendUnavailable, select_backend
from node_agent.identity import Identities

PROG = "aryl-agent"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description="Aryl node agent (one per GPU server).")
    add_standard_flags(parser)
    parser.add_argument("--config", help="TOML or YAML config file (default: $ARYL_CONFIG)")
    parser.add_argument("--scheduler", metavar="HOST:PORT", help="scheduler address (agent.scheduler_address)")
    parser.add_argument("--hostname", help="this server's name, its server_id (agent.hostname)")
    parser.add_argument(
        "--advertise-address", metavar="HOST",
        help="address (IP or DNS name) the scheduler and other servers' workers use to reach this server: "
        "its log service and MASTER_ADDR (agent.advertise_address; default: the hostname)",
    )
    parser.add_argument("--pool", choices=["training", "inference"], help="agent.pool")
    parser.add_argument("--work-dir", metavar="DIR", help="worker logs, state and checkpoints (agent.work_dir)")
    parser.add_argument(
        "--keep-workers", action="store_true", default=None,
        help="on SIGTERM/SIGINT exit leaving the workers running for the next agent to adopt, instead of "
        "deregistering and stopping them (agent.keep_workers_on_exit)",
    )
    gpus = parser.add_mutually_exclusive_group()
    gpus.add_argument("--fake-gpus", type=int, metavar="N", help="pretend to have N GPUs (implies --gpu-backend fake)")
    gpus.add_argument("--gpu-backend", choices=["auto", "nvml", "fake"], help="gpus.backend")
    return parser.parse_args(argv)


def cli_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The config keys the command line sets, as ``{section: {key: value}}``."""
    agent = {
        key: value
        for key, value in (
            ("scheduler_address", args.scheduler),
            ("hostname", args.hostname),
            ("advertise_address", args.advertise_address),
            ("pool", args.pool),
            ("work_dir", args.work_dir),
            ("keep_workers_on_exit", args.keep_workers),
        )
        if value is not None
    }
    gpus: dict[str, Any] = {}
    if args.fake_gpus is not None:
        gpus = {"backend": "fake", "fake_count": args.fake_gpus}
    elif args.gpu_backend is not None:
        gpus = {"backend": args.gpu_backend}
    return {section: values for section, values in (("agent", agent), ("gpus", gpus)) if values}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_guarded(PROG, lambda: run(args), debug=args.debug)


def run(args: argparse.Namespace) -> int:
    """The program; its failures are typed (``aryl_common.entry``) and reported by ``main``."""
    config: AgentConfig = load_agent_config(args.config, cli_overrides(args))
    configure_logging(config.logging.format, config.logging.level)
    # A root agent that runs jobs as their owners' uids needs directories those uids can reach: say so
    # now rather than fail every job (its work directory defaults to one under the current directory).
    identities = Identities(config.users)
    for setting, path in (("agent.work_dir", config.agent.work_path),
                          ("agent.checkpoint_root", config.agent.checkpoint_path)):
        if (problem := identities.unreachable_directory(setting, path)) is not None:
            raise BadInput(problem)
    try:
        gpus = select_backend(config.gpus, hostname=config.agent.hostname)
    except GpuBackendUnavailable as exc:
        raise Unreachable(f"cannot start the GPU backend {config.gpus.backend!r}: {exc}; install the NVIDIA "
                          "driver, or choose another with --gpu-backend or gpus.backend") from exc
    try:
        agent = Agent(config.agent, gpus, users=config.users)
        metrics = serve_metrics(agent.metrics.registry, config.metrics)
        try:
            run_until_signalled(agent.run, agent.stop if config.agent.keep_workers_on_exit else agent.leave)
        finally:
            if metrics is not None:
                metrics.close()
    finally:
        gpus.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
