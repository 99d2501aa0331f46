"""The scheduler's side of worker execution, over real gRPC on both databases: what agents report
about workers (progress, checkpoints, exits) drives job completion and the restart policy; silent
agents make their servers LOST and the next cycle shrinks or requeues their jobs; logs are located by rank.

The agents here are the test itself speaking the AgentService protocol (register, report), so each
report is exactly the one under test; tests/agent/test_agent_workers.py runs real agents and workers.
"""

from __future__ import annotations

import grpc
import pytest

from protos.aryl.v1 import agent_pb2, scheduler_pb2, types_pb2
from scheduler_service.app import SchedulerApp
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.worker_outcomes import Verdict, judge_exits
from tests.fixtures.workers import EXITED, RUNNING, Agent, J, _app, get_job, running, submit, worker
from tests.harness import ManualClock, details_of, job_spec, register_fake_server, scheduler_stub
from tests.helpers import wait_for


@pytest.fixture
def cluster(scheduler):
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "gpu-1", gpus=4).scheduler_epoch
    agent = Agent(scheduler.address, "gpu-1", epoch)
    yield scheduler, stub, agent
    agent.close()
    channel.close()


def test_desired_workers_carry_an_incarnation_and_all_ranks_exiting_0_completes_the_job(cluster) -> None:
    _, stub, agent = cluster
    job_id = submit(stub, job_spec("two", workers=2, gpus=1))
    running(stub, job_id, 2)
    desired = wait_for(lambda: (d := agent.desired()).workers and d, what="desired workers")
    assert sorted((w.job_id, w.rank, w.incarnation, w.world_size) for w in desired.workers) == [
        (job_id, 0, 1, 2), (job_id, 1, 1, 2)]
    assert desired.workers[0].grace_period.seconds > 0

    agent.report(worker(job_id, 0, 1, EXITED, exit_code=0), worker(job_id, 1, 1, RUNNING))
    assert get_job(stub, job_id).state == J.JOB_STATE_RUNNING  # rank 1 still runs
    generation = agent.desired().generation
    agent.report(worker(job_id, 0, 1, EXITED, exit_code=0), worker(job_id, 1, 1, EXITED, exit_code=0))

    job = get_job(stub, job_id)
    assert job.state == J.JOB_STATE_COMPLETED and job.num_workers == 0
    after = agent.desired()
    assert after.generation > generation and not after.workers  # the agent is told the workers are done
    kinds = [e.kind for e in stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id, include_events=True),
                                         timeout=5).events]
    assert kinds.count(types_pb2.EVENT_KIND_WORKER_EXITED) == 2


def test_a_crash_restarts_the_job_under_on_failure_then_fails_it_when_restarts_run_out(cluster) -> None:
    _, stub, agent = cluster
    job_id = submit(stub, job_spec("flaky", max_restarts=1, restart_policy=J.RESTART_POLICY_ON_FAILURE))
    running(stub, job_id)
    agent.report(worker(job_id, 0, 1, EXITED, exit_code=3, message="boom"))

    # Requeued with one restart used, then started again as a new incarnation.
    job = wait_for(lambda: (j := get_job(stub, job_id)).restarts == 1 and j.state == J.JOB_STATE_RUNNING and j,
                   timeout=20, what="the job restarted")
    assert [w.incarnation for w in agent.desired().workers] == [2]
    # A late report about the crashed incarnation is history: ignored.
    agent.report(worker(job_id, 0, 1, EXITED, exit_code=3))
    assert get_job(stub, job_id).state == J.JOB_STATE_RUNNING

    agent.report(worker(job_id, 0, 2, EXITED, exit_code=-9))
    job = get_job(stub, job_id)
    assert job.state == J.JOB_STATE_FAILED
    assert "killed by SIGKILL" in job.message and "no restarts left" in job.message


def test_never_policy_fails_at_once_and_agent_initiated_stops_are_not_failures(cluster) -> None:
    _, stub, agent = cluster
    job_id = submit(stub, job_spec("once", restart_policy=J.RESTART_POLICY_NEVER, max_restarts=5))
    running(stub, job_id)
    agent.report(worker(job_id, 0, 1, EXITED, exit_code=-15, stop_requested=True))
    assert get_job(stub, job_id).state == J.JOB_STATE_RUNNING
    agent.report(worker(job_id, 0, 1, EXITED, exit_code=1))
    job = get_job(stub, job_id)
    assert job.state == J.JOB_STATE_FAILED and job.restarts == 0 and "restart policy NEVER" in job.message


def test_progress_and_checkpoints_are_recorded_from_the_current_incarnation_only(cluster) -> None:
    scheduler, stub, agent = cluster
    job_id = submit(stub, job_spec("progress"))
    running(stub, job_id)
    agent.report(worker(job_id, 0, 1, progress=40.0, checkpoint_progress=30.0))
    agent.report(worker(job_id, 0, 7, progress=99.0))  # not this job's incarnation: ignored
    app = _app(scheduler)
    record, _ = app.jobs.get(int(job_id))
    assert record.work_done == 40.0
    assert record.checkpoint_work == 30.0 and record.last_checkpoint_at is not None


def test_reports_with_bad_workers_are_refused_with_the_field(cluster) -> None:
    _, _, agent = cluster
    with pytest.raises(grpc.RpcError) as err:
        agent.report(agent_pb2.WorkerStatus(job_id="x", rank=0, phase=RUNNING))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "workers[0].job_id" in details_of(err.value)
    with pytest.raises(grpc.RpcError) as err:
        agent.report(worker("1", 0, 1, progress=float("nan")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "workers[0].progress" in details_of(err.value)


def test_silent_agents_make_servers_lost_shrinking_elastic_jobs_and_requeueing_others(scheduler_factory) -> None:
    scheduler = scheduler_factory(agents={"lost_after_s": 1.0, "report_interval_s": 0.2},
                                  policy={"min_resize_interval_s": 0})
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "a", gpus=2).scheduler_epoch
    register_fake_server(scheduler.address, "b", gpus=2)
    agents = {sid: Agent(scheduler.address, sid, epoch) for sid in ("a", "b")}
    try:
        elastic = submit(stub, job_spec("elastic", gpus=1, workers=1, max_workers=4))
        job = running(stub, elastic, 4, reporting=tuple(agents.values()))
        # Only "a" keeps reporting; "b" goes silent and is lost after 1 s on the scheduler's clock.

        def servers() -> dict[str, types_pb2.Server]:
            return {s.server_id: s for s in stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers}

        def b_lost() -> bool:
            agents["a"].report()  # a status report keeps "a" alive
            return servers()["b"].state == J.SERVER_STATE_LOST
        wait_for(b_lost, timeout=20, interval=0.2, what="server b lost")
        assert servers()["a"].state == J.SERVER_STATE_TRAINING
        # The cycle after the sweep evicts (core.faults): wait for its plan, not for the sweep.
        def shrunk() -> types_pb2.Job | None:
            agents["a"].report()
            return j if (j := get_job(stub, elastic)).num_workers != 4 else None
        job = wait_for(shrunk, timeout=20, interval=0.2, what="the job shrunk by the next cycle")
        assert job.state == J.JOB_STATE_RUNNING and job.num_workers == 2
        assert {a.server_id for a in job.workers} == {"a"}
        assert sorted({a.rank for a in job.workers}) == [0, 1]  # ranks renumbered densely
        desired = agents["a"].desired()
        assert {w.world_size for w in desired.workers} == {2} and {w.incarnation for w in desired.workers} == {2}

        # b reports again: back in service; the workers it ran before (incarnation 1) are not desired
        # any more (the policy may well grow the job onto b again, as a new incarnation).
        agents["b"].report()
        assert servers()["b"].state == J.SERVER_STATE_TRAINING
        assert all(w.incarnation > 1 for w in agents["b"].desired().workers)
    finally:
        for agent in agents.values():
            agent.close()
        channel.close()


def test_an_inelastic_job_on_a_lost_server_is_requeued(scheduler_factory) -> None:
    scheduler = scheduler_factory(agents={"lost_after_s": 0.5})
    channel, stub = scheduler_stub(scheduler.address)
    agent = Agent(scheduler.address, "only", register_fake_server(scheduler.address, "only", gpus=2).scheduler_epoch)
    job_id = submit(stub, job_spec("gang", gpus=1, workers=2))
    # The agent reports until the job runs (a cycle on a loaded machine may come later than 0.5 s),
    # then falls silent.
    running(stub, job_id, 2, reporting=(agent,))
    agent.close()
    job = wait_for(lambda: (j := get_job(stub, job_id)).state == J.JOB_STATE_PENDING and j, timeout=20,
                   what="the job requeued")
    assert job.preemptions == 1 and job.reason == "SERVER_LOST" and "server only lost" in job.message
    channel.close()


def test_liveness_uses_the_monotonic_clock_not_wall_time(database_url: str) -> None:
    clock = ManualClock()
    engine = create_engine_for(database_url)
    try:
        app = SchedulerApp(session_factory(engine), clock)
        app.term.start("test")
        from scheduler_service.lifecycle import Pool
        from scheduler_service.records import GpuReport, ServerRegistration
        app.agents.register(ServerRegistration("s1", Pool.TRAINING, (GpuReport(0, "u0", "m", 1),), "s1", "t"))
        clock.jump_wall(3600)  # the wall clock jumps an hour (NTP, a VM resumed): not silence
        assert app.liveness.sweep_lost(30.0) == []
        clock.advance(31)
        assert app.liveness.sweep_lost(30.0) == ["s1"]
    finally:
        engine.dispose()


def test_job_logs_are_located_by_rank_with_clear_errors(cluster) -> None:
    _, stub, _ = cluster
    job_id = submit(stub, job_spec("logs"))
    running(stub, job_id)
    with pytest.raises(grpc.RpcError) as err:
        stub.GetJobLogs(scheduler_pb2.GetJobLogsRequest(job_id=job_id, rank=3), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "no rank 3" in details_of(err.value)
    # This server registered without a logs address: the user is told where the logs are instead.
    with pytest.raises(grpc.RpcError) as err:
        stub.GetJobLogs(scheduler_pb2.GetJobLogsRequest(job_id=job_id, rank=0), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "gpu-1" in details_of(err.value)


@pytest.mark.parametrize(
    ("exits", "policy", "restarts", "expected"),
    [
        ({0: 0}, "ON_FAILURE", 0, None),  # rank 1 still runs
        ({0: 0, 1: 0}, "ON_FAILURE", 0, Verdict.COMPLETED),
        ({0: 0, 1: 2}, "ON_FAILURE", 0, Verdict.RESTART),
        ({1: 2}, "ON_FAILURE", 1, Verdict.FAILED),
        ({1: -9}, "NEVER", 0, Verdict.FAILED),
    ],
)
def test_judge_exits(exits, policy, restarts, expected) -> None:
    verdict, why = judge_exits(exits, num_workers=2, restart_policy=policy, restarts=restarts, max_restarts=1)
    assert verdict == expected and (why != "") == (expected is not None)


def test_reports_that_say_nothing_new_skip_the_database_until_the_telemetry_interval(scheduler_factory) -> None:
    scheduler = scheduler_factory(agents={"telemetry_write_s": 3600})
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "gpu-1", gpus=2).scheduler_epoch
    agent = Agent(scheduler.address, "gpu-1", epoch)
    try:
        job_id = submit(stub, job_spec("quiet"))
        running(stub, job_id)
        agent.report(worker(job_id, 0, 1, progress=1.0))  # first report: written
        assert get_job(stub, job_id).progress == 1.0
        # Nothing new: answered from memory. The cycle that started the job forgets gpu-1's digest when it
        # announces its commit, which a loaded machine may delay past the first report: that report's
        # digest is then not kept, the next one is written and keeps one, and the one after is the test.
        recorded = 1.0
        for progress in (2.0, 3.0, 4.0):
            agent.report(worker(job_id, 0, 1, progress=progress))
            if get_job(stub, job_id).progress == recorded:
                break
            recorded = progress
        else:
            pytest.fail(f"every report was written (progress {recorded}): none was answered from memory")
        # An exit is news: written at once (with the progress it carries), and the job completes.
        agent.report(worker(job_id, 0, 1, EXITED, exit_code=0, progress=5.0))
        job = get_job(stub, job_id)
        assert job.state == J.JOB_STATE_COMPLETED and job.progress == 5.0
    finally:
        agent.close()
        channel.close()
