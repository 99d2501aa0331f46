"""arylctl's output for people and scripts: control characters escaped in every table and text
line (never printed raw to a terminal), the ELAPSED column of ``jobs``, ``-o name`` and ``-w``.

The commands run against a real scheduler (in-process ``main``, and the installed console script
for ``-w``, which must be stopped with a real SIGINT)."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import subprocess
import threading

import pytest
import sqlalchemy
import yaml
from google.protobuf.timestamp_pb2 import Timestamp

from arylctl.cli import elapsed_text, job_elapsed, printable
from protos.aryl.v1 import types_pb2
from tests.fixtures.cli import arylctl_executable, run, submit_json
from tests.harness import register_fake_server
from tests.helpers import wait_for

# A terminal would clear the screen and then show the rest of the line reversed.
HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\u202edesrever\x9b\x7f"
RAW_CONTROLS = ("\x1b", "\u202e", "\x07", "\x9b", "\x7f")


@pytest.fixture
def ctl(scheduler, capsys: pytest.CaptureFixture[str]):
    """``ctl("jobs", ...)`` runs arylctl in-process against the test's scheduler: (code, stdout, stderr)."""

    def invoke(*argv: str) -> tuple[int, str, str]:
        return run(capsys, "--server", scheduler.address, *argv)

    return invoke


def assert_no_raw_controls(text: str) -> None:
    assert not [ch for ch in RAW_CONTROLS if ch in text], repr(text)


# ---------------------------------------------------------------------------------------------
# Without a server


def test_printable_escapes_controls_and_invisible_format_characters() -> None:
    assert printable(HOSTILE) == "ok\\x1b[2J\\x1b]0;pwned\\x07\\u202edesrever\\x9b\\x7f"
    assert printable("a\tb\nc\rd") == "a\\tb\\nc\\rd"  # one cell stays one line
    assert printable("\u2066x\u2069\u200f\u2028") == "\\u2066x\\u2069\\u200f\\u2028"
    # Printable text is untouched, whatever its script.
    assert printable("café 中文 naïve — ok \U0001f600") == "café 中文 naïve — ok \U0001f600"
    assert printable(None) == "" and printable(42) == "42"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (42, "42s"), (60, "1m00s"), (192, "3m12s"), (3600, "1h00m"), (7500, "2h05m"),
     (86400 * 4 + 3600 * 3 + 59, "4d3h"), (-5, "0s")],
)
def test_elapsed_text_keeps_two_units(seconds: int, text: str) -> None:
    assert elapsed_text(seconds) == text


def _ts(moment: dt.datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(moment)
    return ts


def test_job_elapsed_depends_on_the_state() -> None:
    now = dt.datetime(2026, 1, 10, 12, 0, 0, tzinfo=dt.UTC)
    submitted = _ts(now - dt.timedelta(days=5))
    waiting = types_pb2.Job(state=types_pb2.JOB_STATE_PENDING, submitted_at=_ts(now - dt.timedelta(seconds=90)))
    assert job_elapsed(waiting, now) == "1m30s"  # since submission
    running = types_pb2.Job(state=types_pb2.JOB_STATE_RUNNING, submitted_at=submitted,
                            started_at=_ts(now - dt.timedelta(hours=2, minutes=5, seconds=9)))
    assert job_elapsed(running, now) == "2h05m"  # since start, not since submission
    finished = types_pb2.Job(state=types_pb2.JOB_STATE_COMPLETED, submitted_at=submitted,
                             started_at=_ts(now - dt.timedelta(days=4, hours=4)),
                             finished_at=_ts(now - dt.timedelta(hours=1)))
    assert job_elapsed(finished, now) == "4d3h"  # its run time, however long ago it ended
    never_ran = types_pb2.Job(state=types_pb2.JOB_STATE_CANCELLED, submitted_at=submitted,
                              finished_at=_ts(now - dt.timedelta(hours=1)))
    assert job_elapsed(never_ran, now) == "-"


# ---------------------------------------------------------------------------------------------
# Against the real scheduler


def _store_hostile_text(database_url: str, job_id: str) -> None:
    """Give a job a hostile name and its cancellation event's copy a hostile message in the database, as
    rows written before the scheduler refused such text (the API no longer accepts them)."""
    engine = sqlalchemy.create_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text("UPDATE jobs SET name = :name WHERE id = :id"),
                               {"name": HOSTILE, "id": int(job_id)})
            # The event log is append-only: a copy of the cancellation event carries the text.
            connection.execute(sqlalchemy.text(
                "INSERT INTO events (time, kind, job_id, server_id, from_state, to_state, reason, message, details) "
                "SELECT time, kind, job_id, server_id, from_state, to_state, reason, :text, details FROM events "
                "WHERE message = 'to be replaced'"), {"text": HOSTILE})
    finally:
        engine.dispose()


def test_control_characters_in_stored_text_are_escaped_in_every_view(ctl, database_url: str) -> None:
    job = submit_json(ctl, "--name", "plain", "--", "true")
    code, out, err = ctl("cancel", job["job_id"], "--reason", "to be replaced")
    assert code == 0, err
    _store_hostile_text(database_url, job["job_id"])
    escaped = printable(HOSTILE)

    for argv, copies in ((("job", job["job_id"]), 2), (("events", "--job", job["job_id"]), 1), (("jobs",), 1),
                         (("explain", job["job_id"]), 1)):
        code, out, err = ctl(*argv)
        assert code == 0, err
        assert out.count(escaped) >= copies, (argv, out)  # job: the name and the event's message
        assert_no_raw_controls(out + err)

    # -o json and -o yaml escape by their encoders and give the text back exactly.
    code, out, _ = ctl("-o", "json", "job", job["job_id"])
    assert code == 0
    assert_no_raw_controls(out)
    assert json.loads(out)["job"]["spec"]["name"] == HOSTILE
    assert HOSTILE in [e.get("message") for e in json.loads(out)["events"]]
    code, out, _ = ctl("-o", "yaml", "job", job["job_id"])
    assert code == 0
    assert_no_raw_controls(out)
    assert HOSTILE in [e.get("message") for e in yaml.safe_load(out)["events"]]


def test_accepted_data_characters_are_escaped_in_job(ctl) -> None:
    # Tab, newline and carriage return stay allowed in commands and environment values (scripts);
    # a raw CR would let "echo safe\r# evil" display as "# evil" over it.
    job = submit_json(ctl, "--name", "script", "--env", "PEM=line1\nline2", "--", "sh", "-c", "echo safe\r# evil")
    code, out, err = ctl("job", job["job_id"])
    assert code == 0, err
    assert "Command:" in out and "sh -c echo safe\\r# evil" in out
    assert "PEM=line1\\nline2" in out
    assert "\r" not in out
    code, out, _ = ctl("-o", "json", "job", job["job_id"])
    assert json.loads(out)["job"]["spec"]["command"][-1] == "echo safe\r# evil"


def test_control_characters_in_followed_events_are_escaped(ctl, scheduler, database_url: str) -> None:
    job = submit_json(ctl, "--name", "plain", "--", "true")
    assert ctl("cancel", job["job_id"], "--reason", "to be replaced")[0] == 0
    _store_hostile_text(database_url, job["job_id"])
    follower = subprocess.Popen(
        [arylctl_executable(), "--server", scheduler.address, "events", "--follow", "--job", job["job_id"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert follower.stdout is not None
    watchdog = threading.Timer(30, follower.kill)
    watchdog.start()
    try:
        lines: list[str] = []
        while not any(printable(HOSTILE) in line for line in lines) and (not lines or lines[-1]):
            lines.append(follower.stdout.readline())  # "" at the end: killed by the watchdog
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=15)
    finally:
        watchdog.cancel()
        if follower.poll() is None:
            follower.kill()
    text = "".join(lines) + out
    assert printable(HOSTILE) in text
    assert_no_raw_controls(text + err)


def test_jobs_table_has_an_elapsed_column(ctl, scheduler) -> None:
    register_fake_server(scheduler.address, "node-e", gpus=1)
    running = submit_json(ctl, "--name", "runs", "--", "true")
    submit_json(ctl, "--name", "waits", "--", "true")  # node-e's one GPU is taken
    wait_for(lambda: json.loads(ctl("-o", "json", "job", running["job_id"])[1])["job"]["state"]
             == "JOB_STATE_RUNNING", timeout=10, what="the first job to start")
    cancelled = submit_json(ctl, "--name", "dropped", "--", "true")
    assert ctl("cancel", cancelled["job_id"])[0] == 0

    code, out, err = ctl("jobs")
    assert code == 0, err
    header, *rows = out.splitlines()
    column = header.index("ELAPSED")
    assert header[column:].split()[:2] == ["ELAPSED", "REASON"]
    cells = {row.split()[1]: row[column:].split()[0] for row in rows}
    assert re.fullmatch(r"\d+s", cells["runs"]), cells  # since its start, seconds ago
    assert re.fullmatch(r"\d+s", cells["waits"]), cells  # since submission
    assert cells["dropped"] == "-"  # cancelled before it ever started


def test_o_name_prints_one_id_per_line(ctl, scheduler) -> None:
    first = submit_json(ctl, "--name", "first", "--", "true")
    second = submit_json(ctl, "--name", "second", "--", "true")
    code, out, err = ctl("-o", "name", "jobs")
    assert (code, err) == (0, "")
    assert out.splitlines() == [second["job_id"], first["job_id"]]  # newest first, as the table
    code, out, _ = ctl("jobs", "-o", "name", "--state", "pending", "--limit", "1")
    assert (code, out) == (0, second["job_id"] + "\n")

    register_fake_server(scheduler.address, "node-b", gpus=2)
    register_fake_server(scheduler.address, "node-a", gpus=2)
    code, out, _ = ctl("servers", "-o", "name")
    assert code == 0
    assert sorted(out.splitlines()) == ["node-a", "node-b"]

    # A command without ids to print refuses it before calling the server.
    code, out, err = ctl("-o", "name", "cluster")
    assert (code, out) == (2, "")
    assert "-o name applies only to jobs and servers" in err


class Lines:
    """A process's stdout read by a thread, so that a test can wait for a line with a timeout."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line)

    def text(self) -> str:
        return "".join(self.lines)


@pytest.mark.parametrize("command", ["jobs", "servers"])
def test_watch_renders_again_after_a_change_and_exits_0_on_ctrl_c(ctl, scheduler, command: str) -> None:
    submit_json(ctl, "--name", "before", "--", "true")
    register_fake_server(scheduler.address, "node-before", gpus=1)
    watcher = subprocess.Popen(
        [arylctl_executable(), "--server", scheduler.address, command, "-w"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    watchdog = threading.Timer(60, watcher.kill)
    watchdog.start()
    try:
        out = Lines(watcher.stdout)
        wait_for(lambda: out.text().count("ID ") == 1 and "before" in out.text(), timeout=20)
        assert watcher.poll() is None  # still watching
        if command == "jobs":
            submit_json(ctl, "--name", "after", "--", "true")
        else:
            register_fake_server(scheduler.address, "node-after", gpus=1)
        # The table is read line by line: wait for a render that holds both rows ("node-after" sorts first, so a
        # render read half-way holds it alone).
        wait_for(lambda: all(name in out.text().split("\n\n")[-1] for name in ("before", "after")), timeout=20)
        renders = out.text().split("\n\n")
        assert len(renders) >= 2  # a fresh table, not a line appended to the old one
        assert renders[-1].startswith("ID ") and "before" in renders[-1] and "after" in renders[-1]
        assert "after" not in renders[0]
        watcher.send_signal(signal.SIGINT)
        _, err = watcher.communicate(timeout=15)
    finally:
        watchdog.cancel()
        if watcher.poll() is None:
            watcher.kill()
    assert watcher.returncode == 0, err
    assert "Traceback" not in err


def test_jobs_table_cuts_long_commands_and_job_shows_them_whole(ctl) -> None:
    long_arg = "--data=/datasets/" + "x" * 200
    submit_json(ctl, "--name", "long", "--", "python", "train.py", long_arg)
    submit_json(ctl, "--name", "short", "--", "python", "t.py")
    code, out, err = ctl("jobs")
    assert code == 0, err
    header, *rows = out.splitlines()
    start, end = header.index("COMMAND"), header.index("SUBMITTED")
    cells = {row.split()[1]: row[start:end].rstrip() for row in rows}
    assert cells["short"] == "python t.py"
    assert cells["long"] == ("python train.py " + long_arg)[:37] + "..."
    assert len(cells["long"]) == 40
    job_id = next(row.split()[0] for row in rows if row.split()[1] == "long")
    code, out, err = ctl("job", job_id)
    assert code == 0, err
    assert f"python train.py {long_arg}\n" in out
