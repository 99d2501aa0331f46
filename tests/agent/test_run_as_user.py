"""Jobs run as their user (issue 18, part 5; ``node_agent.identity``).

The rules (user map, refusals, clean environment) are checked on ``Identities`` everywhere. What
needs root (a worker really running as its owner's mapped uid, directories chowned to it) is checked
as root, in process with a supervisor and end to end with a real scheduler on PostgreSQL and a real
``aryl-agent`` process: those skip only when not root and ``CI`` is not ``true``. The mapped uid is
4242, which has no passwd entry (no user is created), and workers run ``/usr/bin/python3``, which
any uid may execute (the venv's interpreter may live under a 0700 home).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from arylctl.client import ArylClient
from node_agent.config import AgentSection, UsersSection
from node_agent.desired import DesiredStateTracker
from node_agent.identity import Identities, Refused, closed_directory, parse_map
from node_agent.supervisor import Supervisor
from node_agent.workers import Phase, WorkerId, WorkerView
from protos.aryl.v1 import types_pb2
from scheduler_service.server import serve_in_background
from tests.fixtures.cluster import end_leftovers
from tests.harness import AS_ITSELF, daemon_env, desired_state, desired_worker, job_spec, scheduler_config
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
UID, GID = 4242, 4242
SHOW_IDS = "import os; print('ids', os.getuid(), os.getgid(), sorted(os.getgroups()), flush=True)"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 and os.environ.get("CI") != "true",
    reason="switching a worker's uid needs a root agent (runs as root on CI)",
)
needs_python = pytest.mark.skipif(not os.access(PYTHON, os.X_OK), reason=f"{PYTHON} is needed for mapped workers")


def owner_rules(**users: object) -> Identities:
    return Identities(UsersSection(**{"run_as": "owner", **users}), euid=0)


# --------------------------------------------------------------------------------------------------
# the rules


def test_the_user_map_is_parsed_and_a_bad_entry_names_itself() -> None:
    assert parse_map("alice:1001:1001, bob:1002:1003\n# comment\ncarol:7:8 # trailing", "m") == {
        "alice": (1001, 1001), "bob": (1002, 1003), "carol": (7, 8),
    }
    with pytest.raises(ValueError, match="'alice:x:1' is not name:uid:gid"):
        parse_map("alice:x:1", "m")


def test_a_root_agent_maps_owners_and_refuses_root_and_the_unmapped(tmp_path: Path) -> None:
    map_file = tmp_path / "users"
    map_file.write_text("bob:2002:2002\nalice:1:1\n")
    rules = owner_rules(map="alice:1001:1001, zero:0:5, gzero:5:0", map_file=str(map_file))
    assert (rules.resolve("alice").uid, rules.resolve("alice").gid) == (1001, 1001)  # map beats map_file
    assert rules.resolve("bob").uid == 2002
    with pytest.raises(Refused, match=r"jobs of user root are refused.*allow_root = false"):
        rules.resolve("root")
    for user in ("zero", "gzero"):
        with pytest.raises(Refused, match=r"root is refused \(\[users\] allow_root = false\)"):
            rules.resolve(user)
    with pytest.raises(Refused, match=r"no uid mapped for user 'mallory'.*\[users\] map"):
        rules.resolve("mallory")
    assert owner_rules(default_uid=65534, default_gid=65534).resolve("mallory").uid == 65534
    assert owner_rules(map="root:0:0", allow_root=True).resolve("root").uid == 0


def test_by_default_a_root_agent_runs_workers_as_their_owners_and_warns_when_it_maps_no_one() -> None:
    default = Identities(UsersSection(), euid=0)
    assert default.switching
    with pytest.raises(Refused, match=r"no uid mapped for user 'alice'"):
        default.resolve("alice")
    with pytest.raises(Refused, match=r"jobs of user root are refused"):
        default.resolve("root")
    assert "every job will be refused" in (default.start_warning() or "")
    mapped = Identities(UsersSection(map="alice:1001:1001"), euid=0)
    assert mapped.resolve("alice").uid == 1001 and mapped.start_warning() is None
    assert Identities(UsersSection(default_uid=65534, default_gid=65534), euid=0).start_warning() is None
    not_root = Identities(UsersSection(), euid=1000)  # cannot switch: runs workers as itself, nothing to warn of
    assert not not_root.switching and not not_root.resolve("alice").switches and not_root.start_warning() is None


def test_the_system_users_serve_names_in_no_map_but_never_a_system_account() -> None:
    system = next((p for p in pwd.getpwall() if 0 < p.pw_uid < 1000 and p.pw_gid != 0), None)  # e.g. daemon
    if system is None:
        pytest.skip("no system account (0 < uid < 1000) in this machine's passwd")
    with pytest.raises(Refused, match=rf"{system.pw_name!r} is the system account uid {system.pw_uid}, below "
                                      r"\[users\] min_uid = 1000"):
        owner_rules(use_passwd=True).resolve(system.pw_name)
    lowered = owner_rules(use_passwd=True, min_uid=system.pw_uid).resolve(system.pw_name)
    assert (lowered.uid, lowered.gid) == (system.pw_uid, system.pw_gid)
    assert owner_rules(use_passwd=True, map=f"{system.pw_name}:4242:4242").resolve(system.pw_name).uid == 4242
    with pytest.raises(Refused, match="no uid mapped for user 'no-such-account'"):
        owner_rules(use_passwd=True).resolve("no-such-account")


def test_without_root_or_owner_mode_workers_run_as_the_agent() -> None:
    assert not Identities(UsersSection(run_as="owner", map="alice:1:1"), euid=1000).resolve("root").switches
    assert not Identities(UsersSection(run_as="agent"), euid=0).resolve("mallory").switches


def test_the_environment_is_clean_and_loader_variables_are_refused(tmp_path: Path) -> None:
    rules = owner_rules(pass_env=["CUDA_HOME", "ABSENT"])
    agent_env = {"CUDA_HOME": "/usr/local/cuda", "SECRET_OF_THE_AGENT": "x", "PATH": "/agent/bin"}
    env = rules.environment("alice", tmp_path, {"LR": "0.1", "RANK": "9"}, {"RANK": "0"}, agent_env)
    assert env == {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8",
                   "USER": "alice", "LOGNAME": "alice", "CUDA_HOME": "/usr/local/cuda", "LR": "0.1", "RANK": "0"}
    with pytest.raises(Refused, match=r"LD_LIBRARY_PATH, LD_PRELOAD: dynamic-loader variables are refused"):
        rules.environment("alice", tmp_path, {"LD_PRELOAD": "/tmp/evil.so", "LD_LIBRARY_PATH": "/x"}, {}, {})
    allowed = owner_rules(allow_loader_env=True).environment("alice", tmp_path, {"LD_PRELOAD": "a.so"}, {}, {})
    assert allowed["LD_PRELOAD"] == "a.so"


# --------------------------------------------------------------------------------------------------
# as root: a supervisor in this process


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory a mapped uid can reach (pytest's tmp_path is under a 0700 directory of root's)."""
    path = Path(tempfile.mkdtemp(prefix="aryl-run-as-"))
    path.chmod(0o711)
    yield path
    end_leftovers(path)
    shutil.rmtree(path, ignore_errors=True)


def owner_supervisor(work: Path) -> tuple[Supervisor, DesiredStateTracker]:
    config = AgentSection(hostname="u-node", work_dir=str(work), stop_grace_s=5.0, reconcile_interval_s=0.05)
    users = UsersSection(run_as="owner", map=f"alice:{UID}:{GID}", python=PYTHON)
    tracker = DesiredStateTracker()
    supervisor = Supervisor(config, tracker, users=users)
    supervisor.start()
    return supervisor, tracker


def view_of(supervisor: Supervisor, job: str) -> WorkerView | None:
    return next((v for v in supervisor.statuses() if v.id == WorkerId(job, 0, 1)), None)


def stop_agent(agent: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not exited within 15 s."""
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(timeout=15)
    except subprocess.TimeoutExpired:
        agent.kill()


def mode_and_owner(path: Path) -> tuple[str, int, int]:
    st = path.lstat()
    return oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid


@needs_root
@needs_python
def test_a_mapped_users_worker_runs_with_its_uid_in_private_directories(shared_dir: Path) -> None:
    work = shared_dir / "agent"
    supervisor, tracker = owner_supervisor(work)
    try:
        worker = desired_worker([PYTHON, "-c", SHOW_IDS + "; import time; time.sleep(30)"], job="job-u",
                                env={"LR": "0.1"})
        worker.user = "alice"
        root_job = desired_worker([PYTHON, "-c", "print(1)"], job="job-root", gpus=(1,))
        root_job.user = "root"
        stranger = desired_worker([PYTHON, "-c", "print(1)"], job="job-x", gpus=(2,))
        stranger.user = "mallory"
        loader = desired_worker([PYTHON, "-c", "print(1)"], job="job-ld", gpus=(3,), env={"LD_PRELOAD": "x.so"})
        loader.user = "alice"
        assert tracker.offer(desired_state(1, worker, root_job, stranger, loader)).accepted
        supervisor.wake()
        view = wait_for(lambda: (v := view_of(supervisor, "job-u")) and v.phase is Phase.RUNNING and v,
                        timeout=20, what="the mapped worker running")
        log = work / "logs" / "job-u" / "rank-0.log"
        wait_for(lambda: "\nids " in log.read_text(), timeout=20, what="the worker's ids in its log")
        assert f"\nids {UID} {GID} []\n" in log.read_text()  # no supplementary group of the agent's
        # The shim is the group leader; its real, effective, saved and filesystem uids are all 4242.
        shim_pid = next(w.pid for w in supervisor._workers.values() if w.id.job_id == "job-u")
        status = Path(f"/proc/{shim_pid}/status").read_text()
        assert f"Uid:\t{UID}\t{UID}\t{UID}\t{UID}" in status and f"Gid:\t{GID}\t{GID}\t{GID}\t{GID}" in status
        assert view.exit_code == 0

        for job, reason in (("job-root", "jobs of user root are refused"),
                            ("job-x", "no uid mapped for user 'mallory'"),
                            ("job-ld", "LD_PRELOAD: dynamic-loader variables are refused")):
            def exited(j: str = job) -> WorkerView | None:
                return v if (v := view_of(supervisor, j)) and v.phase is Phase.EXITED else None
            refused = wait_for(exited, timeout=10, what=f"{job} refused")
            assert refused.cannot_start and reason in refused.message and refused.exit_code == 127
            assert reason in (work / "logs" / job / "rank-0.log").read_text()

        for private in (work / "jobs" / "job-u", work / "run" / "job-u", work / "checkpoints" / "job-u"):
            assert mode_and_owner(private) == ("0o700", UID, GID), private
        for parent in (work / "jobs", work / "run", work / "logs", work / "checkpoints"):
            assert mode_and_owner(parent) == ("0o711", 0, 0), parent
        assert mode_and_owner(log.parent) == ("0o700", 0, 0) and mode_and_owner(log) == ("0o600", 0, 0)
        assert mode_and_owner(work / "run" / "workers.json")[0] == "0o600"
        assert not (work / "jobs" / "job-root").exists()  # nothing is made for a refused worker
    finally:
        supervisor.close(stop_workers=True)


@needs_root
@needs_python
def test_a_worker_cannot_read_the_state_file_or_another_jobs_directories(shared_dir: Path) -> None:
    work = shared_dir / "agent"
    supervisor, tracker = owner_supervisor(work)
    probe = (
        "import os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    try:\n"
        "        open(p).read() if os.path.isfile(p) else os.listdir(p); print('read', p)\n"
        "    except PermissionError:\n"
        "        print('denied', p)\n"
    )
    other = work / "jobs" / "job-other"
    targets = [str(work / "run" / "workers.json"), str(other), str(work / "logs"), str(work / "jobs")]
    try:
        first = desired_worker([PYTHON, "-c", "import time; time.sleep(30)"], job="job-other", env={"TOKEN": "s3"})
        first.user = "alice"
        assert tracker.offer(desired_state(1, first)).accepted
        supervisor.wake()
        wait_for(other.is_dir, timeout=10, what="the other job's directory")
        other.chmod(0o700)
        os.chown(other, 4343, 4343)  # as if another user's job
        worker = desired_worker([PYTHON, "-c", probe, *targets], job="job-probe", gpus=(1,))
        worker.user = "alice"
        assert tracker.offer(desired_state(2, first, worker)).accepted
        supervisor.wake()
        wait_for(lambda: (v := view_of(supervisor, "job-probe")) and v.phase is Phase.EXITED,
                 timeout=20, what="the probe done")
        out = (work / "logs" / "job-probe" / "rank-0.log").read_text()
        for target in targets:
            assert f"denied {target}" in out, out
    finally:
        supervisor.close(stop_workers=True)


# --------------------------------------------------------------------------------------------------
# as root: end to end, a real scheduler on PostgreSQL and a real aryl-agent process


@needs_root
@needs_python
@pytest.mark.postgres
def test_end_to_end_a_job_of_a_mapped_user_runs_with_that_uid(shared_dir: Path, postgres_url: str) -> None:
    scheduler = serve_in_background(scheduler_config(
        postgres_url, agents={"report_interval_s": 0.3, "lost_after_s": 5.0},
        scheduling={"cycle_interval_s": 0.2, "default_grace_period_s": 5.0},
    ))
    client = ArylClient(scheduler.address, timeout=10)
    work = shared_dir / "agent-u"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env.update(daemon_env("node-u"))
    env.pop("ARYL_USERS__RUN_AS")  # the default: workers run as their owners' mapped uids
    env.update(ARYL_AGENT__RECONCILE_INTERVAL_S="0.1", ARYL_AGENT__CHECKPOINT_ROOT=str(shared_dir / "ckpt"),
               ARYL_AGENT__LOGS_LISTEN_HOST="127.0.0.1", ARYL_AGENT__ADVERTISE_ADDRESS="127.0.0.1",
               ARYL_USERS__MAP=f"alice:{UID}:{GID}", ARYL_USERS__PYTHON=PYTHON)
    args = [sys.executable, "-m", "node_agent.main", "--scheduler", scheduler.address, "--hostname", "node-u",
            "--fake-gpus", "2", "--work-dir", str(work)]
    with (shared_dir / "agent.log").open("ab") as agent_log:
        agent = subprocess.Popen(args, cwd=REPO, env=env, stdout=agent_log, stderr=subprocess.STDOUT)
    try:
        def submit(user: str) -> str:
            spec = job_spec(f"ids-{user}", user=user)
            del spec.command[:]
            spec.command.extend([PYTHON, "-c", SHOW_IDS + "; import json, os; "
                                 "json.dump(dict(os.environ), open(os.environ['HOME'] + '/env.json', 'w'))"])
            spec.env["LR"] = "0.1"
            return client.submit_job(spec).job_id

        def finished(job_id: str) -> types_pb2.Job:
            return wait_for(
                lambda: (j := client.get_job(job_id).job).state in (
                    types_pb2.JOB_STATE_COMPLETED, types_pb2.JOB_STATE_FAILED) and j,
                timeout=60, interval=0.2,
                what=f"job {job_id} to end; agent log:\n{(shared_dir / 'agent.log').read_text()[-1500:]}",
            )

        alice = submit("alice")
        assert finished(alice).state == types_pb2.JOB_STATE_COMPLETED, (
            f"{client.get_job(alice).job}\nworker log:\n{(work / 'logs' / alice / 'rank-0.log').read_text()[-1500:]}"
            f"\nagent log:\n{(shared_dir / 'agent.log').read_text()[-1500:]}"
        )
        assert f"\nids {UID} {GID} []\n" in (work / "logs" / alice / "rank-0.log").read_text()
        worker_env = json.loads((work / "jobs" / alice / "env.json").read_text())
        assert worker_env["LR"] == "0.1" and worker_env["USER"] == "alice" and worker_env["ARYL_JOB_ID"] == alice
        assert not {k for k in worker_env if k.startswith(("ARYL_AGENT", "ARYL_SECURITY"))}
        assert mode_and_owner(work / "jobs" / alice) == ("0o700", UID, GID)

        mallory = submit("mallory")
        job = finished(mallory)
        assert job.state == types_pb2.JOB_STATE_FAILED
        assert "no uid mapped for user 'mallory'" in (work / "logs" / mallory / "rank-0.log").read_text()
        assert "every job will be refused" not in (shared_dir / "agent.log").read_text()  # it maps alice
    finally:
        stop_agent(agent)
        client.close()
        scheduler.stop()


@needs_root
def test_a_root_agent_with_the_default_users_section_warns_at_start_up(tmp_path: Path) -> None:
    # The real daemon, as an operator first starts it: nothing in [users], no scheduler to reach yet.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env.update(ARYL_AGENT__INSECURE="true", ARYL_AGENT__LOGS_LISTEN_HOST="127.0.0.1")
    log_path = tmp_path / "agent.log"
    args = [sys.executable, "-m", "node_agent.main", "--scheduler", "127.0.0.1:1", "--hostname", "node-w",
            "--fake-gpus", "1", "--work-dir", str(tmp_path / "agent")]
    with log_path.open("ab") as log:
        agent = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        warning = wait_for(
            lambda: next((line for line in log_path.read_text().splitlines() if "every job will be refused" in line),
                         None),
            timeout=30, what=f"the start-up warning; agent log:\n{log_path.read_text()[-1500:]}",
        )
        assert "warn" in warning.lower()
        for setting in ("map", "map_file", "use_passwd", "default_uid", 'run_as = "agent"'):
            assert setting in warning, (setting, warning)
    finally:
        stop_agent(agent)


def test_workers_run_a_copy_of_the_shim_that_any_uid_can_read(tmp_path: Path) -> None:
    """A worker's uid never reads the agent's source tree (which may be a clone under root's 0700 home):
    the agent copies the shim into its work directory, the directories 0711 and the file 0644."""
    from node_agent.launch import SHIM, install_shim

    root = tmp_path / "agent"
    root.mkdir()
    copy = install_shim(root)
    assert copy == root / "lib" / "node_agent" / "shim.py" and copy.read_bytes() == SHIM.read_bytes()
    assert [oct(stat.S_IMODE(p.stat().st_mode)) for p in (copy.parent.parent, copy.parent, copy)] == [
        "0o711", "0o711", "0o644"]
    copy.write_text("stale")
    assert install_shim(root).read_bytes() == SHIM.read_bytes()  # an agent's start replaces an older copy
    assert sorted(p.name for p in copy.parent.iterdir()) == ["shim.py"]  # no temporary file left


# --------------------------------------------------------------------------------------------------
# the first hour (issue 36): what a root agent needs besides a user map, said before a job fails


def test_a_switching_agent_runs_the_shim_on_an_interpreter_every_uid_can_reach(shared_dir: Path) -> None:
    assert Identities(UsersSection(python="/opt/py/bin/python3"), euid=0).shim_python() == ("/opt/py/bin/python3",
                                                                                          None)
    assert Identities(UsersSection(run_as="agent"), euid=0).shim_python() == (sys.executable, None)
    python, warning = owner_rules(map="alice:1001:1001").shim_python()
    if warning is None:  # the agent's own interpreter's real file, or python3 on the workers' PATH
        assert closed_directory(Path(python).parent) is None and os.stat(python).st_mode & stat.S_IXOTH
        assert python in (os.path.realpath(sys.executable), os.path.realpath(shutil.which("python3", path=(
            "/usr/local/bin:/usr/bin:/bin")) or ""))
    # Neither the agent's interpreter nor python3 on the workers' PATH reachable: a warning naming the fix.
    private = shared_dir / "private"
    (private / "bin").mkdir(parents=True)
    private.chmod(0o700)
    hidden = private / "bin" / "python3"
    shutil.copy(os.path.realpath(sys.executable), hidden)
    original = sys.executable
    try:
        sys.executable = str(hidden)
        assert owner_rules(path=str(private / "bin")).shim_python() == (str(hidden), (
            f"no Python interpreter that the job owners' uids can run was found (this agent's, {hidden}, lies in a "
            f"private directory, and there is no python3 on [users] path {private / 'bin'}): their workers will "
            "fail to start; set [users] python (ARYL_USERS__PYTHON) to one, e.g. /usr/bin/python3"))
    finally:
        sys.executable = original


def test_a_closed_directory_above_the_work_dir_is_named_with_the_fix(shared_dir: Path) -> None:
    closed = shared_dir / "home"
    (closed / "proj").mkdir(parents=True)
    closed.chmod(0o700)
    assert closed_directory(closed / "proj" / ".aryl" / "agent-1") == closed
    assert closed_directory(shared_dir / "not-yet" / "agent") is None  # the agent makes the rest 0711
    problem = owner_rules(map="alice:1001:1001").unreachable_directory("agent.work_dir", closed / "proj" / "w")
    assert problem is not None and f"lies under {closed} (mode 0o700)" in problem and "chmod o+x" in problem
    # No one mapped (every job is refused anyway, with its own warning) or no switching: nothing to say.
    assert owner_rules().unreachable_directory("agent.work_dir", closed / "w") is None
    assert Identities(UsersSection(map="alice:1:1"), euid=1000).unreachable_directory("x", closed / "w") is None


@needs_root
def test_a_root_agent_that_maps_users_refuses_a_work_dir_they_cannot_reach(shared_dir: Path) -> None:
    closed = shared_dir / "closed"
    closed.mkdir()
    closed.chmod(0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env.update(ARYL_AGENT__INSECURE="true", ARYL_USERS__MAP=f"alice:{UID}:{GID}")
    agent = subprocess.run(
        [sys.executable, "-m", "node_agent.main", "--scheduler", "127.0.0.1:1", "--hostname", "node-c",
         "--fake-gpus", "1", "--work-dir", str(closed / "agent")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False,
    )
    assert agent.returncode == 2, agent.stderr
    assert f"agent.work_dir {closed}/agent lies under {closed} (mode 0o700)" in agent.stderr


def test_a_command_not_found_names_the_workers_path_and_users_path(tmp_path: Path) -> None:
    config = AgentSection(hostname="p-node", work_dir=str(tmp_path / "agent"), reconcile_interval_s=0.05)
    tracker = DesiredStateTracker()
    supervisor = Supervisor(config, tracker, users=AS_ITSELF)
    supervisor.start()
    try:
        missing = desired_worker(["python-that-is-not-there", "train.py"], job="job-127")
        shell = desired_worker(["/bin/sh", "-c", "exit 127"], job="job-sh", gpus=(1,), env={"PATH": "/job/bin"})
        assert tracker.offer(desired_state(1, missing, shell)).accepted
        supervisor.wake()
        for job, path, where in (("job-127", "/usr/local/bin:/usr/bin:/bin", "the agent's [users] path"),
                                 ("job-sh", "/job/bin", "the job's env")):
            def exited(j: str = job) -> WorkerView | None:
                return v if (v := view_of_job(supervisor, j)) and v.phase is Phase.EXITED else None
            view = wait_for(exited, timeout=20, what=f"{job} exited")
            assert view.exit_code == 127
            assert f"the workers' PATH is {path} ({where})" in view.message, view.message
            assert "users.path (ARYL_USERS__PATH)" in view.message
        not_found = view_of_job(supervisor, "job-127")
        assert not_found is not None
        assert "command not found: python-that-is-not-there" in not_found.message
    finally:
        supervisor.close(stop_workers=True)


def view_of_job(supervisor: Supervisor, job: str) -> WorkerView | None:
    return next((v for v in supervisor.statuses() if v.id.job_id == job), None)


def test_a_root_agent_told_to_run_workers_as_itself_warns_that_they_run_as_root() -> None:
    warning = Identities(UsersSection(run_as="agent"), euid=0).start_warning()
    assert warning is not None and 'run_as = "agent": every job\'s workers run as root' in warning
    assert Identities(UsersSection(run_as="agent"), euid=1000).start_warning() is None


def test_closed_directory_for_a_uid_counts_its_owner_and_group_bits(shared_dir: Path) -> None:
    mine = shared_dir / "mine"
    mine.mkdir()
    mine.chmod(0o700)
    if os.geteuid() == 0:
        os.chown(mine, UID, GID)
    owner = mine.stat().st_uid
    assert closed_directory(mine, owner, 1) is None  # its owner enters
    assert closed_directory(mine, owner + 1, 1) == mine  # another uid does not
    mine.chmod(0o710)
    assert closed_directory(mine, owner + 1, mine.stat().st_gid) is None  # its group does
    assert closed_directory(mine) == mine  # and not every uid


@needs_root
@needs_python
def test_a_default_working_dir_a_mapped_uid_cannot_enter_falls_back_to_the_jobs_directory(shared_dir: Path) -> None:
    work = shared_dir / "agent"
    private = shared_dir / "root-only"
    private.mkdir()
    private.chmod(0o700)
    supervisor, tracker = owner_supervisor(work)
    try:
        default = desired_worker([PYTHON, "-c", "import os; print('cwd', os.getcwd())"], job="job-cwd")
        default.user, default.working_dir, default.working_dir_if_exists = "alice", str(private), True
        required = desired_worker([PYTHON, "-c", "print(1)"], job="job-req", gpus=(1,))
        required.user, required.working_dir = "alice", str(private)
        assert tracker.offer(desired_state(1, default, required)).accepted
        supervisor.wake()
        done = wait_for(lambda: (v := view_of_job(supervisor, "job-cwd")) and v.phase is Phase.EXITED and v,
                        timeout=20, what="job-cwd done")
        assert done.exit_code == 0, done.message
        log = (work / "logs" / "job-cwd" / "rank-0.log").read_text()
        assert f"cwd {work / 'jobs' / 'job-cwd'}" in log
        assert f"working directory {private} cannot be entered by uid {UID}, which alice's workers run as" in log
        refused = wait_for(lambda: (v := view_of_job(supervisor, "job-req")) and v.phase is Phase.EXITED and v,
                           timeout=20, what="job-req refused")
        assert refused.cannot_start and f"cannot be entered by uid {UID}" in refused.message
    finally:
        supervisor.close(stop_workers=True)
