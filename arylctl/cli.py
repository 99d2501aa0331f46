"""``arylctl``: the command line over the scheduler's gRPC API (kubectl/squeue-like).

Every command is a thin layer over :class:`arylctl.client.ArylClient`: it parses flags, makes
one or a few calls, and prints the result as an aligned table (default), or as JSON/YAML
(``-o json|yaml``: the protobuf messages as ``MessageToDict`` writes them with the proto field
names and every field, zero values included; a list for list commands). It never decides anything
and never retries a call; the one exception is ``events --follow``, a stream meant to outlive a
scheduler restart, which reconnects (with ``aryl_common.backoff.Backoff``) and resumes after the
last event it printed.

A job as ``-o json|yaml`` prints it (``arylctl job ID``, ``submit``, ``cancel``) is a valid
``submit -f`` file: its ``spec`` is submitted, in the protobuf JSON spelling
(``arylctl.spec.normalize_job_spec_mapping``), and the job's read-only fields (``job_id``,
``state``, ``events``, ...) are ignored with a note on stderr.

Exit codes (those of every Aryl program, ``aryl_common.entry``): 0 success; 1 the server refused or
failed (``error: <server message> (CODE)`` on stderr), or an unexpected error (a bug: one line,
``--debug`` or ``ARYL_DEBUG=1`` adds the traceback); 2 bad usage or INVALID_ARGUMENT; 3 the
scheduler is unreachable; 130 interrupted.
OUT_OF_RANGE (a read past the end of a worker's log) is 1, not 2: ``logs`` reads from the start, the
end (``--tail``) or where the previous answer ended, so it meets one only when the log changed under
it (the rank moved to a server with a shorter log); the command line is fine and running it again
works, which 2 would deny.
An RPC failure never prints a Python traceback.

Examples::

    arylctl submit --name bert --gpus-per-worker 8 --min-workers 1 --max-workers 4 -- python train.py
    arylctl submit -f job.yaml --priority 5
    arylctl jobs --state pending --state running
    arylctl events --job 42 --follow
    arylctl job 42 -o yaml > job.yaml && arylctl submit -f job.yaml
    arylctl -o json cluster
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import grpc

from aryl_common.entry import package_version, run_guarded
from aryl_common.security import ENV_INSECURE, ENV_TLS_CERT, SECURE_BY_DEFAULT, ClientSecurity
from arylctl import certs, completion
from arylctl.args import (
    ArylArgumentParser,
    add_global_options,
    bad_values,
    chosen_parser,
    report_usage_errors,
    unknown_arguments,
)
from arylctl.args import global_options_parser as _global_options_parser  # the name it had here
from arylctl.client import ArylClient, ArylError, default_address
from arylctl.commands import add_commands
from arylctl.commands.explain import describe_explanation
from arylctl.commands.jobs import job_elapsed, restart_text
from arylctl.commands.local import run_login
from arylctl.output import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    NAME_COMMANDS,
    PROG,
    Output,
    UsageError,
    elapsed_text,
    enum_name,
    format_table,
    printable,
)
from arylctl.spec import submit_directory, submit_spec_mapping, submit_spec_problems

# The entry point and the parser are defined here; the other names moved to arylctl.output, arylctl.spec,
# arylctl.args and arylctl.commands, and stay importable from here.
__all__ = [
    "UsageError",
    "_global_options_parser",
    "build_parser",
    "describe_explanation",
    "elapsed_text",
    "enum_name",
    "format_table",
    "job_elapsed",
    "main",
    "parse_args",
    "printable",
    "restart_text",
    "submit_directory",
    "submit_spec_mapping",
]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: ``--version`` and the global options, then every command, each registered by
    its module (``arylctl.commands.REGISTRATIONS``) through ``add``, which gives it the global options too."""
    parser = ArylArgumentParser(
        prog=PROG,
        description="Command line for the Aryl elastic GPU scheduler.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    add_global_options(parser, defaults=True)
    common = ArylArgumentParser(add_help=False, allow_abbrev=False)
    add_global_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    def add(name: str, handler: Callable[..., int] | None, help_text: str, **kwargs: Any) -> argparse.ArgumentParser:
        sub = commands.add_parser(
            name, help=help_text, description=help_text, parents=[common], allow_abbrev=False, **kwargs
        )
        if handler is not None:
            sub.set_defaults(handler=handler)
        return sub

    add_commands(add, common)
    return parser


def _split_command(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split at the first ``--``: what follows is the job's argv, untouched by argparse."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line parsed; every usage error found is reported at once (one ``error:`` line each,
    after the usage of the command that has them) and exits 2, as argparse does for one."""
    parser = build_parser()
    own, command = _split_command(argv)
    args, unknown = parser.parse_known_args(own)
    args.command = command
    chosen = chosen_parser(parser, args)
    problems = bad_values(args) + unknown_arguments(unknown, chosen, args.command_name)
    if command and args.command_name != "submit":
        problems.append(f"{args.command_name} takes no arguments after --")
    if args.output == "name" and args.command_name not in NAME_COMMANDS:
        problems.append(f"-o name applies only to {' and '.join(sorted(NAME_COMMANDS))}")
    if problems and args.command_name == "submit" and not args.file:
        problems += submit_spec_problems({"name": args.name, "command": command})  # the rest of its errors
    if problems:
        report_usage_errors(chosen, problems)
    if args.command_name == "jobs":
        args.states = [state for states in args.state_lists or () for state in states]
    return args


def _plaintext(args: argparse.Namespace) -> bool:
    """Whether arylctl talks plaintext: ``--insecure`` or ``ARYL_INSECURE`` (as ``ClientSecurity.from_env``)."""
    flag = os.environ.get(ENV_INSECURE, "").lower()
    return bool(args.insecure) or (flag in ("1", "true", "yes") if flag else not SECURE_BY_DEFAULT)


def _tls_hint(message: str, address: str, plaintext: bool) -> str | None:
    """The fix for a connection that failed at TLS, or None when ``message`` is not about TLS."""
    if not any(word in message for word in ("ssl", "SSL", "handshake", "Socket closed")):
        return None
    tls_env = "ARYL_TLS_CA, ARYL_TLS_CERT and ARYL_TLS_KEY (absolute paths: the cluster's ca.crt and a client " \
              "certificate and key, as 'arylctl certs init' printed them; docs/security.md)"
    if plaintext:  # a TLS scheduler closes a plaintext connection at once
        return (f"hint: arylctl spoke plaintext (--insecure or ARYL_INSECURE) and {address} closed the connection: "
                f"a scheduler with TLS does that. Leave out --insecure, unset ARYL_INSECURE, and export {tls_env}")
    if "CERTIFICATE_VERIFY_FAILED" in message:
        return (f"hint: the certificate of {address} is not signed by a CA arylctl trusts: export {tls_env}; "
                "ARYL_TLS_CA must be the CA that signed the scheduler's certificate")
    expired = _client_certificate_expiry()
    if expired is not None:  # the scheduler's TLS refuses it at the handshake: it closes the socket
        path, not_after = expired
        return (f"hint: the client certificate {path} (ARYL_TLS_CERT) expired at {not_after:%Y-%m-%d %H:%M:%S} UTC; "
                "a development CA re-issues its certificates with 'arylctl certs renew DIR' (same keys), "
                "otherwise ask the cluster's admin for a new one (docs/security.md)")
    return (f"hint: the TLS handshake with {address} failed: export {tls_env}; for a scheduler started with "
            "--insecure (plaintext), pass --insecure or set ARYL_INSECURE=1 instead")


def _client_certificate_expiry() -> tuple[str, dt.datetime] | None:
    """(path, notAfter) of the client certificate ARYL_TLS_CERT names, when it has expired; None otherwise
    (none set, unreadable, or still valid)."""
    path = os.environ.get(ENV_TLS_CERT)
    if not path:
        return None
    try:
        from cryptography import x509

        not_after = x509.load_pem_x509_certificate(Path(path).read_bytes()).not_valid_after_utc
    except (OSError, ValueError):
        return None
    return (path, not_after) if not_after <= dt.datetime.now(dt.UTC) else None


def _report_rpc_error(exc: ArylError, address: str, timeout: float, stderr: TextIO, *, plaintext: bool = False) -> int:
    print(f"error: {exc.message} ({exc.code.name})", file=stderr)
    if exc.code == grpc.StatusCode.UNAVAILABLE and not exc.from_scheduler:
        hint = _tls_hint(exc.message, address, plaintext)
        if hint is not None:
            print(hint, file=stderr)
            return EXIT_UNAVAILABLE
        print(
            f"hint: no scheduler answered at {address}; check --server or the ARYL_SERVER environment variable",
            file=stderr,
        )
        return EXIT_UNAVAILABLE
    if exc.code == grpc.StatusCode.UNAUTHENTICATED:
        print("hint: log in with 'arylctl login' (the token is read from stdin), or set ARYL_TOKEN", file=stderr)
    if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        print(f"hint: the call took longer than {timeout:g}s; raise --timeout if the scheduler is busy", file=stderr)
    if exc.code == grpc.StatusCode.OUT_OF_RANGE:
        print("hint: the log became shorter than where arylctl was reading (the worker may have moved to "
              "another server); run the command again to read it from the start", file=stderr)
    return EXIT_USAGE if exc.code == grpc.StatusCode.INVALID_ARGUMENT else EXIT_FAILED


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run one arylctl command; returns the exit code (see the module docstring).

    ``stdout``/``stderr`` (default: the process's) receive the command's results and its
    errors; argparse's usage and help text always go to the process's streams.
    """
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    err = stderr or sys.stderr
    if args.command_name == "completion":  # no scheduler involved
        (stdout or sys.stdout).write(completion.script(build_parser(), args.shell))
        return EXIT_OK
    if args.command_name in ("login", "certs"):  # local files only
        return run_guarded(PROG, lambda: _run_local(args, stdout or sys.stdout, err), debug=args.debug, stderr=err)
    return run_guarded(PROG, lambda: _run(args, stdout or sys.stdout, err), debug=args.debug, stderr=err)


def _run(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """One command, its expected failures reported as ``error: ...`` lines; the unexpected ones
    (bugs) reach ``main``'s handler."""
    address = args.server or default_address()
    out = Output(args.output, stdout, stderr)
    try:
        security = ClientSecurity(insecure=True) if args.insecure else None
        with ArylClient(address, timeout=args.timeout, security=security) as client:
            return args.handler(client, args, out)
    except ArylError as exc:
        return _report_rpc_error(exc, address, args.timeout, stderr, plaintext=_plaintext(args))
    except UsageError as exc:
        print(f"error: {exc}", file=stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `arylctl jobs | head`: the reader left; not an error worth a trace
        _silence_stdout()
        return EXIT_OK


def _run_local(args: argparse.Namespace, stdout: TextIO, stderr: TextIO) -> int:
    """``login`` and ``certs init|add``: files on this machine, no scheduler."""
    if args.command_name == "login":
        return run_login(args, stdout, stderr)
    return certs.run_command(args, stdout, stderr)


def _silence_stdout() -> None:
    # Python flushes stdout again at exit and would report the broken pipe; point it at devnull.
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":  # pragma: no cover - `python -m arylctl.cli`
    sys.exit(main())
