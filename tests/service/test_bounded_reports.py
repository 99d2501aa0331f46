"""A status report is bounded, and so is every transaction (issue 19: a 200 KB report of 100,000 GPU
samples held its server's row lock for minutes, and the agent's registration timed out behind it).

Over real gRPC on SQLite and PostgreSQL: a report may carry at most one sample per registered GPU;
more, or a GPU twice, is refused at once with INVALID_ARGUMENT naming the field, and the same
server's registration and reports go on meanwhile. On the store: a unit of work that runs past
``transaction_timeout_ms`` is refused and rolled back, and its lock goes with it.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import sqlalchemy as sa
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc
from scheduler_service.store import db
from scheduler_service.store import models as m
from scheduler_service.store.transactions import Transactions
from tests.harness import as_call, details_of, register_fake_server, secure_channel

GPUS = 4


def _sample(index: int, *, healthy: bool = True) -> agent_pb2.GpuStatus:
    return agent_pb2.GpuStatus(index=index, utilization=0.5, memory_used_bytes=1 << 30, temperature_c=60.0,
                               healthy=healthy, health_reason="" if healthy else "XID 79")


def _report(epoch: int, samples: list[agent_pb2.GpuStatus], generation: int = 0) -> agent_pb2.ReportStatusRequest:
    return agent_pb2.ReportStatusRequest(server_id="node-1", scheduler_epoch=epoch, observed_generation=generation,
                                         gpus=samples)


def _refused_field(error: grpc.RpcError) -> str:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    status = rpc_status.from_call(as_call(error))
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    return bad_request.field_violations[0].field


def _gpu_health(database_url: str) -> dict[int, bool]:
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            g = m.GPUS.c
            return dict(conn.execute(sa.select(g.index, g.healthy).where(g.server_id == "node-1")).all())
    finally:
        engine.dispose()


def test_a_report_of_100k_samples_is_refused_at_once_and_the_server_goes_on(scheduler, database_url) -> None:
    registered = register_fake_server(scheduler.address, "node-1", gpus=GPUS)
    epoch = registered.scheduler_epoch
    # 100,000 samples of the server's 4 GPUs (200 KB), each saying "unhealthy": before the cap, every
    # one wrote an event and an UPDATE with the server's row locked.
    flood = _report(epoch, [_sample(i % GPUS, healthy=False) for i in range(100_000)])
    with secure_channel(scheduler.address) as channel, ThreadPoolExecutor(max_workers=3) as pool:
        agent = agent_pb2_grpc.AgentServiceStub(channel)
        started = time.monotonic()
        flooding = pool.submit(agent.ReportStatus, flood, timeout=10)
        # Meanwhile the same server registers again and reports normally (as the real agent would).
        again = pool.submit(register_fake_server, scheduler.address, "node-1", gpus=GPUS)
        with pytest.raises(grpc.RpcError) as refused:
            flooding.result()
        refused_after = time.monotonic() - started
        assert _refused_field(refused.value) == "gpus"
        assert "one sample per GPU" in details_of(refused.value)
        assert refused_after < 3, f"the flood took {refused_after:.1f} s to refuse"
        epoch = again.result(timeout=10).scheduler_epoch
        normal = agent.ReportStatus(_report(epoch, [_sample(i) for i in range(GPUS)]), timeout=5)
        assert normal.desired_generation >= 1
        assert time.monotonic() - started < 5
    # The flood wrote nothing: no GPU was marked unhealthy.
    assert _gpu_health(database_url) == dict.fromkeys(range(GPUS), True)


def test_a_gpu_reported_twice_or_more_samples_than_gpus_are_refused(scheduler, database_url) -> None:
    epoch = register_fake_server(scheduler.address, "node-1", gpus=GPUS).scheduler_epoch
    with secure_channel(scheduler.address) as channel:
        agent = agent_pb2_grpc.AgentServiceStub(channel)
        with pytest.raises(grpc.RpcError) as twice:
            agent.ReportStatus(_report(epoch, [_sample(0), _sample(1, healthy=False), _sample(1)]), timeout=5)
        assert _refused_field(twice.value) == "gpus[2].index"
        assert "reported twice" in details_of(twice.value)
        with pytest.raises(grpc.RpcError) as too_many:
            agent.ReportStatus(_report(epoch, [_sample(i) for i in range(GPUS + 1)]), timeout=5)
        assert _refused_field(too_many.value) == "gpus"
        assert f"registered {GPUS} GPU(s)" in details_of(too_many.value)
        # Past any server's size: refused before the store is asked.
        with pytest.raises(grpc.RpcError) as huge:
            agent.ReportStatus(_report(epoch, [_sample(i) for i in range(1025)]), timeout=5)
        assert _refused_field(huge.value) == "gpus"
        assert _gpu_health(database_url) == dict.fromkeys(range(GPUS), True)
        # A normal report, one GPU failing, is recorded.
        agent.ReportStatus(_report(epoch, [_sample(0), _sample(1), _sample(2, healthy=False), _sample(3)]),
                           timeout=5)
    assert _gpu_health(database_url) == {0: True, 1: True, 2: False, 3: True}


def test_a_transaction_past_its_bound_is_rolled_back_and_frees_its_lock(database_url) -> None:
    engine = db.create_engine_for(database_url, transaction_timeout_ms=400)
    transactions = Transactions(db.session_factory(engine), publish=lambda _states: None)
    try:
        transactions.write(lambda session: session.add(m.Server(
            id="node-1", hostname="node-1", pool="TRAINING", state="TRAINING", state_reason="test", agent_address="a",
            agent_version="t", registered_at=0.0, desired_generation=1,
            state_changed_at=0.0, logs_address="", inference_endpoint="")))
        locked = threading.Event()

        def slow(session) -> None:  # many quick statements, each well under any statement timeout
            for i in range(10_000):
                session.execute(sa.update(m.SERVERS).where(m.SERVERS.c.id == "node-1")
                                .values(state_reason=f"slow {i}"))
                locked.set()
                time.sleep(0.01)

        started = time.monotonic()
        with pytest.raises(db.TransactionTimedOut, match="400 ms"):
            transactions.write(slow)
        assert locked.is_set()
        assert time.monotonic() - started < 2
        # Nothing of it was saved, and the row is free for the next writer.
        transactions.write(lambda session: session.execute(
            sa.update(m.SERVERS).where(m.SERVERS.c.id == "node-1").values(state_reason="next")))
        assert transactions.read(lambda session: session.get_one(m.Server, "node-1").state_reason) == "next"
    finally:
        engine.dispose()
