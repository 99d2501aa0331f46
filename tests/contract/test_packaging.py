"""Installing Aryl prints no packaging warnings: the licence is an SPDX expression with its file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_metadata_builds_without_licence_warnings(tmp_path: Path) -> None:
    # The project's metadata alone (no packages are needed to read it), built by the same backend pip uses.
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    (tmp_path / "meta").mkdir()
    result = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         "import setuptools.build_meta as backend; print(backend.prepare_metadata_for_build_wheel('meta'))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "license" not in result.stderr.lower(), result.stderr
    metadata = next((tmp_path / "meta").glob("*.dist-info")) / "METADATA"
    text = metadata.read_text()
    assert "License-Expression: Apache-2.0" in text
    assert "License-File: LICENSE" in text
