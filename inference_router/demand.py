"""The demand reporter: tells the scheduler, every ``report_interval_s``, how many inference servers
must stay serving.

The number is static (``router.servers_needed``) until the router measures load itself; the
observed request rate is reported as 0 because nothing is observed yet. Each call has a deadline;
a failed call is retried with exponential backoff and jitter, then the regular interval resumes.
It only reports: loans and reclaims are the scheduler's decisions.
"""

from __future__ import annotations

import threading

import grpc
import structlog

from inference_router.config import RouterSection
from node_agent.daemon import Backoff, describe_rpc_error, scheduler_channel
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc


class DemandReporter:
    """``run()`` reports until ``stop()``, which any other thread may call."""

    def __init__(self, config: RouterSection, *, backoff: Backoff | None = None) -> None:
        if config.servers_needed is None:
            raise ValueError("router.servers_needed must be set before reporting demand")
        self.config = config
        self.servers_needed = config.servers_needed
        self._backoff = backoff or Backoff(config.reconnect_max_backoff_s)
        self._stopping = threading.Event()
        self._log = structlog.get_logger("inference_router").bind(
            source=config.source, servers_needed=self.servers_needed
        )
        self.reports_sent = 0

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        self._log.info("demand reporter starting", scheduler=self.config.scheduler_address,
                       interval_s=self.config.report_interval_s)
        channel = scheduler_channel(self.config.scheduler_address, self.config.reconnect_max_backoff_s)
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        try:
            while not self._stopping.is_set():
                delay = self.config.report_interval_s if self.report_once(stub) else self._backoff.next_delay()
                self._stopping.wait(delay)
        finally:
            channel.close()
            self._log.info("demand reporter stopped", reports_sent=self.reports_sent)

    def report_once(self, stub: inference_pb2_grpc.InferenceServiceStub) -> bool:
        """One ReportDemand call; True when the scheduler took it."""
        request = inference_pb2.ReportDemandRequest(
            servers_needed=self.servers_needed, observed_rps=0.0, source=self.config.source
        )
        try:
            response = stub.ReportDemand(request, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            self._log.warning("demand report failed; retrying with backoff", error=describe_rpc_error(exc),
                              attempt=self._backoff.failures + 1)
            return False
        first = self.reports_sent == 0 or self._backoff.failures > 0
        self._backoff.reset()
        self.reports_sent += 1
        (self._log.info if first else self._log.debug)(
            "demand reported", servers_serving=response.servers_serving, servers_loaned=response.servers_loaned
        )
        return True
