"""The applier: ``SchedulerApp.cluster.apply`` commits a Plan's preemptions, scales, starts and loan steps in one
transaction, refuses each stale action alone, and ``snapshot`` shows the policy what it needs.

Every test runs on SQLite and on PostgreSQL (``database_url``) through the application layer, with a
manual clock so times can be asserted exactly. Plans are written by hand: these tests check the
applier's contract, not any policy.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.app import SchedulerApp
from scheduler_service.core.plan import ApplyResult, LoanStep, Plan, PreemptJob, Reason
from scheduler_service.core.snapshot import BatchLimits
from scheduler_service.lifecycle import JobState, Pool, ServerState
from scheduler_service.records import GpuReport, GpuSample, JobInfo, JobSubmission, ServerRegistration, StatusReport
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.models import Allocation
from tests.harness import T0, ManualClock, scale, start, step
from tests.helpers import wait_for


class RecordingNotifier:
    def __init__(self) -> None:
        self.desired: list[set[str]] = []
        self.committed: list[Mapping[str, object]] = []  # the states pushed straight from commits

    def events_appended(self) -> None:
        pass

    def desired_state_changed(self, server_ids: Iterable[str]) -> None:
        self.desired.append(set(server_ids))

    def desired_states_committed(self, states: Mapping[str, object]) -> None:
        self.desired.append(set(states))
        self.committed.append(dict(states))

    def cycle_requested(self) -> None:
        pass

    def jobs_queued(self) -> None:
        pass


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def notifier() -> RecordingNotifier:
    return RecordingNotifier()


@pytest.fixture
def app(database_url: str, clock: ManualClock, notifier: RecordingNotifier) -> Iterator[SchedulerApp]:
    engine = create_engine_for(database_url)
    yield SchedulerApp(session_factory(engine), clock, notifier=notifier)
    engine.dispose()


# --- builders -------------------------------------------------------------------------------------


def register(app: SchedulerApp, name: str, *, pool: Pool = Pool.TRAINING, gpus: int = 4) -> None:
    app.agents.register(
        ServerRegistration(
            hostname=name, pool=pool, agent_address=f"{name}:7000", agent_version="test",
            gpus=tuple(GpuReport(i, f"GPU-{name}-{i}", "Fake-GPU", 80 << 30) for i in range(gpus)),
        )
    )


def submit(app: SchedulerApp, name: str = "job", *, gpus: int = 1, workers: int = 1, max_workers: int = 0,
           throughput: dict | None = None) -> int:
    return app.jobs.submit(
        JobSubmission(
            name=name, user="alice", queue="default", command=("python", "train.py"), env={},
            gpus_per_worker=gpus, min_workers=workers, max_workers=max_workers or workers,
            throughput=throughput or {},
        )
    ).id


def applied(app: SchedulerApp, **actions: Iterable[Any]) -> ApplyResult:
    fields: dict[str, Any] = {k: tuple(v) for k, v in actions.items()}  # Plan's fields of actions, by name
    return app.cluster.apply(Plan(**fields))


def allocations(app: SchedulerApp, job_id: int) -> set[tuple[int, str, int]]:
    record, _ = app.jobs.get(job_id)
    return {(a.rank, a.server_id, a.gpu_index) for a in record.allocations}


def job_row(app: SchedulerApp, job_id: int):
    return app.jobs.get(job_id)[0]


def transitions(app: SchedulerApp, job_id: int) -> list[tuple[str, str, str]]:
    _, events = app.jobs.get(job_id, include_events=True)
    return [(e.from_state, e.to_state, e.reason) for e in events if e.kind == "JOB_STATE_CHANGED"]


def server_row(app: SchedulerApp, server_id: str):
    return next(r for r in app.views.servers() if r.id == server_id)


def generation(app: SchedulerApp, server_id: str) -> int:
    return server_row(app, server_id).desired_generation


def server_events(app: SchedulerApp, server_id: str) -> list[tuple[str, str, str, str]]:
    return [(e.kind, e.from_state, e.to_state, e.reason) for e in app.views.events_after(0, server_id=server_id)
            if e.kind != "SERVER_REGISTERED"]


def loans(app: SchedulerApp) -> list[tuple[str, str, float, float | None]]:
    return sorted((loan.server_id, loan.state, loan.started_at, loan.ended_at)
                  for loan in app.views.loans(include_returned=True))


# --- preemption -----------------------------------------------------------------------------------


def test_preemption_frees_the_gpus_and_requeues_the_job_with_an_explanation(
    app: SchedulerApp, clock: ManualClock, notifier: RecordingNotifier
) -> None:
    register(app, "s1", gpus=2)
    register(app, "s2", gpus=2)
    job = submit(app, workers=2, max_workers=2)
    assert applied(app, starts=[start(job, ("s1", (0,)), ("s2", (0,)))]).started == (job,)
    before = {s: generation(app, s) for s in ("s1", "s2")}
    clock.advance(60)

    result = applied(app, preemptions=[PreemptJob(job, Reason.PREEMPTED_FOR_RECLAIM, "server s2 went back")])

    assert result.preempted == (job,) and result.rejected == ()
    assert result.touched_servers == {"s1", "s2"}
    assert allocations(app, job) == set()
    row = job_row(app, job)
    assert (row.state, row.num_workers, row.preemptions, row.restarts) == ("PENDING", 0, 1, 0)
    assert row.pending_reason == "PREEMPTED_FOR_RECLAIM: server s2 went back"
    assert transitions(app, job)[-2:] == [
        ("RUNNING", "PREEMPTED", "PREEMPTED_FOR_RECLAIM"),
        ("PREEMPTED", "PENDING", "PREEMPTED_FOR_RECLAIM"),
    ]
    explanation = app.jobs.explain(job)
    assert "requeued after preemption: server s2 went back" in explanation.summary
    # Each server it ran on is told once, after commit.
    assert {s: generation(app, s) for s in ("s1", "s2")} == {s: g + 1 for s, g in before.items()}
    assert notifier.desired[-1] == {"s1", "s2"}
    # The freed GPUs are free again: another job can take them in the next plan.
    other = submit(app, "other", gpus=2)
    assert applied(app, starts=[start(other, ("s1", (0, 1)))]).started == (other,)


def test_preempting_a_job_that_is_not_running_is_refused(app: SchedulerApp) -> None:
    job = submit(app)

    result = applied(app, preemptions=[PreemptJob(job, Reason.PREEMPTED_FOR_RECLAIM, "stale")])

    assert result.preempted == ()
    assert result.rejected == ((job, f"STALE_PLAN: job {job} is PENDING, not running: there is nothing to preempt"),)
    assert job_row(app, job).preemptions == 0


# --- scaling --------------------------------------------------------------------------------------


def test_scale_out_then_in_replaces_allocations_and_world_size_and_keeps_staying_workers(
    app: SchedulerApp, clock: ManualClock
) -> None:
    register(app, "s1", gpus=2)
    register(app, "s2", gpus=2)
    job = submit(app, workers=1, max_workers=4)
    applied(app, starts=[start(job, ("s1", (0,)))])
    first_allocated_at = app.jobs.get(job)[0].allocations[0].allocated_at
    assert job_row(app, job).last_resized_at == T0
    s2_before = generation(app, "s2")

    out_at = clock.advance(100)
    result = applied(app, scales=[scale(job, ("s1", (0,)), ("s1", (1,)), ("s2", (0,)))])

    assert result.scaled == (job,) and result.rejected == ()
    assert allocations(app, job) == {(0, "s1", 0), (1, "s1", 1), (2, "s2", 0)}
    record = app.jobs.get(job)[0]
    kept = next(a for a in record.allocations if a.rank == 0)
    assert kept.allocated_at == first_allocated_at  # the staying worker's row was not rewritten
    assert (record.state, record.num_workers, record.restarts, record.last_resized_at, record.started_at) == (
        "RUNNING", 3, 0, out_at, T0)
    assert generation(app, "s2") == s2_before + 1
    # Agents see the new world size on every server the job runs on.
    for server_id, ranks in (("s1", [(0, 0), (1, 1)]), ("s2", [(2, 0)])):
        desired = app.agents.desired_state(server_id)
        assert [(w.rank, w.local_rank, w.world_size) for w in desired.workers] == [(r, lr, 3) for r, lr in ranks]
        assert {w.master_addr for w in desired.workers} == {"s1:7000"}

    in_at = clock.advance(100)
    result = applied(app, scales=[scale(job, ("s1", (0,)), ("s1", (1,)), reason=Reason.SCALED_IN)])

    assert result.scaled == (job,)
    assert result.touched_servers == {"s1", "s2"}  # s2 lost its worker; s1's workers restart at size 2
    assert allocations(app, job) == {(0, "s1", 0), (1, "s1", 1)}
    assert (job_row(app, job).num_workers, job_row(app, job).last_resized_at) == (2, in_at)
    assert app.agents.desired_state("s2").workers == ()
    assert [w.world_size for w in app.agents.desired_state("s1").workers] == [2, 2]
    assert transitions(app, job) == [
        ("PENDING", "RUNNING", "PLACED"),
        ("RUNNING", "SCALING", "SCALED_OUT"),
        ("SCALING", "RUNNING", "SCALED_OUT"),
        ("RUNNING", "SCALING", "SCALED_IN"),
        ("SCALING", "RUNNING", "SCALED_IN"),
    ]


def test_explain_lists_each_resize_and_preemption_once_and_the_event_log_keeps_both_steps(
    app: SchedulerApp, clock: ManualClock
) -> None:
    """Issue 21: RUNNING -> SCALING -> RUNNING (and RUNNING -> PREEMPTED -> PENDING) carry the
    decision's reason twice; explain lists one line per decision, the event log keeps every step."""
    register(app, "s1", gpus=2)
    job = submit(app, workers=1, max_workers=2)
    applied(app, starts=[start(job, ("s1", (0,)))])
    clock.advance(100)
    applied(app, scales=[scale(job, ("s1", (0,)), ("s1", (1,)))])
    clock.advance(100)
    applied(app, preemptions=[PreemptJob(job, Reason.PREEMPTED_FOR_RECLAIM, "server s1 went back")])

    listed = [(e.reason, e.message) for e in app.jobs.explain(job).decisions if e.reason != "SUBMITTED"]
    assert listed == [
        ("PLACED", "test placement"),
        ("SCALED_OUT", "to 2 worker(s) (now 2 worker(s))"),
        ("PREEMPTED_FOR_RECLAIM", "requeued: server s1 went back"),
    ]
    assert "requeued after preemption: server s1 went back" in app.jobs.explain(job).summary
    assert len(transitions(app, job)) == 5  # both steps of each change stay in the log


def test_the_desired_state_lists_each_worker_once_with_its_gpus_in_order(
    app: SchedulerApp, notifier: RecordingNotifier
) -> None:
    register(app, "s1", gpus=12)
    register(app, "s2", gpus=4)
    job = submit(app, gpus=2, workers=3)
    other = submit(app, "other", gpus=1)
    # Ranks 0 and 1 on s1 with GPUs given out of order (and past 9, where text order is not number order).
    applied(app, starts=[start(job, ("s1", (10, 2)), ("s1", (3, 1)), ("s2", (2, 0))), start(other, ("s1", (11,)))])

    s1, s2 = app.agents.desired_state("s1"), app.agents.desired_state("s2")
    assert [(w.job_id, w.rank, w.local_rank, w.world_size, w.gpu_indices, w.master_addr) for w in s1.workers] == [
        (job, 0, 0, 3, (2, 10), "s1:7000"), (job, 1, 1, 3, (1, 3), "s1:7000"), (other, 0, 0, 1, (11,), "s1:7000")]
    assert [(w.rank, w.local_rank, w.gpu_indices, w.master_addr) for w in s2.workers] == [(2, 0, (0, 2), "s1:7000")]
    assert [w.command for w in s1.workers + s2.workers] == [("python", "train.py")] * 4
    # What the committing transaction pushed is what a later read says.
    pushed = notifier.committed[-1]
    assert (pushed["s1"], pushed["s2"]) == (s1, s2)


def test_shrinks_run_before_starts_so_freed_gpus_can_be_reused_in_the_same_plan(app: SchedulerApp) -> None:
    register(app, "s1", gpus=2)
    elastic = submit(app, "elastic", workers=1, max_workers=2)
    applied(app, starts=[start(elastic, ("s1", (0,)), ("s1", (1,)))])
    waiting = submit(app, "waiting")

    # Listed start-first on purpose: the applier still shrinks first.
    result = applied(
        app,
        starts=[start(waiting, ("s1", (1,)))],
        scales=[scale(elastic, ("s1", (0,)), reason=Reason.SCALED_IN_FOR_BASE_DEMAND)],
    )

    assert (result.started, result.scaled, result.rejected) == ((waiting,), (elastic,), ())
    assert allocations(app, elastic) == {(0, "s1", 0)}
    assert allocations(app, waiting) == {(0, "s1", 1)}


def test_preemptions_run_before_starts_so_freed_gpus_can_be_reused_in_the_same_plan(app: SchedulerApp) -> None:
    register(app, "s1", gpus=1)
    victim = submit(app, "victim")
    applied(app, starts=[start(victim, ("s1", (0,)))])
    urgent = submit(app, "urgent")

    result = applied(
        app,
        starts=[start(urgent, ("s1", (0,)))],
        preemptions=[PreemptJob(victim, Reason.PREEMPTED_FOR_RECLAIM, "make room")],
    )

    assert (result.started, result.preempted, result.rejected) == ((urgent,), (victim,), ())
    assert allocations(app, urgent) == {(0, "s1", 0)}


def test_a_stale_scale_is_refused_alone_while_the_rest_of_the_plan_commits(app: SchedulerApp) -> None:
    register(app, "s1", gpus=4)
    stale = submit(app, "stale", workers=1, max_workers=2)
    applied(app, starts=[start(stale, ("s1", (0,)))])
    app.jobs.cancel(stale, "user changed their mind")
    fresh = submit(app, "fresh")

    result = applied(app, scales=[scale(stale, ("s1", (0,)), ("s1", (1,)))], starts=[start(fresh, ("s1", (0,)))])

    assert result.scaled == ()
    assert result.rejected == ((stale, f"STALE_PLAN: job {stale} is CANCELLED, not running: it cannot be resized"),)
    assert result.started == (fresh,)
    assert allocations(app, stale) == set()
    assert allocations(app, fresh) == {(0, "s1", 0)}
    assert job_row(app, stale).state == "CANCELLED"


@pytest.mark.parametrize(
    ("workers", "why"),
    [
        ((("s1", (0,)), ("s1", (1,)), ("s1", (2,))), "job {job}: 3 worker(s) planned, outside 1..2"),
        ((("s1", (0, 1)),), "job {job}: rank 0 has 2 GPU(s), needs 1"),
        ((("s1", (0,)), ("s9", (0,))), "server s9 is not registered: training cannot run on it"),
        ((("s1", (0,)), ("s1", (7,))), "GPU 7 of server s1 is unhealthy or missing"),
    ],
    ids=["above_max", "wrong_gpus_per_worker", "unknown_server", "missing_gpu"],
)
def test_a_malformed_scale_is_refused_and_the_job_keeps_running_as_it_was(
    app: SchedulerApp, workers: tuple, why: str
) -> None:
    register(app, "s1", gpus=4)
    job = submit(app, workers=1, max_workers=2)
    applied(app, starts=[start(job, ("s1", (0,)))])

    result = applied(app, scales=[scale(job, *workers)])

    assert result.rejected == ((job, "STALE_PLAN: " + why.format(job=job)),)
    assert allocations(app, job) == {(0, "s1", 0)}
    assert (job_row(app, job).state, job_row(app, job).num_workers) == ("RUNNING", 1)


# --- double booking -------------------------------------------------------------------------------


def test_a_plan_that_double_books_a_gpu_commits_only_the_first_action(app: SchedulerApp) -> None:
    register(app, "s1", gpus=2)
    first, second = submit(app, "first"), submit(app, "second")
    elastic = submit(app, "elastic", workers=1, max_workers=2)
    applied(app, starts=[start(elastic, ("s1", (1,)))])

    result = applied(
        app,
        starts=[start(first, ("s1", (0,))), start(second, ("s1", (0,)))],
        scales=[scale(elastic, ("s1", (1,)), ("s1", (0,)))],  # grows after the starts: GPU 0 is gone by then
    )

    assert result.started == (first,)
    assert result.scaled == ()
    assert result.rejected == (
        (second, "STALE_PLAN: a planned GPU is already held by another worker"),
        (elastic, "STALE_PLAN: a planned GPU is already held by another worker"),
    )
    assert allocations(app, first) == {(0, "s1", 0)}
    assert allocations(app, second) == set()
    assert allocations(app, elastic) == {(0, "s1", 1)}
    assert (job_row(app, second).state, job_row(app, elastic).num_workers) == ("PENDING", 1)
    assert transitions(app, elastic)[-1] == ("PENDING", "RUNNING", "PLACED")  # no SCALING recorded


# --- many starts in one plan (applied as one batch) -----------------------------------------------


def _start_record(app: SchedulerApp, job_id: int) -> tuple:
    row = job_row(app, job_id)
    return (row.state, row.num_workers, row.incarnation, row.started_at, row.last_resized_at, row.pending_reason,
            row.worker_exits, row.rank_servers, row.state_reason, row.state_message)


def test_many_starts_record_exactly_what_one_start_at_a_time_records(
    app: SchedulerApp, clock: ManualClock, notifier: RecordingNotifier
) -> None:
    for name in ("s1", "s2", "s3"):
        register(app, name, gpus=2)
    alone = submit(app, "alone", workers=2)
    assert applied(app, starts=[start(alone, ("s1", (0,)), ("s2", (0,)))]).started == (alone,)
    one_by_one = _start_record(app, alone)
    applied(app, preemptions=[PreemptJob(alone, Reason.PREEMPTED_FOR_RECLAIM, "make room")])
    clock.advance(60)
    jobs = [submit(app, f"batch-{i}", workers=2) for i in range(3)]
    before = {s: generation(app, s) for s in ("s1", "s2", "s3")}

    result = applied(app, starts=[
        start(jobs[0], ("s1", (0,)), ("s2", (0,))),
        start(jobs[1], ("s2", (1,)), ("s3", (0,))),
        start(jobs[2], ("s3", (1,)), ("s1", (1,))),
        start(alone, ("s1", (0,)), ("s2", (0,))),  # held by jobs[0]: the batch falls back, this one is refused
    ])
    assert result.started == tuple(jobs) and result.rejected == (
        (alone, "STALE_PLAN: a planned GPU is already held by another worker"),
    )

    # Free s1/s2 GPU 0 and start two jobs together, one of them restarted after its preemption.
    applied(app, preemptions=[PreemptJob(jobs[0], Reason.PREEMPTED_FOR_RECLAIM, "make room")])
    register(app, "s4", gpus=1)
    again = submit(app, "again")
    clock.advance(60)
    result = applied(app, starts=[start(alone, ("s1", (0,)), ("s2", (0,))), start(again, ("s4", (0,)))])
    assert result == ApplyResult((alone, again), (), frozenset({"s1", "s2", "s4"}))
    assert allocations(app, alone) == {(0, "s1", 0), (1, "s2", 0)}
    # The same columns as one start at a time, except the restart's incarnation; started_at is the first start.
    state, workers, incarnation, started_at, resized_at, pending, exits, ranks, why, message = _start_record(app, alone)
    assert (state, workers, incarnation, started_at) == ("RUNNING", 2, one_by_one[2] + 1, one_by_one[3])
    assert (resized_at, pending, exits, ranks, why, message) == (clock.time, "", None, *one_by_one[7:])
    assert transitions(app, again) == [("PENDING", "RUNNING", "PLACED")]
    assert transitions(app, alone)[-1] == ("PENDING", "RUNNING", "PLACED")
    # Every touched server is told once per plan, after commit, with one generation bump per plan.
    assert notifier.desired[-1] == {"s1", "s2", "s4"}
    assert generation(app, "s3") == before["s3"] + 1  # the first batch only


def test_only_the_plans_jobs_with_batch_limits_have_their_batch_read_after_the_decision(app: SchedulerApp) -> None:
    # After a plan's starts are recorded, every round trip delays the pushes: the jobs the plan read without
    # batch limits need no read of their batch columns, and one with limits still has its batch recorded.
    for name in ("s1", "s2"):
        register(app, name, gpus=2)
    plain = [submit(app, f"plain-{i}") for i in range(3)]
    limited = app.jobs.submit(JobSubmission(
        name="limited", user="alice", queue="default", command=("python", "train.py"), env={}, gpus_per_worker=1,
        min_workers=1, max_workers=1, batch_limits=BatchLimits(init_bsz=64, max_bsz=256, max_atomic_bsz=64),
    )).id
    reads: list[list[object]] = []

    def seen(conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        if "batch_init IS NOT NULL" in statement:  # the batch columns of the jobs whose batch may change
            reads.append(list(params.values()) if isinstance(params, Mapping) else list(params))

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", seen)
    try:
        assert applied(app, starts=[start(plain[0], ("s1", (0,))), start(plain[1], ("s1", (1,)))]).started == (
            plain[0], plain[1])
        assert reads == []
        assert applied(app, starts=[start(plain[2], ("s2", (0,))), start(limited, ("s2", (1,)))]).started == (
            plain[2], limited)
    finally:
        sa.event.remove(sa.engine.Engine, "before_cursor_execute", seen)
    assert len(reads) == 1 and limited in reads[0] and plain[2] not in reads[0]
    _, events = app.jobs.get(limited, include_events=True)
    assert [e.message for e in events if e.kind == "JOB_BATCH_CHANGED"] == [
        "batch 64 = 1 GPU(s) x 64 per pass x 1 pass(es) per step (its init batch over its GPUs)"]


def test_a_batch_of_starts_may_land_on_a_server_the_same_plan_activates(app: SchedulerApp) -> None:
    register(app, "inf-1", pool=Pool.INFERENCE, gpus=2)
    applied(app, server_actions=[step("inf-1", LoanStep.LOAN, Reason.LOANED_IDLE_SERVER)])
    jobs = [submit(app, f"j{i}") for i in range(2)]

    result = applied(app, server_actions=[step("inf-1", LoanStep.ACTIVATE)],
                     starts=[start(j, ("inf-1", (i,))) for i, j in enumerate(jobs)])

    assert (result.server_steps, result.started, result.rejected) == ((("inf-1", "ACTIVATE"),), tuple(jobs), ())


def test_a_job_that_left_pending_after_the_plan_is_refused_alone_in_a_batch(app: SchedulerApp) -> None:
    register(app, "s1", gpus=4)
    jobs = [submit(app, f"j{i}") for i in range(4)]
    app.jobs.cancel(jobs[2], "changed my mind")

    result = applied(app, starts=[start(j, ("s1", (i,))) for i, j in enumerate(jobs)])

    assert result.started == (jobs[0], jobs[1], jobs[3])
    assert result.rejected == ((jobs[2], f"STALE_PLAN: job {jobs[2]} is no longer pending (it is CANCELLED)"),)
    assert allocations(app, jobs[2]) == set()
    assert [job_row(app, j).incarnation for j in jobs] == [1, 1, 0, 1]


def test_cancels_in_one_batch_each_get_their_own_answer(app: SchedulerApp, notifier: RecordingNotifier) -> None:
    register(app, "s1", gpus=2)
    register(app, "s2", gpus=2)
    running, queued, done = submit(app, "running", workers=2), submit(app, "queued"), submit(app, "done")
    applied(app, starts=[start(running, ("s1", (0,)), ("s2", (1,)))])
    app.jobs.cancel(done, "first")
    before = {s: generation(app, s) for s in ("s1", "s2")}
    versions = {j: job_row(app, j).version for j in (running, queued)}

    results = app.jobs.cancel_many([(running, "a", ""), (queued, "", ""), (running, "again", ""), (done, "x", ""),
                                    (999_999, "y", "")])

    assert [type(r).__name__ for r in results] == [
        "JobInfo", "JobInfo", "FailedPrecondition", "FailedPrecondition", "NotFound"]
    assert "already CANCELLED" in str(results[2]) and "job 999999 not found" in str(results[4])
    assert [job_row(app, j).state for j in (running, queued, done)] == ["CANCELLED"] * 3
    assert allocations(app, running) == set()
    assert transitions(app, running)[-1] == ("RUNNING", "CANCELLED", "CANCELLED_BY_USER")
    # Each cancelled job is written with its own request's reason, in the answer as in the database.
    assert [(r.state, r.state_message, r.num_workers) for r in results[:2] if isinstance(r, JobInfo)] == [
        ("CANCELLED", "a", 0), ("CANCELLED", "cancelled by user", 0)]
    for job_id, message in ((running, "a"), (queued, "cancelled by user")):
        row = job_row(app, job_id)
        assert (row.state_message, row.finished_at, row.pending_reason, row.num_workers) == (message, T0, "", 0)
        assert row.version == versions[job_id] + 1  # a writer holding the old version fails its check
    assert app.jobs.get(running, include_events=True)[1][-1].message == "a"
    # One bump per server for the whole batch, and the agents are told once.
    assert {s: generation(app, s) for s in ("s1", "s2")} == {s: g + 1 for s, g in before.items()}
    assert notifier.desired[-1] == {"s1", "s2"}


# --- the loan cycle -------------------------------------------------------------------------------


@pytest.mark.parametrize("vacate", ["preempt", "scale_in"])
def test_the_full_loan_cycle(app: SchedulerApp, clock: ManualClock, notifier: RecordingNotifier, vacate: str) -> None:
    register(app, "train-1", gpus=2)
    register(app, "inf-1", pool=Pool.INFERENCE, gpus=2)
    job = submit(app, workers=1, max_workers=4)
    applied(app, starts=[start(job, ("train-1", (0,)), ("train-1", (1,)))])

    loan_at = clock.advance(10)
    result = applied(app, server_actions=[step("inf-1", LoanStep.LOAN, Reason.LOANED_IDLE_SERVER)])
    assert result.server_steps == (("inf-1", "LOAN"),) and result.rejected == ()
    assert server_row(app, "inf-1").state == "DRAINING"
    assert loans(app) == [("inf-1", "ACTIVE", loan_at, None)]
    view = app.cluster.snapshot().server("inf-1")
    assert (view.state, view.state_since, view.loan_started_at) == (ServerState.DRAINING, loan_at, loan_at)

    # Lent and used in one plan: ACTIVATE is applied before the plan's placements.
    activate_at = clock.advance(30)
    result = applied(
        app,
        server_actions=[step("inf-1", LoanStep.ACTIVATE)],
        scales=[scale(job, ("train-1", (0,)), ("train-1", (1,)), ("inf-1", (0,)), ("inf-1", (1,)))],
    )
    assert (result.server_steps, result.scaled, result.rejected) == ((("inf-1", "ACTIVATE"),), (job,), ())
    view = app.cluster.snapshot().server("inf-1")
    assert (view.state, view.state_since, view.loan_started_at) == (ServerState.LOANED, activate_at, loan_at)
    assert view.allocated == ((0, job), (1, job))
    assert [w.world_size for w in app.agents.desired_state("inf-1").workers] == [4, 4]

    reclaim_at = clock.advance(300)
    vacating = (
        {"preemptions": [PreemptJob(job, Reason.PREEMPTED_FOR_RECLAIM, "inf-1 went back to inference")]}
        if vacate == "preempt"
        else {"scales": [scale(job, ("train-1", (0,)), ("train-1", (1,)), reason=Reason.SCALED_IN_FOR_RECLAIM)]}
    )
    result = applied(
        app, server_actions=[step("inf-1", LoanStep.RECLAIM, Reason.RECLAIMED_FOR_INFERENCE)], **vacating
    )
    assert result.server_steps == (("inf-1", "RECLAIM"),) and result.rejected == ()
    assert "inf-1" in result.touched_servers and "inf-1" in notifier.desired[-1]
    assert server_row(app, "inf-1").state == "RECLAIMING"
    assert loans(app) == [("inf-1", "RECLAIMING", loan_at, None)]
    assert app.agents.desired_state("inf-1").workers == ()
    if vacate == "preempt":
        assert job_row(app, job).state == "PENDING"
    else:
        assert (job_row(app, job).state, job_row(app, job).num_workers) == ("RUNNING", 2)
    view = app.cluster.snapshot().server("inf-1")
    assert (view.state_since, view.loan_started_at, view.agent_converged) == (reclaim_at, loan_at, False)

    # The agent confirms it stopped the workers, then the server serves again.
    app.agents.report_status(StatusReport("inf-1", app.term.epoch, (), server_row(app, "inf-1").desired_generation))
    assert app.cluster.snapshot().server("inf-1").agent_converged
    return_at = clock.advance(5)
    result = applied(app, server_actions=[step("inf-1", LoanStep.RETURN, Reason.RETURNED_TO_SERVING)])
    assert result.server_steps == (("inf-1", "RETURN"),) and result.rejected == ()
    assert server_row(app, "inf-1").state == "SERVING"
    assert loans(app) == [("inf-1", "RETURNED", loan_at, return_at)]
    view = app.cluster.snapshot().server("inf-1")
    assert (view.state, view.state_since, view.loan_started_at) == (ServerState.SERVING, return_at, None)

    assert server_events(app, "inf-1") == [
        ("SERVER_STATE_CHANGED", "SERVING", "DRAINING", "LOANED_IDLE_SERVER"),
        ("LOAN_STARTED", "", "", "LOANED_IDLE_SERVER"),
        ("SERVER_STATE_CHANGED", "DRAINING", "LOANED", "LOAN_ACTIVE"),
        ("SERVER_STATE_CHANGED", "LOANED", "RECLAIMING", "RECLAIMED_FOR_INFERENCE"),
        ("SERVER_STATE_CHANGED", "RECLAIMING", "SERVING", "RETURNED_TO_SERVING"),
        ("LOAN_ENDED", "", "", "RETURNED_TO_SERVING"),
    ]


def test_a_loan_cancelled_while_draining_returns_the_server_and_ends_the_loan(
    app: SchedulerApp, clock: ManualClock
) -> None:
    register(app, "inf-1", pool=Pool.INFERENCE)
    applied(app, server_actions=[step("inf-1", LoanStep.LOAN, Reason.LOANED_IDLE_SERVER)])
    cancel_at = clock.advance(20)

    result = applied(app, server_actions=[step("inf-1", LoanStep.CANCEL, Reason.LOAN_CANCELLED)])

    assert result.server_steps == (("inf-1", "CANCEL"),)
    assert server_row(app, "inf-1").state == "SERVING"
    assert loans(app) == [("inf-1", "RETURNED", T0, cancel_at)]
    assert [e[0] for e in server_events(app, "inf-1")][-2:] == ["SERVER_STATE_CHANGED", "LOAN_ENDED"]
    # A new loan may start later: only open loans are limited to one per server.
    assert applied(app, server_actions=[step("inf-1", LoanStep.LOAN)]).server_steps == (("inf-1", "LOAN"),)


def test_a_reclaim_of_a_server_that_still_holds_workers_is_refused_and_changes_nothing_there(
    app: SchedulerApp, clock: ManualClock
) -> None:
    register(app, "inf-1", pool=Pool.INFERENCE, gpus=2)
    register(app, "train-1", gpus=1)
    applied(app, server_actions=[step("inf-1", LoanStep.LOAN)])
    applied(app, server_actions=[step("inf-1", LoanStep.ACTIVATE)])
    job = submit(app, "on-loan", workers=2, max_workers=2)
    applied(app, starts=[start(job, ("inf-1", (0,)), ("inf-1", (1,)))])
    other = submit(app, "other")
    before = (server_row(app, "inf-1").state, generation(app, "inf-1"), loans(app), server_events(app, "inf-1"))
    clock.advance(60)

    # The plan reclaims inf-1 without vacating it; the unrelated start still commits.
    result = applied(
        app, server_actions=[step("inf-1", LoanStep.RECLAIM, Reason.RECLAIMED_FOR_INFERENCE)],
        starts=[start(other, ("train-1", (0,)))],
    )

    assert result.server_steps == ()
    assert result.rejected == (
        ("inf-1", f"STALE_PLAN: server inf-1 still runs workers of job(s) {job} after this plan's job actions; "
                  "RECLAIM needs it vacated"),
    )
    assert result.started == (other,)
    assert "inf-1" not in result.touched_servers
    after = (server_row(app, "inf-1").state, generation(app, "inf-1"), loans(app), server_events(app, "inf-1"))
    assert after == before
    assert before[0] == "LOANED"
    assert allocations(app, job) == {(0, "inf-1", 0), (1, "inf-1", 1)}


def test_return_is_refused_while_workers_remain(app: SchedulerApp, database_url: str) -> None:
    register(app, "inf-1", pool=Pool.INFERENCE, gpus=1)
    for kind in (LoanStep.LOAN, LoanStep.ACTIVATE, LoanStep.RECLAIM):
        applied(app, server_actions=[step("inf-1", kind)])
    # No plan can place a worker on a RECLAIMING server; write one behind the applier's back (say, a
    # worker the applier did not know of) to show RETURN checks the allocations itself.
    job = submit(app)
    engine = create_engine_for(database_url)
    with Session(engine) as session, session.begin():
        session.add(Allocation(job_id=job, rank=0, server_id="inf-1", gpu_index=0, allocated_at=T0))
    engine.dispose()

    result = applied(app, server_actions=[step("inf-1", LoanStep.RETURN, Reason.RETURNED_TO_SERVING)])

    assert result.rejected == (
        ("inf-1", f"STALE_PLAN: server inf-1 still runs workers of job(s) {job} after this plan's job actions; "
                  "RETURN needs it vacated"),
    )
    assert server_row(app, "inf-1").state == "RECLAIMING"
    assert loans(app) == [("inf-1", "RECLAIMING", T0, None)]


def test_activate_on_a_serving_server_is_an_illegal_transition(app: SchedulerApp) -> None:
    register(app, "inf-1", pool=Pool.INFERENCE)
    before = generation(app, "inf-1")

    result = applied(app, server_actions=[step("inf-1", LoanStep.ACTIVATE)])

    assert result.server_steps == ()
    assert result.rejected == (("inf-1", "STALE_PLAN: server cannot go from SERVING to LOANED"),)
    assert server_row(app, "inf-1").state == "SERVING"
    assert generation(app, "inf-1") == before
    assert loans(app) == [] and server_events(app, "inf-1") == []


def test_a_training_server_cannot_be_loaned(app: SchedulerApp) -> None:
    register(app, "train-1")

    result = applied(app, server_actions=[step("train-1", LoanStep.LOAN)])

    assert result.rejected == (("train-1", "STALE_PLAN: server cannot go from TRAINING to DRAINING"),)
    assert loans(app) == []


def test_workers_are_not_placed_on_a_draining_server_the_plan_does_not_activate(app: SchedulerApp) -> None:
    register(app, "inf-1", pool=Pool.INFERENCE, gpus=1)
    applied(app, server_actions=[step("inf-1", LoanStep.LOAN)])
    job = submit(app)

    result = applied(app, starts=[start(job, ("inf-1", (0,)))])

    assert result.rejected == ((job, "STALE_PLAN: server inf-1 is DRAINING: training cannot run on it"),)
    assert allocations(app, job) == set() and job_row(app, job).state == "PENDING"


def test_a_step_for_an_unknown_server_is_refused(app: SchedulerApp) -> None:
    result = applied(app, server_actions=[step("ghost", LoanStep.LOAN)])

    assert result.rejected == (("ghost", "STALE_PLAN: server ghost is not registered"),)


# --- the snapshot ---------------------------------------------------------------------------------


def test_the_snapshot_shows_progress_throughput_and_times(app: SchedulerApp, clock: ManualClock) -> None:
    register(app, "s1", gpus=2)
    hints = {"points": [[1, 100.0], [2, 180.0]], "total_work": 1e6, "estimated_runtime_s": 3600.0}
    job = submit(app, workers=1, max_workers=2, throughput=hints)
    plain = submit(app, "plain")

    view = {j.job_id: j for j in app.cluster.snapshot().jobs}
    assert view[job].throughput_points == ((1, 100.0), (2, 180.0))
    assert (view[job].total_work, view[job].estimated_runtime_s, view[job].work_done) == (1e6, 3600.0, 0.0)
    assert (view[job].started_at, view[job].last_resized_at, view[job].last_checkpoint_at) == (None, None, None)
    assert (view[plain].throughput_points, view[plain].total_work) == ((), 0.0)

    start_at = clock.advance(5)
    applied(app, starts=[start(job, ("s1", (0,)))])
    resize_at = clock.advance(5)
    applied(app, scales=[scale(job, ("s1", (0,)), ("s1", (1,)))])

    snapshot = app.cluster.snapshot()
    running = next(j for j in snapshot.jobs if j.job_id == job)
    assert (running.state, running.num_workers) == (JobState.RUNNING, 2)
    assert (running.started_at, running.last_resized_at) == (start_at, resize_at)
    s1 = snapshot.server("s1")
    assert s1.state_since == T0  # registration; training servers never change state here
    assert s1.loan_started_at is None
    assert not s1.agent_converged  # the scale bumped the generation; the agent has not caught up
    app.agents.report_status(StatusReport("s1", app.term.epoch, (), server_row(app, "s1").desired_generation))
    assert app.cluster.snapshot().server("s1").agent_converged


def test_a_snapshot_reuses_the_views_of_unchanged_servers_and_rebuilds_the_rest(
    app: SchedulerApp, database_url: str, clock: ManualClock
) -> None:
    register(app, "s1", gpus=3)
    register(app, "s2", gpus=3)
    register(app, "s3", gpus=3)
    first = app.cluster.snapshot()
    assert first.server("s1").free_gpus == (0, 1, 2)

    def gpus(*unhealthy: int) -> tuple[GpuSample, ...]:
        return tuple(GpuSample(i, 0.0, 0, 40.0, i not in unhealthy, "ECC" if i in unhealthy else "") for i in range(3))

    generation_s1 = server_row(app, "s1").desired_generation
    app.agents.report_status(StatusReport("s1", app.term.epoch, gpus(1), generation_s1))  # a GPU goes bad
    job = submit(app)
    applied(app, starts=[start(job, ("s2", (2,)))])

    second = app.cluster.snapshot()
    assert second.server("s3") is first.server("s3")  # nothing about it changed
    assert (second.server("s1").unhealthy_gpus, second.server("s1").free_gpus) == (frozenset({1}), (0, 2))
    assert (second.server("s2").allocated, second.server("s2").free_gpus) == (((2, job),), (0, 1))

    app.agents.report_status(StatusReport("s1", app.term.epoch, gpus(), generation_s1))  # and recovers
    app.jobs.cancel(job, "done")
    third = app.cluster.snapshot()
    assert (third.server("s1").unhealthy_gpus, third.server("s1").free_gpus) == (frozenset(), (0, 1, 2))
    assert (third.server("s2").allocated, third.server("s2").free_gpus) == ((), (0, 1, 2))
    engine = create_engine_for(database_url)  # a scheduler that has never taken a snapshot sees the same
    try:
        assert SchedulerApp(session_factory(engine), clock).cluster.snapshot().servers == third.servers
    finally:
        engine.dispose()


# --- concurrency ----------------------------------------------------------------------------------


def backend_pid(connection: sa.Connection) -> int:
    return connection.scalar(sa.text("SELECT pg_backend_pid()"))


def blocked_by(engine: sa.Engine, holder: int) -> set[int]:
    """The backends waiting for a lock that backend ``holder`` holds."""
    with engine.connect() as probe:  # its own transaction: pg_stat_activity is read once per transaction
        return set(probe.scalars(sa.text(
            "SELECT pid FROM pg_stat_activity WHERE CAST(:holder AS integer) = ANY(pg_blocking_pids(pid))"
        ), {"holder": holder}))


def test_a_change_the_database_aborts_to_break_a_deadlock_is_run_again(postgres_url: str, clock: ManualClock) -> None:
    """PostgreSQL breaks a deadlock by aborting the backend whose own check finds it; each waiting
    backend checks once, ``deadlock_timeout`` after it began to wait. So the cancel is made the victim
    by construction, whatever the machine's speed: the rival waits first and checks only after 10
    minutes, and the cancel's last wait is the one that closes the cycle (its check, 1 s later, finds it).
    Statements may wait a minute here (not the service's 5 s), so a slow machine only makes it slower."""
    engine = create_engine_for(postgres_url, statement_timeout_ms=60_000)
    app = SchedulerApp(session_factory(engine), clock)
    register(app, "s1", gpus=2)
    job = submit(app)
    applied(app, starts=[start(job, ("s1", (0,)))])
    outcome: list[object] = []

    def cancel() -> None:
        try:
            outcome.append(app.jobs.cancel_many([(job, "bye", "")])[0])
        except Exception as exc:  # noqa: BLE001 - shown by the assertion below (without the retry: DeadlockDetected)
            outcome.append(exc)

    try:
        with engine.connect() as rival, engine.connect() as gate:
            rival.execute(sa.text("SET LOCAL deadlock_timeout = '10min'"))  # never the one that checks
            rival.execute(sa.text("UPDATE servers SET version = version WHERE id = 's1'"))  # holds s1's row
            gate.execute(sa.text("SELECT 1 FROM allocations WHERE job_id = :id FOR UPDATE"), {"id": job})
            # The cancel locks the job, then stops at its allocation (the gate holds it)...
            canceller = threading.Thread(target=cancel)
            canceller.start()
            gate_pid, rival_pid = backend_pid(gate), backend_pid(rival)
            (cancel_pid,) = wait_for(lambda: blocked_by(engine, gate_pid), timeout=30, interval=0.02,
                                     what="the cancel to wait for the gate")
            # ...the rival, holding s1, waits for the job...
            def want_the_job() -> None:
                rival.execute(sa.text("UPDATE jobs SET priority = priority + 1 WHERE id = :id"), {"id": job})
                rival.commit()
            wants_the_job = threading.Thread(target=want_the_job)
            wants_the_job.start()
            wait_for(lambda: rival_pid in blocked_by(engine, cancel_pid), timeout=30, interval=0.02,
                     what="the rival to wait for the job")
            # ...and the gate opens: the cancel goes on to bump s1's generation and waits for the rival,
            # a deadlock. The cancel is aborted, the rival goes on and commits, and the cancel runs again.
            gate.commit()
            wants_the_job.join(timeout=60)
            canceller.join(timeout=60)
        assert [type(r).__name__ for r in outcome] == ["JobInfo"], outcome
        cancelled = outcome[0]
        assert isinstance(cancelled, JobInfo)
        assert cancelled.state == "CANCELLED" and cancelled.priority == 1  # saw the rival's change
        assert allocations(app, job) == set()
        assert transitions(app, job)[-1] == ("RUNNING", "CANCELLED", "CANCELLED_BY_USER")
    finally:
        engine.dispose()
