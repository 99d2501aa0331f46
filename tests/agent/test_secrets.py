"""Secrets referenced by name (``aryl-secret:NAME``) and resolved by the agent from its secrets file
(node_agent/secrets.py, docs/security.md): the worker gets the value, the scheduler only ever holds the
reference, and a missing secret refuses the worker without printing any value."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from node_agent import secrets
from node_agent.config import AgentSection
from node_agent.desired import DesiredStateTracker
from node_agent.identity import Refused
from node_agent.supervisor import Supervisor
from node_agent.workers import Phase, WorkerId, WorkerView
from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.harness import AS_ITSELF, desired_state, desired_worker, job_spec, secure_channel
from tests.helpers import wait_for


def secrets_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "secrets"
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_references_are_replaced_and_other_values_kept(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, "# team tokens\nhf-team=hf_value=with=equals\nwandb=w1\n")
    env = {"HF_TOKEN": "aryl-secret:hf-team", "WANDB_API_KEY": "aryl-secret:wandb", "PLAIN": "aryl-secretish"}
    assert secrets.resolve(env, str(path)) == {"HF_TOKEN": "hf_value=with=equals", "WANDB_API_KEY": "w1",
                                               "PLAIN": "aryl-secretish"}
    assert secrets.resolve({"A": "1"}, "") == {"A": "1"}  # no reference: no file needed


def test_a_missing_secret_or_file_refuses_without_printing_values(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, "wandb=w1-secret-value\n")
    with pytest.raises(Refused, match=r"secret\(s\) hf-team not found .* referenced by HF_TOKEN") as info:
        secrets.resolve({"HF_TOKEN": "aryl-secret:hf-team", "W": "aryl-secret:wandb"}, str(path))
    assert "w1-secret-value" not in str(info.value)
    with pytest.raises(Refused, match=r"references secrets \(hf-team\) and this server has no secrets file"):
        secrets.resolve({"HF_TOKEN": "aryl-secret:hf-team"}, "")
    bad = secrets_file(tmp_path, "not a line with a name\n")
    with pytest.raises(Refused, match=r"secrets:1: expected NAME=VALUE"):
        secrets.resolve({"HF_TOKEN": "aryl-secret:x"}, str(bad))


def test_the_worker_gets_the_value_and_a_missing_secret_fails_its_start(tmp_path: Path) -> None:
    path = secrets_file(tmp_path, "hf-team=hf_from_the_agent\n")
    out = tmp_path / "seen"
    config = AgentSection(hostname="s-node", work_dir=str(tmp_path / "agent"), stop_grace_s=5.0,
                          reconcile_interval_s=0.05, secrets_file=str(path), insecure=True)
    tracker = DesiredStateTracker()
    supervisor = Supervisor(config, tracker, users=AS_ITSELF)
    supervisor.start()

    def view(job: str) -> WorkerView | None:
        return next((v for v in supervisor.statuses() if v.id == WorkerId(job, 0, 1)), None)

    try:
        command = [sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(os.environ['HF_TOKEN'])"]
        good = desired_worker(command, job="job-ok", env={"HF_TOKEN": "aryl-secret:hf-team"})
        missing = desired_worker(["true"], job="job-missing", env={"HF_TOKEN": "aryl-secret:nope"}, gpus=(1,))
        assert tracker.offer(desired_state(1, good, missing, server_id="s-node")).accepted
        supervisor.wake()
        wait_for(lambda: (v := view("job-ok")) is not None and v.phase is Phase.EXITED, timeout=20,
                 what="the worker to exit")
        assert out.read_text() == "hf_from_the_agent"
        refused = wait_for(lambda: (v := view("job-missing")) is not None and v.phase is Phase.EXITED and v,
                           timeout=20, what="the refused worker")
        assert refused.cannot_start and "secret(s) nope not found" in refused.message
    finally:
        supervisor.close(stop_workers=True)


def test_the_scheduler_holds_only_the_reference(scheduler) -> None:
    spec = job_spec("uses-secret", env={"HF_TOKEN": "aryl-secret:hf-team"})
    with secure_channel(scheduler.address) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job
        got = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job
    assert got.spec.env["HF_TOKEN"] == "aryl-secret:hf-team"
