"""Fuzzing every user-facing RPC with random and invalid messages, over real gRPC on loopback.

Hypothesis builds request messages field by field from valid values, invalid values (empty, huge,
control-character, NUL and non-ASCII strings; out-of-range numbers; unknown enum numbers; NaN and
infinities; malformed Durations and Timestamps; forged page tokens) and plain garbage, and sends
them to a real scheduler, once on SQLite and once on PostgreSQL. For every request:

- the status is one the RPC's contract allows -- never UNKNOWN, INTERNAL or UNAVAILABLE -- and the
  server still answers GetCluster afterwards;
- INVALID_ARGUMENT carries a google.rpc.BadRequest whose field is a path into the request (list
  indices in range), and the details string starts with that field ("spec.min_workers: ...");
- where the test knows a request is invalid, the refusal names one of its invalid fields; where it
  knows the request is valid, it is accepted;
- a refused request changes nothing: a fingerprint of every table is equal before and after.

The scheduling cycle writes in the background (placements, pending reasons) after every accepted
write, so a fingerprint is taken only once the database has settled (``Database.settle``).
Examples are derandomized: CI sends the same requests on every run.

Never: patch or reach into the running server; everything goes over the wire or reads the database.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf import duration_pb2, text_format, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from protos.aryl.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
from scheduler_service.api import validation
from scheduler_service.errors import InvalidArgument
from scheduler_service.store.models import Base
from tests.harness import register_fake_server, secure_channel
from tests.helpers import scaled_timeout

Code = grpc.StatusCode
OK, INVALID = Code.OK, Code.INVALID_ARGUMENT

# What each RPC may answer, whatever it is sent.
CONTRACT: dict[str, frozenset[grpc.StatusCode]] = {
    "SubmitJob": frozenset({OK, INVALID, Code.ALREADY_EXISTS}),
    "GetJob": frozenset({OK, INVALID, Code.NOT_FOUND}),
    "ListJobs": frozenset({OK, INVALID}),
    "CancelJob": frozenset({OK, INVALID, Code.NOT_FOUND, Code.FAILED_PRECONDITION}),
    # A stream never ends by itself: the test's deadline or its own cancel ends it.
    "WatchEvents": frozenset({OK, INVALID, Code.DEADLINE_EXCEEDED, Code.CANCELLED}),
    "GetCluster": frozenset({OK}),
    "ListServers": frozenset({OK, INVALID}),
    "ListLoans": frozenset({OK}),
    "ExplainJob": frozenset({OK, INVALID, Code.NOT_FOUND}),
    "PreviewReclaim": frozenset({OK, INVALID}),
    "ReportDemand": frozenset({OK, INVALID}),
    "RegisterServer": frozenset({OK, INVALID, Code.ALREADY_EXISTS, Code.FAILED_PRECONDITION}),
    "ReportStatus": frozenset({OK, INVALID, Code.NOT_FOUND, Code.FAILED_PRECONDITION}),
}
# Accepted calls of these change state and trigger a scheduling cycle.
WRITES = frozenset({"SubmitJob", "CancelJob", "ReportDemand", "RegisterServer", "ReportStatus"})
WATCH_OUTCOMES = frozenset({OK, Code.DEADLINE_EXCEEDED, Code.CANCELLED})

RPC_TIMEOUT_S = 10.0
WATCH_DEADLINE_S = 0.15  # long enough to see a replay, short enough for dozens of examples
# Two fingerprints this far apart must agree before a refusal is fingerprinted: time for the cycles
# an accepted write triggered to commit (a cycle takes milliseconds; the periodic tick is 0.2 s).
SETTLE_QUIET_S = 0.3
CONFIRM_QUIET_S = 1.0  # before blaming a refused request for a change (``Harness._changes_by``)

FUZZ = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,  # CI reproducibility: the same requests on every run
    database=None,
    # Not the explain phase: over a real server it re-runs a failing example hundreds of times.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    # One scheduler serves all examples of a test (that is the point: state accumulates).
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FEW = settings(FUZZ, max_examples=20)

# ---------------------------------------------------------------------------------------------
# The documented input rules, restated independently of scheduler_service.api.validation
# (only the ListJobs page-token digest, in ``_filter_digest``, comes from the server's code).

TEN_YEARS_S = 10 * 365 * 86400
# Fixed once: a strategy must not read the clock (Hypothesis replays draws and needs the same bounds).
# "Future" values lie a day or more ahead, so they stay in the future for the whole run.
NOW_S = int(time.time())
# 0001-01-01 .. 9999-12-31T23:59:58: times are stored as float seconds, and the last second of 9999
# would round past the end of Timestamp's range, so the API refuses it.
TIMESTAMP_MIN_S, TIMESTAMP_MAX_S = -62135596800, 253402300798
INT64_MAX = 2**63 - 1
IDENT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+-]*")
HOSTNAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_ENV = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
JOB_STATES = range(1, 8)  # JOB_STATE_PENDING .. JOB_STATE_CANCELLED


# C0, DEL, C1 and the bidirectional overrides/isolates (validation.py's character rule).
BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def has_control(value: str) -> bool:
    return any(ord(c) < 32 or 127 <= ord(c) < 160 or c in BIDI_CONTROLS for c in value)


def is_text(value: str, max_len: int, *, required: bool = False, pattern: re.Pattern[str] | None = None) -> bool:
    if not value:
        return not required
    return len(value) <= max_len and not has_control(value) and (pattern is None or bool(pattern.fullmatch(value)))


def is_job_id(value: str) -> bool:
    return re.fullmatch(r"[0-9]{1,19}", value) is not None and 0 < int(value) < 2**63


# ---------------------------------------------------------------------------------------------
# Value strategies

EDGES = (-(2**63), -(2**31), -1, 0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1)


def wide(low: int, high: int) -> st.SearchStrategy[int]:
    """Any integer in [low, high]; half the time an edge (the bounds, where int32/int64 end, ...),
    which plain ``st.integers`` over a wide range seldom draws."""
    return st.sampled_from(sorted({low, high, *(e for e in EDGES if low <= e <= high)})) | st.integers(low, high)


UINT32 = wide(0, 2**32 - 1)
INT32 = wide(-(2**31), 2**31 - 1)
INT64 = wide(-(2**63), 2**63 - 1)
UINT64 = wide(0, 2**64 - 1)
DOUBLES = st.floats()  # NaN, infinities, negatives, -0.0, subnormals, huge
FLOATS32 = st.floats(width=32)
PRINTABLE = st.characters(exclude_categories=("Cc", "Cs"), exclude_characters=BIDI_CONTROLS)
# What a command argument or environment value may hold: printable text, tab, newline, CR.
DATA = st.characters(exclude_categories=("Cc", "Cs"), exclude_characters=BIDI_CONTROLS, include_characters="\t\n\r")
CONTROL_CHARS = st.sampled_from(["\x00", "\x01", "\t", "\n", "\r", "\x1b", "\x7f", "\x9b", "\u202e", "\u2066"])
WITH_CONTROL = st.tuples(st.text(PRINTABLE, max_size=6), CONTROL_CHARS, st.text(max_size=6)).map("".join)
IDENTS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,15}", fullmatch=True)
HOSTNAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,15}", fullmatch=True)
NOT_IDENTS = st.one_of(
    st.sampled_from(["-alice", ".x", "a b", "al/ice", "Ünïcode", "a:b", "名前", "🚀", "x=y"]),
    st.text(PRINTABLE, min_size=1, max_size=12).filter(lambda s: not IDENT_RE.fullmatch(s)),
)


def too_long(max_len: int) -> st.SearchStrategy[str]:
    return st.one_of(st.integers(max_len + 1, max_len + 40).map(lambda n: "a" * n), st.just("é" * (max_len + 1)))


def strings(max_size: int = 24) -> st.SearchStrategy[str]:
    """Any string a client can send: empty, unicode, ASCII, with a control character or NUL, huge."""
    return st.one_of(
        st.just(""),
        st.text(max_size=max_size),
        st.text(st.characters(codec="ascii"), max_size=max_size),
        WITH_CONTROL,
        st.sampled_from(["\x00", " ", "é", "名前", "🚀" * 70, "a" * 129, "a" * 254, "x" * 4097, "y" * (32 * 1024 + 1)]),
    )


def mostly(valid_values: st.SearchStrategy[Any], invalid_values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Valid two times in three: enough refusals to probe validation, enough acceptances to go deeper.
    (Not ``st.one_of``: it flattens nested alternatives, and the many invalid ones would win.)"""
    return st.sampled_from([valid_values, valid_values, invalid_values]).flatmap(lambda values: values)


def job_ids() -> st.SearchStrategy[str]:
    return mostly(
        st.one_of(st.integers(1, 6).map(str), wide(1, 2**63 - 1).map(str),  # the first ones exist
                  st.sampled_from(["007", "9" * 19, str(2**63 - 1)])),
        st.one_of(
            wide(2**63, 10**30).map(str),
            wide(-(10**20), 0).map(str),
            st.sampled_from(["", "0", "+1", " 1", "1 ", "1\n", "1.0", "1e3", "0x1f", "١٢", "²", "abc", "9" * 20,
                             str(2**63)]),
            strings(),
        ),
    )


def durations() -> st.SearchStrategy[duration_pb2.Duration]:
    """Valid and malformed: any int64 seconds, any int32 nanos (sign mismatches, |nanos| >= 1 s)."""
    return st.builds(
        duration_pb2.Duration,
        seconds=st.one_of(st.integers(-315576000000, 315576000000), INT64, st.integers(0, TEN_YEARS_S)),
        nanos=st.one_of(st.integers(-999_999_999, 999_999_999), INT32),
    )


def valid_durations() -> st.SearchStrategy[duration_pb2.Duration]:
    return st.builds(duration_pb2.Duration, seconds=st.integers(0, TEN_YEARS_S - 1), nanos=st.integers(0, 10**9 - 1))


def invalid_durations() -> st.SearchStrategy[duration_pb2.Duration]:
    D = duration_pb2.Duration
    return st.one_of(
        st.builds(D, seconds=wide(-(2**63), -1), nanos=st.integers(-999_999_999, 0)),  # negative
        st.builds(D, seconds=wide(TEN_YEARS_S + 1, 2**63 - 1), nanos=st.integers(0, 10**9 - 1)),
        st.builds(D, seconds=st.integers(1, 2**40), nanos=st.integers(-999_999_999, -1)),  # signs disagree
        st.builds(D, seconds=st.integers(-(2**40), -1), nanos=st.integers(1, 999_999_999)),
        st.builds(D, seconds=st.integers(-(2**40), 2**40),
                  nanos=st.one_of(st.integers(10**9, 2**31 - 1), st.integers(-(2**31), -(10**9)))),
    )


def timestamps() -> st.SearchStrategy[timestamp_pb2.Timestamp]:
    return st.builds(timestamp_pb2.Timestamp, seconds=st.one_of(st.integers(TIMESTAMP_MIN_S, TIMESTAMP_MAX_S), INT64),
                     nanos=st.one_of(st.integers(0, 10**9 - 1), INT32))


def future_timestamps() -> st.SearchStrategy[timestamp_pb2.Timestamp]:
    return st.builds(timestamp_pb2.Timestamp, seconds=st.integers(NOW_S + 86400, TIMESTAMP_MAX_S),
                     nanos=st.integers(0, 10**9 - 1))


# The last instant the API accepts, 9999-12-31T23:59:58.999999999: an edge worth a case of its own.
LAST_INSTANT = timestamp_pb2.Timestamp(seconds=TIMESTAMP_MAX_S, nanos=10**9 - 1)


def invalid_deadlines() -> st.SearchStrategy[timestamp_pb2.Timestamp]:
    T = timestamp_pb2.Timestamp
    return st.one_of(
        st.builds(T, seconds=st.integers(TIMESTAMP_MIN_S, NOW_S - 3600), nanos=st.integers(0, 10**9 - 1)),
        st.builds(T, seconds=st.one_of(wide(-(2**63), TIMESTAMP_MIN_S - 1),
                                       wide(TIMESTAMP_MAX_S + 1, 2**63 - 1)), nanos=st.integers(0, 10**9 - 1)),
        st.builds(T, seconds=st.integers(NOW_S + 86400, TIMESTAMP_MAX_S),
                  nanos=st.one_of(st.integers(10**9, 2**31 - 1), st.integers(-(2**31), -1))),
    )


def page_tokens(states: list[int], user: str, queue: str) -> st.SearchStrategy[str]:
    """Empty, garbage, random base64, and tokens forged in the server's own format for this filter."""
    forged_id = st.one_of(INT64.map(str), wide(2**63, 10**40).map(str),
                          st.sampled_from(["", "x", "١٢", " 7 ", "1_0", "-0", "9" * 400]))
    forged = st.builds(
        lambda version, last, digest: base64.urlsafe_b64encode(f"{version}:{last}:{digest}".encode()).decode(),
        mostly(st.just("v1"), st.sampled_from(["v2", ""])), forged_id,
        mostly(st.just(_filter_digest(states, user, queue)), st.just("0" * 12)),
    )
    random_b64 = st.binary(max_size=60).map(lambda b: base64.urlsafe_b64encode(b).decode())
    return mostly(st.just("") | forged, strings() | random_b64)


def _filter_digest(states: list[int], user: str, queue: str) -> str:
    """The filter digest a ListJobs page token carries, computed by the server's own code."""
    try:
        return validation.job_filter(states, user, queue).digest()
    except InvalidArgument:
        return "0" * 12


def unknown_fields() -> st.SearchStrategy[bytes]:
    """Wire-valid fields no message in aryl.v1 defines: a newer client's request must still work."""

    def encode(number: int, wire: int, value: int | bytes) -> bytes:
        payload = _varint(value) if isinstance(value, int) else _varint(len(value)) + value
        return _varint(number << 3 | wire) + payload

    one = st.one_of(
        st.builds(encode, st.integers(100, 18999), st.just(0), UINT64),
        st.builds(encode, st.integers(20000, 2**29 - 1), st.just(2), st.binary(max_size=40)),
    )
    return st.lists(one, max_size=4).map(b"".join)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


# ---------------------------------------------------------------------------------------------
# Cases: a request and what the test knows about it


@dataclass(frozen=True)
class Case:
    request: Message | bytes
    # The outcomes the test expects; None: it only knows the RPC's contract.
    expect: frozenset[grpc.StatusCode] | None = None
    # With INVALID_ARGUMENT expected: the refusal must name one of these fields (or a field inside one).
    fields: tuple[str, ...] = ()


def valid(request: Message | bytes, *codes: grpc.StatusCode) -> Case:
    return Case(request, frozenset(codes or (OK,)))


def invalid(request: Message, *fields: str) -> Case:
    return Case(request, frozenset({INVALID}), tuple(fields))


def judged(request: Message, problems: list[str], *accepted: grpc.StatusCode) -> Case:
    """``problems``: the fields the test's own rules find invalid; none -> one of ``accepted``."""
    return invalid(request, *problems) if problems else valid(request, *accepted)


# -- SubmitJob -----------------------------------------------------------------------------------

IDEMPOTENCY_KEYS = ["batch-1", "batch-2", "nightly"]  # few, so some submissions reuse one


@st.composite
def valid_specs(draw: st.DrawFn, *, small: bool = False) -> types_pb2.JobSpec:
    """A JobSpec every rule accepts. ``small``: fits the test servers (<= 4 GPUs per worker, 2 workers)."""
    low = draw(st.integers(1, 2) if small else st.one_of(st.integers(1, 4), st.just(4096)))
    spec = types_pb2.JobSpec(
        name=draw(st.text(PRINTABLE, min_size=1, max_size=40)),
        user=draw(IDENTS),
        queue=draw(st.sampled_from(["", "default"])),  # a queue that exists (none is configured here)
        command=[draw(st.text(PRINTABLE, min_size=1, max_size=20)),
                 *draw(st.lists(st.text(DATA, max_size=16), max_size=4))],
        env=draw(st.dictionaries(
            st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True).filter(
                lambda k: k not in RESERVED_ENV and not k.startswith("ARYL_")),
            st.text(DATA, max_size=16), max_size=3)),
        gpus_per_worker=draw(st.integers(1, 4) if small else st.one_of(st.integers(1, 8), st.just(64))),
        min_workers=low,
        max_workers=draw(st.just(0) | st.integers(low, min(low + 2, 4096))),
        priority=draw(INT32),
        restart_policy=draw(st.sampled_from([0, 1, 2])),
        max_restarts=draw(st.integers(0, 1000)),
    )
    deadline = "none" if small else draw(st.sampled_from(["none", "future", "last instant"]))
    if deadline != "none":
        spec.deadline.CopyFrom(LAST_INSTANT if deadline == "last instant" else draw(future_timestamps()))
    max_runtime = draw(st.none() | valid_durations())
    if max_runtime is not None:
        spec.max_runtime.CopyFrom(max_runtime)
    if draw(st.booleans()):
        workers = draw(st.lists(st.integers(1, 4096), unique=True, max_size=4))
        speed = st.floats(min_value=0, exclude_min=True, allow_infinity=False)
        spec.throughput.points.extend(types_pb2.ThroughputPoint(workers=w, samples_per_second=draw(speed))
                                      for w in workers)
        spec.throughput.total_work = draw(st.floats(min_value=0, allow_infinity=False))
        if draw(st.booleans()):
            spec.throughput.estimated_runtime.CopyFrom(draw(valid_durations()))
    return spec


def _spec_mutations(draw: st.DrawFn, spec: types_pb2.JobSpec) -> str:
    """Break exactly one rule of a valid ``spec`` in place; returns the field the refusal must name."""
    kind = draw(st.sampled_from([
        "name", "user", "queue", "command", "command[0]", "command[i]", "env", "gpus_per_worker",
        "min_workers", "max_workers", "deadline", "points", "total_work", "estimated_runtime",
        "max_runtime", "restart_policy", "max_restarts",
    ]))
    if kind == "name":
        spec.name = draw(st.just("") | too_long(253) | WITH_CONTROL)
    elif kind == "user":
        spec.user = draw(st.just("") | too_long(128) | WITH_CONTROL | NOT_IDENTS)
    elif kind == "queue":
        spec.queue = draw(too_long(128) | WITH_CONTROL | NOT_IDENTS)
    elif kind == "command":
        del spec.command[:]
        spec.command.extend(draw(st.sampled_from([[], ["a"] * 1025])))
    elif kind == "command[0]":
        spec.command[0] = draw(st.just("") | too_long(4096) | WITH_CONTROL)
        return "spec.command[0]"
    elif kind == "command[i]":
        spec.command.append(draw(too_long(4096) | st.text(max_size=4).map(lambda s: s + "\x00")))
        return f"spec.command[{len(spec.command) - 1}]"
    elif kind == "env":
        bad_key = st.one_of(
            st.sampled_from(["", "1A", "A-B", "A B", "Ä", "A=B", "a.b", "PATH\n", *RESERVED_ENV, "ARYL_JOB"]),
            st.text(max_size=8).filter(lambda k: not ENV_KEY_RE.fullmatch(k)),
        )
        choice = draw(st.sampled_from(["key", "value", "count"]))
        if choice == "key":
            spec.env[draw(bad_key)] = "1"
        elif choice == "value":
            with_nul = st.text(max_size=4).map(lambda s: s + "\x00")
            spec.env["FUZZ_VALUE"] = draw(st.just("y" * (32 * 1024 + 1)) | with_nul)
        else:
            spec.env.update({f"V{i}": "" for i in range(257)})
        return "spec.env"
    elif kind == "gpus_per_worker":
        spec.gpus_per_worker = draw(st.just(0) | st.integers(65, 2**32 - 1))
    elif kind == "min_workers":
        spec.min_workers = draw(st.just(0) | st.integers(4097, 2**32 - 1))
    elif kind == "max_workers":
        spec.min_workers = draw(st.integers(2, 4096))
        spec.max_workers = draw(st.integers(1, spec.min_workers - 1) | st.integers(4097, 2**32 - 1))
    elif kind == "deadline":
        spec.deadline.CopyFrom(draw(invalid_deadlines()))
    elif kind == "points":
        how = draw(st.sampled_from(["workers", "duplicate", "speed"]))
        if how == "workers":
            spec.throughput.points.add(workers=draw(st.just(0) | st.integers(4097, 2**32 - 1)), samples_per_second=1)
        elif how == "duplicate":
            spec.throughput.points.add(workers=4096, samples_per_second=1)
            spec.throughput.points.add(workers=4096, samples_per_second=2)
        else:
            bad = draw(st.sampled_from([0.0, -0.0, math.nan, math.inf, -math.inf]) | st.floats(max_value=0))
            spec.throughput.points.add(workers=4095, samples_per_second=bad)
        return "spec.throughput.points"
    elif kind == "total_work":
        spec.throughput.total_work = draw(st.sampled_from([math.nan, math.inf, -math.inf])
                                          | st.floats(max_value=-1e-300, allow_infinity=False))
        return "spec.throughput.total_work"
    elif kind == "estimated_runtime":
        spec.throughput.estimated_runtime.CopyFrom(draw(invalid_durations()))
        return "spec.throughput.estimated_runtime"
    elif kind == "max_runtime":
        spec.max_runtime.CopyFrom(draw(invalid_durations()))
    elif kind == "restart_policy":
        spec.restart_policy = draw(INT32.filter(lambda v: v not in (0, 1, 2)))
    elif kind == "max_restarts":
        spec.max_restarts = draw(st.integers(1001, 2**32 - 1))
    return f"spec.{kind}"


@st.composite
def submit_cases(draw: st.DrawFn, *, small: bool = False) -> Case:
    """Valid, invalid (one rule broken) or garbage submissions. ``small``: no garbage, and valid jobs
    fit the test servers (so they run, and cancelling frees GPUs)."""
    mode = draw(st.sampled_from(["valid", "invalid"] if small else ["valid", "valid", "invalid", "invalid", "garbage"]))
    if mode == "valid":
        key = draw(st.just("") | st.sampled_from(IDEMPOTENCY_KEYS))
        request = scheduler_pb2.SubmitJobRequest(spec=draw(valid_specs(small=small)), idempotency_key=key)
        return valid(request, OK, Code.ALREADY_EXISTS) if key else valid(request)
    if mode == "invalid":
        spec = draw(valid_specs(small=small))
        if draw(st.integers(0, 9)) == 0:
            key = draw(too_long(128) | WITH_CONTROL)
            return invalid(scheduler_pb2.SubmitJobRequest(spec=spec, idempotency_key=key), "idempotency_key")
        problem = _spec_mutations(draw, spec)
        return invalid(scheduler_pb2.SubmitJobRequest(spec=spec), problem)
    counts = st.one_of(st.integers(0, 5), UINT32)
    spec = types_pb2.JobSpec(
        name=draw(strings()), user=draw(strings()), queue=draw(strings()),
        command=draw(st.lists(strings(), max_size=4)), env=draw(st.dictionaries(strings(8), strings(), max_size=3)),
        gpus_per_worker=draw(counts), min_workers=draw(counts), max_workers=draw(counts), priority=draw(INT32),
        deadline=draw(st.none() | timestamps()), max_runtime=draw(st.none() | durations()),
        restart_policy=draw(INT32 | st.integers(0, 3)), max_restarts=draw(st.integers(0, 1001) | UINT32),
        throughput=draw(st.none() | st.builds(
            types_pb2.ThroughputHints,
            points=st.lists(st.builds(types_pb2.ThroughputPoint, workers=counts, samples_per_second=DOUBLES),
                            max_size=4),
            total_work=DOUBLES, estimated_runtime=st.none() | durations(),
        )),
    )
    return Case(scheduler_pb2.SubmitJobRequest(spec=spec, idempotency_key=draw(strings())))


# -- job lookups -----------------------------------------------------------------------------------


@st.composite
def get_job_cases(draw: st.DrawFn) -> Case:
    job_id = draw(job_ids())
    request = scheduler_pb2.GetJobRequest(job_id=job_id, include_events=draw(st.booleans()))
    return judged(request, [] if is_job_id(job_id) else ["job_id"], OK, Code.NOT_FOUND)


@st.composite
def explain_job_cases(draw: st.DrawFn) -> Case:
    job_id = draw(job_ids())
    return judged(scheduler_pb2.ExplainJobRequest(job_id=job_id), [] if is_job_id(job_id) else ["job_id"],
                  OK, Code.NOT_FOUND)


@st.composite
def cancel_job_cases(draw: st.DrawFn) -> Case:
    job_id = draw(job_ids())
    reason = draw(mostly(st.just("") | st.text(PRINTABLE, max_size=30), too_long(1024) | WITH_CONTROL))
    problems = [f for f, ok in (("job_id", is_job_id(job_id)), ("reason", is_text(reason, 1024))) if not ok]
    return judged(scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason), problems,
                  OK, Code.NOT_FOUND, Code.FAILED_PRECONDITION)


@st.composite
def list_jobs_cases(draw: st.DrawFn) -> Case:
    states = draw(st.one_of(
        st.lists(st.sampled_from(JOB_STATES), max_size=4),
        st.lists(INT32 | st.integers(0, 9), max_size=6),
        st.lists(st.sampled_from(JOB_STATES), min_size=100, max_size=300),
    ))
    user = draw(mostly(st.just("") | IDENTS, strings()))
    queue = draw(mostly(st.just("") | IDENTS, strings()))
    page_size = draw(mostly(st.integers(0, 1000) | st.just(1), st.integers(1001, 2**32 - 1)))
    token = draw(page_tokens(states, user, queue))
    request = scheduler_pb2.ListJobsRequest(states=states, user=user, queue=queue, page_size=page_size,
                                            page_token=token)
    problems = [f"states[{i}]" for i, s in enumerate(states) if s not in JOB_STATES]
    problems += [f for f, v in (("user", user), ("queue", queue)) if not is_text(v, 128)]
    problems += [] if page_size <= 1000 else ["page_size"]
    if token:  # whether a token decodes is the server's business: any refusal must name it
        return Case(request, None, tuple(problems + ["page_token"]))
    return judged(request, problems)


@st.composite
def watch_cases(draw: st.DrawFn) -> Case:
    request = scheduler_pb2.WatchEventsRequest(
        job_id=draw(st.just("") | job_ids()), server_id=draw(mostly(st.just(""), HOSTNAMES | strings())),
    )
    after = draw(mostly(st.none() | st.integers(0, 30), INT64))
    if after is not None:
        request.after_event_id = after
    problems = [f for f, ok in (
        ("job_id", not request.job_id or is_job_id(request.job_id)),
        ("server_id", is_text(request.server_id, 253, pattern=HOSTNAME_RE)),
        ("after_event_id", after is None or after >= 0),
    ) if not ok]
    return judged(request, problems, *WATCH_OUTCOMES)


# -- cluster views ---------------------------------------------------------------------------------


@st.composite
def get_cluster_cases(draw: st.DrawFn) -> Case:
    return valid(draw(unknown_fields()))


@st.composite
def list_servers_cases(draw: st.DrawFn) -> Case:
    pool = draw(st.integers(0, 3) | INT32)
    request = scheduler_pb2.ListServersRequest(pool=pool)
    if draw(st.booleans()):
        return judged(request.SerializeToString() + draw(unknown_fields()), [] if pool in (0, 1, 2) else ["pool"])
    return judged(request, [] if pool in (0, 1, 2) else ["pool"])


@st.composite
def list_loans_cases(draw: st.DrawFn) -> Case:
    request = scheduler_pb2.ListLoansRequest(include_returned=draw(st.booleans()))
    return valid(request.SerializeToString() + draw(unknown_fields()) if draw(st.booleans()) else request)


@st.composite
def preview_reclaim_cases(draw: st.DrawFn) -> Case:
    servers = draw(mostly(st.integers(1, 3) | st.integers(1, 100_000), st.just(0) | wide(100_001, 2**32 - 1)))
    return judged(scheduler_pb2.PreviewReclaimRequest(servers=servers), [] if 1 <= servers <= 100_000 else ["servers"])


# -- inference and agents --------------------------------------------------------------------------


@st.composite
def report_demand_cases(draw: st.DrawFn) -> Case:
    request = inference_pb2.ReportDemandRequest(
        servers_needed=draw(mostly(st.integers(0, len(INFERENCE_SERVERS)), UINT32)),
        observed_rps=draw(mostly(st.floats(min_value=0, allow_infinity=False), DOUBLES)),
        source=draw(mostly(st.just("") | HOSTNAMES, strings(300))),
    )
    problems = [f for f, ok in (
        ("servers_needed", request.servers_needed <= len(INFERENCE_SERVERS)),  # at most the inference pool
        ("observed_rps", math.isfinite(request.observed_rps) and request.observed_rps >= 0),
        ("source", is_text(request.source, 253)),
    ) if not ok]
    return judged(request, problems)


REGISTERED = ("fuzz-a", "fuzz-b")  # the test servers every agent-side test starts with, 4 GPUs each
INFERENCE_SERVERS = ("fuzz-inf-1", "fuzz-inf-2")  # the inference pool of the demand test


@st.composite
def register_cases(draw: st.DrawFn) -> Case:
    sane = draw(st.booleans())  # half the requests stay close to what a real agent sends
    hostname = draw(st.sampled_from([*REGISTERED, "fuzz-c"]) | HOSTNAMES if sane else strings() | HOSTNAMES)
    count = draw(st.integers(0, 8) if sane else st.one_of(st.integers(0, 6), st.just(1025)))
    gpus = [
        agent_pb2.GpuInfo(
            index=draw(st.just(i) if sane else st.integers(0, 3) | UINT32),
            uuid=draw(st.just(f"GPU-{hostname}-{i}") if sane
                      else strings() | st.sampled_from(["GPU-1", "GPU-fuzz-a-0"])),
            model=draw(st.just("Fake-GPU") | st.text(PRINTABLE, max_size=20) if sane else strings()),
            memory_total_bytes=draw(st.integers(0, 2**40) | UINT64),
        )
        for i in range(count)
    ]
    request = agent_pb2.RegisterServerRequest(
        hostname=hostname, pool=draw(st.sampled_from([1, 2]) if sane else st.integers(0, 3) | INT32), gpus=gpus,
        agent_address=draw(st.just("") | HOSTNAMES if sane else strings()),
        agent_version=draw(st.just("test") | st.text(PRINTABLE, max_size=10) if sane else strings()),
    )
    problems = [f for f, ok in (
        ("hostname", is_text(hostname, 253, required=True, pattern=HOSTNAME_RE)),
        ("pool", request.pool in (1, 2)),
        ("gpus", count <= 1024),
        ("agent_address", is_text(request.agent_address, 253)),
        ("agent_version", is_text(request.agent_version, 64)),
    ) if not ok]
    indices: set[int] = set()
    uuids: set[str] = set()
    for i, g in enumerate(gpus):
        if g.index >= 1024 or g.index in indices:
            problems.append(f"gpus[{i}].index")
        if not is_text(g.uuid, 128, required=True) or g.uuid in uuids:
            problems.append(f"gpus[{i}].uuid")
        if not is_text(g.model, 128):
            problems.append(f"gpus[{i}].model")
        if g.memory_total_bytes > INT64_MAX:  # uint64 on the wire, a signed 64-bit column
            problems.append(f"gpus[{i}].memory_total_bytes")
        indices.add(g.index)
        uuids.add(g.uuid)
    return judged(request, problems, OK, Code.ALREADY_EXISTS, Code.FAILED_PRECONDITION)


@st.composite
def report_status_cases(draw: st.DrawFn, epoch: int) -> Case:
    gpus = draw(st.lists(st.builds(
        agent_pb2.GpuStatus,
        index=mostly(st.integers(0, 3), st.integers(4, 8) | UINT32),  # fuzz-a and fuzz-b have GPUs 0-3
        utilization=mostly(st.floats(0, 1, width=32), FLOATS32),
        memory_used_bytes=mostly(st.integers(0, 2**40), UINT64),
        temperature_c=mostly(st.floats(0, 120, width=32), FLOATS32), healthy=st.booleans(),
        health_reason=mostly(st.sampled_from(["", "XID 79"]), strings(300)),
        ecc_uncorrectable=UINT64, retired_pages=UINT32,
    ), max_size=5))
    workers = draw(st.lists(st.builds(
        agent_pb2.WorkerStatus, job_id=job_ids(), rank=UINT32, phase=st.integers(0, 4) | INT32, exit_code=INT32,
        progress=DOUBLES, samples_per_second=DOUBLES, checkpoint_progress=DOUBLES, incarnation=UINT64,
        message=strings(600), stop_requested=st.booleans(),
    ), max_size=3))
    request = agent_pb2.ReportStatusRequest(
        server_id=draw(mostly(st.sampled_from(REGISTERED), HOSTNAMES | strings())),
        scheduler_epoch=draw(mostly(st.just(epoch), INT64)), gpus=gpus, workers=workers,
        observed_generation=draw(st.integers(0, 10) | INT64),
    )
    problems = [f for f, ok in (("server_id", is_text(request.server_id, 253, required=True, pattern=HOSTNAME_RE)),)
                if not ok]
    for i, g in enumerate(gpus):
        if any(earlier.index == g.index for earlier in gpus[:i]):
            problems.append(f"gpus[{i}].index")  # one sample per GPU
        if not (math.isfinite(g.utilization) and math.isfinite(g.temperature_c)) or not is_text(g.health_reason, 256):
            problems.append(f"gpus[{i}]")
        if g.memory_used_bytes > INT64_MAX:
            problems.append(f"gpus[{i}].memory_used_bytes")
    if len(workers) > 4096:
        problems.append("workers")
    for i, w in enumerate(workers):
        if not is_job_id(w.job_id):
            problems.append(f"workers[{i}].job_id")
        if w.phase not in (1, 2, 3, 4):
            problems.append(f"workers[{i}].phase")
        for name in ("progress", "samples_per_second", "checkpoint_progress"):
            value = getattr(w, name)
            if not math.isfinite(value) or value < 0:
                problems.append(f"workers[{i}].{name}")
    # A well-formed report can still name a GPU that was never registered: the server's call.
    return Case(request, frozenset({INVALID}) if problems else None, tuple(problems))


# ---------------------------------------------------------------------------------------------
# The database, read directly


class TableFingerprint(NamedTuple):
    rows: int
    max_key: Any  # the largest primary key (single-column keys only)
    digest: str  # of every row, in key order


Fingerprint = dict[str, TableFingerprint]


class Database:
    """Reads the scheduler's database directly, to prove that a refused request changed nothing."""

    def __init__(self, url: str) -> None:
        self._sqlite = url.startswith("sqlite")
        if self._sqlite:
            self.engine = sa.create_engine(url, connect_args={"timeout": 30})
        else:  # one snapshot for all tables
            self.engine = sa.create_engine(url, isolation_level="REPEATABLE READ")

    def close(self) -> None:
        self.engine.dispose()

    def fingerprint(self) -> Fingerprint:
        result: Fingerprint = {}
        with self.engine.connect() as conn:
            if self._sqlite:
                conn.exec_driver_sql("BEGIN")  # a read transaction: one snapshot for all tables
            for table in Base.metadata.sorted_tables:
                key = list(table.primary_key.columns)
                rows = [tuple(r) for r in conn.execute(sa.select(table).order_by(*key))]
                max_key = rows[-1][list(table.columns).index(key[0])] if rows and len(key) == 1 else None
                digest = hashlib.sha256(repr(rows).encode()).hexdigest()
                result[table.name] = TableFingerprint(len(rows), max_key, digest)
            conn.rollback()
        return result

    def settle(self, *, quiet_s: float = SETTLE_QUIET_S, timeout_s: float = 20.0) -> Fingerprint:
        """Wait until background scheduling cycles stop writing: two fingerprints a quiet period apart agree."""
        give_up = time.monotonic() + timeout_s
        last = self.fingerprint()
        while True:
            time.sleep(quiet_s)
            now = self.fingerprint()
            if now == last:
                return now
            if time.monotonic() > give_up:
                raise AssertionError(f"the database kept changing for {timeout_s}s: {changed_tables(last, now)}")
            last = now


def changed_tables(before: Fingerprint, after: Fingerprint) -> dict[str, str]:
    """The tables whose fingerprints differ, each with what changed, readably."""
    changed = {}
    for name, old in before.items():
        new = after[name]
        if new != old:
            grew = (old.rows, old.max_key) != (new.rows, new.max_key)
            changed[name] = (f"rows {old.rows} -> {new.rows}, last key {old.max_key!r} -> {new.max_key!r}" if grew
                             else f"{old.rows} rows, contents differ")
    return changed


# ---------------------------------------------------------------------------------------------
# The harness: sends one case and checks every property


@dataclass(frozen=True)
class Outcome:
    code: grpc.StatusCode
    details: str
    response: Any = None  # the response message, or the events a stream sent
    bad_field: str | None = None  # google.rpc.BadRequest's first field violation


SERVICES = {
    "scheduler": ("aryl.v1.SchedulerService", scheduler_pb2_grpc.SchedulerServiceStub),
    "inference": ("aryl.v1.InferenceService", inference_pb2_grpc.InferenceServiceStub),
    "agent": ("aryl.v1.AgentService", agent_pb2_grpc.AgentServiceStub),
}
# The RPCs the tests also call with serialized requests (to add unknown fields on the wire).
RAW_RESPONSES = {
    "GetCluster": scheduler_pb2.GetClusterResponse,
    "ListServers": scheduler_pb2.ListServersResponse,
    "ListLoans": scheduler_pb2.ListLoansResponse,
}
SERVICE_OF = {
    **{rpc: "scheduler" for rpc in scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].methods_by_name},
    "ReportDemand": "inference", "RegisterServer": "agent", "ReportStatus": "agent",
}


class Harness:
    """A client of one running scheduler that sends cases and checks every property on each answer."""

    def __init__(self, address: str, database: Database) -> None:
        self.address = address
        # False while the cluster has no jobs: a scheduling cycle then has nothing to place or explain
        # and writes nothing, so there is nothing to wait for. (Were that wrong, refusals would seem to
        # change state: a loud failure, never a silent pass.)
        self.background_writes = True
        self.database = database
        self.channel = secure_channel(address)
        self.stubs = {name: stub(self.channel) for name, (_, stub) in SERVICES.items()}
        self.scheduler: scheduler_pb2_grpc.SchedulerServiceStub = self.stubs["scheduler"]
        self._settled = False  # no accepted write since the last settle: nothing runs in the background

    def close(self) -> None:
        self.channel.close()

    def send(self, rpc: str, case: Case, *, check_state: bool = True) -> Outcome:
        before = None
        if check_state and (case.expect is None or case.expect - WATCH_OUTCOMES):  # it may be refused
            if not self._settled:
                self.settle()
            before = self.database.fingerprint()
        outcome = self._call(rpc, case.request, refused=case.expect is not None and OK not in case.expect)
        if currently_in_test_context():  # --hypothesis-show-statistics shows the mix of answers
            event(f"{rpc} -> {outcome.code.name}")
        what = f"{rpc}({_show(case.request)}) -> {outcome.code.name}: {outcome.details[:300]!r}"
        changed = {}
        if before is not None and outcome.code not in (OK, *WATCH_OUTCOMES):
            changed = self._changes_by(rpc, case, outcome, before)
        assert outcome.code in CONTRACT[rpc], f"{what}\n(tables changed: {changed or 'none'})"
        assert not changed, f"{what}\nrefused, yet the database changed: {changed}"
        if case.expect is not None:
            assert outcome.code in case.expect, f"{what}\nexpected {sorted(c.name for c in case.expect)}"
        if outcome.code == INVALID:
            self._check_refusal(case, outcome, what)
        if outcome.code == OK and rpc in WRITES and self.background_writes:
            self._settled = False
        self.check_alive(what)
        return outcome

    def _changes_by(self, rpc: str, case: Case, refused: Outcome, before: Fingerprint) -> dict[str, Any]:
        """What a refused call changed. Settling is a timing heuristic: on a starved machine a cycle
        triggered earlier can still land during the call. So a change is confirmed before it is
        blamed on the request: settle longer, send the same request again, compare strictly."""
        changed = changed_tables(before, self.database.fingerprint())
        if not changed or refused.code not in CONTRACT[rpc]:
            return changed
        self.database.settle(quiet_s=CONFIRM_QUIET_S)
        before_again = self.database.fingerprint()
        again = self._call(rpc, case.request, refused=case.expect is not None and OK not in case.expect)
        changed_again = changed_tables(before_again, self.database.fingerprint())
        if again.code == refused.code and not changed_again:
            return {}
        return {"first call": changed, f"same call again ({again.code.name})": changed_again}

    def check_alive(self, after: str = "") -> scheduler_pb2.GetClusterResponse:
        try:
            return self.scheduler.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError as err:
            raise AssertionError(f"GetCluster failed ({err.code().name}: {err.details()}) after {after}") from None

    def epoch(self) -> int:
        return self.check_alive().scheduler_epoch

    def settle(self) -> None:
        self.database.settle()
        self._settled = True

    @staticmethod
    def _check_refusal(case: Case, outcome: Outcome, what: str) -> None:
        assert outcome.bad_field, f"{what}\nINVALID_ARGUMENT without a google.rpc.BadRequest field violation"
        reason = outcome.details.removeprefix(f"{outcome.bad_field}: ")
        assert reason != outcome.details and reason.strip(), (
            f"{what}\nthe details do not start with the field {outcome.bad_field!r} and a reason"
        )
        if isinstance(case.request, Message):
            assert names_a_field(case.request, outcome.bad_field), (
                f"{what}\n{outcome.bad_field!r} is not a field of this request (or its list index is out of range)"
            )
        if case.fields:
            assert any(within(outcome.bad_field, f) for f in case.fields), (
                f"{what}\nexpected the refusal to name one of {list(case.fields)}"
            )

    def _call(self, rpc: str, request: Message | bytes, *, refused: bool = False) -> Outcome:
        if rpc == "WatchEvents":
            return self._watch(request, refused=refused)
        service = SERVICE_OF[rpc]
        if isinstance(request, bytes):  # a serialized request with extra fields on the wire
            method: Callable[..., Any] = self.channel.unary_unary(
                f"/{SERVICES[service][0]}/{rpc}", request_serializer=None,
                response_deserializer=RAW_RESPONSES[rpc].FromString,
            )
        else:
            method = getattr(self.stubs[service], rpc)
        try:
            return Outcome(OK, "", method(request, timeout=RPC_TIMEOUT_S))
        except grpc.RpcError as err:
            return _refused(err)

    def _watch(self, request: scheduler_pb2.WatchEventsRequest, *, refused: bool = False) -> Outcome:
        """Read at most two events; the short deadline ends a stream with nothing to send. A request the case
        expects refused gets the RPCs' deadline: its refusal may take longer than a stream's short deadline on
        a loaded machine (it answered DEADLINE_EXCEEDED so under load 13)."""
        timeout = scaled_timeout(RPC_TIMEOUT_S) if refused else WATCH_DEADLINE_S
        stream = self.scheduler.WatchEvents(request, timeout=timeout)
        events: list[types_pb2.Event] = []
        try:
            for item in stream:
                events.append(item)
                if len(events) == 2:
                    stream.cancel()
                    return Outcome(Code.CANCELLED, "cancelled by the test", events)
        except grpc.RpcError as err:
            return Outcome(err.code(), err.details() or "", events, _refused(err).bad_field)
        return Outcome(OK, "", events)


def _refused(err: grpc.RpcError) -> Outcome:
    bad_field = None
    status = rpc_status.from_call(err)
    for detail in status.details if status is not None else ():
        bad_request = error_details_pb2.BadRequest()
        if detail.Unpack(bad_request) and bad_request.field_violations:
            bad_field = bad_request.field_violations[0].field
    return Outcome(err.code(), err.details() or "", None, bad_field)


def _show(request: Message | bytes) -> str:
    text = repr(request) if isinstance(request, bytes) else text_format.MessageToString(request, as_one_line=True)
    return text if len(text) <= 600 else f"{text[:600]}... ({len(text)} chars)"


def within(path: str, prefix: str) -> bool:
    """Is ``path`` the field ``prefix`` or inside it ("spec.env['A']" is within "spec.env")?"""
    return path == prefix or path.startswith((f"{prefix}.", f"{prefix}["))


_STEP = re.compile(r"\.?([a-z_]+)")


def names_a_field(message: Message, path: str) -> bool:
    """Does ``path`` ("spec.throughput.points[2].workers", "spec.env['KEY']") lead into ``message``,
    with every list index in range and every map key present (keys may be shown truncated)?"""
    value: Any = message
    pos = 0
    while pos < len(path):
        step = _STEP.match(path, pos)
        if step is None or not isinstance(value, Message) or step[1] not in value.DESCRIPTOR.fields_by_name:
            return False
        value, pos = getattr(value, step[1]), step.end()
        if not path.startswith("[", pos):
            continue
        # The subscript is a Python literal; a map key's repr may itself contain "]".
        end = path.find("]", pos)
        while end != -1:
            try:
                key = ast.literal_eval(path[pos + 1:end])
                break
            except (ValueError, SyntaxError):
                end = path.find("]", end + 1)
        else:
            return False
        pos = end + 1
        if isinstance(key, int) and not isinstance(value, Message) and hasattr(value, "__len__") \
                and not hasattr(value, "keys"):
            if not 0 <= key < len(value):
                return False
            value = value[key]
        elif isinstance(key, str) and hasattr(value, "keys"):
            matches = [k for k in value.keys() if k.startswith(key)]
            if not matches:
                return False
            value = value[matches[0]]
        else:
            return False
    return True


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def harness(scheduler_factory, database_url: str) -> Iterator[Harness]:
    """One scheduler for all examples of a test: state accumulates from example to example. Its fake servers
    never report, so they are never LOST while a test runs (on a loaded machine a test outlasts the default
    30 s, and a server going LOST during a refused call was blamed on the call)."""
    scheduler = scheduler_factory(agents={"lost_after_s": 86400.0})
    database = Database(database_url)
    h = Harness(scheduler.address, database)
    yield h
    h.close()
    database.close()


@pytest.fixture
def with_jobs(harness: Harness) -> Harness:
    """A cluster with one 4-GPU server and a few jobs: running, pending, cancelled."""
    register_fake_server(harness.address, "fuzz-a", gpus=4)
    spec = types_pb2.JobSpec(name="seed", user="alice", command=["python", "train.py"], min_workers=1)
    for gpus in (2, 2, 4, 1):
        spec.gpus_per_worker = gpus
        harness.scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=RPC_TIMEOUT_S)
    harness.scheduler.CancelJob(scheduler_pb2.CancelJobRequest(job_id="4"), timeout=RPC_TIMEOUT_S)
    return harness


@pytest.fixture
def with_servers(harness: Harness) -> Harness:
    for hostname in REGISTERED:
        register_fake_server(harness.address, hostname, gpus=4)
    return harness


@pytest.fixture
def without_jobs(with_servers: Harness) -> Harness:
    """Servers and no jobs, ever: the tests of agents, inference demand and cluster views."""
    with_servers.background_writes = False
    return with_servers


@pytest.fixture
def with_inference(without_jobs: Harness) -> Harness:
    """``without_jobs`` and an inference pool (demand may be at most its size)."""
    for hostname in INFERENCE_SERVERS:
        register_fake_server(without_jobs.address, hostname, "inference", gpus=1)
    return without_jobs


# ---------------------------------------------------------------------------------------------
# One property test per RPC


@FUZZ
@given(case=submit_cases())
def test_submit_job(harness: Harness, case: Case) -> None:
    outcome = harness.send("SubmitJob", case)
    if outcome.code == OK:
        job = outcome.response.job
        assert job.state == types_pb2.JOB_STATE_PENDING and int(job.job_id) > 0
        assert job.spec.name == case.request.spec.name and list(job.spec.command) == list(case.request.spec.command)


@FUZZ
@given(case=get_job_cases())
def test_get_job(with_jobs: Harness, case: Case) -> None:
    outcome = with_jobs.send("GetJob", case)
    if outcome.code == OK:
        assert outcome.response.job.job_id == str(int(case.request.job_id))
        assert all(e.job_id == outcome.response.job.job_id for e in outcome.response.events)


@FUZZ
@given(case=explain_job_cases())
def test_explain_job(with_jobs: Harness, case: Case) -> None:
    outcome = with_jobs.send("ExplainJob", case)
    if outcome.code == OK:
        assert outcome.response.job.job_id == str(int(case.request.job_id)) and outcome.response.summary


@FUZZ
@given(case=cancel_job_cases())
def test_cancel_job(with_jobs: Harness, case: Case) -> None:
    outcome = with_jobs.send("CancelJob", case)
    if outcome.code == OK:
        job = outcome.response.job
        assert job.state == types_pb2.JOB_STATE_CANCELLED and not job.workers and job.finished_at.seconds > 0


@FUZZ
@given(case=list_jobs_cases())
def test_list_jobs(with_jobs: Harness, case: Case) -> None:
    outcome = with_jobs.send("ListJobs", case)
    if outcome.code == OK:
        request, jobs = case.request, outcome.response.jobs
        ids = [int(j.job_id) for j in jobs]
        assert ids == sorted(ids, reverse=True), "newest first"
        assert len(jobs) <= (request.page_size or 100)
        assert all(j.state in request.states for j in jobs) if request.states else True
        assert all(j.spec.user == request.user for j in jobs) if request.user else True


@FEW
@given(case=watch_cases())
def test_watch_events(with_jobs: Harness, case: Case) -> None:
    outcome = with_jobs.send("WatchEvents", case)
    request = case.request
    for item in outcome.response or ():
        assert item.job_id == request.job_id.lstrip("0") if request.job_id else True
        assert item.server_id == request.server_id if request.server_id else True
        assert item.event_id > request.after_event_id if request.HasField("after_event_id") else True


@FEW
@given(case=get_cluster_cases())
def test_get_cluster(without_jobs: Harness, case: Case) -> None:
    without_jobs.send("GetCluster", case)


@FEW
@given(case=list_servers_cases())
def test_list_servers(without_jobs: Harness, case: Case) -> None:
    outcome = without_jobs.send("ListServers", case)
    if outcome.code == OK and isinstance(case.request, Message) and case.request.pool:
        assert all(s.pool == case.request.pool for s in outcome.response.servers)


@FEW
@given(case=list_loans_cases())
def test_list_loans(without_jobs: Harness, case: Case) -> None:
    without_jobs.send("ListLoans", case)


@FEW
@given(case=preview_reclaim_cases())
def test_preview_reclaim(without_jobs: Harness, case: Case) -> None:
    outcome = without_jobs.send("PreviewReclaim", case)
    if outcome.code == OK:
        preview = outcome.response
        assert len(preview.server_ids) <= min(case.request.servers, preview.loaned_servers)
        assert math.isfinite(preview.cost_gpu_seconds) and preview.cost_gpu_seconds >= 0


@FUZZ
@given(case=report_demand_cases())
def test_report_demand(with_inference: Harness, case: Case) -> None:
    outcome = with_inference.send("ReportDemand", case)
    if outcome.code == OK:  # the largest fresh router's report counts (store.inference)
        assert case.request.servers_needed <= outcome.response.demand.servers_needed <= len(INFERENCE_SERVERS)


@FUZZ
@given(case=register_cases())
def test_register_server(without_jobs: Harness, case: Case) -> None:
    outcome = without_jobs.send("RegisterServer", case)
    if outcome.code == OK:
        assert outcome.response.server_id == case.request.hostname
        assert outcome.response.scheduler_epoch == without_jobs.epoch()


@FUZZ
@given(data=st.data())
def test_report_status(without_jobs: Harness, data: st.DataObject) -> None:
    without_jobs.send("ReportStatus", data.draw(report_status_cases(without_jobs.epoch()), label="case"))


# ---------------------------------------------------------------------------------------------
# Random sequences of user calls, then the cluster's invariants through the API


@st.composite
def job_calls(draw: st.DrawFn) -> tuple[str, Case | int]:
    """("SubmitJob", case) or (rpc, n): n picks one of the jobs submitted so far (or a random id)."""
    rpc = draw(st.sampled_from(["SubmitJob", "SubmitJob", "CancelJob", "GetJob", "ExplainJob"]))
    if rpc == "SubmitJob":
        return rpc, draw(submit_cases(small=True))
    return rpc, draw(st.integers(0, 40))


@dataclass
class JobLedger:
    """What the test knows it did, across all examples of one test (the scheduler keeps its state)."""

    submitted: list[str] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)


@pytest.fixture
def ledger() -> JobLedger:
    return JobLedger()


BY_JOB_ID = {"CancelJob": scheduler_pb2.CancelJobRequest, "GetJob": scheduler_pb2.GetJobRequest,
             "ExplainJob": scheduler_pb2.ExplainJobRequest}


@settings(FUZZ, max_examples=10)
@given(calls=st.lists(job_calls(), min_size=3, max_size=15))
def test_random_call_sequences_keep_the_cluster_consistent(with_servers: Harness, ledger: JobLedger,
                                                           calls: list[tuple[str, Case | int]]) -> None:
    # Refusals are fingerprinted by the tests above; here the sequence runs without waiting, and the
    # invariants are checked on a consistent view while the scheduler keeps deciding.
    for rpc, arg in calls:
        if isinstance(arg, Case):
            outcome = with_servers.send(rpc, arg, check_state=False)
            if outcome.code == OK:
                ledger.submitted.append(outcome.response.job.job_id)
            continue
        known = ledger.submitted and arg < 30
        job_id = ledger.submitted[arg % len(ledger.submitted)] if known else str(arg * 7919 + 1)
        outcome = with_servers.send(rpc, Case(BY_JOB_ID[rpc](job_id=job_id)), check_state=False)
        if rpc == "CancelJob" and outcome.code == OK:
            ledger.cancelled.add(job_id)
        elif rpc == "CancelJob" and job_id in ledger.cancelled:
            assert outcome.code == Code.FAILED_PRECONDITION, "a cancelled job cannot be cancelled again"
    check_cluster_invariants(with_servers.scheduler, ledger)


class ClusterView(NamedTuple):
    jobs: list[types_pb2.Job]
    servers: list[types_pb2.Server]
    cluster: scheduler_pb2.GetClusterResponse


def consistent_view(stub: scheduler_pb2_grpc.SchedulerServiceStub, *, attempts: int = 50) -> ClusterView:
    """Jobs, servers and the cluster summary as of one moment, though read by several calls while
    cycles run: every GPU assignment changes with its job's version, so when the jobs' (id, state,
    version) are the same before and after the other reads, nothing changed in between."""
    for _ in range(attempts):
        jobs = list_all_jobs(stub)
        servers = list(stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=RPC_TIMEOUT_S).servers)
        cluster = stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=RPC_TIMEOUT_S)
        if _versions(list_all_jobs(stub)) == _versions(jobs):
            return ClusterView(jobs, servers, cluster)
        time.sleep(0.1)
    raise AssertionError(f"the jobs kept changing across {attempts} reads")


def _versions(jobs: list[types_pb2.Job]) -> list[tuple[str, int, int]]:
    return [(j.job_id, j.state, j.version) for j in jobs]


def check_cluster_invariants(stub: scheduler_pb2_grpc.SchedulerServiceStub, ledger: JobLedger) -> None:
    jobs, servers, cluster = consistent_view(stub)
    assert sorted(j.job_id for j in jobs) == sorted(ledger.submitted), "every accepted submission, nothing else"
    held: dict[tuple[str, int], str] = {}
    for job in jobs:
        assert job.state in JOB_STATES, job
        gpus = [(w.server_id, g) for w in job.workers for g in w.gpu_indices]
        for gpu in gpus:
            assert gpu not in held, f"GPU {gpu} held by jobs {held[gpu]} and {job.job_id}"
            held[gpu] = job.job_id
        if job.state == types_pb2.JOB_STATE_RUNNING:
            assert job.num_workers == len(job.workers), job
            assert job.spec.min_workers <= job.num_workers <= (job.spec.max_workers or job.spec.min_workers)
            assert sorted(w.rank for w in job.workers) == list(range(job.num_workers))
            assert all(len(w.gpu_indices) == job.spec.gpus_per_worker for w in job.workers), job
        elif job.state != types_pb2.JOB_STATE_SCALING:
            assert not job.workers and job.num_workers == 0, f"a {types_pb2.JobState.Name(job.state)} job holds GPUs"
        if job.job_id in ledger.cancelled:
            assert job.state == types_pb2.JOB_STATE_CANCELLED
    by_servers = {(s.server_id, g.index): g.job_id for s in servers for g in s.gpus if g.job_id}
    assert by_servers == held, "ListServers and ListJobs disagree on who holds which GPU"
    for server in servers:
        assert server.gpus_used == sum(1 for g in server.gpus if g.job_id)
    assert {c.state: c.count for c in cluster.jobs} == dict(Counter(j.state for j in jobs))


def list_all_jobs(stub: scheduler_pb2_grpc.SchedulerServiceStub) -> list[types_pb2.Job]:
    jobs: list[types_pb2.Job] = []
    token = ""
    while True:
        page = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=7, page_token=token), timeout=RPC_TIMEOUT_S)
        jobs += page.jobs
        token = page.next_page_token
        if not token:
            return jobs


# ---------------------------------------------------------------------------------------------
# The smallest inputs that broke the server, one test each (the properties above find them too).
# Each passes whether the server accepts the input or refuses it naming the field: the fix decides.


def test_submit_job_with_the_last_representable_deadline(harness: Harness) -> None:
    # Times are stored as float seconds: 9999-12-31T23:59:59.999999999 once rounded up to 253402300800,
    # which no Timestamp can hold (INTERNAL with the job committed). The last second is now refused,
    # and the last accepted instant reads back fine.
    spec = types_pb2.JobSpec(name="j", user="u", command=["x"], gpus_per_worker=1, min_workers=1,
                             deadline=timestamp_pb2.Timestamp(seconds=TIMESTAMP_MAX_S + 1, nanos=10**9 - 1))
    harness.send("SubmitJob", invalid(scheduler_pb2.SubmitJobRequest(spec=spec), "spec.deadline"))
    spec.deadline.CopyFrom(LAST_INSTANT)
    harness.send("SubmitJob", Case(scheduler_pb2.SubmitJobRequest(spec=spec)))
    harness.send("ListJobs", valid(scheduler_pb2.ListJobsRequest()))


def test_env_variable_name_with_a_trailing_newline_is_refused(harness: Harness) -> None:
    # The name rule [A-Za-z_][A-Za-z0-9_]* is checked with re.match and "$", which also matches
    # before a trailing newline.
    spec = types_pb2.JobSpec(name="j", user="u", command=["x"], gpus_per_worker=1, min_workers=1, env={"A\n": "1"})
    harness.send("SubmitJob", invalid(scheduler_pb2.SubmitJobRequest(spec=spec), "spec.env"))


def test_list_jobs_with_a_forged_page_token_beyond_int64(harness: Harness) -> None:
    # Well-formed token, id past int64: SQLite cannot bind it (PostgreSQL compares it fine).
    token = base64.urlsafe_b64encode(f"v1:{2**63}:{_filter_digest([], '', '')}".encode()).decode()
    harness.send("ListJobs", Case(scheduler_pb2.ListJobsRequest(page_token=token)))


def test_register_server_with_memory_beyond_int64(harness: Harness) -> None:
    # uint64 on the wire, a signed 64-bit column in the database.
    gpu = agent_pb2.GpuInfo(index=0, uuid="GPU-0", memory_total_bytes=2**63)
    harness.send("RegisterServer", Case(agent_pb2.RegisterServerRequest(hostname="h", pool=1, gpus=[gpu])))


def test_report_status_with_memory_beyond_int64(with_servers: Harness) -> None:
    request = agent_pb2.ReportStatusRequest(server_id="fuzz-a", scheduler_epoch=with_servers.epoch(),
                                            gpus=[agent_pb2.GpuStatus(index=0, memory_used_bytes=2**63)])
    with_servers.send("ReportStatus", Case(request))


def test_report_status_for_an_unregistered_gpu_names_its_list_entry(with_servers: Harness) -> None:
    # The refusal once said "gpus[7]" (the GPU's index) for the request's gpus[0].
    request = agent_pb2.ReportStatusRequest(server_id="fuzz-a", scheduler_epoch=with_servers.epoch(),
                                            gpus=[agent_pb2.GpuStatus(index=7)])
    with_servers.send("ReportStatus", invalid(request, "gpus[0]"))
