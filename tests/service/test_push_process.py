"""The agents' desired-state streams in a process of their own (``scheduler_service.push_process``, issue 35
item 2), on SQLite and PostgreSQL, with TLS and identities as in production:

- ``RegisterServer`` names the push process's port; a stream there gets the current state at once, then every
  decision, in generation order (a placement, then its cancellation).
- The scheduler still serves the stream itself, for agents that do not know the port.
- Only a server's own agent may watch it there too.
- A push process that dies is started again on the same port; a stream that ended with it is watched again
  and gets the current state, so no decision is lost.
- The push process ends when its scheduler stops.
- On PostgreSQL a standby's push process serves the streams too, following the leader's commits on the change
  feed (LISTEN/NOTIFY), and goes on serving them when it takes over.
- A real ``aryl-agent`` watches its desired state there (the port its registration named) and starts a job
  pushed that way; when the push process dies it watches the one started again, without registering again.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from aryl_common import security
from aryl_common.channels import DESIRED_STATE_PORT_KEY
from aryl_common.security import ClientSecurity
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, types_pb2
from scheduler_service.server import ServerHandle, serve_in_background
from tests.fixtures.cluster import Cluster, end_leftovers
from tests.harness import (
    job_spec,
    pki,
    register_fake_server,
    scheduler_config,
    scheduler_stub,
)
from tests.helpers import scaled_timeout, wait_for


@pytest.fixture
def scheduler(database_url: str) -> Iterator[ServerHandle]:
    handle = serve_in_background(scheduler_config(database_url, server={"desired_state_port": 0}))
    try:
        yield handle
    finally:
        handle.stop()


def _agent_channel(address: str, server_id: str, *, principal: str | None = None) -> grpc.Channel:
    """A channel as ``server_id``'s agent (its own certificate; its token unless ``principal`` names another)."""
    ca = pki()
    cert, key = ca.agent_cert(server_id)
    credentials = ClientSecurity(ca_file=ca.path("ca.crt"), cert_file=cert, key_file=key,
                                 token=ca.token(principal or f"agent:{server_id}"))
    return security.secure_channel(address, credentials, [])


def _push_port(address: str, hostname: str) -> int:
    """Register ``hostname`` as its agent would; the port RegisterServer named in its initial metadata."""
    with _agent_channel(address, hostname) as channel:
        stub = agent_pb2_grpc.AgentServiceStub(channel)
        _, call = stub.RegisterServer.with_call(agent_pb2.RegisterServerRequest(
            hostname=hostname, pool=types_pb2.POOL_TRAINING, agent_address=hostname, agent_version="test",
            gpus=[agent_pb2.GpuInfo(index=i, uuid=f"GPU-{hostname}-{i}", model="Fake-GPU",
                                    memory_total_bytes=80 << 30) for i in range(4)],
        ), timeout=scaled_timeout(10))
        return int(dict(call.initial_metadata())[DESIRED_STATE_PORT_KEY])


class _Watch:
    """A WatchDesiredState stream read on a thread: every state on ``states``, then its end (an RpcError or None)."""

    def __init__(self, address: str, server_id: str, *, principal: str | None = None) -> None:
        self.states: queue.Queue[Any] = queue.Queue()
        self._channel = _agent_channel(address, server_id, principal=principal)
        stub = agent_pb2_grpc.AgentServiceStub(self._channel)
        self._call = stub.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=server_id))
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for state in self._call:
                self.states.put(state)
            self.states.put(None)
        except grpc.RpcError as exc:
            self.states.put(exc)

    def next(self, timeout: float = 30.0) -> Any:
        return self.states.get(timeout=scaled_timeout(timeout))

    def until(self, predicate: Any, timeout: float = 30.0) -> agent_pb2.DesiredState:
        deadline = time.monotonic() + scaled_timeout(timeout)
        while True:
            got = self.states.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(got, grpc.RpcError) or got is None:
                raise AssertionError(f"the stream ended: {got}")
            if predicate(got):
                return got

    def close(self) -> None:
        self._call.cancel()
        self._channel.close()


def _jobs(state: agent_pb2.DesiredState) -> set[str]:
    return {w.job_id for w in state.workers}


def test_the_push_process_streams_every_decision_in_order(scheduler: ServerHandle) -> None:
    port = _push_port(scheduler.address, "gpu-1")
    host = scheduler.address.rpartition(":")[0]
    assert port != int(scheduler.address.rpartition(":")[2])
    there, here = _Watch(f"{host}:{port}", "gpu-1"), _Watch(scheduler.address, "gpu-1")
    try:
        first = there.next()
        assert first.server_id == "gpu-1" and not first.workers and first.scheduler_epoch >= 1
        assert here.next().generation == first.generation  # the scheduler serves the stream too
        channel, stub = scheduler_stub(scheduler.address)
        with channel:
            job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("pushed", gpus=4)),
                                    timeout=scaled_timeout(10)).job.job_id
            placed = there.until(lambda s: job_id in _jobs(s))
            assert placed.generation > first.generation and placed.scheduler_epoch == first.scheduler_epoch
            assert here.until(lambda s: job_id in _jobs(s)).generation == placed.generation
            stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id), timeout=scaled_timeout(10))
            released = there.until(lambda s: job_id not in _jobs(s))
            assert released.generation > placed.generation
    finally:
        there.close()
        here.close()


def test_only_its_own_agent_watches_a_server_there(scheduler: ServerHandle) -> None:
    port = _push_port(scheduler.address, "gpu-1")
    register_fake_server(scheduler.address, "gpu-2")
    host = scheduler.address.rpartition(":")[0]
    other = _Watch(f"{host}:{port}", "gpu-1", principal="agent:gpu-2")  # gpu-1's certificate, gpu-2's token
    try:
        ended = other.next()
        assert isinstance(ended, grpc.RpcError) and ended.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        other.close()
    channel = _agent_channel(f"{host}:{port}", "gpu-1")
    with channel:  # it serves the stream alone: an agent registers and reports to the scheduler
        with pytest.raises(grpc.RpcError) as refused:
            agent_pb2_grpc.AgentServiceStub(channel).ReportStatus(
                agent_pb2.ReportStatusRequest(server_id="gpu-1"), timeout=scaled_timeout(10))
        assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_push_process_that_dies_is_started_again_and_nothing_is_lost(scheduler: ServerHandle) -> None:
    port = _push_port(scheduler.address, "gpu-1")
    host = scheduler.address.rpartition(":")[0]
    push = scheduler.service.push_process
    assert push is not None and push.pid is not None
    watch = _Watch(f"{host}:{port}", "gpu-1")
    channel, stub = scheduler_stub(scheduler.address)
    try:
        watch.next()
        dead = push.pid
        os.kill(dead, signal.SIGKILL)
        ended = watch.next()
        assert isinstance(ended, grpc.RpcError) or ended is None
        # A decision while no push process serves: not lost, the next stream starts with it.
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("meanwhile", gpus=4)),
                                timeout=scaled_timeout(10)).job.job_id
        wait_for(lambda: push.port == port and push.pid != dead, timeout=60, what="the push process started again")
        again = _Watch(f"{host}:{port}", "gpu-1")
        try:
            assert job_id in _jobs(again.until(lambda s: job_id in _jobs(s)))
        finally:
            again.close()
    finally:
        watch.close()
        channel.close()


def test_the_push_process_ends_with_its_scheduler(database_url: str) -> None:
    handle = serve_in_background(scheduler_config(database_url, server={"desired_state_port": 0}))
    push = handle.service.push_process
    assert push is not None and push.pid is not None
    pid = push.pid
    handle.stop()

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(gone, timeout=30, what="the push process ended")



WATCHING_THERE = re.compile(r"watching the desired state on the scheduler's desired-state streams' process.*port=(\d+)")


@pytest.mark.postgres
def test_a_real_agent_watches_there_and_a_job_starts_through_it(tmp_path: Path, postgres_url: str) -> None:
    cluster = Cluster(tmp_path, postgres_url)
    try:
        cluster.start_scheduler(server={"desired_state_port": 0})
        push = cluster.scheduler.service.push_process
        assert push is not None and push.port is not None
        port, first_pid = push.port, push.pid
        cluster.start_agent("node-a")
        log = tmp_path / "node-a.log"

        def watching_there() -> list[int]:
            return [int(p) for p in WATCHING_THERE.findall(log.read_text(errors="replace"))]

        wait_for(watching_there, timeout=60, what="the agent watching on the push process's port")
        assert watching_there() == [port]
        job_id = cluster.submit("pushed", "--total-steps", "3", "--step-time", "0.1")
        cluster.wait_job(job_id, lambda j: j.state == types_pb2.JOB_STATE_COMPLETED, "completed")

        # The push process dies; the agent watches the one started on the same port, and a job starts through it.
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        wait_for(lambda: push.port == port and push.pid != first_pid, timeout=60,
                 what="the push process started again")
        wait_for(lambda: len(watching_there()) == 2, timeout=60, what="the agent watching there again")
        assert watching_there() == [port, port]
        again = cluster.submit("pushed-again", "--total-steps", "3", "--step-time", "0.1")
        cluster.wait_job(again, lambda j: j.state == types_pb2.JOB_STATE_COMPLETED, "completed")
        text = log.read_text(errors="replace")
        assert text.count("registered with the scheduler") == 1, text[-3000:]  # its one session: pushed there
        assert "watching the scheduler itself" not in text, text[-3000:]
    finally:
        cluster.close()
        end_leftovers(tmp_path)


@pytest.mark.postgres
def test_a_standby_s_push_process_serves_the_leader_s_decisions(postgres_url: str) -> None:
    config = scheduler_config(postgres_url, server={"desired_state_port": 0}, ha={"lease_s": 2.0, "renew_s": 0.5})
    leader = serve_in_background(config)
    standby = serve_in_background(config)
    try:
        assert leader.service.leadership is not None and standby.service.leadership is not None
        assert leader.service.leadership.leading and not standby.service.leadership.leading
        push = standby.service.push_process
        assert push is not None and push.port is not None
        _push_port(leader.address, "gpu-1")
        watch = _Watch(f"{standby.address.rpartition(':')[0]}:{push.port}", "gpu-1")
        channel, stub = scheduler_stub(leader.address)
        try:
            first = watch.next()
            assert first.server_id == "gpu-1" and first.scheduler_epoch == leader.service.leadership.epoch
            with channel:
                job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("noticed", gpus=4)),
                                        timeout=scaled_timeout(10)).job.job_id
                placed = watch.until(lambda s: job_id in _jobs(s))
                assert placed.generation > first.generation and placed.scheduler_epoch == first.scheduler_epoch
            # The leader stops; the standby leads, and the stream it served goes on with its own decisions.
            leader.stop()
            wait_for(lambda: standby.service.leadership is not None and standby.service.leadership.leading,
                     timeout=30, what="the standby to lead")
            channel, stub = scheduler_stub(standby.address)
            with channel:
                stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id), timeout=scaled_timeout(10))
                released = watch.until(lambda s: job_id not in _jobs(s))
            assert released.generation > placed.generation and released.scheduler_epoch > placed.scheduler_epoch
        finally:
            watch.close()
    finally:
        standby.stop()
        leader.stop()
