"""``aryl-router``: the inference router daemon (for now only its demand reporter; see the package doc).

    aryl-router [--config FILE] [--scheduler HOST:PORT] [--servers-needed N] [--interval SECONDS]
                [--source NAME]

Flags beat ``ARYL_*`` environment variables, which beat the config file. Exit status: 0 after a
clean shutdown (SIGTERM/SIGINT), 2 for invalid configuration.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from inference_router.config import load_router_config
from inference_router.demand import DemandReporter
from node_agent.daemon import run_until_signalled
from scheduler_service.config import ConfigError
from scheduler_service.logs import configure_logging

EXIT_OK, EXIT_CONFIG = 0, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="aryl-router", description="Aryl inference router (this version: reports a static demand only)."
    )
    parser.add_argument("--config", help="TOML or YAML config file (default: $ARYL_CONFIG)")
    parser.add_argument("--scheduler", metavar="HOST:PORT", help="scheduler address (router.scheduler_address)")
    parser.add_argument("--servers-needed", type=int, metavar="N", help="router.servers_needed")
    parser.add_argument("--interval", type=float, metavar="SECONDS", help="router.report_interval_s")
    parser.add_argument("--source", help="router.source")
    return parser.parse_args(argv)


def cli_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The config keys the command line sets, as ``{section: {key: value}}``."""
    pairs = (
        ("scheduler_address", args.scheduler),
        ("servers_needed", args.servers_needed),
        ("report_interval_s", args.interval),
        ("source", args.source),
    )
    router = {key: value for key, value in pairs if value is not None}
    return {"router": router} if router else {}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = load_router_config(args.config, cli_overrides(args))
    except ConfigError as exc:
        print(f"aryl-router: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.logging.format, config.logging.level)
    reporter = DemandReporter(config.router)
    run_until_signalled(reporter.run, reporter.stop)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
