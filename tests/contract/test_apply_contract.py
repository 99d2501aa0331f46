"""The appliers' contract: the service's SQL applier and the simulator's cluster apply the same plans
to the same cluster with the same results -- what each commits, what it refuses and why (message and
``RefusalCode``) -- and leave the same state behind. So does the goodput job model's cluster
(``simulator.goodput_cluster``), which applies through the simulator's and moves its jobs' physics to
where the applied plans put them.

Both call the rules in ``scheduler_service.core.apply_rules``; this test holds them to it. One script
of plans, from one initial cluster built on both sides (the service: servers registered and jobs
submitted through its use cases, on SQLite and PostgreSQL; the simulator: a ``ClusterSpec`` and trace
jobs), with the outside world's events (a GPU going bad, a server falling silent) told to each side
its own way. The script has a plan refused for every rule, valid plans that need the dependency
order, a plan no order can apply, the loan cycle with its reclaim deadline, and plans made by the
code that makes them in production (``core.faults``, the aryl policy) on the state both sides share.

After every plan: equal ``ApplyResult``s, refusals as the script expects them (so a rule dropped on
both sides fails too), and equal snapshots (servers' states, GPUs, allocations, loan times; jobs'
states, workers, pending reasons, times). Times are compared from the clocks' common origin.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from scheduler_service.app import SchedulerApp
from scheduler_service.core.apply_rules import ApplySettings, RefusalCode
from scheduler_service.core.faults import plan_evictions
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import (
    ApplyResult,
    KeepPending,
    LoanStep,
    Plan,
    PreemptJob,
    Reason,
    ScaleJob,
    StartJob,
    WorkerPlacement,
)
from scheduler_service.core.snapshot import AdminState, ClusterSnapshot, JobView, WorkerView
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.policies import create_policy
from scheduler_service.records import GpuReport, GpuSample, JobSubmission, ServerRegistration, StatusReport
from scheduler_service.store.db import create_engine_for, session_factory
from simulator.clock import VirtualClock
from simulator.cluster import SimulatedCluster
from simulator.goodput_cluster import GoodputCluster
from simulator.goodput_jobs import placement_of
from simulator.model import ClusterSpec, TraceJob
from tests.harness import T0, ManualClock, linear_job, scale, start, step

SPEC = ClusterSpec(training_servers=2, inference_servers=2, gpus_per_server=4)  # t0000, t0001, i0000, i0001
JOBS = (  # (gpus per worker, min workers, max workers), ids 1.. in this order
    (1, 1, 3),
    (2, 1, 1),
    (1, 2, 2),
    (1, 1, 2),
    (4, 1, 1),
    (1, 1, 4),
    (1, 1, 2),
)
STEP_S = 10.0  # the clocks move this far before every plan
SETTINGS = ApplySettings.of(PolicyParams())
RECLAIM_DEADLINE_S = SETTINGS.reclaim_deadline_s
NO_PROTECTION = PolicyParams(min_resize_interval_s=0, max_disruptions_per_hour=0)  # core.protection off

C = RefusalCode


def trace_jobs() -> list[TraceJob]:
    """Submitted at the clocks' origin, as the service's submissions are."""
    return [linear_job(job_id, T0, gpus, low, high, 1e9) for job_id, (gpus, low, high) in enumerate(JOBS, 1)]


# -- the two sides ---------------------------------------------------------------------------------


class ServiceSide:
    """The SQL applier behind the service's use cases, on ``database_url``."""

    def __init__(self, database_url: str) -> None:
        self.clock = ManualClock(T0)
        self.engine = create_engine_for(database_url)
        self.app = SchedulerApp(session_factory(self.engine), self.clock, apply_settings=SETTINGS)
        self.app.term.start("test")
        self.servers = {f"t{k:04d}": Pool.TRAINING for k in range(SPEC.training_servers)}
        self.servers |= {f"i{k:04d}": Pool.INFERENCE for k in range(SPEC.inference_servers)}
        self.unhealthy: dict[str, set[int]] = {sid: set() for sid in self.servers}
        self.lost: set[str] = set()
        for sid, pool in self.servers.items():
            self.app.agents.register(ServerRegistration(
                sid, pool, tuple(GpuReport(i, f"GPU-{sid}-{i}", "Fake-GPU", 80 << 30)
                                 for i in range(SPEC.gpus_per_server)), f"{sid}:7000", "test"))
        for job in trace_jobs():
            submitted = self.app.jobs.submit(JobSubmission(
                job.name, "alice", "default", ("python", "train.py"), {}, job.gpus_per_worker, job.min_workers,
                job.max_workers))
            assert submitted.id == job.job_id  # the script names jobs by id on both sides

    def close(self) -> None:
        self.engine.dispose()

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def apply(self, plan: Plan) -> ApplyResult:
        return self.app.cluster.apply(plan)

    def snapshot(self) -> ClusterSnapshot:
        return self.app.cluster.snapshot()

    def set_gpu_health(self, server_id: str, index: int, healthy: bool) -> None:
        """The server's agent reports its GPUs' health (telemetry of every GPU, as agents send it)."""
        (self.unhealthy[server_id].discard if healthy else self.unhealthy[server_id].add)(index)
        samples = tuple(GpuSample(i, 0.0, 0, 40.0, i not in self.unhealthy[server_id],
                                  "ECC" if i in self.unhealthy[server_id] else "")
                        for i in range(SPEC.gpus_per_server))
        self.app.agents.report_status(StatusReport(server_id, self.app.term.epoch, samples, 0))

    def set_admin(self, server_id: str, admin: AdminState) -> None:
        """An operator cordons (or drains) the server, or uncordons it (NONE), as arylctl does."""
        if admin == AdminState.NONE:
            self.app.server_admin.uncordon(server_id)
        elif admin == AdminState.CORDONED:
            self.app.server_admin.cordon(server_id, "contract test")
        else:
            self.app.server_admin.drain(server_id, "contract test")

    def fail_server(self, server_id: str) -> None:
        """The server's agent falls silent: every other live agent reports now, and the liveness sweep
        marks the one not heard from since the last step LOST."""
        self.lost.add(server_id)
        for sid in self.servers:
            if sid not in self.lost:
                self.app.agents.report_status(StatusReport(sid, self.app.term.epoch, (), 0))
        assert self.app.liveness.sweep_lost(STEP_S / 2) == [server_id]


class SimulatorSide:
    """The simulator's cluster, from ``SPEC`` and the same jobs, on a virtual clock at the same origin."""

    def __init__(self) -> None:
        self.clock = VirtualClock(T0)
        self.cluster = SimulatedCluster(SPEC, self.clock, apply_settings=SETTINGS)
        for job in trace_jobs():
            self.cluster.submit(job)

    def close(self) -> None:
        pass

    def advance(self, seconds: float) -> None:
        self.clock.advance_to(self.clock.now() + seconds)

    def apply(self, plan: Plan) -> ApplyResult:
        return self.cluster.apply(plan)

    def snapshot(self) -> ClusterSnapshot:
        return self.cluster.snapshot()

    def set_gpu_health(self, server_id: str, index: int, healthy: bool) -> None:
        self.cluster.set_gpu_health(server_id, index, healthy)

    def set_admin(self, server_id: str, admin: AdminState) -> None:
        self.cluster.set_admin(server_id, admin)

    def fail_server(self, server_id: str) -> None:
        self.cluster.fail_server(server_id)


class PlacedJob:
    """A stand-in for a goodput job (``simulator.goodput_jobs.SimJob``) of the script: its shape, and where
    the job model last (re)allocated it (``reallocations``: how often)."""

    def __init__(self, job: TraceJob) -> None:
        self.index = job.job_id
        self.spec = SimpleNamespace(name=job.name, submit_time=job.submit_time)
        self.app = SimpleNamespace(name="contract")
        self.completion_time: float | None = None
        self.shape = (job.gpus_per_worker, job.min_workers, job.max_workers)
        self.placement: tuple[int, ...] = ()
        self.reallocations = 0

    def reallocate(self, placement: tuple[int, ...], restart_s: float) -> None:
        self.placement = placement
        self.reallocations += 1


SERVER_IDS = sorted([f"t{k:04d}" for k in range(SPEC.training_servers)] +
                    [f"i{k:04d}" for k in range(SPEC.inference_servers)])


class AsSubmitted:
    """The goodput cluster's ``JobDeclaration`` for the script's jobs: their shapes, shown as the cluster
    holds them; an allocation is the index (in ``SERVER_IDS``) of each GPU's server, by rank."""

    def shape(self, job: PlacedJob) -> tuple[int, int, int]:
        return job.shape

    def view(self, job: PlacedJob, shown: JobView, now: float) -> JobView:
        return shown

    def allocation(self, workers: Sequence[WorkerView]) -> list[int]:
        return [SERVER_IDS.index(w.server_id) for w in sorted(workers, key=lambda w: w.rank) for _ in w.gpu_indices]


class GoodputSide(SimulatorSide):
    """The goodput job model's cluster around a simulated cluster of ``SPEC`` with the same jobs."""

    def __init__(self) -> None:  # the outside world's events reach its simulated cluster as SimulatorSide's
        self.clock = VirtualClock(T0)
        self.cluster = SimulatedCluster(SPEC, self.clock, apply_settings=SETTINGS)
        self.jobs = [PlacedJob(job) for job in trace_jobs()]
        # The script's PlacedJobs stand in for SimJobs: the cluster only holds them and hands them back.
        self.goodput = GoodputCluster(self.jobs, self.cluster, AsSubmitted(), restart_s=30.0)  # type: ignore[arg-type]
        assert self.goodput.arrive() == len(JOBS)

    def apply(self, plan: Plan) -> ApplyResult:
        return self.goodput.apply(plan)

    def snapshot(self) -> ClusterSnapshot:
        return self.goodput.snapshot()

    def runs_where_placed(self, snapshot: ClusterSnapshot) -> None:
        """Every job's physics run where the applied plans placed it (none for a pending job)."""
        for view in snapshot.jobs:
            job = self.jobs[view.job_id - 1]
            assert job.placement == placement_of(AsSubmitted().allocation(view.workers)), view.job_id


Side = ServiceSide | SimulatorSide


def state_of(snapshot: ClusterSnapshot) -> dict[str, Any]:
    """What the two sides must agree on, times from the common origin."""
    def since(t: float | None) -> float | None:
        return None if t is None else t - T0

    return {
        "servers": [(s.server_id, s.pool, s.state, s.gpu_indices, s.unhealthy_gpus, s.allocated,
                     since(s.loan_started_at), since(s.reclaim_deadline), s.admin, since(s.drain_deadline))
                    for s in snapshot.servers],
        "jobs": [(j.job_id, j.state, j.gpus_per_worker, j.min_workers, j.max_workers, since(j.submitted_at),
                  j.workers, j.pending_reason, since(j.started_at), since(j.last_resized_at)) for j in snapshot.jobs],
    }


# -- the script ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One plan, after the outside world's ``events`` (on both sides). ``plan`` is a Plan, or a
    function of the (shared) snapshot that makes one; ``refused``: the (job or server id, code) of
    every refusal, in order; ``check``: more to assert on the result and the shared state."""

    name: str
    plan: Plan | Callable[[ClusterSnapshot], Plan]
    refused: tuple[tuple[int | str, RefusalCode], ...] = ()
    events: tuple[Callable[[Side], None], ...] = ()
    check: Callable[[ApplyResult, ClusterSnapshot], None] | None = None


def worker(rank: int, server_id: str, *gpus: int) -> WorkerPlacement:
    return WorkerPlacement(rank, server_id, gpus)


def preempt(job_id: int) -> PreemptJob:
    return PreemptJob(job_id, Reason.PREEMPTED_FOR_RECLAIM, f"job {job_id} off its loaned server")


def gpu_goes_bad(server_id: str, index: int) -> Callable[[Side], None]:
    return lambda side: side.set_gpu_health(server_id, index, False)


def admin(server_id: str, state: AdminState) -> Callable[[Side], None]:
    return lambda side: side.set_admin(server_id, state)


def server_fails(server_id: str) -> Callable[[Side], None]:
    return lambda side: side.fail_server(server_id)


def deadline_set_at_reclaim(result: ApplyResult, snapshot: ClusterSnapshot) -> None:
    server = snapshot.server("i0000")
    assert (server.state, server.reclaim_deadline) == (ServerState.RECLAIMING, snapshot.now + RECLAIM_DEADLINE_S)


def in_dependency_order(result: ApplyResult, snapshot: ClusterSnapshot) -> None:
    assert (result.scaled, result.started) == ((7, 1), (4,))


def something_applied(result: ApplyResult, snapshot: ClusterSnapshot) -> None:
    assert result.started or result.scaled or result.preempted or result.server_steps


def evictions(snapshot: ClusterSnapshot) -> Plan:
    """What every policy plans first for the jobs on LOST servers."""
    planned = plan_evictions(snapshot)
    assert planned is not None
    return planned.merge(Plan())


def renumbered_survivor(result: ApplyResult, snapshot: ClusterSnapshot) -> None:
    assert (result.scaled, result.preempted) == ((1,), (3,))
    job = next(j for j in snapshot.jobs if j.job_id == 1)
    assert [(w.rank, w.server_id, w.gpu_indices) for w in job.workers] == [(0, "t0000", (0,))]


def no_elastic_work_on_t0000(result: ApplyResult, snapshot: ClusterSnapshot) -> None:
    assert snapshot.server("t0000").admin == AdminState.DRAINING
    assert result.preempted == (1, 4, 6, 7)  # elastic, all their workers there (t0001 is LOST): requeued
    assert not [j.job_id for j in snapshot.jobs if j.is_elastic and any(w.server_id == "t0000" for w in j.workers)]


SCRIPT = (
    # Starts, applied as one batch by the service: each checked in order, as one start at a time is. No
    # two share a GPU and no database constraint minds them: the rules alone refuse them.
    Step("starts: on a SERVING server, wrong GPU count, ranks not dense", Plan(starts=(
        start(1, ("t0000", (0,))),
        start(3, ("i0000", (0,)), ("i0000", (1,))),
        start(4, ("t0000", (1, 2))),
        StartJob(5, (worker(1, "i0001", 0, 1, 2, 3),), Reason.PLACED, "rank 1 alone"),
        start(7, ("t0001", (0,))),
    ), pending=(KeepPending(5, Reason.WAITING_FOR_GANG, "needs 4 GPU(s)"),
                KeepPending(1, Reason.WAITING_FOR_GANG, "started by this plan: not recorded"))),
         refused=((3, C.SERVER_CANNOT_TRAIN), (4, C.WRONG_GPU_COUNT), (5, C.RANKS_NOT_DENSE))),
    # An operator cordons a training and an inference server: no new worker there, no loan of it (a
    # worker already there keeps its GPUs: job 1 on t0000); uncordoned by the next step's events.
    Step("a start on a cordoned server, a LOAN of a cordoned server", Plan(
        starts=(start(2, ("t0000", (2, 3))),),
        server_actions=(step("i0001", LoanStep.LOAN, Reason.LOANED_IDLE_SERVER),),
    ), refused=((2, C.SERVER_CORDONED), ("i0001", C.SERVER_CORDONED)),
         events=(admin("t0000", AdminState.CORDONED), admin("i0001", AdminState.CORDONED))),
    Step("uncordoned", Plan(), events=(admin("t0000", AdminState.NONE), admin("i0001", AdminState.NONE))),
    # Starts alone (the one-by-one path).
    Step("a start of too many workers", Plan(starts=(
        start(6, ("t0000", (3,)), ("t0001", (1,)), ("t0001", (2,)), ("t0001", (3,)), ("i0000", (2,))),
    )), refused=((6, C.WORKERS_OUT_OF_RANGE),)),
    Step("a start on an unhealthy GPU", Plan(starts=(start(4, ("t0001", (3,))),)),
         refused=((4, C.GPU_UNUSABLE),), events=(gpu_goes_bad("t0001", 3),)),
    Step("starts: of a running job, on a GPU a running job holds, on one an earlier start of the plan took",
         Plan(starts=(
             start(1, ("t0000", (1,))),
             start(2, ("t0000", (0, 1))),
             start(3, ("t0001", (1,)), ("t0001", (2,))),
             start(4, ("t0001", (2,))),
         )), refused=((1, C.JOB_NOT_PENDING), (2, C.GPU_HELD), (4, C.GPU_HELD))),
    Step("resizes and a preemption of pending jobs, a malformed resize, a valid one", Plan(
        scales=(scale(4, ("t0000", (1,))), scale(7, ("t0001", (0, 1))), scale(1, ("t0000", (0,)), ("t0000", (1,)))),
        preemptions=(preempt(5),),
    ), refused=((5, C.JOB_NOT_RUNNING), (4, C.JOB_NOT_RUNNING), (7, C.WRONG_GPU_COUNT))),
    Step("a resize with ranks not dense, and one outside min..max", Plan(scales=(
        ScaleJob(1, (worker(0, "t0000", 0), worker(2, "t0000", 1)), Reason.SCALED_OUT, "rank 2 without 1"),
        scale(3, ("t0001", (1,))),
    )), refused=((3, C.WORKERS_OUT_OF_RANGE), (1, C.RANKS_NOT_DENSE))),  # a shrink comes first (it frees GPUs)
    # Valid only in the dependency order: job 1 (first in job-id order) moves onto the GPU job 7 frees,
    # and job 4 starts on the GPU job 1 frees.
    Step("moves and a start in dependency order", Plan(
        starts=(start(4, ("t0000", (1,))),),
        scales=(scale(1, ("t0000", (0,)), ("t0001", (0,))), scale(7, ("t0000", (2,)))),
    ), check=in_dependency_order),
    Step("a swap of GPUs: no order applies it", Plan(scales=(
        scale(1, ("t0000", (0,)), ("t0000", (2,))),
        scale(7, ("t0001", (0,))),
    )), refused=((1, C.UNORDERABLE), (7, C.UNORDERABLE))),
    Step("loan steps: a LOAN, an ACTIVATE from SERVING, a step for an unknown server", Plan(server_actions=(
        step("i0000", LoanStep.LOAN, Reason.LOANED_IDLE_SERVER),
        step("i0001", LoanStep.ACTIVATE),
        step("ghost", LoanStep.LOAN, Reason.LOANED_IDLE_SERVER),
    )), refused=(("i0001", C.ILLEGAL_TRANSITION), ("ghost", C.SERVER_NOT_REGISTERED))),
    Step("a placement on the server the same plan activates", Plan(
        starts=(start(6, ("i0000", (0,)), ("i0000", (1,))),),
        server_actions=(step("i0000", LoanStep.ACTIVATE),),
    )),
    Step("a reclaim of a server still running workers", Plan(server_actions=(
        step("i0000", LoanStep.RECLAIM, Reason.RECLAIMED_FOR_INFERENCE),
    )), refused=(("i0000", C.SERVER_NOT_VACATED),)),
    Step("a reclaim after the preemption that vacates it", Plan(
        server_actions=(step("i0000", LoanStep.RECLAIM, Reason.RECLAIMED_FOR_INFERENCE),),
        preemptions=(preempt(6),),
    ), check=deadline_set_at_reclaim),
    Step("a CANCEL of a reclaimed loan", Plan(server_actions=(step("i0000", LoanStep.CANCEL, Reason.LOAN_CANCELLED),)),
         refused=(("i0000", C.LOAN_MISMATCH),)),
    Step("the return", Plan(server_actions=(step("i0000", LoanStep.RETURN, Reason.RETURNED_TO_SERVING),))),
    Step("a loan", Plan(server_actions=(step("i0001", LoanStep.LOAN, Reason.LOANED_IDLE_SERVER),))),
    # The server dies draining: LOST, and its loan ends (both sides); LOST -> SERVING is a legal move.
    Step("a RETURN without a reclaiming loan, a placement on a LOST server", Plan(
        server_actions=(step("i0001", LoanStep.RETURN, Reason.RETURNED_TO_SERVING),),
        starts=(start(5, ("i0001", (0, 1, 2, 3))),),
    ), refused=((5, C.SERVER_CANNOT_TRAIN), ("i0001", C.LOAN_MISMATCH)), events=(server_fails("i0001"),)),
    # t0001 dies under job 1's rank 1 and both of job 3's workers: job 1 shrinks to its worker on t0000
    # (renumbered, not placed again), job 3 is requeued.
    Step("the evictions off a LOST server (core.faults)", evictions, events=(server_fails("t0001"),),
         check=renumbered_survivor),
    Step("the aryl policy's plan on the shared state", lambda snap: create_policy("aryl").schedule(snap),
         check=something_applied),
    # An operator drains t0000: the policy's plan (core.faults first) moves the elastic jobs off it (no
    # worker elsewhere: requeued) and places nothing there, on both sides alike. The protection window is
    # off here (those jobs started moments ago: a drain waits for it, tests/unit/test_protection.py).
    Step("the aryl policy's plan with t0000 draining",
         lambda snap: create_policy("aryl", NO_PROTECTION).schedule(snap),
         events=(admin("t0000", AdminState.DRAINING),), check=no_elastic_work_on_t0000),
)


@pytest.fixture
def sides(database_url: str) -> Iterator[tuple[ServiceSide, SimulatorSide, GoodputSide]]:
    service, simulator, goodput = ServiceSide(database_url), SimulatorSide(), GoodputSide()
    try:
        yield service, simulator, goodput
    finally:
        service.close()


def test_both_appliers_commit_and_refuse_the_same_actions_and_leave_the_same_state(
    sides: tuple[ServiceSide, SimulatorSide, GoodputSide],
) -> None:
    service, simulator, goodput = sides
    assert state_of(service.snapshot()) == state_of(simulator.snapshot()) == state_of(goodput.snapshot())
    every_code: set[RefusalCode] = set()
    for s in SCRIPT:
        for side in (service, simulator, goodput):
            side.advance(STEP_S)
            for event in s.events:
                event(side)
        before = simulator.snapshot()
        assert state_of(service.snapshot()) == state_of(before), s.name
        assert state_of(goodput.snapshot()) == state_of(before), s.name
        plan = s.plan if isinstance(s.plan, Plan) else s.plan(before)
        by_simulator = simulator.apply(plan)
        by_service = service.apply(plan)
        reallocations = [job.reallocations for job in goodput.jobs]
        by_goodput = goodput.apply(plan)

        assert by_service == by_simulator, s.name
        assert by_goodput == by_simulator, s.name
        goodput.runs_where_placed(goodput.snapshot())
        moved = {job.index for job, n in zip(goodput.jobs, reallocations, strict=True) if job.reallocations > n}
        assert moved <= {*by_goodput.started, *by_goodput.scaled, *by_goodput.preempted}, s.name
        assert tuple(zip((i for i, _ in by_simulator.rejected), by_simulator.rejected_codes, strict=True)) \
            == s.refused, s.name
        assert all(why.startswith("STALE_PLAN: ") for _, why in by_simulator.rejected), s.name
        after = simulator.snapshot()
        assert state_of(service.snapshot()) == state_of(after), s.name
        assert state_of(goodput.snapshot()) == state_of(after), s.name
        if s.check is not None:
            s.check(by_simulator, after)
        every_code.update(code for _, code in s.refused)
    # The script refuses by every rule but the database's own (a concurrent writer, not scriptable here) and
    # the service's port range (the simulator runs no rendezvous: tests/service/test_master_port.py covers it).
    assert every_code == set(RefusalCode) - {RefusalCode.CHANGED_CONCURRENTLY, RefusalCode.MASTER_PORT_RANGE_FULL}
