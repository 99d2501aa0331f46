"""The newest scheduler epoch this agent has seen, kept in a small file of its work directory
(``scheduler-epoch``) so that the fence survives an agent restart: a restarted agent still refuses
a deposed scheduler whose epoch is older than one it saw before (``node_agent.desired``).

Written atomically (a temporary file, fsync, rename) whenever the epoch rises, before the state that
raised it is accepted. A file that cannot be read as an epoch stops the agent with its path: starting
from 0 would silently drop the fence.

Never: decide anything (``DesiredStateTracker`` does).
"""

from __future__ import annotations

import os
from pathlib import Path

from aryl_common.entry import BadInput

FILE_NAME = "scheduler-epoch"


class EpochFileError(BadInput):
    """The epoch file exists but holds no epoch (the agent exits 2, naming it)."""


class EpochFile:
    def __init__(self, work_dir: Path) -> None:
        self.path = work_dir / FILE_NAME

    def load(self) -> int:
        """The epoch saved last; 0 when there is no file (a new agent)."""
        try:
            text = self.path.read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return 0
        except (OSError, UnicodeDecodeError) as exc:
            raise EpochFileError(f"cannot read the newest scheduler epoch from {self.path}: {exc}") from exc
        if not text.isdigit():
            raise EpochFileError(
                f"{self.path} holds {text[:40]!r}, not a scheduler epoch; delete it only if the scheduler's "
                "database was reset (the agent then trusts any epoch it meets first)"
            )
        return int(text)

    def save(self, epoch: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{FILE_NAME}.{os.getpid()}")
        with temporary.open("w", encoding="ascii") as out:
            out.write(f"{epoch}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.path)
