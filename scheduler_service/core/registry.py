"""Policies plug in by name: a small Protocol and a registry that refuses duplicates.

Every policy the registry creates runs behind ``FaultsFirst``: the evictions of jobs on LOST servers
(``core.faults``) come first, whatever the policy, so no policy can forget them and none copies them.
``FaultsFirst`` also holds Python's cyclic garbage collector off for the length of one decision
(``_collector_paused``): a decision allocates tens of thousands of short-lived objects and no cycles
worth collecting, and the collections they trigger took half of a 5,000-job decision's time
(``make bench``, ``aryl_cycle_equal_values``). The collector runs again right after.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scheduler_service.core.faults import plan_evictions
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan
from scheduler_service.core.snapshot import ClusterSnapshot


class Policy(Protocol):
    """Contract: ``schedule`` is pure -- no I/O, no wall clock -- and deterministic for a given
    snapshot (including its seed). It may leave jobs pending but must explain each one."""

    @property
    def name(self) -> str: ...  # read-only to callers: a frozen dataclass's field satisfies it

    def schedule(self, snapshot: ClusterSnapshot) -> Plan: ...


@dataclass(frozen=True)
class ReclaimDecision:
    """Which loaned servers to return, and what that does to the jobs on them."""

    servers: tuple[str, ...]                       # in pick order
    preempted: tuple[int, ...]                     # job ids, requeued
    scaled_in: tuple[tuple[int, int, int], ...]    # (job id, workers before, workers after)
    cost_gpu_s: float                              # work lost + restart costs, GPU-seconds


@runtime_checkable
class ReclaimPreviewer(Protocol):
    """Optional, for policies that loan servers: the dry run of a reclaim (``PreviewReclaim``).

    Contract: ``preview_reclaim`` is pure like ``schedule``, and answers what the policy's own
    reclaim would choose if inference needed ``count`` loaned servers back now; it changes nothing.
    A policy whose configuration does not loan raises ``ReclaimPreviewUnsupported``."""

    def preview_reclaim(self, snapshot: ClusterSnapshot, count: int) -> ReclaimDecision: ...


class ReclaimPreviewUnsupported(Exception):
    """The configured policy never loans servers, so there is no reclaim of its to preview."""

    def __init__(self, policy: str) -> None:
        super().__init__(f"policy {policy!r} does not loan inference servers, so it has no reclaim to preview; "
                         "configure a loaning policy (scheduling.policy) to use PreviewReclaim")
        self.policy = policy


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, back on after if it was on (reference counting still
    frees everything that is not in a cycle). Process-wide: a decision running beside another thread's
    holds that thread's cycles until it ends."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


class FaultsFirst:
    """A policy as the registry hands it out: ``core.faults``' evictions first, then the policy on
    the snapshot as those evictions leave it, merged into one plan (``Evictions.merge``)."""

    def __init__(self, policy: Policy, params: PolicyParams | None = None) -> None:
        self.policy = policy
        self.name = policy.name
        self.params = params  # with them, a drain honours protection windows (``core.protection``)

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        with _collector_paused():
            evictions = plan_evictions(snapshot, self.params)
            if evictions is None:
                return self.policy.schedule(snapshot)
            return evictions.merge(self.policy.schedule(evictions.after))

    def preview_reclaim(self, snapshot: ClusterSnapshot, count: int) -> ReclaimDecision:
        """The policy's own reclaim choice (``ReclaimPreviewer``), on the snapshot as this cycle's
        evictions would leave it; ReclaimPreviewUnsupported when the policy has none."""
        if not isinstance(self.policy, ReclaimPreviewer):
            raise ReclaimPreviewUnsupported(self.name)
        evictions = plan_evictions(snapshot, self.params)
        return self.policy.preview_reclaim(snapshot if evictions is None else evictions.after, count)


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

    def create(self, name: str, params: PolicyParams | None = None) -> FaultsFirst:
        """The policy ``name`` built with ``params``, behind ``FaultsFirst``."""
        try:
            factory = self._factories[name]
        except KeyError:
            raise UnknownPolicy(f"unknown policy {name!r}; registered: {', '.join(self.names())}") from None
        params = params or PolicyParams()
        return FaultsFirst(factory(params), params)

    def names(self) -> list[str]:
        return sorted(self._factories)


policies = PolicyRegistry()
