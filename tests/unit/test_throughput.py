"""Amdahl's law, written once (``core.throughput.amdahl_speedup``): its values and shape, and that the
throughput model and the simulator's trace loader both answer with it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_service.core.throughput import ThroughputModel, amdahl_speedup
from simulator.traces import _relative_amdahl_curve


def test_known_values_of_the_speedup() -> None:
    # 8 / (1 + 0.1 * 7) = 8 / 1.7 = 80 / 17; 4 / (1 + 0.05 * 3) = 80 / 23.
    assert amdahl_speedup(8, 0.1) == pytest.approx(80 / 17, rel=1e-12)
    assert amdahl_speedup(4, 0.05) == pytest.approx(80 / 23, rel=1e-12)
    assert amdahl_speedup(16, 0.0) == 16.0  # nothing serial: linear
    assert amdahl_speedup(16, 1.0) == 1.0  # all serial: more workers add nothing


@given(st.floats(min_value=0.0, max_value=1.0))
def test_one_worker_is_the_unit(alpha: float) -> None:
    assert amdahl_speedup(1, alpha) == 1.0


@given(st.floats(min_value=0.0, max_value=1.0), st.integers(min_value=1, max_value=4096))
def test_more_workers_never_slow_down_and_stay_under_the_serial_bound(alpha: float, n: int) -> None:
    assert amdahl_speedup(n + 1, alpha) >= amdahl_speedup(n, alpha)
    assert amdahl_speedup(n, alpha) <= n
    if alpha > 0:
        assert amdahl_speedup(n, alpha) <= 1 / alpha * (1 + 1e-12)


def test_the_model_and_the_trace_loader_use_the_one_formula() -> None:
    assert [ThroughputModel(alpha=0.2).speed(w) for w in (1, 3, 7)] == [amdahl_speedup(w, 0.2) for w in (1, 3, 7)]
    through_point = ThroughputModel(points=((2, 10.0),), alpha=0.2)  # one point: Amdahl through it
    assert through_point.speed(6) == pytest.approx(10.0 * amdahl_speedup(6, 0.2) / amdahl_speedup(2, 0.2))
    # Workers 2..4 of 4 GPUs each, relative to 2 workers: S(8), S(12), S(16) over S(8).
    assert _relative_amdahl_curve(4, 2, 4, 0.1) == pytest.approx(
        [amdahl_speedup(g, 0.1) / amdahl_speedup(8, 0.1) for g in (8, 12, 16)]
    )
