"""Built-in scheduling policies. Importing this package registers them by name."""

from __future__ import annotations

from typing import Any

from scheduler_service.core.registry import Policy, policies
from scheduler_service.policies import fifo  # noqa: F401  (registers "fifo")


def create_policy(name: str, **params: Any) -> Policy:
    """The registered policy ``name``; UnknownPolicy (listing the names) otherwise."""
    return policies.create(name, **params)
