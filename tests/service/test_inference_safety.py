"""Inference safety (issue 18, part 4), over real gRPC on SQLite and PostgreSQL: an inference endpoint
must match ``inference.endpoint_allow`` (by default the registering agent's own address); demand is
kept per router, a router's report expires after ``inference.demand_ttl_s`` and several fresh
routers' reports combine (max); ``servers_needed`` above the inference pool's size is refused; with
two routers a DRAINING server is loaned only once both acknowledged it.

Routers are told apart by their authenticated identity: ``router:r1`` (its own token and a
certificate naming it) and the test admin, whose requests name the router they act as (``r2``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from aryl_common import security
from aryl_common.security import ClientSecurity
from protos.aryl.v1 import agent_pb2, inference_pb2, inference_pb2_grpc, scheduler_pb2, types_pb2
from scheduler_service.api.agent_validation import allowed_endpoint, peer_host
from scheduler_service.errors import PermissionDenied
from scheduler_service.lifecycle import Pool
from scheduler_service.records import ServerRegistration
from tests.harness import details_of, job_spec, pki, register_fake_server, scheduler_stub, secure_channel
from tests.helpers import wait_for

S = types_pb2
ACK_ONLY = {"loan_idle_s": 0, "drain_timeout_s": 3600, "min_loan_s": 0, "loan_buffer_servers": 0}


def router_stub(address: str, router: str = "") -> tuple[grpc.Channel, inference_pb2_grpc.InferenceServiceStub]:
    """An InferenceService stub as router ``router`` (its token and a certificate naming it), or as the
    test admin (whose requests name the router: ``source``)."""
    if not router:
        channel = secure_channel(address)
    else:
        ca = pki()
        cert, key = ca.agent_cert(router)
        credentials = ClientSecurity(ca_file=ca.path("ca.crt"), cert_file=cert, key_file=key,
                                     token=ca.token(f"router:{router}"))
        channel = security.secure_channel(address, credentials, [])
    return channel, inference_pb2_grpc.InferenceServiceStub(channel)


def register(address: str, hostname: str, endpoint: str) -> None:
    register_fake_server(address, hostname, "inference", gpus=1, inference_endpoint=endpoint, converge=True)


def refused(call, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call()
    assert err.value.code() == code, err.value.details()
    return details_of(err.value)


def registration(endpoint: str, hostname: str = "inf-1", agent_address: str = "") -> ServerRegistration:
    return ServerRegistration(hostname=hostname, pool=Pool.INFERENCE, gpus=(), agent_address=agent_address or hostname,
                              agent_version="", logs_address="", inference_endpoint=endpoint)


def test_the_allow_list_matches_cidrs_and_name_patterns_and_never_resolves_names() -> None:
    allow = ["10.0.0.0/8", "fd00::/8", "*.svc.local"]
    for endpoint in ("http://10.1.2.3:8000", "https://[fd00::7]:443/v1", "http://Model-A.SVC.local:80", ""):
        allowed_endpoint(registration(endpoint), allow)
    for endpoint in ("http://11.0.0.1:8000", "http://10.0.0.1.evil.com", "http://svc.local.evil.com:1",
                     "http://127.0.0.1:9"):
        with pytest.raises(PermissionDenied, match=r"matches none of inference\.endpoint_allow"):
            allowed_endpoint(registration(endpoint), allow)
    # No list: the agent's own name, address, or the address it connects from only.
    allowed_endpoint(registration("http://inf-1:8000"), [])
    allowed_endpoint(registration("http://10.0.0.7:8000", agent_address="10.0.0.7"), [])
    allowed_endpoint(registration("http://192.168.1.5:8000"), [], "ipv4:192.168.1.5:40000")
    allowed_endpoint(registration("http://[::1]:8000"), [], "ipv6:[::1]:40000")
    with pytest.raises(PermissionDenied, match=r"host 'attacker.example' is not this server's own address"):
        allowed_endpoint(registration("http://attacker.example:8000"), [], "ipv4:192.168.1.5:40000")
    assert peer_host("unix:/tmp/x") == ""


def test_an_endpoint_outside_the_allow_list_is_refused(scheduler_factory) -> None:
    default = scheduler_factory()
    # The attack: a registration pointing the routers at someone else's host.
    details = refused(lambda: register(default.address, "inf-evil", "http://attacker.example:8000/"),
                      grpc.StatusCode.PERMISSION_DENIED)
    assert "not this server's own address" in details and "inference.endpoint_allow" in details
    register(default.address, "inf-own", "http://127.0.0.1:9001")  # where it connects from: allowed
    register(default.address, "inf-name", "http://inf-name:9001")  # its own name: allowed
    default.stop()  # one scheduler at a time on the database (the next one leads at once)

    listed = scheduler_factory(inference={"endpoint_allow": ["10.0.0.0/8", "*.svc.local"]})
    register(listed.address, "inf-a", "http://10.20.30.40:8000")
    register(listed.address, "inf-b", "http://model.svc.local:8000")
    for endpoint in ("http://127.0.0.1:9001", "http://model.svc.local.evil.com:8000"):
        details = refused(lambda e=endpoint: register(listed.address, "inf-c", e), grpc.StatusCode.PERMISSION_DENIED)
        assert "matches none of inference.endpoint_allow (10.0.0.0/8, *.svc.local)" in details
    channel, stub = scheduler_stub(listed.address)
    try:
        names = {s.server_id for s in stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers}
        assert {"inf-a", "inf-b"} <= names and not {"inf-c", "inf-evil"} & names  # refused: nothing kept
    finally:
        channel.close()


def test_demand_outside_zero_to_the_pool_size_is_refused(scheduler) -> None:
    register(scheduler.address, "inf-1", "http://127.0.0.1:9001")
    register(scheduler.address, "inf-2", "http://127.0.0.1:9002")
    register_fake_server(scheduler.address, "gpu-1", "training", gpus=4)  # training servers do not count
    channel, stub = router_stub(scheduler.address, "r1")
    try:
        for needed in (3, 100_000, 2**32 - 1):
            details = refused(lambda n=needed: stub.ReportDemand(
                inference_pb2.ReportDemandRequest(servers_needed=n), timeout=5), grpc.StatusCode.INVALID_ARGUMENT)
            assert f"servers_needed: must be between 0 and the inference pool's size, 2 registered server(s) " \
                   f"(got {needed})" in details
        for needed in (2, 0):
            answer = stub.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=needed), timeout=5)
            assert answer.demand.servers_needed == needed and answer.demand.source == "r1"
    finally:
        channel.close()


def test_a_routers_demand_expires_and_fresh_routers_combine(scheduler_factory) -> None:
    scheduler = scheduler_factory(inference={"demand_ttl_s": 1.5})
    for name in ("inf-1", "inf-2", "inf-3"):
        register(scheduler.address, name, "http://127.0.0.1:9001")
    c1, r1 = router_stub(scheduler.address, "r1")
    c2, admin = router_stub(scheduler.address)
    try:
        def demand() -> tuple[int, str]:
            d = r1.GetDemand(inference_pb2.GetDemandRequest(), timeout=5).demand
            return d.servers_needed, d.source

        # A spoofed source field changes nothing: the router is its authenticated identity.
        r1.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=3, source="r2"), timeout=5)
        assert demand() == (3, "r1")
        admin.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=1, source="r2"), timeout=5)
        assert demand() == (3, "r1,r2")  # the largest fresh report counts
        time.sleep(0.8)
        admin.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=1, source="r2"), timeout=5)
        # r1 goes quiet: its report stops counting once older than the TTL; admin's fresh one remains.
        assert wait_for(lambda: demand() == (1, "r2"), timeout=5, interval=0.1,
                        what="r1's demand to expire")
        # And with no fresh report at all there is no demand (as before any report).
        assert wait_for(lambda: demand() == (0, ""), timeout=5, interval=0.1, what="all demand to expire")
    finally:
        c1.close()
        c2.close()


def server_events(stub, server_id: str) -> list[types_pb2.Event]:
    """The server's events so far (a replayed watch, read until it has been quiet for a second)."""
    events: list[types_pb2.Event] = []
    call = stub.WatchEvents(scheduler_pb2.WatchEventsRequest(server_id=server_id, after_event_id=0), timeout=1)
    try:
        events.extend(call)
    except grpc.RpcError as exc:
        assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
    return events


def test_with_two_routers_a_server_is_loaned_only_after_both_acknowledge(scheduler_factory) -> None:
    scheduler = scheduler_factory(policy=ACK_ONLY, inference={"demand_ttl_s": 600})
    register(scheduler.address, "inf-1", "http://127.0.0.1:9001")
    register(scheduler.address, "inf-2", "http://127.0.0.1:9002")
    c1, r1 = router_stub(scheduler.address, "r1")
    c2, admin = router_stub(scheduler.address)
    channel, stub = scheduler_stub(scheduler.address)
    try:
        def servers() -> dict[str, int]:
            listed = stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
            return {s.server_id: s.state for s in listed}

        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("waiting")), timeout=5)
        r1.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=1), timeout=5)
        admin.ReportDemand(inference_pb2.ReportDemandRequest(servers_needed=1, source="r2"), timeout=5)
        draining = wait_for(lambda: [sid for sid, st in servers().items() if st == S.SERVER_STATE_DRAINING],
                            timeout=15, what="a DRAINING server")
        (server_id,) = draining

        answer = r1.ReportDrained(inference_pb2.ReportDrainedRequest(server_id=server_id), timeout=5)
        assert answer.state == S.SERVER_STATE_DRAINING
        r1.ReportDrained(inference_pb2.ReportDrainedRequest(server_id=server_id), timeout=5)  # a repeat counts once
        time.sleep(1.5)  # several scheduling cycles (0.2 s): one router's word is not enough
        assert servers()[server_id] == S.SERVER_STATE_DRAINING
        drained = [e for e in server_events(stub, server_id) if e.kind == S.EVENT_KIND_SERVER_DRAINED]
        assert [(e.reason, e.details["router"]) for e in drained] == [("ACKNOWLEDGED", "r1")]
        assert "waiting for r2" in drained[0].message

        admin.ReportDrained(inference_pb2.ReportDrainedRequest(server_id=server_id, source="r2"), timeout=5)
        wait_for(lambda: servers()[server_id] == S.SERVER_STATE_LOANED, timeout=15, what="the server loaned")
    finally:
        for c in (c1, c2, channel):
            c.close()


def test_an_agent_cannot_register_an_endpoint_for_another_server(scheduler) -> None:
    """The endpoint comes from the server's own authenticated agent: gpu-1's agent cannot register (or
    re-point) server inf-1."""
    ca = pki()
    cert, key = ca.agent_cert("gpu-1")
    credentials = ClientSecurity(ca_file=ca.path("ca.crt"), cert_file=cert, key_file=key,
                                 token=ca.token("agent:gpu-1"))
    with security.secure_channel(scheduler.address, credentials, []) as channel:
        from protos.aryl.v1 import agent_pb2_grpc

        agent = agent_pb2_grpc.AgentServiceStub(channel)
        request = agent_pb2.RegisterServerRequest(
            hostname="inf-1", pool=S.POOL_INFERENCE, agent_address="inf-1", inference_endpoint="http://inf-1:80",
            gpus=[agent_pb2.GpuInfo(index=0, uuid="GPU-x", model="m", memory_total_bytes=1)],
        )
        details = refused(lambda: agent.RegisterServer(request, timeout=5), grpc.StatusCode.PERMISSION_DENIED)
        assert "may only act for its own server" in details


def test_a_router_asking_more_than_the_pool_reports_the_pools_size(scheduler, tmp_path) -> None:
    """A real aryl-router with static demand 3 and an inference pool of 2: refused, it reports 2 (its
    report does not go stale while it asks the impossible)."""
    register(scheduler.address, "inf-1", "http://127.0.0.1:9001")
    register(scheduler.address, "inf-2", "http://127.0.0.1:9002")
    router = Path(sys.executable).with_name("aryl-router")
    args = [str(router), "--listen", "127.0.0.1:0", "--scheduler", scheduler.address, "--servers-needed", "3",
            "--source", "edge-test", "--interval", "0.2"]
    with (tmp_path / "router.log").open("ab") as log:
        process = subprocess.Popen(args, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    channel, stub = router_stub(scheduler.address)
    try:
        def reported() -> bool:
            assert process.poll() is None, (tmp_path / "router.log").read_text()
            demand = stub.GetDemand(inference_pb2.GetDemandRequest(), timeout=5).demand
            return (demand.servers_needed, demand.source) == (2, "edge-test")

        wait_for(reported, timeout=30, what="the router's capped demand")
        assert "demand above the inference pool's size" in (tmp_path / "router.log").read_text()
    finally:
        process.terminate()
        process.wait(timeout=15)
        channel.close()
