"""The scheduler's side of the loaning protocol with the router, over real gRPC on both databases:
the serving-pool watch (full set, pushed on change) and the drain acknowledgement that lets a
DRAINING server be loaned before the drain timeout."""

from __future__ import annotations

import queue
import threading

import grpc
import pytest

from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, types_pb2
from tests.harness import details_of, job_spec, register_fake_server, scheduler_stub, secure_channel
from tests.helpers import wait_for

S = types_pb2
# Loans as soon as demand allows, but a drain that nobody acknowledges would take an hour.
ACK_ONLY = {"loan_idle_s": 0, "drain_timeout_s": 3600, "min_loan_s": 0, "loan_buffer_servers": 0}


def register_inference_server(address: str, hostname: str, endpoint: str, *, converge: bool = True) -> None:
    """Register an inference server with one GPU as an agent would, then (``converge``) report its desired
    generation as applied."""
    register_fake_server(address, hostname, "inference", gpus=1, inference_endpoint=endpoint, converge=converge)


class PoolWatch:
    """A WatchServingPool stream read by a thread into a queue."""

    def __init__(self, address: str) -> None:
        self._channel = secure_channel(address)
        self.stub = inference_pb2_grpc.InferenceServiceStub(self._channel)
        self._call = self.stub.WatchServingPool(inference_pb2.WatchServingPoolRequest(source="test"))
        self.updates: queue.Queue[inference_pb2.ServingPool] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            for update in self._call:
                self.updates.put(update)
        except grpc.RpcError:
            pass

    def next_where(self, predicate, what: str) -> inference_pb2.ServingPool:
        while True:
            try:
                update = self.updates.get(timeout=15)
            except queue.Empty:
                raise AssertionError(f"no serving-pool update with {what}") from None
            if predicate(update):
                return update

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()


def states(update: inference_pb2.ServingPool) -> dict[str, int]:
    return {s.server_id: s.state for s in update.servers}


def test_pool_watch_drain_acknowledgement_and_loan(scheduler_factory) -> None:
    scheduler = scheduler_factory(policy=ACK_ONLY)
    channel, stub = scheduler_stub(scheduler.address)
    register_inference_server(scheduler.address, "inf-1", "http://127.0.0.1:9001")
    register_inference_server(scheduler.address, "inf-2", "http://127.0.0.1:9002")
    watch = PoolWatch(scheduler.address)
    try:
        first = watch.next_where(lambda u: len(u.servers) == 2, "both servers")
        assert states(first) == {"inf-1": S.SERVER_STATE_SERVING, "inf-2": S.SERVER_STATE_SERVING}
        assert {s.endpoint for s in first.servers} == {"http://127.0.0.1:9001", "http://127.0.0.1:9002"}

        # Before any drain, an acknowledgement is refused with the reason.
        with pytest.raises(grpc.RpcError) as err:
            watch.stub.ReportDrained(inference_pb2.ReportDrainedRequest(server_id="inf-1", source="t"), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "not DRAINING" in details_of(err.value)

        # Training waits and demand falls to one server: one is drained (still in the pool, marked
        # DRAINING, so the router stops sending it requests) ...
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("waiting")), timeout=5)
        watch.stub.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=1, source="t"), timeout=5)
        draining = watch.next_where(lambda u: S.SERVER_STATE_DRAINING in states(u).values(), "a DRAINING server")
        server_id = next(sid for sid, st in states(draining).items() if st == S.SERVER_STATE_DRAINING)
        assert draining.version > first.version

        def servers() -> dict[str, types_pb2.ServerState]:
            listed = stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
            return {s.server_id: s.state for s in listed}

        assert servers()[server_id] == S.SERVER_STATE_DRAINING  # the hour-long timeout holds it there

        # ... and once the router says nothing is in flight there, it is loaned and leaves the pool.
        answer = watch.stub.ReportDrained(inference_pb2.ReportDrainedRequest(server_id=server_id, source="t"),
                                          timeout=5)
        assert answer.state == S.SERVER_STATE_DRAINING
        watch.next_where(lambda u: server_id not in states(u), f"{server_id} out of the pool")
        wait_for(lambda: servers()[server_id] == S.SERVER_STATE_LOANED, what="the drained server loaned")
        with pytest.raises(grpc.RpcError) as err:
            watch.stub.ReportDrained(inference_pb2.ReportDrainedRequest(server_id="nope", source="t"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        watch.close()
        channel.close()


def test_only_servers_with_an_endpoint_and_a_converged_agent_are_routable(scheduler) -> None:
    register_inference_server(scheduler.address, "no-endpoint", "")
    register_inference_server(scheduler.address, "unconfirmed", "http://127.0.0.1:9009", converge=False)
    watch = PoolWatch(scheduler.address)
    try:
        assert not watch.next_where(lambda u: True, "the first update").servers
        # The agent confirms the desired state (no training workers there): now it is routable.
        register_inference_server(scheduler.address, "unconfirmed", "http://127.0.0.1:9009")
        update = watch.next_where(lambda u: u.servers, "a routable server")
        assert [s.server_id for s in update.servers] == ["unconfirmed"]
    finally:
        watch.close()
    with pytest.raises(grpc.RpcError) as err:
        register_inference_server(scheduler.address, "bad", "ftp://x")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "inference_endpoint" in details_of(err.value)
