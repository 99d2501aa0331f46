"""Issue 37, 9c: a scheduler whose start is slow after it took the leader lease (the solvers' warm-up, a
loaded machine) keeps the lease: it is renewed from the moment it is taken, not once the service is up,
so the scheduler never steps down and re-takes it in a new term during its own start."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from scheduler_service import server
from scheduler_service.server import serve_in_background
from tests.harness import scheduler_config

pytestmark = pytest.mark.postgres

# Long enough that the renewing thread, every 0.25 s, is not stalled past it by the other tests' load on a 2-core
# machine (at 1 s, one CI run saw "not renewed for 1s" 3 s into the real warm-up, with another test file beside it).
LEASE_S = 3.0


def test_a_slow_start_after_taking_the_lease_keeps_the_lease_and_its_term(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    services: list[server.SchedulerService] = []
    seen: dict[str, Any] = {}
    real_init, real_warm_up = server.SchedulerService.__init__, server.warm_up_solvers

    def recording_init(self: server.SchedulerService, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        services.append(self)

    def slow_warm_up() -> None:
        # Three leases long (the lease already taken): without renewals meanwhile it lapses before the service is up.
        leadership = services[-1].leadership
        assert leadership is not None and leadership.leading
        seen["epoch"], deadline = leadership.epoch, leadership._deadline
        pause = threading.Event()
        for _ in range(int(3 * LEASE_S / 0.05)):
            pause.wait(0.05)
        seen["renewed"] = leadership._deadline > deadline
        real_warm_up()

    monkeypatch.setattr(server.SchedulerService, "__init__", recording_init)
    monkeypatch.setattr(server, "warm_up_solvers", slow_warm_up)
    handle = serve_in_background(scheduler_config(postgres_url, ha={"lease_s": LEASE_S, "renew_s": 0.25}))
    try:
        leadership = handle.service.leadership
        assert leadership is not None
        assert seen["renewed"], "the lease was not renewed while the start went on"
        assert leadership.leading
        assert leadership.epoch == seen["epoch"]  # its first term still: never stepped down and took it again
    finally:
        handle.stop()
