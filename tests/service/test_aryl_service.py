"""The Aryl policy running in the service: loan, scale out, reclaim with scale-in, return -- over real
gRPC, on SQLite and PostgreSQL, with every step recorded in the event log."""

from __future__ import annotations

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, inference_pb2, inference_pb2_grpc, scheduler_pb2, types_pb2
from tests.harness import job_spec, register_fake_server, scheduler_stub, secure_channel
from tests.helpers import wait_for

FAST_LOANS = {"loan_idle_s": 0, "drain_timeout_s": 0, "min_resize_interval_s": 0, "min_loan_s": 0,
              "loan_buffer_servers": 0, "restart_cost_s": 1}
LOANED = types_pb2.SERVER_STATE_LOANED
SERVING = types_pb2.SERVER_STATE_SERVING


def servers_by_id(stub) -> dict[str, types_pb2.Server]:
    return {s.server_id: s for s in stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers}


def get_job(stub, job_id: str) -> types_pb2.Job:
    return stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5).job


def report_demand(address: str, servers: int) -> None:
    with secure_channel(address) as channel:
        inference_pb2_grpc.InferenceServiceStub(channel).ReportDemand(
            inference_pb2.ReportDemandRequest(servers_needed=servers, observed_rps=10.0 * servers, source="test"),
            timeout=5,
        )


def acknowledge_desired_state(address: str, epoch: int, server_ids: list[str], stub) -> None:
    """What an agent does after converging: report the generation it applied."""
    current = servers_by_id(stub)
    with secure_channel(address) as channel:
        agent = agent_pb2_grpc.AgentServiceStub(channel)
        for sid in server_ids:
            agent.ReportStatus(
                agent_pb2.ReportStatusRequest(
                    server_id=sid, scheduler_epoch=epoch, observed_generation=current[sid].desired_generation,
                    gpus=[agent_pb2.GpuStatus(index=g.index, healthy=True) for g in current[sid].gpus],
                ),
                timeout=5,
            )


def test_loan_scale_out_reclaim_and_return(scheduler_factory) -> None:
    scheduler = scheduler_factory(policy=FAST_LOANS)
    channel, stub = scheduler_stub(scheduler.address)
    epoch = register_fake_server(scheduler.address, "train-1", gpus=4).scheduler_epoch
    for sid in ("infer-1", "infer-2"):
        register_fake_server(scheduler.address, sid, pool="inference", gpus=4)
    report_demand(scheduler.address, 0)
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(
        spec=job_spec("elastic", gpus=2, workers=1, max_workers=6)), timeout=5).job

    # Load is low: both inference servers are loaned and the elastic job grows onto them.
    wait_for(lambda: all(servers_by_id(stub)[s].state == LOANED for s in ("infer-1", "infer-2")),
             timeout=20, what="both inference servers to be loaned")
    grown = wait_for(
        lambda: (j := get_job(stub, job.job_id)).num_workers == 6 and j,
        timeout=20, what="the job to scale out to 6 workers",
    )
    assert {w.server_id for w in grown.workers} == {"train-1", "infer-1", "infer-2"}

    # The dry run says what a reclaim would do, and changes nothing.
    preview = stub.PreviewReclaim(scheduler_pb2.PreviewReclaimRequest(servers=1), timeout=5)
    assert preview.loaned_servers == 2 and len(preview.server_ids) == 1
    assert list(preview.preempted_job_ids) == []
    assert [(s.job_id, s.workers_before, s.workers_after) for s in preview.scaled_in] == [(job.job_id, 6, 4)]
    assert stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id), timeout=5).job.num_workers == 6

    # Load rises: inference needs both servers back; the job shrinks instead of dying.
    report_demand(scheduler.address, 2)
    shrunk = wait_for(
        lambda: (j := get_job(stub, job.job_id)).num_workers == 2 and j,
        timeout=20, what="the job to scale in to its training server",
    )
    assert {w.server_id for w in shrunk.workers} == {"train-1"}
    assert shrunk.state == types_pb2.JOB_STATE_RUNNING and shrunk.preemptions == 0
    assert {servers_by_id(stub)[s].state for s in ("infer-1", "infer-2")} == {types_pb2.SERVER_STATE_RECLAIMING}
    reclaiming = stub.ListLoans(scheduler_pb2.ListLoansRequest(), timeout=5).loans
    assert all(loan.HasField("hard_deadline") for loan in reclaiming)  # when inference may force it back

    # The agents confirm they stopped the workers; the servers serve inference again.
    acknowledge_desired_state(scheduler.address, epoch, ["infer-1", "infer-2"], stub)
    wait_for(lambda: all(servers_by_id(stub)[s].state == SERVING for s in ("infer-1", "infer-2")),
             timeout=20, what="the reclaimed servers to serve again")

    loans = stub.ListLoans(scheduler_pb2.ListLoansRequest(include_returned=True), timeout=5).loans
    assert sorted((loan.server_id, loan.state) for loan in loans) == [
        ("infer-1", types_pb2.LOAN_STATE_RETURNED), ("infer-2", types_pb2.LOAN_STATE_RETURNED)]
    explained = stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=job.job_id), timeout=5)
    reasons = [d.reason for d in explained.decisions]
    assert "SCALED_OUT" in reasons and "SCALED_IN_FOR_RECLAIM" in reasons
    events = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id, include_events=True), timeout=5).events
    assert ("RUNNING", "SCALING") in [(e.from_state, e.to_state) for e in events]
    channel.close()


def test_reclaim_preempts_an_inelastic_job_and_requeues_it(scheduler_factory) -> None:
    scheduler = scheduler_factory(policy=FAST_LOANS)
    channel, stub = scheduler_stub(scheduler.address)
    register_fake_server(scheduler.address, "infer-1", pool="inference", gpus=4)
    report_demand(scheduler.address, 0)
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("inelastic", gpus=4)), timeout=5).job
    wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id), timeout=5).job.state
             == types_pb2.JOB_STATE_RUNNING, timeout=20, what="the job to run on the loaned server")
    report_demand(scheduler.address, 1)
    requeued = wait_for(
        lambda: (j := get_job(stub, job.job_id)).preemptions == 1 and j,
        timeout=20, what="the job to be preempted",
    )
    assert requeued.state == types_pb2.JOB_STATE_PENDING
    summary = stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=job.job_id), timeout=5).summary
    assert "PREEMPTED_FOR_RECLAIM" in summary or "preemption" in summary
    channel.close()


def test_reclaim_preview_from_the_cli(scheduler_factory) -> None:
    import io

    from arylctl import cli

    scheduler = scheduler_factory(policy=FAST_LOANS)
    register_fake_server(scheduler.address, "infer-1", pool="inference", gpus=4)
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["--server", scheduler.address, "reclaim-preview", "1"], stdout=out, stderr=err) == 0
    assert "Loaned servers" in out.getvalue() and "Would preempt" in out.getvalue()
    err = io.StringIO()
    assert cli.main(["--server", scheduler.address, "reclaim-preview", "0"], stdout=io.StringIO(), stderr=err) == 2
    assert "servers: must be between 1 and 100000" in err.getvalue()
