"""``arylctl``: the command line (``arylctl.cli``) and the Python client (``arylctl.client``) of Aryl.

Where things are:

- ``client``: :class:`~arylctl.client.ArylClient`, one method per RPC; its connection and failover among
  schedulers (``connection``), its failures (``errors``), its event streams (``streams``) and its
  submissions' retries (``retries``).
- ``spec``: every job spec built and read: ``job_spec``, a ``-f`` file, ``submit``'s flags.
- ``cli``: the entry point ``main``, the global flags, and what an RPC failure tells the user.
- ``args``: argument types and the parser; ``output``: tables, fields, times, ``-o`` and exit codes.
- ``commands``: one module per command group, each registering its own parser and handlers
  (``commands.REGISTRATIONS`` lists them in ``--help`` order); ``certs`` registers ``certs`` the same way.
"""

from __future__ import annotations

import os
import sys

# arylctl as a program (its console script): gRPC's C core writes log lines of its own to stderr (a failed TLS
# handshake, ...) ahead of arylctl's one-line error, which names the cause and the fix; the terminal gets
# arylctl's messages only. gRPC reads the variable once, when it is first imported, which is why this is
# here, before ``arylctl.cli`` imports it. A GRPC_VERBOSITY set by the user (to debug a connection) wins.
# A program that imports the client keeps gRPC's logging as it configured it.
if os.path.basename(sys.argv[0] if sys.argv else "") == "arylctl":
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
