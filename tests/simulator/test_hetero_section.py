"""The heterogeneity section without the Sia artifact: it says how to get it and run it (issue 33 item 5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evaluation.heterogeneity import heterogeneity_section
from simulator.hetero_inference import main


def test_without_the_artifact_the_section_says_how(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SIA_REF_GIT", raising=False)
    text, figures = heterogeneity_section(tmp_path, tmp_path, {})
    assert figures == {"beyond": {}, "needs": "SIA_REF_GIT"}
    assert "git clone --bare https://github.com/siasosp23/artifacts.git" in text
    assert "python -m evaluation --only heterogeneity" in text
    assert list(tmp_path.iterdir()) == []   # nothing written, nothing of the artifact


def test_the_comparison_says_how_without_the_artifact(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("SIA_REF_GIT", raising=False)
    assert main([]) == 2
    assert "python -m simulator.hetero_inference" in capsys.readouterr().err
