"""Job specs: building a :class:`JobSpec` from keyword arguments (:func:`job_spec`), from a mapping as
a YAML/JSON spec file holds it (:func:`job_spec_from_mapping`), and the mapping ``arylctl submit`` sends
(:func:`submit_spec_mapping`: a ``-f`` file overlaid with the flags given).

A submission's spec is built here from start to end; :mod:`arylctl.client` only sends it. What this module
must never do: call the scheduler, or decide whether a spec is acceptable (validation is the server's job;
the helpers here only reject what cannot be expressed in a JobSpec, and what a submission lacks).
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml
from google.protobuf.duration_pb2 import Duration

from aryl_common.security import ClientSecurity
from arylctl.output import PROG, UsageError
from protos.aryl.v1 import types_pb2

RESTART_POLICIES: Final[Mapping[str, types_pb2.RestartPolicy]] = {
    "never": types_pb2.RESTART_POLICY_NEVER,
    "on_failure": types_pb2.RESTART_POLICY_ON_FAILURE,
}


def _current_user() -> str:
    """The login name, the owner a scheduler without identities records; "" with identities (TLS and a
    token), where the scheduler makes the caller the owner (docs/security.md)."""
    if not ClientSecurity.from_env().insecure:
        return ""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        return ""


def _duration(key: str, seconds: float) -> Any:
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{key} must be a finite number of seconds >= 0, got {seconds!r}")
    duration = Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def job_spec(
    *,
    name: str,
    command: Sequence[str],
    user: str | None = None,
    queue: str = "default",
    gpus_per_worker: int = 1,
    min_workers: int = 1,
    max_workers: int | None = None,
    priority: int = 0,
    env: Mapping[str, str] | None = None,
    deadline: dt.datetime | None = None,
    max_runtime_s: float | None = None,
    restart_policy: str = "on_failure",
    max_restarts: int = 0,
    estimated_runtime_s: float | None = None,
    throughput_points: Mapping[int, float] | None = None,
    total_work: float | None = None,
    working_dir: str | None = None,
    working_dir_if_exists: bool = False,
    priority_class: str = "",
    gpu_types: Sequence[str] = (),
    batch_size: int | None = None,
    max_batch_size: int | None = None,
    max_local_batch_size: int | None = None,
) -> types_pb2.JobSpec:
    """Build a :class:`JobSpec`.

    ``command`` is an argv list (``["python", "train.py"]``), not a shell string. ``user``
    defaults to the login name. ``max_workers`` defaults to ``min_workers`` (an inelastic job).
    A naive ``deadline`` is local time. ``restart_policy`` is ``"never"`` or ``"on_failure"``.
    ``throughput_points`` maps a worker count to samples/s; with ``total_work`` (same unit) the
    scheduler estimates completion times, else it uses ``estimated_runtime_s`` at min_workers.
    ``working_dir`` is where the workers start, an absolute path on the servers: a server without
    it fails the job, unless ``working_dir_if_exists`` (then it is a default, and such a server
    starts the worker in the agent's directory for the job). None: the agent's directory for the job.
    ``batch_size`` (the total batch its hyper-parameters were tuned for) declares that the job adapts
    its batch size to its allocation (``node_agent.contract``): ``max_batch_size`` defaults to it (a
    fixed total), ``max_local_batch_size`` (what one GPU fits in one pass) to its share per GPU at
    ``min_workers``.

    Raises ``ValueError`` naming the argument for what no JobSpec can express; whether the spec
    is acceptable (e.g. ``min_workers >= 1``) is for the server to say.
    """
    if isinstance(command, (str, bytes)) or not all(isinstance(arg, str) for arg in command):
        raise ValueError(f"command must be a list of strings (an argv), got {command!r}")
    if restart_policy not in RESTART_POLICIES:
        raise ValueError(f"restart_policy must be one of {sorted(RESTART_POLICIES)}, got {restart_policy!r}")
    if working_dir is not None and not isinstance(working_dir, str):
        raise ValueError(f"working_dir must be a path (a string), got {working_dir!r}")
    if not isinstance(working_dir_if_exists, bool):
        raise ValueError(f"working_dir_if_exists must be true or false, got {working_dir_if_exists!r}")
    if env is not None:
        for env_key, env_value in env.items():
            if not isinstance(env_key, str) or not isinstance(env_value, str):
                raise ValueError(f"env must map strings to strings, got {env_key!r}: {env_value!r}")
    try:
        spec = types_pb2.JobSpec(
            name=name,
            user=_current_user() if user is None else user,
            queue=queue,
            command=list(command),
            env=dict(env or {}),
            restart_policy=RESTART_POLICIES[restart_policy],
            working_dir=working_dir or "",
            working_dir_if_exists=working_dir_if_exists,
            priority_class=priority_class,
            gpu_types=list(gpu_types),
        )
        # One field at a time so that an out-of-range value is reported under its own name.
        for key, value in (
            ("gpus_per_worker", gpus_per_worker),
            ("min_workers", min_workers),
            ("max_workers", min_workers if max_workers is None else max_workers),
            ("priority", priority),
            ("max_restarts", max_restarts),
        ):
            _set_int(spec, key, value)
    except TypeError as exc:
        raise ValueError(f"invalid job spec: {exc}") from exc
    if deadline is not None:
        if not isinstance(deadline, dt.datetime):
            raise ValueError(f"deadline must be a datetime, got {deadline!r}")
        spec.deadline.FromDatetime(deadline.astimezone(dt.UTC))
    if max_runtime_s is not None:
        spec.max_runtime.CopyFrom(_duration("max_runtime_s", max_runtime_s))
    if estimated_runtime_s is not None:
        spec.throughput.estimated_runtime.CopyFrom(_duration("estimated_runtime_s", estimated_runtime_s))
    if total_work is not None:
        if not math.isfinite(total_work) or total_work < 0:
            raise ValueError(f"total_work must be a finite number >= 0, got {total_work!r}")
        spec.throughput.total_work = total_work
    for workers, samples_per_second in sorted((throughput_points or {}).items()):
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"throughput_points keys must be worker counts >= 1, got {workers!r}")
        if not math.isfinite(samples_per_second) or samples_per_second < 0:
            raise ValueError(
                f"throughput_points[{workers}] must be samples/s >= 0, got {samples_per_second!r}"
            )
        spec.throughput.points.add(workers=workers, samples_per_second=samples_per_second)
    if batch_size is not None:
        gpus = max(spec.gpus_per_worker * spec.min_workers, 1)
        for key, value in (("init_batch_size", batch_size),
                           ("max_batch_size", batch_size if max_batch_size is None else max_batch_size),
                           ("max_local_batch_size",
                            -(-batch_size // gpus) if max_local_batch_size is None else max_local_batch_size)):
            _set_int(spec.batch, key, value)
    elif max_batch_size is not None or max_local_batch_size is not None:
        raise ValueError("max_batch_size and max_local_batch_size need batch_size (the initial total batch)")
    return spec


def _set_int(spec: types_pb2.JobSpec | types_pb2.BatchHints, key: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    try:
        setattr(spec, key, value)
    except ValueError:
        kind = "an integer >= 0" if key != "priority" else "a 32-bit integer"
        raise ValueError(f"{key} must be {kind}, got {value!r}") from None


# job_spec_from_mapping: one converter per key, from what YAML/JSON produce to job_spec's types.


def _as_str(key: str, value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"job spec key {key!r}: expected a string, got {value!r}")
    return value


def _as_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"job spec key {key!r}: expected an integer, got {value!r}")
    return value


def _float(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        # PyYAML follows YAML 1.1, which reads `5.0e6` (no sign in the exponent) as a string.
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _as_seconds(key: str, value: object) -> float:
    seconds = _float(value)
    if seconds is None:
        raise ValueError(f"job spec key {key!r}: expected a number of seconds, got {value!r}")
    return seconds


def _as_bool(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"job spec key {key!r}: expected true or false, got {value!r}")
    return value


def _as_number(key: str, value: object) -> float:
    number = _float(value)
    if number is None:
        raise ValueError(f"job spec key {key!r}: expected a number, got {value!r}")
    return number


def _as_command(key: str, value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValueError(f"job spec key {key!r}: expected a list of strings (an argv), got {value!r}")
    return value


def _as_str_list(key: str, value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise ValueError(f"job spec key {key!r}: expected a list of strings, got {value!r}")
    return value


def _as_env(key: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError(f"job spec key {key!r}: expected a mapping of NAME: value, got {value!r}")
    env: dict[str, str] = {}
    for name, item in value.items():
        # YAML turns `OMP_NUM_THREADS: 4` into an int; numbers are unambiguous, booleans are not
        # (true -> "True"? "true"? "1"?), so those must be quoted.
        if isinstance(item, bool) or not isinstance(item, (str, int, float)) or not isinstance(name, str):
            raise ValueError(f"job spec key {key!r}: {name!r} must be a string (quote it), got {item!r}")
        env[name] = str(item)
    return env


_RELATIVE_UNITS: Final = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_RELATIVE = re.compile(r"\+?((?:\d+(?:\.\d+)?(?:min|[smhdw]))+)")
_RELATIVE_PART = re.compile(r"(\d+(?:\.\d+)?)(min|[smhdw])")


def parse_deadline(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """A deadline as people write it: an ISO 8601 time (``2026-11-24T18:00Z``; local time without an
    offset), or a time from ``now`` (default: the current time) such as ``6h``, ``90m``, ``1h30m``,
    ``2d`` (units s, m or min, h, d, w). ``ValueError`` saying both forms for anything else."""
    text = text.strip()
    match = _RELATIVE.fullmatch(text)
    if match:
        seconds = sum(float(n) * _RELATIVE_UNITS[unit] for n, unit in _RELATIVE_PART.findall(match.group(1)))
        if seconds > 0:
            return (now or dt.datetime.now(dt.UTC)) + dt.timedelta(seconds=seconds)
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"expected an ISO 8601 time like 2026-11-24T18:00Z or a time from now like 6h, 90m or "
                         f"1h30m, got {text!r}") from None
    return when if when.tzinfo is not None else when.astimezone()  # naive: local time


def _as_datetime(key: str, value: object) -> dt.datetime:
    if isinstance(value, dt.datetime):  # YAML parses unquoted timestamps itself
        return value
    if isinstance(value, str):
        try:
            return parse_deadline(value)
        except ValueError as exc:
            raise ValueError(f"job spec key {key!r}: {exc}") from None
    raise ValueError(f"job spec key {key!r}: expected an ISO 8601 time like 2026-11-24T18:00Z or a time from now "
                     f"like 6h, got {value!r}")


def _as_throughput_points(key: str, value: object) -> dict[int, float]:
    if not isinstance(value, Mapping):
        raise ValueError(f"job spec key {key!r}: expected a mapping of workers: samples_per_second, got {value!r}")
    points: dict[int, float] = {}
    for workers, speed in value.items():
        try:  # JSON object keys are always strings
            count = int(workers) if not isinstance(workers, bool) else None
        except (TypeError, ValueError):
            count = None
        samples_per_second = _float(speed)
        if count is None or samples_per_second is None:
            raise ValueError(f"job spec key {key!r}: expected workers: samples_per_second, got {workers!r}: {speed!r}")
        points[count] = samples_per_second
    return points


_SPEC_KEYS: Final[Mapping[str, Any]] = {
    "name": _as_str,
    "command": _as_command,
    "user": _as_str,
    "queue": _as_str,
    "gpus_per_worker": _as_int,
    "min_workers": _as_int,
    "max_workers": _as_int,
    "priority": _as_int,
    "env": _as_env,
    "deadline": _as_datetime,
    "max_runtime_s": _as_seconds,
    "restart_policy": _as_str,
    "max_restarts": _as_int,
    "estimated_runtime_s": _as_seconds,
    "throughput_points": _as_throughput_points,
    "total_work": _as_number,
    "working_dir": _as_str,
    "working_dir_if_exists": _as_bool,
    "priority_class": _as_str,
    "gpu_types": _as_str_list,
    "batch_size": _as_int,
    "max_batch_size": _as_int,
    "max_local_batch_size": _as_int,
}
SPEC_KEYS: Final = tuple(_SPEC_KEYS)
_REQUIRED_SPEC_KEYS: Final = ("name", "command")
_RESTART_POLICY_PREFIX: Final = "RESTART_POLICY_"
# The protobuf JSON spelling of a JobSpec's batch hints -> job_spec's flat keys.
_BATCH_KEYS: Final = {
    "init_batch_size": "batch_size",
    "max_batch_size": "max_batch_size",
    "max_local_batch_size": "max_local_batch_size",
}
# The protobuf JSON spelling of a JobSpec's nested throughput hints -> job_spec's flat keys.
_THROUGHPUT_KEYS: Final = {
    "estimated_runtime": "estimated_runtime_s",
    "points": "throughput_points",
    "total_work": "total_work",
}


def _proto_duration(key: str, value: object) -> float:
    """A protobuf JSON duration (``"3600s"``, ``"1.500s"``) or a plain number, in seconds."""
    seconds = _float(value[:-1] if isinstance(value, str) and value.endswith("s") else value)
    if seconds is None:
        raise ValueError(f"job spec key {key!r}: expected a duration like '3600s', got {value!r}")
    return seconds


def _proto_points(key: str, value: object) -> dict[int, object]:
    """``[{workers: 2, samples_per_second: 790.0}, ...]`` (protobuf JSON) -> ``{2: 790.0, ...}``."""
    if isinstance(value, Mapping):  # already job_spec's form
        return dict(value)
    if not isinstance(value, list) or not all(isinstance(point, Mapping) for point in value):
        raise ValueError(f"job spec key {key!r}: expected a list of {{workers, samples_per_second}}, got {value!r}")
    return {point.get("workers", 0): point.get("samples_per_second", 0.0) for point in value}


def _set_once(out: dict[str, Any], key: str, value: object, spelled: str) -> None:
    if out.get(key) is not None:
        raise ValueError(f"job spec keys {key!r} and {spelled!r} say the same thing; give one")
    out[key] = value


def normalize_job_spec_mapping(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with the protobuf JSON spellings of a JobSpec turned into :func:`job_spec`'s keys.

    What ``arylctl -o json|yaml`` prints for a job's ``spec`` (``MessageToDict`` with the proto
    field names) is thereby a valid spec file: ``max_runtime: 3600s`` becomes ``max_runtime_s``;
    ``throughput: {estimated_runtime, points: [{workers, samples_per_second}], total_work}``
    becomes ``estimated_runtime_s``, ``throughput_points`` and ``total_work``; and
    ``restart_policy: RESTART_POLICY_ON_FAILURE`` becomes ``on_failure`` (``..._UNSPECIFIED``:
    the default). Other keys are left as they are. Raises ``ValueError`` when both spellings of
    one value are given.
    """
    out = dict(data)
    if "max_runtime" in out:
        value = out.pop("max_runtime")
        if value is not None:
            _set_once(out, "max_runtime_s", _proto_duration("max_runtime", value), "max_runtime")
    throughput = out.pop("throughput", None)
    if throughput is not None:
        if not isinstance(throughput, Mapping):
            raise ValueError(f"job spec key 'throughput': expected a mapping, got {throughput!r}")
        unknown = sorted(str(key) for key in throughput if key not in _THROUGHPUT_KEYS)
        if unknown:
            raise ValueError(f"unknown job spec key 'throughput.{unknown[0]}'; valid: {', '.join(_THROUGHPUT_KEYS)}")
        for sub, key in _THROUGHPUT_KEYS.items():
            value = throughput.get(sub)
            if value is None:
                continue
            if sub == "estimated_runtime":
                value = _proto_duration("throughput.estimated_runtime", value)
            elif sub == "points":
                value = _proto_points("throughput.points", value)
            _set_once(out, key, value, f"throughput.{sub}")
    batch = out.pop("batch", None)  # BatchHints, as -o json|yaml prints it
    if batch is not None:
        if not isinstance(batch, Mapping):
            raise ValueError(f"job spec key 'batch': expected a mapping, got {batch!r}")
        unknown = sorted(str(key) for key in batch if key not in _BATCH_KEYS)
        if unknown:
            raise ValueError(f"unknown job spec key 'batch.{unknown[0]}'; valid: {', '.join(_BATCH_KEYS)}")
        for sub, key in _BATCH_KEYS.items():
            if batch.get(sub) is not None:
                _set_once(out, key, batch[sub], f"batch.{sub}")
    policy = out.get("restart_policy")
    if isinstance(policy, str) and policy.upper().startswith(_RESTART_POLICY_PREFIX):
        name = policy[len(_RESTART_POLICY_PREFIX):].lower()
        out["restart_policy"] = None if name == "unspecified" else name
    return out


def job_spec_from_mapping(data: Mapping[str, Any]) -> types_pb2.JobSpec:
    """Build a :class:`JobSpec` from a parsed YAML/JSON spec file with :func:`job_spec`'s keys.

    Example file::

        name: resnet50
        command: [torchrun, train.py]
        gpus_per_worker: 4
        min_workers: 1
        max_workers: 4
        env: {NCCL_DEBUG: INFO}
        throughput_points: {1: 410.0, 2: 790.0, 4: 1500.0}
        total_work: 1.2e7

    The protobuf JSON spellings of the same fields (what ``arylctl -o json|yaml`` prints for a
    job's spec) are accepted too: see :func:`normalize_job_spec_mapping`.

    Raises ``ValueError`` naming the key for an unknown key (a typo must not silently fall back
    to a default), a missing ``name``/``command``, or a value of the wrong type. A key set to
    null means "use the default".
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"a job spec must be a mapping of keys to values, got {type(data).__name__}")
    data = normalize_job_spec_mapping(data)
    unknown = sorted(str(key) for key in data if key not in _SPEC_KEYS)
    if unknown:
        raise ValueError(
            f"unknown job spec key {unknown[0]!r}" + (f" (and {unknown[1:]})" if len(unknown) > 1 else "")
            + f"; valid keys: {', '.join(SPEC_KEYS)}"
        )
    missing = [key for key in _REQUIRED_SPEC_KEYS if data.get(key) is None]
    if missing:
        raise ValueError(f"job spec key {missing[0]!r} is required")
    kwargs = {key: _SPEC_KEYS[key](key, value) for key, value in data.items() if value is not None}
    try:
        return job_spec(**kwargs)
    except ValueError as exc:
        raise ValueError(f"job spec: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# Spec files and submit's flags


def _read_spec_file(path: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read spec file {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        kind = "JSON" if path.endswith(".json") else "YAML"
        raise UsageError(f"spec file {path} is not valid {kind}: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"spec file {path} must hold a mapping of job spec keys, got {type(data).__name__}")
    return data


# submit flag (argparse dest) -> job spec key, for flags that override a spec file's value.
_SUBMIT_FLAG_KEYS: Final = {
    "name": "name",
    "user": "user",
    "queue": "queue",
    "gpus_per_worker": "gpus_per_worker",
    "min_workers": "min_workers",
    "max_workers": "max_workers",
    "priority": "priority",
    "deadline": "deadline",
    "max_runtime": "max_runtime_s",
    "restart_policy": "restart_policy",
    "max_restarts": "max_restarts",
    "estimated_runtime": "estimated_runtime_s",
    "priority_class": "priority_class",
    "gpu_types": "gpu_types",
    "batch_size": "batch_size",
    "max_batch_size": "max_batch_size",
    "max_local_batch_size": "max_local_batch_size",
}


READ_ONLY_NOTE_NAMES: Final = 4  # read-only keys named in the note about a job file; the rest counted


def spec_of_file(data: Mapping[str, Any], path: str, note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The job spec keys of a spec file, which may also hold a whole job as ``-o json|yaml``
    prints one: ``{job: {spec: ..., state: ...}, events: [...]}`` (``arylctl job``) or
    ``{job_id: ..., spec: ..., state: ...}`` (``submit``/``cancel``). Of a job only the spec is
    submitted; its read-only fields are ignored, with a note saying so."""
    beside_job: list[str] = []
    ignored: list[str] = []
    if isinstance(data.get("job"), Mapping):
        beside_job = [str(key) for key in data if key != "job"]
        data = data["job"]
    if isinstance(data.get("spec"), Mapping):
        ignored = [str(key) for key in data if key != "spec"]
        data = data["spec"]
    ignored += beside_job  # the job's own fields first: job_id and state say what the file is
    if ignored and note is not None:
        named = ", ".join(ignored[:READ_ONLY_NOTE_NAMES])
        more = f" and {len(ignored) - READ_ONLY_NOTE_NAMES} more" if len(ignored) > READ_ONLY_NOTE_NAMES else ""
        note(f"note: {path} holds a job: submitting its spec, ignoring its read-only fields ({named}{more})")
    try:
        return normalize_job_spec_mapping(data)
    except ValueError as exc:
        raise UsageError(f"spec file {path}: {exc}") from exc


def submit_spec_mapping(args: argparse.Namespace, note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The job spec keys from ``-f`` overlaid with the flags given (env entries merge per name)."""
    data = spec_of_file(_read_spec_file(args.file), args.file, note) if args.file else {}
    for flag, key in _SUBMIT_FLAG_KEYS.items():
        value = getattr(args, flag)
        if value is not None:
            data[key] = value
    if args.env:
        env = data.get("env") or {}
        if not isinstance(env, Mapping):
            raise UsageError(f"spec file {args.file}: 'env' must be a mapping, got {env!r}")
        data["env"] = {**env, **dict(args.env)}
    if args.command:
        data["command"] = args.command
    _set_working_dir(data, args.chdir, note)
    problems = submit_spec_problems(data)
    if problems:
        raise UsageError("\nerror: ".join(problems))
    return data


def submit_spec_problems(data: Mapping[str, Any]) -> list[str]:
    """What a submission lacks, every item at once: a job name, a command."""
    problems = []
    if data.get("name") is None:
        problems.append("submit needs a job name: --name NAME (or 'name' in the -f file)")
    if not data.get("command"):
        problems.append(f"submit needs a command: {PROG} submit [flags] -- PROGRAM [ARGS...] (or 'command' in the "
                        "-f file)")
    return problems


def _set_working_dir(data: dict[str, Any], chdir: str | None, note: Callable[[str], None] | None) -> None:
    """``working_dir``: ``--chdir`` (required on the servers), else the file's, else the submit
    directory as a default (``working_dir_if_exists``). A relative path is taken from the directory
    arylctl runs in, as Slurm's ``--chdir`` is."""
    if chdir is not None:
        data["working_dir"], data["working_dir_if_exists"] = chdir, False
    given = data.get("working_dir")
    if isinstance(given, str) and given:
        data["working_dir"] = os.path.abspath(given)
        return
    submit_dir = submit_directory()
    if submit_dir is None:
        if note is not None:
            note("note: the submit directory cannot be sent as the job's working directory (unreadable, or "
                 "not a printable path of at most 4096 characters); the workers start in the agent's directory "
                 "for the job (--chdir DIR to choose one)")
        return
    data["working_dir"], data["working_dir_if_exists"] = submit_dir, True


WORKING_DIR_MAX: Final = 4096  # the scheduler's limit (spec.working_dir)


def submit_directory() -> str | None:
    """The directory arylctl runs in, as the shell names it (``$PWD``, when it is the same directory:
    a symlinked path such as ``/home/alice`` is more likely to exist on the servers than what it
    resolves to); None when it cannot be sent (unreadable, too long, not printable)."""
    try:
        cwd = os.getcwd()
    except OSError:
        return None
    pwd = os.environ.get("PWD", "")
    try:
        if pwd.startswith("/") and os.path.samefile(pwd, cwd):
            cwd = pwd
    except OSError:
        pass
    return cwd if len(cwd) <= WORKING_DIR_MAX and cwd.isprintable() else None
