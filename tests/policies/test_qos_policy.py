"""The ``qos`` policy (deadline urgency, autoscaling to meet deadlines) and deadlines inside ``aryl``:
hand-computed cases on snapshots and tiny simulations, and the invariants on random snapshots.

Jobs here are linear (``linear_job``: 1 unit/s per worker), so a job of ``work`` units at ``n`` workers
takes ``work / n`` seconds; the policies add ``restart_cost_s`` (60 s) to a start or resize, the
simulator ``restart_overhead_s`` (30 s)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.core import ClusterSnapshot, JobView
from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan, ScaleJob, StartJob
from scheduler_service.lifecycle import JobState, ServerState
from scheduler_service.policies import create_policy
from simulator.engine import simulate
from simulator.model import ClusterSpec, TraceJob
from tests.harness import (
    NOW,
    first_fit_workers,
    inference_server,
    job_spec,
    linear_job,
    register_fake_server,
    running_job,
    scheduler_stub,
    snapshot_of,
    training_server,
)
from tests.helpers import wait_for


def plan(name: str, snap: ClusterSnapshot, **params) -> Plan:
    result = create_policy(name, PolicyParams(**params)).schedule(snap)
    assert check_plan(snap, result) == [], check_plan(snap, result)
    return result


def queued(jid: int, work: float, *, high: int, deadline: float | None, gpus: int = 1) -> JobView:
    """A queued linear job of ``work`` units (1..``high`` workers) with a deadline ``deadline`` s from NOW."""
    return JobView(jid, JobState.PENDING, gpus, 1, high, 0, NOW - 10,
                   throughput_points=tuple((w, float(w)) for w in range(1, high + 1)), total_work=work,
                   deadline=None if deadline is None else NOW + deadline)


def sizes(result: Plan) -> dict[int, int]:
    actions: tuple[StartJob | ScaleJob, ...] = (*result.starts, *result.scales)
    return {a.job_id: len(a.workers) for a in actions}


def with_deadline(job: TraceJob, deadline: float) -> TraceJob:
    return replace(job, deadline=deadline)


# -- qos: feasible, infeasible, hopeless -------------------------------------------------------------


def test_qos_sizes_each_deadline_job_to_meet_it_and_meets_every_deadline_in_a_feasible_case() -> None:
    # 8 GPUs. Job 1 (4000 units, due in 1100 s) needs 4 workers (60 + 1000 s), job 2 (2000 units) 2;
    # job 3 has no deadline. Both deadline jobs are at risk (slack 40 s < 20% of 1000 s); job 1, the
    # first in urgency (least slack at 1 worker), gets the one spare GPU: 5 workers.
    snap = snapshot_of([training_server("t", gpus=8)],
                       [queued(1, 4000, high=8, deadline=1100), queued(2, 2000, high=8, deadline=1100),
                        queued(3, 10000, high=8, deadline=None)])
    assert sizes(plan("qos", snap)) == {1: 5, 2: 2, 3: 1}
    # Simulated to the end: both deadlines met under qos; sjf (jobs at min_workers) meets neither.
    jobs = [with_deadline(linear_job(1, 0, 1, 1, 8, 4000.0), 1100.0),
            with_deadline(linear_job(2, 0, 1, 1, 8, 2000.0), 1100.0), linear_job(3, 0, 1, 1, 8, 10000.0)]
    ends: dict[str, dict[int, float]] = {}  # the finished jobs' ends
    for name in ("qos", "sjf"):
        result = simulate(jobs, [], ClusterSpec(1, 0, gpus_per_server=8), name, PolicyParams(), seed=0,
                          check_plans=True)
        ends[name] = {j.job_id: j.end for j in result.jobs if j.end is not None}
    assert ends["qos"][1] == 30 + 4000 / 5 and ends["qos"][2] == 30 + 2000 / 2  # 830 s, 1030 s
    assert ends["sjf"][1] > 1100 and ends["sjf"][2] > 1100


def test_qos_sacrifices_the_one_large_job_so_that_two_deadlines_are_met() -> None:
    # 4 GPUs. Job 1 needs all 4 to make it (4000 units, 60 + 1000 s); jobs 2 and 3 need 1 each
    # (1000 units). Job 1 is the most urgent, but meeting it leaves nothing for the other two: it
    # gives way (Moore-Hodgson: drop the largest), and gets a GPU left over only after them.
    jobs = [queued(1, 4000, high=4, deadline=1100), queued(2, 1000, high=4, deadline=1100),
            queued(3, 1000, high=4, deadline=1100)]
    snap = snapshot_of([training_server("t", gpus=4)], jobs)
    result = plan("qos", snap)
    got = sizes(result)
    assert got[2] >= 1 and got[3] >= 1 and got.get(1, 0) <= 2
    start1 = next((s for s in result.starts if s.job_id == 1), None)
    message = start1.message if start1 else next(p.message for p in result.pending if p.job_id == 1)
    assert "gives way" in message
    # Keeping urgency instead (qos_hopeless=keep: nothing is sacrificed): job 1 takes every GPU.
    assert sizes(plan("qos", snap, qos_hopeless="keep")) == {1: 4}


def test_qos_preempts_a_job_without_deadline_only_for_a_deadline_and_never_for_another_job() -> None:
    busy = replace(running_job(9, [("t", (0,)), ("t", (1,))], low=2, runtime=7200.0), started_at=NOW - 600)
    snap = snapshot_of([training_server("t", gpus=2)], [busy, queued(1, 100, high=1, deadline=None)])
    result = plan("qos", snap)
    assert not result.preemptions and [p.job_id for p in result.pending] == [1]
    urgent = queued(2, 600, high=2, deadline=700)  # needs 1 worker: 60 + 600 s
    result = plan("qos", snapshot_of([training_server("t", gpus=2)], [busy, urgent]))
    assert [p.job_id for p in result.preemptions] == [9] and sizes(result) == {2: 2}


def test_a_hopeless_job_queues_behind_jobs_without_a_deadline_unless_kept() -> None:
    # Job 1 cannot finish 10000 units in 1000 s even on 2 workers; job 2 has no deadline.
    snap = snapshot_of([training_server("t", gpus=2)],
                       [queued(1, 10000, high=2, deadline=1000, gpus=2), queued(2, 500, high=1, deadline=None)])
    result = plan("qos", snap)
    assert sizes(result) == {2: 1}
    [waiting] = result.pending
    assert waiting.job_id == 1 and "cannot meet its deadline" in waiting.message and "deprioritised" in waiting.message
    assert sizes(plan("qos", snap, qos_hopeless="keep")) == {1: 1}


def test_qos_grows_a_job_on_the_gpu_type_it_runs_on() -> None:
    job = replace(running_job(1, [("a", (0,))], low=1, high=4, resized=NOW - 4000),
                  throughput_points=tuple((w, float(w)) for w in range(1, 5)), total_work=1e6, work_done=1.0)
    servers = [training_server("a", gpus=2, gpu_type="A100"), training_server("b", gpus=8, gpu_type="V100")]
    assert sizes(plan("qos", snapshot_of(servers, [job]))) == {1: 2}  # the A100 server's one free GPU


def test_qos_runs_in_the_service(scheduler_factory) -> None:
    # Chosen by name (scheduling.policy), over real gRPC on SQLite and PostgreSQL: a queued elastic job
    # starts at once and takes the spare GPUs (no deadline: sized by spare GPUs, one worker at a time).
    scheduler = scheduler_factory(scheduling={"policy": "qos"})
    channel, stub = scheduler_stub(scheduler.address)
    register_fake_server(scheduler.address, "train-1", gpus=4)
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("elastic", workers=1, max_workers=4)),
                         timeout=5).job
    running = wait_for(lambda: (j := stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id), timeout=5).job)
                       .state == types_pb2.JOB_STATE_RUNNING and j, timeout=20, what="the job to run under qos")
    assert len(running.workers) == 4
    channel.close()


# -- aryl with deadlines ------------------------------------------------------------------------------


def elastic_pair(deadline: float | None, due: int = 2) -> ClusterSnapshot:
    """Two running elastic jobs at 1 worker (1..2) on 3 GPUs: one spare GPU. Job 1 is longer (5000 units
    left: a second worker cuts 2500 s); job 2 (2000 units left: 1000 s) with a deadline 1500 s from now
    misses it at 1 worker (2000 s) and meets it at 2 (60 + 1000 s). ``due``: the job with the deadline."""
    jobs = []
    for jid, work in ((1, 5000.0), (2, 2000.0)):
        job = running_job(jid, [("t", (jid - 1,))], low=1, high=2, resized=NOW - 4000)
        jobs.append(replace(job, throughput_points=((1, 1.0), (2, 2.0)), total_work=2 * work, work_done=work,
                            estimated_runtime_s=None,
                            deadline=NOW + deadline if jid == due and deadline is not None else None))
    return snapshot_of([training_server("t", gpus=3)], jobs)


def test_aryl_gives_the_spare_worker_to_the_job_it_saves_from_a_missed_deadline() -> None:
    # The two-step sizing (aryl-nojoint): without deadlines its knapsack takes the larger cut in completion
    # time: job 1's (2500 s vs 1000 s).
    assert sizes(plan("aryl-nojoint", elastic_pair(None))) == {1: 2}
    # Job 2's deadline makes its worker worth its cut plus its remaining time at 1 worker (1000 + 2000 s).
    assert sizes(plan("aryl-nojoint", elastic_pair(1500.0))) == {2: 2}
    # deadline_weight = 0: aryl ignores deadlines, as before.
    assert sizes(plan("aryl-nojoint", elastic_pair(1500.0), deadline_weight=0.0)) == {1: 2}
    # A deadline met anyway (or missed anyway) adds nothing: the plan is the one without deadlines.
    assert plan("aryl-nojoint", elastic_pair(5000.0)) == plan("aryl-nojoint", elastic_pair(None))
    assert sizes(plan("aryl-nojoint", elastic_pair(100.0))) == {1: 2}


def test_the_joint_sizing_gives_the_spare_worker_to_the_job_it_saves_from_a_missed_deadline() -> None:
    # aryl's joint sizing values completion rates: without deadlines the worker goes to job 2, the shorter
    # (1/1000 - 1/(2000 + 60) = 0.000515 a second against job 1's 1/2500 - 1/(5000 + 60) = 0.000202).
    assert sizes(plan("aryl", elastic_pair(None))) == {2: 2}
    # Job 1 due in 3000 s: it meets that only with 2 workers (60 + 2500 s). The deadline is worth its
    # remaining time at 1 worker, 5000 s, as a rate 5000 / (5060 x 2500) = 0.000395: 0.000597 in all.
    assert sizes(plan("aryl", elastic_pair(3000.0, due=1))) == {1: 2}
    assert sizes(plan("aryl", elastic_pair(3000.0, due=1), deadline_weight=0.0)) == {2: 2}
    # Met anyway, or missed anyway: the plan without deadlines.
    assert plan("aryl", elastic_pair(6000.0, due=1)) == plan("aryl", elastic_pair(None))
    assert sizes(plan("aryl", elastic_pair(100.0, due=1))) == {2: 2}


def test_aryl_reclaims_around_a_job_that_a_preemption_would_make_miss_its_deadline() -> None:
    # Two loaned servers, one inelastic 8-GPU job on each, 1000 units left at 1 unit/s. Job 1 checkpointed
    # 100 s ago, job 2 200 s ago: preempting job 1 loses less work, so it is the cheaper to reclaim --
    # unless job 1 is due in 1100 s: it meets that running on (1000 s) and misses it requeued (60 s
    # restart + 100 s redone + 1000 s); that deadline now weighs 1000 s x 8 GPUs on its server.
    def loaned_pair(deadline: float | None) -> ClusterSnapshot:
        jobs = []
        for jid, checkpoint in ((1, 100.0), (2, 200.0)):
            job = running_job(jid, [(f"i{jid - 1}", tuple(range(8)))], low=1, resized=NOW - 5000)
            jobs.append(replace(job, throughput_points=((1, 1.0),), total_work=2000.0, work_done=1000.0,
                                estimated_runtime_s=None, last_checkpoint_at=NOW - checkpoint,
                                deadline=NOW + deadline if jid == 1 and deadline is not None else None))
        servers = [inference_server(f"i{k}", ServerState.LOANED, since=NOW - 5000) for k in range(2)]
        return snapshot_of(servers, jobs, demand=1)

    aryl = create_policy("aryl", PolicyParams())
    assert aryl.preview_reclaim(loaned_pair(None), 1).servers == ("i0",)
    assert aryl.preview_reclaim(loaned_pair(1100.0), 1).servers == ("i1",)
    assert aryl.preview_reclaim(loaned_pair(5000.0), 1).servers == ("i0",)  # met even requeued
    blind = create_policy("aryl", PolicyParams(deadline_weight=0.0))
    assert blind.preview_reclaim(loaned_pair(1100.0), 1).servers == ("i0",)


# -- invariants on random snapshots ---------------------------------------------------------------------


@st.composite
def clusters(draw) -> ClusterSnapshot:
    servers = [training_server(f"t{k}", gpus=draw(st.sampled_from([2, 4, 8]))) for k in range(draw(st.integers(1, 3)))]
    free = {s.server_id: list(s.gpu_indices) for s in servers}
    jobs: list[JobView] = []
    for jid in range(1, draw(st.integers(0, 9)) + 1):
        gpus, low = draw(st.sampled_from([1, 2, 4])), draw(st.integers(1, 2))
        high = low + draw(st.integers(0, 3))
        work = draw(st.sampled_from([300.0, 3000.0, 30000.0]))
        deadline = draw(st.one_of(st.none(), st.sampled_from([-100.0, 200.0, 2000.0, 20000.0])))
        points = tuple((w, float(w)) for w in range(1, high + 1))
        placement = first_fit_workers(free, gpus, draw(st.integers(0, high)), least=low)
        if placement:
            job = running_job(jid, placement, low=low, high=high, resized=NOW - draw(st.sampled_from([10, 4000])))
        else:
            job = JobView(jid, JobState.PENDING, gpus, low, high, 0, NOW - 10)
        jobs.append(replace(job, throughput_points=points, total_work=work, work_done=work / 3,
                            deadline=None if deadline is None else NOW + deadline))
    return snapshot_of(servers, jobs)


@pytest.mark.parametrize(("name", "params"), [("qos", {}), ("qos", {"qos_hopeless": "keep"}), ("aryl", {}),
                                              ("aryl", {"deadline_weight": 0.0})])
@settings(max_examples=80, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(snap=clusters())
def test_every_plan_keeps_the_invariants_and_explains_every_waiting_job(name: str, params: dict, snap) -> None:
    result = plan(name, snap, **params)
    assert plan(name, snap, **params) == result  # deterministic
    if name == "aryl" and params:  # deadline_weight = 0: exactly the plan without any deadline
        blind = replace(snap, jobs=tuple(replace(j, deadline=None) for j in snap.jobs), _by_id={})
        assert plan("aryl", blind) == result
    started = {s.job_id for s in result.starts}
    assert {j.job_id for j in snap.pending_jobs()} - started == {p.job_id for p in result.pending}
