"""The risk-valued loans of ``aryl`` (issue 31, item 3): an extra worker on a loaned server is valued by its
expected useful time before the server goes back to inference (``policies.aryl.loans.loan_risk``,
``cycle.LoanRisk``, ``sizing.completion_rates``), in the ``aryl-risk`` variant; ``aryl`` values them at their
full rate. Hand-computed cases."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_service.core.demand_forecast import DemandForecaster
from scheduler_service.core.snapshot import ClusterSnapshot, DemandView
from scheduler_service.core.throughput import JobEstimate, ThroughputModel
from scheduler_service.lifecycle import ServerState
from scheduler_service.policies import create_policy
from scheduler_service.policies.aryl import completion_rates
from scheduler_service.policies.aryl.cycle import LoanRisk
from tests.harness import NOW, inference_server, running_job, training_server, with_allocations

pytestmark = pytest.mark.timeout(60)


def test_the_chance_of_losing_a_loaned_server_and_its_integral():
    risk = LoanRisk((600.0, 1800.0), (0.5, 1.0))
    assert risk.lost_within(0.0) == (0.0, 0.0)
    assert risk.lost_within(300.0) == pytest.approx((0.25, 37.5))       # 0.25 x 300 / 2
    assert risk.lost_within(1200.0) == pytest.approx((0.75, 525.0))     # 150 + (0.5 + 0.75) / 2 x 600
    assert risk.lost_within(3600.0) == pytest.approx((1.0, 2850.0))     # 150 + 450 + 1 x 1800 past the last window
    assert risk.lost_within(1200.0, 0.5) == pytest.approx((0.375, 262.5))


def test_completion_rates_value_a_size_by_its_expected_time_before_and_after_a_reclaim():
    # 10,000 s left at 1 worker, 5,000 s at 2 (declared points). The extra worker's server goes back for sure
    # within 600 s, linearly: F(5000) = 1, I(5000) = 300 + 4400 = 4700. Expected time at 2 workers:
    # 5000 + 60 x 1 + (10000 / 5000 - 1) x 4700 = 9760 s (it runs 2x for 300 s on average, then restarts at 1).
    est = JobEstimate(ThroughputModel(((1, 1.0), (2, 2.0)), 0.05), 10_000.0)
    risk = LoanRisk((600.0,), (1.0,))
    assert completion_rates(est, 1, 1, 1, 60.0, risk.lost_within) == pytest.approx([1 / 10_000, 1 / (9760 + 60)])
    # Without the risk: 1 / (5000 + 60), the restart of the resize.
    assert completion_rates(est, 1, 1, 1, 60.0) == pytest.approx([1 / 10_000, 1 / 5060])


def _rising(until: float) -> DemandForecaster:
    """15 minutes of a need rising 0.1 server a minute, to 1.4 now: too few anchors, so the trend decides --
    1.6 within the 2-minute reclaim lead (2 serve: no reclaim now), 2.6 within 12 minutes (3 needed: the
    loaned server goes back)."""
    forecaster = DemandForecaster()
    for b in range(15):
        forecaster.observe(until - 870.0 + b * 60.0, 0.1 * b)
    return forecaster


def test_aryl_does_not_grow_a_job_onto_a_loaned_server_about_to_go_back():
    # Job 1 runs at 1 worker of 8 GPUs on training server t, 10,000 s left there (13,000 s estimated, 3,000 s
    # run); a second worker speeds it up 1.1x only. Loaned server l (8 GPUs) is free. Without the risk, the
    # second worker is worth 1 / (10000 / 1.1 + 60) - 1 / 10000 > 0: aryl grows the job onto l. The
    # forecast says l goes back within 12 minutes (F(600 s) = 1): the expected time at 2 workers is
    # 9090.9 + 60 + 0.1 x (9090.9 - 300) = 10030 s, plus the resize's restart: more than 10,000 s. aryl-risk
    # keeps it.
    job = dataclasses.replace(
        running_job(1, [("t", tuple(range(8)))], low=1, high=2, resized=NOW - 3000, runtime=13_000),
        throughput_points=((1, 1.0), (2, 1.1)))
    servers = [training_server("t", 8), inference_server("s1", since=NOW - 7200),
               inference_server("s2", since=NOW - 7200),
               inference_server("l", ServerState.LOANED, since=NOW - 7200)]
    forecast = _rising(NOW).view(NOW)
    snapshot = ClusterSnapshot(now=NOW, servers=with_allocations(servers, (job,)), jobs=(job,),
                               demand=DemandView(1, 10.0, NOW, forecast=forecast))
    full_rate = create_policy("aryl").schedule(snapshot)
    assert [(s.job_id, len(s.workers)) for s in full_rate.scales] == [(1, 2)]
    assert not full_rate.server_actions  # nothing reclaimed now: the band over the lead is 1.6
    risk = create_policy("aryl-risk").schedule(snapshot)
    assert risk.scales == () and not risk.server_actions
