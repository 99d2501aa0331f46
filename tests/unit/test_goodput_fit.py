"""core.goodput_fit: the online fit recovers known step-time parameters, the fallback rules (which jobs are
fitted, which keep their declared curve), the memo per sample set, the explored range, and the
predictions the views show."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_service.core.goodput import GradParams, PerfParams, StepSample, goodput, pass_time, step_time
from scheduler_service.core.goodput_fit import (
    BATCH_HYSTERESIS,
    EXPLORE_FACTOR,
    batch_for,
    default_batch,
    fitted_perf,
    goodput_curve,
    job_goodput,
    nodes_for,
    predicted_speedups,
)
from scheduler_service.core.plan import BatchSize
from scheduler_service.core.snapshot import BatchLimits, JobView, WorkerView
from scheduler_service.core.throughput import ThroughputModel
from scheduler_service.lifecycle import JobState

TRUE = PerfParams(alpha_c=0.05, beta_c=0.002, alpha_n=0.2, beta_n=0.01, alpha_r=0.05, beta_r=0.005, gamma=1.5)
CONFIGS = ((1, 1, 32), (1, 2, 32), (1, 4, 32), (2, 8, 32), (1, 4, 64), (4, 16, 16))
LIMITS = BatchLimits(init_bsz=128, max_bsz=4096, max_atomic_bsz=64)
NOISY = GradParams(sqr=1.0, var=50.0)


def sample(nodes: int, replicas: int, atomic: int, perf: PerfParams = TRUE) -> StepSample:
    return StepSample(nodes, replicas, atomic, pass_time(perf, atomic), step_time(perf, nodes, replicas, atomic, 0))


def job(samples: tuple[StepSample, ...] = (), *, limits: BatchLimits | None = LIMITS,
        grad: GradParams | None = NOISY, workers: int = 1, low: int = 1, high: int = 16, gpus: int = 1,
        points: tuple[tuple[int, float], ...] = ()) -> JobView:
    return JobView(7, JobState.RUNNING if workers else JobState.PENDING, gpus, low, high, 0, 0.0,
                   workers=tuple(WorkerView(r, "s", tuple(range(r * gpus, (r + 1) * gpus))) for r in range(workers)),
                   throughput_points=points, batch_limits=limits, step_samples=samples, grad_stats=grad)


def test_the_fit_recovers_known_parameters_from_synthetic_samples() -> None:
    fitted = fitted_perf(tuple(sample(*c) for c in CONFIGS))
    for name in ("alpha_c", "beta_c", "alpha_n", "beta_n", "alpha_r", "beta_r", "gamma"):
        assert getattr(fitted, name) == pytest.approx(getattr(TRUE, name), rel=0.02), name


def test_the_fit_is_memoised_per_sample_set_in_any_order() -> None:
    samples = tuple(sample(*c) for c in CONFIGS[:3])
    first = fitted_perf(samples)
    hits = fitted_perf.cache_info().hits
    assert fitted_perf(tuple(reversed(samples))) is not None
    assert fitted_perf(samples) is first and fitted_perf.cache_info().hits >= hits + 1
    # one more configuration is a new sample set: a new fit
    assert fitted_perf(samples + (sample(*CONFIGS[3]),)) is not first


@pytest.mark.parametrize("change", [
    {"limits": None},            # no batch limits: the job does not adapt its batch
    {"grad": None},              # no gradient statistics reported yet
    {"samples": ()},             # no step sample yet (never ran)
])
def test_a_job_missing_any_goodput_input_keeps_its_declared_curve(change: dict) -> None:
    fields = {"samples": (sample(1, 1, 32),), "limits": LIMITS, "grad": NOISY} | change
    view = job(fields.pop("samples"), **fields)
    assert job_goodput(view) is None
    declared = ThroughputModel((), 0.05)
    got = predicted_speedups(view, [1, 2, 4], alpha=0.05)
    assert [p.source for p in got] == ["declared"] * 3
    assert [p.speedup for p in got] == pytest.approx([declared.speed(w) for w in (1, 2, 4)])


def test_a_job_with_samples_statistics_and_limits_is_fitted() -> None:
    view = job((sample(1, 1, 32), sample(1, 2, 32)))
    model = job_goodput(view)
    assert model is not None and model.explored == 2 and model.trusted == 2 * EXPLORE_FACTOR
    assert job_goodput(dataclasses.replace(view)) is model  # memoised on (samples, statistics, limits)
    assert {p.source for p in predicted_speedups(view, [1, 2])} == {"fitted"}


def test_beyond_the_explored_range_the_fit_follows_the_declared_curve() -> None:
    view = job((sample(1, 1, 32),), points=tuple((w, float(w) ** 0.5) for w in range(1, 17)))
    model = job_goodput(view)
    assert model is not None and model.trusted == EXPLORE_FACTOR
    curve = dict(goodput_curve(view, model, 16, alpha=0.05))
    edge = EXPLORE_FACTOR
    for w in (edge + 1, 8, 16):  # the declared ratio carries the edge's fitted speed on
        assert curve[w] == pytest.approx(curve[edge] * (w / edge) ** 0.5)
    assert curve[1] == pytest.approx(1.0)  # anchored at the declared speed of min_workers


def test_noisy_gradients_predict_more_speed_up_than_clean_ones() -> None:
    samples = tuple(sample(*c) for c in CONFIGS)
    noisy = predicted_speedups(job(samples, grad=GradParams(1.0, 200.0)), [8])[0]
    clean = predicted_speedups(job(samples, grad=GradParams(1.0, 0.0)), [8])[0]
    assert noisy.speedup > clean.speedup > 1.0
    assert noisy.batch is not None and clean.batch is not None
    replicas = 8
    assert (noisy.batch.atomic_bsz * (noisy.batch.accum_steps + 1) * replicas
            > clean.batch.atomic_bsz * (clean.batch.accum_steps + 1) * replicas)  # a larger batch pays off


def test_batches_only_for_jobs_with_limits() -> None:
    assert batch_for(job(limits=None), 1, 2) is None
    assert batch_for(job(), 1, 0) is None
    # declared (no fit yet): the tuned batch split over the GPUs
    assert batch_for(job(), 1, 4) == BatchSize(7, 32, 0)
    assert default_batch(LIMITS, 4).total(4) == 128
    assert default_batch(BatchLimits(128, 4096, 16), 2).accum_steps == 3  # 64 per GPU in passes of 16
    fitted = batch_for(job(tuple(sample(*c) for c in CONFIGS)), 1, 4)
    assert fitted is not None and 1 <= fitted.atomic_bsz <= LIMITS.max_atomic_bsz


def test_predictions_are_relative_to_the_current_size() -> None:
    view = job(tuple(sample(*c) for c in CONFIGS), workers=2)
    got = {p.workers: p for p in predicted_speedups(view, [1, 2, 4])}
    assert got[2].speedup == pytest.approx(1.0) and got[2].reference == 2
    assert got[1].speedup < 1.0 < got[4].speedup


def test_nodes_for_packs_workers_on_the_fewest_servers() -> None:
    assert nodes_for(1, 8) == 1 and nodes_for(2, 8) == 2 and nodes_for(8, 1) == 1 and nodes_for(9, 1) == 2
    assert nodes_for(3, 4, gpus_per_server=8) == 2



def test_at_an_unchanged_allocation_a_job_keeps_its_batch_unless_the_best_gains_enough() -> None:
    view = job(tuple(sample(*c) for c in CONFIGS), workers=4)
    model = job_goodput(view)
    assert model is not None
    best = batch_for(view, 1, 4)
    assert best is not None
    best_goodput = model.choice(1, 4).goodput

    def goodput_of(atomic: int, accum: int) -> float:
        return goodput(model.perf, model.grad, LIMITS.init_bsz, 1, 4, atomic, accum)

    # A batch within BATCH_HYSTERESIS of the best is kept; one further away is replaced by the best.
    near = next(a for a in range(best.atomic_bsz - 1, 0, -1)
                if goodput_of(a, best.accum_steps) >= (1 - BATCH_HYSTERESIS) * best_goodput)
    far = next(a for a in range(1, best.atomic_bsz)
               if goodput_of(a, best.accum_steps) < (1 - BATCH_HYSTERESIS) * best_goodput)
    keep = dataclasses.replace(view, batch_now=(near, best.accum_steps, 4))
    assert batch_for(keep, 1, 4) == BatchSize(7, near, best.accum_steps)
    assert batch_for(dataclasses.replace(view, batch_now=(far, best.accum_steps, 4)), 1, 4) == best
    # Chosen for another allocation (here 2 GPUs): a resize chooses afresh.
    assert batch_for(dataclasses.replace(view, batch_now=(near, best.accum_steps, 2)), 1, 4) == best
