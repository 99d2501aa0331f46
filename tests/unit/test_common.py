"""``aryl_common``: the plumbing the scheduler, the agent and the router share (the parts their own
tests do not already cover: the one wording of a worker's exit, the capped backoff, free ports, and where an
agent watches its desired state)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from aryl_common import ports
from aryl_common.backoff import Backoff
from aryl_common.channels import DESIRED_STATE_ADDRESS_KEY, DESIRED_STATE_PORT_KEY, desired_state_addresses
from aryl_common.exits import describe_exit
from scheduler_service.worker_outcomes import Verdict, judge_exits


@pytest.mark.parametrize(
    "status, words",
    [(0, "exited with status 0"), (3, "exited with status 3"), (-9, "killed by SIGKILL"),
     (-11, "killed by SIGSEGV"), (-200, "killed by signal 200")],
)
def test_an_exit_status_reads_the_same_wherever_it_is_described(status: int, words: str) -> None:
    assert describe_exit(status) == words


def test_the_scheduler_explains_a_failed_job_in_the_agents_words() -> None:
    verdict, why = judge_exits({0: 0, 1: -9}, num_workers=2, restart_policy="NEVER", restarts=0, max_restarts=0)
    assert verdict is Verdict.FAILED
    assert why == "rank 1 failed (killed by SIGKILL); restart policy NEVER"


def test_a_capped_backoff_below_its_default_start_starts_at_the_cap() -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(0.2)
    backoff = Backoff.capped(0.2)
    assert all(0.1 <= backoff.next_delay() <= 0.2 for _ in range(5))
    assert Backoff.capped(10.0).initial_s == 0.5


def test_a_process_is_never_handed_one_free_port_twice() -> None:
    # The kernel may hand a probed port out again once its probe socket closes: 1,000 probes of the
    # ephemeral range repeat one almost surely (a birthday bound over ~28,000 ports), this helper never,
    # nor when threads ask at once (the demo, the tests and the benchmarks take their ports from it).
    with ThreadPoolExecutor(8) as pool:
        given = list(pool.map(lambda _: ports.free_loopback_port(), range(1000)))
    assert len(set(given)) == len(given)


def test_a_registration_answer_names_where_to_watch_a_standbys_process_first_then_the_schedulers_own() -> None:
    at = "10.0.0.5:50051"  # the scheduler the agent reached
    both: dict[str, str | bytes] = {DESIRED_STATE_ADDRESS_KEY: b"10.0.0.7:50061", DESIRED_STATE_PORT_KEY: "50060"}
    assert desired_state_addresses(both, at) == ["10.0.0.7:50061", "10.0.0.5:50060"]
    assert desired_state_addresses({DESIRED_STATE_PORT_KEY: "50060"}, at) == ["10.0.0.5:50060"]
    # The same process named twice is watched once; values that are not a host:port or a port are left out.
    assert desired_state_addresses({DESIRED_STATE_ADDRESS_KEY: "10.0.0.5:50060", DESIRED_STATE_PORT_KEY: "50060"},
                                   at) == ["10.0.0.5:50060"]
    assert desired_state_addresses({DESIRED_STATE_ADDRESS_KEY: "nohost", DESIRED_STATE_PORT_KEY: "70000"}, at) == []
    assert desired_state_addresses({DESIRED_STATE_ADDRESS_KEY: "h:x", DESIRED_STATE_PORT_KEY: "-1"}, at) == []
    assert desired_state_addresses({}, at) == []
