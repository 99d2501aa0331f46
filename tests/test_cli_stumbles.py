"""A new user's first hour with arylctl (issue 36): every error names a real fix. The TLS hints and the
terminal free of gRPC's own log lines, through the installed console script against a real TLS
scheduler; typos answered with "did you mean", every usage error of a command at once, ``submit --help``
with its defaults, and the restart policy in words."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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
