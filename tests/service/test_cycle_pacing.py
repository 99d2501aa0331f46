"""How the scheduler paces its cycles (``service_loops``): after cycles that could place none of the waiting
jobs, newly queued jobs alone wake the next cycle later, doubling up to the periodic tick; any other trigger ends
that wait at once; a cycle the periodic tick woke (no trigger) starts the count again. The loop runs for
real on an asyncio loop with the service's own notifier; the cycle is a stand-in that records when it ran."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import pytest

from scheduler_service.clock import SystemClock
from scheduler_service.config import SchedulerConfig, SchedulingConfig
from scheduler_service.core.plan import ApplyResult, KeepPending, Plan, Reason
from scheduler_service.cycle import CycleReport
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.notify.notifier import AsyncNotifier
from scheduler_service.service_loops import ServiceLoops, fruitless_cycle, queue_backoff_s

WAITING = Plan(pending=(KeepPending(1, Reason.WAITING_FOR_GANG, "no GPUs"),))
NOTHING = ApplyResult(started=(), rejected=(), touched_servers=frozenset())


def report(plan: Plan = WAITING, result: ApplyResult = NOTHING) -> CycleReport:
    return CycleReport(snapshot_jobs=len(plan.pending), plan=plan, result=result, decide_s=0.0, total_s=0.0)


def test_a_fruitless_cycle_left_jobs_waiting_and_changed_nothing() -> None:
    assert fruitless_cycle(report())
    assert not fruitless_cycle(report(plan=Plan()))  # nothing waited: nothing to space out
    for changed in (ApplyResult(started=(2,), rejected=(), touched_servers=frozenset({"s"})),
                    ApplyResult(started=(), rejected=(), touched_servers=frozenset(), scaled=(3,)),
                    ApplyResult(started=(), rejected=(), touched_servers=frozenset(), preempted=(3,)),
                    ApplyResult(started=(), rejected=(), touched_servers=frozenset(), server_steps=(("s", "LOAN"),)),
                    ApplyResult(started=(), rejected=((2, "raced"),), touched_servers=frozenset())):
        assert not fruitless_cycle(report(result=changed))


def test_the_wait_doubles_per_fruitless_cycle_up_to_the_periodic_tick() -> None:
    assert queue_backoff_s(0, 0.05, 2.0) == 0.0
    assert queue_backoff_s(1, 0.05, 2.0) == pytest.approx(0.05)   # the pause, doubled
    assert queue_backoff_s(3, 0.05, 2.0) == pytest.approx(0.35)   # 0.05 x 8, less the pause taken already
    assert queue_backoff_s(10, 0.05, 2.0) == pytest.approx(1.95)  # at most the tick, in all
    assert queue_backoff_s(10_000, 0.05, 2.0) == pytest.approx(1.95)


class RecordingCycle:
    """A stand-in ``SchedulingCycle``: returns ``next_report`` and signals each run."""

    def __init__(self) -> None:
        self.runs = 0
        self.next_report = report()
        self.ran = threading.Condition()

    def run_once(self) -> CycleReport:
        with self.ran:
            self.runs += 1
            self.ran.notify_all()
        return self.next_report


async def _wait_runs(cycle: RecordingCycle, runs: int) -> None:
    def wait() -> None:
        with cycle.ran:
            assert cycle.ran.wait_for(lambda: cycle.runs >= runs, timeout=120), f"cycle {runs} never ran"
    await asyncio.get_running_loop().run_in_executor(None, wait)


async def _until(check: Callable[[], bool]) -> None:
    """Wait (on the loop) until ``check()`` holds; the test's timeout bounds it."""
    while not check():  # noqa: ASYNC110 -- the loop under test keeps a plain counter, no event to wait on
        await asyncio.sleep(0.01)


@asynccontextmanager
async def cycling(interval_s: float, fruitless: int = 0) -> AsyncIterator[tuple[ServiceLoops, AsyncNotifier,
                                                                                RecordingCycle]]:
    """The service's cycle loop running on this event loop over a ``RecordingCycle``, cycles at least
    ``min_cycle_gap_s`` = 10 ms apart, ``fruitless`` cycles counted already; cancelled on exit."""
    config = SchedulerConfig(scheduling=SchedulingConfig(cycle_interval_s=interval_s, min_cycle_gap_s=0.01))
    loops = ServiceLoops(config, SystemClock(), leading=lambda: True,
                         metrics=SchedulerMetrics(read=lambda work: None), demand_outlook=lambda: None)
    loops.fruitless_cycles = fruitless
    notifier = AsyncNotifier(asyncio.get_running_loop())
    cycle = RecordingCycle()
    with ThreadPoolExecutor(max_workers=1) as executor:
        task = asyncio.create_task(loops.cycles(cycle, notifier, executor))  # type: ignore[arg-type]
        try:
            yield loops, notifier, cycle
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


@pytest.mark.timeout(180)
def test_queued_jobs_alone_wait_out_the_backoff_and_any_other_trigger_ends_it() -> None:
    async def scenario() -> None:
        # No periodic tick within the test; as at the end of a long burst into a full cluster: many fruitless
        # cycles in a row.
        async with cycling(120.0, fruitless=40) as (loops, notifier, cycle):
            await _wait_runs(cycle, 1)  # the first cycle runs at once; fruitless too: the wait is the whole tick
            await _until(lambda: loops.fruitless_cycles == 41)
            notifier.jobs_queued()
            await asyncio.sleep(1.0)
            assert cycle.runs == 1  # new jobs alone do not end the wait (a busy machine only delays more)
            notifier.cycle_requested()  # something else changed: a job ended, a server came
            await _wait_runs(cycle, 2)
            await _until(lambda: loops.fruitless_cycles == 42)
            # A cycle that changed something ends the backoff: the next queued job wakes one after the pause.
            cycle.next_report = report(result=ApplyResult(started=(1,), rejected=(), touched_servers=frozenset()))
            notifier.cycle_requested()
            await _wait_runs(cycle, 3)
            await _until(lambda: loops.fruitless_cycles == 0)
            cycle.next_report = report()
            notifier.jobs_queued()
            await _wait_runs(cycle, 4)
            await _until(lambda: loops.fruitless_cycles == 1)

    asyncio.run(scenario())


@pytest.mark.timeout(180)
def test_a_cycle_the_periodic_tick_woke_starts_the_count_again() -> None:
    async def scenario() -> None:
        async with cycling(0.2) as (loops, _notifier, cycle):
            await _wait_runs(cycle, 1)  # at once, on no tick: it counts
            await _until(lambda: loops.fruitless_cycles == 1)
            loops.fruitless_cycles = 40  # as after a burst; then ticks alone, no trigger
            await _wait_runs(cycle, 2)
            await _until(lambda: loops.fruitless_cycles == 0)  # a cycle the tick woke counts none
            await _wait_runs(cycle, 3)
            assert loops.fruitless_cycles == 0

    asyncio.run(scenario())
