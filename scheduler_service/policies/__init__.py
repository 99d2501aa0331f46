"""Built-in scheduling policies. Importing this package registers them by name."""

from __future__ import annotations

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.registry import FaultsFirst, policies
from scheduler_service.policies import aryl, dl2, drf, fifo, gavel, optimus, pollux, qos, sia, tiresias  # noqa: F401  (registers the policies)


def create_policy(name: str, params: PolicyParams | None = None) -> FaultsFirst:
    """The registered policy ``name`` (behind ``FaultsFirst``: LOST servers' jobs are evicted first);
    UnknownPolicy (listing the names) otherwise."""
    return policies.create(name, params)
