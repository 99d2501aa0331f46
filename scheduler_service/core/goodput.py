"""The goodput job model of Pollux (Qiao et al., OSDI'21): how fast a data-parallel training job makes
*statistical* progress for a given allocation and batch size.

Nouns (the paper's, section 3):

- **configuration**: ``nodes`` (servers used), ``replicas`` (GPUs = data-parallel workers), ``atomic_bsz``
  (samples per GPU per forward/backward pass) and ``accum_steps`` (extra gradient-accumulation passes
  before each synchronised update). The total batch size is ``replicas * atomic_bsz * (accum_steps + 1)``.
- **throughput**: samples per second, from a step-time model with seven fitted parameters
  (``PerfParams``): a pass costs ``alpha_c + beta_c * atomic_bsz``; the gradient all-reduce costs
  ``alpha + beta * (replicas - 2)`` over the slowest link (between servers when ``nodes > 1``, inside one
  when ``replicas > 1``, nothing for one GPU); the last pass overlaps the all-reduce as a ``gamma``-norm
  (``gamma`` = 1: no overlap, large: the max of the two).
- **statistical efficiency**: progress per sample at batch size ``B`` relative to the initial batch size
  ``B0``, from the gradient noise scale ``var / sqr`` (``GradParams``, measured as training goes, so it
  changes with progress): ``E(B) = (var + sqr) / (var / s + sqr) / s`` with ``s = B / B0``. 1 at ``B0``,
  falling as ``B`` grows.
- **goodput** = throughput x efficiency, in samples-at-``B0`` per second; divided by ``B0`` it is the
  *progress rate* in iterations at ``B0`` per second, the unit a job's training target is counted in.

- **fitting** (``fit_perf_params``): the seven parameters from a job's measured (configuration, pass time,
  step time) samples, minimising the log errors with Pollux's priors, by a restarted Nelder-Mead (Pollux
  uses L-BFGS-B with autograd gradients; the minimiser differs, the objective is the same).

What this module must never do: read files, a clock or any cluster state. Pure functions of numbers;
measured profiles are loaded by the simulator (``simulator.goodput_profiles``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# Tolerance of the ceil() operations that split a batch: 2048 / 16 must give 128, not 129.
_EPS = 1e-8


@dataclass(frozen=True, slots=True)
class PerfParams:
    """Fitted step-time parameters (seconds; ``beta_c`` per sample, ``beta_n``/``beta_r`` per replica)."""

    alpha_c: float  # pass: constant
    beta_c: float   # pass: per sample of the atomic batch
    alpha_n: float  # all-reduce across servers: constant
    beta_n: float   # all-reduce across servers: per replica beyond 2
    alpha_r: float  # all-reduce inside one server: constant
    beta_r: float   # all-reduce inside one server: per replica beyond 2
    gamma: float    # overlap of the last pass with the all-reduce, >= 1


@dataclass(frozen=True, slots=True)
class GradParams:
    """Gradient statistics at the initial batch size: ``sqr`` = |E g|^2, ``var`` = the noise variance."""

    sqr: float
    var: float


def pass_time(perf: PerfParams, atomic_bsz: float) -> float:
    """Seconds of one forward/backward pass of ``atomic_bsz`` samples on one GPU."""
    return perf.alpha_c + perf.beta_c * atomic_bsz


def network_time(perf: PerfParams, nodes: int, replicas: int) -> float:
    """Seconds of one gradient all-reduce: over the slowest link, growing with the ring's length."""
    extra = max(replicas - 2, _EPS)
    if nodes > 1:
        return perf.alpha_n + perf.beta_n * extra
    if replicas > 1:
        return perf.alpha_r + perf.beta_r * extra
    return _EPS + _EPS * extra  # one GPU: nothing to synchronise


def step_time(perf: PerfParams, nodes: int, replicas: int, atomic_bsz: float, accum_steps: int) -> float:
    """Seconds of one optimiser step: ``accum_steps`` plain passes, then a pass overlapped with the
    all-reduce (a ``gamma``-norm of the two)."""
    t_pass = pass_time(perf, atomic_bsz)
    t_net = network_time(perf, nodes, replicas)
    g = perf.gamma
    return accum_steps * t_pass + float((t_pass ** g + t_net ** g) ** (1.0 / g))


def throughput(perf: PerfParams, nodes: int, replicas: int, atomic_bsz: float, accum_steps: int) -> float:
    """Samples per second."""
    return replicas * atomic_bsz * (accum_steps + 1) / step_time(perf, nodes, replicas, atomic_bsz, accum_steps)


def efficiency_gain(grad: GradParams, init_bsz: float, batch_size: float) -> float:
    """Progress of one step at ``batch_size``, in steps at ``init_bsz``: ``(var + sqr) / (var / s + sqr)``,
    ``s = batch_size / init_bsz`` (between 1 and ``s``; 1 when the gradient has no signal measured)."""
    scale = batch_size / init_bsz
    denom = grad.var / scale + grad.sqr
    return (grad.var + grad.sqr) / denom if denom > 0 else 1.0


def efficiency(grad: GradParams, init_bsz: float, batch_size: float) -> float:
    """Statistical efficiency: progress per sample at ``batch_size`` relative to ``init_bsz``, in (0, 1]
    for ``batch_size >= init_bsz``."""
    return efficiency_gain(grad, init_bsz, batch_size) * init_bsz / batch_size


def goodput(perf: PerfParams, grad: GradParams, init_bsz: float, nodes: int, replicas: int, atomic_bsz: float,
            accum_steps: int) -> float:
    """Throughput x efficiency: samples-at-``init_bsz`` per second."""
    batch = replicas * atomic_bsz * (accum_steps + 1)
    return throughput(perf, nodes, replicas, atomic_bsz, accum_steps) * efficiency(grad, init_bsz, batch)


def progress_rate(gain: float, seconds_per_step: float) -> float:
    """Iterations at the initial batch size per second, for a step of ``seconds_per_step`` that is worth
    ``gain`` of them (``efficiency_gain``): the unit a training target is counted in."""
    return gain / seconds_per_step


@dataclass(frozen=True, slots=True)
class BatchSplit:
    """How a total batch is run: ``atomic_bsz`` samples per pass, ``accum_steps + 1`` passes per step."""

    atomic_bsz: int
    accum_steps: int

    def total(self, replicas: int) -> int:
        return replicas * self.atomic_bsz * (self.accum_steps + 1)


def split_batch(batch_size: float, replicas: int, max_atomic_bsz: int, *, init_bsz: float | None = None,
                max_batch_size: int | None = None) -> BatchSplit:
    """Split ``batch_size`` over ``replicas`` GPUs: the per-GPU share rounded up, in as few passes as keep
    each pass within ``max_atomic_bsz`` (what fits in GPU memory).

    ``init_bsz``: a single GPU running more than ``init_bsz`` samples per step makes at least two passes
    (Pollux estimates the gradient noise from the spread between passes, so one pass leaves it blind).
    ``max_batch_size``: the atomic batch is then cut so that the total does not exceed it (the ceil()s
    may round it above)."""
    local = math.ceil(batch_size / replicas - _EPS)
    accum = math.ceil(local / max_atomic_bsz - _EPS) - 1
    if init_bsz is not None and replicas == 1 and batch_size > init_bsz:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - _EPS)
    if max_batch_size is not None:
        atomic = min(atomic, int(max_batch_size / (replicas * (accum + 1))))
    return BatchSplit(atomic, accum)


@dataclass(frozen=True, slots=True)
class BatchChoice:
    goodput: float
    split: BatchSplit


def geometric_candidates(low: float, high: float, count: int = 50) -> list[float]:
    """``count`` batch sizes spaced geometrically from ``low`` to ``high`` (both included)."""
    if count == 1 or high == low:
        return [low] * count
    ratio = math.log(high / low) / (count - 1)
    return [low * math.exp(ratio * i) for i in range(count - 1)] + [high]


def best_batch_size(perf: PerfParams, grad: GradParams, init_bsz: int, nodes: int, replicas: int, *,
                    max_batch_size: int, atomic_bsz_range: tuple[int, int], accumulation: bool = True,
                    candidates: int = 50) -> BatchChoice:
    """The batch size (and its split) with the highest goodput on ``nodes`` x ``replicas``, among
    ``candidates`` sizes spaced geometrically from the smallest allowed (``init_bsz``, and at least the
    smallest atomic batch on every GPU) to ``max_batch_size``. A candidate whose pass falls outside
    ``atomic_bsz_range`` scores 0; without ``accumulation`` a candidate must fit in one pass per GPU.
    Ties go to the smaller batch size. ``goodput`` 0 means no candidate is valid."""
    min_atomic, max_atomic = atomic_bsz_range
    if not 1 <= nodes <= replicas:
        raise ValueError(f"need 1 <= nodes <= replicas (got {nodes} nodes, {replicas} replicas)")
    low = max(init_bsz, min_atomic * replicas)
    best: BatchChoice | None = None
    for batch in geometric_candidates(low, max_batch_size, candidates):
        local = batch / replicas
        if accumulation:
            accum = math.ceil(local / max_atomic - _EPS) - 1
            if replicas == 1 and local > init_bsz + _EPS:
                accum = max(accum, 1)
        else:
            accum = 0
        atomic = math.ceil(local / (accum + 1) - _EPS)
        value = 0.0
        if min_atomic <= atomic <= max_atomic:
            value = goodput(perf, grad, init_bsz, nodes, replicas, atomic, accum)
        if best is None or value > best.goodput:
            best = BatchChoice(value, BatchSplit(atomic, accum))
    assert best is not None
    return best


# --------------------------------------------------------------------------------------------------
# Fitting the step-time parameters to a job's measurements
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StepSample:
    """One measured configuration: seconds of a plain pass and of a whole step (no accumulation)."""

    nodes: int
    replicas: int
    atomic_bsz: float
    pass_s: float
    step_s: float


_FLOOR = 1e-8  # the smallest value of a time parameter (and of an unobserved one)


def _objective(perf: PerfParams, samples: Sequence[StepSample]) -> float:
    """Root-mean-square log error of the pass and of the step times, plus two priors: ``gamma`` near 1
    (easier to fit) and small retrogression terms (an optimistic model for unseen scales)."""
    err_pass = err_step = 0.0
    for s in samples:
        err_pass += (math.log(pass_time(perf, s.atomic_bsz)) - math.log(s.pass_s)) ** 2
        err_step += (math.log(step_time(perf, s.nodes, s.replicas, s.atomic_bsz, 0)) - math.log(s.step_s)) ** 2
    n = len(samples)
    retrogression = (perf.beta_n / perf.alpha_n) ** 2 + (perf.beta_r / perf.alpha_r) ** 2
    prior = 1e-3 * (perf.gamma - 1.0) ** 2 + 1e-2 * retrogression
    return math.sqrt(err_pass / n) + math.sqrt(err_step / n) + prior


def fit_perf_params(samples: Sequence[StepSample], *, iterations: int = 1000, restarts: int = 4) -> PerfParams:
    """The ``PerfParams`` that best explain ``samples`` (``_objective``), by Nelder-Mead over the
    logarithms of the time parameters and a bounded ``gamma`` in [1, 10].

    What the samples cannot tell is fixed, as Pollux does: with one atomic batch size only,
    ``alpha_c`` is half the mean pass time; without a multi-node sample the cross-server terms, without
    a multi-GPU single-node sample the in-server terms, and without a sample of more than 2 GPUs both
    retrogression terms stay at their floor; and without a multi-node sample the cross-server terms are
    then raised to at least 1.1 x the in-server ones (a network is no faster than a PCIe bus)."""
    if not samples:
        raise ValueError("no samples to fit")
    fixed = fixed_terms(samples)
    multi_node = any(s.nodes > 1 for s in samples)
    start = [1e-1, 1e-2, 1e-1, 1e-2, 1e-1, 1e-2, 1.0 + 1e-3]
    free = [i for i in range(7) if i not in fixed]

    def params_of(x: Sequence[float]) -> PerfParams:
        values = dict(fixed)
        for i, raw in zip(free, x, strict=True):
            v = min(max(raw, -40.0), 40.0)  # exp() stays finite wherever the simplex wanders
            values[i] = 1.0 + 9.0 / (1.0 + math.exp(-v)) if i == 6 else max(math.exp(v), _FLOOR)
        return PerfParams(*(values.get(i, start[i]) for i in range(7)))

    def encode(i: int) -> float:
        if i == 6:
            g = (start[6] - 1.0) / 9.0
            return math.log(g / (1.0 - g))
        return math.log(start[i])

    best = [encode(i) for i in free]
    for _ in range(restarts):  # a fresh simplex around the last best point: Nelder-Mead stalls in 7-D
        best = _nelder_mead(lambda x: _objective(params_of(x), samples), best, iterations)
    perf = params_of(best)
    if not multi_node:
        perf = PerfParams(perf.alpha_c, perf.beta_c, max(perf.alpha_n, perf.alpha_r * 1.1),
                          max(perf.beta_n, perf.beta_r * 1.1), perf.alpha_r, perf.beta_r, perf.gamma)
    return perf


def _nelder_mead(f: Callable[[list[float]], float], x0: list[float], iterations: int, step: float = 0.5
                 ) -> list[float]:
    """Minimise ``f`` from ``x0`` (the standard reflection/expansion/contraction/shrink simplex)."""
    n = len(x0)
    if n == 0:
        return []
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    values = [f(p) for p in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=lambda i: values[i])
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < 1e-12:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst, strict=True)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2.0 * (c - w) for c, w in zip(centroid, worst, strict=True)]
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst, strict=True)]
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p, strict=True)] for p in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex[min(range(n + 1), key=lambda i: values[i])]


def fixed_terms(samples: Sequence[StepSample]) -> dict[int, float]:
    """The parameters ``samples`` cannot tell, by index into ``PerfParams``, with the value they are fixed
    at (``fit_perf_params`` states the rules)."""
    fixed: dict[int, float] = {}
    if len({s.atomic_bsz for s in samples}) == 1:
        fixed[0] = sum(s.pass_s for s in samples) / len(samples) / 2
    if not any(s.nodes > 1 for s in samples):
        fixed[2] = fixed[3] = _FLOOR
    if not any(s.nodes == 1 and s.replicas > 1 for s in samples):
        fixed[4] = fixed[5] = _FLOOR
    if not any(s.replicas > 2 for s in samples):
        fixed[3] = fixed[5] = _FLOOR
    return fixed
