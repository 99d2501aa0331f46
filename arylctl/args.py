"""``arylctl``'s argument types and its parser: the types check one value each and say what they expected;
:class:`ArylArgumentParser` reports every bad value of a command line at once, answers a mistyped option or
choice with the closest one, and knows the global options every command accepts before and after it.

What this module must never do: call the scheduler, or read files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from aryl_common.entry import add_debug_flag
from arylctl.client import DEFAULT_ADDRESS
from arylctl.output import EXIT_USAGE, PROG, enum_name
from arylctl.spec import parse_deadline
from protos.aryl.v1 import types_pb2

# What registers a command: ``add(name, handler, help, **parser_kwargs)`` returns the command's parser
# (built by ``arylctl.cli.build_parser``, with the global options as a parent).
AddCommand = Callable[..., argparse.ArgumentParser]


def job_states(text: str) -> list[int]:
    states = []
    for name in filter(None, (part.strip() for part in text.split(","))):
        try:
            states.append(types_pb2.JobState.Value("JOB_STATE_" + name.upper()))
        except ValueError:
            names = [enum_name(types_pb2.JobState, v).lower() for v in types_pb2.JobState.values() if v]
            close = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise argparse.ArgumentTypeError(
                f"unknown job state {name!r} ({hint}choose from {', '.join(names)})") from None
    return states


def pool(text: str) -> int:
    try:
        return types_pb2.Pool.Value("POOL_" + text.upper())
    except ValueError:
        raise argparse.ArgumentTypeError(f"unknown pool {text!r} (choose from training, inference)") from None


def env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def deadline_time(text: str) -> dt.datetime:
    try:
        return parse_deadline(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def positive(text: str) -> float:
    value = non_negative(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


UINT32_MAX: Final = 2**32 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def uint32(text: str) -> int:
    """A count the API carries as uint32 (workers, GPUs, servers, a rank)."""
    value = count(text)
    if value > UINT32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {UINT32_MAX}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = count(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def int32(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not INT32_MIN <= value <= INT32_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer from {INT32_MIN} to {INT32_MAX}, got {text!r}")
    return value


# What users of Slurm and Kubernetes type, and arylctl's flag for it: `submit --gpus 2` is answered with
# the flag that exists (and what it means here) instead of the top-level usage.
FLAG_ALIASES: Final[Mapping[str, tuple[str, str]]] = {
    **dict.fromkeys(("--gpus", "--gres", "--gpus-per-node", "--gpus-per-task", "--gpu", "--nvidia.com/gpu"),
                    ("--gpus-per-worker", "GPUs of each worker; the number of workers is --min-workers/--max-workers")),
    **dict.fromkeys(("--nodes", "-N", "--ntasks", "-n", "--replicas", "--workers", "--num-workers", "--nproc"),
                    ("--min-workers", "and --max-workers for an elastic job; GPUs of each: --gpus-per-worker")),
    **dict.fromkeys(("--job-name", "-J"), ("--name", "")),
    **dict.fromkeys(("--partition", "-p", "--namespace"), ("--queue", "")),
    **dict.fromkeys(("--time", "-t", "--time-limit", "--active-deadline-seconds"), ("--max-runtime", "in seconds")),
    **dict.fromkeys(("--export",), ("--env", "NAME=VALUE, repeatable")),
    **dict.fromkeys(("--workdir", "-D", "--working-dir", "--cwd"), ("--chdir", "")),
}


def did_you_mean(option: str, parser: argparse.ArgumentParser) -> str:
    """`` (did you mean --x?)`` for an option ``parser`` does not know, or "" when nothing is close: a
    Slurm or Kubernetes spelling (``FLAG_ALIASES``), an option it begins (``--stat``: ``--state``), or
    one spelled alike."""
    known = [o for o in parser._option_string_actions if o.startswith("-")]  # argparse's own table of options
    name = option.split("=", 1)[0]
    alias = FLAG_ALIASES.get(name)
    if alias is not None and alias[0] in known:
        return f" (did you mean {alias[0]}?{' ' + alias[1] if alias[1] else ''})"
    begun = sorted(o for o in known if o.startswith(name) and len(name) > 2)
    close = begun or difflib.get_close_matches(name, known, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


# Where ``ArylArgumentParser.parse_known_args`` leaves the bad values it met (argparse stops at the first).
_BAD_VALUES = "_aryl_bad_values"


class ArylArgumentParser(argparse.ArgumentParser):
    """argparse that answers a mistyped choice (a command, ``--restart-policy``...) with the closest one,
    and that reports every bad value of a command line at once: a value its type refuses is noted and
    parsing goes on, and ``parse_args`` reports them all with the unrecognised arguments (argparse's own
    stops at the first). Whoever calls ``parse_known_args`` reports ``bad_values(namespace)`` itself."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._bad_values: list[str] = []
        parsed, extras = super().parse_known_args(args, namespace)
        setattr(parsed, _BAD_VALUES, [*getattr(parsed, _BAD_VALUES, []), *self._bad_values])  # a command's too
        return parsed, extras

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, unknown = self.parse_known_args(args, namespace)
        problems = bad_values(parsed) + unknown_arguments(unknown, chosen_parser(self, parsed), "")
        if problems:
            report_usage_errors(chosen_parser(self, parsed), problems)
        return parsed

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            self._bad_values.append(str(exc))  # reported with every other error of the command line
            return None

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in action.choices], n=1, cutoff=0.6)
            if close:
                choices = ", ".join(repr(str(c)) for c in action.choices)
                raise argparse.ArgumentError(
                    action, f"invalid choice: {value!r} (did you mean {close[0]!r}? choose from {choices})")
        super()._check_value(action, value)


def bad_values(args: argparse.Namespace) -> list[str]:
    """The values ``ArylArgumentParser`` refused while parsing ``args`` (each "argument --x: why")."""
    return list(getattr(args, _BAD_VALUES, []))


def report_usage_errors(parser: argparse.ArgumentParser, problems: Sequence[str]) -> None:
    """``parser``'s usage, then one ``error:`` line per problem; exits 2, as argparse does for one."""
    parser.print_usage(sys.stderr)
    parser.exit(EXIT_USAGE, "".join(f"{parser.prog}: error: {problem}\n" for problem in problems))


def chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command's own parser that ``args`` came through, e.g. ``queues create``'s."""
    while True:
        for action in parser._actions:  # argparse keeps its subcommands there
            if isinstance(action, argparse._SubParsersAction):
                chosen = getattr(args, action.dest or "", None)
                if chosen in action.choices:
                    parser = action.choices[chosen]
                    break
        else:
            return parser


def unknown_arguments(unknown: Sequence[str], parser: argparse.ArgumentParser, command: str) -> list[str]:
    """One problem a line for what ``parser`` did not recognise: each option with what the user may have
    meant (the values that follow an unknown option go with it); stray words once."""
    problems: list[str] = []
    stray: list[str] = []
    after_option = False
    for arg in unknown:
        if arg.startswith("-") and arg != "-":
            problems.append(f"unrecognized argument {arg.split('=', 1)[0]}{did_you_mean(arg, parser)}")
            after_option = "=" not in arg
        elif after_option:
            after_option = False  # the unknown option's value
        else:
            stray.append(arg)
    if stray:
        where = (f"; a job's command goes after --: {PROG} submit [flags] -- PROGRAM [ARGS...]"
                 if command == "submit" else "")
        problems.append(f"unrecognized arguments: {' '.join(stray)}{where}")
    return problems


def add_global_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    # Accepted before and after the subcommand. On subcommands the defaults are SUPPRESSed so
    # that an option left out there does not overwrite the one given before the subcommand.
    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--server",
        default=default(None),
        metavar="HOST:PORT",
        help=f"scheduler address, or several comma-separated (HA: the leader is followed; default: $ARYL_SERVER, "
             f"else {DEFAULT_ADDRESS})",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json", "yaml", "name"), default=default("table"),
        help="output format (name: one id per line, for jobs and servers)",
    )
    parser.add_argument(
        "--timeout", type=positive, default=default(10.0), metavar="SECONDS", help="deadline of each call"
    )
    parser.add_argument(
        "--insecure", action="store_true", default=default(False),
        help="plaintext, no certificate or token: only for a scheduler run with security.insecure "
             "(default: TLS and a token, docs/security.md; also ARYL_INSECURE=1)",
    )
    add_debug_flag(parser, default=default(False))


WATCH_HELP: Final = (
    "print the list, then again after each change the event log reports, until Ctrl-C "
    "(-o json: one JSON list per line; -o yaml: one document per change)"
)


def global_options_parser() -> argparse.ArgumentParser:
    """The global options as a parent for a command's parser (they then work after it too)."""
    common = ArylArgumentParser(add_help=False, allow_abbrev=False)
    add_global_options(common, defaults=False)
    return common
