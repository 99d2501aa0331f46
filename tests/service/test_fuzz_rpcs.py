"""Fuzzing every user-facing RPC with random and invalid messages, over real gRPC on loopback.

Hypothesis builds request messages field by field from valid values, invalid values (empty, huge,
control-character, NUL and non-ASCII strings; out-of-range numbers; unknown enum numbers; NaN and
infinities; malformed Durations and Timestamps; forged page tokens) and plain garbage, and sends
them to a real scheduler, once on SQLite and once on PostgreSQL. For every request:

- the status is one the RPC's contract allows -- never UNKNOWN, INTERNAL or UNAVAILABLE -- and the
  server still answers GetCluster afterwards;
- INVALID_ARGUMENT carries a google.rpc.BadRequest whose field is a path into the request (list
  indices in range), and the details string starts with that field ("spec.min_workers: ...");
- where the test knows a request is invalid, the refusal names one of its invalid fields; where it
  knows the request is valid, it is accepted;
- a refused request changes nothing: a fingerprint of every table is equal before and after.

The scheduling cycle writes in the background (placements, pending reasons) after every accepted
write, so a fingerprint is taken only once the database has settled (``Database.settle``).
Examples are derandomized: CI sends the same requests on every run.
The requests and what the test knows of each are ``tests/fixtures/rpc_cases.py``'s; sending one and
checking every property, ``tests/fixtures/rpc_harness.py``'s.

Never: patch or reach into the running server; everything goes over the wire or reads the database.
"""

from __future__ import annotations

import base64
import math
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest
from google.protobuf import timestamp_pb2
from google.protobuf.message import Message
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from protos.aryl.v1 import (
    agent_pb2,
    inference_pb2,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
from tests.fixtures.rpc_cases import (
    INFERENCE_SERVERS,
    JOB_STATES,
    LAST_INSTANT,
    OK,
    REGISTERED,
    TIMESTAMP_MAX_S,
    Case,
    Code,
    cancel_job_cases,
    explain_job_cases,
    filter_digest,
    get_cluster_cases,
    get_job_cases,
    invalid,
    list_jobs_cases,
    list_loans_cases,
    list_servers_cases,
    preview_reclaim_cases,
    register_cases,
    report_demand_cases,
    report_status_cases,
    submit_cases,
    valid,
    watch_cases,
)
from tests.fixtures.rpc_harness import RPC_TIMEOUT_S, Database, Harness
from tests.harness import register_fake_server

FUZZ = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,  # CI reproducibility: the same requests on every run
    database=None,
    # Not the explain phase: over a real server it re-runs a failing example hundreds of times.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    # One scheduler serves all examples of a test (that is the point: state accumulates).
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FEW = settings(FUZZ, max_examples=20)


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
def harness(scheduler_factory, database_url: str) -> Iterator[Harness]:
    """One scheduler for all examples of a test: state accumulates from example to example. Its fake servers
    never report, so they are never LOST while a test runs (on a loaded machine a test outlasts the default
    30 s, and a server going LOST during a refused call was blamed on the call)."""
    scheduler = scheduler_factory(agents={"lost_after_s": 86400.0})
    database = Database(database_url)
    h = Harness(scheduler.address, database)
    yield h
    h.close()
    database.close()


@pytest.fixture
def with_jobs(harness: Harness) -> Harness:
    """A cluster with one 4-GPU server and a few jobs: running, pending, cancelled."""
    register_fake_server(harness.address, "fuzz-a", gpus=4)
    spec = types_pb2.JobSpec(name="seed", user="alice", command=["python", "train.py"], min_workers=1)
    for gpus in (2, 2, 4, 1):
        spec.gpus_per_worker = gpus
        harness.scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=RPC_TIMEOUT_S)
    harness.scheduler.CancelJob(scheduler_pb2.CancelJobRequest(job_id="4"), timeout=RPC_TIMEOUT_S)
    return harness


@pytest.fixture
def with_servers(harness: Harness) -> Harness:
    for hostname in REGISTERED:
        register_fake_server(harness.address, hostname, gpus=4)
    return harness


@pytest.fixture
def without_jobs(with_servers: Harness) -> Harness:
    """Servers and no jobs, ever: the tests of agents, inference demand and cluster views."""
    with_servers.background_writes = False
    return with_servers


@pytest.fixture
def with_inference(without_jobs: Harness) -> Harness:
    """``without_jobs`` and an inference pool (demand may be at most its size)."""
    for hostname in INFERENCE_SERVERS:
        register_fake_server(without_jobs.address, hostname, "inference", gpus=1)
    return without_jobs


# ---------------------------------------------------------------------------------------------
# One property test per RPC


@FUZZ
@given(case=submit_cases())
def test_submit_job(harness: Harness, case: Case[scheduler_pb2.SubmitJobRequest]) -> None:
    outcome = harness.send("SubmitJob", case)
    if outcome.code == OK:
        job = outcome.response.job
        assert job.state == types_pb2.JOB_STATE_PENDING and int(job.job_id) > 0
        assert job.spec.name == case.request.spec.name and list(job.spec.command) == list(case.request.spec.command)


@FUZZ
@given(case=get_job_cases())
def test_get_job(with_jobs: Harness, case: Case[scheduler_pb2.GetJobRequest]) -> None:
    outcome = with_jobs.send("GetJob", case)
    if outcome.code == OK:
        assert outcome.response.job.job_id == str(int(case.request.job_id))
        assert all(e.job_id == outcome.response.job.job_id for e in outcome.response.events)


@FUZZ
@given(case=explain_job_cases())
def test_explain_job(with_jobs: Harness, case: Case[scheduler_pb2.ExplainJobRequest]) -> None:
    outcome = with_jobs.send("ExplainJob", case)
    if outcome.code == OK:
        assert outcome.response.job.job_id == str(int(case.request.job_id)) and outcome.response.summary


@FUZZ
@given(case=cancel_job_cases())
def test_cancel_job(with_jobs: Harness, case: Case[scheduler_pb2.CancelJobRequest]) -> None:
    outcome = with_jobs.send("CancelJob", case)
    if outcome.code == OK:
        job = outcome.response.job
        assert job.state == types_pb2.JOB_STATE_CANCELLED and not job.workers and job.finished_at.seconds > 0


@FUZZ
@given(case=list_jobs_cases())
def test_list_jobs(with_jobs: Harness, case: Case[scheduler_pb2.ListJobsRequest]) -> None:
    outcome = with_jobs.send("ListJobs", case)
    if outcome.code == OK:
        request, jobs = case.request, outcome.response.jobs
        ids = [int(j.job_id) for j in jobs]
        assert ids == sorted(ids, reverse=True), "newest first"
        assert len(jobs) <= (request.page_size or 100)
        assert all(j.state in request.states for j in jobs) if request.states else True
        assert all(j.spec.user == request.user for j in jobs) if request.user else True


@FEW
@given(case=watch_cases())
def test_watch_events(with_jobs: Harness, case: Case[scheduler_pb2.WatchEventsRequest]) -> None:
    outcome = with_jobs.send("WatchEvents", case)
    request = case.request
    for item in outcome.response or ():
        assert item.job_id == request.job_id.lstrip("0") if request.job_id else True
        assert item.server_id == request.server_id if request.server_id else True
        assert item.event_id > request.after_event_id if request.HasField("after_event_id") else True


@FEW
@given(case=get_cluster_cases())
def test_get_cluster(without_jobs: Harness, case: Case[bytes]) -> None:
    without_jobs.send("GetCluster", case)


@FEW
@given(case=list_servers_cases())
def test_list_servers(without_jobs: Harness, case: Case[scheduler_pb2.ListServersRequest | bytes]) -> None:
    outcome = without_jobs.send("ListServers", case)
    if outcome.code == OK and isinstance(case.request, Message) and case.request.pool:
        assert all(s.pool == case.request.pool for s in outcome.response.servers)


@FEW
@given(case=list_loans_cases())
def test_list_loans(without_jobs: Harness, case: Case[scheduler_pb2.ListLoansRequest | bytes]) -> None:
    without_jobs.send("ListLoans", case)


@FEW
@given(case=preview_reclaim_cases())
def test_preview_reclaim(without_jobs: Harness, case: Case[scheduler_pb2.PreviewReclaimRequest]) -> None:
    outcome = without_jobs.send("PreviewReclaim", case)
    if outcome.code == OK:
        preview = outcome.response
        assert len(preview.server_ids) <= min(case.request.servers, preview.loaned_servers)
        assert math.isfinite(preview.cost_gpu_seconds) and preview.cost_gpu_seconds >= 0


@FUZZ
@given(case=report_demand_cases())
def test_report_demand(with_inference: Harness, case: Case[inference_pb2.ReportDemandRequest]) -> None:
    outcome = with_inference.send("ReportDemand", case)
    if outcome.code == OK:  # the largest fresh router's report counts (store.inference)
        assert case.request.servers_needed <= outcome.response.demand.servers_needed <= len(INFERENCE_SERVERS)


@FUZZ
@given(case=register_cases())
def test_register_server(without_jobs: Harness, case: Case[agent_pb2.RegisterServerRequest]) -> None:
    outcome = without_jobs.send("RegisterServer", case)
    if outcome.code == OK:
        assert outcome.response.server_id == case.request.hostname
        assert outcome.response.scheduler_epoch == without_jobs.epoch()


@FUZZ
@given(data=st.data())
def test_report_status(without_jobs: Harness, data: st.DataObject) -> None:
    without_jobs.send("ReportStatus", data.draw(report_status_cases(without_jobs.epoch()), label="case"))


# ---------------------------------------------------------------------------------------------
# Random sequences of user calls, then the cluster's invariants through the API


@st.composite
def job_calls(draw: st.DrawFn) -> tuple[str, Case | int]:
    """("SubmitJob", case) or (rpc, n): n picks one of the jobs submitted so far (or a random id)."""
    rpc = draw(st.sampled_from(["SubmitJob", "SubmitJob", "CancelJob", "GetJob", "ExplainJob"]))
    if rpc == "SubmitJob":
        return rpc, draw(submit_cases(small=True))
    return rpc, draw(st.integers(0, 40))


@dataclass
class JobLedger:
    """What the test knows it did, across all examples of one test (the scheduler keeps its state)."""

    submitted: list[str] = field(default_factory=list)
    cancelled: set[str] = field(default_factory=set)


@pytest.fixture
def ledger() -> JobLedger:
    return JobLedger()


BY_JOB_ID = {"CancelJob": scheduler_pb2.CancelJobRequest, "GetJob": scheduler_pb2.GetJobRequest,
             "ExplainJob": scheduler_pb2.ExplainJobRequest}


@settings(FUZZ, max_examples=10)
@given(calls=st.lists(job_calls(), min_size=3, max_size=15))
def test_random_call_sequences_keep_the_cluster_consistent(with_servers: Harness, ledger: JobLedger,
                                                           calls: list[tuple[str, Case | int]]) -> None:
    # Refusals are fingerprinted by the tests above; here the sequence runs without waiting, and the
    # invariants are checked on a consistent view while the scheduler keeps deciding.
    for rpc, arg in calls:
        if isinstance(arg, Case):
            outcome = with_servers.send(rpc, arg, check_state=False)
            if outcome.code == OK:
                ledger.submitted.append(outcome.response.job.job_id)
            continue
        known = ledger.submitted and arg < 30
        job_id = ledger.submitted[arg % len(ledger.submitted)] if known else str(arg * 7919 + 1)
        outcome = with_servers.send(rpc, Case(BY_JOB_ID[rpc](job_id=job_id)), check_state=False)
        if rpc == "CancelJob" and outcome.code == OK:
            ledger.cancelled.add(job_id)
        elif rpc == "CancelJob" and job_id in ledger.cancelled:
            assert outcome.code == Code.FAILED_PRECONDITION, "a cancelled job cannot be cancelled again"
    check_cluster_invariants(with_servers.scheduler, ledger)


class ClusterView(NamedTuple):
    jobs: list[types_pb2.Job]
    servers: list[types_pb2.Server]
    cluster: scheduler_pb2.GetClusterResponse


def consistent_view(stub: scheduler_pb2_grpc.SchedulerServiceStub, *, attempts: int = 50) -> ClusterView:
    """Jobs, servers and the cluster summary as of one moment, though read by several calls while
    cycles run: every GPU assignment changes with its job's version, so when the jobs' (id, state,
    version) are the same before and after the other reads, nothing changed in between."""
    for _ in range(attempts):
        jobs = list_all_jobs(stub)
        servers = list(stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=RPC_TIMEOUT_S).servers)
        cluster = stub.GetCluster(scheduler_pb2.GetClusterRequest(), timeout=RPC_TIMEOUT_S)
        if _versions(list_all_jobs(stub)) == _versions(jobs):
            return ClusterView(jobs, servers, cluster)
        time.sleep(0.1)
    raise AssertionError(f"the jobs kept changing across {attempts} reads")


def _versions(jobs: list[types_pb2.Job]) -> list[tuple[str, int, int]]:
    return [(j.job_id, j.state, j.version) for j in jobs]


def check_cluster_invariants(stub: scheduler_pb2_grpc.SchedulerServiceStub, ledger: JobLedger) -> None:
    jobs, servers, cluster = consistent_view(stub)
    assert sorted(j.job_id for j in jobs) == sorted(ledger.submitted), "every accepted submission, nothing else"
    held: dict[tuple[str, int], str] = {}
    for job in jobs:
        assert job.state in JOB_STATES, job
        gpus = [(w.server_id, g) for w in job.workers for g in w.gpu_indices]
        for gpu in gpus:
            assert gpu not in held, f"GPU {gpu} held by jobs {held[gpu]} and {job.job_id}"
            held[gpu] = job.job_id
        if job.state == types_pb2.JOB_STATE_RUNNING:
            assert job.num_workers == len(job.workers), job
            assert job.spec.min_workers <= job.num_workers <= (job.spec.max_workers or job.spec.min_workers)
            assert sorted(w.rank for w in job.workers) == list(range(job.num_workers))
            assert all(len(w.gpu_indices) == job.spec.gpus_per_worker for w in job.workers), job
        elif job.state != types_pb2.JOB_STATE_SCALING:
            assert not job.workers and job.num_workers == 0, f"a {types_pb2.JobState.Name(job.state)} job holds GPUs"
        if job.job_id in ledger.cancelled:
            assert job.state == types_pb2.JOB_STATE_CANCELLED
    by_servers = {(s.server_id, g.index): g.job_id for s in servers for g in s.gpus if g.job_id}
    assert by_servers == held, "ListServers and ListJobs disagree on who holds which GPU"
    for server in servers:
        assert server.gpus_used == sum(1 for g in server.gpus if g.job_id)
    assert {c.state: c.count for c in cluster.jobs} == dict(Counter(j.state for j in jobs))


def list_all_jobs(stub: scheduler_pb2_grpc.SchedulerServiceStub) -> list[types_pb2.Job]:
    jobs: list[types_pb2.Job] = []
    token = ""
    while True:
        page = stub.ListJobs(scheduler_pb2.ListJobsRequest(page_size=7, page_token=token), timeout=RPC_TIMEOUT_S)
        jobs += page.jobs
        token = page.next_page_token
        if not token:
            return jobs


# ---------------------------------------------------------------------------------------------
# The smallest inputs that broke the server, one test each (the properties above find them too).
# Each passes whether the server accepts the input or refuses it naming the field: the fix decides.


def test_submit_job_with_the_last_representable_deadline(harness: Harness) -> None:
    # Times are stored as float seconds: 9999-12-31T23:59:59.999999999 once rounded up to 253402300800,
    # which no Timestamp can hold (INTERNAL with the job committed). The last second is now refused,
    # and the last accepted instant reads back fine.
    spec = types_pb2.JobSpec(name="j", user="u", command=["x"], gpus_per_worker=1, min_workers=1,
                             deadline=timestamp_pb2.Timestamp(seconds=TIMESTAMP_MAX_S + 1, nanos=10**9 - 1))
    harness.send("SubmitJob", invalid(scheduler_pb2.SubmitJobRequest(spec=spec), "spec.deadline"))
    spec.deadline.CopyFrom(LAST_INSTANT)
    harness.send("SubmitJob", Case(scheduler_pb2.SubmitJobRequest(spec=spec)))
    harness.send("ListJobs", valid(scheduler_pb2.ListJobsRequest()))


def test_env_variable_name_with_a_trailing_newline_is_refused(harness: Harness) -> None:
    # The name rule [A-Za-z_][A-Za-z0-9_]* is checked with re.match and "$", which also matches
    # before a trailing newline.
    spec = types_pb2.JobSpec(name="j", user="u", command=["x"], gpus_per_worker=1, min_workers=1, env={"A\n": "1"})
    harness.send("SubmitJob", invalid(scheduler_pb2.SubmitJobRequest(spec=spec), "spec.env"))


def test_list_jobs_with_a_forged_page_token_beyond_int64(harness: Harness) -> None:
    # Well-formed token, id past int64: SQLite cannot bind it (PostgreSQL compares it fine).
    token = base64.urlsafe_b64encode(f"v1:{2**63}:{filter_digest([], '', '')}".encode()).decode()
    harness.send("ListJobs", Case(scheduler_pb2.ListJobsRequest(page_token=token)))


def test_register_server_with_memory_beyond_int64(harness: Harness) -> None:
    # uint64 on the wire, a signed 64-bit column in the database.
    gpu = agent_pb2.GpuInfo(index=0, uuid="GPU-0", memory_total_bytes=2**63)
    request = agent_pb2.RegisterServerRequest(hostname="h", pool=types_pb2.POOL_TRAINING, gpus=[gpu])
    harness.send("RegisterServer", Case(request))


def test_report_status_with_memory_beyond_int64(with_servers: Harness) -> None:
    request = agent_pb2.ReportStatusRequest(server_id="fuzz-a", scheduler_epoch=with_servers.epoch(),
                                            gpus=[agent_pb2.GpuStatus(index=0, memory_used_bytes=2**63)])
    with_servers.send("ReportStatus", Case(request))


def test_report_status_for_an_unregistered_gpu_names_its_list_entry(with_servers: Harness) -> None:
    # The refusal once said "gpus[7]" (the GPU's index) for the request's gpus[0].
    request = agent_pb2.ReportStatusRequest(server_id="fuzz-a", scheduler_epoch=with_servers.epoch(),
                                            gpus=[agent_pb2.GpuStatus(index=7)])
    with_servers.send("ReportStatus", invalid(request, "gpus[0]"))
