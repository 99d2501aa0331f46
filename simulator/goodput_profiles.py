"""The measured ground truth of the goodput job model: one ``Application`` per DL model of the Pollux
study (OSDI'21, section 5.3), read at run time from its data folder (``pollux-data/traces/<model>/``,
never copied into this repository; see ``pollux-data/README.md`` for the files).

What a simulated job's true speed comes from (the authors' simulator takes the same choices; they
are stated here because each changes the figures):

- **step time** of a placement (GPUs per node, e.g. (4, 4, 2)) at an atomic batch size: the placement is
  normalised to its lexicographically smallest rotation; if ``placements.csv`` measured that placement,
  step and sync times are interpolated linearly in the atomic batch size between its measured rows;
  otherwise they are interpolated linearly (Delaunay, scipy's ``LinearNDInterpolator``) in
  (nodes, replicas, atomic batch) over the per-key mean of ``placements.csv`` followed by
  ``scalability.csv``, with nodes capped at 16. A step with ``k`` accumulation passes costs
  ``step + k * (step - sync)``.
- **gradient statistics** (``grad_sqr``, ``grad_var``) during epoch ``e`` at total batch ``B``: linear in
  ``B`` between the two validated batch sizes around it (``validation-<B>.csv``, row ``e``).
- **progress**: counted in iterations at the initial (smallest validated) batch size; epoch ``e`` ends at
  the smallest ``progress`` any validation run reached at the end of its epoch ``e`` (row ``e - 1``).
- **target**: every job trains for ``max_epochs`` epochs (bert 2, cifar10 100, deepspeech2 80,
  imagenet 90, ncf 10, yolov3 50; no target metric).
- **limits**: batch sizes from the smallest to the largest validated one; atomic batch from the smallest
  to the largest ``local_bsz`` measured, except yolov3 whose largest is 8 (GPU memory).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from scheduler_service.core.goodput import GradParams, efficiency_gain

# The authors' per-model settings: epochs trained, and a smaller largest atomic batch where GPU memory
# (not the measurements) limits it.
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
MAX_ATOMIC_BSZ = {"yolov3": 8}
MAX_NODES_INTERPOLATED = 16  # scalability.csv reaches 16 nodes


class ProfileError(ValueError):
    """A profile folder is missing or malformed; the message names the file."""


def normalise_placement(placement: tuple[int, ...]) -> tuple[int, ...]:
    """GPUs per node without empty nodes, rotated to the lexicographically smallest rotation (a ring's
    throughput does not depend on where it starts)."""
    used = tuple(g for g in placement if g)
    return min(used[i:] + used[:i] for i in range(len(used)))


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[float, ...]]:
    try:
        with path.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in columns if c not in (reader.fieldnames or ())]
            if missing:
                raise ProfileError(f"{path}: missing column(s) {', '.join(missing)}")
            return [tuple(float(row[c]) for c in columns) for row in reader]
    except OSError as exc:
        raise ProfileError(f"{path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        if isinstance(exc, ProfileError):
            raise
        raise ProfileError(f"{path}: not a number: {exc}") from exc


@dataclass(frozen=True, slots=True)
class ValidationRun:
    """One validation run at a fixed total batch size: per-epoch rows."""

    progress: np.ndarray
    iteration: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


@dataclass
class Application:
    """One model's measured profile and limits (see the module doc). Lookups are memoised."""

    name: str
    validation: dict[int, ValidationRun]          # ascending batch size
    placements: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # id -> (bsz, step, sync), bsz ascending
    interp_points: np.ndarray                     # (nodes, replicas, bsz) rows for the N-d interpolation
    interp_values: np.ndarray                     # (step, sync) rows
    max_epochs: int
    min_atomic_bsz: int
    max_atomic_bsz: int
    _batches: list[int] = field(default_factory=list, repr=False)
    _interp: Any = field(default=None, repr=False)
    _step_memo: dict[tuple[tuple[int, ...], int], tuple[float, float]] = field(default_factory=dict, repr=False)
    _grad_memo: dict[tuple[float, int], GradParams] = field(default_factory=dict, repr=False)
    _epoch_ends: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._batches = sorted(self.validation)
        self._epoch_ends = [0.0] + [min(float(v.progress[e - 1]) for v in self.validation.values())
                                    for e in range(1, self.max_epochs + 1)]

    @property
    def init_batch_size(self) -> int:
        return self._batches[0]

    @property
    def max_batch_size(self) -> int:
        return self._batches[-1]

    def step_times(self, placement: tuple[int, ...], atomic_bsz: int) -> tuple[float, float]:
        """(step, sync) seconds of one step on ``placement`` at ``atomic_bsz`` (module doc)."""
        key = (placement, atomic_bsz)
        known = self._step_memo.get(key)
        if known is None:
            known = self._step_memo[key] = self._step_times(normalise_placement(placement), atomic_bsz)
        return known

    def _step_times(self, placement: tuple[int, ...], atomic_bsz: int) -> tuple[float, float]:
        pid = int("".join(map(str, placement)))
        measured = self.placements.get(pid)
        if measured is not None:
            bsz, step, sync = measured
            if not bsz[0] <= atomic_bsz <= bsz[-1]:
                raise ValueError(f"{self.name}: atomic batch {atomic_bsz} outside the measured "
                                 f"{int(bsz[0])}..{int(bsz[-1])} of placement {pid}")
            return float(np.interp(atomic_bsz, bsz, step)), float(np.interp(atomic_bsz, bsz, sync))
        if self._interp is None:
            from scipy.interpolate import LinearNDInterpolator  # scipy: only the goodput model needs it

            self._interp = LinearNDInterpolator(self.interp_points, self.interp_values)
        nodes = min(len(placement), MAX_NODES_INTERPOLATED)
        step, sync = self._interp([nodes, sum(placement), atomic_bsz])[0]
        if not (math.isfinite(step) and math.isfinite(sync)):
            raise ValueError(f"{self.name}: placement {placement} at atomic batch {atomic_bsz} is outside "
                             "the measured configurations")
        return float(step), float(sync)

    def _bracket(self, batch_size: float) -> tuple[int, int]:
        lower = upper = None
        for b in self._batches:
            if b <= batch_size:
                lower = b
            if b >= batch_size:
                upper = b
                break
        if lower is None or upper is None:
            raise ValueError(f"{self.name}: batch size {batch_size} outside the validated "
                             f"{self._batches[0]}..{self._batches[-1]}")
        return lower, upper

    def _interpolate(self, batch_size: float, column: str, epoch: int) -> float:
        lower, upper = self._bracket(batch_size)
        low = float(getattr(self.validation[lower], column)[epoch])
        if lower == upper:
            return low
        high = float(getattr(self.validation[upper], column)[epoch])
        return ((batch_size - lower) * high + (upper - batch_size) * low) / (upper - lower)

    def grad_params(self, batch_size: float, epoch: int) -> GradParams:
        """The gradient statistics measured during ``epoch`` at total batch ``batch_size``."""
        key = (batch_size, epoch)
        known = self._grad_memo.get(key)
        if known is None:
            known = self._grad_memo[key] = GradParams(self._interpolate(batch_size, "grad_sqr", epoch),
                                                      self._interpolate(batch_size, "grad_var", epoch))
        return known

    def gain(self, batch_size: float, epoch: int) -> float:
        """Progress of one step at ``batch_size`` during ``epoch``, in steps at the initial batch size."""
        return efficiency_gain(self.grad_params(batch_size, epoch), self.init_batch_size, batch_size)

    def epoch_end(self, epoch: int) -> float:
        """Progress at which ``epoch`` (0-based) ends, i.e. at which epoch ``epoch + 1`` begins."""
        return self._epoch_ends[epoch + 1]

    def iterations_after(self, batch_size: float, epoch: int) -> float:
        """Iterations run at ``batch_size`` once ``epoch`` is complete (for an oracle of remaining work)."""
        return self._interpolate(batch_size, "iteration", epoch)

    @property
    def completion_epoch(self) -> int:
        """A job completes when it finishes this (0-based) epoch."""
        return self.max_epochs - 1


def load_application(data_dir: str | Path, name: str, gpu_type: str = "") -> Application:
    """Read ``<data_dir>/<name>/`` (memoised per folder). ``gpu_type``: the profile of that GPU type,
    ``placements-<type>.csv`` and ``scalability-<type>.csv`` (the Sia study's layout, ``simulator.hetero``)."""
    return _load_application(str(Path(data_dir).resolve()), name, gpu_type)


@lru_cache(maxsize=64)
def _load_application(data_dir: str, name: str, gpu_type: str = "") -> Application:
    root = Path(data_dir) / name
    if name not in MAX_EPOCHS:
        raise ProfileError(f"unknown application {name!r}; known: {', '.join(sorted(MAX_EPOCHS))}")
    if not root.is_dir():
        raise ProfileError(f"no profile folder {root} (set the Pollux data directory)")
    validation: dict[int, ValidationRun] = {}
    for path in root.glob("validation-*.csv"):
        rows = np.array(_read_rows(path, ("progress", "iteration", "grad_sqr", "grad_var")), dtype=float)
        if len(rows) < MAX_EPOCHS[name]:
            raise ProfileError(f"{path}: {len(rows)} epoch rows, the model trains {MAX_EPOCHS[name]}")
        validation[int(path.stem.split("-")[-1])] = ValidationRun(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3])
    if not validation:
        raise ProfileError(f"{root}: no validation-*.csv")
    suffix = f"-{gpu_type}" if gpu_type else ""
    placement_rows = _read_rows(root / f"placements{suffix}.csv", ("placement", "local_bsz", "step_time", "sync_time"))
    by_id: dict[int, list[tuple[float, float, float]]] = {}
    by_key: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
    for pid, bsz, step, sync in placement_rows:
        by_id.setdefault(int(pid), []).append((bsz, step, sync))
        digits = [int(d) for d in str(int(pid))]
        by_key.setdefault((len(digits), sum(digits), int(bsz)), []).append((step, sync))
    placements = {}
    for pid, measured in by_id.items():
        table = np.array(sorted(measured, key=lambda r: r[0]), dtype=float)
        placements[pid] = (table[:, 0], table[:, 1], table[:, 2])
    # The N-d interpolation's points, in the order the authors' simulator hands them to Qhull (the per-key
    # means sorted by key, then scalability.csv as read): the same points in another order may triangulate
    # a degenerate (grid) point set differently.
    keys = sorted(by_key)
    points: list[list[float]] = [[float(x) for x in k] for k in keys]
    values = [[float(np.mean([s for s, _ in by_key[k]])), float(np.mean([y for _, y in by_key[k]]))] for k in keys]
    for nodes, replicas, bsz, step, sync in _read_rows(root / f"scalability{suffix}.csv",
                                                       ("num_nodes", "num_replicas", "local_bsz", "step_time",
                                                        "sync_time")):
        points.append([nodes, replicas, bsz])
        values.append([step, sync])
    local = [int(r[1]) for r in placement_rows]
    return Application(
        name=name, validation=dict(sorted(validation.items())), placements=placements,
        interp_points=np.array(points, dtype=float), interp_values=np.array(values, dtype=float),
        max_epochs=MAX_EPOCHS[name], min_atomic_bsz=min(local),
        max_atomic_bsz=MAX_ATOMIC_BSZ.get(name, max(local)),
    )
