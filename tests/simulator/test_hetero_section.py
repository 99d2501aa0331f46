"""The heterogeneity section without the Sia artifact: it says how to get it and run it (issue 33 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.heterogeneity import gate_rows, heterogeneity_section
from simulator.hetero_inference import main


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
