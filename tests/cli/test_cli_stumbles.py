"""A new user's first hour with arylctl (issue 36): every error names a real fix. The TLS hints and the
terminal free of gRPC's own log lines, through the installed console script against a real TLS
scheduler; typos answered with "did you mean", every usage error of a command at once, ``submit --help``
with its defaults, and the restart policy in words."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from protos.aryl.v1 import types_pb2
from tests.harness import details_of

ARYLCTL = Path(sys.executable).parent / "arylctl"  # the console script, installed beside the interpreter

# A log line of gRPC's C core: severity letter, MMDD, time, thread, file:line] (e.g. "I1128 19:35:09.912700 8039
# ssl_transport_security.cc:2563] Handshake failed ...").
GRPC_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]", re.MULTILINE)


def console(*argv: str, drop: tuple[str, ...] = (),
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The console script as a user runs it, without the environment variables that start with ``drop``."""
    base = {k: v for k, v in os.environ.items() if not (drop and k.startswith(drop)) and k != "GRPC_VERBOSITY"}
    return subprocess.run([str(ARYLCTL), *argv], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})}, check=False)


def test_tls_failures_hint_the_real_fix_and_grpc_logs_stay_off_the_terminal(scheduler) -> None:
    # No CA given: the scheduler's certificate cannot be verified.
    unverified = console("--server", scheduler.address, "jobs", drop=("ARYL_TLS_",))
    assert unverified.returncode == 3
    assert "is not signed by a CA arylctl trusts: export ARYL_TLS_CA" in unverified.stderr, unverified.stderr
    assert GRPC_LOG_LINE.search(unverified.stderr) is None, unverified.stderr
    assert unverified.stderr.startswith("error: "), unverified.stderr
    # Plaintext against TLS: the hint says to drop --insecure, never to pass it.
    plaintext = console("--server", scheduler.address, "--insecure", "jobs")
    assert plaintext.returncode == 3
    assert "Leave out --insecure, unset ARYL_INSECURE, and export ARYL_TLS_CA" in plaintext.stderr, plaintext.stderr
    assert "pass --insecure" not in plaintext.stderr
    assert GRPC_LOG_LINE.search(plaintext.stderr) is None, plaintext.stderr
    # A user who asks for gRPC's logs gets them.
    verbose = console("--server", scheduler.address, "jobs", drop=("ARYL_TLS_",), env={"GRPC_VERBOSITY": "INFO"})
    assert GRPC_LOG_LINE.search(verbose.stderr) is not None, verbose.stderr


def test_slurm_and_kubernetes_spellings_and_typos_get_did_you_mean() -> None:
    # `submit --gpus` (Slurm's, and what a Kubernetes user reaches for): the flag that exists, and every
    # other error of the command line at once (the missing --name no longer hides behind it).
    typed = console("submit", "--gpus", "2", "--", "python3", "train.py")
    assert typed.returncode == 2
    lines = typed.stderr.splitlines()
    assert lines[0].startswith("usage: arylctl submit"), typed.stderr  # the command's usage, not the top level's
    assert "arylctl submit: error: unrecognized argument --gpus (did you mean --gpus-per-worker?" in typed.stderr
    assert "arylctl submit: error: submit needs a job name: --name NAME" in typed.stderr
    both = console("submit", "--job-name", "x", "python3", "train.py")
    assert "unrecognized argument --job-name (did you mean --name?)" in both.stderr, both.stderr
    assert "unrecognized arguments: python3 train.py; a job's command goes after --" in both.stderr
    assert "submit needs a command" in both.stderr
    command = console("sumbit")
    assert command.returncode == 2 and "invalid choice: 'sumbit' (did you mean 'submit'?" in command.stderr
    flag = console("jobs", "--stat", "pending")
    assert flag.returncode == 2 and "arylctl jobs: error: unrecognized argument --stat (did you mean --state?)" in (
        flag.stderr)
    sub = console("queues", "creat", "vision")
    assert "invalid choice: 'creat' (did you mean 'create'?" in sub.stderr, sub.stderr
    choice = console("submit", "--name", "x", "--restart-policy", "on-failure", "--", "a")
    assert "invalid choice: 'on-failure' (did you mean 'on_failure'?" in choice.stderr, choice.stderr


def test_every_bad_value_of_a_command_line_is_reported_at_once() -> None:
    bad = console("submit", "--min-workers", "two", "--max-workers", "x", "--gpus", "2", "--", "python3", "t.py")
    assert bad.returncode == 2
    errors = [line for line in bad.stderr.splitlines() if line.startswith("arylctl submit: error: ")]
    assert [e.split(": error: ", 1)[1].split(":")[0].split(" (")[0] for e in errors] == [
        "argument --min-workers", "argument --max-workers", "unrecognized argument --gpus", "submit needs a job name"]
    state = console("jobs", "--state", "runing")
    assert "unknown job state 'runing' (did you mean 'running'? choose from pending" in state.stderr, state.stderr


def test_submit_without_name_or_command_names_both(capsys) -> None:
    from arylctl.cli import main

    code = main(["--server", "127.0.0.1:9", "submit", "--min-workers", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: submit needs a job name" in err and "error: submit needs a command" in err, err


def test_submit_help_shows_every_default() -> None:
    from arylctl.cli import _global_options_parser, build_parser

    parser = build_parser()
    submit = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["submit"]
    global_options = set(_global_options_parser()._option_string_actions)
    lacking = [action.option_strings[-1] for action in submit._actions
               if action.option_strings and action.nargs != 0 and action.help != argparse.SUPPRESS
               and not set(action.option_strings) & global_options
               and not re.search(r"\b(default|required)\b", action.help or "", re.IGNORECASE)]
    assert lacking == [], f"submit options whose help names no default: {lacking}"
    text = submit.format_help()
    assert "GPUs each worker gets (default: 1)" in " ".join(text.split())


@pytest.mark.parametrize(("policy", "restarts", "text"), [
    (types_pb2.RESTART_POLICY_ON_FAILURE, 0, "never restarted: a failure ends it (ON_FAILURE, max 0)"),
    (types_pb2.RESTART_POLICY_UNSPECIFIED, 0, "never restarted: a failure ends it (ON_FAILURE, max 0)"),
    (types_pb2.RESTART_POLICY_NEVER, 3, "never restarted: a failure ends it (NEVER)"),
    (types_pb2.RESTART_POLICY_ON_FAILURE, 1, "restarted on failure, once (ON_FAILURE, max 1)"),
    (types_pb2.RESTART_POLICY_ON_FAILURE, 3, "restarted on failure, up to 3 times (ON_FAILURE, max 3)"),
])
def test_restart_policy_reads_as_what_it_means(policy: types_pb2.RestartPolicy, restarts: int, text: str) -> None:
    from arylctl.cli import restart_text

    assert restart_text(types_pb2.JobSpec(restart_policy=policy, max_restarts=restarts)) == text


def test_loader_variables_are_refused_at_submission(scheduler_factory, capsys) -> None:
    """``--env LD_PRELOAD=...`` is refused by SubmitJob (INVALID_ARGUMENT naming the variable and the
    settings), not only by the agent when the job is to start; SubmitJobs likewise. A scheduler with
    security.allow_loader_env takes it."""
    import grpc

    from arylctl.cli import main
    from protos.aryl.v1 import scheduler_pb2
    from tests.harness import job_spec, scheduler_stub

    strict = scheduler_factory()
    code = main(["--server", strict.address, "submit", "--name", "ld", "--env", "LD_PRELOAD=/tmp/x.so", "--",
                 "python3", "-c", "print(1)"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "spec.env['LD_PRELOAD']: is a dynamic-loader variable (LD_*), which the agents refuse" in err, err
    assert "security.allow_loader_env" in err
    channel, stub = scheduler_stub(strict.address)
    with channel:
        spec = job_spec("ld")
        spec.env["LD_LIBRARY_PATH"] = "/opt/lib"
        with pytest.raises(grpc.RpcError) as refused:
            stub.SubmitJobs(scheduler_pb2.SubmitJobsRequest(jobs=[scheduler_pb2.SubmitJobRequest(spec=spec)]))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert details_of(refused.value).startswith("jobs[0].spec.env['LD_LIBRARY_PATH']")
        assert stub.ListJobs(scheduler_pb2.ListJobsRequest()).jobs == []
    strict.stop()  # one scheduler at a time leads a PostgreSQL database
    allowing = scheduler_factory(security={"allow_loader_env": True})
    channel, stub = scheduler_stub(allowing.address)
    with channel:
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job
        assert job.spec.env["LD_LIBRARY_PATH"] == "/opt/lib"


def test_an_expired_client_certificate_is_named_with_its_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The scheduler's TLS refuses an expired client certificate at the handshake: the client only sees the
    # socket closed, so arylctl reads ARYL_TLS_CERT's notAfter itself.
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from arylctl import cli

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "user:alice")])
    now = datetime.datetime.now(datetime.UTC)

    def certificate(not_after: datetime.datetime) -> Path:
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=2))
                .not_valid_after(not_after).sign(key, hashes.SHA256()))
        path = tmp_path / f"client-{not_after.timestamp():.0f}.crt"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    old = certificate(now - datetime.timedelta(days=1))
    monkeypatch.setenv("ARYL_TLS_CERT", str(old))
    hint = cli._tls_hint("Socket closed", "sched:50051", False)
    assert hint is not None and f"{old} (ARYL_TLS_CERT) expired at" in hint and "arylctl certs renew DIR" in hint
    monkeypatch.setenv("ARYL_TLS_CERT", str(certificate(now + datetime.timedelta(days=1))))
    hint = cli._tls_hint("Socket closed", "sched:50051", False)
    assert hint is not None and "expired" not in hint and "TLS handshake" in hint
