"""The worker shim: the small parent the agent puts between itself and every worker command.

    python -I shim.py --exit-file PATH -- COMMAND [ARGS...]

Why it exists: the agent must survive its own restart (an upgrade must not kill training), and a
restarted agent cannot wait for processes that are not its children. So the agent starts this shim
as the leader of a new session and process group; the shim runs the real command as its child and,
when the command ends, writes the command's exit status to ``--exit-file`` (JSON ``{"exit_code",
"message"}``, written atomically) before it exits itself. Any agent, this one or its successor,
finds the status there.

What it does besides:
- SIGTERM or SIGINT sent to the shim is relayed, once, to its whole process group (the command
  and everything the command started), so ``kill <shim>`` stops the whole worker gracefully; the
  agent starts the shim with both signals blocked and the shim unblocks them once it can relay;
- a command that cannot be started is recorded as exit status 127 (126: not executable) with the
  reason, and written to the worker's log (the shim's stderr);
- when the command exits, processes it left behind in the group are killed, so a worker never
  leaves orphans (what a container runtime does when the main process exits).

It must stay pure standard library and import nothing from Aryl: it runs with ``python -I`` (no
site packages, no PYTHON* variables of the job's environment) so that whatever the job puts in its
environment cannot break it. For the same reason it must stay one file: the agent runs a copy of it
in its work directory (``launch.install_shim``), which a worker's uid can read even when the
agent's source tree is private to root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
RELAYED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def parse(argv: list[str]) -> tuple[str, list[str]]:
    if len(argv) < 4 or argv[0] != "--exit-file" or argv[2] != "--":
        raise SystemExit("usage: shim.py --exit-file PATH -- COMMAND [ARGS...]")
    return argv[1], argv[3:]


def record_exit(path: str, exit_code: int, message: str = "") -> None:
    """Write the exit record atomically; a failure is logged, the shim still exits with the status."""
    temporary = f"{path}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump({"exit_code": exit_code, "message": message}, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        print(f"aryl-shim: cannot record exit status {exit_code} in {path}: {exc}", file=sys.stderr, flush=True)


def relay_signals_to_group() -> list[int]:
    """SIGTERM/SIGINT to the shim go to its whole group, once: the shim receives its own relayed
    copy too, and ``echoes`` swallows it instead of relaying forever. Returns the list of signals
    relayed so far (a signal that came before the command started must still reach it)."""
    echoes: dict[int, int] = {sig: 0 for sig in RELAYED_SIGNALS}
    relayed: list[int] = []

    def relay(signum: int, _frame: object) -> None:
        if echoes[signum]:
            echoes[signum] -= 1
            return
        echoes[signum] += 1
        relayed.append(signum)
        os.killpg(os.getpgrp(), signum)

    for sig in RELAYED_SIGNALS:
        signal.signal(sig, relay)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # no terminal; the worker must not die with one
    # The agent starts the shim with these signals blocked, so a stop that comes while Python is
    # still starting waits here instead of killing the shim before it can record anything.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, RELAYED_SIGNALS)
    return relayed


def group_members(pgid: int) -> list[int]:
    """Pids in process group ``pgid`` other than this one (Linux /proc; elsewhere: none known)."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as file:
                fields = file.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:  # fields after "(comm)": state, ppid, pgrp, ...
            members.append(int(entry))
    return members


def kill_leftovers() -> None:
    leftovers = group_members(os.getpgrp())
    for pid in leftovers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if leftovers:
        print(f"aryl-shim: killed {len(leftovers)} leftover process(es) of the worker", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    exit_file, command = parse(argv)
    relayed = relay_signals_to_group()
    try:
        child = subprocess.Popen(command)
    except FileNotFoundError as exc:
        return fail(exit_file, EXIT_NOT_FOUND, f"command not found: {command[0]} ({exc.strerror})")
    except PermissionError as exc:
        return fail(exit_file, EXIT_NOT_EXECUTABLE, f"command not executable: {command[0]} ({exc.strerror})")
    except OSError as exc:
        return fail(exit_file, EXIT_NOT_FOUND, f"cannot start {command[0]}: {exc}")
    if relayed:  # stopped while the command was starting
        child.send_signal(relayed[0])
    exit_code = child.wait()
    record_exit(exit_file, exit_code)
    kill_leftovers()
    return exit_code if exit_code >= 0 else 128 - exit_code


def fail(exit_file: str, exit_code: int, message: str) -> int:
    print(f"aryl-shim: {message}", file=sys.stderr, flush=True)
    record_exit(exit_file, exit_code, message)
    return exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
