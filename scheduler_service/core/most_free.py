"""Placement in GPU counts: a server is a number of free GPUs, a job a number of GPUs, and each GPU a job
takes comes from the server with the most free GPUs at that moment. The Pollux study's baselines placed
this way (``policies.tiresias``, ``policies.optimus``), and so does the simulator's goodput model
(``simulator.goodput_sim``); the registered policies place on a ``ClusterSnapshot`` with ``core.placement``.

Pure: no I/O, no wall clock; deterministic (ties go to the first server in the mapping's order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def place_most_free(free: dict[int, int], count: int) -> list[int]:
    """Take ``count`` GPUs, each time from the server with the most free GPUs (the first such in
    ``free``'s order): as many as it has or as are still needed. ``free`` is updated; returns the
    server of every GPU taken, in order. Raises ValueError if there are not enough."""
    taken: list[int] = []
    while len(taken) < count:
        server = max(free, key=lambda s: free[s], default=None)
        if server is None or free[server] <= 0:
            raise ValueError(f"{count} GPUs requested, only {len(taken)} free")
        num = min(free[server], count - len(taken))
        taken.extend([server] * num)
        free[server] -= num
    return taken


def place_in_order(order: Iterable[int], gpus: Mapping[int, int], kept: Mapping[int, list[int]],
                   capacity: Mapping[int, int]) -> dict[int, list[int]]:
    """Placements (one server per GPU) for the jobs of ``order`` that need ``gpus`` and are not ``kept``
    where they are, in that order, each by ``place_most_free`` on what ``capacity`` (GPUs per server, in
    server order) leaves after the kept ones; the kept ones included."""
    free = dict(capacity)
    for servers in kept.values():
        for s in servers:
            free[s] -= 1
    free = {s: n for s, n in free.items() if n > 0}
    placed = {k: list(v) for k, v in kept.items()}
    for key in order:
        if gpus[key] > 0 and key not in placed:
            placed[key] = place_most_free(free, gpus[key])
    return placed
