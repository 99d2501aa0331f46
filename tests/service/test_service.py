"""The scheduler service over real gRPC on loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import grpc
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, inference_pb2, inference_pb2_grpc, scheduler_pb2, types_pb2
from tests.harness import (
    details_of,
    health_stub,
    job_spec,
    job_state,
    reflection_stub,
    register_fake_server,
    scheduler_stub,
    secure_channel,
)
from tests.helpers import wait_for

RUNNING = types_pb2.JOB_STATE_RUNNING
PENDING = types_pb2.JOB_STATE_PENDING


@pytest.fixture
def stub(scheduler):
    channel, stub = scheduler_stub(scheduler.address)
    yield stub
    channel.close()


def submit(stub, spec=None, key: str = "") -> types_pb2.Job:
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec or job_spec(), idempotency_key=key), timeout=5).job


def test_job_is_placed_when_a_server_has_free_gpus(scheduler, stub) -> None:
    register_fake_server(scheduler.address, "train-1", gpus=4)
    job = submit(stub, job_spec("resnet", gpus=2, workers=2))
    assert job.state == PENDING
    wait_for(lambda: job_state(stub, job.job_id) == RUNNING, what="job to run")
    got = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id, include_events=True), timeout=5)
    assert got.job.num_workers == 2
    assert sorted((w.rank, tuple(w.gpu_indices)) for w in got.job.workers) == [(0, (0, 1)), (1, (2, 3))]
    assert [(e.from_state, e.to_state, e.reason) for e in got.events] == [
        ("", "PENDING", "SUBMITTED"),
        ("PENDING", "RUNNING", "PLACED"),
    ]
    servers = stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
    assert [(s.server_id, s.gpus_used, s.gpus_total) for s in servers] == [("train-1", 4, 4)]


def test_pending_job_explains_why_and_fifo_blocks_later_jobs(scheduler_factory) -> None:
    scheduler = scheduler_factory(scheduling={"policy": "fifo"})
    channel, stub = scheduler_stub(scheduler.address)
    register_fake_server(scheduler.address, "train-1", gpus=2)
    register_fake_server(scheduler.address, "train-2", gpus=2)
    holder = submit(stub, job_spec("holder", gpus=2))  # one server busy: the gang of two must wait
    wait_for(lambda: job_state(stub, holder.job_id) == types_pb2.JOB_STATE_RUNNING, what="the holder to run")
    big = submit(stub, job_spec("big", gpus=2, workers=2))
    small = submit(stub, job_spec("small", gpus=1))
    explanation = wait_for(
        lambda: (e := stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=big.job_id), timeout=5)).job.pending_reason
        and e,
        what="a pending reason",
    )
    assert "WAITING_FOR_GANG" in explanation.summary
    assert "needs 2 worker(s) x 2 GPU(s)" in explanation.summary
    assert any(d.reason == "WAITING_FOR_GANG" for d in explanation.decisions)
    small_why = wait_for(
        lambda: stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=small.job_id), timeout=5).job.pending_reason,
        what="small job's pending reason",
    )
    assert small_why.startswith("BLOCKED_BY_EARLIER_JOB")
    assert job_state(stub, small.job_id) == PENDING
    channel.close()


def test_cancel_frees_gpus_for_the_next_job_and_cannot_repeat(scheduler, stub) -> None:
    register_fake_server(scheduler.address, "train-1", gpus=2)
    first = submit(stub, job_spec("first", gpus=2))
    second = submit(stub, job_spec("second", gpus=2))
    wait_for(lambda: job_state(stub, first.job_id) == RUNNING, what="first job to run")
    cancelled = stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=first.job_id, reason="done early"), timeout=5).job
    assert cancelled.state == types_pb2.JOB_STATE_CANCELLED
    assert cancelled.finished_at.seconds > 0
    wait_for(lambda: job_state(stub, second.job_id) == RUNNING, what="second job to take the GPUs")
    with pytest.raises(grpc.RpcError) as err:
        stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=first.job_id), timeout=5)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already CANCELLED" in details_of(err.value)


def test_duplicate_idempotency_key_is_refused_without_a_second_job(stub) -> None:
    first = submit(stub, key="batch-7")
    with pytest.raises(grpc.RpcError) as err:
        # Another spec under the same key (the same spec would be a retry: tests/service/test_idempotency.py).
        submit(stub, job_spec("another spec"), key="batch-7")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert f"job {first.job_id}" in details_of(err.value)
    assert len(stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=5).jobs) == 1


def test_list_jobs_filters_and_paginates_newest_first(stub) -> None:
    ids = [submit(stub, job_spec(f"j{i}", user="ann" if i % 2 else "bob")).job_id for i in range(7)]
    seen, token = [], ""
    while True:
        page = stub.ListJobs(scheduler_pb2.ListJobsRequest(user="ann", page_size=2, page_token=token), timeout=5)
        seen += [j.job_id for j in page.jobs]
        assert len(page.jobs) <= 2
        token = page.next_page_token
        if not token:
            break
    assert seen == [ids[i] for i in (5, 3, 1)]
    with pytest.raises(grpc.RpcError) as err:
        stub.ListJobs(scheduler_pb2.ListJobsRequest(user="bob", page_token=token or "djE6NDox"), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    by_state = stub.ListJobs(scheduler_pb2.ListJobsRequest(states=[types_pb2.JOB_STATE_COMPLETED]), timeout=5)
    assert list(by_state.jobs) == []


def test_invalid_requests_name_the_field(stub) -> None:
    cases = [
        (job_spec(workers=0), "spec.min_workers"),
        (job_spec(workers=2, max_workers=1), "spec.max_workers"),
        (types_pb2.JobSpec(name="x", user="u", gpus_per_worker=1, min_workers=1), "spec.command"),
        (job_spec(env={"RANK": "3"}), "spec.env['RANK']"),
        (job_spec(name="bad\x00name"), "spec.name"),
        (job_spec(restart_policy=99), "spec.restart_policy"),
    ]
    for spec, field in cases:
        with pytest.raises(grpc.RpcError) as err:
            submit(stub, spec)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert details_of(err.value).startswith(field), details_of(err.value)
    for bad in ("abc", "-1", "0", "99999999999999999999"):
        with pytest.raises(grpc.RpcError) as err:
            stub.GetJob(scheduler_pb2.GetJobRequest(job_id=bad), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        stub.GetJob(scheduler_pb2.GetJobRequest(job_id="12345"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_watch_events_replays_then_streams_live(scheduler, stub) -> None:
    first = submit(stub)
    stream = stub.WatchEvents(scheduler_pb2.WatchEventsRequest(after_event_id=0))
    received: list[types_pb2.Event] = []
    got_two = threading.Event()

    def consume() -> None:
        for event in stream:
            if event.kind == types_pb2.EVENT_KIND_JOB_SUBMITTED:
                received.append(event)
            if len(received) >= 2:
                got_two.set()
                return

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    second = submit(stub)
    assert got_two.wait(10), "did not receive both job events"
    stream.cancel()
    assert [e.job_id for e in received] == [first.job_id, second.job_id]
    assert received[0].event_id < received[1].event_id


def test_agent_receives_desired_state_pushed_after_placement(scheduler, stub) -> None:
    register_fake_server(scheduler.address, "train-1", gpus=2)
    channel = secure_channel(scheduler.address)
    agent = agent_pb2_grpc.AgentServiceStub(channel)
    stream = agent.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id="train-1"))
    initial = next(stream)
    assert list(initial.workers) == []
    job = submit(stub, job_spec("placed", gpus=2))
    update = next(stream)
    stream.cancel()
    channel.close()
    assert update.generation > initial.generation
    [worker] = update.workers
    assert (worker.job_id, worker.rank, worker.world_size, list(worker.gpu_indices)) == (job.job_id, 0, 1, [0, 1])
    assert list(worker.command) == ["python", "train.py"]
    assert worker.master_addr == "train-1"


def test_status_reports_are_fenced_by_epoch(scheduler) -> None:
    registered = register_fake_server(scheduler.address, "train-1", gpus=1)
    with secure_channel(scheduler.address) as channel:
        agent = agent_pb2_grpc.AgentServiceStub(channel)
        ok = agent.ReportStatus(
            agent_pb2.ReportStatusRequest(server_id="train-1", scheduler_epoch=registered.scheduler_epoch,
                                          gpus=[agent_pb2.GpuStatus(index=0, healthy=True, utilization=0.5)]),
            timeout=5,
        )
        assert ok.desired_generation >= 1
        with pytest.raises(grpc.RpcError) as err:
            agent.ReportStatus(
                agent_pb2.ReportStatusRequest(server_id="train-1", scheduler_epoch=registered.scheduler_epoch - 1),
                timeout=5,
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        with pytest.raises(grpc.RpcError) as err:
            agent.ReportStatus(agent_pb2.ReportStatusRequest(server_id="nope", scheduler_epoch=1), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_unhealthy_gpu_is_not_used(scheduler, stub) -> None:
    registered = register_fake_server(scheduler.address, "train-1", gpus=2)
    with secure_channel(scheduler.address) as channel:
        agent_pb2_grpc.AgentServiceStub(channel).ReportStatus(
            agent_pb2.ReportStatusRequest(
                server_id="train-1", scheduler_epoch=registered.scheduler_epoch,
                gpus=[agent_pb2.GpuStatus(index=0, healthy=False, health_reason="XID 79"),
                      agent_pb2.GpuStatus(index=1, healthy=True)],
            ),
            timeout=5,
        )
    job = submit(stub, job_spec(gpus=2))
    why = wait_for(
        lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id), timeout=5).job.pending_reason,
        what="pending reason",
    )
    assert "WORKER_TOO_LARGE" in why
    [server] = stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
    assert server.gpus_healthy == 1
    assert server.gpus[0].health_reason == "XID 79"


def test_demand_reports_show_in_the_cluster_summary(scheduler, stub) -> None:
    register_fake_server(scheduler.address, "infer-1", pool="inference", gpus=8)
    with secure_channel(scheduler.address) as channel:
        reply = inference_pb2_grpc.InferenceServiceStub(channel).ReportDemand(
            inference_pb2.ReportDemandRequest(servers_needed=1, observed_rps=42.5, source="test"), timeout=5
        )
    assert (reply.servers_serving, reply.servers_loaned) == (1, 0)
    cluster = stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=5)
    assert cluster.demand.servers_needed == 1
    assert cluster.policy == "aryl"
    pools = {p.pool: p for p in cluster.pools}
    assert pools[types_pb2.POOL_INFERENCE].gpus_total == 8


def test_restart_keeps_state_and_starts_a_new_epoch(scheduler_factory) -> None:
    first = scheduler_factory()
    register_fake_server(first.address, "train-1", gpus=1)
    channel, stub = scheduler_stub(first.address)
    job = submit(stub, job_spec(gpus=1))
    wait_for(lambda: job_state(stub, job.job_id) == RUNNING, what="job to run")
    epoch = stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=5).scheduler_epoch
    channel.close()
    first.stop()
    second = scheduler_factory()
    channel, stub = scheduler_stub(second.address)
    assert job_state(stub, job.job_id) == RUNNING
    assert stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=5).scheduler_epoch == epoch + 1
    channel.close()


def test_health_and_reflection_are_served(scheduler) -> None:
    with secure_channel(scheduler.address) as channel:
        health = health_stub(channel).Check(
            health_pb2.HealthCheckRequest(service="aryl.v1.SchedulerService"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        responses = reflection_stub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"aryl.v1.SchedulerService", "aryl.v1.AgentService", "aryl.v1.InferenceService"} <= names


def test_gpus_reported_in_another_order_after_a_reboot_are_accepted(scheduler, stub) -> None:
    register_fake_server(scheduler.address, "train-1", gpus=2)
    with secure_channel(scheduler.address) as channel:
        agent_pb2_grpc.AgentServiceStub(channel).RegisterServer(
            agent_pb2.RegisterServerRequest(
                hostname="train-1", pool=types_pb2.POOL_TRAINING,
                gpus=[agent_pb2.GpuInfo(index=0, uuid="GPU-train-1-1"),
                      agent_pb2.GpuInfo(index=1, uuid="GPU-train-1-0")],
            ),
            timeout=5,
        )
    [server] = stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
    assert [g.uuid for g in server.gpus] == ["GPU-train-1-1", "GPU-train-1-0"]
