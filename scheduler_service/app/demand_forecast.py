"""The live service's inference demand forecast: the one ``core.demand_forecast.DemandForecaster`` of this
scheduler process, which its scheduling cycle feeds, and what operators are shown of it (``arylctl loans``,
the metrics) -- the same forecast, over the same lead and quantile, that the aryl policy reclaims ahead of.

Nouns: the *forecaster* is ``LiveDemandForecast`` (a ``DemandForecaster`` that keeps the last view a cycle
made); the *outlook* is ``DemandForecastInfo``, that view's forecast over the policy's lead
(``ForecastView.lead_s(policy.reclaim_deadline_s)``) at the policy's quantile
(``1 - policy.inference_short_budget``), as ``policies.aryl.loans.demand_outlook`` reads it.

One per process, kept across this process's leadership terms; a scheduler that becomes the leader starts
with the history it has (empty, if it never led): the forecast is learned, not stored.

Never: decide (the policy does), feed the forecaster (the scheduling cycle does), or hold SQL.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_service.core.demand_forecast import DemandForecaster, ForecastSettings, ForecastView
from scheduler_service.core.params import PolicyParams


@dataclass(frozen=True)
class DemandForecastInfo:
    """The forecast at the last cycle (``made_at``, the cycle's time), in serving servers: the need in
    force (``needed_now``), the expected highest need within ``lead_s`` (``point``) and its upper band at
    ``quantile`` (``upper``); ``reclaim_latency_s`` is None until a reclaim was measured."""

    made_at: float
    needed_now: float
    point: float
    upper: float
    lead_s: float
    quantile: float
    reclaim_latency_s: float | None
    decision_lag_s: float
    anchors: int
    trend_per_h: float


class LiveDemandForecast(DemandForecaster):
    """The service's forecaster (module doc): fed by its scheduling cycle like any ``DemandForecaster``; the
    last view a cycle took is kept (``last_view``) for RPCs and metrics to read, never to recompute."""

    def __init__(self, settings: ForecastSettings | None = None) -> None:
        super().__init__(settings)
        self.last_view: ForecastView | None = None

    def view(self, now: float) -> ForecastView | None:
        view = super().view(now)
        self.last_view = view  # one reference, swapped whole: readers on other threads see one view or the next
        return view

    def outlook(self, params: PolicyParams) -> DemandForecastInfo | None:
        """The last cycle's forecast over the policy's lead at its quantile (None before a cycle saw a
        demand report)."""
        view = self.last_view
        if view is None:
            return None
        lead = view.lead_s(params.reclaim_deadline_s)
        forecast = view.forecast(lead, 1.0 - params.inference_short_budget)
        return DemandForecastInfo(
            made_at=view.now, needed_now=forecast.level, point=forecast.point, upper=forecast.upper, lead_s=lead,
            quantile=forecast.quantile, reclaim_latency_s=view.reclaim_latency_s,
            decision_lag_s=view.decision_lag_s, anchors=forecast.anchors, trend_per_h=forecast.trend_per_h,
        )
