"""The field rules every request shares: every field checked, every refusal names the field and the reason.

The character rule (``text``), job ids, counts, finite numbers, durations, timestamps, byte counts,
enum values, pools and server ids. The checks of each message family build on these:
``job_validation`` (job specs, SubmitJobs, ListJobs' filter), ``agent_validation`` (registrations,
status reports, inference endpoints) and ``queue_validation`` (queues).

Validation runs before anything touches the database, so a rejected request changes nothing. What this
module must never do: read or write state, or know one message family's rules (they live in their modules).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from protos.aryl.v1 import types_pb2
from scheduler_service.errors import InvalidArgument
from scheduler_service.lifecycle import Pool

NAME_MAX = 253
# Matched with fullmatch: "$" would also accept a trailing newline.
IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")
HOSTNAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
MAX_JOB_ID = 2**63 - 1
POOL_NAMES: dict[int, Pool] = {types_pb2.POOL_TRAINING: Pool.TRAINING, types_pb2.POOL_INFERENCE: Pool.INFERENCE}


# The character rule. Names and identifiers (a job's name, user and queue, environment variable
# names, and every other short text field checked by ``text``) are shown to other people in
# terminals, tables and logs, so they may contain none of: C0 controls (U+0000-U+001F, tab and
# newline included), DEL (U+007F), C1 controls (U+0080-U+009F; U+009B is a one-byte ESC [ to many
# terminals) and the Unicode bidirectional overrides, embeddings and isolates (U+202A-U+202E,
# U+2066-U+2069), which make a string display in a different order from what it holds
# ("Trojan Source"). Command arguments and environment VALUES are data handed to the program:
# they may hold tab, newline and carriage return (a `bash -c` or `python -c` script, a PEM key),
# and nothing else from that list (NUL cannot pass execve; a raw ESC or bidi control in a command
# line only serves to make it display differently from what runs: a program that needs one can
# write it as an escape, e.g. printf '\033'). Output (arylctl) escapes what it prints as well.
_BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_CONTROLS = "".join(chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))) + _BIDI_CONTROLS
CONTROL_CHARS = re.compile(f"[{re.escape(_CONTROLS)}]")
# The same set less tab, newline and carriage return: for command arguments and environment values.
DATA_CONTROL_CHARS = re.compile(f"[{re.escape(_CONTROLS.translate({9: None, 10: None, 13: None}))}]")


def refuse_controls(field: str, value: str, pattern: re.Pattern[str], allowed: str = "") -> None:
    found = pattern.search(value)
    if found is not None:
        raise InvalidArgument(
            field, f"must not contain control or bidirectional-override characters{allowed} "
            f"(found U+{ord(found.group()):04X} at position {found.start()})",
        )


# Patterns whose every match is printable ASCII: a value one of them matches has passed the character
# rule already (``text`` then skips the second scan; a value none matches is refused as before).
_PRINTABLE_PATTERNS = frozenset({IDENT, HOSTNAME})


def text(field: str, value: str, *, max_len: int, required: bool = False, pattern: re.Pattern[str] | None = None,
         hint: str = "") -> str:
    """A printable string: none of ``CONTROL_CHARS`` (PostgreSQL refuses NUL; the rest display
    misleadingly), bounded length."""
    if not value:
        if required:
            raise InvalidArgument(field, "is required")
        return value
    if len(value) > max_len:
        raise InvalidArgument(field, f"must be at most {max_len} characters (got {len(value)})")
    if pattern in _PRINTABLE_PATTERNS and pattern.fullmatch(value):
        return value
    refuse_controls(field, value, CONTROL_CHARS)
    if pattern is not None and not pattern.fullmatch(value):
        raise InvalidArgument(field, f"{value!r} is not valid{': ' + hint if hint else ''}")
    return value


def job_id(field: str, value: str) -> int:
    if not value:
        raise InvalidArgument(field, "is required")
    if not value.isascii() or not value.isdigit() or len(value) > 19 or not 0 < int(value) <= MAX_JOB_ID:
        raise InvalidArgument(field, f"{value[:40]!r} is not a job id (job ids are positive numbers, e.g. '42')")
    return int(value)


def count(field: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise InvalidArgument(field, f"must be between {low} and {high} (got {value})")
    return value


def finite(field: str, value: float, *, positive: bool = False) -> float:
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise InvalidArgument(field, f"must be a finite number {'>' if positive else '>='} 0 (got {value})")
    return value


def duration(field: str, value: duration_pb2.Duration) -> float:
    if (value.nanos and (value.seconds < 0) != (value.nanos < 0)) or abs(value.nanos) >= 10**9:
        raise InvalidArgument(field, "is not a valid duration")
    seconds = value.seconds + value.nanos / 1e9
    if seconds < 0:
        raise InvalidArgument(field, f"must not be negative (got {seconds}s)")
    if seconds > 10 * 365 * 86400:
        raise InvalidArgument(field, "must be at most 10 years")
    return seconds


# Times are stored as float seconds; the last second of 9999 would round past Timestamp's range.
MAX_TIMESTAMP_S = 253402300798  # 9999-12-31T23:59:58Z
MAX_INT64 = 2**63 - 1


def timestamp(field: str, value: timestamp_pb2.Timestamp) -> float:
    if not -62135596800 <= value.seconds <= MAX_TIMESTAMP_S or not 0 <= value.nanos < 10**9:
        raise InvalidArgument(field, "is not a valid timestamp (0001-01-01 .. 9999-12-31T23:59:58Z)")
    return value.seconds + value.nanos / 1e9


def byte_count(field: str, value: int) -> int:
    if value > MAX_INT64:
        raise InvalidArgument(field, f"must be at most {MAX_INT64} (got {value})")
    return value


def enum_value(field: str, value: int, allowed: Iterable[int], enum_type: EnumTypeWrapper) -> int:
    if value not in allowed:
        names = ", ".join(enum_type.Name(v) for v in allowed if v)
        raise InvalidArgument(field, f"unknown value {value}; use one of {names}")
    return value


def pool(field: str, value: int, *, required: bool) -> Pool | None:
    if value == types_pb2.POOL_UNSPECIFIED and not required:
        return None
    if value not in POOL_NAMES:
        raise InvalidArgument(field, f"unknown pool {value}; use POOL_TRAINING or POOL_INFERENCE")
    return POOL_NAMES[value]


def server_id(field: str, value: str, *, required: bool = True) -> str:
    return text(field, value, max_len=NAME_MAX, required=required, pattern=HOSTNAME,
                hint="a hostname: letters, digits, '.', '_' and '-'")

