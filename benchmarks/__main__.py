"""``python -m benchmarks`` (``make bench``): run the benchmarks; one JSON figure per line on stdout.

Progress and the scheduler's own warnings go to stderr, so stdout can be piped straight into a file
or a tracker. Exits 1 when a benchmark could not run (never because a figure was slow). ``--under-load`` runs
each benchmark quiet and with a CPU hog on every core, and prints the two runs side by side
(``benchmarks.under_load``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from benchmarks import (
    bench_agents,
    bench_auth,
    bench_ckpt_ack,
    bench_cycle,
    bench_dl2,
    bench_pollux,
    bench_reclaim,
    bench_router,
    bench_service,
    bench_sim,
    bench_solvers,
    bench_submit,
)
from benchmarks.harness import FULL, QUICK, BenchContext, Benchmark
from benchmarks.under_load import LATENCY_BENCHMARKS, run_under_load

BENCHMARKS = (
    bench_service.BENCHMARKS + bench_agents.BENCHMARKS + bench_solvers.BENCHMARKS + bench_cycle.BENCHMARKS
    + bench_sim.BENCHMARKS + bench_reclaim.BENCHMARKS + bench_router.BENCHMARKS + bench_pollux.BENCHMARKS
    + bench_submit.BENCHMARKS + bench_auth.BENCHMARKS + bench_ckpt_ack.BENCHMARKS + bench_dl2.BENCHMARKS
)

DEFAULT_ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
log = logging.getLogger("aryl.bench")


def registry(benchmarks: Sequence[Benchmark] = BENCHMARKS) -> dict[str, Benchmark]:
    by_name: dict[str, Benchmark] = {}
    for bench in benchmarks:
        if bench.name in by_name:
            raise ValueError(f"two benchmarks are named {bench.name!r}")
        by_name[bench.name] = bench
    return by_name


def parse_args(argv: list[str] | None, by_name: dict[str, Benchmark]) -> argparse.Namespace:
    names = list(by_name)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description="Aryl benchmarks: one JSON figure per line on stdout.",
        epilog="Benchmarks: " + "; ".join(f"{b.name}: {b.summary}" for b in by_name.values()),
    )
    parser.add_argument("--only", action="append", choices=names, metavar="NAME",
                        help=f"run only this benchmark (repeatable; one of: {', '.join(names)})")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke test, not a measurement")
    parser.add_argument(
        "--under-load", action="store_true",
        help="run each benchmark twice, quiet and with a CPU hog on every core, and print the two runs side by side "
             f"(by default the latency benchmarks: {', '.join(LATENCY_BENCHMARKS)}; benchmarks/under_load.py)")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, metavar="N",
                        help="CPU hogs in the loaded run (default: one per core, %(default)s here)")
    parser.add_argument(
        "--database-url", default=os.environ.get("ARYL_BENCH_DATABASE_URL", DEFAULT_ADMIN_URL),
        help="PostgreSQL URL allowed to create databases; each benchmark creates, migrates and drops its own "
             "aryl_bench_<random> next to it (default: $ARYL_BENCH_DATABASE_URL, else %(default)s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, benchmarks: Sequence[Benchmark] = BENCHMARKS) -> int:
    """Run the benchmarks of ``argv`` (all by default) from ``benchmarks``; 1 when any of them raised."""
    by_name = registry(benchmarks)
    args = parse_args(argv, by_name)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    ctx = BenchContext(admin_url=args.database_url, sizes=QUICK if args.quick else FULL)
    if args.under_load:
        names = args.only or [name for name in LATENCY_BENCHMARKS if name in by_name]
        failed = run_under_load([by_name[name] for name in names], ctx, max(1, args.hogs))
        if failed:
            log.error("failed: %s", ", ".join(failed))
        return 1 if failed else 0
    failed = []
    for name in args.only or list(by_name):
        # Other work on the machine moves every figure; say how busy it was.
        log.info("running %s (%s sizes); load average %.2f on %d CPUs", name,
                 "quick" if args.quick else "full", os.getloadavg()[0], os.cpu_count() or 0)
        try:
            by_name[name].run(ctx)
        except Exception:  # one broken benchmark must not hide the others' figures
            log.exception("benchmark %s failed", name)
            failed.append(name)
    if failed:
        log.error("failed: %s", ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
