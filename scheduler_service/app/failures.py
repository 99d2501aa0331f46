"""What the use cases answer when the database itself fails: the api layer's backstop asks here.

``store.transactions`` already turns a lost connection or a timed-out lock/statement into
``Unavailable`` inside every unit of work; ``database_unavailable`` classifies any database error
that reaches a servicer some other way, so the client reads "retry" instead of "internal error".
The api layer may not look into the store itself (docs/architecture.md), hence this one door.

Never: retry, or swallow an error that is not the database's.
"""

from __future__ import annotations

from scheduler_service.errors import Unavailable
from scheduler_service.store.db import BUSY, UNREACHABLE, connection_lost, database_busy


def database_unavailable(exc: BaseException) -> Unavailable | None:
    """``Unavailable`` with the message a user can act on when ``exc`` is the database being
    unreachable or too busy (a lock or statement timed out); None for any other error."""
    if connection_lost(exc):
        return Unavailable(UNREACHABLE)
    if database_busy(exc):
        return Unavailable(BUSY)
    return None
