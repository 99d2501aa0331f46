"""What-if on the live cluster (issue 22): ``WhatIf`` / ``arylctl what-if`` simulate the next hours of a
real scheduler's cluster on PostgreSQL under another policy, parameter set or inference pool, and
leave the live state untouched -- every table's rows compared before and after. Inputs are checked
(unknown policy or parameter: INVALID_ARGUMENT naming the choices) and only admins may ask."""

from __future__ import annotations

import io

import grpc
import pytest
import sqlalchemy as sa

from arylctl import cli
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from scheduler_service.server import serve_in_background
from scheduler_service.store.models import Base
from tests.harness import job_spec, register_fake_server, scheduler_config, scheduler_stub, secure_channel
from tests.helpers import wait_for

pytestmark = pytest.mark.postgres

# Tables a live scheduler writes on its own clock whatever happens (its leader lease renewals).
CHANGING_ON_THEIR_OWN = frozenset({"leader_lease"})


def table_rows(url: str) -> dict[str, list[tuple]]:
    """Every row of every table of ours (but the lease), in a stable order."""
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
    assert caught.value.details().startswith(f"{field}: ") and names in caught.value.details()


def test_what_if_is_for_admins(busy_cluster) -> None:
    handle, _, _ = busy_cluster
    with secure_channel(handle.address, principal="user:alice") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            scheduler_pb2_grpc.SchedulerServiceStub(channel).WhatIf(
                scheduler_pb2.WhatIfRequest(horizon_hours=1), timeout=30)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
