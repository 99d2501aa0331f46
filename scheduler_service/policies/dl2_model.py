"""The ``dl2`` policy's network and its input encoding: what the network sees, what it outputs, and the
weights file. Plain numpy; PyTorch only where weights are trained (``torch_network``, imported lazily).

**Encoding** (version ``ENCODING_VERSION``; a fixed-size vector of ``input_size()`` floats): ``JOB_SLOTS``
rows of ``JOB_FEATURES``, then ``GLOBAL_FEATURES``. Every feature is *relative to the cluster* (shares of its
GPUs or of a server, log-scaled, or ratios), never a raw GPU count, so that a cluster of 8-GPU servers, or
one twice the size, looks like the 16 x 4-GPU clusters the network trained on.

- ``JOB_SLOTS`` rows, one per visible active (PENDING or RUNNING) job: the oldest first (submission time,
  then job id), which only decides *which* jobs are seen -- the network scores every row with the same
  weights, so their order does not matter (below). Jobs past the last row are not seen and keep their
  state this cycle. An empty row is all zeros. Per row, each about 0..1: ``present``; ``running`` (at the
  snapshot); ``gpus_per_worker / GPUs of the largest server``; the job's GPUs at ``min_workers``, at
  ``max_workers`` and at its workers so far (in this decision), each as a share of the cluster's training
  GPUs (``share_scaled``); ``workers / max_workers``; ``gain`` (relative speed-up of its next unit: 1 for a
  job with no workers, else ``speed(w + 1) / speed(w) - 1``); ``saving / remaining`` (the share of its
  remaining time one more worker saves; 1 for a job with no workers); ``saving`` and ``remaining`` in
  minutes (log-scaled: ``minutes_scaled``; ``remaining`` at its workers, or at ``min_workers`` when it has
  none); ``waited`` (since submission, the same scale); ``unit / free`` (the GPUs of its next unit -- its
  gang when it has no workers, else one worker -- over the free GPUs, at most 1); ``added`` and ``removed``
  (in this decision); ``arrival`` (its rank among the visible jobs by arrival / ``JOB_SLOTS``: a property
  of the job, its place in the queue, so that a network can learn first-come-first-served as its teacher
  does, without the row's position meaning anything).
- ``GLOBAL_FEATURES``: free GPUs / training GPUs; the largest free block on one server / GPUs of the
  largest server; demand (the active jobs' GPUs at ``min_workers`` / training GPUs, ``log2_scaled`` to 16);
  the share of active jobs not seen; the visible jobs / ``JOB_SLOTS``.

**Actions** (``action_count()``): ``i`` in ``0..JOB_SLOTS-1`` adds a unit to the job in row ``i`` (its
``min_workers`` gang when it has no workers, else one worker); ``JOB_SLOTS + i`` removes one from it (one
worker, or its whole gang at ``min_workers``: a preemption); ``2 x JOB_SLOTS`` stops the decision.

**Network** (shared per job, pooled over jobs; Deep Sets / PointNet style): each present row, with the
globals appended, is embedded by one shared layer, ``e = tanh([row, globals] @ w1 + b1)``; the cluster
context is the mean and the max of ``e`` over the present rows; ``h = tanh([e, mean, max] @ w2 + b2)``
per row; the row's *add* and *remove* logits are ``h @ wp + bp`` (two columns). *Stop* reads the pooled
``h`` (mean and max over present rows: ``[mean, max] @ ws + bs``) and so does the value (``wv``, ``bv``: a
scalar, the expected return, the baseline of online learning). Permuting the rows therefore permutes the
add and remove logits the same way and leaves stop and the value unchanged (a test checks it), and the
size of the network does not depend on ``JOB_SLOTS``.

**Weights file** (``.npz``): the arrays ``w1 b1 w2 b2 wp bp ws bs wv bv`` and ``meta``, a JSON string with
the encoding version, the shape (slots, features, globals, hidden, actions) and how the weights were made.
``load_network`` refuses a file whose encoding or shape differs from this module's (``ModelFileError``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

ENCODING_VERSION = 2
JOB_SLOTS = 32
JOB_FEATURES = 16
GLOBAL_FEATURES = 5
DEFAULT_HIDDEN = 64
# The policy's arrays (what RL changes and ``.checkpoints.npz`` keeps), then the value head's.
POLICY_ARRAYS = ("w1", "b1", "w2", "b2", "wp", "bp", "ws", "bs")
_ARRAYS = (*POLICY_ARRAYS, "wv", "bv")
# Row feature indexes that ``Decision`` fills outside ``encode_slot``: ``unit / free`` changes with every
# action that takes or frees GPUs, so it is set for all rows at once when an observation is taken.
UNIT_PER_FREE = 12
# The weights shipped with Aryl (``aryl-sim train-dl2``, the command and seed in their ``meta``).
BUNDLED_MODEL = Path(__file__).resolve().parent / "data" / "dl2.npz"


def input_size() -> int:
    return JOB_SLOTS * JOB_FEATURES + GLOBAL_FEATURES


def action_count() -> int:
    return 2 * JOB_SLOTS + 1


STOP = 2 * JOB_SLOTS


class ModelFileError(ValueError):
    """The weights file is missing, unreadable, or made for another encoding or shape."""


_LOG2_65 = math.log2(65.0)  # the scales' denominators (a decision encodes rows thousands of times)
_LOG1P_TEN_DAYS = math.log1p(14400.0)


def log2_scaled(count: float, top: float = 64.0) -> float:
    """``log2(1 + count) / log2(1 + top)``: 0 at 0, 1 at ``top``."""
    return math.log2(1.0 + max(count, 0.0)) / (_LOG2_65 if top == 64.0 else math.log2(1.0 + top))


def share_scaled(share: float) -> float:
    """A share of the cluster (0..1), log-scaled so that small jobs differ: ``log2(1 + 64 x) / log2(65)``."""
    return log2_scaled(64.0 * min(max(share, 0.0), 1.0))


def minutes_scaled(seconds: float) -> float:
    """``log1p(minutes) / log1p(10 days in minutes)``: 0 at 0, 1 at ten days."""
    if not math.isfinite(seconds):
        return 1.0
    return min(math.log1p(max(seconds, 0.0) / 60.0) / _LOG1P_TEN_DAYS, 1.0)


class SlotFeatures(NamedTuple):
    """One job's features before scaling (what ``encode_slot`` turns into ``JOB_FEATURES`` floats), and the
    cluster's sizes they are relative to. (A named tuple: a decision makes one per row and action, and a frozen
    dataclass of 14 fields took longer to build than the row's encoding.)"""

    running: bool
    gpus_per_worker: int
    min_workers: int
    max_workers: int
    workers: int
    gain: float
    saving_s: float
    remaining_s: float
    waited_s: float
    added: bool
    removed: bool
    total_gpus: int
    server_gpus: int
    arrival: int


def encode_slot(f: SlotFeatures) -> list[float]:
    """The row of one job; ``unit / free`` (index ``UNIT_PER_FREE``) is 0 here (``Decision`` sets it)."""
    total = max(f.total_gpus, 1)
    saving_share = 1.0 if not math.isfinite(f.saving_s) else (
        min(f.saving_s / f.remaining_s, 1.0) if f.remaining_s > 0 else 0.0)
    return [
        1.0,
        float(f.running),
        min(f.gpus_per_worker / max(f.server_gpus, 1), 1.0),
        share_scaled(f.min_workers * f.gpus_per_worker / total),
        share_scaled(f.max_workers * f.gpus_per_worker / total),
        share_scaled(f.workers * f.gpus_per_worker / total),
        f.workers / f.max_workers if f.max_workers > 0 else 0.0,
        min(max(f.gain, 0.0), 1.0),
        max(saving_share, 0.0),
        minutes_scaled(f.saving_s),
        minutes_scaled(f.remaining_s),
        minutes_scaled(f.waited_s),
        0.0,
        float(f.added),
        float(f.removed),
        f.arrival / JOB_SLOTS,
    ]


def encode_globals(free_gpus: int, total_gpus: int, largest_block: int, server_gpus: int, demand_gpus: int,
                   visible_jobs: int, unseen_jobs: int) -> list[float]:
    total = max(total_gpus, 1)
    active = visible_jobs + unseen_jobs
    return [free_gpus / total if total_gpus > 0 else 0.0, min(largest_block / max(server_gpus, 1), 1.0),
            log2_scaled(demand_gpus / total, 16.0), unseen_jobs / active if active else 0.0,
            visible_jobs / JOB_SLOTS]


def unit_per_free(unit_gpus: np.ndarray, free_gpus: int) -> np.ndarray:
    """``unit / free`` per row, at most 1 (1 when nothing is free and the row has a unit)."""
    return np.minimum(unit_gpus / max(free_gpus, 0.5), 1.0).astype(np.float32)


class Pooling:
    """Which rows of an input are present, as ``Network.forward`` pools over them: the mean's weights (1 / the
    rows present, 0 for an empty row) and the max's mask (None when every row is present: nothing to mask)."""

    __slots__ = ("mask", "weight")

    def __init__(self, present: np.ndarray) -> None:
        self.weight = present.astype(np.float32) / max(int(present.sum()), 1)
        self.mask: np.ndarray | None = None if present.all() else present[:, None]

    @classmethod
    def of(cls, rows: int) -> Pooling:
        """The first ``rows`` rows present (as ``policies.dl2.Decision`` fills them)."""
        return cls(np.arange(JOB_SLOTS) < rows)

    def pool(self, layer: np.ndarray) -> np.ndarray:
        """The mean and the max of ``layer`` (rows x H) over the present rows: 2H values."""
        top = (layer if self.mask is None else np.where(self.mask, layer, -1.0)).max(axis=0)
        return np.concatenate((self.weight @ layer, top))


@dataclass
class Network:
    """The network's weights as numpy arrays (float32), and its shape's provenance (``meta``)."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    wp: np.ndarray
    bp: np.ndarray
    ws: np.ndarray
    bs: np.ndarray
    wv: np.ndarray
    bv: np.ndarray
    meta: dict[str, Any]

    @property
    def hidden(self) -> int:
        return int(self.w1.shape[1])

    @property
    def preempts(self) -> bool:
        """Whether the network was trained with preemption among its actions (``meta["preemption"]``; weights
        from before it existed were not): only then may its removals take a job's last gang
        (``policies.dl2.Decision``)."""
        return bool(self.meta.get("preemption", False))

    def forward(self, x: np.ndarray, pooling: Pooling | None = None) -> tuple[np.ndarray, float]:
        """Action logits and the value for one input vector: ``forward_batch``'s function (a test checks it),
        written for one vector, the live decision's hot path (the layers split by input block: no copies).
        ``pooling``: the rows present in ``x`` when the caller knows them (``Pooling.of``; a decision's rows
        stay present for all its steps), else read from ``x``."""
        logits, pooled = self._policy(x, pooling)
        return logits, float(pooled @ self.wv + self.bv)

    def logits(self, x: np.ndarray, pooling: Pooling | None = None) -> np.ndarray:
        """``forward``'s logits alone (what a decision reads: the value only trains)."""
        return self._policy(x, pooling)[0]

    def _policy(self, x: np.ndarray, pooling: Pooling | None) -> tuple[np.ndarray, np.ndarray]:
        """The logits and the pooled last layer (the value head's input)."""
        rows = x[:JOB_SLOTS * JOB_FEATURES].reshape(JOB_SLOTS, JOB_FEATURES)
        if pooling is None:
            pooling = Pooling(rows[:, 0] > 0)
        e = np.tanh(rows @ self.w1[:JOB_FEATURES] + (x[JOB_SLOTS * JOB_FEATURES:] @ self.w1[JOB_FEATURES:] + self.b1))
        hidden = e.shape[1]
        h = np.tanh(e @ self.w2[:hidden] + (pooling.pool(e) @ self.w2[hidden:] + self.b2))
        per_job = h @ self.wp + self.bp
        pooled = pooling.pool(h)
        logits = np.empty(action_count(), dtype=np.float32)
        logits[:JOB_SLOTS] = per_job[:, 0]
        logits[JOB_SLOTS:STOP] = per_job[:, 1]
        logits[STOP] = pooled @ self.ws + self.bs
        return logits, pooled

    def forward_batch(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Action logits ``(B, action_count())`` and values ``(B,)`` for a batch of input vectors (module doc)."""
        batch = x.shape[0]
        rows = x[:, :JOB_SLOTS * JOB_FEATURES].reshape(batch, JOB_SLOTS, JOB_FEATURES)
        cluster = np.broadcast_to(x[:, None, JOB_SLOTS * JOB_FEATURES:], (batch, JOB_SLOTS, GLOBAL_FEATURES))
        present = (rows[:, :, 0] > 0)[:, :, None]
        e = np.tanh(np.concatenate([rows, cluster], axis=2) @ self.w1 + self.b1)
        context = _pool(e, present)
        h = np.tanh(np.concatenate([e, np.broadcast_to(context[:, None, :], (batch, JOB_SLOTS, context.shape[1]))],
                                   axis=2) @ self.w2 + self.b2)
        per_job = h @ self.wp + self.bp
        pooled = _pool(h, present)
        stop = pooled @ self.ws + self.bs
        logits = np.concatenate([per_job[:, :, 0], per_job[:, :, 1], stop[:, None]], axis=1)
        return logits, pooled @ self.wv + self.bv

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in _ARRAYS}


def _pool(e: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Mean and max of ``e`` (``B x rows x H``, values in -1..1) over the present rows: ``B x 2H`` (zeros and
    -1 with none present)."""
    count = np.maximum(present.sum(axis=1), 1)
    mean = (e * present).sum(axis=1) / count
    top = np.where(present, e, -1.0).max(axis=1)
    return np.concatenate([mean, top], axis=1)


def expected_shapes(hidden: int) -> dict[str, tuple[int, ...]]:
    return {"w1": (JOB_FEATURES + GLOBAL_FEATURES, hidden), "b1": (hidden,), "w2": (3 * hidden, hidden),
            "b2": (hidden,), "wp": (hidden, 2), "bp": (2,), "ws": (2 * hidden,), "bs": (), "wv": (2 * hidden,),
            "bv": ()}


def shape_meta(hidden: int) -> dict[str, int]:
    return {"encoding_version": ENCODING_VERSION, "job_slots": JOB_SLOTS, "job_features": JOB_FEATURES,
            "global_features": GLOBAL_FEATURES, "hidden": hidden, "actions": action_count()}


def random_network(hidden: int = DEFAULT_HIDDEN, seed: int = 0) -> Network:
    """Random weights, Glorot-scaled (for tests and as training's start when torch is not the one initialising)."""
    rng = np.random.default_rng(seed)
    arrays = {}
    for name, shape in expected_shapes(hidden).items():
        fan_in = shape[0] if shape else 1
        scale = 1.0 / math.sqrt(fan_in) if name.startswith("w") else 0.0
        arrays[name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return Network(**arrays, meta={**shape_meta(hidden), "made_by": f"random_network(seed={seed})"})


def save_network(network: Network, path: str | Path, **provenance: Any) -> None:
    """Write the weights and their ``meta`` (shape + ``provenance``: command, seed, ...) to ``path``."""
    meta = {**network.meta, **shape_meta(network.hidden), **provenance}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as handle:
        np.savez_compressed(handle, meta=np.array(json.dumps(meta, sort_keys=True)), **network.arrays())  # type: ignore[arg-type]


def load_network(path: str | Path) -> Network:
    """The network in ``path``; ModelFileError (saying what to do) when it is missing, unreadable, or
    made for another encoding version or shape than this module's."""
    path = Path(path)
    fix = "train one with `aryl-sim train-dl2` or set policy.dl2_model to a file it wrote"
    if not path.is_file():
        raise ModelFileError(f"dl2 weights file {str(path)!r} does not exist; {fix}")
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            hidden = int(meta.get("hidden", -1))
            want = shape_meta(hidden)
            got = {k: meta.get(k) for k in want}
            if got != want:
                raise ModelFileError(f"dl2 weights file {str(path)!r} was made for encoding {got}, this Aryl uses "
                                     f"{want}; {fix}")
            arrays = {name: np.asarray(data[name], dtype=np.float32) for name in _ARRAYS}
    except ModelFileError:
        raise
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"dl2 weights file {str(path)!r} is not a dl2 weights file ({exc}); {fix}") from None
    for name, shape in expected_shapes(hidden).items():
        if arrays[name].shape != shape:
            raise ModelFileError(f"dl2 weights file {str(path)!r}: array {name} has shape {arrays[name].shape}, "
                                 f"expected {shape}; {fix}")
    return Network(**arrays, meta=meta)


# --------------------------------------------------------------------------------------------------
# PyTorch twin (training and online learning only)
# --------------------------------------------------------------------------------------------------


def torch_network(network: Network) -> Any:
    """A ``torch.nn.Module`` with ``network``'s weights: ``module(x) -> (logits, value)`` on a batch, the same
    function as ``Network.forward_batch``. Its parameters carry the arrays' names (``module.w1``, ...);
    ``policy_parameters`` are the policy's."""
    import torch
    from torch import nn

    class TorchNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name in _ARRAYS:
                setattr(self, name, nn.Parameter(torch.from_numpy(np.array(getattr(network, name), dtype=np.float32))))

        def forward(self, x: Any) -> tuple[Any, Any]:
            p: dict[str, Any] = {name: getattr(self, name) for name in _ARRAYS}
            batch = x.shape[0]
            rows = x[:, :JOB_SLOTS * JOB_FEATURES].reshape(batch, JOB_SLOTS, JOB_FEATURES)
            cluster = x[:, None, JOB_SLOTS * JOB_FEATURES:].expand(batch, JOB_SLOTS, GLOBAL_FEATURES)
            present = (rows[:, :, 0] > 0).unsqueeze(2)
            e = torch.tanh(torch.cat([rows, cluster], dim=2) @ p["w1"] + p["b1"])
            context = self._pool(e, present)
            h = torch.tanh(torch.cat([e, context.unsqueeze(1).expand(batch, JOB_SLOTS, context.shape[1])], dim=2)
                           @ p["w2"] + p["b2"])
            per_job = h @ p["wp"] + p["bp"]
            pooled = self._pool(h, present)
            logits = torch.cat([per_job[:, :, 0], per_job[:, :, 1], (pooled @ p["ws"] + p["bs"]).unsqueeze(1)], dim=1)
            return logits, pooled @ p["wv"] + p["bv"]

        @staticmethod
        def _pool(e: Any, present: Any) -> Any:
            count = present.sum(dim=1).clamp(min=1)
            mean = (e * present).sum(dim=1) / count
            top = e.masked_fill(~present, -1.0).max(dim=1).values
            return torch.cat([mean, top], dim=1)

    return TorchNet()


def policy_parameters(module: Any) -> list[Any]:
    """The parameters of a ``torch_network`` module that make the action logits (not the value head's)."""
    return [getattr(module, name) for name in POLICY_ARRAYS]


def from_torch(module: Any, meta: dict[str, Any]) -> Network:
    """The numpy network of a ``torch_network`` module (a copy: later training does not change it)."""
    def np_of(t: Any) -> np.ndarray:
        return np.asarray(t.detach().cpu().numpy(), dtype=np.float32).copy()

    return Network(**{name: np_of(getattr(module, name)) for name in _ARRAYS}, meta=dict(meta))
