"""``arylctl submit`` warns (stderr, never refusing) when the command line looks like it carries a secret,
pointing at secrets by name (issue 37, 9d); the value itself is never echoed."""

from __future__ import annotations

import json

import pytest

from arylctl.argv_secrets import secret_looking_arguments
from tests.fixtures.cli import run


@pytest.mark.parametrize(("command", "named"), [
    (["python", "train.py", "--password", "hunter2"], "argument 2 (--password)"),
    (["python", "train.py", "--hf-token=hf_abc"], "argument 2 (--hf-token)"),
    (["env", "HF_TOKEN=abc123", "python", "train.py"], "argument 1 (HF_TOKEN=...)"),
    (["sh", "-c", "run", "AWS_SECRET_ACCESS_KEY=zz"], "argument 3 (AWS_SECRET_ACCESS_KEY=...)"),
    (["python", "train.py", "--apiKey", "k-123"], "argument 2 (--apiKey)"),
    (["python", "load.py", "--db", "postgresql://me:pw@db/x"], "argument 3 (a URL with a password)"),
    (["python", "push.py", "ghp_" + "a" * 36], "argument 2 (a GitHub token)"),
])
def test_secret_looking_arguments_are_named_without_their_values(command: list[str], named: str) -> None:
    assert secret_looking_arguments(command) == [named]


@pytest.mark.parametrize("command", [
    ["torchrun", "--nproc_per_node", "8", "train.py", "--max-tokens", "512", "--tokenizer", "gpt2"],
    ["python", "train.py", "--password-file", "/run/secrets/db"],    # where the secret is, not the secret
    ["python", "train.py", "--token", "$HF_TOKEN"],                  # expanded in the worker
    ["python", "train.py", "--api-key", "aryl-secret:team"],         # a reference
    ["python", "train.py", "--use_auth_token", "true", "OMP_NUM_THREADS=4"],
])
def test_ordinary_command_lines_raise_no_alarm(command: list[str]) -> None:
    assert secret_looking_arguments(command) == []


def test_submit_warns_on_stderr_and_still_submits(scheduler, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--server", scheduler.address, "-o", "json", "submit", "--name", "leaky",
                         "--", "python", "train.py", "--password", "hunter2")

    assert code == 0, err
    assert json.loads(out)["spec"]["name"] == "leaky"
    assert "warning:" in err and "argument 2 (--password)" in err
    assert "aryl-secret:" in err and "docs/security.md" in err
    assert "hunter2" not in err


def test_submit_of_an_ordinary_command_says_nothing_of_secrets(scheduler, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--server", scheduler.address, "submit", "--name", "fine", "--env",
                       "HF_TOKEN=aryl-secret:hf", "--", "python", "train.py", "--max-tokens", "512")

    assert code == 0, err
    assert "secret" not in err
