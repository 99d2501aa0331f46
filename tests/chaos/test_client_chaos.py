"""Clients behaving badly, against a scheduler on the test's own PostgreSQL database with a real agent:

- impatient clients: SubmitJob and CancelJob with deadlines of a few milliseconds, and calls the
  client cancels itself mid-flight, in a seeded loop: each is applied once or not at all (a retry
  with the same idempotency key finds the job it queued), and afterwards ordinary calls are answered
  and health says SERVING (issue 19: one cancelled call used to wedge every later one);
- one client sending at ten times the normal rate (open loop: it does not slow down when answers
  do): the normal client beside it is answered every time, the flood only ever hears OK or a
  retryable refusal, nothing is stored twice;
- idle watch streams up to the scheduler's limits (2,000 under ARYL_CHAOS=full; the limits
  ``server.max_watch_streams`` and ``max_watch_streams_per_client`` set to that many, all of them
  coming from loopback): the next stream is refused RESOURCE_EXHAUSTED, submits keep succeeding,
  the scheduler stays SERVING, and once the streams end new ones are admitted again.

Each ends with the invariants (``tests.chaos.invariants``).
"""

from __future__ import annotations

import random
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health_pb2

from arylctl.client import ArylClient
from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.chaos.conftest import InProcessCluster, RetryingClient, chaos_job, scaled, serving
from tests.chaos.invariants import check_invariants, wait_workers_match
from tests.harness import health_stub, secure_channel

pytestmark = pytest.mark.postgres

CATCH_UP_S = 60.0
# What a client may hear under load or when it gave up itself; never INTERNAL or UNKNOWN.
IMPATIENT = {"DEADLINE_EXCEEDED", "CANCELLED", "UNAVAILABLE"}
RETRYABLE_REFUSALS = {"UNAVAILABLE", "RESOURCE_EXHAUSTED", "ABORTED", "DEADLINE_EXCEEDED"}


def submit_request(name: str) -> scheduler_pb2.SubmitJobRequest:
    return scheduler_pb2.SubmitJobRequest(spec=chaos_job(name), idempotency_key=f"key-{name}")


def health(address: str) -> int:
    with secure_channel(address) as channel:
        return health_stub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def test_clients_giving_up_mid_call_never_wedge_the_scheduler_or_apply_twice(
    inprocess_cluster: InProcessCluster, rng: random.Random,
) -> None:
    cluster = inprocess_cluster
    cluster.start(agents=1, gpus=4)
    channel = secure_channel(cluster.address)
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    names: list[str] = []
    known: list[str] = []  # job ids acknowledged so far, to cancel impatiently
    heard: dict[str, int] = {}
    try:
        for i in range(scaled(40, 400)):
            deadline = rng.uniform(0.001, 0.03)
            action = rng.choice(("submit", "submit", "submit-cancelled", "cancel"))
            try:
                if action == "cancel" and known:
                    stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=rng.choice(known), reason="chaos"),
                                   timeout=deadline)
                elif action == "submit-cancelled":
                    names.append(name := f"c{i}")
                    call = stub.SubmitJob.future(submit_request(name), timeout=10)
                    time.sleep(deadline)  # the client gives up by itself, mid-call
                    call.cancel()
                    known.append(call.result().job.job_id)  # answered before the cancel reached it
                else:
                    names.append(name := f"s{i}")
                    known.append(stub.SubmitJob(submit_request(name), timeout=deadline).job.job_id)
                heard["OK"] = heard.get("OK", 0) + 1
            except grpc.FutureCancelledError:
                heard["CANCELLED"] = heard.get("CANCELLED", 0) + 1
            except grpc.RpcError as exc:
                heard[exc.code().name] = heard.get(exc.code().name, 0) + 1
                assert exc.code().name in IMPATIENT | {"FAILED_PRECONDITION"}, (exc.code(), exc.details())
        print(f"impatient calls heard: {heard}")
        assert set(heard) - {"OK", "FAILED_PRECONDITION"}, "no call gave up: the case tested nothing"

        # Ordinary calls are answered (each retry finds the job an impatient try queued, if it did).
        patient = ArylClient(cluster.address, timeout=10)
        try:
            acknowledged = [patient.submit_job(chaos_job(n), idempotency_key=f"key-{n}", attempts=1).job_id
                            for n in names]
        finally:
            patient.close()
        assert health(cluster.address) == health_pb2.HealthCheckResponse.SERVING
        check_invariants(cluster.url, acknowledged, submitted_names=names)
        assert set(known) <= set(acknowledged)  # an answered impatient submit is the job its retry finds
        wait_workers_match(cluster.url, cluster.marker, timeout=CATCH_UP_S)
    finally:
        channel.close()


def test_a_client_at_ten_times_the_normal_rate_starves_no_one(
    inprocess_cluster: InProcessCluster, rng: random.Random,
) -> None:
    normal_rate = 5.0  # submissions per second of the normal client
    seconds = scaled(4, 30)
    cluster = inprocess_cluster
    cluster.start(agents=1, gpus=4)
    flood_channel = secure_channel(cluster.address)
    flood = scheduler_pb2_grpc.SchedulerServiceStub(flood_channel)
    normal = ArylClient(cluster.address, timeout=10)
    flood_calls: list[tuple[str, grpc.Future]] = []
    normal_acks: dict[str, str] = {}
    stop = threading.Event()

    def send_flood() -> None:
        # Open loop: one call every 1/(10 x rate) s, whatever the answers do.
        interval = 1.0 / (10 * normal_rate)
        for i in range(int(seconds * 10 * normal_rate)):
            if stop.is_set():
                return
            name = f"flood-{i}"
            flood_calls.append((name, flood.SubmitJob.future(submit_request(name), timeout=30)))
            time.sleep(interval * rng.uniform(0.5, 1.5))

    sender = threading.Thread(target=send_flood, daemon=True)
    try:
        sender.start()
        for i in range(int(seconds * normal_rate)):
            name = f"normal-{i}"
            # arylctl's own client, with its own retries: it must be answered every time.
            normal_acks[name] = normal.submit_job(chaos_job(name), idempotency_key=f"key-{name}").job_id
            time.sleep(1.0 / normal_rate)
        sender.join(timeout=seconds * 10 + 60)
        assert not sender.is_alive()
        heard: dict[str, int] = {}
        acknowledged = dict(normal_acks)
        for name, call in flood_calls:
            try:
                acknowledged[name] = call.result().job.job_id
                heard["OK"] = heard.get("OK", 0) + 1
            except grpc.RpcError as exc:
                heard[exc.code().name] = heard.get(exc.code().name, 0) + 1
                assert exc.code().name in RETRYABLE_REFUSALS, (exc.code(), exc.details())
        print(f"flood of {len(flood_calls)} heard: {heard}; normal client: {len(normal_acks)} answered")
        assert serving(cluster.address)
        check_invariants(cluster.url, acknowledged.values(),
                         submitted_names=[n for n, _ in flood_calls] + list(normal_acks))
        wait_workers_match(cluster.url, cluster.marker, timeout=CATCH_UP_S)
    finally:
        stop.set()
        normal.close()
        flood_channel.close()


def test_idle_watch_streams_up_to_the_limit_leave_submits_and_health_alone(
    inprocess_cluster: InProcessCluster, rng: random.Random,
) -> None:
    streams = scaled(200, 2000)
    per_channel = 100  # HTTP/2 streams per connection, well under any server's limit
    cluster = inprocess_cluster
    cluster.start(agents=1, gpus=4, server={"max_watch_streams": streams, "max_watch_streams_per_client": streams,
                                            "max_concurrent_streams": streams + 200})
    channels = [secure_channel(cluster.address) for _ in range((streams + per_channel - 1) // per_channel)]
    calls: list[grpc.Call] = []
    client = RetryingClient(cluster.address)
    acknowledged: list[str] = []
    names: list[str] = []
    try:
        names.append("before-watch")  # so that the event log is not empty (the probe replays it)
        acknowledged.append(client.submit(chaos_job("before-watch"), "key-before-watch"))
        def idle(i: int) -> grpc.Call:
            stub = scheduler_pb2_grpc.SchedulerServiceStub(channels[i // per_channel])
            return stub.WatchEvents(scheduler_pb2.WatchEventsRequest())  # opened, never read: idle

        calls.extend(idle(i) for i in range(streams))

        def refused_beyond_the_limit() -> bool:
            # A probe replaying the log from the start: admitted, it hears the first event at once.
            extra = scheduler_pb2_grpc.SchedulerServiceStub(channels[0]).WatchEvents(
                scheduler_pb2.WatchEventsRequest(after_event_id=0), timeout=30)
            try:
                next(extra)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    return True
                raise
            extra.cancel()  # admitted: the idle streams are not all open yet
            return False

        # Every idle stream is open once one more is refused for the limit (admission is counted per stream).
        # A probe admitted while idle streams were still arriving held a slot: an idle stream refused then
        # (ended, RESOURCE_EXHAUSTED) is opened again, so the idle ones do fill the limit.
        for _ in range(600):
            calls[:] = [call if call.is_active() else idle(i) for i, call in enumerate(calls)]
            if refused_beyond_the_limit():
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"{streams} idle streams never filled the limit of {streams}")

        for i in range(scaled(20, 200)):
            name = f"while-watched-{i}"
            names.append(name)
            acknowledged.append(client.submit(chaos_job(name, gpus=rng.choice((1, 2))), f"key-{name}"))
        assert health(cluster.address) == health_pb2.HealthCheckResponse.SERVING
        check_invariants(cluster.url, acknowledged, submitted_names=names)
        wait_workers_match(cluster.url, cluster.marker, timeout=CATCH_UP_S)

        for call in calls:
            call.cancel()
        calls.clear()
        # The slots are given back: a new stream is admitted (and hears a new job's event).
        for _ in range(600):
            if not refused_beyond_the_limit():
                break
            time.sleep(0.1)
        else:
            raise AssertionError("streams that ended still count against the limit")
    finally:
        for call in calls:
            call.cancel()
        client.close()
        with futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda c: c.close(), channels))
