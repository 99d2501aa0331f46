"""How a worker process is set up before the supervisor starts it: the shim copy it runs under, its
environment (the job contract's variables, batch variables, resolved secrets), its working directory
and its log file.

Nouns (worker spec, work directory layout: see ``node_agent.workers``): the *shim* is the parent
process of every worker (``node_agent.shim``), run from a copy under the agent's work directory; the
*contract environment* is the variables a training program reads (``node_agent.contract``), which
nothing may override; a worker's *log* is the agent's file its output is appended to, opening with a
*log header* per incarnation.
These are functions of their arguments: only the supervisor (``node_agent.supervisor``) calls them,
from its reconciler thread. This module never starts, signals or waits for a process, and never
decides what should run.
"""

from __future__ import annotations

import os
import shlex
import signal
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from node_agent import contract, secrets
from node_agent.identity import PRIVATE_FILE_MODE, Identities, RunAs, closed_directory, parent_directory
from node_agent.workers import DEFAULT_MASTER_PORT, WorkDir, WorkerSpec

SHIM = Path(__file__).with_name("shim.py")
# The copy of the shim that workers run (``install_shim``), under the agent's work directory; named like the source
# (``node_agent/shim.py``), so that what finds shims by their command line finds these.
SHIM_COPY = Path("lib", "node_agent", "shim.py")
SHIM_COPY_MODE = 0o644  # any uid reads it: a worker's interpreter runs it as the worker's user
EXIT_CANNOT_START = 127
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def install_shim(root: Path) -> Path:
    """Copy the shim into the agent's work directory ``root`` (a directory 0711 the agent owns, the file
    0644), replacing any older copy atomically; returns the copy's path. Why a copy: a worker running
    as a mapped uid must read the script its interpreter runs, and the agent's own source tree may be
    private (a clone under root's 0700 home); the work directory is already one a worker reaches, as
    its job's directory is under it."""
    target = root / SHIM_COPY
    for directory in reversed(target.parents[:len(SHIM_COPY.parents) - 1]):  # lib, then lib/node_agent
        parent_directory(directory)
    st = os.lstat(target.parent)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{target.parent} is not a directory of the agent's user")
    temporary = target.with_name(f".{target.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, SHIM_COPY_MODE)
    try:
        os.fchmod(fd, SHIM_COPY_MODE)  # not narrowed by the umask
        with os.fdopen(fd, "wb", closefd=False) as file:
            file.write(SHIM.read_bytes())
    finally:
        os.close(fd)
    os.replace(temporary, target)  # a worker starting meanwhile runs the old copy or the new, never half of one
    return target


@contextmanager
def signals_blocked(signals: tuple[signal.Signals, ...]) -> Iterator[None]:
    """Block ``signals`` in the calling thread (children inherit the mask); pending ones arrive after."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def open_log(path: Path) -> BinaryIO:
    """A worker's log for appending, the agent's own (0600), never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    return os.fdopen(fd, "ab")


def working_directory(spec: WorkerSpec, layout: WorkDir, hostname: str,
                      run_as: RunAs | None = None) -> tuple[Path | None, str]:
    """Where ``spec``'s worker starts (``node_agent.workers``, "working directory") and a line for
    its log saying why it starts elsewhere than asked; ``(None, why)`` when it cannot start here.
    A worker that runs as another uid (``run_as``) must be able to enter the directory as that uid."""
    job_dir = layout.job_dir(spec.id.job_id)
    if not spec.working_dir:
        return job_dir, ""
    problem = _unusable_directory(spec.working_dir, run_as)
    if not problem:
        return Path(spec.working_dir), ""
    if spec.working_dir_if_exists:
        return job_dir, (
            f"working directory {spec.working_dir} {problem} on {hostname} (it was a default, such as the "
            f"directory arylctl submit ran in); running in the job's directory {job_dir}"
        )
    return None, f"working directory {spec.working_dir} {problem}"


def _unusable_directory(path: str, run_as: RunAs | None = None) -> str:
    """Why the worker cannot start in ``path``, or "" when it can."""
    if not os.path.exists(path):
        return "does not exist"
    if not os.path.isdir(path):
        return "is not a directory"
    if not os.access(path, os.X_OK):
        return "cannot be entered by the agent's user"
    if run_as is not None and run_as.uid is not None and run_as.gid is not None:
        closed = closed_directory(Path(path), run_as.uid, run_as.gid)
        if closed is not None:
            return (f"cannot be entered by uid {run_as.uid}, which {run_as.user or 'the owner'}'s workers run as "
                    f"({closed} is closed to it)")
    return ""


def contract_environment(spec: WorkerSpec, layout: WorkDir, default_master_addr: str) -> dict[str, str]:
    """The job contract's variables (``node_agent.contract``), which nothing may override; the rest of
    the worker's environment is ``Identities.environment`` (no variable of the agent's own)."""
    return {
        contract.WORLD_SIZE: str(spec.world_size),
        contract.RANK: str(spec.id.rank),
        contract.LOCAL_RANK: str(spec.local_rank),
        contract.MASTER_ADDR: spec.master_addr or default_master_addr,
        contract.MASTER_PORT: str(spec.master_port or DEFAULT_MASTER_PORT),
        contract.CUDA_VISIBLE_DEVICES: ",".join(str(i) for i in spec.gpu_indices),
        contract.CUDA_DEVICE_ORDER: "PCI_BUS_ID",  # NVML's indices (node_agent.gpus)
        contract.JOB_ID: spec.id.job_id,
        contract.INCARNATION: str(spec.id.incarnation),
        contract.CHECKPOINT_DIR: str(layout.checkpoint_dir(spec.id.job_id)),
        contract.PROGRESS_FILE: str(layout.progress_file(spec.id)),
        contract.STOP_NOTICE_FILE: str(layout.stop_notice_file(spec.id)),
        contract.CHECKPOINT_ACK_FILE: str(layout.ack_file(spec.id)),
    }


def worker_environment(
    spec: WorkerSpec, layout: WorkDir, agent_env: Mapping[str, str], default_master_addr: str,
    identities: Identities | None = None, secrets_file: str = "",
) -> dict[str, str]:
    """The worker's whole environment (``node_agent.identity``), its secret references resolved from
    ``secrets_file`` (``node_agent.secrets``); ``Refused`` for a job env it refuses."""
    identities = identities or Identities()
    return identities.environment(
        spec.user, layout.job_dir(spec.id.job_id), secrets.resolve(dict(spec.env), secrets_file),
        {**contract_environment(spec, layout, default_master_addr), **batch_environment(spec, layout)}, agent_env,
    )


def batch_environment(spec: WorkerSpec, layout: WorkDir) -> dict[str, str]:
    """The contract's batch variables (``node_agent.contract``), only for a job with batch limits."""
    if spec.batch is None:
        return {}
    return {
        contract.LOCAL_BATCH_SIZE: str(spec.local_batch_size),
        contract.ACCUM_STEPS: str(spec.accum_steps),
        contract.INIT_BATCH_SIZE: str(spec.init_batch_size),
        contract.MAX_BATCH_SIZE: str(spec.max_batch_size),
        contract.MAX_LOCAL_BATCH_SIZE: str(spec.max_local_batch_size),
        contract.BATCH_FILE: str(layout.batch_file(spec.id)),
    }


def log_header(spec: WorkerSpec, wall_time: float) -> str:
    """The line that opens each incarnation's part of a worker's log (``wall_time``: the agent's clock)."""
    now = datetime.fromtimestamp(wall_time, UTC).isoformat(timespec="seconds")
    return (
        f"===== {now} aryl-agent: incarnation {spec.id.incarnation}, rank {spec.id.rank} of world size "
        f"{spec.world_size}, GPUs [{','.join(map(str, spec.gpu_indices))}]: {shlex.join(spec.command)}\n"
    )


def not_found_hint(spec: WorkerSpec, users_path: str) -> str:
    """What an exit status 127 (a command not found, by the shim or by a shell in the job) most often
    means here: the workers' PATH is not the agent's nor the submitter's."""
    path = dict(spec.env).get("PATH", users_path)
    where = "the job's env" if "PATH" in dict(spec.env) else "the agent's [users] path"
    return (f"127 means a command was not found: the workers' PATH is {path} ({where}), not the shell's that "
            "submitted the job; give the program's full path (e.g. /usr/bin/python3), or add its directory "
            "to users.path (ARYL_USERS__PATH) on the agents")
