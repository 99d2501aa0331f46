"""The order appliers apply a plan in (``core.plan.apply_order``): a dependency order over its GPU moves.

A plan is checked as a whole (``check_plan``) but applied one action at a time, so every valid plan
must be applied in full: hand-built plans of the shapes that used to be refused (a resize onto a GPU
another resize frees later in job-id order, the start and the reclaim waiting on it); random plans
over a small cluster through the simulator's applier; and the one shape no order can apply (GPU moves
in a cycle), which ``check_plan`` calls invalid and the appliers refuse openly.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.plan import (
    Action,
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    ServerAction,
    StartJob,
    WorkerPlacement,
    apply_order,
    unorderable,
)
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.lifecycle import JobState
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.engine import PlanChecker, PlanRefusedError
from simulator.model import ClusterSpec, TraceJob
from tests.harness import linear_job, placed

GPUS = 4


def elastic_job(job_id: int, gpus_per_worker: int = 1, max_workers: int = 4) -> TraceJob:
    """Submitted at 0, 1 to ``max_workers`` workers, linear speed-up, and too long to finish in a test."""
    return linear_job(job_id, 0.0, gpus_per_worker, 1, max_workers, 1e9)


def scale(job_id: int, *workers: tuple[str, tuple[int, ...]]) -> ScaleJob:
    return ScaleJob(job_id, placed(*workers), Reason.SCALED_IN, "")


def start(job_id: int, *workers: tuple[str, tuple[int, ...]]) -> StartJob:
    return StartJob(job_id, placed(*workers), Reason.PLACED, "")


def step(server_id: str, kind: LoanStep) -> ServerAction:
    return ServerAction(server_id, kind, Reason.RECLAIMED_FOR_INFERENCE, "")


def cluster(jobs: list[TraceJob], running: dict[int, tuple[WorkerPlacement, ...]]) -> SimulatedCluster:
    """Training servers t0000, t0001 and inference servers i0000 (LOANED) and i0001 (DRAINING), 4 GPUs
    each; ``jobs`` submitted and ``running`` started on their placements. The clock stands at 100 s."""
    clock = VirtualClock(0.0)
    state = SimulatedCluster(ClusterSpec(2, 2, GPUS), clock)
    for job in jobs:
        state.submit(job)
    assert state.apply(Plan(server_actions=(step("i0000", LoanStep.LOAN), step("i0001", LoanStep.LOAN)))).rejected == ()
    clock.advance_to(10.0)
    setup = Plan(starts=tuple(StartJob(j, w, Reason.PLACED, "") for j, w in running.items()),
                 server_actions=(step("i0000", LoanStep.ACTIVATE),))
    assert state.apply(setup).rejected == ()
    clock.advance_to(100.0)
    return state


def held_now(snapshot: ClusterSnapshot) -> dict[int, list[tuple[str, int]]]:
    return {j.job_id: [(w.server_id, g) for w in j.workers for g in w.gpu_indices] for j in snapshot.jobs}


def placements(snapshot: ClusterSnapshot) -> dict[int, tuple[WorkerPlacement, ...]]:
    return {j.job_id: tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in j.workers)
            for j in snapshot.jobs if j.workers}


def refused_ids(actions: tuple[Action, ...]) -> set[int | str]:
    return {a.server_id if isinstance(a, ServerAction) else a.job_id for a in actions}


# -- the shape that was refused: job 294's move onto a GPU job 1689 frees later, job 1757's start ----


def moves_plan() -> tuple[SimulatedCluster, Plan]:
    """Job 1 (a 294) moves its second worker off the loaned server i0000 onto t0000:1, which job 2 (a
    1689) frees by shrinking; job 3 (a 1757) starts on t0000:0, which job 1 frees; i0000, emptied by
    job 1, is reclaimed."""
    state = cluster([elastic_job(1), elastic_job(2), elastic_job(3)], {
        1: placed(("t0000", (0,)), ("i0000", (0,))),
        2: placed(("t0000", (2,)), ("t0000", (1,))),
    })
    plan = Plan(
        starts=(start(3, ("t0000", (0,))),),
        scales=(scale(1, ("t0000", (1,))), scale(2, ("t0000", (2,)))),
        server_actions=(step("i0000", LoanStep.RECLAIM),),
    )
    return state, plan


def test_a_resize_onto_a_gpu_another_resize_frees_comes_after_it_and_so_do_what_waits_on_it() -> None:
    state, plan = moves_plan()
    snapshot = state.snapshot()
    assert check_plan(snapshot, plan) == []  # valid as a whole
    scale_1, scale_2 = plan.scales
    assert apply_order(plan, held_now(snapshot)) == (scale_2, scale_1, plan.starts[0], plan.server_actions[0])
    assert unorderable(plan, held_now(snapshot)) == ()


def test_the_simulated_cluster_applies_that_plan_in_full() -> None:
    state, plan = moves_plan()
    result = state.apply(plan)
    assert result.rejected == ()
    assert (result.scaled, result.started, result.server_steps) == ((2, 1), (3,), (("i0000", "RECLAIM"),))
    after = state.snapshot()
    assert placements(after) == {1: placed(("t0000", (1,))), 2: placed(("t0000", (2,))), 3: placed(("t0000", (0,)))}
    assert {s.server_id: s.allocated for s in after.servers}["i0000"] == ()


def test_a_chain_of_moves_is_applied_from_its_end() -> None:
    """Job 1 takes job 2's GPU, job 2 takes job 3's, job 3 shrinks: the reverse of job-id order."""
    state = cluster([elastic_job(1), elastic_job(2), elastic_job(3)], {
        1: placed(("t0000", (0,)), ("t0001", (0,))),
        2: placed(("t0000", (1,)), ("t0001", (1,))),
        3: placed(("t0000", (2,)), ("t0001", (2,))),
    })
    plan = Plan(scales=(scale(1, ("t0000", (0,)), ("t0001", (1,))),
                        scale(2, ("t0000", (1,)), ("t0001", (2,))),
                        scale(3, ("t0000", (2,)))))
    assert apply_order(plan, held_now(state.snapshot())) == plan.scales[::-1]
    assert state.apply(plan).rejected == ()


def test_the_order_is_the_phase_order_wherever_that_already_works() -> None:
    """Deterministic, and no change where none is needed: ACTIVATE steps, preemptions, scales that
    release GPUs, starts, growing scales, other loan steps -- each group in plan order."""
    held = {1: [("t0000", 0)], 2: [("t0000", 1), ("t0000", 2)], 3: [("t0001", 0)], 4: [("t0001", 1)]}
    plan = Plan(
        starts=(start(6, ("i0001", (0,))), start(5, ("t0000", (0,)))),
        scales=(scale(3, ("t0001", (0,)), ("t0001", (3,))),  # grows: takes t0001:3 only
                scale(2, ("t0000", (2,)))),                    # shrinks: frees t0000:1
        preemptions=(PreemptJob(4, Reason.PREEMPTED_FOR_RECLAIM, ""), PreemptJob(1, Reason.PREEMPTED_FOR_RECLAIM, "")),
        server_actions=(step("i0002", LoanStep.LOAN), step("i0001", LoanStep.ACTIVATE), step("i0000", LoanStep.RETURN)),
    )
    a = plan.server_actions
    expected = (a[1], *plan.preemptions, plan.scales[1], *plan.starts, plan.scales[0], a[0], a[2])
    assert apply_order(plan, held) == expected
    assert apply_order(plan, dict(reversed(held.items()))) == expected


# -- the shape no order can apply: a cycle of GPU moves ----------------------------------------------


def test_a_cycle_of_moves_is_an_invalid_plan_and_is_refused_openly_never_half_applied() -> None:
    """Jobs 1 and 2 swap GPUs: each applier deletes then inserts one job at a time, so whichever goes
    first finds its new GPU held. No order helps: ``check_plan`` calls the plan invalid, ``apply_order``
    puts the cycle and what waits on it (job 3's start on a GPU job 2 frees) last, and the applier
    refuses exactly those, leaving their jobs as they were; the rest of the plan is applied."""
    state = cluster([elastic_job(1), elastic_job(2), elastic_job(3), elastic_job(4)], {
        1: placed(("t0000", (0,))),
        2: placed(("t0000", (1,)), ("t0000", (2,))),
    })
    plan = Plan(
        starts=(start(3, ("t0000", (2,))), start(4, ("t0001", (0,)))),
        scales=(scale(1, ("t0000", (1,))), scale(2, ("t0000", (0,)))),
    )
    before = state.snapshot()
    held = held_now(before)
    blocked = unorderable(plan, held)
    assert blocked == (*plan.scales, plan.starts[0])
    assert apply_order(plan, held) == (plan.starts[1], *blocked)
    assert check_plan(before, plan) == [
        "no order applies the plan one action at a time: job 1, job 2, job 3 wait on a cycle of GPU moves "
        "(each takes a GPU another frees)"
    ]
    result = state.apply(plan)
    assert result.started == (4,)
    assert {job_id for job_id, _ in result.rejected} == {1, 2, 3}
    after = placements(state.snapshot())
    assert (after[1], after[2], after.get(3)) == (placements(before)[1], placements(before)[2], None)


def test_the_engine_raises_when_the_applier_refuses_a_valid_plan() -> None:
    """In the simulator nothing changes between a snapshot and its plan's apply, so a refusal of a plan
    that passed check_plan is a defect, and a checked run stops on it. Made here by changing the state
    behind the checker's back, as only the service's state may change."""
    state = cluster([elastic_job(1), elastic_job(2)], {})
    checker = PlanChecker(state)
    checker.snapshot()
    assert state.apply(Plan(starts=(start(2, ("t0000", (0,))),))).rejected == ()
    with pytest.raises(PlanRefusedError, match=r"t=100.0 was partly refused: \[\(1, 'STALE_PLAN: a planned GPU"):
        checker.apply(Plan(starts=(start(1, ("t0000", (0,))),)))


# -- random valid plans through the simulator's applier ----------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> tuple[list[TraceJob], dict[int, tuple[WorkerPlacement, ...]], Plan]:
    """Jobs, their placements now, and a plan to any placement the cluster allows afterwards: each job
    keeps, preempts, starts or resizes (keeping some of its workers, adding others anywhere free),
    the draining server i0001 may be activated and the loaned i0000 reclaimed (then emptied)."""
    jobs = [elastic_job(j, draw(st.sampled_from((1, 2)))) for j in range(1, draw(st.integers(1, 6)) + 1)]

    def place(free: dict[str, list[int]], gpus_per_worker: int, count: int,
              kept: list[tuple[str, tuple[int, ...]]]) -> tuple[WorkerPlacement, ...]:
        workers = list(kept)
        for _ in range(count):
            fits = sorted(sid for sid, gpus in free.items() if len(gpus) >= gpus_per_worker)
            if not fits:
                break
            server_id = draw(st.sampled_from(fits))
            gpus = tuple(sorted(draw(st.permutations(free[server_id]))[:gpus_per_worker]))
            free[server_id] = [g for g in free[server_id] if g not in gpus]
            workers.append((server_id, gpus))
        return placed(*workers)

    free = {sid: list(range(GPUS)) for sid in ("t0000", "t0001", "i0000")}
    running = {}
    for job in jobs:
        if workers := place(free, job.gpus_per_worker, draw(st.integers(0, 2)), []):
            running[job.job_id] = workers
    activate, reclaim = draw(st.booleans()), draw(st.booleans())
    usable = {"t0000", "t0001"} | ({"i0001"} if activate else set()) | (set() if reclaim else {"i0000"})
    # What each job keeps first (so new workers go around it), then new workers in job order.
    keeps: dict[int, list[tuple[str, tuple[int, ...]]] | None] = {}  # None: left alone
    for job in jobs:
        now = [(w.server_id, w.gpu_indices) for w in running.get(job.job_id, ())]
        can_stay = all(sid in usable for sid, _ in now)
        if now and can_stay and draw(st.booleans()):
            keeps[job.job_id] = None
        else:
            stays = [w for w in now if w[0] in usable]
            keeps[job.job_id] = stays[: draw(st.integers(0, len(stays)))]
    free = {sid: list(range(GPUS)) for sid in sorted(usable)}
    for job in jobs:
        kept = keeps[job.job_id]
        for sid, gpus in kept if kept is not None else [(w.server_id, w.gpu_indices) for w in running[job.job_id]]:
            free[sid] = [g for g in free[sid] if g not in gpus]
    starts, scales, preemptions = [], [], []
    for job in jobs:
        kept = keeps[job.job_id]
        if kept is None:
            continue
        target = place(free, job.gpus_per_worker, draw(st.integers(0, job.max_workers - len(kept))), kept)
        if job.job_id not in running:
            if target:
                starts.append(StartJob(job.job_id, target, Reason.PLACED, ""))
        elif not target:
            preemptions.append(PreemptJob(job.job_id, Reason.PREEMPTED_FOR_RECLAIM, ""))
        elif target != running[job.job_id]:
            scales.append(ScaleJob(job.job_id, target, Reason.SCALED_IN, ""))
    server_actions = ((step("i0001", LoanStep.ACTIVATE),) if activate else ()) + \
                     ((step("i0000", LoanStep.RECLAIM),) if reclaim else ())
    return jobs, running, Plan(starts=tuple(starts), scales=tuple(scales), preemptions=tuple(preemptions),
                               server_actions=server_actions)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans())
def test_every_valid_plan_is_applied_in_full_and_only_a_cycle_is_refused(
    case: tuple[list[TraceJob], dict[int, tuple[WorkerPlacement, ...]], Plan],
) -> None:
    jobs, running, plan = case
    state = cluster(jobs, running)
    before = state.snapshot()
    problems = check_plan(before, plan)
    blocked = unorderable(plan, held_now(before))
    # Valid as a whole by construction; only a cycle of moves can make check_plan object.
    assert problems == ([] if not blocked else [problems[0]]) and all("cycle" in p for p in problems)
    result = state.apply(plan)
    assert {why.split(":")[0] for _, why in result.rejected} <= {"STALE_PLAN"}
    assert {i for i, _ in result.rejected} == refused_ids(blocked)
    # What was applied left exactly the planned placements; what was refused left the job as it was.
    after = placements(state.snapshot())
    applied = {*result.started, *result.scaled}
    for job_id, workers in [(s.job_id, s.workers) for s in plan.starts] + [(s.job_id, s.workers) for s in plan.scales]:
        assert after.get(job_id) == (workers if job_id in applied else running.get(job_id))
    for action in plan.preemptions:
        assert action.job_id not in after
    jobs_after = {j.job_id: j.state for j in state.snapshot().jobs}
    assert all(jobs_after[j] == JobState.RUNNING for j in after)
