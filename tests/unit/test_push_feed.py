"""The feed from the scheduler to its desired-state streams' own process (``scheduler_service.push_process``,
issue 35 item 2): a committing thread never waits for that process, and no frame is lost or reordered.
"""

from __future__ import annotations

import pickle
import socket
import struct
import time

from scheduler_service.push_process import PushFeed
from tests.helpers import scaled_timeout


def test_the_feed_never_blocks_the_committer_and_keeps_every_frame_in_order() -> None:
    """Frames that do not fit in the socket wait in the backlog, sent in order by the feed's thread."""
    ours, theirs = socket.socketpair()
    theirs.settimeout(scaled_timeout(30))
    feed = PushFeed()
    try:
        feed.attach(ours)
        many = [f"server-{i:05d}" for i in range(64)]
        started = time.monotonic()
        for i in range(2_000):  # far more than the socket holds while nobody reads
            feed.changed([f"{name}-{i}" for name in many])
        assert time.monotonic() - started < scaled_timeout(10)  # nothing waited for the reader
        reader = theirs.makefile("rb")
        for i in range(2_000):
            (size,) = struct.unpack("!I", reader.read(4))
            kind, ids = pickle.loads(reader.read(size))
            assert (kind, ids[0]) == ("changed", f"server-00000-{i}")
    finally:
        feed.close()
        ours.close()
        theirs.close()
