"""The gradient noise scale from gradients a data-parallel step computes anyway (Pollux, OSDI'21 §3.1).

Nouns: a *gradient sample* is the gradient of one pass on one replica (the mean over its ``atomic_bsz``
samples); a step has ``count`` of them (replicas × passes). From the mean of their squared norms
(``local_sqr``) and the squared norm of their mean (``total_sqr``, the all-reduced gradient) follow two
unbiased estimates: ``sqr`` = |E g|², the true gradient's squared norm, and ``var`` = tr(Σ) / B₀, the
noise variance of a gradient over the job's initial (tuned) batch size B₀. Their ratio is the noise
scale; ``var / sqr`` at B₀ is what Pollux's statistical efficiency needs (``core.goodput.GradParams``).

Why they hold, for samples g_i = G + noise of covariance Σ / b:  E local = |G|² + tr Σ / b and
E total = |G|² + tr Σ / (b · count); two equations, two unknowns.

With one sample per step (one replica, no accumulation) the estimate pairs this step's gradient with
the previous one (a differenced estimate: biased, since the parameters moved in between).

Plain arithmetic on floats: no torch here, so the estimate is tested on its own.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GradStats:
    """|E g|² and tr(Σ)/B₀ (module doc); the latter is ≥ 0 only on average."""

    sqr: float
    var: float


def estimate(local_sqr: float, total_sqr: float, count: int, atomic_bsz: float, init_bsz: float) -> GradStats:
    """One step's estimate from ``count`` ≥ 2 gradient samples of ``atomic_bsz`` samples each:
    ``local_sqr`` the mean of their squared norms, ``total_sqr`` the squared norm of their mean."""
    if count < 2:
        raise ValueError(f"the noise scale needs at least 2 gradient samples per estimate, got {count}")
    sqr = (count * total_sqr - local_sqr) / (count - 1)
    var_atomic = (local_sqr - total_sqr) * count / (count - 1)  # tr Σ / atomic_bsz
    return GradStats(sqr, var_atomic * atomic_bsz / init_bsz)


@dataclass(slots=True)
class SmoothedGradStats:
    """Exponential moving averages of the per-step estimates, bias-corrected (as Adam's moments are) so
    the first steps are not pulled to 0. A step over a larger batch weighs more: its decay is
    ``smoothing ** scale`` with ``scale`` = its total batch / B₀ (a step of 4·B₀ samples counts as 4)."""

    smoothing: float = 0.95
    _sqr: float = 0.0
    _var: float = 0.0
    _weight: float = 0.0  # 1 - Π decays: what the raw averages must be divided by

    def update(self, stats: GradStats, scale: float) -> None:
        decay = self.smoothing ** max(scale, 1e-6)
        self._sqr = decay * self._sqr + (1 - decay) * stats.sqr
        self._var = decay * self._var + (1 - decay) * stats.var
        self._weight = decay * self._weight + (1 - decay)

    @property
    def value(self) -> GradStats | None:
        """The smoothed estimate (``var`` floored at 0, ``sqr`` at a tiny positive value); None before
        any update."""
        if self._weight <= 0:
            return None
        return GradStats(max(self._sqr / self._weight, 1e-12), max(self._var / self._weight, 0.0))

    def state_dict(self) -> dict[str, float]:
        return {"sqr": self._sqr, "var": self._var, "weight": self._weight}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self._sqr, self._var, self._weight = float(state["sqr"]), float(state["var"]), float(state["weight"])
