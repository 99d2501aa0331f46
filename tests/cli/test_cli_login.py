"""``arylctl login`` never writes or chmods through a link at the token path (issue 37, 9b)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.fixtures.cli import run


def test_login_writes_the_token_mode_0600(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = tmp_path / "aryl" / "token"
    token.parent.mkdir(mode=0o700)
    token.write_text("an older and longer token\n")
    token.chmod(0o644)

    code, _, err = run(capsys, "login", "--token", "tok-1", "--file", str(token))

    assert code == 0, err
    assert token.read_text() == "tok-1\n"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


def test_login_refuses_a_symlink_at_the_token_path_and_leaves_its_target_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    target = tmp_path / "someone-elses-file"
    target.write_text("precious\n")
    target.chmod(0o644)
    link = tmp_path / "token"
    link.symlink_to(target)

    code, _, err = run(capsys, "login", "--token", "tok-1", "--file", str(link))

    assert code == 2
    assert "symbolic link" in err and "--file" in err
    assert target.read_text() == "precious\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    assert link.is_symlink()


def test_login_refuses_a_dangling_symlink_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "token"
    link.symlink_to(tmp_path / "created-through-the-link")

    code, _, err = run(capsys, "login", "--token", "tok-1", "--file", str(link))

    assert code == 2, err
    assert not (tmp_path / "created-through-the-link").exists()


def test_login_refuses_a_fifo_without_hanging(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo)

    code, _, err = run(capsys, "login", "--token", "tok-1", "--file", str(fifo))

    assert code == 2 and "not a regular file" in err
