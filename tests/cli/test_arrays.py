"""Job arrays: ``arylctl submit --array`` index lists (Slurm's syntax, bad input refused), and end to
end with a real scheduler (PostgreSQL) and a real ``aryl-agent``: each element's worker sees its
``ARYL_ARRAY_INDEX`` and ``ARYL_ARRAY_JOB_ID``, ``arylctl jobs`` shows ``NAME[INDEX]``, and
``arylctl cancel --array`` cancels what has not ended."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from arylctl.arrays import MAX_ARRAY_SIZE, ArraySpecError, parse_array
from arylctl.cli import main as arylctl
from protos.aryl.v1 import types_pb2
from tests.fixtures.cluster import Cluster, end_leftovers


@pytest.mark.parametrize(("text", "indices"), [
    ("0-4", [0, 1, 2, 3, 4]),
    ("0-9:3", [0, 3, 6, 9]),
    ("1,3,5", [1, 3, 5]),
    ("7", [7]),
    ("10-12, 2", [10, 11, 12, 2]),
    ("4294967295", [4294967295]),
    ("0-999", list(range(1000))),
])
def test_index_lists(text: str, indices: list[int]) -> None:
    assert parse_array(text) == indices


@pytest.mark.parametrize(("text", "message"), [
    ("", "needs indices"),
    ("5-3", "ends before it starts"),
    ("0-9:0", "step"),
    ("1,2,1", "index 1 is named twice"),
    ("0-3,2", "index 2 is named twice"),
    ("a-b", "is not an index"),
    ("-1", "is not an index"),
    ("1,,2", "is not an index"),
    ("0-4294967296", "largest index"),
    (f"0-{MAX_ARRAY_SIZE}", f"more than {MAX_ARRAY_SIZE} jobs"),
    ("0-9%2", "%N suffix"),
])
def test_bad_index_lists_are_refused(text: str, message: str) -> None:
    with pytest.raises(ArraySpecError, match=message.replace("%", "%")):
        parse_array(text)


def test_a_bad_array_is_a_usage_error_before_any_call() -> None:
    err = io.StringIO()
    # Nothing listens on port 1: a usage error must come before any call.
    code = arylctl(["--server", "127.0.0.1:1", "submit", "--name", "a", "--user", "u", "--gpus-per-worker", "1",
                    "--min-workers", "1", "--array", "3-1", "--", "true"], stdout=io.StringIO(), stderr=err)
    assert code == 2 and "ends before it starts" in err.getvalue()


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[Cluster]:
    c = Cluster(tmp_path, postgres_url)
    yield c
    c.close()
    end_leftovers(tmp_path)


def _ctl(cluster: Cluster, *args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = arylctl(["--server", cluster.scheduler.address, *args], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    return out.getvalue() + err.getvalue()


@pytest.mark.postgres
def test_array_elements_see_their_index_and_a_whole_array_can_be_cancelled(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a", gpus=2)
    script = "import os; print('element', os.environ['ARYL_ARRAY_JOB_ID'], os.environ['ARYL_ARRAY_INDEX'])"
    submitted = _ctl(cluster, "submit", "--name", "echo", "--user", "alice", "--gpus-per-worker", "1",
                     "--min-workers", "1", "--array", "3,5", "--", sys.executable, "-c", script)
    array_id = submitted.split("job array ")[1].split(":")[0]
    jobs = [j for j in cluster.client.list_jobs().jobs if j.array_job_id == array_id]
    assert sorted(j.array_index for j in jobs) == [3, 5]
    for job in jobs:
        cluster.wait_job(job.job_id, lambda j: j.state == types_pb2.JOB_STATE_COMPLETED, "completed")
        log = _ctl(cluster, "logs", job.job_id)
        assert f"element {array_id} {job.array_index}" in log
    listing = _ctl(cluster, "jobs")
    assert "echo[3]" in listing and "echo[5]" in listing

    # Four sleepers on two GPUs: two run, two wait; cancelling the array ends all four.
    submitted = _ctl(cluster, "submit", "--name", "sleeper", "--user", "alice", "--gpus-per-worker", "1",
                     "--min-workers", "1", "--array", "0-3", "--", sys.executable, "-c", "import time; time.sleep(60)")
    array_id = submitted.split("job array ")[1].split(":")[0]
    sleepers = [j.job_id for j in cluster.client.list_jobs().jobs if j.array_job_id == array_id]
    assert len(sleepers) == 4
    cluster.wait_job(sleepers[-1], lambda j: j.state in (types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_PENDING),
                     "queued")
    out = _ctl(cluster, "cancel", "--array", array_id)
    assert "4 job(s) cancelled" in out
    for job_id in sleepers:
        cluster.wait_job(job_id, lambda j: j.state == types_pb2.JOB_STATE_CANCELLED, "cancelled")
