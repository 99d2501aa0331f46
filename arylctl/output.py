"""How ``arylctl`` shows things: tables, ``Label: value`` fields, times and spans, the ``-o`` formats
(:class:`Output`), and the exit codes every command returns.

Everything here renders what it is given; it never calls the scheduler and never decides. Every text
value goes through :func:`printable` before it reaches a terminal.
"""

from __future__ import annotations

import datetime as dt
import json
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TextIO

import yaml
from google.protobuf.duration_pb2 import Duration
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from protos.aryl.v1 import types_pb2

PROG: Final = "arylctl"

# The exit codes of every Aryl program (``aryl_common.entry``); ``arylctl.cli``'s docstring says when each.
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNAVAILABLE: Final = 3
EXIT_INTERRUPTED: Final = 130


class UsageError(Exception):
    """The command line (or a spec file it names) is wrong; the message says how."""


# The commands that have ids to print with `-o name`; the others refuse it before calling the server.
NAME_COMMANDS: Final = frozenset({"jobs", "servers"})

# ---------------------------------------------------------------------------------------------
# Formatting


# Characters that must not reach a terminal as they are: C0/C1 controls (ESC starts sequences that
# move the cursor, recolour, retitle the window or worse), DEL, line/paragraph separators and the
# invisible format characters (U+202E and the other bidi overrides reorder what follows).
_UNPRINTABLE_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def printable(value: object) -> str:
    """``str(value)`` safe to print in a table or a text line: every control or invisible format
    character becomes a visible escape (``\\x1b``, ``\\u202e``, ``\\n``: newlines too, since a value
    is one cell). Used by every table and text renderer; never on ``logs`` (the worker's own
    stream) nor on ``-o json|yaml`` (their encoders escape these already)."""
    text = "" if value is None else str(value)
    if text.isprintable():  # the common case, and it is fast
        return text
    return "".join(_escape(ch) for ch in text)


def _escape(ch: str) -> str:
    if unicodedata.category(ch) not in _UNPRINTABLE_CATEGORIES:
        return ch  # e.g. a plain space, which isprintable() also counts as printable
    code = ord(ch)
    if ch in "\t\n\r":
        return repr(ch)[1:-1]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Plain-text columns aligned on the widest cell, two spaces apart; the last column ragged.
    Cells go through :func:`printable`."""
    cells = [list(headers)] + [[printable(value) for value in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def format_fields(fields: Iterable[tuple[str, object]]) -> str:
    """``Label:  value`` lines with the values aligned (through :func:`printable`)."""
    pairs = [(label + ":", printable(value)) for label, value in fields]
    width = max((len(label) for label, _ in pairs), default=0)
    return "\n".join(f"{label.ljust(width)}  {value}".rstrip() for label, value in pairs)


def enum_name(enum: Any, value: int) -> str:
    """``JOB_STATE_RUNNING`` -> ``RUNNING``: the name without the prefix its UNSPECIFIED value shares."""
    prefix = enum.Name(0).removesuffix("UNSPECIFIED")
    try:
        return enum.Name(value).removeprefix(prefix)
    except ValueError:  # a value from a newer server
        return str(value)


_STATE_PREFIXES: Final = tuple(
    enum.Name(0).removesuffix("UNSPECIFIED")
    for enum in (types_pb2.JobState, types_pb2.ServerState, types_pb2.LoanState)
)


def short_state(name: str) -> str:
    """An event's from/to state string without its enum prefix."""
    for prefix in _STATE_PREFIXES:
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return name


def local_time(ts: Timestamp) -> str:
    """A timestamp as local ISO time to the second; ``-`` when unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return "-"
    return ts.ToDatetime(tzinfo=dt.UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")


def age(ts: Timestamp, now: dt.datetime | None = None) -> str:
    """How long ago, coarsely (``42s``, ``5m``, ``3h``, ``2d``); ``-`` when unset."""
    if ts.seconds == 0 and ts.nanos == 0:
        return "-"
    now = now or dt.datetime.now(dt.UTC)
    return seconds_text(max(0.0, (now - ts.ToDatetime(tzinfo=dt.UTC)).total_seconds()), coarse=True)


def seconds_text(seconds: float, *, coarse: bool = False) -> str:
    """``5400`` -> ``1h30m``; coarse keeps only the largest unit."""
    remaining = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    if not parts:
        return "0s"
    return parts[0] if coarse else "".join(parts)


def elapsed_text(seconds: float) -> str:
    """A span in its two largest units, the second zero-padded: ``42s``, ``3m12s``, ``2h05m``,
    ``4d3h`` (days are not padded: ``4d03h`` reads as a typo)."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def duration_text(duration: Duration) -> str:
    return seconds_text(duration.ToTimedelta().total_seconds()) if duration.ByteSize() else "-"


def to_dict(message: Message) -> dict[str, Any]:
    # Every field, zero values included: a missing `priority` or `restarts` would read as "unknown".
    # (Message fields that are not set, such as an absent deadline, still have no key.)
    return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)


class Output:
    """Where a command's result goes (``stream``, in the format chosen with ``-o``) and where
    notes for the human go (``notes``: "No jobs found." and the like, never mixed into data)."""

    def __init__(self, fmt: str, stream: TextIO, notes: TextIO) -> None:
        self.fmt = fmt
        self.stream = stream
        self.notes = notes
        self._snapshots = 0  # renders printed by --watch so far

    def note(self, text: str) -> None:
        print(text, file=self.notes)

    def emit(
        self,
        data: Message | Sequence[Message],
        table: Callable[[], str],
        names: Callable[[], Iterable[str]] | None = None,
    ) -> None:
        """One result: a message (or a list of them for list commands); ``table`` renders it and
        ``names`` gives its ids for ``-o name`` (commands without it are refused ``-o name``
        before they call the server: ``NAME_COMMANDS``)."""
        if self.fmt == "table":
            text = table()
            if text:
                print(text, file=self.stream)
            return
        if self.fmt == "name":
            if names is None:  # pragma: no cover - NAME_COMMANDS keeps this from happening
                raise UsageError("-o name applies only to " + ", ".join(sorted(NAME_COMMANDS)))
            for name in names():
                print(printable(name), file=self.stream)
            return
        payload: Any = to_dict(data) if isinstance(data, Message) else [to_dict(item) for item in data]
        self._dump(payload)

    def emit_snapshot(
        self, data: Sequence[Message], table: Callable[[], str], names: Callable[[], Iterable[str]]
    ) -> None:
        """One render of a watched list (``-w``): a table or ``-o name`` list after a blank line
        (but the first); with ``-o json`` the list as one JSON line, with ``-o yaml`` one document."""
        if self.fmt == "json":
            print(json.dumps([to_dict(item) for item in data]), file=self.stream, flush=True)
            return
        if self.fmt == "yaml":
            print("---", file=self.stream)
            self._dump([to_dict(item) for item in data])
        else:
            if self._snapshots:
                print(file=self.stream)
            self.emit(data, table, names)
        self._snapshots += 1
        self.stream.flush()

    def emit_stream_item(self, message: Message) -> None:
        """One item of an unbounded stream: a JSON line, or a YAML document."""
        if self.fmt == "json":
            print(json.dumps(to_dict(message)), file=self.stream, flush=True)
        else:
            print("---", file=self.stream)
            self._dump(to_dict(message))
            self.stream.flush()

    def _dump(self, payload: Any) -> None:
        if self.fmt == "json":
            print(json.dumps(payload, indent=2), file=self.stream)
        else:
            print(yaml.safe_dump(payload, sort_keys=False).rstrip("\n"), file=self.stream)

