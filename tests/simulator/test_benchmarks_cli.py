"""``python -m benchmarks`` fails loudly: a benchmark that raises makes ``main`` return 1 and names it,
and the benchmarks after it still run. Uses stand-in benchmarks, never the real (heavy) ones."""

from __future__ import annotations

import logging

import pytest

from benchmarks.__main__ import main, registry
from benchmarks.harness import QUICK, BenchContext, Benchmark


def stand_ins(ran: list[str]) -> tuple[Benchmark, ...]:
    def fine(ctx: BenchContext) -> None:
        ran.append(f"fine:{'quick' if ctx.sizes is QUICK else 'full'}")

    def broken(ctx: BenchContext) -> None:
        ran.append("broken")
        raise TimeoutError("timed out waiting for the scale-out")

    return (Benchmark("broken", broken, "raises"), Benchmark("fine", fine, "prints nothing"))


def test_a_benchmark_that_raises_makes_main_return_1_and_names_it(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []
    with caplog.at_level(logging.INFO, logger="aryl.bench"):
        assert main(["--quick"], stand_ins(ran)) == 1
    assert ran == ["broken", "fine:quick"]  # one broken benchmark does not hide the others
    assert "failed: broken" in caplog.text
    assert "timed out waiting for the scale-out" in caplog.text  # with its traceback


def test_main_returns_0_when_every_benchmark_ran() -> None:
    ran: list[str] = []
    assert main(["--only", "fine"], stand_ins(ran)) == 0
    assert ran == ["fine:full"]


def test_two_benchmarks_of_one_name_are_refused() -> None:
    bench = Benchmark("same", lambda ctx: None, "")
    with pytest.raises(ValueError, match="two benchmarks are named 'same'"):
        registry((bench, bench))


def test_every_shipped_benchmark_is_registered_once() -> None:
    names = registry()
    assert {"reclaim_latency", "dl2_decide", "checkpoint_ack_latency"} <= set(names)
