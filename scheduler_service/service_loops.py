"""The loops of a running scheduler, beside its RPCs: scheduling cycles (on triggers, coalesced, and at
least every ``scheduling.cycle_interval_s``, with the ETA forecast after them when it is due; after cycles
that could place none of the waiting jobs, newly queued jobs alone wake the next one later: ``queue_backoff_s``), the
liveness sweep that marks silent agents' servers LOST, and the pruning of old events.

Each loop runs while this scheduler leads and idles on a standby; a failed round is logged and retried,
never fatal. ``SchedulerService.run`` starts them as tasks and cancels them on shutdown. What this module
must never do: decide anything itself (the cycle and the use cases do), or run a round on a standby.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import structlog

from scheduler_service.app.demand_forecast import DemandForecastInfo
from scheduler_service.app.forecast import Forecasts
from scheduler_service.app.liveness import Liveness
from scheduler_service.app.retention import EventRetention
from scheduler_service.config import SchedulerConfig
from scheduler_service.core.clock import Clock
from scheduler_service.cycle import CycleReport, SchedulingCycle
from scheduler_service.errors import Aborted, Unavailable
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.notify.notifier import AsyncNotifier

log = structlog.get_logger("aryl.scheduler")


class ServiceLoops:
    """The loops of one scheduler: ``config``'s intervals, its ``clock``, ``leading`` (whether it decides
    now), its ``metrics`` and the inference demand's forecast at the last cycle (``demand_outlook``)."""

    def __init__(self, config: SchedulerConfig, clock: Clock, *, leading: Callable[[], bool],
                 metrics: SchedulerMetrics, demand_outlook: Callable[[], DemandForecastInfo | None]) -> None:
        self.config = config
        self.clock = clock
        self._leading = leading
        self.metrics = metrics
        self._demand_outlook = demand_outlook
        # Cycles in a row, each woken by a trigger, that left jobs waiting and changed nothing (``queue_backoff_s``).
        self.fruitless_cycles = 0

    async def cycles(self, cycle: SchedulingCycle, notifier: AsyncNotifier, executor: ThreadPoolExecutor,
                     forecasts: Forecasts | None = None, forecaster: ThreadPoolExecutor | None = None) -> None:
        """Run a cycle on every trigger (coalesced) and at least every ``cycle_interval_s``; after a cycle,
        the ETA forecast when it is due (``app.forecast``), on ``forecaster`` (never holding up cycles)."""
        loop = asyncio.get_running_loop()
        duty = self.config.scheduling.max_cycle_duty
        ticked = False  # whether the periodic tick woke this cycle (no trigger since the last)
        while True:
            seen, capacity_seen = notifier.cycle.version, notifier.capacity.version
            took = 0.0
            if not self._leading():  # a standby decides nothing
                await notifier.cycle.wait_newer(seen, timeout=self.config.scheduling.cycle_interval_s)
                continue
            try:
                began = self.clock.now()
                report = await loop.run_in_executor(executor, cycle.run_once)
                took = report.total_s
                # A quiet spell (the tick woke it) starts the count again: no burst to space out.
                self.fruitless_cycles = self.fruitless_cycles + 1 if fruitless_cycle(report) and not ticked else 0
                await loop.run_in_executor(executor, self.metrics.observe_cycle, report, began)
                await loop.run_in_executor(executor, lambda: self.metrics.observe_demand_forecast(
                    self._demand_outlook()))
                if forecasts is not None and forecaster is not None and forecasts.due():
                    forecaster.submit(forecast_quietly, forecasts)
                if report.result.started or report.result.rejected:
                    log.info("cycle", jobs=report.snapshot_jobs, started=len(report.result.started),
                             rejected=list(report.result.rejected), decide_ms=round(report.decide_s * 1e3, 2),
                             total_ms=round(report.total_s * 1e3, 2))
            except (Unavailable, Aborted) as exc:  # the database is away or busy, or a race was lost: expected
                log.warning("scheduling cycle skipped; retrying at the next tick", reason=str(exc))
            except Exception:  # a failed cycle is logged and retried, never fatal
                log.exception("scheduling cycle failed; retrying at the next tick")
            # Batch a burst of triggers (e.g. many submissions) into the next cycle, and keep cycles to
            # their share of the time however long they take (a large cluster's snapshot is not free).
            pause = max(self.config.scheduling.min_cycle_gap_s, took * (1 / duty - 1))
            await asyncio.sleep(pause)
            # After cycles that could place none of the waiting jobs, newly queued jobs alone wait longer for the
            # next one (any other trigger ends the wait): a burst of submissions into a full cluster re-decides
            # the whole queue less often, and the RPCs keep the time.
            interval = self.config.scheduling.cycle_interval_s
            longer = queue_backoff_s(self.fruitless_cycles, pause, interval)
            if longer > 0:
                began_waiting = loop.time()
                await notifier.capacity.wait_newer(capacity_seen, timeout=longer)
                interval = max(0.0, interval - (loop.time() - began_waiting))
            await notifier.cycle.wait_newer(seen, timeout=interval)
            ticked = notifier.cycle.version == seen

    async def liveness(self, liveness: Liveness, executor: ThreadPoolExecutor) -> None:
        """Mark servers LOST whose agents are silent past ``agents.lost_after_s`` (this process's
        monotonic clock), checking a few times per grace period."""
        loop = asyncio.get_running_loop()
        lost_after = self.config.agents.lost_after_s
        while True:
            await asyncio.sleep(min(1.0, lost_after / 4))
            if not self._leading():  # liveness is judged by the leader alone
                continue
            try:
                lost = await loop.run_in_executor(executor, liveness.sweep_lost, lost_after)
                if lost:
                    log.warning("servers lost: their agents are silent", servers=lost, lost_after_s=lost_after)
            except (Unavailable, Aborted) as exc:  # the database is away or busy, or this one stepped down
                log.warning("liveness check skipped; retrying", reason=str(exc))
            except Exception:  # retried at the next check, never fatal
                log.exception("liveness check failed; retrying")

    async def retention(self, retention: EventRetention, executor: ThreadPoolExecutor) -> None:
        """Every ``events.prune_interval_s``, delete events older than ``events.retention_days``, in
        short chunks (``app.retention``); a failure is logged and retried at the next run."""
        loop = asyncio.get_running_loop()
        events = self.config.events
        while True:
            await asyncio.sleep(events.prune_interval_s)
            if not self._leading():
                continue
            try:
                deleted = await loop.run_in_executor(executor, lambda: retention.prune(
                    now=self.clock.now(), retention_days=events.retention_days, chunk=events.prune_chunk))
                if deleted:
                    log.info("old events pruned", deleted=deleted, retention_days=events.retention_days)
            except Exception:  # retried at the next run, never fatal
                log.exception("event pruning failed; retrying at the next run")


def fruitless_cycle(report: CycleReport) -> bool:
    """A cycle that left jobs waiting and changed nothing: no start, resize, preemption or loan step, and no
    refusal (a refused action is a race with fresh state, worth a prompt retry)."""
    result = report.result
    return bool(report.plan.pending) and not (result.started or result.scaled or result.preempted
                                              or result.server_steps or result.rejected)


def queue_backoff_s(fruitless: int, pause_s: float, interval_s: float) -> float:
    """How much longer than ``pause_s`` a cycle woken only by newly queued jobs waits, after ``fruitless`` fruitless
    cycles in a row, each woken by a trigger (a cycle the periodic tick woke counts none): the pause doubled per
    such cycle, in all at most the periodic tick (``cycle_interval_s``); none after a cycle that changed something.
    Any other trigger (a job ended, a server came or went, a report changed a worker, a cancel, the inference
    demand) ends the wait at once. So a lone submission into a full cluster after a quiet spell is decided on as
    promptly as before, and a burst of them re-decides the whole queue a few times a second at most."""
    if fruitless <= 0:
        return 0.0
    return max(0.0, min(interval_s, pause_s * 2.0 ** min(fruitless, 30)) - pause_s)


def forecast_quietly(forecasts: Forecasts) -> None:
    """One ETA forecast; a failure is logged and the previous forecast stays (the next cycle tries again)."""
    try:
        forecasts.refresh()
    except (Unavailable, Aborted) as exc:
        log.warning("forecast skipped; retrying after the next cycle", reason=str(exc))
    except Exception:  # a failed forecast is never fatal
        log.exception("forecast failed; retrying after the next cycle")
