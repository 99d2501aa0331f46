"""GetJobLogs end to end over real gRPC: client -> scheduler -> a real agent WorkerLogService -> the
log file on disk, on both databases. The server is registered by the test (as an agent would, with
its logs address); the log is written by the test where the agent's layout puts a worker's output.

What is checked here is how the agent's answers reach users: an offset past the end of the log is
OUT_OF_RANGE all the way to the client (typed, with a BadRequest naming ``offset`` and a message that
names the server), not UNAVAILABLE; arylctl reports it with exit code 1.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from arylctl.cli import main as arylctl
from arylctl.client import ArylClient, OutOfRange
from node_agent.config import AgentSection
from node_agent.logs import serve_worker_logs
from node_agent.workers import WorkDir
from protos.aryl.v1 import scheduler_pb2, types_pb2
from tests.harness import as_call, daemon_security, job_spec, register_fake_server, scheduler_stub
from tests.helpers import wait_for

SERVER = "gpu-logs"
LOG = b"step 1\nstep 2\n"


class LoggedJob:
    """A running job whose rank 0 wrote ``LOG`` to ``log``, on a server whose agent serves its logs."""

    def __init__(self, address: str, job_id: str, log: Path) -> None:
        self.address = address
        self.job_id = job_id
        self.log = log


@pytest.fixture
def logged_job(scheduler, tmp_path: Path) -> Iterator[LoggedJob]:
    layout = WorkDir(tmp_path / "agent", tmp_path / "checkpoints")
    agent_logs, port = serve_worker_logs(layout, SERVER, "127.0.0.1", 0, tls=AgentSection(**daemon_security(SERVER)))
    channel, stub = scheduler_stub(scheduler.address)
    try:
        register_fake_server(scheduler.address, SERVER, gpus=2, logs_address=f"127.0.0.1:{port}")
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("logs")), timeout=5).job.job_id
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5).job.state
                 == types_pb2.JOB_STATE_RUNNING, timeout=20, what=f"job {job_id} running")
        log = layout.log_file(job_id, 0)
        log.parent.mkdir(parents=True)
        log.write_bytes(LOG)
        yield LoggedJob(scheduler.address, job_id, log)
    finally:
        channel.close()
        agent_logs.stop(grace=0)


def test_an_offset_past_the_end_of_the_log_reaches_the_client_as_out_of_range(logged_job: LoggedJob) -> None:
    with ArylClient(logged_job.address, timeout=5) as client:
        chunk = client.read_job_log(logged_job.job_id)
        assert (chunk.data, chunk.server_id, chunk.size) == (LOG, SERVER, len(LOG))
        assert client.read_job_log(logged_job.job_id, offset=len(LOG)).data == b""  # at the end: nothing yet

        with pytest.raises(OutOfRange) as past_end:
            client.read_job_log(logged_job.job_id, offset=len(LOG) + 5)
        error = past_end.value
        assert error.code == grpc.StatusCode.OUT_OF_RANGE and error.from_scheduler
        assert SERVER in error.message and "past the end of the log" in error.message
        assert f"({len(LOG)} bytes)" in error.message  # the agent's size of the log, relayed

        # A valid request that may succeed later: once the log has grown, the same read works.
        with logged_job.log.open("ab") as log:
            log.write(b"step 3 and more\n")
        assert client.read_job_log(logged_job.job_id, offset=len(LOG) + 5).data == b"3 and more\n"


def test_out_of_range_carries_a_bad_request_naming_the_offset(logged_job: LoggedJob) -> None:
    channel, stub = scheduler_stub(logged_job.address)
    try:
        with pytest.raises(grpc.RpcError) as past_end:
            stub.GetJobLogs(scheduler_pb2.GetJobLogsRequest(job_id=logged_job.job_id, offset=1000), timeout=5)
    finally:
        channel.close()
    assert past_end.value.code() == grpc.StatusCode.OUT_OF_RANGE
    status = rpc_status.from_call(as_call(past_end.value))  # raises if the details' code is not OUT_OF_RANGE
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    assert [v.field for v in bad_request.field_violations] == ["offset"]


def test_arylctl_exits_1_with_a_hint_when_the_log_it_follows_becomes_shorter(logged_job: LoggedJob) -> None:
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []
    follow = threading.Thread(target=lambda: codes.append(arylctl(
        ["--server", logged_job.address, "logs", logged_job.job_id, "--follow", "--poll", "0.05"],
        stdout=out, stderr=err)))
    follow.start()
    try:
        wait_for(lambda: out.getvalue() == LOG.decode(), what="arylctl to print the log")
    finally:
        logged_job.log.write_bytes(b"")  # arylctl's next read is now past the end (and ends the command)
        follow.join(timeout=20)
    assert not follow.is_alive() and codes == [1], err.getvalue()
    assert err.getvalue().startswith("error: ") and "(OUT_OF_RANGE)" in err.getvalue()
    assert SERVER in err.getvalue() and "hint: " in err.getvalue() and "Traceback" not in err.getvalue()
