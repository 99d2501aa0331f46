"""The scheduler's Prometheus metrics, on a registry of its own (``aryl_common.metrics``).

Two kinds:

- **Read at each scrape** from the database (``store.metrics``), so they are right whoever changed
  what: ``aryl_jobs{queue,state}``, ``aryl_servers{pool,state}``, ``aryl_gpus{server,pool,model}``
  (and ``aryl_gpus_healthy``), ``aryl_gpus_allocated{server,model,queue}``,
  ``aryl_gpu_utilization_ratio{server,model,queue}`` (mean of the last reported samples, 0..1;
  ``queue=""``: GPUs no job holds).
- **Observed per scheduling cycle** (``observe_cycle``): ``aryl_scheduler_cycle_duration_seconds``
  (snapshot, decide and apply) and ``aryl_scheduler_decide_duration_seconds``,
  ``aryl_scheduler_plan_actions{kind}`` (plan sizes: starts, scales, preemptions, server steps),
  counters of what the applier committed: ``aryl_scheduler_job_starts_total``,
  ``aryl_scheduler_job_resizes_total``, ``aryl_scheduler_preemptions_total``,
  ``aryl_scheduler_loan_steps_total{step}`` (LOAN, ACTIVATE, CANCEL, RECLAIM, RETURN: loans and
  reclaims), ``aryl_scheduler_plan_rejections_total``, and
  ``aryl_scheduler_job_queueing_seconds{queue}``: submission to first start.
- **The inference demand forecast** at the last cycle (``observe_demand_forecast``,
  ``app.demand_forecast``), in serving servers, over the policy's lead at its quantile:
  ``aryl_scheduler_demand_forecast_servers{kind}`` (``level``: the need now; ``point``; ``upper``: the band
  the aryl policy reclaims ahead of), ``aryl_scheduler_demand_forecast_lead_seconds`` and
  ``aryl_scheduler_reclaim_latency_seconds`` (measured, p90 of the last reclaims; absent until one was).
  All absent until a cycle saw a demand report.
- **The status reports' write-behind** (``app.agents``), read at each scrape:
  ``aryl_scheduler_telemetry_backlog``, servers whose latest telemetry-only report waits to be written
  (at most one per server; a backlog near the fleet's size says the database cannot keep up with
  ``agents.telemetry_write_s``, and telemetry is that much staler).

Never: change anything. A scrape that cannot read the database answers with the cycle metrics
alone (and ``aryl_scheduler_scrape_errors_total``), not an error page.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session

from scheduler_service.app.demand_forecast import DemandForecastInfo
from scheduler_service.core.plan import LoanStep
from scheduler_service.cycle import CycleReport
from scheduler_service.store.metrics import ClusterGauges, cluster_gauges, first_start_waits

T = TypeVar("T")
Read = Callable[[Callable[[Session], Any]], Any]
log = structlog.get_logger("aryl.metrics")

# Seconds: a cycle takes milliseconds on a small cluster, seconds on a very large one.
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
PLAN_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
# Seconds from submission to first start: from an idle cluster's next cycle to a day's wait.
QUEUEING_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


class SchedulerMetrics:
    """``read`` runs a read-only unit of work on the database (``Transactions.read``)."""

    def __init__(self, read: Read) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.cycle_seconds = Histogram("aryl_scheduler_cycle_duration_seconds",
                                       "One scheduling cycle: snapshot, decide, apply", buckets=CYCLE_BUCKETS,
                                       registry=r)
        self.decide_seconds = Histogram("aryl_scheduler_decide_duration_seconds",
                                        "The policy's decision within a cycle", buckets=CYCLE_BUCKETS, registry=r)
        self.plan_actions = Histogram("aryl_scheduler_plan_actions", "Actions per cycle's plan, by kind",
                                      ["kind"], buckets=PLAN_BUCKETS, registry=r)
        self.starts = Counter("aryl_scheduler_job_starts", "Jobs started (or restarted) by the applier", registry=r)
        self.resizes = Counter("aryl_scheduler_job_resizes", "Running jobs resized by the applier", registry=r)
        self.preemptions = Counter("aryl_scheduler_preemptions", "Jobs preempted by the applier", registry=r)
        self.loan_steps = Counter("aryl_scheduler_loan_steps",
                                  "Loan cycle steps applied (LOAN, ACTIVATE, CANCEL, RECLAIM, RETURN)", ["step"],
                                  registry=r)
        for step in LoanStep:
            self.loan_steps.labels(step=str(step))  # every step shows, at 0 until it happens
        self.rejections = Counter("aryl_scheduler_plan_rejections", "Plan actions the applier refused", registry=r)
        self.queueing = Histogram("aryl_scheduler_job_queueing_seconds", "Submission to first start, by queue",
                                  ["queue"], buckets=QUEUEING_BUCKETS, registry=r)
        self.scrape_errors = Counter("aryl_scheduler_scrape_errors",
                                     "Scrapes whose database read failed", registry=r)
        self.telemetry_backlog = Gauge("aryl_scheduler_telemetry_backlog",
                                       "Servers whose latest telemetry-only status report waits to be written",
                                       registry=r)
        self.demand_forecast: DemandForecastInfo | None = None  # the last cycle's (observe_demand_forecast)
        self._read = read
        r.register(_ClusterCollector(self))
        r.register(_DemandForecastCollector(self))

    def observe_demand_forecast(self, info: DemandForecastInfo | None) -> None:
        """The forecast at the last cycle (None: no demand seen yet; its gauges stay absent)."""
        if info is not None:
            self.demand_forecast = info

    def observe_cycle(self, report: CycleReport, began: float) -> None:
        """Record one cycle; ``began`` is the clock's ``now()`` before it ran (for first starts)."""
        self.cycle_seconds.observe(report.total_s)
        self.decide_seconds.observe(report.decide_s)
        plan, result = report.plan, report.result
        for kind, actions in (("start", plan.starts), ("scale", plan.scales), ("preempt", plan.preemptions),
                              ("server", plan.server_actions)):
            self.plan_actions.labels(kind=kind).observe(len(actions))
        self.starts.inc(len(result.started))
        self.resizes.inc(len(result.scaled))
        self.preemptions.inc(len(result.preempted))
        self.rejections.inc(len(result.rejected))
        for _server, step in result.server_steps:
            self.loan_steps.labels(step=str(step)).inc()
        if result.started:
            try:
                waits = self._read(lambda session: first_start_waits(session, list(result.started), began))
            except Exception as exc:  # noqa: BLE001 - a metric is never worth failing a cycle
                log.warning("metrics: the started jobs' queueing times could not be read", error=str(exc))
                return
            for queue, seconds in waits:
                self.queueing.labels(queue=queue).observe(seconds)

    def gauges(self) -> ClusterGauges | None:
        try:
            gauges: ClusterGauges = self._read(cluster_gauges)
            return gauges
        except Exception as exc:  # noqa: BLE001 - a scrape must not fail while the database is away a moment
            self.scrape_errors.inc()
            log.warning("metrics: the database could not be read for this scrape", error=str(exc))
            return None


class _ClusterCollector(Collector):
    def __init__(self, metrics: SchedulerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # read at scrape time only: registering must not query the database

    def collect(self) -> Iterator[Metric]:
        gauges = self._metrics.gauges()
        if gauges is None:
            return
        jobs = GaugeMetricFamily("aryl_jobs", "Jobs by queue and state", labels=["queue", "state"])
        for (queue, state), n in sorted(gauges.jobs.items()):
            jobs.add_metric([queue, state], n)
        yield jobs
        servers = GaugeMetricFamily("aryl_servers", "Registered servers by pool and state", labels=["pool", "state"])
        for (pool, state), n in sorted(gauges.servers.items()):
            servers.add_metric([pool, state], n)
        yield servers
        gpus = GaugeMetricFamily("aryl_gpus", "GPUs per server and model", labels=["server", "pool", "model"])
        healthy = GaugeMetricFamily("aryl_gpus_healthy", "Healthy GPUs per server and model",
                                    labels=["server", "pool", "model"])
        util = GaugeMetricFamily("aryl_gpu_utilization_ratio",
                                 "Mean GPU utilisation (0..1, last reported) per server, model and holding queue "
                                 "(queue=\"\": GPUs no job holds)", labels=["server", "model", "queue"])
        allocated = GaugeMetricFamily("aryl_gpus_allocated", "GPUs held by jobs, per server, model and queue",
                                      labels=["server", "model", "queue"])
        held: dict[tuple[str, str], tuple[int, float]] = {}
        for a in gauges.allocated:
            allocated.add_metric([a.server_id, a.model, a.queue], a.gpus)
            util.add_metric([a.server_id, a.model, a.queue], a.utilization)
            n, total = held.get((a.server_id, a.model), (0, 0.0))
            held[(a.server_id, a.model)] = (n + a.gpus, total + a.utilization * a.gpus)
        for g in gauges.gpus:
            gpus.add_metric([g.server_id, g.pool, g.model], g.gpus)
            healthy.add_metric([g.server_id, g.pool, g.model], g.healthy)
            n, total = held.get((g.server_id, g.model), (0, 0.0))
            if g.gpus > n:  # the free GPUs' mean: the group's total less the held ones'
                util.add_metric([g.server_id, g.model, ""], max(0.0, (g.utilization * g.gpus - total) / (g.gpus - n)))
        yield from (gpus, healthy, allocated, util)


class _DemandForecastCollector(Collector):
    """The last cycle's demand forecast (module doc): absent before one, and the measured reclaim latency
    absent before a reclaim was measured (never a 0 that reads as "instant")."""

    def __init__(self, metrics: SchedulerMetrics) -> None:
        self._metrics = metrics

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        info = self._metrics.demand_forecast
        if info is None:
            return
        servers = GaugeMetricFamily("aryl_scheduler_demand_forecast_servers",
                                    "The inference demand forecast at the last cycle, in serving servers: level "
                                    "(the need now), point and upper (its band at the policy's quantile) within "
                                    "the lead", labels=["kind"])
        for kind, value in (("level", info.needed_now), ("point", info.point), ("upper", info.upper)):
            servers.add_metric([kind], value)
        yield servers
        yield GaugeMetricFamily("aryl_scheduler_demand_forecast_lead_seconds",
                                "How far ahead of the forecast rise a reclaim starts: the reclaim latency "
                                "(policy.reclaim_deadline_s before one is measured) plus the decision lag",
                                value=info.lead_s)
        if info.reclaim_latency_s is not None:
            yield GaugeMetricFamily("aryl_scheduler_reclaim_latency_seconds",
                                    "Measured time from a reclaim decision to the server serving again (p90 of "
                                    "the last reclaims)", value=info.reclaim_latency_s)
