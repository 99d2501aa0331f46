"""``aryl-router``: the inference router daemon (the controller of HAProxy, or a Python proxy, that reports
demand; see the package doc).

    aryl-router [--config FILE] [--listen HOST:PORT] [--scheduler HOST:PORT | --no-scheduler]
                [--backend URL ...] [--servers-needed N | --capacity-rps RPS] [--headroom H]
                [--min-servers N] [--scale-down-delay SECONDS] [--interval SECONDS] [--source NAME]
                [--health-path PATH] [--data-plane haproxy|python]

Flags beat ``ARYL_<SECTION>__<KEY>`` environment variables, which beat the config file. Exit status
(``aryl_common.entry``): 0 after a clean shutdown (SIGTERM/SIGINT: stop accepting, finish in-flight
requests within ``router.shutdown_timeout_s``), 2 for invalid configuration, a listen address that
cannot be bound or a HAProxy that cannot be found or started; one line on stderr says why (``--debug``
or ``ARYL_DEBUG=1`` adds the traceback).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from aryl_common.entry import EXIT_OK, BadInput, add_standard_flags, run_guarded
from aryl_common.logs import configure_logging
from aryl_common.metrics import MetricsConfig
from aryl_common.signals import stop_on_signals
from inference_router.config import load_router_config
from inference_router.router import DataPlaneError, ListenError, serve

PROG = "aryl-router"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Aryl inference router: programs HAProxy (or its own Python proxy) to route HTTP requests to "
        "the serving inference servers and reports to the scheduler how many servers the load needs.",
    )
    add_standard_flags(parser)
    parser.add_argument("--config", help="TOML or YAML config file (default: $ARYL_CONFIG)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="HTTP address to serve on (router.listen)")
    parser.add_argument("--scheduler", metavar="HOST:PORT", help="scheduler address (router.scheduler_address)")
    parser.add_argument("--no-scheduler", action="store_true",
                        help="no scheduler: route to --backend URLs only and report nothing")
    parser.add_argument("--backend", action="append", metavar="URL",
                        help="static backend base URL instead of the scheduler's pool (repeatable; "
                        "router.static_backends)")
    parser.add_argument("--servers-needed", type=int, metavar="N", help="static demand (router.servers_needed)")
    parser.add_argument("--capacity-rps", type=float, metavar="RPS",
                        help="requests/s one server sustains: derive the demand from load (router.server_capacity_rps)")
    parser.add_argument("--headroom", type=float, metavar="H", help="router.headroom (0.2 = 20%% spare)")
    parser.add_argument("--min-servers", type=int, metavar="N", help="router.min_servers")
    parser.add_argument("--scale-down-delay", type=float, metavar="SECONDS", help="router.scale_down_delay_s")
    parser.add_argument("--interval", type=float, metavar="SECONDS", help="router.report_interval_s (heartbeat)")
    parser.add_argument("--source", help="router.source")
    parser.add_argument("--health-path", metavar="PATH", help="router.health_path (e.g. /healthz)")
    parser.add_argument("--data-plane", choices=("haproxy", "python"),
                        help="router.data_plane: haproxy (default; HAProxy carries the requests) or python (the "
                        "router's own proxy, for hosts without HAProxy)")
    return parser.parse_args(argv)


def cli_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The config keys the command line sets, as ``{section: {key: value}}``."""
    pairs = (
        ("listen", args.listen),
        ("scheduler_address", "" if args.no_scheduler else args.scheduler),
        ("static_backends", args.backend),
        ("servers_needed", args.servers_needed),
        ("server_capacity_rps", args.capacity_rps),
        ("headroom", args.headroom),
        ("min_servers", args.min_servers),
        ("scale_down_delay_s", args.scale_down_delay),
        ("report_interval_s", args.interval),
        ("source", args.source),
        ("health_path", args.health_path),
        ("data_plane", args.data_plane),
    )
    router = {key: value for key, value in pairs if value is not None}
    return {"router": router} if router else {}


async def run_until_signalled(config: Any, metrics: MetricsConfig | None = None) -> None:
    stop = asyncio.Event()
    stop_on_signals(asyncio.get_running_loop(), stop.set)
    await serve(config, stop, metrics)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_guarded(PROG, lambda: run(args), debug=args.debug)


def run(args: argparse.Namespace) -> int:
    """The program; its failures are typed (``aryl_common.entry``) and reported by ``main``."""
    config = load_router_config(args.config, cli_overrides(args))
    configure_logging(config.logging.format, config.logging.level)
    try:
        asyncio.run(run_until_signalled(config.router, config.metrics))
    except ListenError as exc:
        raise BadInput(f"{exc}; choose another address with --listen or router.listen") from exc
    except DataPlaneError as exc:
        raise BadInput(str(exc)) from exc
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
