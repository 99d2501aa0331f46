"""``aryl-scheduler``: run the scheduler service (or only its database migrations)."""

from __future__ import annotations

import argparse
import asyncio
import sys

import structlog

from aryl_common.config import ConfigError, apply_overrides
from aryl_common.logs import configure_logging
from aryl_common.signals import stop_on_signals
from migrations import upgrade
from scheduler_service.config import SchedulerConfig, load_config
from scheduler_service.core.registry import UnknownPolicy


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="aryl-scheduler", description="Aryl scheduler service")
    parser.add_argument("command", nargs="?", choices=["serve", "migrate"], default="serve",
                        help="serve (default) or only run database migrations and exit")
    parser.add_argument("--config", help="TOML or YAML config file (default: $ARYL_CONFIG)")
    parser.add_argument("--listen", help="host:port to serve on (server.listen)")
    parser.add_argument("--database-url", help="SQLAlchemy URL (database.url)")
    parser.add_argument("--policy", help="scheduling policy name (scheduling.policy)")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> SchedulerConfig:
    return apply_overrides(
        load_config(args.config),
        {
            "server": {"listen": args.listen},
            "database": {"url": args.database_url},
            "scheduling": {"policy": args.policy},
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = build_config(args)
    except ConfigError as exc:
        print(f"aryl-scheduler: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.logging.format, config.logging.level)
    if args.command == "migrate":
        upgrade(config.database.url)
        structlog.get_logger("aryl.scheduler").info("database migrated to head")
        return 0
    from scheduler_service.server import SchedulerService

    try:
        service = SchedulerService(config, tune_gc=True)
    except (UnknownPolicy, ValueError) as exc:
        print(f"aryl-scheduler: {exc}", file=sys.stderr)
        return 2

    async def serve() -> None:
        stop_on_signals(asyncio.get_running_loop(), service.stop)
        await service.run()

    try:
        asyncio.run(serve())
    except OSError as exc:
        print(f"aryl-scheduler: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
