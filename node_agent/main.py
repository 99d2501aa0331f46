"""``aryl-agent``: the node agent daemon, one per GPU server.

    aryl-agent [--config FILE] [--scheduler HOST:PORT] [--hostname NAME] [--pool training|inference]
               [--fake-gpus N | --gpu-backend auto|nvml|fake] [--work-dir DIR]

Workers keep running when the agent stops (SIGTERM/SIGINT): the next agent started with the same
work directory adopts them, so upgrading the agent does not interrupt training. Set
``agent.stop_workers_on_exit`` to stop them (with their grace periods) instead.

Flags beat ``ARYL_*`` environment variables, which beat the config file. Exit status: 0 after a
clean shutdown (SIGTERM/SIGINT), 1 when the GPU backend cannot start, 2 for invalid configuration.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import structlog

from aryl_common.config import ConfigError
from aryl_common.logs import configure_logging
from aryl_common.signals import run_until_signalled
from node_agent.agent import Agent
from node_agent.config import AgentConfig, load_agent_config
from node_agent.gpus import GpuBackendUnavailable, select_backend

EXIT_OK, EXIT_BACKEND, EXIT_CONFIG = 0, 1, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aryl-agent", description="Aryl node agent (one per GPU server).")
    parser.add_argument("--config", help="TOML or YAML config file (default: $ARYL_CONFIG)")
    parser.add_argument("--scheduler", metavar="HOST:PORT", help="scheduler address (agent.scheduler_address)")
    parser.add_argument("--hostname", help="this server's name, its server_id (agent.hostname)")
    parser.add_argument("--pool", choices=["training", "inference"], help="agent.pool")
    parser.add_argument("--work-dir", metavar="DIR", help="worker logs, state and checkpoints (agent.work_dir)")
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
            ("pool", args.pool),
            ("work_dir", args.work_dir),
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
    try:
        config: AgentConfig = load_agent_config(args.config, cli_overrides(args))
    except ConfigError as exc:
        print(f"aryl-agent: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.logging.format, config.logging.level)
    log = structlog.get_logger("node_agent")
    try:
        gpus = select_backend(config.gpus, hostname=config.agent.hostname)
    except GpuBackendUnavailable as exc:
        log.error("cannot start the GPU backend", reason=str(exc))
        return EXIT_BACKEND
    try:
        agent = Agent(config.agent, gpus)
        run_until_signalled(agent.run, agent.stop)
    finally:
        gpus.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
