"""The job contract: what the node agent gives each training worker, and how a worker talks back.

Pure standard library on purpose: a training program may import this module, or copy the few lines
it needs, without installing Aryl. It must never import anything from Aryl or outside the stdlib.

Environment the agent sets for every worker (on top of a minimal base and the job's ``env``; the
agent's own environment is not passed on: ``node_agent.identity``):

- ``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``: the PyTorch elastic
  conventions (``torch.distributed.init_process_group("nccl")`` reads them as they are);
- ``CUDA_VISIBLE_DEVICES``: the worker's GPU indices, comma-separated (empty: no GPU), with
  ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so the indices mean the GPUs the agent registered;
- ``ARYL_JOB_ID`` and ``ARYL_INCARNATION``: which job and which (re)start of it this is; the
  incarnation changes whenever the job's workers restart (new start, resize, restart after failure);
- ``ARYL_CHECKPOINT_DIR``: a directory that outlives this process; save checkpoints there and resume
  from them on start (the same job restarts there at another world size after a resize);
- ``ARYL_PROGRESS_FILE``: where ``report_progress`` writes (the agent reads it at each status report);
- ``ARYL_ARRAY_JOB_ID`` and ``ARYL_ARRAY_INDEX``, only for an element of a job array (``arylctl submit
  --array 0-99``, the ``SubmitJobs`` call with array indices): the array's id (the job id of its first
  element) and this job's index in it, as Slurm's ``SLURM_ARRAY_JOB_ID`` / ``SLURM_ARRAY_TASK_ID``.

Signals: SIGTERM means "checkpoint and exit within the grace period" (exit status 0 is fine: the
agent reports that it stopped the worker); SIGKILL follows when the grace period is over. The
worker's whole process group receives both.

Stop notices and checkpoint acknowledgements (so a stop need not wait out the grace period):

- just before it sends SIGTERM the agent writes a *stop notice* to ``ARYL_STOP_NOTICE_FILE``
  (``stop_notice()``): ``{"stop_id", "grace_s", "deadline"}``, the stop's unique id, its grace
  period and the wall-clock time (``time.time()``) at which SIGKILL follows;
- a worker *acknowledges a checkpoint* with ``acknowledge_checkpoint(P)`` once its state at progress
  ``P`` is safely saved: it writes ``{"checkpoint_progress", "saved_at", "incarnation", "stop_id"}``
  to ``ARYL_CHECKPOINT_ACK_FILE``. The ack says two things: "my checkpoint at progress P, saved at
  ``saved_at``, is where a restart resumes" (the scheduler counts work lost since then, and resumes
  the job there), and, when it names the current stop notice's ``stop_id``, "I have answered this
  stop: nothing left in me is worth waiting for". Only the second ends a stop early: the agent then
  gives the worker ``ack_exit_window_s`` (default 1 s) to exit by itself and SIGKILLs its process
  group after that, instead of at the end of the grace period. An ack written before the SIGTERM
  (no notice yet, or an older one) or by an earlier incarnation (another file; its ``incarnation``
  differs) is still a checkpoint report but never shortens a stop.
- every rank that wants its stop shortened acknowledges (in a job where rank 0 saves, the other
  ranks acknowledge after the barrier that follows the save); a rank that does not is stopped as
  before. Acknowledging a checkpoint outside a stop (after each periodic save) is fine and makes
  the scheduler's estimate of the work a preemption would lose exact.

Exit status: 0 when the work is done; anything else is a failure the scheduler may restart from the
last checkpoint (with a new incarnation). The agent never restarts a worker by itself.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WORLD_SIZE = "WORLD_SIZE"
RANK = "RANK"
LOCAL_RANK = "LOCAL_RANK"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"
JOB_ID = "ARYL_JOB_ID"
INCARNATION = "ARYL_INCARNATION"
CHECKPOINT_DIR = "ARYL_CHECKPOINT_DIR"
PROGRESS_FILE = "ARYL_PROGRESS_FILE"
ARRAY_JOB_ID = "ARYL_ARRAY_JOB_ID"
ARRAY_INDEX = "ARYL_ARRAY_INDEX"
STOP_NOTICE_FILE = "ARYL_STOP_NOTICE_FILE"
CHECKPOINT_ACK_FILE = "ARYL_CHECKPOINT_ACK_FILE"


@dataclass(frozen=True)
class Progress:
    """What a worker reports: ``progress`` in the unit of the job's total work (e.g. steps),
    its current throughput, and the progress saved by its last checkpoint (0: none yet)."""

    progress: float = 0.0
    samples_per_second: float = 0.0
    checkpoint_progress: float = 0.0


def world_size() -> int:
    return int(os.environ.get(WORLD_SIZE, "1"))


def rank() -> int:
    return int(os.environ.get(RANK, "0"))


def local_rank() -> int:
    return int(os.environ.get(LOCAL_RANK, "0"))


def job_id() -> str:
    return os.environ.get(JOB_ID, "")


def incarnation() -> int:
    return int(os.environ.get(INCARNATION, "0"))


def array_index() -> int | None:
    """This job's index in its job array; None for a job not in an array."""
    value = os.environ.get(ARRAY_INDEX)
    return int(value) if value else None


def checkpoint_dir(default: str = "checkpoints") -> Path:
    """``ARYL_CHECKPOINT_DIR``, or ``default`` when running outside Aryl; created if missing."""
    path = Path(os.environ.get(CHECKPOINT_DIR) or default)
    path.mkdir(parents=True, exist_ok=True)
    return path


def report_progress(
    progress: float,
    samples_per_second: float = 0.0,
    checkpoint_progress: float = 0.0,
    *,
    path: str | os.PathLike[str] | None = None,
) -> None:
    """Tell the agent how far the worker is. Cheap enough to call every step.

    Writes ``{"progress", "samples_per_second", "checkpoint_progress"}`` as JSON to ``path``
    (default ``$ARYL_PROGRESS_FILE``) atomically: a temporary file then ``os.replace``, so the agent
    never reads half a report. Does nothing when there is nowhere to write (outside Aryl).
    """
    target = path or os.environ.get(PROGRESS_FILE)
    if not target:
        return
    report = Progress(float(progress), float(samples_per_second), float(checkpoint_progress))
    temporary = f"{target}.tmp.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(asdict(report), file)
    os.replace(temporary, target)


def read_progress(path: str | os.PathLike[str]) -> Progress | None:
    """The last progress written to ``path``; None when there is none or it is not valid."""
    try:
        with open(path, encoding="utf-8") as file:
            return parse_progress(file.read())
    except OSError:
        return None


def parse_progress(text: str | None) -> Progress | None:
    """A progress file's text as ``Progress``; None when there is none or it is not valid."""
    try:
        if text is None:
            return None
        data = json.loads(text)
        return Progress(
            float(data.get("progress", 0.0)),
            float(data.get("samples_per_second", 0.0)),
            float(data.get("checkpoint_progress", 0.0)),
        )
    except (ValueError, TypeError, AttributeError):
        return None


@dataclass(frozen=True)
class StopNotice:
    """The agent's notice of a stop, written just before its SIGTERM (module doc): ``stop_id`` to
    echo in an acknowledgement, the ``grace_s`` granted, and the wall-clock ``deadline`` of SIGKILL."""

    stop_id: str
    grace_s: float
    deadline: float


@dataclass(frozen=True)
class CheckpointAck:
    """A worker's acknowledgement (module doc): its checkpoint at ``checkpoint_progress`` was complete
    at ``saved_at`` (``time.time()``); written by ``incarnation``; answering stop ``stop_id`` ("": none)."""

    checkpoint_progress: float
    saved_at: float
    incarnation: int
    stop_id: str = ""

    def answers(self, incarnation: int, stop_id: str) -> bool:
        """Whether this ack ends the stop ``stop_id`` of the worker ``incarnation`` (never an empty id)."""
        return bool(stop_id) and self.stop_id == stop_id and self.incarnation == incarnation


def stop_notice(path: str | os.PathLike[str] | None = None) -> StopNotice | None:
    """The current stop notice (``$ARYL_STOP_NOTICE_FILE``), or None while the worker is not being
    stopped (or outside Aryl). A SIGTERM handler may call it to learn how long it has."""
    target = path or os.environ.get(STOP_NOTICE_FILE)
    if not target:
        return None
    try:
        with open(target, encoding="utf-8") as file:
            return parse_stop_notice(file.read())
    except OSError:
        return None


def acknowledge_checkpoint(
    checkpoint_progress: float,
    *,
    saved_at: float | None = None,
    path: str | os.PathLike[str] | None = None,
    notice_path: str | os.PathLike[str] | None = None,
) -> bool:
    """Tell the agent the checkpoint at ``checkpoint_progress`` is saved (complete, durable): call it
    after the save, never before. ``saved_at`` defaults to now.

    During a stop (a stop notice exists) the ack answers that stop and the agent stops the worker at
    once (module doc); so call it last, when nothing else needs doing: returns True then. Outside a
    stop it only reports the checkpoint and returns False. Writes atomically to ``path`` (default
    ``$ARYL_CHECKPOINT_ACK_FILE``); does nothing and returns False outside Aryl.
    """
    target = path or os.environ.get(CHECKPOINT_ACK_FILE)
    if not target:
        return False
    notice = stop_notice(notice_path)
    ack = CheckpointAck(
        checkpoint_progress=float(checkpoint_progress),
        saved_at=time.time() if saved_at is None else float(saved_at),
        incarnation=incarnation(),
        stop_id=notice.stop_id if notice is not None else "",
    )
    temporary = f"{target}.tmp.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(asdict(ack), file)
    os.replace(temporary, target)
    return bool(ack.stop_id)


def parse_checkpoint_ack(text: str | None) -> CheckpointAck | None:
    """An ack file's text as ``CheckpointAck``; None when there is none or it is not valid."""
    try:
        data = json.loads(text) if text is not None else None
        if not isinstance(data, dict):
            return None
        ack = CheckpointAck(
            checkpoint_progress=float(data["checkpoint_progress"]),
            saved_at=float(data["saved_at"]),
            incarnation=int(data["incarnation"]),
            stop_id=str(data.get("stop_id") or ""),
        )
    except (ValueError, TypeError, KeyError):
        return None
    if not (math.isfinite(ack.checkpoint_progress) and math.isfinite(ack.saved_at)) or ack.checkpoint_progress < 0:
        return None
    return ack


def parse_stop_notice(text: str | None) -> StopNotice | None:
    """A stop notice's text as ``StopNotice``; None when there is none or it is not valid."""
    try:
        data = json.loads(text) if text is not None else None
        if not isinstance(data, dict):
            return None
        return StopNotice(str(data["stop_id"]), float(data["grace_s"]), float(data["deadline"]))
    except (ValueError, TypeError, KeyError):
        return None
