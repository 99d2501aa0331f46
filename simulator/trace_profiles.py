"""Pollux's measured throughput profiles, as the trace loaders turn them into speed curves.

What this module is for: reading one application's profile folder
(``../shared/traces/pollux-throughput-profiles/<model>/``) into a ``PolluxProfile`` that answers a
job's goodput at a GPU count and batch size, by the rules below. ``simulator.traces`` builds every
profile-backed job's speed curve from it. (The goodput job model's own ground truth, with gradient
statistics and Delaunay interpolation, is ``simulator.goodput_profiles``: a different reading of the
Pollux study's data for a different purpose.)
What it must never do: decide anything at run time, or depend on files inside the repository (the
profiles folder is an argument).

Pollux profiles
---------------
(``../shared/traces/pollux-throughput-profiles/<model>/``, Apache-2.0, measured on 16 nodes x 4 T4.)
One replica = one GPU. For a job with total batch size ``B`` on ``r`` GPUs:

- **Placement.** The tightest packing on the 4-GPU testbed nodes (``ceil(r/4)`` nodes, as Pollux's
  ``get_configurations`` does). ``r <= 16``: the measured ``placements.csv`` row of that placement
  (e.g. 6 GPUs = ``24``, rotations normalised to the smallest as Pollux does). ``r > 16``:
  ``scalability.csv`` rows with ``num_nodes = r/4`` (measured at 24, 32, 48 and 64 GPUs); between
  measured counts, step and sync time are interpolated linearly in ``r`` (with 16 GPUs = ``4444``
  as the lower anchor). Above 64 GPUs nothing was measured: those sizes are not offered.
- **Batch size as the job scales.** Pollux's rule without a fitted model
  (``simulator.py: update_local_bsz``): ``M(r) = max(B, r * min_local_bsz)``, so the batch stays
  ``B`` until each GPU would go below the smallest measured local batch, and then grows. ``M(r) >
  max_batch_size`` (the largest ``validation-*.csv``) is infeasible: that size is not offered.
  Local batches above ``max_local_bsz`` use gradient accumulation exactly as Pollux does:
  ``accum = ceil(local / max_local) - 1`` extra micro-steps, ``atomic = ceil(local / (accum + 1))``,
  and one iteration takes ``step(atomic) + accum * (step(atomic) - sync(atomic))``; step and sync are
  interpolated linearly in ``local_bsz`` within a placement's measurements.
- **Work and statistical efficiency.** A job is done when it has trained for the profile's epochs
  (the number of rows in ``validation-*.csv``: bert 2, cifar10 100, deepspeech2 80, imagenet 90,
  ncf 10, yolov3 50 -- the ``max_epochs`` of Pollux's ``applications.py``). The validation runs are
  aligned on statistical progress, so ``samples(B) = iteration_final(B) * B`` -- the ``iteration``
  of the last row of ``validation-B.csv`` times ``B``, linear in ``B`` between measured batch sizes
  as Pollux's ``get_iteration`` does -- is the number of samples the job needs at batch ``B`` (the
  same quantity Pollux's ``get_configurations`` uses to estimate a configuration's JCT). A Pollux
  workload job's ``work`` is ``samples(B)``; its speed at ``r`` GPUs is the *goodput in
  B-equivalent samples/s*: ``M / t_iter * samples(B) / samples(M)`` -- raw throughput, discounted by
  how many more samples the larger batch needs.
- **Cleaning.** Measured goodput is not always monotone in ``r`` (crossing a node boundary, e.g.
  4 -> 5 GPUs, adds network synchronisation; a grown batch costs statistical efficiency). The curve
  is cleaned with a running maximum -- the speed at ``r`` is the best speed at any size ``<= r``,
  i.e. surplus GPUs would idle rather than slow the job -- and ``max_workers`` is cut at the first
  size that reaches the curve's maximum. Curves are not made concave: some keep the measured
  plateau-then-rise at node boundaries (the knapsack does not need concavity). Example, bert at
  batch 12 from 1 GPU: measured 1.00, 1.57, 1.85, 2.07 on 1-4 GPUs, then 0.65 on 5 (two nodes) and
  only 2.10 again at 11 GPUs -- cleaned, a 1-GPU bert job declares 1..4 workers. NCF's measured
  goodput never rises above one GPU at small batches, so NCF jobs end up inelastic (Pollux pins NCF
  to one replica too).
- **Check.** Against the Pollux simulator's own Tiresias runs of ``workloads-realistic``
  (``pollux-data/reference-runs``): for 1-GPU jobs that started at once, the simulator's JCT is this
  runtime at base size plus its 30-s start delay (cifar10 4,028 s here vs 4,030 s there; bert, deepspeech2,
  ncf, yolov3 within 2%). Multi-node jobs differ by up to ~20% because that simulator placed them
  differently from the tightest packing used here.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import numpy as np

from simulator.trace_csv import TraceFormatError, _dict_rows, _parse

__all__ = ["POLLUX_APPLICATIONS", "PolluxProfile", "load_pollux_profile"]


POLLUX_APPLICATIONS: tuple[str, ...] = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
# Pollux's applications.py forces yolov3's largest local batch to 8 (its placements go up to 16).
_POLLUX_MAX_LOCAL_BSZ = {"yolov3": 8}
_POLLUX_GPUS_PER_NODE = 4  # the profiles' testbed: g4dn.12xlarge, 4 x T4 per node


class PolluxProfile:
    """One application's measured step times and validation runs, with the goodput rule of the
    module doc. Built by ``load_pollux_profile``; immutable after construction."""

    def __init__(
        self,
        name: str,
        placements: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]],
        scalability: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]],
        validation: dict[int, np.ndarray],
        min_local_bsz: int,
        max_local_bsz: int,
    ):
        self.name = name
        self.min_local_bsz = min_local_bsz
        self.max_local_bsz = max_local_bsz
        self.epochs = min(len(its) for its in validation.values())
        self._val_bsz = np.array(sorted(validation), dtype=float)
        self._val_final_iter = np.array([validation[b][self.epochs - 1] for b in sorted(validation)], dtype=float)
        self.init_batch_size = int(self._val_bsz[0])
        self.max_batch_size = int(self._val_bsz[-1])
        # Step-time anchors for the packed placement of r GPUs (module doc, "Placement").
        anchors: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for r in range(1, 4 * _POLLUX_GPUS_PER_NODE + 1):  # placements.csv: up to 4 nodes
            pid = _placement_id(_packed_placement(r))
            if pid in placements:
                anchors[r] = placements[pid]
        for (nodes, replicas), table in scalability.items():
            if nodes == math.ceil(replicas / _POLLUX_GPUS_PER_NODE) and replicas not in anchors:
                anchors[replicas] = table
        self._anchor_r = np.array(sorted(anchors))
        self._anchors = anchors
        self.max_replicas = int(self._anchor_r[-1])
        self._goodput_memo: dict[tuple[int, int], float | None] = {}

    def samples_to_finish(self, batch_size: float) -> float:
        """Samples the job needs at total batch ``batch_size`` (``iteration_final(B) * B``)."""
        b = min(max(float(batch_size), self._val_bsz[0]), self._val_bsz[-1])
        return float(np.interp(b, self._val_bsz, self._val_final_iter)) * b

    def clamp_batch(self, batch_size: float) -> int:
        return int(min(max(batch_size, self.init_batch_size), self.max_batch_size))

    def _step_sync(self, replicas: int, atomic_bsz: int) -> tuple[float, float] | None:
        def at(r: int) -> tuple[float, float]:
            bsz, step, sync = self._anchors[r]
            return float(np.interp(atomic_bsz, bsz, step)), float(np.interp(atomic_bsz, bsz, sync))

        if replicas in self._anchors:
            return at(replicas)
        i = int(np.searchsorted(self._anchor_r, replicas))
        if i == 0 or i >= len(self._anchor_r):
            return None  # not measured
        lo, hi = int(self._anchor_r[i - 1]), int(self._anchor_r[i])
        (s0, y0), (s1, y1) = at(lo), at(hi)
        f = (replicas - lo) / (hi - lo)
        return s0 + f * (s1 - s0), y0 + f * (y1 - y0)

    def goodput(self, replicas: int, batch_size: int) -> float | None:
        """B-equivalent samples/s of a job with base batch ``batch_size`` on ``replicas`` GPUs, or
        ``None`` where the profile cannot run it (batch too large, or more GPUs than measured)."""
        key = (replicas, batch_size)
        if key not in self._goodput_memo:
            self._goodput_memo[key] = self._goodput(replicas, batch_size)
        return self._goodput_memo[key]

    def _goodput(self, r: int, b: int) -> float | None:
        total = max(b, r * self.min_local_bsz)
        if total > self.max_batch_size or r > self.max_replicas:
            return None
        local = math.ceil(total / r - 1e-8)
        accum = math.ceil(local / self.max_local_bsz - 1e-8) - 1
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        atomic = min(atomic, self.max_batch_size // (r * (accum + 1)))
        if atomic < self.min_local_bsz:
            return None
        times = self._step_sync(r, atomic)
        if times is None:
            return None
        step, sync = times
        t_iter = step + accum * (step - sync)
        effective = r * atomic * (accum + 1)
        return effective / t_iter * self.samples_to_finish(b) / self.samples_to_finish(effective)


def _packed_placement(replicas: int) -> tuple[int, ...]:
    full, rest = divmod(replicas, _POLLUX_GPUS_PER_NODE)
    return (_POLLUX_GPUS_PER_NODE,) * full + ((rest,) if rest else ())


def _placement_id(placement: tuple[int, ...]) -> int:
    # Pollux normalises a placement to its lexicographically smallest rotation.
    best = min(placement[i:] + placement[:i] for i in range(len(placement)))
    return int("".join(map(str, best)))


def _bsz_table(rows: list[tuple[int, float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows (local_bsz, step, sync) -> arrays sorted by local_bsz, duplicates averaged."""
    by_bsz: dict[int, list[tuple[float, float]]] = {}
    for bsz, step, sync in rows:
        by_bsz.setdefault(bsz, []).append((step, sync))
    keys = sorted(by_bsz)
    steps = [sum(s for s, _ in by_bsz[k]) / len(by_bsz[k]) for k in keys]
    syncs = [sum(y for _, y in by_bsz[k]) / len(by_bsz[k]) for k in keys]
    return np.array(keys, dtype=float), np.array(steps), np.array(syncs)


def load_pollux_profile(profiles_dir: str | Path, name: str) -> PolluxProfile:
    """Read ``<profiles_dir>/<name>/{placements,scalability,validation-*}.csv`` (cached per path)."""
    return _load_pollux_profile(str(Path(profiles_dir).resolve()), name)


@lru_cache(maxsize=64)
def _load_pollux_profile(profiles_dir: str, name: str) -> PolluxProfile:
    root = Path(profiles_dir) / name
    if not root.is_dir():
        raise FileNotFoundError(f"no Pollux profile {name!r} under {profiles_dir} (expected a folder {root})")
    placement_rows: dict[int, list[tuple[int, float, float]]] = {}
    min_local = max_local = None
    for line, row in _dict_rows(root / "placements.csv", ("placement", "local_bsz", "step_time", "sync_time")):
        pid = _parse(row, "placement", int, root / "placements.csv", line)
        bsz = _parse(row, "local_bsz", int, root / "placements.csv", line)
        step = _parse(row, "step_time", float, root / "placements.csv", line)
        sync = _parse(row, "sync_time", float, root / "placements.csv", line)
        placement_rows.setdefault(pid, []).append((bsz, step, sync))
        min_local = bsz if min_local is None else min(min_local, bsz)
        max_local = bsz if max_local is None else max(max_local, bsz)
    scal_rows: dict[tuple[int, int], list[tuple[int, float, float]]] = {}
    cols = ("num_nodes", "num_replicas", "local_bsz", "step_time", "sync_time")
    for line, row in _dict_rows(root / "scalability.csv", cols):
        p = root / "scalability.csv"
        key = (_parse(row, "num_nodes", int, p, line), _parse(row, "num_replicas", int, p, line))
        scal_rows.setdefault(key, []).append(
            (_parse(row, "local_bsz", int, p, line), _parse(row, "step_time", float, p, line),
             _parse(row, "sync_time", float, p, line))
        )
    validation: dict[int, np.ndarray] = {}
    for path in sorted(root.glob("validation-*.csv")):
        batch = int(path.stem.split("-")[-1])
        its = [_parse(row, "iteration", float, path, line) for line, row in _dict_rows(path, ("iteration",))]
        if not its:
            raise TraceFormatError(path, None, None, "no validation rows")
        validation[batch] = np.array(its)
    if not placement_rows or not validation or min_local is None or max_local is None:
        raise TraceFormatError(root, None, None, "a profile needs placements.csv and validation-*.csv rows")
    return PolluxProfile(
        name=name,
        placements={k: _bsz_table(v) for k, v in placement_rows.items()},
        scalability={k: _bsz_table(v) for k, v in scal_rows.items()},
        validation=validation,
        min_local_bsz=min_local,
        max_local_bsz=_POLLUX_MAX_LOCAL_BSZ.get(name, max_local),
    )
