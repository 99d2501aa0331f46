"""Who is acting: the authenticated caller of the RPC being served (``api.auth`` sets it), recorded as
every event's ``actor`` (``store.changes``). "" for the scheduler's own decisions and without
identities (``security.insecure``)."""

from __future__ import annotations

import contextvars

ACTOR: contextvars.ContextVar[str] = contextvars.ContextVar("aryl_actor", default="")


def current_actor() -> str:
    return ACTOR.get()
