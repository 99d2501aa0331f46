"""Built-in scheduling policies. Importing this package registers them by name."""

from __future__ import annotations

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.registry import Policy, policies
from scheduler_service.policies import aryl, fifo  # noqa: F401  (registers the policies)


def create_policy(name: str, params: PolicyParams | None = None) -> Policy:
    """The registered policy ``name``; UnknownPolicy (listing the names) otherwise."""
    return policies.create(name, params)
