"""Who a worker runs as, with which environment, and the permissions of its directories.

Nouns:
- a job's *owner* is the user the scheduler says submitted it (``DesiredWorker.user``: the
  authenticated identity when the scheduler authenticates, else the name the client gave);
- the *user map* (``[users]`` in the agent's config, ``UsersSection``) maps owners to a uid and a gid:
  ``map = "alice:1001:1001, bob:1002:1002"``, and/or ``map_file`` (one ``name:uid:gid`` a line,
  ``#`` comments), and, with ``use_passwd``, the system's user database for names in neither (an
  account there below ``min_uid``, a system account such as ``daemon``, only through the maps);
- the *run-as* of a worker (``RunAs``): the uid/gid its shim and command run as, or the agent's own.

Rules (``Identities.resolve``):
- ``run_as = "owner"`` and the agent is root: the worker runs as its owner's mapped uid/gid, with no
  supplementary groups. An owner that maps to nothing is refused ("no uid mapped for user ..."),
  unless ``default_uid``/``default_gid`` are set (>= 0): then it runs as those. An owner named
  ``root``, or any mapping to uid 0 or gid 0, is refused unless ``allow_root``;
- ``run_as = "owner"`` is the default, so a root agent never runs a job's code as root unless told to;
  one that can map nobody refuses every job and warns at start-up (``start_warning``);
- otherwise (``run_as = "agent"``, an explicit opt-in, or an agent that is not root and so cannot
  switch) the worker runs as the agent's uid; the rules below still apply.
- a switching agent must not depend on what only root can reach: the shim runs on an interpreter
  every uid can execute (``shim_python``: ``[users] python``, else the agent's own interpreter's real
  file or ``python3`` on the workers' ``PATH``, whichever others can reach), and ``aryl-agent`` refuses
  to start when its work directory or checkpoint root lies under a directory they cannot enter
  (``unreachable_directory``). ``arylctl certs`` writes a map file for the users it issues tokens to.

Environment (``clean_environment``): never the agent's own. A worker gets a minimal base (``PATH`` =
``[users] path``, ``HOME`` = its job's private directory, ``LANG=C.UTF-8``, ``USER``/``LOGNAME`` = its
owner), the agent's variables named in ``pass_env`` (e.g. a container's ``LD_LIBRARY_PATH`` for
CUDA), the job's ``env``, then the job contract's variables, which nothing overrides. A job whose env
sets a dynamic-loader variable (any ``LD_*`` name, e.g. ``LD_PRELOAD``, ``LD_LIBRARY_PATH``) is
refused (not silently dropped, so the owner learns why) unless ``allow_loader_env``.

Directories (``Supervisor._spawn``): the job's directory (its default working directory and ``HOME``),
its checkpoint directory and its run directory (exit and progress files) are owned by the run-as
uid/gid with mode 0700; their parents (``jobs/``, ``run/``, ``logs/``, the checkpoint root) are 0711,
so a worker reaches its own directory without listing anyone else's. Logs stay the agent's (0700
directory, 0600 file; the worker writes through the descriptor it inherits; its owner reads them
with ``arylctl logs``), so a worker can never point the agent at another file through its log. The
state file ``run/workers.json`` (every co-located job's environment) is 0600. The agent reads what
a worker may write (exit and progress files) without following links and only from regular files.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from node_agent.config import UsersSection

PRIVATE_DIR_MODE = 0o700
PARENT_DIR_MODE = 0o711
PRIVATE_FILE_MODE = 0o600


class Refused(Exception):
    """A worker that must not start here; the message says why and what setting would allow it."""


@dataclass(frozen=True)
class RunAs:
    """The uid/gid a worker runs as; ``uid is None``: the agent's own (no switch)."""

    user: str
    uid: int | None = None
    gid: int | None = None

    @property
    def switches(self) -> bool:
        return self.uid is not None


def parse_map(text: str, where: str) -> dict[str, tuple[int, int]]:
    """``name:uid:gid`` entries separated by commas, whitespace or new lines (``#`` starts a comment)."""
    mapping: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        for entry in line.split("#", 1)[0].replace(",", " ").split():
            parts = entry.split(":")
            if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2].isdigit():
                raise ValueError(f"{where}: {entry!r} is not name:uid:gid (e.g. alice:1001:1001)")
            mapping[parts[0]] = (int(parts[1]), int(parts[2]))
    return mapping


class Identities:
    """The ``[users]`` rules of one agent (module doc). ``euid``: the agent's effective uid (tests)."""

    def __init__(self, section: UsersSection | None = None, *, euid: int | None = None) -> None:
        self.section = section or UsersSection()
        self.euid = os.geteuid() if euid is None else euid
        self.mapping = parse_map(self.section.map, "[users] map")
        if self.section.map_file:
            file_map = parse_map(Path(self.section.map_file).read_text(encoding="utf-8"), self.section.map_file)
            self.mapping = {**file_map, **self.mapping}

    @property
    def switching(self) -> bool:
        """Whether workers run as their owners: ``run_as = "owner"`` and the agent is root."""
        return self.section.run_as == "owner" and self.euid == 0

    def start_warning(self) -> str | None:
        """What the agent warns of at start-up: every owner would be refused -- switching, with no map, no
        map file, no passwd lookup and no default uid (a root agent with the default settings) --, or every
        worker runs as root (a root agent told ``run_as = "agent"``)."""
        s = self.section
        if s.run_as == "agent" and self.euid == 0:
            return ("this agent runs as root with [users] run_as = \"agent\": every job's workers run as root; "
                    "run_as = \"owner\" (the default) runs each as its owner's mapped uid (docs/security.md)")
        if not self.switching or self.mapping or s.use_passwd or s.default_uid >= 0:
            return None
        return ("this agent runs as root and maps no job owner to a uid: every job will be refused until [users] "
                "map, map_file (arylctl certs init writes one: DIR/users), use_passwd or default_uid is set "
                "(docs/security.md); run_as = \"agent\" runs every worker as root instead, an explicit and "
                "insecure opt-out for single-user machines")

    def maps_anyone(self) -> bool:
        """Whether some owner can run here as a mapped uid (a switching agent with a map, a map file,
        passwd lookups or a default uid)."""
        s = self.section
        return self.switching and bool(self.mapping or s.use_passwd or s.default_uid >= 0)

    def unreachable_directory(self, setting: str, path: Path) -> str | None:
        """Why workers of mapped uids could not use ``path`` (the agent's ``setting``, e.g.
        ``agent.work_dir``), or None: a directory on the way that others cannot enter. Only for an agent
        that maps someone (``maps_anyone``); the message names the fix."""
        if not self.maps_anyone():
            return None
        closed = closed_directory(path)
        if closed is None:
            return None
        mode = oct(stat.S_IMODE(os.stat(closed).st_mode))
        return (f"{setting} {path} lies under {closed} (mode {mode}), which the job owners' uids cannot enter: "
                f"their workers could not start. Give {setting} a path every uid can reach (e.g. /var/lib/aryl/agent "
                f"or /tmp/aryl-agent), or chmod o+x {closed}")

    def shim_python(self) -> tuple[str, str | None]:
        """The interpreter that runs the worker shim, and a warning when no good one was found.

        The shim is standard library only and runs with ``-I``, so any Python 3 does. ``[users] python``
        wins; an agent that does not switch uses its own. A switching agent must not depend on its own
        interpreter path, which may be private (a venv under root's 0700 home): it takes the first of
        its own interpreter's real file and ``python3`` on the workers' ``PATH`` that every uid can
        reach, and warns, naming ``[users] python``, when neither can be."""
        if self.section.python:
            return self.section.python, None
        if not self.switching:
            return sys.executable, None
        candidates = [os.path.realpath(sys.executable)]
        on_path = shutil.which("python3", path=self.section.path)
        if on_path:
            candidates.append(os.path.realpath(on_path))
        for candidate in candidates:
            try:
                executable = bool(os.stat(candidate).st_mode & stat.S_IXOTH)
            except OSError:
                continue
            if executable and closed_directory(Path(candidate).parent) is None:
                return candidate, None
        return sys.executable, (
            f"no Python interpreter that the job owners' uids can run was found (this agent's, {sys.executable}, "
            f"lies in a private directory, and there is no python3 on [users] path {self.section.path}): their "
            "workers will fail to start; set [users] python (ARYL_USERS__PYTHON) to one, e.g. /usr/bin/python3"
        )

    def resolve(self, user: str) -> RunAs:
        """Who ``user``'s worker runs as; ``Refused`` with the reason when it must not run here."""
        if not self.switching:
            return RunAs(user)
        allow_root = self.section.allow_root
        if user == "root" and not allow_root:
            raise Refused("jobs of user root are refused on this server ([users] allow_root = false)")
        ids = self.mapping.get(user)
        if ids is None and self.section.use_passwd and user:
            try:
                entry = pwd.getpwnam(user)
                ids = (entry.pw_uid, entry.pw_gid)
            except KeyError:
                ids = None
            # A token named "daemon" must not become the system's daemon: system accounts only by name in a map.
            if ids is not None and ids[0] < self.section.min_uid:
                raise Refused(
                    f"user {user!r} is the system account uid {ids[0]}, below [users] min_uid = "
                    f"{self.section.min_uid}: only [users] map or map_file can run its jobs"
                )
        if ids is None and self.section.default_uid >= 0:
            ids = (self.section.default_uid, self.section.default_gid)
        if ids is None:
            raise Refused(
                f"no uid mapped for user {user!r} on this server (add it to [users] map or map_file -- arylctl "
                "certs add DIR --user NAME writes DIR/users, a map_file --, or set [users] default_uid)"
            )
        uid, gid = ids
        if (uid == 0 or gid == 0) and not allow_root:
            raise Refused(f"user {user!r} maps to uid {uid} gid {gid}: root is refused ([users] allow_root = false)")
        return RunAs(user, uid, gid)

    def environment(
        self, user: str, home: Path, job_env: Mapping[str, str], contract_env: Mapping[str, str],
        agent_env: Mapping[str, str],
    ) -> dict[str, str]:
        """The worker's whole environment (module doc); ``Refused`` for a loader variable not allowed."""
        loader = sorted(name for name in job_env if name.startswith("LD_"))
        if loader and not self.section.allow_loader_env:
            raise Refused(
                f"the job's env sets {', '.join(loader)}: dynamic-loader variables are refused on this server "
                "([users] allow_loader_env = false)"
            )
        env = {"PATH": self.section.path, "HOME": str(home), "LANG": "C.UTF-8"}
        if user:
            env.update(USER=user, LOGNAME=user)
        env.update({name: agent_env[name] for name in self.section.pass_env if name in agent_env})
        env.update(job_env)
        env.update(contract_env)
        return env


def closed_directory(path: Path, uid: int | None = None, gid: int | None = None) -> Path | None:
    """The first existing directory from ``/`` down to ``path`` that ``uid``/``gid`` (with no
    supplementary groups, as workers run) cannot enter, or None. Without ``uid``: one that users other
    than its owner and group cannot enter (no ``o+x``), i.e. where some unprivileged uid could not
    reach ``path``. Parts that do not exist yet count as reachable (the agent creates them 0711)."""
    current = Path("/")
    for part in Path(os.path.abspath(path)).parts[1:]:
        current = Path(os.path.realpath(current / part))
        try:
            st = os.stat(current)
        except OSError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            continue
        if uid is not None and st.st_uid == uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif gid is not None and st.st_gid == gid:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return current
    return None


def private_directory(path: Path, run_as: RunAs) -> None:
    """Create ``path`` (parents 0711 where missing) owned by ``run_as`` with mode 0700. A path that is
    a link is refused: a worker must not make the agent chown something else."""
    parent_directory(path.parent)
    path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    if path.is_symlink() or not path.is_dir():
        raise OSError(f"{path} is not a directory")
    if run_as.switches:
        assert run_as.uid is not None and run_as.gid is not None
        os.chown(path, run_as.uid, run_as.gid, follow_symlinks=False)
    os.chmod(path, PRIVATE_DIR_MODE)


def agent_directory(path: Path) -> None:
    """Create ``path`` (parents 0711) as the agent's own, mode 0700 (logs of one job)."""
    parent_directory(path.parent)
    path.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or st.st_uid != os.geteuid():
        raise OSError(f"{path} is not a directory of the agent's user")
    os.chmod(path, PRIVATE_DIR_MODE)


def parent_directory(path: Path) -> None:
    """Create ``path`` (and its parents) with mode 0711 where missing; an existing one the agent owns
    is set to 0711 (reachable, not listable)."""
    path.mkdir(mode=PARENT_DIR_MODE, parents=True, exist_ok=True)
    try:
        if os.lstat(path).st_uid == os.geteuid():
            os.chmod(path, PARENT_DIR_MODE)
    except OSError:
        pass


def read_worker_file(path: Path, limit: int = 1 << 16) -> str | None:
    """The text of a file a worker may write (exit, progress), read without following a link, without
    blocking on a FIFO and only from a regular file; None when there is none such."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
