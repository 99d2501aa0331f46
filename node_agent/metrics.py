"""The node agent's Prometheus metrics, on a registry of its own (``aryl_common.metrics``; served
by ``node_agent.main`` on ``[metrics] port``).

- ``aryl_agent_report_latency_seconds``: each ReportStatus call's round trip to the scheduler;
  ``aryl_agent_reports_total{outcome}`` (ok, failed) and ``aryl_agent_registrations_total``.
- ``aryl_agent_gpu_utilization_ratio{gpu,model}`` (0..1), ``aryl_agent_gpu_memory_used_bytes{gpu,model}``
  and ``aryl_agent_gpu_healthy{gpu,model}``: the samples of the last report.
- ``aryl_agent_workers{phase}``: this server's workers by phase (STARTING, RUNNING, STOPPING,
  EXITED), and ``aryl_agent_observed_generation``: the desired state it has applied.

Never: change what the agent does.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from node_agent.gpus import GpuInfo, GpuSample
from node_agent.workers import Phase

# Seconds: a report is milliseconds on a quiet scheduler; the RPC timeout bounds it.
REPORT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AgentMetrics:
    def __init__(self, inventory: Sequence[GpuInfo]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.report_latency = Histogram("aryl_agent_report_latency_seconds",
                                        "ReportStatus round trip to the scheduler", buckets=REPORT_BUCKETS, registry=r)
        self.reports = Counter("aryl_agent_reports", "Status reports sent, by outcome", ["outcome"], registry=r)
        for outcome in ("ok", "failed"):
            self.reports.labels(outcome=outcome)
        self.registrations = Counter("aryl_agent_registrations", "Registrations with the scheduler", registry=r)
        self.workers = Gauge("aryl_agent_workers", "This server's workers by phase", ["phase"], registry=r)
        self.observed_generation = Gauge("aryl_agent_observed_generation",
                                         "Generation of the desired state the agent has applied", registry=r)
        labels = ["gpu", "model"]
        self.gpu_utilization = Gauge("aryl_agent_gpu_utilization_ratio", "GPU utilisation, 0..1 (last report)",
                                     labels, registry=r)
        self.gpu_memory = Gauge("aryl_agent_gpu_memory_used_bytes", "GPU memory in use (last report)", labels,
                                registry=r)
        self.gpu_healthy = Gauge("aryl_agent_gpu_healthy", "1 when the GPU is healthy (last report)", labels,
                                 registry=r)
        self._models = {gpu.index: gpu.model for gpu in inventory}

    def report_sent(self, seconds: float, *, ok: bool) -> None:
        self.reports.labels(outcome="ok" if ok else "failed").inc()
        if ok:
            self.report_latency.observe(seconds)

    def sampled(self, samples: Iterable[GpuSample], phases: Iterable[Phase], observed_generation: int) -> None:
        for s in samples:
            labels = (str(s.index), self._models.get(s.index, ""))
            self.gpu_utilization.labels(*labels).set(s.utilization)
            self.gpu_memory.labels(*labels).set(s.memory_used_bytes)
            self.gpu_healthy.labels(*labels).set(1 if s.healthy else 0)
        counts = Tally(phases)
        for phase in Phase:
            self.workers.labels(phase=str(phase)).set(counts.get(phase, 0))
        self.observed_generation.set(observed_generation)
