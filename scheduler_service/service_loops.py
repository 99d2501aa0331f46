"""The loops of a running scheduler, beside its RPCs: scheduling cycles (on triggers, coalesced, and at
least every ``scheduling.cycle_interval_s``, with the ETA forecast after them when it is due), the
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
from scheduler_service.cycle import SchedulingCycle
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

    async def cycles(self, cycle: SchedulingCycle, notifier: AsyncNotifier, executor: ThreadPoolExecutor,
                     forecasts: Forecasts | None = None, forecaster: ThreadPoolExecutor | None = None) -> None:
        """Run a cycle on every trigger (coalesced) and at least every ``cycle_interval_s``; after a cycle,
        the ETA forecast when it is due (``app.forecast``), on ``forecaster`` (never holding up cycles)."""
        loop = asyncio.get_running_loop()
        duty = self.config.scheduling.max_cycle_duty
        while True:
            seen = notifier.cycle.version
            took = 0.0
            if not self._leading():  # a standby decides nothing
                await notifier.cycle.wait_newer(seen, timeout=self.config.scheduling.cycle_interval_s)
                continue
            try:
                began = self.clock.now()
                report = await loop.run_in_executor(executor, cycle.run_once)
                took = report.total_s
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
            await asyncio.sleep(max(self.config.scheduling.min_cycle_gap_s, took * (1 / duty - 1)))
            await notifier.cycle.wait_newer(seen, timeout=self.config.scheduling.cycle_interval_s)

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


def forecast_quietly(forecasts: Forecasts) -> None:
    """One ETA forecast; a failure is logged and the previous forecast stays (the next cycle tries again)."""
    try:
        forecasts.refresh()
    except (Unavailable, Aborted) as exc:
        log.warning("forecast skipped; retrying after the next cycle", reason=str(exc))
    except Exception:  # a failed forecast is never fatal
        log.exception("forecast failed; retrying after the next cycle")
