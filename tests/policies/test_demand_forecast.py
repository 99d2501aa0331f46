"""The inference demand forecast (``core.demand_forecast``) on hand-made loads, and the ``aryl`` loan cycle's use
of it (``policies.aryl.loans.demand_outlook``): a reclaim that starts ahead of a forecast rise, by the lead,
and no loan of what the forecast needs back; ``aryl-reactive`` on the need now alone."""

from __future__ import annotations

import pytest

from scheduler_service.core.demand_forecast import DAY_S, DemandForecaster, ForecastSettings
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import LoanStep, Reason
from scheduler_service.core.snapshot import ClusterSnapshot, DemandView
from scheduler_service.lifecycle import ServerState
from scheduler_service.policies import create_policy
from scheduler_service.policies.aryl.loans import demand_outlook
from tests.harness import inference_server

pytestmark = pytest.mark.timeout(60)

HOUR = 3600.0


def evening_peak(t: float) -> int:
    """10 servers, except 20 from 18:00 to 20:00 every day."""
    hour = (t % DAY_S) / HOUR
    return 20 if 18 <= hour < 20 else 10


def fed(until: float, need=evening_peak, step: float = 600.0, start: float = 0.0) -> DemandForecaster:
    """A forecaster fed ``need`` every ``step`` seconds from ``start`` to before ``until``."""
    forecaster = DemandForecaster()
    t = start
    while t < until:
        forecaster.observe(t, need(t))
        t += step
    return forecaster


def test_a_daily_rise_is_forecast_from_the_days_before():
    # Three days of history. At 17:55 (need 10), the band over 10 minutes holds the rise to 20 seen on every
    # past day at 18:00: the anchors of 17:50..17:59 on past days rose to 20 within 10 minutes (ratio 2).
    now = 3 * DAY_S + 17 * HOUR + 55 * 60
    view = fed(now).view(now)
    assert view is not None and view.level == 10
    ahead = view.forecast(600.0, 0.999)
    assert ahead.upper == pytest.approx(20.0)
    assert ahead.anchors > 100 and ahead.trend_per_h == pytest.approx(0.0, abs=1e-9)
    # The median anchor saw no rise (most moments of 17:00..19:00 are not just before 18:00).
    assert ahead.point == pytest.approx(10.0)
    # At noon no past day rose within 10 minutes: the band is the level.
    noon = 3 * DAY_S + 12 * HOUR
    at_noon = fed(noon).view(noon)
    assert at_noon is not None and at_noon.forecast(600.0, 0.999).upper == pytest.approx(10.0)


def test_the_band_does_not_know_where_in_the_hour_a_rise_comes():
    # At 17:50 the rise is 10 minutes away, yet the 2-minute band holds it: the anchors are every minute of
    # 16:50..18:50 on past days, and the few of them 1-2 minutes before 18:00 saw it (the band does not model
    # the phase within its season window). A 0.9 quantile ignores those rare anchors.
    now = 3 * DAY_S + 17 * HOUR + 50 * 60
    view = fed(now).view(now)
    assert view is not None
    assert view.forecast(120.0, 0.999).upper == pytest.approx(20.0)
    assert view.forecast(120.0, 0.9).upper == pytest.approx(10.0)


def test_rises_are_measured_in_units_of_the_square_root_of_the_need():
    # On three past days the need rose from 4 to 6 at 18:00: a rise of 2 / sqrt(4) = 1 unit. Today it has stood at
    # 16 since noon, so the recent hour saw no rise. At 17:55 the band over 10 minutes is 16 + sqrt(16) x 1 = 20:
    # relative rises would say 16 x 6/4 = 24, absolute ones 16 + 2 = 18.
    def need(t: float) -> int:
        hour = (t % DAY_S) / HOUR
        if t >= 3 * DAY_S:
            return 16 if hour >= 12 else 4
        return 6 if 18 <= hour < 20 else 4

    now = 3 * DAY_S + 17 * HOUR + 55 * 60
    view = fed(now, need).view(now)
    assert view is not None and view.level == 16
    assert view.forecast(600.0, 0.999).upper == pytest.approx(20.0)


def test_without_history_the_band_is_the_level_or_the_rising_trend():
    forecaster = DemandForecaster(ForecastSettings(min_anchors=1000))  # no anchor is enough: trend only
    for minute in range(10):
        forecaster.observe(minute * 60.0, 10 + minute)  # one server more each minute
    view = forecaster.view(9 * 60.0 + 30)
    assert view is not None and view.level == 19
    ahead = view.forecast(120.0, 0.999)
    # The least-squares slope over the last 10 one-minute bins is exactly 1 server a minute: 2 more in 2 minutes.
    assert ahead.trend_per_h == pytest.approx(60.0)
    assert ahead.upper == pytest.approx(21.0)
    assert ahead.anchors == 0
    # A falling need forecasts no fall: the band never goes below the level.
    falling = DemandForecaster(ForecastSettings(min_anchors=1000))
    for minute in range(10):
        falling.observe(minute * 60.0, 20 - minute)
    after_the_fall = falling.view(600.0)
    assert after_the_fall is not None and after_the_fall.forecast(120.0, 0.999).upper == pytest.approx(11.0)


def test_skipped_bins_hold_the_need_in_force_and_history_is_bounded():
    forecaster = DemandForecaster(ForecastSettings(bin_s=60.0, history_s=DAY_S))
    forecaster.observe(0.0, 5)
    forecaster.observe(59.0, 3)            # same bin: the bin keeps its highest need, the level follows
    forecaster.observe(600.0, 7)           # bins 1..9 held 3
    view = forecaster.view(600.0)
    assert view is not None and view.level == 7
    assert view.history.tolist() == [5.0, 3, 3, 3, 3, 3, 3, 3, 3, 3, 7]
    forecaster.observe(3 * DAY_S, 8)       # two days later: only the last day is kept
    later = forecaster.view(3 * DAY_S)
    assert later is not None and len(later.history) == DAY_S / 60 and later.history[-1] == 8
    assert later.history[0] == 7


def test_reclaim_latency_is_measured_and_the_lead_falls_back_before_it():
    forecaster = fed(DAY_S)
    first = forecaster.view(DAY_S)
    assert first is not None and first.reclaim_latency_s is None
    assert first.lead_s(120.0) == 120.0  # no cycle gap yet either
    for seconds in (30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 110.0, 300.0):
        forecaster.observe_reclaim(seconds)
    forecaster.view(DAY_S + 60.0)
    view = forecaster.view(DAY_S + 90.0)  # cycle gaps 60 s and 30 s: their p90 (nearest rank) is 60
    assert view is not None
    assert view.reclaim_latency_s == 110.0  # p90 by nearest rank of 10 samples: the 9th
    assert view.decision_lag_s == 60.0
    assert view.lead_s(120.0) == 170.0


def _cluster(now: float, forecaster: DemandForecaster | None) -> ClusterSnapshot:
    """20 inference servers: 11 serving (the need now, 10, plus the spare), 9 loaned for a day, idle."""
    servers = [inference_server(f"i{k:02d}", since=now - 2 * HOUR) for k in range(11)]
    servers += [inference_server(f"i{k:02d}", ServerState.LOANED, since=now - DAY_S) for k in range(11, 20)]
    view = forecaster.view(now) if forecaster is not None else None
    return ClusterSnapshot(now=now, servers=tuple(servers), jobs=(),
                           demand=DemandView(10, 100.0, now, forecast=view))


def test_aryl_reclaims_ahead_of_a_forecast_rise_and_the_reactive_variant_waits():
    # 17:58: the need is 10 and 11 serve. The lead is the reclaim deadline (120 s, no reclaim measured yet):
    # the band over it holds the rise to 20 at 18:00, so aryl reclaims the 9 loaned servers now, saying why.
    now = 3 * DAY_S + 17 * HOUR + 58 * 60
    plan = create_policy("aryl").schedule(_cluster(now, fed(now)))
    reclaims = [a for a in plan.server_actions if a.kind == LoanStep.RECLAIM]
    assert len(reclaims) == 9
    assert all(a.reason == Reason.RECLAIMED_FOR_INFERENCE for a in reclaims)
    assert reclaims[0].message.startswith("the demand forecast says inference needs 20 serving server(s) within 120s")
    assert "it needs 10 now" in reclaims[0].message
    # The reactive variant reclaims only when the need itself rises.
    reactive = create_policy("aryl-reactive").schedule(_cluster(now, fed(now)))
    assert not [a for a in reactive.server_actions if a.kind == LoanStep.RECLAIM]
    # At noon, the history shows no rise within the lead: no reclaim.
    noon = 3 * DAY_S + 12 * HOUR
    assert not [a for a in create_policy("aryl").schedule(_cluster(noon, fed(noon))).server_actions
                if a.kind == LoanStep.RECLAIM]


def test_the_outlook_reclaims_for_the_lead_and_keeps_for_the_payback():
    # No history to learn from (min_anchors out of reach), a need rising one server a minute: the band is the
    # trend. Lead 120 s (the reclaim deadline; nothing measured, no cycle gap yet): 19 + 2 = 21 to reclaim for;
    # lead + payback, 120 + 2 x 60 s (policy.restart_cost_s): 19 + 4 = 23 that no loan may take.
    forecaster = DemandForecaster(ForecastSettings(min_anchors=1000))
    for minute in range(10):
        forecaster.observe(minute * 60.0, 10 + minute)
    now = 9 * 60.0 + 30
    view = forecaster.view(now)
    params = PolicyParams()
    outlook = demand_outlook(DemandView(19, 100.0, now, forecast=view), 30, params, forecast=True)
    assert (outlook.needed, outlook.reclaim_to, outlook.keep) == (19, 21, 23)
    assert outlook.reclaim_why.startswith("the demand forecast says inference needs 21 serving server(s) within "
                                          "120s")
    assert outlook.keep_text == "19 server(s) now and up to 23 within 240s by its forecast"
    # Never beyond the inference cluster (but never below the need now); without a forecast, the need now.
    assert (demand_outlook(DemandView(19, 100.0, now, forecast=view), 22, params, forecast=True).keep) == 22
    assert demand_outlook(DemandView(25, 100.0, now, forecast=view), 22, params, forecast=True).keep == 25
    reactive = demand_outlook(DemandView(19, 100.0, now, forecast=view), 30, params, forecast=False)
    assert (reactive.reclaim_to, reactive.keep, reactive.reclaim_why) == (19, 19, "")


def test_a_larger_budget_takes_a_lower_quantile_of_the_rises():
    # 17:50 on the evening-peak load: the rise to 20 at 18:00 was seen within 2 minutes only from the anchors of
    # 17:58 and 17:59 on past days, a few of the ~420: the 0.999 quantile holds it, a budget of 0.2 does not.
    now = 3 * DAY_S + 17 * HOUR + 50 * 60
    view = fed(now).view(now)
    demand = DemandView(10, 100.0, now, forecast=view)
    assert demand_outlook(demand, 20, PolicyParams(), forecast=True).reclaim_to == 20
    assert demand_outlook(demand, 20, PolicyParams(inference_short_budget=0.2), forecast=True).keep == 10


def test_the_budget_must_be_a_share():
    with pytest.raises(ValueError, match="inference_short_budget must be below 1"):
        PolicyParams(inference_short_budget=1.0)


def test_reclaimed_shares_count_the_loaned_servers_each_anchor_rise_takes_back():
    # 12 one-minute bins, need 3 but 4 at bin 4 and 6 at bin 7; now in bin 11, level 3. Anchors (the last hour,
    # whole window in the past) for a 2-minute window: bins 0..8. Each one's rise over its next 2 bins (in units
    # of the square root of where it stood), applied to the level (3 + sqrt(3) x rise), with 3 serving and 2
    # loaned, takes back: bins 0, 1: 0 (max 3); 2: 4 -> 1; 3: 4 -> 1; 4: 3 - sqrt(3) x 1/2 -> 0; 5: 6 -> 2 (all
    # loaned); 6: 6 -> 2; 7: 3 - sqrt(3) x 3/sqrt(6) -> 0; 8: 0.
    # Mean 6 / 9 servers: a share of 1/3 of the 2 loaned.
    forecaster = DemandForecaster(ForecastSettings(min_anchors=4))
    for b in range(12):
        forecaster.observe(b * 60.0, {4: 4, 7: 6}.get(b, 3))
    view = forecaster.view(11 * 60.0 + 30)
    assert view is not None and view.level == 3
    assert view.reclaimed_shares([120.0], serving=3, loaned=2) == pytest.approx((1 / 3,))
    assert view.reclaimed_shares([120.0], serving=3, loaned=0) == (0.0,)
    # Fewer anchors than min_anchors: the rising trend carried ahead, one sample. Flat at 3: nothing back;
    # rising 0.01 server a minute (3.11 now): 3.13 within 2 minutes (4 needed: one back), 3.71 within an hour.
    for slope, shares in ((0.0, (0.0, 0.0)), (0.01, (0.5, 0.5))):
        sparse = DemandForecaster(ForecastSettings(min_anchors=20))
        for b in range(12):
            sparse.observe(b * 60.0, 3 + slope * b)
        view = sparse.view(11 * 60.0 + 30)
        assert view is not None and view.reclaimed_shares([120.0, 3600.0], serving=3, loaned=2) == shares
