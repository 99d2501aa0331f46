"""The inference section's text (``evaluation.inference``) from made-up summaries: the JCT cost against the
reactive row and the naive reclaim's ratio are computed per seed, and every figure lands in its row."""

from __future__ import annotations

import pytest

from evaluation.headline import aggregate
from evaluation.inference import POLICIES, STRICT, inference_text

pytestmark = pytest.mark.timeout(60)


def summary(jct: float, short: float, per_reclaim: float) -> dict[str, object]:
    return {"avg_jct_s": jct, "p95_jct_s": 2 * jct, "loans": 10, "reclaims": 8, "reclaim_preemptions": 4,
            "preemptions_per_reclaim": per_reclaim, "gpu_hours_lost": 5.0,
            "inference_shortfall": {"requests_short_share": short, "requests_unserved_share": short / 10,
                                    "requests_beyond_cluster_share": 0.0, "server_s": 3600.0, "time_s": 60.0},
            "inference_shortfall_window": {"requests_short_share": 3 * short}}


def test_the_text_reports_the_cost_and_the_reclaim_ratio_per_seed():
    seeds = [0, 1]
    runs = {"aryl-reactive": [summary(3600.0, 0.01, 0.5), summary(7200.0, 0.02, 0.5)],
            "aryl": [summary(3672.0, 0.0005, 0.25), summary(7488.0, 0.0007, 0.1)],
            "aryl-risk": [summary(3635.28, 0.0005, 0.25), summary(7488.0, 0.0007, 0.1)],
            STRICT: [summary(3672.0, 0.0005, 0.125), summary(7413.12, 0.0007, 0.1)],
            "aryl-naivereclaim": [summary(3700.0, 0.0005, 0.5), summary(7500.0, 0.0007, 0.5)]}
    per = {p: aggregate(runs[p], seeds) for p in POLICIES}
    per["coverage"] = {"miss_share": 0.001, "band_height_servers": 2.5, "mean_need_servers": 10.0,
                       "inference_servers": 30}
    text = inference_text({"seeds": seeds, "estimates": "lognormal:0.8", "budget": 0.001, "coverage_lead_s": 120.0,
                           "loads": {"servegen": per}})
    # JCT cost per seed: +2% and +4%: mean +3.0% (+2.0%-+4.0%); naive / aryl preemptions per reclaim: 2x and 5x.
    assert "at +3.0% (+2.0%-+4.0%) average JCT against `aryl-reactive`" in text
    assert "makes 3.50x (2.00x-5.00x) the preemptions per reclaimed server" in text
    # naive / strict: 4x and 5x; strict against aryl: 0% and -1% average JCT.
    assert ("and 4.50x (4.00x-5.00x) those of `aryl`'s with `reclaim_protection = strict`, which against `aryl` "
            "moves average JCT by -0.5% (-1.0%-+0.0%) and GPU-hours lost by +0.0%.") in text
    assert "| servegen | `aryl`, `reclaim_protection = strict` | 0.06% (0.05%-0.07%) |" in text
    # aryl-risk against aryl per seed: -1% and 0% average JCT; the same GPU-hours lost.
    assert "`aryl-risk` against `aryl`: average JCT -0.5% (-1.0%-+0.0%), GPU-hours lost +0.0%." in text
    # Over the arrival window, 3x the whole run's share (made up): both are reported.
    assert ("`aryl` leaves 0.06% (0.05%-0.07%) of requests short, 0.18% (0.15%-0.21%) over the arrival window "
            "(`aryl-reactive`: 1.50% (1.00%-2.00%), 4.50% (3.00%-6.00%))") in text
    assert "rose above the band at 0.10% of minutes; the band stood 2.5 servers above the need" in text
    assert "| servegen | `aryl` | 0.06% (0.05%-0.07%) | 0.18% (0.15%-0.21%) |" in text
    assert "1 - `policy.inference_short_budget` = 99.9%" in text
