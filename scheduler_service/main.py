"""``aryl-scheduler``: run the scheduler service (or only its database migrations).

Exit status (``aryl_common.entry``): 0 after a clean shutdown (SIGTERM/SIGINT); 2 for invalid
configuration or a listen address that cannot be bound; 3 when the database cannot be reached. A
failed start prints one line on stderr (``--debug`` or ``ARYL_DEBUG=1`` adds the traceback) and,
because the port and the database are checked first, writes nothing to the event log.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import sqlalchemy.exc
import structlog

from aryl_common.config import apply_overrides
from aryl_common.entry import EXIT_OK, BadInput, add_standard_flags, run_guarded
from aryl_common.logs import configure_logging
from aryl_common.signals import stop_on_signals
from migrations import upgrade
from scheduler_service.config import SchedulerConfig, load_config
from scheduler_service.core.registry import UnknownPolicy

PROG = "aryl-scheduler"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description="Aryl scheduler service")
    add_standard_flags(parser)
    parser.add_argument("command", nargs="?", choices=["serve", "migrate"], default="serve",
                        help="serve (default) or only run database migrations and exit")
    parser.add_argument("--config", help="TOML or YAML config file (default: $ARYL_CONFIG)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to serve on (server.listen)")
    parser.add_argument("--database-url", metavar="URL",
                        help="SQLAlchemy URL, e.g. postgresql+psycopg2://aryl@db/aryl (database.url; "
                             "default: SQLite in ./.aryl)")
    parser.add_argument("--policy", metavar="NAME",
                        help="scheduling policy, e.g. aryl or fifo (scheduling.policy); an unknown name is "
                             "refused with the list of registered ones")
    parser.add_argument("--insecure", action="store_true", default=None,
                        help="plaintext gRPC and no identities: any caller may do anything (security.insecure = "
                             "true, ARYL_SECURITY__INSECURE=true; development only; the default is TLS and tokens)")
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace) -> SchedulerConfig:
    return apply_overrides(
        load_config(args.config),
        {
            "server": {"listen": args.listen},
            "database": {"url": args.database_url},
            "scheduling": {"policy": args.policy},
            "security": {"insecure": args.insecure},
        },
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_guarded(PROG, lambda: run(args), debug=args.debug)


def run(args: argparse.Namespace) -> int:
    """The program; its failures are typed (``aryl_common.entry``) and reported by ``main``."""
    config = build_config(args)
    configure_logging(config.logging.format, config.logging.level)
    try:
        from scheduler_service.server import SchedulerService, displayed_url, reaching_database
    except ModuleNotFoundError as exc:  # the solvers' numba is an extra: aryl[scheduler]
        if exc.name not in ("numba", "llvmlite"):
            raise
        missing = f"the scheduler needs {exc.name}, which is not installed: pip install 'aryl[scheduler]'"
        raise BadInput(missing) from exc

    if args.command == "migrate":
        with reaching_database(config.database.url):
            upgrade(config.database.url)
        structlog.get_logger("aryl.scheduler").info("database migrated to head")
        return EXIT_OK
    try:
        service = SchedulerService(config, tune_gc=True)
    except (UnknownPolicy, ValueError) as exc:
        raise BadInput(str(exc)) from exc
    except (sqlalchemy.exc.ArgumentError, ImportError, OSError) as exc:  # a bad URL, no driver, no such directory
        raise BadInput(f"cannot use database.url {displayed_url(config.database.url)}: {exc}; fix --database-url, "
                       "database.url or ARYL_DATABASE__URL") from exc

    async def serve() -> None:
        stop_on_signals(asyncio.get_running_loop(), service.stop)
        await service.run()

    asyncio.run(serve())
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
