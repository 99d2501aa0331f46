"""arylctl: parsing and formatting without a server, then every command against a real scheduler,
in-process (``main([...])``) and through the installed console script."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from arylctl.cli import enum_name, format_table, main, parse_args, submit_directory, submit_spec_mapping
from protos.aryl.v1 import types_pb2
from tests.fixtures.cli import arylctl, arylctl_executable, run, submit_json
from tests.harness import register_fake_server
from tests.helpers import free_port, wait_for


def closed_address() -> str:
    return f"127.0.0.1:{free_port()}"


# ---------------------------------------------------------------------------------------------
# No server


def test_format_table_aligns_columns() -> None:
    text = format_table(("ID", "NAME", "STATE"), [(1, "bert-large", "RUNNING"), (12, "x", None)])
    assert text.splitlines() == [
        "ID  NAME        STATE",
        "1   bert-large  RUNNING",
        "12  x",
    ]


def test_enum_names_lose_their_prefix() -> None:
    assert enum_name(types_pb2.JobState, types_pb2.JOB_STATE_RUNNING) == "RUNNING"
    assert enum_name(types_pb2.ServerState, types_pb2.SERVER_STATE_LOANED) == "LOANED"
    assert enum_name(types_pb2.EventKind, types_pb2.EVENT_KIND_JOB_SUBMITTED) == "JOB_SUBMITTED"
    assert enum_name(types_pb2.JobState, 99) == "99"  # a state from a newer server


def test_global_options_go_before_or_after_the_subcommand(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARYL_SERVER", raising=False)
    before = parse_args(["--server", "a:1", "-o", "json", "jobs"])
    after = parse_args(["jobs", "--server", "a:1", "-o", "json", "--timeout", "3"])
    assert (before.server, before.output) == ("a:1", "json")
    assert (after.server, after.output, after.timeout) == ("a:1", "json", 3.0)
    plain = parse_args(["jobs"])
    assert (plain.server, plain.output, plain.timeout) == (None, "table", 10.0)
    # --server is the scheduler address for every command, events included; the filter is --server-id.
    events = parse_args(["events", "--server", "a:1", "--server-id", "node-3"])
    assert (events.server, events.server_id) == ("a:1", "node-3")


def test_jobs_state_filters_accept_repeats_and_commas() -> None:
    args = parse_args(["jobs", "--state", "pending,running", "--state", "CANCELLED"])
    assert args.states == [types_pb2.JOB_STATE_PENDING, types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_CANCELLED]


def test_submit_command_after_double_dash_is_untouched() -> None:
    args = parse_args(["submit", "--name", "n", "--", "torchrun", "--nproc", "8", "train.py", "--", "-x"])
    assert args.command == ["torchrun", "--nproc", "8", "train.py", "--", "-x"]


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["jobs", "--state", "sleeping"],
        ["jobs", "--all", "--limit", "3"],
        ["jobs", "--limit", "0"],
        ["servers", "--pool", "gaming"],
        ["submit", "--env", "NOEQUALS", "--name", "n", "--", "true"],
        ["submit", "--deadline", "next tuesday", "--name", "n", "--", "true"],
        ["submit", "--gpus-per-worker", "-1", "--name", "n", "--", "true"],
        ["jobs", "--", "extra"],
        ["-o", "xml", "jobs"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert "usage:" in err
    assert "Traceback" not in out + err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["submit", "--help"]) == 0
    assert "--idempotency-key" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["submit", "--", "true"], "--name"),
        (["submit", "--name", "n"], "command"),
        (["submit", "-f", "/nonexistent/spec.yaml"], "cannot read spec file"),
    ],
)
def test_incomplete_submit_exits_2_before_calling_the_server(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, "--server", closed_address(), *argv)
    assert code == 2
    assert err.startswith("error: ") and message in err


def test_spec_file_with_unknown_key_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: n\ncommand: [true]\ngpu: 2\n")
    code, _, err = run(capsys, "--server", closed_address(), "submit", "-f", str(spec))
    assert code == 2
    assert "unknown job spec key 'gpu'" in err


def test_flags_override_the_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: from-file\ncommand: [python, a.py]\npriority: 1\nenv: {A: '1', B: '1'}\n")
    args = parse_args(["submit", "-f", str(spec), "--priority", "7", "--env", "B=2", "--", "python", "b.py"])
    assert submit_spec_mapping(args) == {
        "name": "from-file",
        "command": ["python", "b.py"],
        "priority": 7,
        "env": {"A": "1", "B": "2"},
        # Neither --chdir nor a working_dir in the file: the submit directory, as a default.
        "working_dir": submit_directory(),
        "working_dir_if_exists": True,
    }


def test_unreachable_server_exits_3_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--server", closed_address(), "--timeout", "5", "jobs")
    assert code == 3
    assert out == ""
    assert err.startswith("error: ") and "UNAVAILABLE" in err
    assert "--server" in err and "ARYL_SERVER" in err
    assert "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Against the real scheduler, in-process


@pytest.fixture
def ctl(scheduler, capsys: pytest.CaptureFixture[str]):
    """``ctl("jobs", ...)`` runs arylctl against the test's scheduler: (exit code, stdout, stderr)."""

    def invoke(*argv: str) -> tuple[int, str, str]:
        return run(capsys, "--server", scheduler.address, *argv)

    return invoke


def test_submit_via_flags(ctl) -> None:
    assert ctl("queues", "create", "nlp", "--quota", "0")[0] == 0  # a job's queue must exist
    code, out, err = ctl(
        "submit", "--name", "bert", "--user", "ada", "--queue", "nlp", "--gpus-per-worker", "2",
        "--min-workers", "1", "--max-workers", "3", "--priority", "4", "--env", "A=1", "--env", "B=x=y",
        "--deadline", "2030-01-31T18:00:00Z", "--max-runtime", "7200", "--restart-policy", "never",
        "--estimated-runtime", "600", "--idempotency-key", "bert-1", "--", "python", "train.py", "--lr", "0.1",
    )
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["ID", "NAME", "STATE"]
    job_id, name, state = row.split()
    assert (name, state) == ("bert", "PENDING")

    code, out, _ = ctl("-o", "json", "job", job_id)
    assert code == 0
    spec = json.loads(out)["job"]["spec"]
    assert spec["command"] == ["python", "train.py", "--lr", "0.1"]
    assert spec["env"] == {"A": "1", "B": "x=y"}
    assert (spec["user"], spec["queue"], spec["gpus_per_worker"], spec["max_workers"]) == ("ada", "nlp", 2, 3)
    assert spec["priority"] == 4
    assert spec["deadline"] == "2030-01-31T18:00:00Z"
    assert spec["max_runtime"] == "7200s"
    assert spec["restart_policy"] == "RESTART_POLICY_NEVER"
    assert spec["throughput"]["estimated_runtime"] == "600s"


def test_submit_via_yaml_file_with_overrides(ctl, tmp_path: Path) -> None:
    spec_file = tmp_path / "resnet.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "resnet",
                "command": ["torchrun", "train.py"],
                "gpus_per_worker": 1,
                "min_workers": 1,
                "max_workers": 2,
                "env": {"OMP_NUM_THREADS": 4},
                "throughput_points": {1: 100.0, 2: 180.0},
                "total_work": 1e6,
            }
        )
    )
    job = submit_json(ctl, "-f", str(spec_file), "--priority", "9", "--env", "EXTRA=1")
    spec = job["spec"]
    assert (spec["name"], spec["priority"], spec["max_workers"]) == ("resnet", 9, 2)
    assert spec["env"] == {"OMP_NUM_THREADS": "4", "EXTRA": "1"}
    assert spec["throughput"]["points"] == [
        {"workers": 1, "samples_per_second": 100.0},
        {"workers": 2, "samples_per_second": 180.0},
    ]


def test_submit_via_json_file(ctl, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps({"name": "from-json", "command": ["true"], "throughput_points": {"1": 5}}))
    assert submit_json(ctl, "-f", str(spec_file))["spec"]["name"] == "from-json"


def test_json_and_yaml_print_zero_values(ctl) -> None:
    job = submit_json(ctl, "--name", "zeros", "--priority", "0", "--", "true")
    assert (job["spec"]["priority"], job["spec"]["max_restarts"], job["restarts"], job["num_workers"]) == (0, 0, 0, 0)
    code, out, _ = ctl("-o", "yaml", "job", job["job_id"])
    assert code == 0
    described = yaml.safe_load(out)["job"]
    assert (described["preemptions"], described["spec"]["env"]) == (0, {})
    # Printed even when empty; a cycle may have set it by now (on a loaded machine it had: no server exists).
    assert "pending_reason" in described
    assert "deadline" not in described["spec"]  # an unset message field is absent, not a zero


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_a_job_printed_with_o_is_a_submit_file(ctl, tmp_path: Path, fmt: str) -> None:
    assert ctl("queues", "create", "nlp", "--quota", "0")[0] == 0  # a job's queue must exist
    original = submit_json(
        ctl, "--name", "again", "--user", "ada", "--queue", "nlp", "--gpus-per-worker", "2", "--min-workers", "1",
        "--max-workers", "3", "--priority", "0", "--env", "A=1", "--deadline", "2030-01-31T18:00:00Z",
        "--max-runtime", "7200.5", "--restart-policy", "on_failure", "--max-restarts", "2",
        "--estimated-runtime", "600", "--", "python", "train.py",
    )
    code, printed, _ = ctl("-o", fmt, "job", original["job_id"])
    assert code == 0
    spec_file = tmp_path / f"job.{fmt}"
    spec_file.write_text(printed)

    code, out, err = ctl("-o", "json", "submit", "-f", str(spec_file))
    assert code == 0, err
    assert f"note: {spec_file} holds a job: submitting its spec, ignoring its read-only fields (job_id, " in err
    copy = json.loads(out)
    assert copy["job_id"] != original["job_id"]
    assert copy["spec"] == original["spec"]

    # What `submit -o` prints round-trips too, and flags still override the file's values.
    spec_file.write_text(json.dumps(copy) if fmt == "json" else yaml.safe_dump(copy))
    overridden = submit_json(ctl, "-f", str(spec_file), "--max-runtime", "60", "--restart-policy", "never")
    assert (overridden["spec"]["max_runtime"], overridden["spec"]["restart_policy"]) == ("60s", "RESTART_POLICY_NEVER")
    assert {**overridden["spec"], "max_runtime": "", "restart_policy": ""} == {
        **original["spec"], "max_runtime": "", "restart_policy": ""}


def test_a_spec_in_both_spellings_is_refused(ctl, tmp_path: Path) -> None:
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text("name: n\ncommand: [true]\nmax_runtime: 60s\nmax_runtime_s: 60\n")
    code, _, err = ctl("submit", "-f", str(spec_file))
    assert code == 2
    assert "'max_runtime_s' and 'max_runtime' say the same thing" in err


def test_events_filter_by_server_id_and_server_stays_the_address(ctl, scheduler) -> None:
    register_fake_server(scheduler.address, "train-1", gpus=1)
    register_fake_server(scheduler.address, "train-2", gpus=1)
    # --server after the subcommand is the scheduler's address here as everywhere (ctl gave another first).
    code, out, err = ctl("--server", closed_address(), "-o", "json", "events", "--server", scheduler.address,
                         "--server-id", "train-2")
    assert code == 0, err
    events = json.loads(out)
    assert events and {e["server_id"] for e in events} == {"train-2"}


def test_jobs_table_json_yaml_and_filters(ctl) -> None:
    for queue in ("a", "b"):  # a job's queue must exist
        assert ctl("queues", "create", queue, "--quota", "0")[0] == 0
    first = submit_json(ctl, "--name", "first", "--queue", "a", "--", "true")
    second = submit_json(ctl, "--name", "second", "--queue", "b", "--", "true")
    third = submit_json(ctl, "--name", "third", "--queue", "b", "--", "true")
    assert ctl("cancel", first["job_id"])[0] == 0

    code, out, _ = ctl("jobs")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["ID", "NAME", "USER", "QUEUE", "STATE"]
    assert [line.split()[1] for line in lines[1:]] == ["third", "second", "first"]  # newest first
    assert "CANCELLED" in lines[3]

    code, out, _ = ctl("-o", "json", "jobs")
    assert code == 0
    assert [job["job_id"] for job in json.loads(out)] == [third["job_id"], second["job_id"], first["job_id"]]
    code, out, _ = ctl("jobs", "-o", "yaml", "--queue", "b")
    assert code == 0
    assert [job["spec"]["name"] for job in yaml.safe_load(out)] == ["third", "second"]

    _, out, _ = ctl("-o", "json", "jobs", "--state", "cancelled")
    assert [job["job_id"] for job in json.loads(out)] == [first["job_id"]]
    _, out, _ = ctl("-o", "json", "jobs", "--state", "pending", "--state", "running")
    assert {job["job_id"] for job in json.loads(out)} == {second["job_id"], third["job_id"]}
    _, out, _ = ctl("-o", "json", "jobs", "--limit", "2")
    assert [job["job_id"] for job in json.loads(out)] == [third["job_id"], second["job_id"]]
    _, out, _ = ctl("-o", "json", "jobs", "--all")
    assert len(json.loads(out)) == 3

    code, out, err = ctl("jobs", "--user", "nobody")
    assert (code, out) == (0, "")
    assert "No jobs found" in err


def test_job_describe_shows_fields_workers_and_events(ctl, scheduler) -> None:
    register_fake_server(scheduler.address, "node-a", gpus=4)
    job = submit_json(ctl, "--name", "described", "--gpus-per-worker", "2", "--", "python", "x.py")
    deadline = time.monotonic() + 10
    while True:  # the scheduling cycle places it on node-a
        code, out, err = ctl("job", job["job_id"])
        assert code == 0, err
        if "RUNNING" in out or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert "Name:" in out and "described" in out
    assert "Command:" in out and "python x.py" in out
    assert "Workers:\nRANK  SERVER  GPUS" in out and "node-a" in out
    events = out.split("Events:\n", 1)[1]
    assert "JOB_SUBMITTED" in events
    assert "PENDING -> RUNNING" in events


def test_cancel_then_cancel_again_fails(ctl) -> None:
    job = submit_json(ctl, "--name", "doomed", "--", "true")
    code, out, _ = ctl("cancel", job["job_id"], "--reason", "not needed")
    assert code == 0
    assert out.splitlines()[1].split() == [job["job_id"], "doomed", "CANCELLED"]
    code, out, err = ctl("cancel", job["job_id"])
    assert code == 1
    assert out == ""
    assert err.startswith("error: ") and "FAILED_PRECONDITION" in err
    _, out, _ = ctl("-o", "json", "job", job["job_id"])
    assert any(e.get("message") == "not needed" for e in json.loads(out)["events"])


def test_unknown_job_is_an_error_without_traceback(ctl) -> None:
    code, out, err = ctl("job", "999999")
    assert code == 1
    assert out == ""
    assert err.startswith("error: ") and "999999" in err and "NOT_FOUND" in err
    assert "Traceback" not in err


def test_invalid_spec_rejected_by_the_server_exits_2(ctl) -> None:
    code, _, err = ctl("submit", "--name", "zero", "--min-workers", "0", "--", "true")
    assert code == 2
    assert "min_workers" in err and "INVALID_ARGUMENT" in err


def test_duplicate_idempotency_key_exits_1(ctl) -> None:
    assert ctl("submit", "--name", "a", "--idempotency-key", "k1", "--", "true")[0] == 0
    code, _, err = ctl("submit", "--name", "b", "--idempotency-key", "k1", "--", "true")  # another spec
    assert code == 1
    assert "ALREADY_EXISTS" in err


def test_events_replay_stops_when_caught_up(ctl) -> None:
    first = submit_json(ctl, "--name", "one", "--", "true")
    second = submit_json(ctl, "--name", "two", "--", "true")
    started = time.monotonic()
    code, out, _ = ctl("events")
    assert code == 0
    assert time.monotonic() - started < 5
    assert out.splitlines()[0].split()[:3] == ["ID", "TIME", "KIND"]
    assert out.count("JOB_SUBMITTED") == 2

    code, out, _ = ctl("-o", "json", "events", "--job", second["job_id"])
    events = json.loads(out)
    assert {e["job_id"] for e in events} == {second["job_id"]}
    assert events[0]["kind"] == "EVENT_KIND_JOB_SUBMITTED"

    _, out, _ = ctl("-o", "json", "events")
    submitted = next(e for e in json.loads(out) if e.get("job_id") == first["job_id"])
    _, out, _ = ctl("-o", "json", "events", "--since", submitted["event_id"])
    assert all(int(e["event_id"]) > int(submitted["event_id"]) for e in json.loads(out))


def test_explain_prints_summary_and_decisions(ctl, scheduler) -> None:
    # Queued before any server registers (SubmitJob refuses a job no registered server can hold).
    job = submit_json(ctl, "--name", "huge", "--gpus-per-worker", "8", "--", "true")
    register_fake_server(scheduler.address, "small", gpus=2)
    code, out, err = ctl("explain", job["job_id"])
    assert code == 0, err
    head, _, table = out.partition("\n\n")
    assert head.startswith(f"Job {job['job_id']} (huge): ")
    assert table.splitlines()[0].split() == ["TIME", "REASON", "MESSAGE"]
    assert "SUBMITTED" in table
    _, out, _ = ctl("-o", "json", "explain", job["job_id"])
    assert json.loads(out)["summary"]


def test_cluster_servers_loans_and_demand(ctl, scheduler) -> None:
    register_fake_server(scheduler.address, "train-1", pool="training", gpus=4)
    register_fake_server(scheduler.address, "infer-1", pool="inference", gpus=2)

    code, out, _ = ctl("servers")
    assert code == 0
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows["train-1"][1:4] == ["TRAINING", "TRAINING", "0/4"]
    assert rows["infer-1"][1:4] == ["INFERENCE", "SERVING", "0/2"]
    _, out, _ = ctl("-o", "json", "servers", "--pool", "inference")
    assert [s["server_id"] for s in json.loads(out)] == ["infer-1"]

    code, out, _ = ctl("cluster")
    assert code == 0
    assert "Policy:" in out
    pools = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("TRAINING", "INFERENCE"))}
    assert pools["TRAINING"][1:3] == ["1", "4"]
    assert pools["INFERENCE"][1:3] == ["1", "2"]

    code, out, err = ctl("loans")
    # No loan, and the scheduler's reason why (no demand reported yet: loans follow the router's signal).
    assert code == 0 and out.startswith("Not loaning (since ") and "NOT_LOANED_NO_DEMAND" in out
    assert "No active loans" in err
    code, out, _ = ctl("-o", "json", "loans", "--all")
    assert (code, json.loads(out)["loans"]) == (0, [])  # the whole answer: loans, not_loaned, demand_forecast
    assert "demand_forecast" not in json.loads(out)  # no demand reported yet: nothing to forecast from

    code, out, _ = ctl("demand", "set", "1", "--rps", "42.5")
    assert code == 0
    assert "1 server(s) needed, 42.5 rps" in out
    code, out, _ = ctl("-o", "yaml", "demand", "get")
    assert code == 0
    demand = yaml.safe_load(out)
    assert (demand["servers_needed"], demand["observed_rps"], demand["source"]) == (1, 42.5, "arylctl")
    _, out, _ = ctl("-o", "json", "cluster")
    assert json.loads(out)["demand"]["servers_needed"] == 1
    # Once a cycle saw the demand, `arylctl loans` shows its forecast (app.demand_forecast).
    wait_for(lambda: "Demand forecast" in ctl("loans")[1], timeout=30, interval=0.2,
             what="the demand forecast in arylctl loans")
    code, out, _ = ctl("loans")
    assert "inference needs 1 serving server(s) now" in out and "reclaim latency not measured yet" in out
    forecast = json.loads(ctl("-o", "json", "loans")[1])["demand_forecast"]
    assert (forecast["servers_needed_now"], forecast["quantile"]) == (1.0, 0.999)
    assert "reclaim_latency_s" not in forecast


# ---------------------------------------------------------------------------------------------
# The installed console script, as a user runs it


def test_console_script_submit_list_and_errors(scheduler) -> None:
    # The address from the environment, as a user would set it once.
    env = {"ARYL_SERVER": scheduler.address}
    submitted = arylctl("-o", "json", "submit", "--name", "cli", "--", "python", "-c", "print(1)", env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(submitted.stdout)["job_id"]

    listed = arylctl("jobs", "-o", "json", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [job["job_id"] for job in json.loads(listed.stdout)] == [job_id]

    missing = arylctl("job", "424242", env=env)
    assert missing.returncode == 1
    assert missing.stderr.startswith("error: ") and "NOT_FOUND" in missing.stderr
    assert "Traceback" not in missing.stderr

    unreachable = arylctl("--server", closed_address(), "cluster")
    assert unreachable.returncode == 3
    assert "ARYL_SERVER" in unreachable.stderr and "Traceback" not in unreachable.stderr


def test_console_script_follow_streams_until_ctrl_c(scheduler) -> None:
    follower = subprocess.Popen(
        [arylctl_executable(), "--server", scheduler.address, "-o", "json", "events", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follower.stdout is not None
    watchdog = threading.Timer(30, follower.kill)  # a hung stream fails the test instead of hanging it
    watchdog.start()
    try:
        assert main(["--server", scheduler.address, "submit", "--name", "followed", "--", "true"]) == 0
        line = follower.stdout.readline()  # JSON lines: the replay starts with the scheduler's own events
        assert json.loads(line)["event_id"]
        seen = [json.loads(line)]
        while not any(e.get("kind") == "EVENT_KIND_JOB_SUBMITTED" for e in seen):
            seen.append(json.loads(follower.stdout.readline()))
        follower.send_signal(signal.SIGINT)
        _, err = follower.communicate(timeout=15)
    finally:
        watchdog.cancel()
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert "Traceback" not in err
