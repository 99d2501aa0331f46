"""The ``dl2`` policy's network and its input encoding: what the network sees, what it outputs, and the
weights file. Plain numpy; PyTorch only where weights are trained (``torch_network``, imported lazily).

**Encoding** (version ``ENCODING_VERSION``; a fixed-size vector of ``input_size()`` floats):

- ``JOB_SLOTS`` slots, one per active (PENDING or RUNNING) job, the oldest first (submission time, then
  job id, as DL2 orders its jobs by arrival); jobs past the last slot are not seen and keep their state
  this cycle. An empty slot is all zeros. Per slot, ``JOB_FEATURES`` features, each scaled to about
  0..1 (counts on a log2 scale, durations as log1p of minutes):
  ``present``, ``running`` (at the snapshot), ``gpus_per_worker``, ``min_workers``, ``max_workers``,
  ``workers`` (in this decision so far), ``workers / max_workers``, ``gain`` (relative speed-up of its next
  unit: 1 for a job with no workers, else ``speed(w + 1) / speed(w) - 1``), ``saving`` (seconds of
  remaining time one more worker saves, ``remaining(w) - remaining(w + 1)``; 1 for a job with no workers),
  ``remaining`` (estimated remaining time at its workers, or at ``min_workers`` when it has none),
  ``waited`` (since submission), ``added`` and ``removed`` (in this decision).
- then ``GLOBAL_FEATURES`` features: free GPUs / all GPUs, free GPUs (log2), all GPUs (log2), the
  number of active jobs not seen (log2).

**Actions** (``action_count()``): ``i`` in ``0..JOB_SLOTS-1`` adds a unit to the job in slot ``i`` (its
``min_workers`` gang when it has no workers, else one worker); ``JOB_SLOTS + i`` removes one from it (one
worker, or its whole gang at ``min_workers``: a preemption); ``2 x JOB_SLOTS`` stops the decision.

**Network**: input -> ``hidden`` (tanh) -> ``hidden`` (tanh) -> action logits, and a value head (a
scalar, the expected return, used as the baseline in training).

**Weights file** (``.npz``): the arrays ``w1 b1 w2 b2 wp bp wv bv`` and ``meta``, a JSON string with the
encoding version, the shape (slots, features, globals, hidden, actions) and how the weights were made.
``load_network`` refuses a file whose encoding or shape differs from this module's (``ModelFileError``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ENCODING_VERSION = 1
JOB_SLOTS = 32
JOB_FEATURES = 13
GLOBAL_FEATURES = 4
DEFAULT_HIDDEN = 64
_ARRAYS = ("w1", "b1", "w2", "b2", "wp", "bp", "wv", "bv")
# The weights shipped with Aryl (``aryl-sim train-dl2``, the command and seed in their ``meta``).
BUNDLED_MODEL = Path(__file__).resolve().parent / "data" / "dl2.npz"


def input_size() -> int:
    return JOB_SLOTS * JOB_FEATURES + GLOBAL_FEATURES


def action_count() -> int:
    return 2 * JOB_SLOTS + 1


STOP = 2 * JOB_SLOTS


class ModelFileError(ValueError):
    """The weights file is missing, unreadable, or made for another encoding or shape."""


def log2_scaled(count: float, top: float = 64.0) -> float:
    """``log2(1 + count) / log2(1 + top)``: 0 at 0, 1 at ``top``."""
    return math.log2(1.0 + max(count, 0.0)) / math.log2(1.0 + top)


def minutes_scaled(seconds: float) -> float:
    """``log1p(minutes) / log1p(10 days in minutes)``: 0 at 0, 1 at ten days."""
    if not math.isfinite(seconds):
        return 1.0
    return min(math.log1p(max(seconds, 0.0) / 60.0) / math.log1p(14400.0), 1.0)


@dataclass(frozen=True, slots=True)
class SlotFeatures:
    """One job's features before scaling (what ``encode_slot`` turns into ``JOB_FEATURES`` floats)."""

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


def encode_slot(f: SlotFeatures) -> list[float]:
    return [
        1.0,
        float(f.running),
        log2_scaled(f.gpus_per_worker, 8.0),
        log2_scaled(f.min_workers),
        log2_scaled(f.max_workers),
        log2_scaled(f.workers),
        f.workers / f.max_workers if f.max_workers > 0 else 0.0,
        min(max(f.gain, 0.0), 1.0),
        minutes_scaled(f.saving_s),
        minutes_scaled(f.remaining_s),
        minutes_scaled(f.waited_s),
        float(f.added),
        float(f.removed),
    ]


def encode_globals(free_gpus: int, total_gpus: int, unseen_jobs: int) -> list[float]:
    return [free_gpus / total_gpus if total_gpus > 0 else 0.0, log2_scaled(free_gpus, 4096.0),
            log2_scaled(total_gpus, 4096.0), log2_scaled(unseen_jobs, 4096.0)]


@dataclass
class Network:
    """The MLP's weights as numpy arrays (float32), and its shape's provenance (``meta``)."""

    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    wp: np.ndarray
    bp: np.ndarray
    wv: np.ndarray
    bv: np.ndarray
    meta: dict[str, Any]

    @property
    def hidden(self) -> int:
        return int(self.w1.shape[1])

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, float]:
        """Action logits and the value for one input vector."""
        h = np.tanh(x @ self.w1 + self.b1)
        h = np.tanh(h @ self.w2 + self.b2)
        return h @ self.wp + self.bp, float(h @ self.wv + self.bv)

    def arrays(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in _ARRAYS}


def expected_shapes(hidden: int) -> dict[str, tuple[int, ...]]:
    n_in, n_out = input_size(), action_count()
    return {"w1": (n_in, hidden), "b1": (hidden,), "w2": (hidden, hidden), "b2": (hidden,),
            "wp": (hidden, n_out), "bp": (n_out,), "wv": (hidden,), "bv": ()}


def shape_meta(hidden: int) -> dict[str, int]:
    return {"encoding_version": ENCODING_VERSION, "job_slots": JOB_SLOTS, "job_features": JOB_FEATURES,
            "global_features": GLOBAL_FEATURES, "hidden": hidden, "actions": action_count()}


def random_network(hidden: int = DEFAULT_HIDDEN, seed: int = 0) -> Network:
    """Small random weights (for tests and as training's start when torch is not the one initialising)."""
    rng = np.random.default_rng(seed)
    arrays = {name: (rng.standard_normal(shape) * (0.1 if len(shape) == 2 else 0.0)).astype(np.float32)
              for name, shape in expected_shapes(hidden).items()}
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
            arrays = {name: np.asarray(data[name], dtype=np.float32) for name in _ARRAYS}
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise ModelFileError(f"dl2 weights file {str(path)!r} is not a dl2 weights file ({exc}); {fix}") from None
    hidden = int(meta.get("hidden", -1))
    want = shape_meta(hidden)
    got = {k: meta.get(k) for k in want}
    if got != want:
        raise ModelFileError(f"dl2 weights file {str(path)!r} was made for encoding {got}, this Aryl uses {want}; "
                             f"{fix}")
    for name, shape in expected_shapes(hidden).items():
        if arrays[name].shape != shape:
            raise ModelFileError(f"dl2 weights file {str(path)!r}: array {name} has shape {arrays[name].shape}, "
                                 f"expected {shape}; {fix}")
    return Network(**arrays, meta=meta)


# --------------------------------------------------------------------------------------------------
# PyTorch twin (training and online learning only)
# --------------------------------------------------------------------------------------------------


def torch_network(network: Network) -> Any:
    """A ``torch.nn.Module`` with ``network``'s weights: ``module(x) -> (logits, value)`` on a batch."""
    import torch
    from torch import nn

    class TorchNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1 = nn.Linear(input_size(), network.hidden)
            self.l2 = nn.Linear(network.hidden, network.hidden)
            self.policy = nn.Linear(network.hidden, action_count())
            self.value = nn.Linear(network.hidden, 1)

        def forward(self, x: Any) -> tuple[Any, Any]:
            h = torch.tanh(self.l2(torch.tanh(self.l1(x))))
            return self.policy(h), self.value(h).squeeze(-1)

    module = TorchNet()
    with torch.no_grad():
        for layer, w, b in ((module.l1, network.w1, network.b1), (module.l2, network.w2, network.b2),
                            (module.policy, network.wp, network.bp)):
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.T)))
            layer.bias.copy_(torch.from_numpy(np.ascontiguousarray(b)))
        module.value.weight.copy_(torch.from_numpy(network.wv.reshape(1, -1).copy()))
        module.value.bias.copy_(torch.from_numpy(network.bv.reshape(1).copy()))
    return module


def from_torch(module: Any, meta: dict[str, Any]) -> Network:
    """The numpy network of a ``torch_network`` module (a copy: later training does not change it)."""
    def np_of(t: Any) -> np.ndarray:
        return np.asarray(t.detach().cpu().numpy(), dtype=np.float32).copy()

    return Network(w1=np_of(module.l1.weight).T.copy(), b1=np_of(module.l1.bias), w2=np_of(module.l2.weight).T.copy(),
                   b2=np_of(module.l2.bias), wp=np_of(module.policy.weight).T.copy(), bp=np_of(module.policy.bias),
                   wv=np_of(module.value.weight).reshape(-1), bv=np_of(module.value.bias).reshape(()),
                   meta=dict(meta))
