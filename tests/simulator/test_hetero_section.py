"""The heterogeneity section without the Sia artifact: it says how to get it and run it (issue 33 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.heterogeneity import gate_rows, heterogeneity_section, model_rows
from simulator.hetero_inference import by_model_over_seeds, main


def test_without_the_artifact_the_section_says_how(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SIA_REF_GIT", raising=False)
    text, figures = heterogeneity_section(tmp_path, tmp_path, {})
    assert figures == {"gate": {}, "beyond": {}, "needs": "SIA_REF_GIT"}
    assert "git clone --bare https://github.com/siasosp23/artifacts.git" in text
    assert "python -m evaluation --only heterogeneity" in text
    assert list(tmp_path.iterdir()) == []   # nothing written, nothing of the artifact


def test_the_comparison_says_how_without_the_artifact(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SIA_REF_GIT", raising=False)
    assert main([]) == 2
    assert "python -m simulator.hetero_inference" in capsys.readouterr().err


def test_the_gate_table_and_its_summaries() -> None:
    results = {"saturn/workload-2": {
        "sia": {"ours": 2638.8, "authors": 2574.0, "diff": 2638.8 / 2574.0 - 1, "restarts_per_job": 4.28,
                "authors_restarts_per_job": 4.23, "decision_mean_ms": 128.0, "decision_p95_ms": 368.0,
                "solve_mean_ms": 41.0, "solve_p95_ms": 180.0},
        "gavel": {"ours": 6390.0, "authors": 6181.2, "diff": 6390.0 / 6181.2 - 1, "restarts_per_job": 4.44,
                  "authors_restarts_per_job": -1.0, "decision_mean_ms": 27.0, "decision_p95_ms": 78.0}}}
    rows, summary, details = gate_rows(results)
    assert summary == {"saturn/workload-2": {"sia": {"ours": 2638.8, "authors": 2574.0},
                                             "gavel": {"ours": 6390.0, "authors": 6181.2}}}
    assert details["saturn/workload-2"]["sia"]["solve_mean_ms"] == 41.0
    assert "ours" not in details["saturn/workload-2"]["gavel"]
    # 2638.8 / 2574.0 = 1.02517; 6390.0 / 6181.2 = 1.03378; the authors' restarts unknown print as "-"
    assert rows[2] == "| saturn/workload-2 | sia | 0.733 | 0.715 | +2.5% | 4.28 / 4.23 | 128 / 368 | 41 / 180 |"
    assert rows[3] == "| saturn/workload-2 | gavel | 1.775 | 1.717 | +3.4% | 4.44 / - | 27 / 78 | - |"


def _by_model(bert: tuple[float, float], cifar: tuple[float, float]) -> dict[str, dict[str, float]]:
    return {"bert": {"jobs": 2, "avg_jct_s": bert[0], "avg_first_wait_s": bert[1]},
            "cifar10": {"jobs": 6, "avg_jct_s": cifar[0], "avg_first_wait_s": cifar[1]}}


def test_the_figures_per_model_are_means_over_seeds() -> None:
    runs = [{"by_model": _by_model((3600.0, 60.0), (900.0, 0.0))},
            {"by_model": _by_model((7200.0, 180.0), (1800.0, 30.0))}]
    assert by_model_over_seeds(runs) == _by_model((5400.0, 120.0), (1350.0, 15.0))


def test_the_table_per_model_and_what_each_model_adds_against_sia() -> None:
    figures = {policy: {"by_model": _by_model(bert, cifar)} for policy, bert, cifar in (
        ("sia", (3600.0, 60.0), (1800.0, 120.0)),
        ("gavel", (7200.0, 600.0), (3600.0, 600.0)),
        ("aryl-noloan", (10800.0, 1200.0), (1200.0, 60.0)),
        ("aryl", (3600.0, 0.0), (900.0, 0.0)))}
    lines = model_rows({"philly/workload-3": figures})
    assert "| philly/workload-3 | bert | 2 | 1.000 / 1.0 | 2.000 / 10.0 | 3.000 / 20.0 | 1.000 / 0.0 |" in lines
    assert "| philly/workload-3 | cifar10 | 6 | 0.500 / 2.0 | 1.000 / 10.0 | 0.333 / 1.0 | 0.250 / 0.0 |" in lines
    # 8 jobs: bert adds 2 x (3 - 1) h / 8 = +0.5 h a job, cifar10 6 x (1/3 - 1/2) h / 8 = -0.125 h; +0.375 h in all
    assert lines[-1] == ("- philly/workload-3: `aryl-noloan` +0.375 h a job against `sia`; bert adds +0.500 h (its "
                         "jobs wait 20.0 min for their first start, against 1.0), cifar10 -0.125 h (its jobs wait 1.0 "
                         "min for their first start, against 2.0).")
