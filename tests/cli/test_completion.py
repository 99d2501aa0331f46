"""`arylctl completion bash|zsh`: the script, sourced in a real bash, completes what the parser has
(commands, flags, fixed values) and the job ids a real scheduler lists."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from arylctl.cli import build_parser, main
from protos.aryl.v1 import scheduler_pb2
from tests.harness import job_spec, scheduler_stub

BIN = Path(sys.executable).parent


def _script(shell: str, tmp_path: Path) -> Path:
    path = tmp_path / f"arylctl.{shell}"
    with path.open("w") as out:
        assert main(["completion", shell], stdout=out) == 0
    return path


def complete(script: Path, line: str, env: dict[str, str] | None = None) -> list[str]:
    """What TAB offers at the end of ``line`` (a trailing space: a new, empty word)."""
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    program = "\n".join([
        f"source {shlex.quote(str(script))}",
        f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)})",
        f"COMP_CWORD={len(words) - 1}",
        "_arylctl_complete",
        'printf "%s\\n" "${COMPREPLY[@]}"',
    ])
    result = subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60, check=True,
                            env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})})
    return [w for w in result.stdout.splitlines() if w]


def test_commands_flags_and_fixed_values_come_from_the_parser(tmp_path: Path) -> None:
    script = _script("bash", tmp_path)
    assert complete(script, "arylctl su") == ["submit"]
    assert set(complete(script, "arylctl ")) >= {"submit", "jobs", "logs", "demand", "completion"}
    assert set(complete(script, "arylctl demand ")) >= {"set", "get"}
    assert "--idempotency-key" in complete(script, "arylctl submit --id")
    assert complete(script, "arylctl jobs -o ") == ["table", "json", "yaml", "name"]
    assert complete(script, "arylctl submit --restart-policy o") == ["on_failure"]
    assert complete(script, "arylctl completion ") == ["bash", "zsh"]
    # A flag's value is not taken for a command; a free-form value gets no suggestions.
    assert complete(script, "arylctl --server jobs logs --ra") == ["--rank"]
    assert complete(script, "arylctl submit --name ") == []
    # Every flag of every command is offered somewhere: the script is generated, not written by hand.
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if action.help != "==SUPPRESS==":
                assert flag in complete(script, f"arylctl {flag[:2]}") or (flag.startswith("-") and len(flag) == 2)


def test_job_ids_are_completed_from_the_scheduler(scheduler, tmp_path: Path) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        ids = [stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec(f"j{i}")), timeout=10).job.job_id
               for i in range(3)]
    script = _script("bash", tmp_path)
    offered = complete(script, f"arylctl --server {scheduler.address} logs ")
    assert sorted(offered) == sorted(ids)
    assert complete(script, f"arylctl explain {ids[0][:1]}", {"ARYL_SERVER": scheduler.address}) == sorted(
        i for i in ids if i.startswith(ids[0][:1]))



def test_zsh_script_is_the_bash_one_behind_bashcompinit(tmp_path: Path) -> None:
    bash, zsh = _script("bash", tmp_path).read_text(), _script("zsh", tmp_path).read_text()
    assert zsh.endswith(bash) and "bashcompinit" in zsh.removesuffix(bash)
