"""Free loopback ports for the processes a launcher starts and tells where to listen: the demo's
services, the tests' and the benchmarks' schedulers, agents and routers.

A port is probed by binding port 0 and closing the socket, so it is free again at once, and the
kernel may well hand the same one to the next probe before the first process has bound it (it
happened: a demo agent's metrics port went to a model server started after it, and the agent
exited). So a port is never handed out twice by one process.
"""

from __future__ import annotations

import socket
import threading

# Probes in a row that may all return ports handed out before, before giving up: with about 28,000
# ephemeral ports, one process would have to hand out nearly all of them.
MAX_PROBES = 10_000

_handed_out: set[int] = set()
_lock = threading.Lock()


def free_loopback_port() -> int:
    """A 127.0.0.1 TCP port nothing listens on now, never one this process was given before."""
    for _ in range(MAX_PROBES):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        with _lock:
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError(f"no loopback port left that this process was not given already ({len(_handed_out)} given)")
