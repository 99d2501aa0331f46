"""The Python client: spec helpers as pure unit tests, then every call against a real scheduler."""

from __future__ import annotations

import datetime as dt
import getpass
import json
import re
from collections.abc import Iterator

import grpc
import pytest
import yaml

from arylctl.client import (
    AlreadyExists,
    ArylClient,
    ArylError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    Unavailable,
    job_spec,
    job_spec_from_mapping,
)
from protos.aryl.v1 import types_pb2
from tests.harness import register_fake_server
from tests.helpers import free_port

# ---------------------------------------------------------------------------------------------
# Spec helpers (no server)


def test_job_spec_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARYL_INSECURE", raising=False)
    spec = job_spec(name="mnist", command=["python", "train.py"])
    assert spec.user == ""  # with identities (the default) the scheduler makes the caller the owner
    monkeypatch.setenv("ARYL_INSECURE", "1")
    assert job_spec(name="mnist", command=["python", "train.py"]).user == getpass.getuser()  # no identities
    assert spec.name == "mnist"
    assert list(spec.command) == ["python", "train.py"]
    assert spec.queue == "default"
    assert (spec.gpus_per_worker, spec.min_workers, spec.max_workers) == (1, 1, 1)  # inelastic by default
    assert spec.restart_policy == types_pb2.RESTART_POLICY_ON_FAILURE
    assert not spec.HasField("deadline")
    assert not spec.HasField("max_runtime")
    assert not spec.HasField("throughput")


def test_job_spec_all_fields() -> None:
    deadline = dt.datetime(2030, 1, 31, 18, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    spec = job_spec(
        name="bert",
        command=["torchrun", "pretrain.py"],
        user="ada",
        queue="research",
        gpus_per_worker=8,
        min_workers=2,
        max_workers=6,
        priority=-3,
        env={"NCCL_DEBUG": "INFO"},
        deadline=deadline,
        max_runtime_s=7200.5,
        restart_policy="never",
        max_restarts=2,
        estimated_runtime_s=3600,
        throughput_points={4: 380.0, 2: 200.0},
        total_work=1e6,
    )
    assert (spec.user, spec.queue, spec.gpus_per_worker, spec.min_workers, spec.max_workers) == (
        "ada", "research", 8, 2, 6,
    )
    assert spec.priority == -3
    assert dict(spec.env) == {"NCCL_DEBUG": "INFO"}
    assert spec.deadline.ToDatetime(tzinfo=dt.UTC) == deadline
    assert spec.max_runtime.ToTimedelta() == dt.timedelta(seconds=7200.5)
    assert spec.restart_policy == types_pb2.RESTART_POLICY_NEVER
    assert spec.max_restarts == 2
    assert spec.throughput.estimated_runtime.ToTimedelta() == dt.timedelta(hours=1)
    assert [(p.workers, p.samples_per_second) for p in spec.throughput.points] == [(2, 200.0), (4, 380.0)]
    assert spec.throughput.total_work == 1e6


def test_job_spec_naive_deadline_is_local_time() -> None:
    naive = dt.datetime(2030, 6, 1, 12, 0)  # noqa: DTZ001 - the naive time is the input under test
    spec = job_spec(name="j", command=["true"], deadline=naive)
    assert spec.deadline.ToDatetime(tzinfo=dt.UTC) == naive.astimezone()


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"command": "python train.py"}, "command"),  # a shell string, not an argv
        ({"restart_policy": "always"}, "restart_policy"),
        ({"gpus_per_worker": -1}, "gpus_per_worker"),
        ({"min_workers": 1.5}, "min_workers"),
        ({"priority": 2**40}, "priority"),
        ({"max_runtime_s": -1}, "max_runtime_s"),
        ({"env": {"N": 1}}, "env"),
        ({"throughput_points": {0: 1.0}}, "throughput_points"),
    ],
)
def test_job_spec_rejects_what_a_job_spec_cannot_express(kwargs: dict, names: str) -> None:
    base = {"name": "j", "command": ["true"]}
    with pytest.raises(ValueError, match=names):
        job_spec(**{**base, **kwargs})


def test_job_spec_leaves_policy_checks_to_the_server() -> None:
    # min_workers=0 is representable; whether it is acceptable is the server's call.
    assert job_spec(name="j", command=["true"], min_workers=0).min_workers == 0


SPEC_YAML = """
name: resnet
command: [torchrun, train.py, --epochs, "90"]
user: grace
queue: vision
gpus_per_worker: 4
min_workers: 1
max_workers: 4
priority: 5
env: {OMP_NUM_THREADS: 8, NCCL_DEBUG: INFO}
deadline: 2030-01-31T18:00:00Z
max_runtime_s: 86400
restart_policy: on_failure
max_restarts: 3
estimated_runtime_s: 3600
throughput_points: {1: 100.0, 2: 190, 4: 350.5}
total_work: 5.0e6
"""


def test_job_spec_from_yaml_mapping_equals_job_spec() -> None:
    spec = job_spec_from_mapping(yaml.safe_load(SPEC_YAML))
    expected = job_spec(
        name="resnet",
        command=["torchrun", "train.py", "--epochs", "90"],
        user="grace",
        queue="vision",
        gpus_per_worker=4,
        min_workers=1,
        max_workers=4,
        priority=5,
        env={"OMP_NUM_THREADS": "8", "NCCL_DEBUG": "INFO"},
        deadline=dt.datetime(2030, 1, 31, 18, 0, tzinfo=dt.UTC),
        max_runtime_s=86400,
        restart_policy="on_failure",
        max_restarts=3,
        estimated_runtime_s=3600,
        throughput_points={1: 100.0, 2: 190.0, 4: 350.5},
        total_work=5e6,
    )
    assert spec == expected


def test_job_spec_from_json_mapping_accepts_string_worker_counts_and_iso_deadline() -> None:
    data = json.loads(
        '{"name": "j", "command": ["true"], "deadline": "2030-01-31T18:00:00+00:00",'
        ' "throughput_points": {"2": 10.0, "1": 6}}'
    )
    spec = job_spec_from_mapping(data)
    assert [(p.workers, p.samples_per_second) for p in spec.throughput.points] == [(1, 6.0), (2, 10.0)]
    assert spec.deadline.ToDatetime(tzinfo=dt.UTC) == dt.datetime(2030, 1, 31, 18, tzinfo=dt.UTC)


def test_job_spec_from_mapping_takes_the_protobuf_json_spelling_of_a_spec() -> None:
    from google.protobuf.json_format import MessageToDict

    spec = job_spec(
        name="j", command=["python", "t.py"], user="ada", gpus_per_worker=2, min_workers=1, max_workers=4,
        priority=0, env={"A": "1"}, deadline=dt.datetime(2030, 1, 31, 18, tzinfo=dt.UTC), max_runtime_s=7200.25,
        restart_policy="never", max_restarts=0, estimated_runtime_s=600, throughput_points={1: 5.0, 2: 9.5},
        total_work=1e6,
    )
    printed = MessageToDict(spec, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    assert printed["max_runtime"] == "7200.250s" and printed["restart_policy"] == "RESTART_POLICY_NEVER"
    assert job_spec_from_mapping(json.loads(json.dumps(printed))) == spec
    assert job_spec_from_mapping(yaml.safe_load(yaml.safe_dump(printed))) == spec
    unspecified = job_spec_from_mapping(
        {"name": "j", "command": ["true"], "restart_policy": "RESTART_POLICY_UNSPECIFIED"})
    assert unspecified.restart_policy == types_pb2.RESTART_POLICY_ON_FAILURE  # unspecified: the default
    with pytest.raises(ValueError, match=re.escape("'throughput.speed'")):
        job_spec_from_mapping({"name": "j", "command": ["true"], "throughput": {"speed": 1}})
    with pytest.raises(ValueError, match=re.escape("'total_work' and 'throughput.total_work' say the same thing")):
        job_spec_from_mapping({"name": "j", "command": ["true"], "total_work": 1, "throughput": {"total_work": 2}})


def test_job_spec_from_mapping_null_means_default() -> None:
    spec = job_spec_from_mapping({"name": "j", "command": ["true"], "max_workers": None, "min_workers": 2})
    assert spec.max_workers == 2


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "j", "command": ["true"], "gpus": 2}, "unknown job spec key 'gpus'"),
        ({"name": "j", "command": ["true"], "minWorkers": 2}, "unknown job spec key 'minWorkers'"),
        ({"command": ["true"]}, "'name' is required"),
        ({"name": "j"}, "'command' is required"),
        ({"name": "j", "command": "python train.py"}, "'command'"),
        ({"name": "j", "command": ["true"], "gpus_per_worker": "two"}, "'gpus_per_worker'"),
        ({"name": "j", "command": ["true"], "min_workers": True}, "'min_workers'"),
        ({"name": "j", "command": ["true"], "env": {"DEBUG": True}}, "'env'"),
        ({"name": "j", "command": ["true"], "deadline": "tomorrow"}, "'deadline'"),
        ({"name": "j", "command": ["true"], "throughput_points": {"many": 1.0}}, "'throughput_points'"),
        ({"name": "j", "command": ["true"], "restart_policy": "always"}, "restart_policy"),
    ],
)
def test_job_spec_from_mapping_names_the_bad_key(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        job_spec_from_mapping(data)


def test_unknown_key_error_lists_the_valid_keys() -> None:
    with pytest.raises(ValueError, match="valid keys: name, command"):
        job_spec_from_mapping({"name": "j", "command": ["true"], "image": "pytorch"})


# ---------------------------------------------------------------------------------------------
# Client construction and an unreachable server (no server)


def test_address_defaults_to_env_then_localhost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARYL_SERVER", raising=False)
    with ArylClient() as client:
        assert client.address == "127.0.0.1:50051"
    monkeypatch.setenv("ARYL_SERVER", "scheduler.internal:6000")
    with ArylClient() as client:
        assert client.address == "scheduler.internal:6000"
    with ArylClient("other:1", timeout=3) as client:
        assert (client.address, client.timeout) == ("other:1", 3)


def test_unreachable_server_raises_unavailable() -> None:
    with ArylClient(f"127.0.0.1:{free_port()}", timeout=5) as client:
        with pytest.raises(Unavailable) as err:
            client.get_cluster()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE
    assert isinstance(err.value, ArylError)
    assert err.value.message


def test_unreachable_server_replay_raises_unavailable() -> None:
    with ArylClient(f"127.0.0.1:{free_port()}", timeout=1) as client:
        with pytest.raises(Unavailable):
            list(client.watch_events(after_event_id=0, idle_timeout=0.5))


# ---------------------------------------------------------------------------------------------
# Against the real scheduler (tests/conftest.py `scheduler`: SQLite and PostgreSQL)


@pytest.fixture
def client(scheduler) -> Iterator[ArylClient]:
    with ArylClient(scheduler.address, timeout=10) as aryl:
        yield aryl


def small_spec(name: str = "job", **kwargs) -> types_pb2.JobSpec:
    return job_spec(name=name, command=["python", "-c", "pass"], user=kwargs.pop("user", "tester"), **kwargs)


def test_submit_get_list_cancel(client: ArylClient) -> None:
    client.create_queue("research", 0)  # a job's queue must exist
    spec = small_spec("bert", queue="research", gpus_per_worker=2, min_workers=1, max_workers=3, env={"A": "1"})
    job = client.submit_job(spec)
    assert job.job_id
    assert job.spec.name == "bert"
    assert job.state == types_pb2.JOB_STATE_PENDING  # no servers registered: nothing can run

    fetched = client.get_job(job.job_id)
    assert fetched.job.job_id == job.job_id
    assert list(fetched.job.spec.command) == ["python", "-c", "pass"]
    assert dict(fetched.job.spec.env) == {"A": "1"}
    assert (fetched.job.spec.gpus_per_worker, fetched.job.spec.max_workers) == (2, 3)
    assert not fetched.events  # only with include_events

    other = client.submit_job(small_spec("other", user="someone-else"))

    def ids(**filters) -> list[str]:
        return [j.job_id for j in client.list_jobs(**filters).jobs]

    assert set(ids()) == {job.job_id, other.job_id}
    assert ids(user="tester") == [job.job_id]
    assert ids(queue="research") == [job.job_id]
    assert ids(queue="nope") == []
    assert set(ids(states=[types_pb2.JOB_STATE_PENDING])) == {job.job_id, other.job_id}
    assert ids(states=[types_pb2.JOB_STATE_CANCELLED]) == []

    cancelled = client.cancel_job(job.job_id, reason="changed my mind")
    assert cancelled.state == types_pb2.JOB_STATE_CANCELLED
    assert client.get_job(job.job_id).job.state == types_pb2.JOB_STATE_CANCELLED
    assert ids(states=[types_pb2.JOB_STATE_CANCELLED]) == [job.job_id]
    assert ids(states=[types_pb2.JOB_STATE_PENDING, types_pb2.JOB_STATE_CANCELLED]) != []


def test_iter_jobs_follows_pages(client: ArylClient) -> None:
    submitted = [client.submit_job(small_spec(f"j{i}")).job_id for i in range(7)]
    first = client.list_jobs(page_size=3)
    assert len(first.jobs) == 3
    assert first.next_page_token
    paged = [j.job_id for j in client.iter_jobs(page_size=3)]
    assert sorted(paged) == sorted(submitted)  # every job exactly once
    assert paged == [j.job_id for j in client.list_jobs(page_size=100).jobs]  # same order as one page
    assert [j.job_id for j in client.iter_jobs(page_size=3, user="nobody")] == []


def test_typed_errors(client: ArylClient) -> None:
    with pytest.raises(NotFound) as not_found:
        client.get_job("999999")
    assert not_found.value.code == grpc.StatusCode.NOT_FOUND
    assert not_found.value.message

    with pytest.raises(InvalidArgument) as invalid:
        client.submit_job(small_spec(min_workers=0))
    assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_workers" in invalid.value.message  # the server names the bad field

    client.submit_job(small_spec("once"), idempotency_key="run-42")
    with pytest.raises(AlreadyExists):  # another spec with the key (the same spec is a retry)
        client.submit_job(small_spec("other"), idempotency_key="run-42")

    job = client.submit_job(small_spec("twice"))
    client.cancel_job(job.job_id)
    with pytest.raises(FailedPrecondition) as precondition:
        client.cancel_job(job.job_id)
    assert precondition.value.code == grpc.StatusCode.FAILED_PRECONDITION

    with pytest.raises(NotFound):
        client.cancel_job("999999")
    with pytest.raises(NotFound):
        client.explain_job("999999")


def test_watch_events_replays_then_streams_new_events(client: ArylClient) -> None:
    job = client.submit_job(small_spec("watched"))
    replay = list(client.watch_events(after_event_id=0, job_id=job.job_id, idle_timeout=1.0))
    assert replay, "the submit event was not replayed"
    submitted = replay[0]
    assert submitted.kind == types_pb2.EVENT_KIND_JOB_SUBMITTED
    assert submitted.job_id == job.job_id
    assert [e.event_id for e in replay] == sorted(e.event_id for e in replay)

    # Live: a cursor past everything seen so far, then a new change arrives on the open stream.
    with client.watch_events(after_event_id=replay[-1].event_id, job_id=job.job_id, idle_timeout=10.0) as stream:
        client.cancel_job(job.job_id, reason="watch test")
        new = []
        for event in stream:  # a scheduling cycle may log a pending reason first
            new.append(event)
            if event.kind == types_pb2.EVENT_KIND_JOB_STATE_CHANGED:
                break
    assert new, "no event arrived on the open stream"
    assert {e.job_id for e in new} == {job.job_id}
    assert new[0].event_id > replay[-1].event_id
    assert new[-1].kind == types_pb2.EVENT_KIND_JOB_STATE_CHANGED
    assert "CANCELLED" in new[-1].to_state


def test_get_job_include_events(client: ArylClient) -> None:
    job = client.submit_job(small_spec("evented"))
    response = client.get_job(job.job_id, include_events=True)
    assert response.events[0].kind == types_pb2.EVENT_KIND_JOB_SUBMITTED
    assert {e.job_id for e in response.events} == {job.job_id}


def test_cancelled_stream_ends_quietly(client: ArylClient) -> None:
    stream = client.watch_events()  # only new events: blocks until cancelled
    stream.cancel()
    assert list(stream) == []


def test_explain_job(client: ArylClient) -> None:
    job = client.submit_job(small_spec("why"))
    explanation = client.explain_job(job.job_id)
    assert explanation.job.job_id == job.job_id
    assert explanation.summary


def test_cluster_servers_loans_and_demand(client: ArylClient, scheduler) -> None:
    register_fake_server(scheduler.address, "gpu-node-1", pool="training", gpus=4)
    servers = client.list_servers()
    assert [s.server_id for s in servers] == ["gpu-node-1"]
    assert servers[0].pool == types_pb2.POOL_TRAINING
    assert servers[0].gpus_total == 4
    assert client.list_servers(pool=types_pb2.POOL_INFERENCE) == []
    assert client.list_loans() == []
    assert client.list_loans(include_returned=True) == []

    cluster = client.get_cluster()
    training = [p for p in cluster.pools if p.pool == types_pb2.POOL_TRAINING]
    assert training and training[0].gpus_total == 4
    assert cluster.policy

    for name in ("inf-1", "inf-2"):  # demand is at most the inference pool's size
        register_fake_server(scheduler.address, name, pool="inference", gpus=1)
    reported = client.report_demand(2, observed_rps=12.5, source="test")
    assert (reported.demand.servers_needed, reported.demand.observed_rps, reported.demand.source) == (2, 12.5, "test")
    demand = client.get_demand()
    assert (demand.servers_needed, demand.source) == (2, "test")
