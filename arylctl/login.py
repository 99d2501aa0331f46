"""``arylctl login``: keep the user's token in a file only they can read.

Must never write through a symbolic link, nor change the mode of a file the token path merely points
at: a link planted at ``~/.config/aryl/token`` would otherwise make ``login`` truncate and chmod its
target (the link is refused; the user removes it or names another ``--file``).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

__all__ = ["UnsafeTokenPath", "store_token"]


class UnsafeTokenPath(Exception):
    """The token path is a symbolic link or not a regular file; the message says what to do."""


def store_token(path: Path, token: str) -> None:
    """Write ``token`` and a newline to ``path``, mode 0600, creating its directory (0700) if needed.

    The file is opened with ``O_NOFOLLOW`` (a link at ``path`` is refused, never followed) and its
    mode set on the open descriptor, so neither the write nor the chmod can reach another file."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a FIFO fails, not hangs
    try:
        fd = os.open(path, flags, stat.S_IRUSR | stat.S_IWUSR)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeTokenPath(f"{path} is a symbolic link: refusing to write the token through it (it would "
                                  "overwrite and chmod the file it points to); remove the link, or give --file "
                                  "PATH") from None
        if exc.errno == errno.ENXIO:
            raise UnsafeTokenPath(f"{path} is not a regular file; remove it, or give --file PATH") from None
        raise
    with os.fdopen(fd, "wb") as out:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeTokenPath(f"{path} is not a regular file; remove it, or give --file PATH")
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)  # before the token is in it, when the file existed
        os.ftruncate(fd, 0)
        out.write(token.encode() + b"\n")
