"""How every Aryl program ends when it cannot go on: one line on stderr that says what is wrong and
what to do, and an exit status a script can act on, never a Python traceback unless asked for.

Exit statuses, the same for every entry point (``aryl-scheduler``, ``aryl-agent``, ``aryl-router``,
``arylctl``, ``aryl-sim``, ``aryl-demo``):

- 0: success;
- 1: the work failed (a request the scheduler refused, a demo that saw failed requests) or an
  unexpected error, i.e. a bug (its type and message are printed; ``--debug`` shows where);
- 2: bad input or configuration: a flag, a config key, a file, a listen address that is taken
  (the fix is in what the program was told);
- 3: a dependency cannot be reached: the database, the scheduler, the GPU driver (the fix is in
  the world around the program: start it, or point the program at the right one);
- 130: interrupted (Ctrl-C).

``--debug`` (every entry point) or ``ARYL_DEBUG=1`` prints the traceback before the one line; the
exit status stays the same.

Nouns: a *fatal error* (``FatalError``) is a typed exception a program raises when it cannot go
on; its class carries the exit status and its message is the line the user reads. This module
never decides what went wrong from an exception's text: each program translates the failures it
knows (a taken port, an unreachable database) into ``BadInput`` or ``Unreachable`` where it meets
them.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Callable
from typing import ClassVar, Final, TextIO

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_BAD_INPUT: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_INTERRUPTED: Final = 130
DEBUG_ENV_VAR: Final = "ARYL_DEBUG"
PACKAGE: Final = "aryl"


class FatalError(Exception):
    """The program cannot go on; ``str(exc)`` says what is wrong and what to do, in one line."""

    exit_status: ClassVar[int] = EXIT_FAILED


class BadInput(FatalError):
    """A flag, config key, file or address the program was given is wrong (exit 2)."""

    exit_status = EXIT_BAD_INPUT


class Unreachable(FatalError):
    """A dependency (database, scheduler, GPU driver) cannot be reached (exit 3)."""

    exit_status = EXIT_UNREACHABLE


def package_version() -> str:
    """The installed ``aryl`` distribution's version (``unknown`` when run from an uninstalled tree)."""
    try:
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def add_standard_flags(parser: argparse.ArgumentParser) -> None:
    """``--version`` and ``--debug``, the flags every entry point has."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    add_debug_flag(parser)


def add_debug_flag(parser: argparse.ArgumentParser, *, default: object = False) -> None:
    parser.add_argument(
        "--debug", action="store_true", default=default,
        help=f"print the traceback of a fatal error (also {DEBUG_ENV_VAR}=1)",
    )


def debug_requested(flag: bool = False) -> bool:
    """``--debug`` was given, or ``ARYL_DEBUG`` is set to something other than empty/0/false/no."""
    return flag or os.environ.get(DEBUG_ENV_VAR, "").strip().lower() not in ("", "0", "false", "no")


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of spaces folded: a fatal error is one line."""
    return " ".join(text.split())


def run_guarded(
    prog: str, body: Callable[[], int], *, debug: bool = False, stderr: TextIO | None = None
) -> int:
    """``body()``'s exit status, or the status of the exception that ended it, printed as one line
    ``<prog>: <message>`` (see the module docstring). ``debug`` (or ``$ARYL_DEBUG``) adds the traceback."""
    err = stderr or sys.stderr
    try:
        return body()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except FatalError as exc:
        failure: Exception = exc
        status, message = exc.exit_status, one_line(str(exc))
    except Exception as exc:  # noqa: BLE001 - the last line of defence: a bug, reported in one line
        failure = exc
        status = EXIT_FAILED
        message = (f"unexpected error: {type(exc).__name__}: {one_line(str(exc))} (a bug; rerun with --debug "
                   f"or {DEBUG_ENV_VAR}=1 for the traceback and report it)")
    if debug_requested(debug):
        traceback.print_exception(failure, file=err)
    print(f"{prog}: {message}", file=err)
    return status
