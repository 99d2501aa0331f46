"""Policies plug in by name: a small Protocol and a registry that refuses duplicates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan
from scheduler_service.core.snapshot import ClusterSnapshot


class Policy(Protocol):
    """Contract: ``schedule`` is pure -- no I/O, no wall clock -- and deterministic for a given
    snapshot (including its seed). It may leave jobs pending but must explain each one."""

    @property
    def name(self) -> str: ...  # read-only to callers: a frozen dataclass's field satisfies it

    def schedule(self, snapshot: ClusterSnapshot) -> Plan: ...


PolicyFactory = Callable[[PolicyParams], Policy]


class UnknownPolicy(KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class PolicyRegistry:
    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}

    def register(self, name: str) -> Callable[[PolicyFactory], PolicyFactory]:
        def add(factory: PolicyFactory) -> PolicyFactory:
            if name in self._factories:
                raise ValueError(f"policy {name!r} is already registered")
            self._factories[name] = factory
            return factory

        return add

    def create(self, name: str, params: PolicyParams | None = None) -> Policy:
        try:
            factory = self._factories[name]
        except KeyError:
            raise UnknownPolicy(f"unknown policy {name!r}; registered: {', '.join(self.names())}") from None
        return factory(params or PolicyParams())

    def names(self) -> list[str]:
        return sorted(self._factories)


policies = PolicyRegistry()
