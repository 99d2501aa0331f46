"""Group commit under impatient callers: a caller that gives up never stops the committer, and health
says when a committer has stopped.

The committer (``scheduler_service.group_commit``) is tested with real threads and futures and a commit
function written here; the service over real gRPC on loopback and a real database, as a client with a
3 ms deadline sees it (issue 19: twenty such SubmitJobs used to kill the ``aryl-submit`` thread, and
every later SubmitJob hung to its deadline while health still said SERVING).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import CancelledError

import grpc
import pytest
from grpc_health.v1 import health_pb2

from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.errors import Unavailable
from scheduler_service.group_commit import GroupCommitter
from tests.fixtures.gated_groups import gated_committer
from tests.harness import health_stub, job_spec, scheduler_stub, secure_channel
from tests.helpers import wait_for

SCHEDULER_SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name
IMPATIENT_S = 0.003  # the deadline of issue 19's impatient client
PROMPT_S = 5.0  # an ordinary call's deadline: a wedged committer makes it run out


# --------------------------------------------------------------------------------------------------
# The committer


def test_a_caller_that_gives_up_is_skipped_and_the_others_still_get_their_results() -> None:
    with gated_committer() as (handler, committer):
        first = committer.submit("a")
        assert handler.in_flight.wait(5)
        # Queued behind the group in flight: one of them gives up (as wrap_future does when the
        # RPC is cancelled), the others wait.
        waiting, gone, failing = committer.submit("b"), committer.submit("c"), committer.submit("bad")
        assert gone.cancel()
        handler.gate.set()
        assert first.result(5) == "A"
        assert waiting.result(5) == "B"
        with pytest.raises(ValueError, match="bad"):
            failing.result(5)
        with pytest.raises(CancelledError):
            gone.result(0)
        # ... and later callers are still served.
        assert committer.submit("d").result(5) == "D"
        # The caller that gave up before its group was committed was never applied.
        assert [item for group in handler.groups for item in group] == ["a", "b", "bad", "d"]
        assert committer.alive


def test_a_caller_that_gives_up_once_its_group_commits_gets_nothing_and_the_group_is_applied() -> None:
    with gated_committer() as (handler, committer):
        running = committer.submit("a")
        assert handler.in_flight.wait(5)
        # Too late: the group is being committed; its result is delivered (to no one).
        assert not running.cancel()
        handler.gate.set()
        assert running.result(5) == "A"
        assert committer.submit("b").result(5) == "B"


def test_a_commit_function_that_breaks_its_contract_fails_its_group_only() -> None:
    calls: list[Sequence[int]] = []

    def short_answer(items: Sequence[int]) -> list[int | Exception]:
        calls.append(items)
        return [] if items[0] < 0 else [i * 2 for i in items]  # one result too few for a negative

    committer: GroupCommitter[int, int] = GroupCommitter(short_answer, name="test-commit")
    try:
        with pytest.raises(ValueError):
            committer.submit(-1).result(5)
        assert committer.submit(21).result(5) == 42
        assert committer.alive
    finally:
        committer.close()


class _Fatal(BaseException):
    """Escapes ``except Exception`` (as SystemExit or KeyboardInterrupt would)."""


def test_a_committer_that_stops_says_so_and_fails_its_callers_at_once() -> None:
    entered, proceed = threading.Event(), threading.Event()

    def fatal(items: Sequence[int]) -> list[int | Exception]:
        entered.set()
        assert proceed.wait(10)
        raise _Fatal("the commit function escaped")

    stopped: list[BaseException | None] = []
    committer: GroupCommitter[int, int] = GroupCommitter(fatal, name="test-commit")
    committer.add_stop_callback(stopped.append)
    in_group = committer.submit(1)
    assert entered.wait(5)
    queued = committer.submit(2)  # behind the group that kills the thread
    proceed.set()
    with pytest.raises(Unavailable):
        in_group.result(5)
    with pytest.raises(Unavailable):
        queued.result(5)
    wait_for(lambda: stopped, what="the stop callback")
    assert isinstance(stopped[0], _Fatal)
    assert not committer.alive
    with pytest.raises(Unavailable, match="test-commit"):
        committer.submit(3)
    # A callback added after the stop is told at once.
    late: list[BaseException | None] = []
    committer.add_stop_callback(late.append)
    assert late == stopped
    committer.close()  # closing a stopped committer returns


def test_close_tells_the_stop_callbacks_and_refuses_later_callers() -> None:
    committer: GroupCommitter[int, int] = GroupCommitter(list, name="test-commit")
    stopped: list[BaseException | None] = []
    committer.add_stop_callback(stopped.append)
    assert committer.submit(7).result(5) == 7
    committer.close()
    assert stopped == [None]
    with pytest.raises(Unavailable):
        committer.submit(8)


# --------------------------------------------------------------------------------------------------
# The service over gRPC


@pytest.fixture
def stub(scheduler):
    channel, stub = scheduler_stub(scheduler.address)
    yield stub
    channel.close()


def _impatient_calls(futures: list[grpc.Future]) -> list[grpc.StatusCode]:
    """Wait for every call; the codes of those that failed (all DEADLINE_EXCEEDED, if any)."""
    codes = []
    for call in futures:
        try:
            call.result()
        except grpc.RpcError as err:
            codes.append(err.code())
    return codes


def _health(address: str, service: str = "") -> int:
    with secure_channel(address) as channel:
        return health_stub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_impatient_submitters_do_not_wedge_later_submissions(scheduler, stub) -> None:
    keys = [f"impatient-{i}" for i in range(20)]
    calls = [stub.SubmitJob.future(scheduler_pb2.SubmitJobRequest(spec=job_spec(f"hurry-{i}"), idempotency_key=key),
                                   timeout=IMPATIENT_S) for i, key in enumerate(keys)]
    assert set(_impatient_calls(calls)) <= {grpc.StatusCode.DEADLINE_EXCEEDED}
    # An ordinary SubmitJob is answered promptly.
    started = time.monotonic()
    patient = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("patient")), timeout=PROMPT_S).job
    assert patient.state == types_pb2.JOB_STATE_PENDING
    assert time.monotonic() - started < PROMPT_S / 2
    # Each impatient submission was applied (and its key finds it) or not at all (a retry with its key
    # queues it now): after retrying every one, each is queued exactly once.
    for i, key in enumerate(keys):
        try:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec(f"hurry-{i}"), idempotency_key=key),
                           timeout=PROMPT_S)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.ALREADY_EXISTS, err.details()
    jobs = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=100), timeout=PROMPT_S).jobs
    assert sorted(j.spec.name for j in jobs) == sorted(["patient", *(f"hurry-{i}" for i in range(20))])
    assert _health(scheduler.address) == health_pb2.HealthCheckResponse.SERVING


def test_impatient_cancellers_do_not_wedge_later_cancels(scheduler, stub) -> None:
    job_ids = [stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec(f"j{i}")), timeout=PROMPT_S).job.job_id
               for i in range(21)]
    calls = [stub.CancelJob.future(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="hurry"),
                                   timeout=IMPATIENT_S) for job_id in job_ids[:20]]
    assert set(_impatient_calls(calls)) <= {grpc.StatusCode.DEADLINE_EXCEEDED}
    started = time.monotonic()
    last = stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_ids[20], reason="done"), timeout=PROMPT_S).job
    assert last.state == types_pb2.JOB_STATE_CANCELLED
    assert time.monotonic() - started < PROMPT_S / 2
    # Each impatient cancel was applied or not: cancelling again ends the job or says it has ended.
    for job_id in job_ids[:20]:
        try:
            stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="again"), timeout=PROMPT_S)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    jobs = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=100), timeout=PROMPT_S).jobs
    assert {j.state for j in jobs} == {types_pb2.JOB_STATE_CANCELLED}
    assert _health(scheduler.address) == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("which", [0, 1], ids=["submissions", "cancellations"])
def test_health_says_not_serving_once_a_committer_has_stopped(scheduler, stub, which: int) -> None:
    assert _health(scheduler.address) == health_pb2.HealthCheckResponse.SERVING
    assert _health(scheduler.address, SCHEDULER_SERVICE) == health_pb2.HealthCheckResponse.SERVING
    scheduler.service.group_committers[which].close()
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    wait_for(lambda: _health(scheduler.address) == not_serving, what="health to say NOT_SERVING")
    assert _health(scheduler.address, SCHEDULER_SERVICE) == not_serving
    # Callers are refused at once instead of waiting for a thread that is gone.
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        if which == 0:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec()), timeout=PROMPT_S)
        else:
            stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id="1"), timeout=PROMPT_S)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    assert time.monotonic() - started < PROMPT_S / 2
