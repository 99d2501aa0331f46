"""GPU types in placement (``core.placement`` step 3): a job that names types runs only on them, in
its order; a job's workers never span types (its elastic extras stay on its type); an impossible type
says so. Hand-built snapshots through the ``aryl`` policy, and the placement pipeline directly."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import Reason
from scheduler_service.policies import create_policy
from simulator.engine import simulate
from simulator.generic_trace import load_generic_csv
from simulator.model import ClusterSpec
from simulator.trace_csv import TraceFormatError
from tests.harness import NOW, linear_job, pending_job, running_job, snapshot_of, training_server


def server(sid: str, gpu_type: str, gpus: int = 4, **fields):
    return training_server(sid, gpus, gpu_type=gpu_type, **fields)


def typed(jid: int, gpus: int, workers: int, *types: str, max_workers: int | None = None):
    return dataclasses.replace(pending_job(jid, gpus, workers, max_workers), gpu_types=types)


def test_a_job_runs_only_on_the_types_it_names() -> None:
    servers = [server("a1", "A100"), server("v1", "V100"), server("v2", "V100")]
    jobs = [typed(1, 2, 2, "A100"), typed(2, 4, 2, "H100", "V100"), typed(3, 4, 1, "A100")]
    snap = snapshot_of(servers, jobs)
    plan = create_policy("aryl").schedule(snap)
    check_plan(snap, plan)
    where = {s.job_id: {w.server_id for w in s.workers} for s in plan.starts}
    assert where == {1: {"a1"}, 2: {"v1", "v2"}}
    [waiting] = plan.pending
    assert waiting.job_id == 3 and waiting.reason == Reason.WAITING_FOR_GPU_TYPE
    assert waiting.message == ("needs 1 worker(s) x 4 GPU(s) as a gang on GPU type(s) A100; free now: 0 GPU(s) "
                               "of that type on 1 server(s)")


def test_a_type_no_server_has_says_so() -> None:
    snap = snapshot_of([server("a1", "A100")], [typed(1, 1, 1, "H100")])
    [waiting] = create_policy("fifo").schedule(snap).pending
    assert waiting.reason == Reason.WAITING_FOR_GPU_TYPE
    assert "no schedulable server has that type (types here: A100)" in waiting.message


def test_a_gang_never_spans_types() -> None:
    # 2 free GPUs on an A100 server and 2 on a V100 one: a 2 x 2-GPU gang of any type does not fit; on a
    # cluster of one type the same free GPUs take it.
    busy = running_job(9, [("a1", (0, 1)), ("v1", (0, 1))], low=2)
    job = pending_job(1, 2, 2)
    mixed = snapshot_of([server("a1", "A100"), server("v1", "V100")], [busy, job])
    assert create_policy("aryl").schedule(mixed).starts == ()
    same = snapshot_of([server("a1", "A100"), server("v1", "A100")], [busy, job])
    assert [s.job_id for s in create_policy("aryl").schedule(same).starts] == [1]


def test_elastic_extras_stay_on_the_jobs_type() -> None:
    # Job 1 (1..4 x 2 GPUs) runs on the V100 server; the A100 server is empty: it grows on v1 only.
    job = running_job(1, [("v1", (0, 1))], low=1, high=4, resized=NOW - 10000, runtime=1e6)
    snap = snapshot_of([server("a1", "A100", 8), server("v1", "V100")], [job])
    plan = create_policy("aryl").schedule(snap)
    check_plan(snap, plan)
    [grown] = plan.scales
    assert {w.server_id for w in grown.workers} == {"v1"} and len(grown.workers) == 2


def test_no_gpu_of_another_type_idles_while_a_job_the_joint_sizing_deferred_waits() -> None:
    # One free "fast" GPU (f1: job 1 holds 3) and 8 free "slow" ones. Job 2 (1..16 one-GPU workers, 600 s) lands
    # on slow, where the room is; the joint sizing shares out all 9 free GPUs as one pool, and 9 workers cut job
    # 2's time more than job 3 (one worker, 10 h) would gain from the 9th GPU: it defers job 3. But job 2 grows
    # on its own type only, to 8, so the fast GPU would stand idle while job 3 waits for it: it starts there.
    servers = [server("f1", "fast"), server("s1", "slow"), server("s2", "slow")]
    busy = running_job(1, [("f1", (0, 1, 2))], low=1, runtime=36000, resized=NOW - 3000)
    jobs = [busy, pending_job(2, 1, 1, 16, runtime=600), pending_job(3, 1, 1, runtime=36000)]
    snap = dataclasses.replace(snapshot_of(servers, jobs), gpu_speed=(("fast", 2.0),))
    plan = create_policy("aryl-noloan").schedule(snap)
    check_plan(snap, plan)
    starts = {s.job_id: s for s in plan.starts}
    assert {w.server_id for w in starts[2].workers} == {"s1", "s2"} and len(starts[2].workers) == 8
    assert [(w.server_id, w.gpu_indices) for w in starts[3].workers] == [("f1", (3,))]
    assert starts[3].reason == Reason.BACKFILLED and "no job's minimum or elastic extras took" in starts[3].message
    assert not plan.pending


def test_untyped_gangs_go_to_the_type_with_most_free_gpus() -> None:
    capacity = FreeCapacity.of(snapshot_of([server("a1", "A100"), server("v1", "V100", 8)], []))
    assert capacity.type_order(()) == ["V100", "A100"]
    assert capacity.type_order(("A100", "X")) == ["A100"]
    placed = capacity.place_gang(pending_job(1, 2, 3), 3)
    assert placed is not None and {w.server_id for w in placed} == {"v1"}


# -- the simulator: typed servers, declared speeds, trace columns -----------------------------------


def test_the_simulator_runs_jobs_on_their_type_at_its_declared_speed() -> None:
    # Two 4-GPU training servers, t0000 "slow" (speed 1) and t0001 "fast" (speed 2). Job 1 asks for
    # "fast": 1000 units at 1 unit/s take 500 s there, plus the 30 s restart overhead. Job 2 asks for
    # "slow": 1000 s + 30 s. Job 3 asks for a type no server has: it never starts (the run stalls).
    spec = ClusterSpec(2, 0, 4, training_gpu_types=(("slow", 1), ("fast", 1)), gpu_speed=(("fast", 2.0),))
    jobs = [dataclasses.replace(linear_job(1, 0.0, 4, 1, 1, 1000.0), gpu_types=("fast",)),
            dataclasses.replace(linear_job(2, 0.0, 4, 1, 1, 1000.0), gpu_types=("slow",))]
    result = simulate(jobs, [], spec, "aryl", PolicyParams(), seed=0, check_plans=True)
    ends = {o.job_id: o.end for o in result.jobs}
    assert ends == {1: pytest.approx(530.0), 2: pytest.approx(1030.0)}
    stuck = [*jobs, dataclasses.replace(linear_job(3, 0.0, 1, 1, 1, 10.0), gpu_types=("H100",))]
    result = simulate(stuck, [], spec, "aryl", PolicyParams(), seed=0, max_time_s=20_000.0)
    assert [o.end for o in result.jobs if o.job_id == 3] == [None]
    with pytest.raises(ValueError, match="training_gpu_types name 1 servers; the cluster has 2"):
        simulate(jobs, [], ClusterSpec(2, 0, 4, training_gpu_types=(("x", 1),)), "aryl", PolicyParams(), seed=0)


def test_generic_trace_columns_for_queues_classes_and_types(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("submit_time,gpus_per_worker,min_workers,duration_s,queue,user,priority_class,gpu_types\n"
                     "0,1,1,60,vision,ann,100,A100;V100\n"
                     "5,1,1,60,,,,\n")
    first, second = load_generic_csv(trace)
    assert (first.queue, first.user, first.priority_class, first.gpu_types) == ("vision", "ann", 100,
                                                                                ("A100", "V100"))
    assert (second.queue, second.user, second.priority_class, second.gpu_types) == ("default", "", 0, ())
    trace.write_text("submit_time,gpus_per_worker,min_workers,duration_s,gpu_types\n0,1,1,60,A;A\n")
    with pytest.raises(TraceFormatError, match="gpu_types"):
        load_generic_csv(trace)
