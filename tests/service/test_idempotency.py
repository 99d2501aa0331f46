"""Retries never duplicate jobs: idempotency keys are per user, a resubmission with the same key and
spec is answered with the job the first try queued, and the Python client and arylctl send a key by
default and retry an unanswered submission with it.

Every test runs over real gRPC against a real scheduler on SQLite and on PostgreSQL; the migration
test on both databases. A lost answer is simulated on the client's side of a real call (the call
reaches the scheduler and commits; the client is told DEADLINE_EXCEEDED or UNAVAILABLE instead of
its answer), the one outcome a short deadline cannot produce on demand.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from arylctl.client import SUBMIT_ATTEMPTS, AlreadyExists, ArylClient, DeadlineExceeded, SubmitRetry, Unavailable
from migrations import downgrade, upgrade
from protos.aryl.v1 import scheduler_pb2
from tests.fixtures.cli import run
from tests.harness import as_call, details_of, job_spec, scheduler_stub, scratch_postgres
from tests.helpers import free_port


@pytest.fixture
def stub(scheduler):
    channel, stub = scheduler_stub(scheduler.address)
    yield stub
    channel.close()


def submit(stub, spec, key: str):
    return stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec, idempotency_key=key), timeout=10).job


def all_jobs(stub) -> list:
    return list(stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=1000), timeout=10).jobs)


# --------------------------------------------------------------------------------------------------
# The scheduler


def test_a_resubmission_with_the_same_key_and_spec_returns_the_first_job(stub) -> None:
    first = submit(stub, job_spec("train", user="ann"), "run-1")
    again = submit(stub, job_spec("train", user="ann"), "run-1")

    assert again.job_id == first.job_id
    assert again.idempotency_key == "run-1"
    assert [j.job_id for j in all_jobs(stub)] == [first.job_id]


def test_keys_are_per_user(stub) -> None:
    ann = submit(stub, job_spec("train", user="ann"), "run-1")
    bob = submit(stub, job_spec("train", user="bob"), "run-1")

    assert ann.job_id != bob.job_id
    assert sorted((j.spec.user, j.idempotency_key) for j in all_jobs(stub)) == [("ann", "run-1"), ("bob", "run-1")]


def test_the_same_key_with_another_spec_is_already_exists_naming_the_job(stub) -> None:
    first = submit(stub, job_spec("train", user="ann", workers=1), "run-1")

    with pytest.raises(grpc.RpcError) as refused:
        submit(stub, job_spec("train", user="ann", workers=2), "run-1")

    assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert f"job {first.job_id}" in details_of(refused.value)
    status = rpc_status.from_call(as_call(refused.value))
    assert status is not None
    infos = []
    for detail in status.details:
        info = error_details_pb2.ResourceInfo()
        if detail.Unpack(info):
            infos.append(info)
    assert [(i.resource_type, i.resource_name, i.owner) for i in infos] == [("aryl.v1.Job", first.job_id, "ann")]
    assert len(all_jobs(stub)) == 1


def test_a_group_commit_with_resubmissions_answers_each_on_its_own(stub) -> None:
    # Sent together, so the group commit takes several in one group: a group whose insert hits a key
    # falls back to one submission at a time, each answered for itself.
    kept = submit(stub, job_spec("kept", user="ann"), "k-kept")
    specs = [(job_spec(f"new-{i}", user="ann"), f"k-new-{i}") for i in range(8)]
    specs += [(job_spec("kept", user="ann"), "k-kept"), (job_spec("other", user="ann"), "k-kept"),
              (job_spec("kept", user="bob"), "k-kept")]
    calls = [stub.SubmitJob.future(scheduler_pb2.SubmitJobRequest(spec=s, idempotency_key=k), timeout=10)
             for s, k in specs]

    answers = []
    for call in calls:
        try:
            answers.append(call.result().job.job_id)
        except grpc.RpcError as err:
            answers.append(err.code())

    assert answers[8] == kept.job_id
    assert answers[9] == grpc.StatusCode.ALREADY_EXISTS
    new_ids = [a for i, a in enumerate(answers) if i != 8 and i != 9]
    assert all(isinstance(a, str) for a in new_ids)
    assert len({*new_ids, kept.job_id}) == 10
    assert len(all_jobs(stub)) == 10


# --------------------------------------------------------------------------------------------------
# The Python client


class _LostAnswer(grpc.RpcError, grpc.Call):
    """What a client sees when a call's answer never arrives: its deadline passes, or the connection
    drops after the request was sent."""

    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code.name)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "answer lost (injected by the test)"

    def trailing_metadata(self) -> tuple:
        return ()

    def initial_metadata(self) -> tuple:
        return ()

    def is_active(self) -> bool:
        return False

    # grpc documents None for a call without a deadline; its stubs (types-grpcio) say float.
    def time_remaining(self) -> float | None:  # type: ignore[override]
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class LoseAnswers(grpc.UnaryUnaryClientInterceptor):
    """Sends every call to the scheduler for real; drops the answers of the first ``lost`` ones
    (after the scheduler gave them: the job is queued) and reports ``code`` instead."""

    def __init__(self, lost: int, code: grpc.StatusCode = grpc.StatusCode.DEADLINE_EXCEEDED) -> None:
        self.lost = lost
        self.code = code
        self.requests: list[Any] = []

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        outcome = continuation(client_call_details, request)
        self.requests.append(request)
        if len(self.requests) <= self.lost:
            outcome.result()  # the scheduler did answer (raises if it refused)
            raise _LostAnswer(self.code)
        return outcome


@pytest.fixture
def lossy(scheduler) -> Iterator[tuple[ArylClient, LoseAnswers]]:
    losing = LoseAnswers(lost=2)
    with ArylClient(scheduler.address, timeout=10, interceptors=[losing]) as client:
        yield client, losing


def test_the_client_sends_a_fresh_key_when_given_none(scheduler) -> None:
    with ArylClient(scheduler.address, timeout=10) as client:
        first = client.submit_job(job_spec("same", user="ann"))
        second = client.submit_job(job_spec("same", user="ann"))

    assert first.idempotency_key and second.idempotency_key
    assert first.idempotency_key != second.idempotency_key
    assert first.job_id != second.job_id  # two calls are two jobs, as before


def test_a_client_retry_after_lost_answers_queues_the_job_once(lossy, stub) -> None:
    client, losing = lossy

    job = client.submit_job(job_spec("lost-answer", user="ann"))

    # Three tries, the same key each time; the first queued the job, the retries were answered with it.
    assert len(losing.requests) == 3
    assert {r.idempotency_key for r in losing.requests} == {job.idempotency_key}
    assert job.idempotency_key
    assert [j.job_id for j in all_jobs(stub)] == [job.job_id]


def test_a_client_retry_keeps_the_callers_key_and_unavailable_is_retried_too(scheduler, stub) -> None:
    losing = LoseAnswers(lost=1, code=grpc.StatusCode.UNAVAILABLE)
    with ArylClient(scheduler.address, timeout=10, interceptors=[losing]) as client:
        job = client.submit_job(job_spec("mine", user="ann"), idempotency_key="my-key")

    assert [r.idempotency_key for r in losing.requests] == ["my-key", "my-key"]
    assert job.idempotency_key == "my-key"
    assert [j.job_id for j in all_jobs(stub)] == [job.job_id]


def test_client_retries_are_bounded(scheduler, stub) -> None:
    losing = LoseAnswers(lost=10)
    with ArylClient(scheduler.address, timeout=10, interceptors=[losing]) as client, \
            pytest.raises(DeadlineExceeded):
        client.submit_job(job_spec("given up", user="ann"), attempts=2)

    assert len(losing.requests) == 2
    assert len(all_jobs(stub)) == 1  # queued once, by the first try


def test_an_unreachable_scheduler_is_tried_three_times() -> None:
    counting = LoseAnswers(lost=0)
    with ArylClient(f"127.0.0.1:{free_port()}", timeout=2, interceptors=[counting]) as client, \
            pytest.raises(Unavailable):
        client.submit_job(job_spec("nowhere", user="ann"))

    assert len(counting.requests) == 3


def test_a_reached_scheduler_is_retried_for_the_budget_with_progress_and_the_key_comes_back(scheduler, stub) -> None:
    # Every answer lost (UNAVAILABLE after the scheduler queued the job): retried past SUBMIT_ATTEMPTS, for
    # retry_s, always with one key; the error then carries it, and submitting again with it queues nothing.
    losing = LoseAnswers(lost=1000, code=grpc.StatusCode.UNAVAILABLE)
    retries: list[SubmitRetry] = []
    with ArylClient(scheduler.address, timeout=10, interceptors=[losing]) as client, \
            pytest.raises(Unavailable) as failed:
        client.submit_job(job_spec("budget", user="ann"), retry_s=10, on_retry=retries.append)

    assert len(losing.requests) > SUBMIT_ATTEMPTS
    key = failed.value.idempotency_key
    assert key and {r.idempotency_key for r in losing.requests} == {key}
    assert [r.tries for r in retries] == list(range(1, len(losing.requests)))
    assert all(r.waited_s <= 10 and r.idempotency_key == key for r in retries)
    assert any(key in note for note in getattr(failed.value, "__notes__", []))
    with ArylClient(scheduler.address, timeout=10) as client:
        again = client.submit_job(job_spec("budget", user="ann"), idempotency_key=key)
    assert [j.job_id for j in all_jobs(stub)] == [again.job_id]


def test_the_client_reads_the_job_holding_a_key(scheduler) -> None:
    with ArylClient(scheduler.address, timeout=10) as client:
        first = client.submit_job(job_spec("a", user="ann"), idempotency_key="k")
        with pytest.raises(AlreadyExists) as refused:
            client.submit_job(job_spec("b", user="ann"), idempotency_key="k")

    assert refused.value.job_id == first.job_id


# --------------------------------------------------------------------------------------------------
# arylctl


def test_arylctl_submit_sends_a_key_and_a_resubmission_with_it_returns_the_job(
    scheduler, stub, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    def ctl(*argv: str) -> dict:
        code, out, err = run(capsys, "--server", scheduler.address, "-o", "json", "submit", "--user", "ann", *argv)
        assert code == 0, err
        return json.loads(out)

    first = ctl("--name", "a", "--", "true")
    key = first["idempotency_key"]
    assert key
    assert ctl("--name", "a", "--", "true")["job_id"] != first["job_id"]  # a fresh key each time
    assert ctl("--name", "a", "--idempotency-key", key, "--", "true")["job_id"] == first["job_id"]
    assert len(all_jobs(stub)) == 2


def test_arylctl_submit_that_fails_prints_the_key_to_retry_with(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "--server", f"127.0.0.1:{free_port()}", "submit", "--name", "a", "--", "true")

    assert code == 3
    assert "--idempotency-key " in err
    key = err.split("--idempotency-key ")[1].split()[0]
    assert len(key) == 32, err  # the key it made up and sent

    code, _, err = run(capsys, "--server", f"127.0.0.1:{free_port()}", "submit", "--idempotency-key", "mine",
                       "--name", "a", "--", "true")
    assert "--idempotency-key mine" in err


# --------------------------------------------------------------------------------------------------
# The migration


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'aryl.db'}"
        return
    with scratch_postgres("aryl_idem") as url:
        yield url


_JOBS = sa.table(
    "jobs", *(sa.column(c) for c in (
        "name", "user", "queue", "gpus_per_worker", "min_workers", "max_workers", "priority", "restart_policy",
        "max_restarts", "idempotency_key", "state", "state_reason", "state_message", "pending_reason",
        "num_workers", "restarts", "preemptions", "submitted_at", "version")),
    sa.column("command", sa.JSON), sa.column("env", sa.JSON), sa.column("throughput", sa.JSON),
)


def _insert_job(url: str, user: str, key: str | None) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(_JOBS).values(
                name="j", user=user, queue="default", command=["true"], env={}, gpus_per_worker=1, min_workers=1,
                max_workers=1, priority=0, throughput={}, restart_policy="NEVER", max_restarts=0,
                idempotency_key=key, state="PENDING", state_reason="", state_message="", pending_reason="",
                num_workers=0, restarts=0, preemptions=0, submitted_at=1.0, version=1,
            ))
    finally:
        engine.dispose()


def _delete_jobs_of(url: str, user: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.delete(_JOBS).where(_JOBS.c.user == user))
    finally:
        engine.dispose()


def test_migration_0004_makes_keys_unique_per_user_and_back(empty_database_url: str) -> None:
    url = empty_database_url
    upgrade(url, "0003")
    _insert_job(url, "ann", "k")
    with pytest.raises(sa.exc.IntegrityError):
        _insert_job(url, "bob", "k")  # before: one key for everyone

    upgrade(url, "0004")  # keeps the jobs there are
    _insert_job(url, "bob", "k")
    with pytest.raises(sa.exc.IntegrityError):
        _insert_job(url, "ann", "k")
    _insert_job(url, "ann", None)  # jobs without a key never collide
    _insert_job(url, "ann", None)

    with pytest.raises(RuntimeError, match="'k' is used by more than one user"):
        downgrade(url, "0003")  # which user keeps a shared key is not the migration's to decide
    _delete_jobs_of(url, "bob")
    downgrade(url, "0003")
    with pytest.raises(sa.exc.IntegrityError):
        _insert_job(url, "bob", "k")
    _insert_job(url, "bob", "k2")
