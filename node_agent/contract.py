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
- ``ARYL_STOP_NOTICE_FILE`` and ``ARYL_CHECKPOINT_ACK_FILE``: the agent's stop notice and the
  worker's checkpoint acknowledgement ("Stop notices and checkpoint acknowledgements" below);
- ``ARYL_ARRAY_JOB_ID`` and ``ARYL_ARRAY_INDEX``, only for an element of a job array (``arylctl submit
  --array 0-99``, the ``SubmitJobs`` call with array indices): the array's id (the job id of its first
  element) and this job's index in it, as Slurm's ``SLURM_ARRAY_JOB_ID`` / ``SLURM_ARRAY_TASK_ID``.

Batch size, only for a job that declared batch limits (``arylctl submit --batch-size INIT
--max-batch-size N --max-local-batch-size N``, ``JobSpec.batch``), so that the scheduler may adapt
its batch size to its allocation as Pollux does (goodput = throughput x statistical efficiency):

- ``ARYL_LOCAL_BATCH_SIZE``: samples per GPU per forward/backward pass (the *atomic* batch; a worker
  holding several GPUs runs this many on each), and ``ARYL_ACCUM_STEPS``: extra gradient-accumulation
  passes before each synchronised optimiser step. The total batch is GPUs x local x (accum + 1);
- ``ARYL_INIT_BATCH_SIZE``, ``ARYL_MAX_BATCH_SIZE``, ``ARYL_MAX_LOCAL_BATCH_SIZE``: the job's own
  declaration, echoed (scale the learning rate against the init batch size: Pollux's AdaScale);
- ``ARYL_BATCH_FILE``: a JSON file ``{"local_batch_size": L, "accum_steps": A}`` holding the batch
  chosen *now*. The variables are the batch at the worker's start; when the scheduler changes only
  the batch, the worker is **not** restarted: the agent rewrites this file (atomically) and the
  program picks the new batch up at its next step (``current_batch()``). In a multi-worker job,
  rank 0 should read it and broadcast the value so that every rank switches at the same step (the
  ranks' passes per step must agree, or their all-reduces no longer pair up). A resize always
  restarts the workers (new incarnation), with the new batch in the variables. The agents start a
  world's ranks at different moments, and an in-place change may fall between two starts: ranks of one
  world may start with different variables, so agree on rank 0's batch before the first step too
  (``aryl_train.Trainer`` does both).

  Why in place: Pollux re-chooses the batch as the gradient noise grows during training, at a fixed
  allocation, many times in a job's life; a restart for each would cost a checkpoint, a stop and a
  start (tens of seconds to minutes for a real model) for a change a data loader absorbs between two
  steps. A program that ignores the file keeps its starting batch and reports that batch
  (``local_batch_size``, ``accum_steps`` below), so the scheduler's measures stay true either way.
- Until a goodput-aware policy chooses a batch for the job's allocation, the scheduler gives the
  default: its init batch split over its GPUs in the fewest passes that fit ``max_local_batch_size``
  (at least one sample per GPU; ``scheduler_service.core.batch.default_batch``).

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
  the scheduler's estimate of the work a preemption would lose exact; pass ``answer_stop=False``
  there, so that a stop notice arriving just before such an ack cannot end the stop at that older
  checkpoint when the program's SIGTERM handling would save a newer one.

Exit status: 0 when the work is done; anything else is a failure the scheduler may restart from the
last checkpoint (with a new incarnation). The agent never restarts a worker by itself.

Progress file (``report_progress``, JSON): ``progress``, ``samples_per_second`` and
``checkpoint_progress`` as always, and the optional goodput measures a job with batch limits should
add: ``step_time_s`` (mean seconds per optimiser step, all its passes and the gradient sync),
``pass_time_s`` (mean seconds of one forward/backward pass without gradient sync),
``local_batch_size`` and ``accum_steps`` (the batch it actually ran), ``grad_sqr`` and ``grad_var``
(Pollux's gradient statistics: the squared norm of the mean gradient and the gradient noise variance,
normalised to the init batch size) and ``samples`` (samples processed so far, the whole job's). The
scheduler takes the goodput measures from rank 0 only (every rank of a synchronous data-parallel job
runs the same steps; other ranks may write them too) and only from the job's current incarnation. A
step time counts only with its ``pass_time_s`` and ``local_batch_size`` (the scheduler keeps the
newest per configuration: servers, GPUs, local batch); the gradient statistics count when either is
above 0.
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
LOCAL_BATCH_SIZE = "ARYL_LOCAL_BATCH_SIZE"
ACCUM_STEPS = "ARYL_ACCUM_STEPS"
INIT_BATCH_SIZE = "ARYL_INIT_BATCH_SIZE"
MAX_BATCH_SIZE = "ARYL_MAX_BATCH_SIZE"
MAX_LOCAL_BATCH_SIZE = "ARYL_MAX_LOCAL_BATCH_SIZE"
BATCH_FILE = "ARYL_BATCH_FILE"
STOP_NOTICE_FILE = "ARYL_STOP_NOTICE_FILE"
CHECKPOINT_ACK_FILE = "ARYL_CHECKPOINT_ACK_FILE"


@dataclass(frozen=True)
class Progress:
    """What a worker reports: ``progress`` in the unit of the job's total work (e.g. steps),
    its current throughput, and the progress saved by its last checkpoint (0: none yet)."""

    progress: float = 0.0
    samples_per_second: float = 0.0
    checkpoint_progress: float = 0.0
    # The goodput measures (module doc, "Progress file"); 0: not reported.
    step_time_s: float = 0.0
    pass_time_s: float = 0.0
    local_batch_size: int = 0
    accum_steps: int = 0
    grad_sqr: float = 0.0
    grad_var: float = 0.0
    samples: float = 0.0


# The optional keys of the progress file, in ``Progress``'s order.
GOODPUT_KEYS = ("step_time_s", "pass_time_s", "local_batch_size", "accum_steps", "grad_sqr", "grad_var", "samples")


@dataclass(frozen=True)
class Batch:
    """The batch a worker runs: ``local_batch_size`` samples per GPU per pass, ``accum_steps`` extra
    accumulation passes per optimiser step."""

    local_batch_size: int
    accum_steps: int = 0

    def total(self, gpus: int) -> int:
        """The total batch over ``gpus`` GPUs."""
        return gpus * self.local_batch_size * (self.accum_steps + 1)


@dataclass(frozen=True)
class BatchLimits:
    """The job's declaration (module doc), as its workers see it."""

    init_batch_size: int
    max_batch_size: int
    max_local_batch_size: int


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


def batch_limits() -> BatchLimits | None:
    """The job's declared batch limits; None for a job that declared none (or outside Aryl)."""
    values = [_positive_int(os.environ.get(name)) for name in (INIT_BATCH_SIZE, MAX_BATCH_SIZE, MAX_LOCAL_BATCH_SIZE)]
    return BatchLimits(*values) if all(values) else None


def start_batch() -> Batch | None:
    """The batch at the worker's start (``ARYL_LOCAL_BATCH_SIZE``, ``ARYL_ACCUM_STEPS``); None for a
    job without batch limits."""
    local = _positive_int(os.environ.get(LOCAL_BATCH_SIZE))
    return Batch(local, _count(os.environ.get(ACCUM_STEPS))) if local else None


def current_batch(path: str | os.PathLike[str] | None = None) -> Batch | None:
    """The batch chosen now: ``$ARYL_BATCH_FILE`` (or ``path``) as the agent last wrote it, else the
    batch at the start; None for a job without batch limits. Cheap (one small file): call it at each
    step, on rank 0, and broadcast (module doc)."""
    target = path or os.environ.get(BATCH_FILE)
    if target:
        try:
            with open(target, encoding="utf-8") as file:
                parsed = parse_batch(file.read())
        except OSError:
            parsed = None
        if parsed is not None:
            return parsed
    return start_batch()


def parse_batch(text: str | None) -> Batch | None:
    """A batch file's text as ``Batch``; None when it is not one."""
    try:
        data = json.loads(text) if text is not None else None
        local = _positive_int(data.get("local_batch_size")) if isinstance(data, dict) else 0
        return Batch(local, _count(data.get("accum_steps"))) if local and isinstance(data, dict) else None
    except (ValueError, TypeError):
        return None


def write_batch(path: str | os.PathLike[str], batch: Batch) -> None:
    """Write ``batch`` to ``path`` atomically (what the agent does; a reader never sees half of it).
    The temporary file is created exclusively and never through a link, and the rename replaces a
    link rather than following it, so a directory its worker owns cannot redirect the write."""
    target = os.fspath(path)
    temporary = f"{target}.tmp.{os.getpid()}"
    try:
        os.unlink(temporary)
    except FileNotFoundError:
        pass
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            json.dump(asdict(batch), file)
        os.replace(temporary, target)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _positive_int(value: object) -> int:
    """``value`` as a positive int; 0 when it is not one."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
    return number if number > 0 else 0


def _count(value: object) -> int:
    """``value`` as a non-negative int; 0 when it is not one."""
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
    return max(number, 0)


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
    step_time_s: float | None = None,
    pass_time_s: float | None = None,
    local_batch_size: int | None = None,
    accum_steps: int | None = None,
    grad_sqr: float | None = None,
    grad_var: float | None = None,
    samples: float | None = None,
) -> None:
    """Tell the agent how far the worker is. Cheap enough to call every step.

    Writes ``{"progress", "samples_per_second", "checkpoint_progress"}`` as JSON to ``path``
    (default ``$ARYL_PROGRESS_FILE``) atomically: a temporary file then ``os.replace``, so the agent
    never reads half a report. The goodput measures (module doc, "Progress file") are written when
    given. Does nothing when there is nowhere to write (outside Aryl).
    """
    target = path or os.environ.get(PROGRESS_FILE)
    if not target:
        return
    report: dict[str, float | int] = {
        "progress": float(progress),
        "samples_per_second": float(samples_per_second),
        "checkpoint_progress": float(checkpoint_progress),
    }
    measures = (step_time_s, pass_time_s, local_batch_size, accum_steps, grad_sqr, grad_var, samples)
    for key, value in zip(GOODPUT_KEYS, measures, strict=True):
        if value is not None:
            report[key] = int(value) if key in _INT_KEYS else float(value)
    temporary = f"{target}.tmp.{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump(report, file)
    os.replace(temporary, target)


_INT_KEYS = frozenset({"local_batch_size", "accum_steps"})


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
        measures = [_measure(data.get(key), key in _INT_KEYS) for key in GOODPUT_KEYS]
        return Progress(
            float(data.get("progress", 0.0)),
            float(data.get("samples_per_second", 0.0)),
            float(data.get("checkpoint_progress", 0.0)),
            *measures,  # type: ignore[arg-type]
        )
    except (ValueError, TypeError, AttributeError):
        return None


def _measure(value: object, integral: bool) -> float | int:
    """An optional goodput measure: 0 when absent, not a number, negative or not finite (one bad
    measure does not cost the report its progress)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        number = 0.0
    if not math.isfinite(number) or number < 0:
        number = 0.0
    return int(number) if integral else number


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
    answer_stop: bool = True,
    path: str | os.PathLike[str] | None = None,
    notice_path: str | os.PathLike[str] | None = None,
) -> bool:
    """Tell the agent the checkpoint at ``checkpoint_progress`` is saved (complete, durable): call it
    after the save, never before. ``saved_at`` defaults to now.

    During a stop (a stop notice exists) the ack answers that stop and the agent stops the worker at
    once (module doc); so call it last, when nothing else needs doing: returns True then. Outside a
    stop, or with ``answer_stop=False`` (a periodic save in a loop that saves again when it handles
    SIGTERM: a notice that came meanwhile must not end the stop at the older checkpoint), it only
    reports the checkpoint and returns False. Writes atomically to ``path`` (default
    ``$ARYL_CHECKPOINT_ACK_FILE``); does nothing and returns False outside Aryl.
    """
    target = path or os.environ.get(CHECKPOINT_ACK_FILE)
    if not target:
        return False
    notice = stop_notice(notice_path) if answer_stop else None
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


STOP_NOTICE_MODE = 0o644  # the agent's file in the worker's private directory: the worker reads it


def write_stop_notice(path: Path, notice: StopNotice) -> None:
    """Write ``notice`` to ``path`` atomically (what the agent does, just before its SIGTERM), into the
    worker's own directory: a new file under a random name (never through a link the worker planted),
    renamed over the notice. ``OSError`` when it cannot."""
    temporary = path.with_name(f"{path.name}.{os.urandom(6).hex()}.tmp")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, STOP_NOTICE_MODE)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), STOP_NOTICE_MODE)  # whatever the umask: the worker must read it
            json.dump({"stop_id": notice.stop_id, "grace_s": notice.grace_s, "deadline": notice.deadline}, file)
        os.replace(temporary, path)
    except OSError:
        temporary.unlink(missing_ok=True)
        raise


def parse_stop_notice(text: str | None) -> StopNotice | None:
    """A stop notice's text as ``StopNotice``; None when there is none or it is not valid."""
    try:
        data = json.loads(text) if text is not None else None
        if not isinstance(data, dict):
            return None
        return StopNotice(str(data["stop_id"]), float(data["grace_s"]), float(data["deadline"]))
    except (ValueError, TypeError, KeyError):
        return None
