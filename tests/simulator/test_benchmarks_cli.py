"""``python -m benchmarks`` fails loudly: a benchmark that raises makes ``main`` return 1 and names it,
and the benchmarks after it still run. The loaded mode (``--under-load``) runs each benchmark quiet and then
beside real CPU hogs, prints both side by side, and never leaves a hog behind. Uses stand-in benchmarks, never
the real (heavy) ones."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import emit_figure
from benchmarks.__main__ import main, registry
from benchmarks.harness import QUICK, BenchContext, Benchmark
from benchmarks.under_load import HOG_CODE, HOG_MARKER, target_check


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


def _hogs_running() -> list[int]:
    """The CPU hogs of the loaded mode alive now (by their marker in /proc/PID/cmdline), zombies excluded."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if HOG_MARKER.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def test_under_load_runs_each_benchmark_quiet_then_beside_a_hog_per_requested_core(
        capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[int, str]] = []

    def latency(ctx: BenchContext) -> None:
        hogs = _hogs_running()
        seen.append((len(hogs), "run"))
        emit_figure("latency_p99", 50.0 if not hogs else 150.0, "ms", target=100.0, reference_name="ref",
                    reference_value=10.0, reference_unit="ms")

    assert main(["--under-load", "--hogs", "2", "--only", "latency"],
                (Benchmark("latency", latency, "prints a latency"),)) == 0
    assert [n for n, _ in seen] == [0, 2]  # quiet first, then two hogs beside it
    assert _hogs_running() == []  # stopped after the loaded run
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(f["run"], f["hogs"], f["value"]) for f in lines] == [("quiet", 0, 50.0), ("loaded", 2, 150.0)]
    row = next(line for line in err.splitlines() if line.startswith("| latency_p99"))
    assert "| 50 (load" in row and "target <= 100 ms: met" in row
    assert "| 150 (load" in row and "target <= 100 ms: NOT met" in row


def test_under_load_names_a_benchmark_whose_loaded_run_raises_and_returns_1(
        caplog: pytest.LogCaptureFixture) -> None:
    runs: list[bool] = []

    def breaks_when_loaded(ctx: BenchContext) -> None:
        loaded = bool(_hogs_running())
        runs.append(loaded)
        if loaded:
            raise TimeoutError("timed out waiting for the scale-out")

    with caplog.at_level(logging.INFO, logger="aryl.bench"):
        assert main(["--under-load", "--hogs", "1", "--only", "flaky"],
                    (Benchmark("flaky", breaks_when_loaded, "raises under load"),)) == 1
    assert runs == [False, True]
    assert "failed: flaky (loaded run)" in caplog.text
    assert _hogs_running() == []  # stopped even though the run raised


def test_a_hog_exits_by_itself_once_its_parent_is_gone() -> None:
    # A parent that starts a hog and dies at once: the hog must not outlive it (a killed benchmark run).
    parent = subprocess.Popen([sys.executable, "-c", (
        "import os, subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-c', {HOG_CODE!r}, str(os.getpid())])\n"
        "print(p.pid, flush=True)\n")], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    hog = int(parent.stdout.readline())
    assert parent.wait() == 0
    deadline = time.monotonic() + 60 * float(os.environ.get("ARYL_TEST_TIMEOUT_FACTOR", "1"))
    while hog in _hogs_running():
        assert time.monotonic() < deadline, f"hog {hog} outlived its parent"
        time.sleep(0.05)


def test_target_check_reads_each_kind_of_target() -> None:
    assert target_check({"name": "r", "value": 1.2, "unit": "ms", "added_ms": 0.4, "added_target_ms": 1.0}) == (
        "adds 0.4 ms, target <= 1", True)
    assert target_check({"name": "s", "value": 900.0, "unit": "jobs/s", "health_check_ratio": 0.44,
                         "health_check_ratio_target": 0.5})[1] is False  # type: ignore[index]
    assert target_check({"name": "t", "value": 12000.0, "unit": "jobs/s", "target": 10000})[1] is True  # type: ignore[index]
    assert target_check({"name": "u", "value": 3.5, "unit": "s", "target_s": 3.0})[1] is False  # type: ignore[index]
    assert target_check({"name": "v", "value": 3.5, "unit": "s"}) is None


def test_under_load_runs_every_quiet_run_before_any_loaded_one() -> None:
    order: list[tuple[str, bool]] = []

    def named(name: str) -> Benchmark:
        return Benchmark(name, lambda ctx: order.append((name, bool(_hogs_running()))), "records its run")

    assert main(["--under-load", "--hogs", "1", "--only", "a", "--only", "b"], (named("a"), named("b"))) == 0
    assert order == [("a", False), ("b", False), ("a", True), ("b", True)]
