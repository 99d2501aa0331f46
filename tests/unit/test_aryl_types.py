"""``aryl`` on several GPU types (issue 33 item 4): a worker's rate on a server scales by its job's speed on that
server's GPU type over its reference type's (``policies.aryl.cycle.type_factors``), so a loaned server of a slower
type is valued as slower; a gang starts on the type where it runs fastest at the size that type has room for; a job
grows on its own type's GPUs only.
Hand-computed cases on hand-built snapshots."""

from __future__ import annotations

import dataclasses

import pytest

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.lifecycle import JobState, ServerState
from scheduler_service.policies import create_policy
from scheduler_service.policies.aryl.cycle import _Cycle, _running_jobs, type_factors
from scheduler_service.policies.aryl.sizing import extra_gains
from tests.harness import NOW, inference_server, pending_job, running_job, snapshot_of, training_server

DECLARED = {"a100": 1.0, "t4": 0.25}


def _job(**fields: object) -> JobView:
    return dataclasses.replace(pending_job(1), **fields)  # type: ignore[arg-type]


def test_declared_factors_alone_are_the_speeds() -> None:
    assert type_factors(_job(), DECLARED, ["a100", "t4"]) == {"a100": 1.0, "t4": 0.25}


def test_a_type_not_declared_runs_at_the_reference_speed() -> None:
    assert type_factors(_job(), {"t4": 0.5}, ["rtx", "t4"]) == {"rtx": 1.0, "t4": 0.5}


def test_measured_speeds_override_the_declared_ones() -> None:
    # Measured 100 samples/s per GPU on the A100 (factor 1, its reference type) and 20 on the T4 (declared 0.25):
    # the reference speed is the A100's 100, so the A100 runs at 1.0 and the T4 at 20 / 100 = 0.2 (the mean of
    # 100 / 1 and 20 / 0.25 = 90 would have put the A100 at 1.11 of its own curve).
    job = _job(type_speeds=(("a100", 100.0), ("t4", 20.0)))
    factors = type_factors(job, DECLARED, ["a100", "t4"])
    assert factors == pytest.approx({"a100": 1.0, "t4": 0.2})
    # Measured on the T4 and an undeclared V100 but not on the A100: the V100 (not named: factor 1.0) anchors,
    # 50 samples/s: the T4 at 20 / 50 = 0.4, the A100 by its declared 1.0.
    both = _job(type_speeds=(("t4", 20.0), ("v100", 50.0)))
    assert type_factors(both, DECLARED, ["a100", "t4", "v100"]) == pytest.approx(
        {"a100": 1.0, "t4": 0.4, "v100": 1.0})
    # Measured on the T4 alone: bootstrapped from it, 20 / 0.25 = 80 the reference; the T4 at 0.25.
    assert type_factors(_job(type_speeds=(("t4", 20.0),)), DECLARED, ["a100", "t4"]) == pytest.approx(
        {"a100": 1.0, "t4": 0.25})
    # Measured on the A100 alone: the T4 is bootstrapped by its declared factor.
    assert type_factors(_job(type_speeds=(("a100", 100.0),)), DECLARED, ["a100", "t4"]) == {"a100": 1.0, "t4": 0.25}


def test_nothing_to_tell_types_apart_is_one_speed() -> None:
    assert type_factors(_job(), {}, ["a100", "t4"]) is None          # no factor, no measure
    assert type_factors(_job(), DECLARED, ["a100"]) is None          # one type (a homogeneous cluster)
    assert type_factors(_job(type_speeds=(("a100", 9.0),)), {}, ["a100"]) is None


def _on_loaned_t4(gpu_speed: dict[str, float]) -> tuple[ClusterSnapshot, _Cycle]:
    """Job 1, elastic 1..2 workers of 1 GPU, 3,600 units of work at 1 unit/s per worker on its reference type, runs
    one worker on a loaned T4 server; an A100 training server is full."""
    job = dataclasses.replace(running_job(1, [("i1", (0,))], low=1, high=2, resized=NOW - 7200),
                              throughput_points=((1, 1.0), (2, 2.0)), total_work=3600.0, work_done=0.0,
                              estimated_runtime_s=None)
    busy = running_job(2, [("a1", (0, 1, 2, 3))], low=1, resized=NOW - 7200)
    servers = [training_server("a1", 4, gpu_type="a100"),
               inference_server("i1", ServerState.LOANED, 4, since=NOW - 9000, gpu_type="t4")]
    snap = dataclasses.replace(snapshot_of(servers, [job, busy], demand=0),
                               gpu_speed=tuple(sorted(gpu_speed.items())))
    params = PolicyParams()
    cycle = _Cycle(snapshot=snap, servers={s.server_id: s for s in snap.servers},
                   server_state={s.server_id: s.state for s in snap.servers}, running=_running_jobs(snap),
                   params=params)
    cycle.rebuild_capacity()
    return snap, cycle


def test_a_slow_loaned_server_is_valued_slower() -> None:
    # On the T4 (0.25 of the reference) the job needs 3,600 / 0.25 = 14,400 s at one worker, 7,200 s at two; a
    # second worker adds 1 / (7,200 + 60 s restart) - 1 / 14,400 to its completion rate. Declared as fast as the
    # reference type: 1 / (1,800 + 60) - 1 / 3,600.
    restart = PolicyParams().restart_cost_s
    _, slow = _on_loaned_t4(DECLARED)
    view = slow.running[1].view
    assert slow.estimate(view).remaining_time(1) == pytest.approx(14_400.0)
    assert slow.estimate(view).remaining_time(2) == pytest.approx(7_200.0)
    [gain] = extra_gains(slow, slow.running[1], 1, 1)
    assert gain == pytest.approx(1 / (7_200 + restart) - 1 / 14_400)
    _, same = _on_loaned_t4({})
    [as_fast] = extra_gains(same, same.running[1], 1, 1)
    assert as_fast == pytest.approx(1 / (1_800 + restart) - 1 / 3_600)
    assert gain < as_fast / 3  # a quarter of the speed: about a quarter of the gain


def test_a_gang_starts_on_its_fastest_type_with_room() -> None:
    # 4 free A100 GPUs and 8 free T4 GPUs on a loaned server: without speeds placement takes the type with the most
    # free GPUs (the T4); with them the job's fastest type that fits (the A100).
    servers = [training_server("a1", 4, gpu_type="a100"),
               inference_server("i1", ServerState.LOANED, 8, since=NOW - 9000, gpu_type="t4")]
    job = pending_job(1, 1, 2)
    for speeds, where in (({}, {"i1"}), (DECLARED, {"a1"})):
        snap = dataclasses.replace(snapshot_of(servers, [job], demand=0), gpu_speed=tuple(sorted(speeds.items())))
        plan = create_policy("aryl").schedule(snap)
        assert check_plan(snap, plan) == []
        [started] = plan.starts
        assert {w.server_id for w in started.workers} == where


@pytest.mark.parametrize(("most", "order"), [(8, ("rtx", "a100")), (1, ("a100", "rtx"))])
def test_a_gang_tries_first_the_type_where_it_runs_fastest_at_the_room_there(most: int, order: tuple[str, ...]
                                                                               ) -> None:
    # One free A100 GPU (3 of 4 held by job 2) and 8 free GPUs of a type at half its speed. Job 1 scales linearly up
    # to ``most`` workers: at 1..8 it runs 0.5 x 8 = 4x as fast on the 8 slower GPUs as on the one A100 (1.0 x 1),
    # where it could not grow while job 2 holds the rest, so its gang tries the slower type first (per GPU, the
    # A100 first: a gang admitted at one worker then ran its life on one GPU); held to one worker it runs 1.0
    # against 0.5 there and tries the A100 first. A plan starts it where its gang tries first.
    servers = [training_server("a1", 4, gpu_type="a100"), training_server("r1", 8, gpu_type="rtx")]
    busy = running_job(2, [("a1", (g,)) for g in range(3)], low=3, resized=NOW - 60)
    job = dataclasses.replace(pending_job(1, 1, 1, most),
                              throughput_points=tuple((n, float(n)) for n in range(1, most + 1)))
    snap = dataclasses.replace(snapshot_of(servers, [job, busy], demand=0),
                               gpu_speed=(("a100", 1.0), ("rtx", 0.5)))
    cycle = _Cycle(snapshot=snap, servers={s.server_id: s for s in snap.servers},
                   server_state={s.server_id: s.state for s in snap.servers}, running=_running_jobs(snap),
                   params=PolicyParams())
    cycle.rebuild_capacity()
    assert cycle.type_preference(job) == order
    plan = create_policy("aryl").schedule(snap)
    assert check_plan(snap, plan) == []
    [started] = plan.starts
    assert {cycle.servers[w.server_id].gpu_type for w in started.workers} == {order[0]}


def test_a_job_grows_on_its_own_type_only() -> None:
    # Job 1 fills an A100 server at 4 workers (7,200 units left at 1 unit/s per worker: 1,800 s) and may grow to 8;
    # job 2 runs one worker on a loaned T4 server with 3 free GPUs (3,600 units, 14,400 s at a quarter of the
    # speed) and may grow to 4. A fifth worker adds 1 / (1,440 + 60) - 1 / 1,800 to job 1's completion rate, a
    # second 1 / (7,200 + 60) - 1 / 14,400 to job 2's, less: one knapsack over all 3 free GPUs gave them to job 1,
    # which has no A100 to grow on, and none to job 2. Per type, job 2 takes them.
    def linear(job: JobView, work: float, most: int) -> JobView:
        return dataclasses.replace(job, estimated_runtime_s=None, total_work=work, work_done=0.0,
                                   throughput_points=tuple((n, float(n)) for n in range(1, most + 1)))

    grown = linear(running_job(1, [("a1", (g,)) for g in range(4)], low=1, high=8, resized=NOW - 7200), 7200.0, 8)
    slow = linear(running_job(2, [("i1", (0,))], low=1, high=4, resized=NOW - 7200), 3600.0, 4)
    servers = [training_server("a1", 4, gpu_type="a100"),
               inference_server("i1", ServerState.LOANED, 4, since=NOW - 9000, gpu_type="t4")]
    snap = dataclasses.replace(snapshot_of(servers, [grown, slow], demand=0),
                               gpu_speed=tuple(sorted(DECLARED.items())))
    plan = create_policy("aryl").schedule(snap)
    assert check_plan(snap, plan) == []
    assert {s.job_id: len(s.workers) for s in plan.scales} == {2: 4}
    assert all(j.state == JobState.RUNNING for j in snap.jobs)


@pytest.mark.parametrize(("work", "moves"), [(3600.0, True), (20.0, False)])
def test_a_job_on_a_slow_type_moves_to_a_faster_one_with_room_when_that_pays(work: float, moves: bool) -> None:
    # Job 1 (one worker, 1 unit/s on its reference type) runs on a loaned T4 at a quarter of that speed; the A100
    # server is free. 3,600 units: 14,400 s left here, 60 s restart + 3,600 s on the A100, it moves. 20 units: 80 s
    # here, 60 + 20 s there, the restart eats the gain, it stays.
    job = dataclasses.replace(running_job(1, [("i1", (0,))], low=1, high=1, resized=NOW - 7200),
                              throughput_points=((1, 1.0),), total_work=work, work_done=0.0, estimated_runtime_s=None)
    servers = [training_server("a1", 4, gpu_type="a100"),
               inference_server("i1", ServerState.LOANED, 4, since=NOW - 9000, gpu_type="t4")]
    snap = dataclasses.replace(snapshot_of(servers, [job], demand=0), gpu_speed=tuple(sorted(DECLARED.items())))
    plan = create_policy("aryl").schedule(snap)
    assert check_plan(snap, plan) == []
    if moves:
        [moved] = plan.scales
        assert [w.server_id for w in moved.workers] == ["a1"]
        assert moved.message == ("moved from 1 worker(s) on t4 to 1 on a100 GPUs (4.00x as fast per GPU for it): "
                                 "estimated completion 14400s -> 3660s with the restart")
    else:
        assert plan.scales == ()


@pytest.mark.parametrize(("work", "moves"), [(3600.0, True), (20.0, False)])
def test_a_job_on_one_gpu_of_a_full_fast_type_moves_to_a_slower_one_with_room_when_that_pays(work: float,
                                                                                          moves: bool) -> None:
    # Job 1 (1..8 workers, linear, 1 unit/s per worker on the A100) runs one worker on an A100 server whose other 3
    # GPUs job 2 holds; an RTX server at half the speed has 8 free GPUs. On its own type it can have 1 worker (1.0 x
    # 1), there 8 (0.5 x 8 = 4): 3,600 units, 3,600 s here; there a 60 s restart + 3,600 / (0.5 n) s at n workers
    # saves more than another restart from n = 3 (60 + 2,400 s; at 2, 60 + 3,600 s saves nothing): it moves, valued
    # at 3 workers, and the sharing out of the spare GPUs grows it to 8. 20 units: 20 s here, 60 + 5 s there at
    # best, it stays. (Per GPU the RTX is slower: before 2026-11-30 it never moved there.)
    snap = _on_a_full_a100(work)
    plan = create_policy("aryl").schedule(snap)
    assert check_plan(snap, plan) == []
    moved = [s for s in plan.scales if s.job_id == 1]
    if moves:
        assert [{w.server_id for w in m.workers} for m in moved] == [{"r1"}]
        assert len(moved[0].workers) == 8
        assert moved[0].message == ("moved from 1 worker(s) on a100 to 3 on rtx GPUs (0.50x as fast per GPU for it): "
                                    "estimated completion 3600s -> 2460s with the restart; 8 worker(s) after sharing "
                                    "out the spare GPUs")
    else:
        assert moved == []


def _on_a_full_a100(work: float) -> ClusterSnapshot:
    """Job 1 (1..8 workers, linear, 1 unit/s per worker on the A100, ``work`` units left) on one GPU of an A100
    server whose other 3 job 2 holds, beside a free RTX server of 8 GPUs at half the speed."""
    job = dataclasses.replace(running_job(1, [("a1", (0,))], low=1, high=8, resized=NOW - 7200),
                              throughput_points=tuple((n, float(n)) for n in range(1, 9)), total_work=work,
                              work_done=0.0, estimated_runtime_s=None)
    busy = running_job(2, [("a1", (g,)) for g in (1, 2, 3)], low=3, resized=NOW - 60)
    servers = [training_server("a1", 4, gpu_type="a100"), training_server("r1", 8, gpu_type="rtx")]
    return dataclasses.replace(snapshot_of(servers, [job, busy], demand=0), gpu_speed=(("a100", 1.0), ("rtx", 0.5)))


def test_a_move_does_not_take_gpus_the_jobs_on_the_new_type_complete_more_on() -> None:
    # The case above, but the RTX server's other 4 GPUs run job 3 (1..12 workers, linear, 600 units: 0.5 unit/s per
    # worker there, 300 s left at its 4). Job 1's move to 3 of the 4 free RTX GPUs would raise its own completion rate
    # by 1 / 2,460 - 1 / 3,600 = 1.3e-4 and give the A100 GPU it leaves to nobody (job 2 is in its protection window);
    # the 3 GPUs would add to job 3's rate, shared out as step 3 shares out the RTX GPUs (its base 1 worker, 1,200 s +
    # a 60 s restart): with all 7 of the room (free and its extras) 1 / 210 - 1 / 1,260, with the 4 left
    # 1 / 300 - 1 / 1,260, 1.4e-3 more. So job 1 stays on its A100 and job 3 grows to 8. Before 2026-11-30 (later
    # session) job 1 moved, weighed by its own time alone (in the Sia philly workload yolov3 jobs moved from one A100 to
    # six RTX GPUs to finish 1% sooner while short jobs there could have grown; docs/simulator.md). With nothing on the
    # RTX type wanting more (the test above) it still moves.
    job = dataclasses.replace(running_job(1, [("a1", (0,))], low=1, high=8, resized=NOW - 7200),
                              throughput_points=tuple((n, float(n)) for n in range(1, 9)), total_work=3600.0,
                              work_done=0.0, estimated_runtime_s=None)
    busy = running_job(2, [("a1", (g,)) for g in (1, 2, 3)], low=3, resized=NOW - 60)
    short = dataclasses.replace(running_job(3, [("r1", (g,)) for g in range(4)], low=1, high=12, resized=NOW - 7200),
                                throughput_points=tuple((n, float(n)) for n in range(1, 13)), total_work=600.0,
                                work_done=0.0, estimated_runtime_s=None)
    servers = [training_server("a1", 4, gpu_type="a100"), training_server("r1", 8, gpu_type="rtx")]
    snap = dataclasses.replace(snapshot_of(servers, [job, busy, short], demand=0),
                               gpu_speed=(("a100", 1.0), ("rtx", 0.5)))
    plan = create_policy("aryl").schedule(snap)
    assert check_plan(snap, plan) == []
    assert {s.job_id: len(s.workers) for s in plan.scales} == {3: 8}


def test_a_moved_job_keeps_the_size_its_move_was_valued_at_while_it_stays_on_that_type() -> None:
    # The move above (3,600 units: valued at 3 RTX workers, grown to 8). A later cycle: job 1, 36,000 units left, runs
    # 8 workers on the RTX server, out of its protection window; job 3 (1..12 workers, linear, 600 units) runs 4 on
    # a second RTX server. Sharing out the 10 RTX GPUs beyond their minimums by completion rates: job 1 takes
    # 72,000 / n s at n workers (+ 60 s if n is not 8), so its 7 extras add 1 / 9,000 - 1 / 72,060, 1.4e-5 per GPU;
    # job 3 takes 1,200 / m s (+ 60 s if m is not 4), and 7 more GPUs add 1 / 169 - 1 / 300, 3.7e-4 per GPU: job 3
    # takes them all. Before 2026-11-30 job 1 fell to 1 worker, at half its speed on the A100 GPU it left (its move
    # paid at 3), and a later cycle moved it back (in the Sia philly workload, yolov3 jobs went back and forth between
    # types a dozen times so). Now it keeps the 3 its move was valued at, and job 3 grows to 1 + its 3 extras + job
    # 1's 5 beyond its floor = 9.
    policy = create_policy("aryl")
    before = policy.schedule(_on_a_full_a100(3600.0))
    assert [len(s.workers) for s in before.scales if s.job_id == 1] == [8]

    def linear(job: JobView, work: float) -> JobView:
        return dataclasses.replace(job, throughput_points=tuple((n, float(n)) for n in range(1, job.max_workers + 1)),
                                   total_work=work, work_done=0.0, estimated_runtime_s=None)

    moved = linear(running_job(1, [("r1", (g,)) for g in range(8)], low=1, high=8, resized=NOW - 7200), 36000.0)
    short = linear(running_job(3, [("r2", (g,)) for g in range(4)], low=1, high=12, resized=NOW - 7200), 600.0)
    busy = running_job(2, [("a1", (g,)) for g in (1, 2, 3)], low=3, resized=NOW - 60)
    servers = [training_server("a1", 4, gpu_type="a100"), training_server("r1", 8, gpu_type="rtx"),
               training_server("r2", 4, gpu_type="rtx")]
    snap = dataclasses.replace(snapshot_of(servers, [moved, short, busy], demand=0),
                               gpu_speed=(("a100", 1.0), ("rtx", 0.5)))
    plan = policy.schedule(snap)
    assert check_plan(snap, plan) == []
    assert {s.job_id: len(s.workers) for s in plan.scales} == {1: 3, 3: 9}
    # A fresh policy (a restarted scheduler) knows of no move: job 1 is sized as any job.
    assert {s.job_id: len(s.workers) for s in create_policy("aryl").schedule(snap).scales} == {1: 1, 3: 11}


def test_a_loan_of_another_type_serves_no_running_jobs_growth() -> None:
    # Job 1 runs 4 workers on a full A100 server and could grow to 8; nothing is queued; an idle inference server
    # serves nobody beyond the spare one (``policy.loan_buffer_servers``). Of the same type, it is lent for job 1 to
    # grow onto; a T4 server is not (job 1 grows on A100s only), so none is lent.
    job = running_job(1, [("a1", (g,)) for g in range(4)], low=1, high=8, resized=NOW - 7200)
    for inference_type, lent in (("a100", True), ("t4", False)):
        servers = [training_server("a1", 4, gpu_type="a100"),
                   *(inference_server(f"i{k}", ServerState.SERVING, 4, since=NOW - 9000, gpu_type=inference_type)
                     for k in (1, 2))]
        snap = snapshot_of(servers, [job], demand=0)
        plan = create_policy("aryl").schedule(snap)
        assert check_plan(snap, plan) == []
        assert bool(plan.server_actions) == lent
