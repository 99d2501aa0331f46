"""SubmitJobs (many jobs in one call, all or none) and CancelJobArray, against a real scheduler over
loopback gRPC, on SQLite and PostgreSQL: a bad spec anywhere refuses the whole call, naming its
index and field, and the database holds no job afterwards; idempotency keys work per job; arrays
get one id and their indices, which reach the workers' environment through the desired state."""

from __future__ import annotations

import grpc
import pytest
import sqlalchemy as sa

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, types_pb2
from scheduler_service.api.job_validation import MAX_BATCH_JOBS
from tests.harness import details_of, job_spec, register_fake_server, scheduler_stub
from tests.helpers import wait_for


def _jobs_in_db(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text("SELECT count(*) FROM jobs")).scalar_one()
    finally:
        engine.dispose()


def _batch(*specs: types_pb2.JobSpec, keys: tuple[str, ...] = (), indices: tuple[int, ...] = ()):
    keys = keys or ("",) * len(specs)
    return scheduler_pb2.SubmitJobsRequest(
        jobs=[scheduler_pb2.SubmitJobRequest(spec=s, idempotency_key=k) for s, k in zip(specs, keys, strict=True)],
        array_indices=list(indices),
    )


def _refusal(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    return info.value


def test_a_batch_is_queued_in_order(scheduler, database_url) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        answer = stub.SubmitJobs(_batch(*(job_spec(f"j{i}") for i in range(5))), timeout=10)
        assert [j.spec.name for j in answer.jobs] == [f"j{i}" for i in range(5)]
        ids = [int(j.job_id) for j in answer.jobs]
        assert ids == sorted(ids) and len(set(ids)) == 5
        assert all(j.state == types_pb2.JOB_STATE_PENDING and not j.array_job_id for j in answer.jobs)
        assert stub.GetJob(scheduler_pb2.GetJobRequest(job_id=str(ids[3])), timeout=5).job.spec.name == "j3"
    assert _jobs_in_db(database_url) == 5


def test_the_ids_view_answers_with_ids_and_the_list_view_is_the_default(scheduler, database_url) -> None:
    """SubmitJobsRequest.view: IDS answers each job's id, name, state, submission time, version and array
    place only; the default and LIST answer the list view; an unknown view is refused, nothing stored."""
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        request = _batch(job_spec("a", env={"K": "v"}), job_spec("b"), indices=(3, 4))
        request.view = scheduler_pb2.SUBMITTED_JOBS_VIEW_IDS
        ids = stub.SubmitJobs(request, timeout=10).jobs
        first = ids[0]
        assert [(j.spec.name, j.array_index, j.array_job_id, j.version) for j in ids] == [
            ("a", 3, first.job_id, 1), ("b", 4, first.job_id, 1)]
        assert first.state == types_pb2.JOB_STATE_PENDING and first.submitted_at.seconds > 0
        assert (first.spec.user, list(first.spec.command), first.spec.gpus_per_worker, first.reason) == ("", [], 0, "")
        full = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=first.job_id), timeout=5).job
        assert (full.spec.user, dict(full.spec.env), full.submitted_at) == ("alice", {"K": "v"}, first.submitted_at)

        for view in (scheduler_pb2.SUBMITTED_JOBS_VIEW_UNSPECIFIED, scheduler_pb2.SUBMITTED_JOBS_VIEW_LIST):
            one = [scheduler_pb2.SubmitJobRequest(spec=job_spec("c", env={"K": "v"}))]
            listed = stub.SubmitJobs(scheduler_pb2.SubmitJobsRequest(jobs=one, view=view), timeout=10).jobs[0]
            assert listed.spec.user == "alice" and list(listed.spec.command) and not listed.spec.env

        error = _refusal(stub.SubmitJobs, scheduler_pb2.SubmitJobsRequest(
            jobs=[scheduler_pb2.SubmitJobRequest(spec=job_spec("d"))], view=7))  # type: ignore[arg-type]  # no such view
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert details_of(error).startswith("view: unknown value 7; use one of SUBMITTED_JOBS_VIEW_LIST, ")
    assert _jobs_in_db(database_url) == 4


@pytest.mark.parametrize("bad_index", [0, 3])
def test_one_bad_spec_refuses_the_whole_batch_naming_its_index(scheduler, database_url, bad_index) -> None:
    specs = [job_spec(f"j{i}") for i in range(5)]
    specs[bad_index] = job_spec(f"j{bad_index}", gpus=0)
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        error = _refusal(stub.SubmitJobs, _batch(*specs))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"jobs[{bad_index}].spec.gpus_per_worker" in details_of(error)
    assert _jobs_in_db(database_url) == 0


def test_batch_shape_refusals(scheduler, database_url) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        cases = {
            "jobs: is required": _batch(),
            "jobs[2].idempotency_key": _batch(job_spec("a"), job_spec("b"), job_spec("c"), keys=("k1", "k2", "k1")),
            "array_indices: must hold one index per job": _batch(job_spec("a"), job_spec("b"), indices=(0,)),
            "array_indices[2]: 1 is listed twice": _batch(job_spec("a"), job_spec("b"), job_spec("c"),
                                                          indices=(0, 1, 1)),
            "jobs[1].spec.env['ARYL_ARRAY_INDEX']": _batch(job_spec("a"), job_spec("b", env={"ARYL_ARRAY_INDEX": "3"})),
        }
        for expected, request in cases.items():
            error = _refusal(stub.SubmitJobs, request)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, expected
            assert expected in details_of(error), (expected, details_of(error))
        # Different users may use the same key in one batch: keys are per user.
        stub.SubmitJobs(_batch(job_spec("a", user="u1"), job_spec("b", user="u2"), keys=("k", "k")), timeout=10)
    assert _jobs_in_db(database_url) == 2


def test_the_size_cap_per_call(scheduler, database_url) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    spec = job_spec("tiny")
    with channel:
        error = _refusal(stub.SubmitJobs, _batch(*[spec] * (MAX_BATCH_JOBS + 1)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"at most {MAX_BATCH_JOBS} jobs per call" in details_of(error)
    assert _jobs_in_db(database_url) == 0


def test_idempotency_keys_per_job(scheduler, database_url) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        first = stub.SubmitJobs(_batch(job_spec("a"), job_spec("b"), keys=("ka", "kb")), timeout=10)
        # A retry of the whole call: the same jobs, nothing new.
        again = stub.SubmitJobs(_batch(job_spec("a"), job_spec("b"), keys=("ka", "kb")), timeout=10)
        assert [j.job_id for j in again.jobs] == [j.job_id for j in first.jobs]
        assert _jobs_in_db(database_url) == 2
        # Part retry, part new: the retried job is answered with itself, the new one queued.
        mixed = stub.SubmitJobs(_batch(job_spec("c"), job_spec("b"), keys=("kc", "kb")), timeout=10)
        assert mixed.jobs[1].job_id == first.jobs[1].job_id and mixed.jobs[0].job_id not in {
            j.job_id for j in first.jobs}
        assert _jobs_in_db(database_url) == 3
        # A key reused with another spec refuses everything, naming the index and the job holding it.
        error = _refusal(stub.SubmitJobs, _batch(job_spec("d"), job_spec("other", gpus=2), keys=("kd", "ka")))
        assert error.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "jobs[1]" in details_of(error) and f"job {first.jobs[0].job_id}" in details_of(error)
    assert _jobs_in_db(database_url) == 3


def test_a_gang_that_can_never_fit_refuses_the_batch(scheduler, database_url) -> None:
    register_fake_server(scheduler.address, "train-1", gpus=4)
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        error = _refusal(stub.SubmitJobs, _batch(job_spec("a"), job_spec("huge", gpus=8)))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "jobs[1]" in details_of(error) and "nothing was queued" in details_of(error)
    assert _jobs_in_db(database_url) == 0


def test_an_array_gets_one_id_its_indices_and_the_environment(scheduler, database_url) -> None:
    register_fake_server(scheduler.address, "train-1", gpus=2, converge=True)
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        answer = stub.SubmitJobs(_batch(job_spec("sweep"), job_spec("sweep"), job_spec("sweep"),
                                        indices=(10, 12, 14)), timeout=10)
        array_id = answer.jobs[0].job_id
        assert [(j.array_job_id, j.array_index) for j in answer.jobs] == [(array_id, 10), (array_id, 12),
                                                                           (array_id, 14)]
        assert stub.GetJob(scheduler_pb2.GetJobRequest(job_id=answer.jobs[2].job_id), timeout=5).job.array_index == 14
        # Two of the three fit the server's two GPUs: their workers' desired state carries the index.
        agent = agent_pb2_grpc.AgentServiceStub(channel)
        stream = agent.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id="train-1"), timeout=20)
        for desired in stream:
            if len(desired.workers) == 2:
                break
        stream.cancel()
        envs = {w.job_id: dict(w.env) for w in desired.workers}
        by_id = {j.job_id: j.array_index for j in answer.jobs}
        for job_id, env in envs.items():
            assert env == {"ARYL_ARRAY_JOB_ID": array_id, "ARYL_ARRAY_INDEX": str(by_id[job_id])}

        cancelled = stub.CancelJobArray(scheduler_pb2.CancelJobArrayRequest(array_job_id=array_id), timeout=10)
        assert sorted(cancelled.cancelled_job_ids) == sorted(j.job_id for j in answer.jobs)
        wait_for(lambda: all(
            stub.GetJob(scheduler_pb2.GetJobRequest(job_id=j.job_id), timeout=5).job.state
            == types_pb2.JOB_STATE_CANCELLED for j in answer.jobs))
        # Again: nothing left to cancel, but the array exists.
        again = stub.CancelJobArray(scheduler_pb2.CancelJobArrayRequest(array_job_id=array_id), timeout=10)
        assert list(again.cancelled_job_ids) == []
        single = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("solo")), timeout=10).job
        error = _refusal(stub.CancelJobArray, scheduler_pb2.CancelJobArrayRequest(array_job_id=single.job_id))
        assert error.code() == grpc.StatusCode.NOT_FOUND
        error = _refusal(stub.CancelJobArray, scheduler_pb2.CancelJobArrayRequest(array_job_id="x"))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
