"""What-if on the live cluster (issue 22): ``WhatIf`` / ``arylctl what-if`` simulate the next hours of a
real scheduler's cluster on PostgreSQL under another policy, parameter set or inference pool, and
leave the live state untouched -- every table's rows compared before and after. Inputs are checked
(unknown policy or parameter: INVALID_ARGUMENT naming the choices) and only admins may ask. First,
``simulator.forecast.what_if`` itself on a snapshot built by hand."""

from __future__ import annotations

import io

import grpc
import pytest
import sqlalchemy as sa

from arylctl import cli
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.core.params import PolicyParams
from scheduler_service.server import serve_in_background
from scheduler_service.store.models import Base
from simulator.forecast import what_if, with_inference_servers
from tests.harness import (
    NOW,
    details_of,
    inference_server,
    job_spec,
    pending_job,
    register_fake_server,
    running_job,
    scheduler_config,
    scheduler_stub,
    secure_channel,
    snapshot_of,
    training_server,
)
from tests.helpers import wait_for

FAST_LOANS = PolicyParams(loan_idle_s=0, drain_timeout_s=0, loan_buffer_servers=0, min_loan_s=0)


def small_cluster():
    """One 4-GPU training server running a 4-GPU job for 1 h, two 4-GPU jobs of 1 h waiting, and one
    idle 4-GPU inference server that inference does not need now."""
    return snapshot_of(
        [training_server("t0", 4), inference_server("i0", gpus=4, since=NOW - 86400)],
        [running_job(1, [("t0", (0, 1, 2, 3))], low=1, resized=NOW - 1, runtime=3600),
         pending_job(2, gpus=4, runtime=3600), pending_job(3, gpus=4, runtime=3600)],
        demand=0,
    )


def test_what_if_compares_two_settings_on_the_same_snapshot() -> None:
    """Loaning the idle inference server (fast loans) lets a waiting job run beside the running one:
    the alternative finishes the queue an hour sooner; the snapshot is not changed."""
    snapshot = small_cluster()
    before = repr(snapshot)
    result = what_if(snapshot, ("aryl-noloan", PolicyParams()), ("aryl", FAST_LOANS), horizon_s=12 * 3600)
    assert repr(snapshot) == before
    now, alt = result.current.summary, result.alternative.summary
    assert now["jobs_completed"] == alt["jobs_completed"] == 3
    assert now["makespan_s"] == pytest.approx(3 * 3600, abs=300)
    assert alt["makespan_s"] == pytest.approx(2 * 3600, abs=300)
    assert alt["loans"] >= 1 and now["loans"] == 0
    assert result.table.splitlines()[0].split() == ["metric", "now:", "aryl-noloan", "what-if:", "aryl"]
    more = what_if(snapshot, ("aryl-noloan", PolicyParams()), ("aryl-noloan", PolicyParams()), horizon_s=3600,
                   extra_inference_servers=2)
    assert more.alternative.summary["makespan_s"] == pytest.approx(3600, abs=1)  # the horizon: an hour ahead


def test_what_if_bounds_and_inference_pool_changes() -> None:
    snapshot = small_cluster()
    with pytest.raises(ValueError, match="at most 168 h"):
        what_if(snapshot, ("aryl", PolicyParams()), ("fifo", PolicyParams()), horizon_s=169 * 3600)
    grown = with_inference_servers(snapshot, 3)
    assert [s.server_id for s in grown.servers[-3:]] == ["what-if-0000", "what-if-0001", "what-if-0002"]
    assert all(len(s.gpu_indices) == 4 for s in grown.servers[-3:])
    assert [s.server_id for s in with_inference_servers(snapshot, -1).servers] == ["t0"]
    with pytest.raises(ValueError, match="1 are serving and idle"):
        with_inference_servers(snapshot, -2)

# Tables a live scheduler writes on its own clock whatever happens (its leader lease renewals, and its replica
# heartbeat on the same round).
CHANGING_ON_THEIR_OWN = frozenset({"leader_lease", "scheduler_replicas"})


def table_rows(url: str) -> dict[str, list[tuple]]:
    """Every row of every table of ours (but the lease and the replica heartbeats), in a stable order."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                table.name: sorted((tuple(row) for row in conn.execute(sa.select(table))), key=repr)
                for table in Base.metadata.sorted_tables if table.name not in CHANGING_ON_THEIR_OWN
            }
    finally:
        engine.dispose()


def runtime(seconds: int) -> dict:
    return {"throughput": {"estimated_runtime": {"seconds": seconds}}}


@pytest.fixture
def busy_cluster(postgres_url: str):
    """A scheduler on PostgreSQL with one 4-GPU training server, two 4-GPU inference servers (one of
    them needed by inference), one job running on the training server and two waiting."""
    handle = serve_in_background(scheduler_config(postgres_url, agents={"lost_after_s": 600}))
    channel, stub = scheduler_stub(handle.address)
    try:
        register_fake_server(handle.address, "train-1", gpus=4)
        for sid in ("infer-1", "infer-2"):
            register_fake_server(handle.address, sid, pool="inference", gpus=4)
        with secure_channel(handle.address) as router:
            inference_pb2_grpc.InferenceServiceStub(router).ReportDemand(
                inference_pb2.ReportDemandRequest(servers_needed=1, observed_rps=10.0, source="test"), timeout=5)
        for name, seconds in (("first", 3600), ("second", 1800), ("third", 900)):
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec(name, gpus=4, **runtime(seconds))), timeout=5)
        wait_for(lambda: any(j.HasField("started_at") for j in stub.ListJobs(scheduler_pb2.ListJobsRequest(),
                                                                             timeout=5).jobs),
                 timeout=20, what="a job to start")
        yield handle, stub, postgres_url
    finally:
        channel.close()
        handle.stop()


def settled_rows(url: str) -> dict[str, list[tuple]]:
    """The rows once four reads half a second apart agree (every cycle since the last change has
    written its reasons: cycles run every 0.2 s here)."""
    reads: list[dict[str, list[tuple]]] = []

    def quiet() -> bool:
        reads.append(table_rows(url))
        return len(reads) >= 4 and all(r == reads[-1] for r in reads[-4:])

    wait_for(quiet, timeout=30, interval=0.5, what="the cluster's rows to settle")
    return reads[-1]


@pytest.mark.postgres
def test_what_if_simulates_the_live_cluster_and_changes_nothing(busy_cluster) -> None:
    handle, stub, url = busy_cluster
    before = settled_rows(url)
    response = stub.WhatIf(scheduler_pb2.WhatIfRequest(
        policy="fifo", params={"loan_buffer_servers": "0"}, inference_servers=2, horizon_hours=12), timeout=60)
    after = table_rows(url)
    assert {k: v for k, v in after.items() if v != before[k]} == {}  # nothing in the live cluster changed

    assert response.current.label == "now: aryl" and response.alternative.label == "what-if: fifo"
    assert list(response.current.changed_params) == []
    assert list(response.alternative.changed_params) == ["loan_buffer_servers=0"]
    assert response.horizon_hours == 12
    # The three jobs finish within the horizon in both runs (1 h + 30 min + 15 min of work, one at a time).
    for run in (response.current, response.alternative):
        assert run.stop_reason == "completed"
        assert run.metrics["jobs_total"] == 3 and run.metrics["jobs_completed"] == 3
        assert run.metrics["makespan_s"] < 12 * 3600
    header, rule, *rows = response.table.splitlines()
    assert header.split() == ["metric", "now:", "aryl", "what-if:", "fifo"]
    assert set(rule) <= {"-", " "}
    assert rows[0].startswith("jobs completed")

    out, err = io.StringIO(), io.StringIO()
    code = cli.main(["--server", handle.address, "what-if", "--policy", "fifo", "--param", "loan_buffer_servers=0",
                     "--inference-servers", "+2", "--hours", "12"], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    assert "what-if: fifo: loan_buffer_servers=0" in out.getvalue()
    assert response.table.splitlines()[0] in out.getvalue()
    assert table_rows(url) == before


@pytest.mark.postgres
@pytest.mark.parametrize("request_fields, field, names", [
    ({"policy": "no-such-policy", "horizon_hours": 1}, "policy", "fifo"),
    ({"params": {"no_such_knob": "1"}, "horizon_hours": 1}, "params[no_such_knob]", "loan_buffer_servers"),
    ({"params": {"loan_buffer_servers": "many"}, "horizon_hours": 1}, "params[loan_buffer_servers]", "int"),
    ({"horizon_hours": 0}, "horizon_hours", "168"),
    ({"horizon_hours": 1, "inference_servers": -5}, "inference_servers", "idle"),
])
def test_what_if_refuses_bad_inputs_naming_the_choices(busy_cluster, request_fields, field, names) -> None:
    _, stub, _ = busy_cluster
    with pytest.raises(grpc.RpcError) as caught:
        stub.WhatIf(scheduler_pb2.WhatIfRequest(**request_fields), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details_of(caught.value).startswith(f"{field}: ") and names in details_of(caught.value)


@pytest.mark.postgres
def test_what_if_is_for_admins(busy_cluster) -> None:
    handle, _, _ = busy_cluster
    with secure_channel(handle.address, principal="user:alice") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            scheduler_pb2_grpc.SchedulerServiceStub(channel).WhatIf(
                scheduler_pb2.WhatIfRequest(horizon_hours=1), timeout=30)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
