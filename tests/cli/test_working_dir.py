"""Where a job's workers start (``spec.working_dir``, ``arylctl submit --chdir``), as a user meets it:
the installed ``arylctl`` (a real process, run from a directory of the test's choosing) against a
real scheduler and a real ``aryl-agent`` daemon with fake GPUs (on PostgreSQL), whose own working
directory is elsewhere, so a worker that ran there would show it; validation and the YAML round trip
without an agent, on SQLite and PostgreSQL.

- ``--chdir DIR`` starts the workers in DIR (a relative script path resolves there); ``arylctl job``
  shows it;
- without it, the directory arylctl ran in is sent as a default (``working_dir_if_exists``) and used;
- a default the server lacks: the worker runs in the agent's directory for the job, and its log says so;
- a required directory the server lacks: the worker does not start, the job FAILS at once (no
  restart, whatever its restart policy) with a reason naming the directory and the server, and the
  agent carries on;
- the field is validated (absolute, bounded, no control characters), each refusal naming it;
- ``arylctl job ID -o yaml`` gives it back to ``submit -f`` unchanged.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import yaml

from arylctl.client import ArylClient
from protos.aryl.v1 import scheduler_pb2, types_pb2
from scheduler_service.server import serve_in_background
from tests.fixtures.cli import ctl
from tests.fixtures.cluster import NODE, Node
from tests.harness import details_of, job_spec, scheduler_config, scheduler_stub

# Prints where it runs; found by a relative path only when it runs in its own directory.
SHOW_CWD = "import os; print('cwd=' + os.getcwd(), flush=True)"


def submitted(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["job_id"]


@pytest.fixture
def node(postgres_url: str, tmp_path: Path) -> Iterator[Node]:
    """A real agent beside a scheduler on PostgreSQL (as test_e2e_workers: real processes on the
    production database; the SQLite store of the field is covered by the tests without an agent)."""
    scheduler = serve_in_background(scheduler_config(postgres_url))
    agent = Node(scheduler.address, tmp_path)
    yield agent
    agent.close()
    scheduler.stop()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project directory with a script, and the submit directory of the tests."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "show_cwd.py").write_text(SHOW_CWD + "\n")
    return proj


# ---------------------------------------------------------------------------------------------
# With an agent


@pytest.mark.postgres
def test_chdir_starts_the_workers_there(node: Node, project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job_id = submitted(ctl(node.address, "-o", "json", "submit", "--name", "chdir", "--chdir", str(project),
                           "--", sys.executable, "show_cwd.py", cwd=elsewhere))
    job = node.finished(job_id)
    assert job.state == types_pb2.JOB_STATE_COMPLETED, (job.message, node.worker_log(job_id))
    assert f"cwd={project}\n" in node.worker_log(job_id)
    assert (job.spec.working_dir, job.spec.working_dir_if_exists) == (str(project), False)
    described = ctl(node.address, "job", job_id, cwd=elsewhere)
    assert described.returncode == 0, described.stderr
    assert re.search(rf"^Working dir:\s+{re.escape(str(project))}$", described.stdout, re.MULTILINE), described.stdout


@pytest.mark.postgres
def test_chdir_takes_a_relative_path_from_the_submit_directory(node: Node, project: Path, tmp_path: Path) -> None:
    job_id = submitted(ctl(node.address, "-o", "json", "submit", "--name", "relative", "--chdir", "proj",
                           "--", sys.executable, "show_cwd.py", cwd=tmp_path))
    assert node.finished(job_id).spec.working_dir == str(project)
    assert f"cwd={project}\n" in node.worker_log(job_id)


@pytest.mark.postgres
def test_without_chdir_the_submit_directory_is_a_default_that_is_used_where_it_exists(
    node: Node, project: Path
) -> None:
    job_id = submitted(ctl(node.address, "-o", "json", "submit", "--name", "here",
                           "--", sys.executable, "show_cwd.py", cwd=project))
    job = node.finished(job_id)
    assert job.state == types_pb2.JOB_STATE_COMPLETED, (job.message, node.worker_log(job_id))
    assert (job.spec.working_dir, job.spec.working_dir_if_exists) == (str(project), True)
    assert f"cwd={project}\n" in node.worker_log(job_id)
    described = ctl(node.address, "job", job_id, cwd=project).stdout
    assert f"{project} (where it exists on the server, else the agent's directory for the job)" in described


@pytest.mark.postgres
def test_a_default_the_server_lacks_runs_in_the_jobs_directory_and_the_log_says_so(
    node: Node, tmp_path: Path
) -> None:
    missing = tmp_path / "not-on-this-server"
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "fallback", "command": [sys.executable, "-c", SHOW_CWD],
        "working_dir": str(missing), "working_dir_if_exists": True,
    }))
    job_id = submitted(ctl(node.address, "-o", "json", "submit", "-f", str(spec), cwd=tmp_path))
    job = node.finished(job_id)
    assert job.state == types_pb2.JOB_STATE_COMPLETED, (job.message, node.worker_log(job_id))
    job_dir = node.work_dir.resolve() / "jobs" / job_id
    header, note, *output = node.worker_log(job_id).splitlines()
    assert header.startswith("===== ")
    assert note == (
        f"===== aryl-agent on {NODE}: working directory {missing} does not exist on {NODE} (it was a default, "
        f"such as the directory arylctl submit ran in); running in the job's directory {job_dir}"
    )
    assert output == [f"cwd={job_dir}"]


@pytest.mark.postgres
def test_a_required_directory_the_server_lacks_fails_the_job_at_once_naming_it_and_the_server(
    node: Node, project: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "missing"
    job_id = submitted(ctl(node.address, "-o", "json", "submit", "--name", "strict", "--chdir", str(missing),
                           "--restart-policy", "on_failure", "--max-restarts", "3",
                           "--", sys.executable, "show_cwd.py", cwd=project))
    job = node.finished(job_id)
    assert job.state == types_pb2.JOB_STATE_FAILED
    assert job.message == (f"rank 0 could not start on server {NODE}: working directory {missing} does not exist; "
                           "not restarted: the spec must change")
    assert job.restarts == 0  # ON_FAILURE with restarts left, yet no retry into the same refusal
    assert node.worker_log(job_id).splitlines()[-1] == (
        f"===== aryl-agent on {NODE}: not started: working directory {missing} does not exist"
    )
    # The agent carries on: still running, and the next job runs.
    assert node.process.poll() is None
    after = submitted(ctl(node.address, "-o", "json", "submit", "--name", "after",
                          "--", sys.executable, "show_cwd.py", cwd=project))
    assert node.finished(after).state == types_pb2.JOB_STATE_COMPLETED


# ---------------------------------------------------------------------------------------------
# The scheduler alone


@pytest.mark.parametrize(
    ("working_dir", "if_exists", "field", "says"),
    [
        ("proj", False, "spec.working_dir", "is not an absolute path"),
        ("/tmp/a\nb", False, "spec.working_dir", "control"),
        ("/" + "d" * 4096, False, "spec.working_dir", "at most 4096 characters"),
        ("", True, "spec.working_dir_if_exists", "needs spec.working_dir"),
    ],
)
def test_working_dir_is_validated(scheduler, working_dir: str, if_exists: bool, field: str, says: str) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    try:
        spec = job_spec("wd", working_dir=working_dir, working_dir_if_exists=if_exists)
        with pytest.raises(grpc.RpcError) as refused:
            stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert details_of(refused.value).startswith(f"{field}: ") and says in details_of(refused.value)
        assert not stub.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=5).jobs  # nothing half-written
    finally:
        channel.close()


def test_arylctl_reports_a_refused_chdir_naming_the_field(scheduler, tmp_path: Path) -> None:
    result = ctl(scheduler.address, "submit", "--name", "bad", "--chdir", "/tmp/\x1b[2Jx", "--", "true", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: spec.working_dir: must not contain control") and "\x1b" not in result.stderr


@pytest.mark.parametrize("chdir", [True, False])
def test_job_yaml_round_trips_the_working_dir_into_submit_f(
    scheduler, project: Path, tmp_path: Path, chdir: bool
) -> None:
    flags = ["--chdir", str(project)] if chdir else []
    first = submitted(ctl(scheduler.address, "-o", "json", "submit", "--name", "rt", *flags, "--", "true",
                          cwd=project))
    printed = ctl(scheduler.address, "-o", "yaml", "job", first, cwd=project)
    assert printed.returncode == 0, printed.stderr
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(printed.stdout)
    # Resubmitted from another directory: the file's working directory is kept, default or not.
    again = submitted(ctl(scheduler.address, "-o", "json", "submit", "-f", str(spec_file), cwd=tmp_path))
    with ArylClient(scheduler.address, timeout=5) as client:
        original, copy = client.get_job(first).job.spec, client.get_job(again).job.spec
    assert (copy.working_dir, copy.working_dir_if_exists) == (str(project), not chdir)
    assert copy == original
