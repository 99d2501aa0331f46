"""Jobs that can never fit are refused at SubmitJob (FAILED_PRECONDITION: the request is well formed, but
this cluster cannot run it; registering larger servers would change the answer) with the largest
possible shape in the message. With no server registered yet nothing is refused (a cluster still
starting is not known: the demo submits while its agents register); a queued job the cluster no longer
fits says so in its pending reason (CANNOT_FIT), from the policy's own decision.

Over real gRPC on SQLite and PostgreSQL; the policy's part on snapshots (``core.fit`` is the one rule)."""

from __future__ import annotations

import grpc
import pytest

from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.core import Reason
from scheduler_service.core.fit import never_fits
from scheduler_service.core.params import PolicyParams
from scheduler_service.policies import create_policy
from tests.harness import (
    details_of,
    inference_server,
    job_spec,
    pending_job,
    register_fake_server,
    scheduler_stub,
    snapshot_of,
    training_server,
)
from tests.helpers import wait_for


def submit(stub, spec: types_pb2.JobSpec) -> types_pb2.Job:
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job


def refusal(stub, spec: types_pb2.JobSpec) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        submit(stub, spec)
    return caught.value


def test_submit_refuses_shapes_no_registered_server_can_hold_but_not_before_any_server_registers(scheduler) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    try:
        # No server yet: the cluster is not known; the job is queued and waits.
        early = submit(stub, job_spec("early", gpus=64, workers=2))
        assert early.state == types_pb2.JOB_STATE_PENDING

        register_fake_server(scheduler.address, "train-1", gpus=4)
        register_fake_server(scheduler.address, "infer-1", pool="inference", gpus=8)

        too_wide = refusal(stub, job_spec("wide", gpus=64))
        assert too_wide.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "needs 64 GPUs per worker; the largest server has 8" in details_of(too_wide)
        too_many = refusal(stub, job_spec("many", gpus=4, workers=4096))
        assert too_many.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ("needs at least 4096 x 4 GPUs; the cluster holds at most 3 worker(s) of 4 GPUs "
                "(12 GPUs on 2 training + inference servers)") in details_of(too_many)
        assert "'many'" in details_of(too_many)
        jobs = stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=5).jobs
        assert [j.spec.name for j in jobs] == ["early"]  # nothing queued for the refused ones

        # The largest shape that fits is accepted (8 GPUs: the inference server, once loaned).
        assert submit(stub, job_spec("fits", gpus=8)).state == types_pb2.JOB_STATE_PENDING
        # The job queued before the servers came says why it waits: it cannot fit them.
        def pending_reason() -> str:
            return stub.GetJob(scheduler_pb2.GetJobRequest(job_id=early.job_id), timeout=5).job.pending_reason

        wait_for(lambda: pending_reason() == "CANNOT_FIT: can never fit the servers registered now: needs 64 GPUs per "
                                             "worker; the largest server has 8 (training + inference servers)",
                 what="the early job's pending reason")
    finally:
        channel.close()


def test_a_queued_job_the_shrunk_cluster_cannot_fit_is_told_so_and_reserves_nothing() -> None:
    policy = create_policy("aryl", PolicyParams(starvation_s=0))
    snapshot = snapshot_of([training_server("t1", 4), training_server("t2", 4)],
                           [pending_job(1, gpus=4, workers=3), pending_job(2, gpus=2, workers=1)])
    plan = policy.schedule(snapshot)
    [waits] = plan.pending
    assert waits.job_id == 1 and waits.reason == Reason.CANNOT_FIT
    assert waits.message == ("can never fit the servers registered now: needs at least 3 x 4 GPUs; the cluster "
                             "holds at most 2 worker(s) of 4 GPUs (8 GPUs on 2 training + inference servers)")
    assert [s.job_id for s in plan.starts] == [2]  # a starving job that can never fit holds no servers back


def test_inference_servers_count_only_for_a_policy_that_loans() -> None:
    snapshot = snapshot_of([training_server("t1", 4), inference_server("i1", gpus=8)], [pending_job(1, gpus=8)])
    [waits] = create_policy("sjf", PolicyParams()).schedule(snapshot).pending
    assert waits.reason == Reason.CANNOT_FIT and "the largest server has 4 (training servers)" in waits.message
    [waits] = create_policy("aryl", PolicyParams()).schedule(snapshot).pending
    assert waits.reason != Reason.CANNOT_FIT


@pytest.mark.parametrize(("gpus", "workers", "servers", "expected"), [
    (8, 1, [8, 4], None),
    (4, 3, [8, 4], None),
    (4, 4, [8, 4], "needs at least 4 x 4 GPUs; the cluster holds at most 3 worker(s) of 4 GPUs (12 GPUs on 2 s)"),
    (3, 3, [8, 4], None),
    (5, 1, [4, 4], "needs 5 GPUs per worker; the largest server has 4 (s)"),
    (64, 4096, [], None),
])
def test_never_fits(gpus: int, workers: int, servers: list[int], expected: str | None) -> None:
    assert never_fits(gpus, workers, servers, servers="s") == expected
