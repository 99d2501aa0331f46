"""Two small contracts from issues 19 and 21, each against a real scheduler over gRPC.

- The character rule (``scheduler_service.api.validation``): control characters (C0, DEL, C1) and
  Unicode bidirectional overrides/isolates are refused, by field name, in a job's name, user,
  queue and environment variable names; command arguments and environment values may hold tab,
  newline and carriage return but nothing else from that set.
- ``aryl-agent --advertise-address``: the address the scheduler and other servers' workers use to
  reach the agent, independent of ``--hostname`` (its server id).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest

from protos.aryl.v1 import scheduler_pb2, types_pb2
from tests.fixtures.daemons import console_script, running_daemon
from tests.harness import details_of, job_spec, scheduler_stub
from tests.helpers import wait_for

# Each is refused in names; the last four are the bidi controls ("Trojan Source").
REFUSED = {
    "ESC": "\x1b",
    "BEL": "\x07",
    "DEL": "\x7f",
    "C1 CSI": "\x9b",
    "C1 NEL": "\x85",
    "RLO U+202E": "\u202e",
    "LRE U+202A": "\u202a",
    "LRI U+2066": "\u2066",
    "PDI U+2069": "\u2069",
}


@pytest.fixture
def stub(scheduler):
    channel, stub = scheduler_stub(scheduler.address)
    yield stub
    channel.close()


def spec_with(*, command: list[str] | None = None, env: dict[str, str] | None = None,
              **fields: Any) -> types_pb2.JobSpec:
    """``tests.harness.job_spec`` with these fields replaced."""
    spec = job_spec(**fields)
    if command is not None:
        del spec.command[:]
        spec.command.extend(command)
    spec.env.update(env or {})
    return spec


def refusal(stub, spec: types_pb2.JobSpec) -> str:
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    return details_of(err.value)


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_control_and_bidi_characters_are_refused_in_names_by_field(stub, what: str) -> None:
    char = REFUSED[what]
    cases = [
        (spec_with(name=f"train{char}[31m-evil"), "spec.name"),
        (spec_with(user=f"ali{char}ce"), "spec.user"),
        (spec_with(queue=f"gpu{char}"), "spec.queue"),
        (spec_with(env={f"A{char}B": "1"}), "spec.env["),
        (spec_with(command=[f"python{char}"]), "spec.command[0]"),
        (spec_with(command=["python", "-c", f"print('x'){char}"]), "spec.command[2]"),
        (spec_with(env={"GREETING": f"hello{char}"}), "spec.env['GREETING']"),
    ]
    for spec, field in cases:
        details = refusal(stub, spec)
        assert details.startswith(field), (what, details)
        assert "control or bidirectional-override" in details, details
        assert f"U+{ord(char):04X}" in details, details
        # The refusal itself is safe to print: it holds none of the refused characters.
        assert not any(c in details for c in REFUSED.values()), ascii(details)
    assert stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=5).jobs == []


def test_whitespace_controls_are_refused_in_names_but_kept_in_commands_and_env_values(stub) -> None:
    for char in "\t\n\r":
        assert refusal(stub, spec_with(name=f"a{char}b")).startswith("spec.name")
        assert refusal(stub, spec_with(env={f"A{char}": "1"})).startswith("spec.env[")
    script = "import os\r\nfor k in ('A', 'B'):\n\tprint(os.environ[k])\n"
    # Right-to-left text itself (and the implicit marks U+200E/U+200F) is not a control: accepted.
    spec = spec_with(name="נתונים\u200f-run", command=["python", "-c", script],
                    env={"PEM": "-----BEGIN-----\nAAAA\n-----END-----\n", "B": "a\tb"})
    job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job
    stored = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id), timeout=5).job.spec
    assert list(stored.command) == ["python", "-c", script]
    assert dict(stored.env) == dict(spec.env)
    assert stored.name == spec.name


def test_agent_advertise_address_is_where_the_scheduler_reads_logs_and_workers_meet(
    scheduler, tmp_path: Path
) -> None:
    # "t1" does not resolve here: reading the worker's log through the scheduler works only if the
    # agent registered its log service (and agent address) on the advertised 127.0.0.1.
    args = [
        console_script("aryl-agent"),
        "--scheduler", scheduler.address,
        "--hostname", "t1",
        "--advertise-address", "127.0.0.1",
        "--pool", "training",
        "--fake-gpus", "1",
        "--work-dir", str(tmp_path / "agent"),
    ]
    channel, stub = scheduler_stub(scheduler.address)
    with channel, running_daemon(args, tmp_path / "agent.log") as check_alive:

        def listed() -> types_pb2.Server | None:
            check_alive()
            servers = stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
            return next((s for s in servers if s.server_id == "t1"), None)

        server = wait_for(listed, timeout=30, what="t1 in ListServers")
        assert server.hostname == "t1"
        assert server.agent_address == "127.0.0.1"

        command = [sys.executable, "-c", "import os; print('MASTER_ADDR=' + os.environ['MASTER_ADDR'])"]
        spec = types_pb2.JobSpec(name="where", user="alice", command=command, gpus_per_worker=1, min_workers=1)
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5).job.job_id

        def finished() -> int | None:
            check_alive()
            state = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5).job.state
            return state if state in (types_pb2.JOB_STATE_COMPLETED, types_pb2.JOB_STATE_FAILED) else None

        assert wait_for(finished, timeout=60, what=f"job {job_id} to finish") == types_pb2.JOB_STATE_COMPLETED
        logs = stub.GetJobLogs(scheduler_pb2.GetJobLogsRequest(job_id=job_id, rank=0), timeout=10)
        assert logs.server_id == "t1"
        # The agent's banner line, then the worker's output.
        assert [line for line in logs.data.decode().splitlines() if "MASTER_ADDR=" in line
                and not line.startswith("=====")] == ["MASTER_ADDR=127.0.0.1"]


@pytest.mark.parametrize("address", ["127.0.0.1:50052", "::1", "t1 ", "_t1"])
def test_an_advertise_address_with_a_port_or_junk_is_a_config_error(address: str) -> None:
    # The agent appends its log port and workers use it as MASTER_ADDR as it stands.
    done = subprocess.run(
        [console_script("aryl-agent"), "--advertise-address", address, "--fake-gpus", "1"],
        capture_output=True, text=True, timeout=30, check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("ARYL_")},
    )
    assert done.returncode == 2, done.stderr
    assert "agent.advertise_address" in done.stderr and "Traceback" not in done.stderr
