"""Worker records and where the agent keeps them on disk. No threads, no decisions.

Nouns:
- a *worker* is one process of a training job on this server, identified by ``(job_id, rank,
  incarnation)`` (``WorkerId``); the scheduler bumps the incarnation whenever the job's workers
  must (re)start, so two incarnations of one rank are two different workers;
- a *worker spec* (``WorkerSpec``) is what the desired state says about a worker: command, world
  size, GPUs, environment, grace period, working directory;
- a worker's *working directory* is its job's ``working_dir`` when that exists on this server (and
  the uid the worker runs as can enter it: ``node_agent.identity``), else
  the job's directory here (``WorkDir.job_dir``): always, when the job gives none; when the job's
  is only a default (``working_dir_if_exists``, e.g. the directory ``arylctl submit`` ran in); a
  job that requires a directory this server lacks is not started here (``cannot_start``);
- a *worker record* (``Worker``) is what the agent knows about one worker: its phase (STARTING:
  desired but not spawned yet, e.g. waiting for an older incarnation to vacate its GPUs; RUNNING;
  STOPPING: SIGTERM sent, grace period running; EXITED), its shim process and its exit;
- a *stop* is one STOPPING phase of a worker: it has an id (``Worker.stop_id``) that the agent's
  stop notice names and a worker's checkpoint acknowledgement must echo to end the stop early
  (``node_agent.contract``, "Stop notices and checkpoint acknowledgements");
- the *shim* (``node_agent/shim.py``) is the process-group leader the agent spawns per worker; it
  runs the command and records its exit status in the worker's *exit file*;
- the *state file* (``<work_dir>/run/workers.json``) holds every record that has a process or an
  exit, and every worker whose shim is being spawned (saved before the spawn), so a restarted agent
  re-adopts running workers, never starts one twice, and does not restart exited ones.

On-disk layout (``WorkDir``)::

    <work_dir>/logs/<job>/rank-<r>.log                   output of every incarnation, appended
    <work_dir>/jobs/<job>/                               the job's directory (a working directory)
    <work_dir>/run/workers.json                          the state file (0600)
    <work_dir>/run/<job>/rank-<r>.inc-<i>.batch.json     ARYL_BATCH_FILE (the agent's, 0644)
    <work_dir>/run/<job>/rank-<r>.inc-<i>.exit.json      written by the shim when the command ends
    <work_dir>/run/<job>/rank-<r>.inc-<i>.progress.json  ARYL_PROGRESS_FILE
    <work_dir>/run/<job>/rank-<r>.inc-<i>.stop.json      ARYL_STOP_NOTICE_FILE (the agent's, 0644)
    <work_dir>/run/<job>/rank-<r>.inc-<i>.ack.json       ARYL_CHECKPOINT_ACK_FILE
    <checkpoint_root>/<job>/                             ARYL_CHECKPOINT_DIR

Permissions and owners (``node_agent.identity``): ``logs/``, ``jobs/``, ``run/`` and the checkpoint
root are 0711; ``jobs/<job>``, ``run/<job>`` and ``<checkpoint_root>/<job>`` are 0700 and owned by
the user the job's workers run as; ``logs/<job>`` (0700) and its logs (0600) are the agent's.

``<job>`` is the job id with anything but letters, digits, ``-``, ``_`` and inner dots
percent-escaped, so no job id can name a path outside its directory.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import quote

from google.protobuf import duration_pb2

from node_agent import contract
from protos.aryl.v1 import agent_pb2

STATE_FILE_VERSION = 1
# Only when the desired state names no port (0): the scheduler assigns each job its own port on its rank 0's
# server (scheduler_service.store.ports), so two jobs there never share one. 29500 is torchrun's default.
DEFAULT_MASTER_PORT = 29500


class Phase(StrEnum):
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    EXITED = "EXITED"


LIVE_PHASES = (Phase.RUNNING, Phase.STOPPING)


@dataclass(frozen=True, order=True)
class WorkerId:
    job_id: str
    rank: int
    incarnation: int

    def __str__(self) -> str:
        return f"{self.job_id}/rank-{self.rank}/inc-{self.incarnation}"


@dataclass(frozen=True)
class WorkerSpec:
    """One desired worker, translated from ``agent_pb2.DesiredWorker``."""

    id: WorkerId
    world_size: int
    local_rank: int
    gpu_indices: tuple[int, ...]
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    master_addr: str
    master_port: int
    grace_s: float
    working_dir: str = ""  # absolute; empty: the job's directory (module doc)
    working_dir_if_exists: bool = False
    user: str = ""  # the job's owner: who the worker runs as (node_agent.identity)
    # A job with batch limits (``node_agent.contract``): the batch chosen now (it may change while the
    # worker runs: ``ARYL_BATCH_FILE``) and the job's limits; all 0 for a job without.
    local_batch_size: int = 0
    accum_steps: int = 0
    init_batch_size: int = 0
    max_batch_size: int = 0
    max_local_batch_size: int = 0

    @property
    def batch(self) -> contract.Batch | None:
        return contract.Batch(self.local_batch_size, self.accum_steps) if self.local_batch_size > 0 else None

    @classmethod
    def from_message(cls, worker: agent_pb2.DesiredWorker, default_grace_s: float) -> WorkerSpec:
        return cls(
            id=WorkerId(worker.job_id, worker.rank, worker.incarnation),
            world_size=worker.world_size or 1,
            local_rank=worker.local_rank,
            gpu_indices=tuple(worker.gpu_indices),
            command=tuple(worker.command),
            env=tuple(sorted(worker.env.items())),
            master_addr=worker.master_addr,
            master_port=worker.master_port,
            grace_s=grace_seconds(worker.grace_period, default_grace_s),
            working_dir=worker.working_dir,
            working_dir_if_exists=worker.working_dir_if_exists,
            user=worker.user,
            local_batch_size=worker.local_batch_size,
            accum_steps=worker.accum_steps,
            init_batch_size=worker.init_batch_size,
            max_batch_size=worker.max_batch_size,
            max_local_batch_size=worker.max_local_batch_size,
        )


def grace_seconds(duration: duration_pb2.Duration, default_s: float) -> float:
    """The desired grace period; unset or zero means the agent's default."""
    seconds = duration.ToTimedelta().total_seconds()
    return seconds if seconds > 0 else default_s


def desired_specs(state: agent_pb2.DesiredState | None, default_grace_s: float) -> dict[WorkerId, WorkerSpec]:
    """The workers ``state`` wants on this server, by identity (a repeated identity counts once)."""
    specs: dict[WorkerId, WorkerSpec] = {}
    for worker in state.workers if state is not None else ():
        spec = WorkerSpec.from_message(worker, default_grace_s)
        specs.setdefault(spec.id, spec)
    return specs


def path_component(job_id: str) -> str:
    """``job_id`` as one safe file name (see the module doc). The empty id, which is never started,
    becomes ``%``, a name no escaped id can have."""
    if not job_id:
        return "%"
    name = quote(job_id, safe="-_.")
    return "%2E" + name[1:] if name.startswith(".") else name


@dataclass(frozen=True)
class WorkDir:
    """The agent's directories (module doc); absolute paths."""

    root: Path
    checkpoint_root: Path

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def state_file(self) -> Path:
        return self.run_dir / "workers.json"

    def log_file(self, job_id: str, rank: int) -> Path:
        return self.root / "logs" / path_component(job_id) / f"rank-{rank}.log"

    def batch_file(self, worker: WorkerId) -> Path:
        return self.run_dir / path_component(worker.job_id) / f"rank-{worker.rank}.inc-{worker.incarnation}.batch.json"

    def exit_file(self, worker: WorkerId) -> Path:
        return self.run_dir / path_component(worker.job_id) / f"rank-{worker.rank}.inc-{worker.incarnation}.exit.json"

    def progress_file(self, worker: WorkerId) -> Path:
        return (
            self.run_dir / path_component(worker.job_id) / f"rank-{worker.rank}.inc-{worker.incarnation}.progress.json"
        )

    def stop_notice_file(self, worker: WorkerId) -> Path:
        return self.run_dir / path_component(worker.job_id) / f"rank-{worker.rank}.inc-{worker.incarnation}.stop.json"

    def ack_file(self, worker: WorkerId) -> Path:
        return self.run_dir / path_component(worker.job_id) / f"rank-{worker.rank}.inc-{worker.incarnation}.ack.json"

    def job_dir(self, job_id: str) -> Path:
        return self.root / "jobs" / path_component(job_id)

    def checkpoint_dir(self, job_id: str) -> Path:
        return self.checkpoint_root / path_component(job_id)

    def forget(self, worker: WorkerId, *, last_of_job: bool) -> None:
        """Remove a dropped worker's exit, progress, stop notice and ack files (never its log or
        checkpoints), and the job's run directory with the job's last worker."""
        for path in (self.exit_file(worker), self.progress_file(worker), self.stop_notice_file(worker),
                     self.ack_file(worker)):
            path.unlink(missing_ok=True)
        if last_of_job:
            try:
                self.exit_file(worker).parent.rmdir()
            except OSError:
                pass  # something else is in there; leave it


@dataclass
class Worker:
    """What the agent knows about one worker (module doc). Mutated only by the supervisor."""

    spec: WorkerSpec
    phase: Phase = Phase.STARTING
    pid: int = 0  # the shim's pid, which is also the worker's process group id
    start_ticks: int | None = None  # the shim's start time (/proc), guards against pid reuse
    started_at: float = 0.0  # wall clock; set when its shim is about to be spawned (``launching``)
    exit_code: int = 0
    message: str = ""
    stop_requested: bool = False
    cannot_start: bool = False  # EXITED without running, for a reason in its spec (no working directory here)
    stop_deadline: float = 0.0  # time.monotonic() (system-wide, so a restarted agent shares it): SIGKILL past it
    killed: bool = False  # the agent sent SIGKILL
    stop_id: str = ""  # the current stop's id (its notice's), once STOPPING
    stop_acked_at: float = 0.0  # time.monotonic() when the worker acknowledged this stop (0: it has not)
    acked_progress: float = 0.0  # the checkpoint progress that acknowledgement named
    reported_exit: bool = field(default=False, compare=False)  # included in a report since EXITED

    @property
    def id(self) -> WorkerId:
        return self.spec.id

    @property
    def live(self) -> bool:
        return self.phase in LIVE_PHASES

    @property
    def launching(self) -> bool:
        """STARTING, and its shim about to be spawned or spawned already: saved (write-ahead) before
        the spawn, so a successor of an agent killed in between looks for the shim (``find_shim``)
        instead of starting the worker a second time."""
        return self.phase is Phase.STARTING and self.started_at > 0

    def exited(self, exit_code: int, message: str) -> None:
        self.phase, self.exit_code, self.message = Phase.EXITED, exit_code, message
        self.reported_exit = False

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        del record["reported_exit"]
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Worker:
        spec = dict(record["spec"])
        spec["id"] = WorkerId(**spec["id"])
        spec["gpu_indices"] = tuple(spec["gpu_indices"])
        spec["command"] = tuple(spec["command"])
        spec["env"] = tuple((k, v) for k, v in spec["env"])
        fields = {k: v for k, v in record.items() if k != "spec"}
        return cls(spec=WorkerSpec(**spec), **{**fields, "phase": Phase(fields["phase"])})


def parse_exit_record(text: str | None) -> tuple[int, str] | None:
    """An exit file's text as ``(exit_code, message)``; None when it is not one."""
    try:
        data = json.loads(text) if text is not None else None
        return (int(data["exit_code"]), str(data.get("message", ""))) if isinstance(data, dict) else None
    except (ValueError, KeyError, TypeError):
        return None


def save_state(path: Path, workers: list[Worker]) -> None:
    """Write the state file atomically (temporary file, fsync, rename). On failure (a full disk) the
    previous state file stays as it was and the partial temporary file is removed."""
    document = {"version": STATE_FILE_VERSION, "workers": [w.to_record() for w in workers]}
    temporary = path.with_suffix(".json.tmp")
    try:
        temporary.unlink(missing_ok=True)
        # 0600: it holds every co-located job's environment (node_agent.identity).
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(document, file, indent=1, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class WorkerView:
    """One worker as reported to the scheduler (``agent_pb2.WorkerStatus`` without the protobuf)."""

    id: WorkerId
    phase: Phase
    exit_code: int
    message: str
    stop_requested: bool
    progress: contract.Progress
    cannot_start: bool = False
    ack: contract.CheckpointAck | None = None  # its incarnation's last checkpoint acknowledgement
    stop_acknowledged: bool = False  # it acknowledged the stop under way (or that ended it)


class StateFileError(Exception):
    """The state file exists but cannot be read; the agent moves it aside and starts empty."""


def load_state(path: Path) -> list[Worker]:
    """The records a previous agent left; empty when there is no state file."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise StateFileError(f"cannot read {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("version") != STATE_FILE_VERSION:
        raise StateFileError(f"{path} is not a version-{STATE_FILE_VERSION} state file")
    try:
        return [Worker.from_record(record) for record in document["workers"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{path} has an invalid worker record: {exc!r}") from exc


def find_shim(exit_file: Path) -> int | None:
    """The pid of a live shim started for ``exit_file`` (its command line names it: ``--exit-file
    PATH``), or None: how a restarted agent finds a worker whose start its predecessor saved as under
    way but not its pid (``Worker.launching``)."""
    needle = b"\0--exit-file\0" + os.fsencode(exit_file) + b"\0"
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                cmdline = file.read()
        except OSError:
            continue
        if needle in cmdline and process_start_ticks(int(entry)) is not None:
            return int(entry)
    return None


def resolve_launch(worker: Worker, exit_file: Path) -> None:
    """``worker``'s previous agent stopped while spawning its shim (its ``exit_file``): adopt the shim
    if it runs, take its exit if it ran already, else it never started (it starts if still desired)."""
    pid = find_shim(exit_file)
    if pid is not None:
        worker.phase, worker.pid, worker.start_ticks = Phase.RUNNING, pid, process_start_ticks(pid)
    elif exit_file.exists():
        worker.phase, worker.pid = Phase.RUNNING, 0  # no process: the next pass records its exit
    else:
        worker.started_at = 0.0


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, /proc/<pid>/stat field 22); None if it is gone
    or has exited (zombie), or where there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as file:
            fields = file.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # exited, not reaped yet
        return None
    return int(fields[19])  # fields after "(comm)" start at field 3 (state)


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start_ticks`` (not a reused pid)."""
    if start_ticks is None or not Path("/proc").is_dir():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return process_start_ticks(pid) == start_ticks
