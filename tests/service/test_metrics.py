"""Prometheus metrics of the scheduler, the node agent and the inference router: each component is
started for real (the scheduler's gRPC server on loopback over SQLite and PostgreSQL, an agent
against it, a router in front of an HTTP backend reporting demand to it), its ``/metrics`` port is
scraped over HTTP and parsed with ``prometheus_client``'s own parser, and the metrics are checked to
exist and to move with what happens (a job submitted, placed; a report sent; a request proxied)."""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aryl_common.backoff import Backoff
from aryl_common.entry import BadInput
from aryl_common.metrics import MetricsConfig, serve_metrics
from inference_router.router import serve
from node_agent.agent import Agent
from node_agent.config import AgentSection
from node_agent.gpus import FakeBackend as FakeGpus
from protos.aryl.v1 import scheduler_pb2
from tests.harness import AS_ITSELF, daemon_security, job_spec, register_fake_server, scheduler_stub
from tests.helpers import free_port, wait_for
from tests.router_rig import FakeBackend, router_section, run, until

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample at ``url``, by (name, sorted labels), parsed by the library's parser."""
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text) for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def number(samples: Samples, name: str, **labels: str) -> float:
    """``value`` of a sample the test expects there to be (to compare it with a bound)."""
    found = value(samples, name, **labels)
    assert found is not None, f"no sample {name} {labels}"
    return found


def test_the_scheduler_serves_jobs_gpus_and_cycle_metrics(scheduler_factory) -> None:
    port = free_port()
    scheduler = scheduler_factory(metrics={"port": port})
    url = f"http://127.0.0.1:{port}/metrics"
    before = scrape(url)
    assert value(before, "aryl_jobs", queue="default", state="PENDING") is None
    assert value(before, "aryl_scheduler_loan_steps_total", step="RECLAIM") == 0
    assert value(before, "aryl_scheduler_preemptions_total") == 0

    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("m", gpus=2)), timeout=10).job
        assert value(scrape(url), "aryl_jobs", queue="default", state="PENDING") == 1
        register_fake_server(scheduler.address, "train-1", gpus=4, converge=True)
        # The gauges read the database (RUNNING once the plan commits); the cycle's counters move just
        # after, when the cycle is recorded: wait for both.
        wait_for(lambda: value(samples := scrape(url), "aryl_jobs", queue="default", state="RUNNING") == 1
                 and value(samples, "aryl_scheduler_job_queueing_seconds_count", queue="default") == 1,
                 timeout=30, what="the job running, and its start recorded, in the metrics")
    after = scrape(url)
    assert value(after, "aryl_jobs", queue="default", state="PENDING") is None
    assert value(after, "aryl_gpus", server="train-1", pool="TRAINING", model="Fake-GPU") == 4
    assert value(after, "aryl_gpus_allocated", server="train-1", model="Fake-GPU", queue="default") == 2
    assert value(after, "aryl_gpu_utilization_ratio", server="train-1", model="Fake-GPU", queue="") == 0
    assert value(after, "aryl_servers", pool="TRAINING", state="TRAINING") == 1
    assert number(after, "aryl_scheduler_job_starts_total") >= 1
    assert value(after, "aryl_scheduler_job_queueing_seconds_count", queue="default") == 1
    assert number(after, "aryl_scheduler_cycle_duration_seconds_count") >= 1
    assert number(after, "aryl_scheduler_plan_actions_sum", kind="start") >= 1
    assert job.job_id


def test_a_taken_metrics_port_is_a_bad_input_naming_the_setting() -> None:
    from prometheus_client import CollectorRegistry

    first = serve_metrics(CollectorRegistry(), MetricsConfig(port=free_port()))
    assert first is not None
    try:
        with pytest.raises(BadInput, match=r"metrics\.port"):
            serve_metrics(CollectorRegistry(), MetricsConfig(port=first.port))
    finally:
        first.close()
    assert serve_metrics(CollectorRegistry(), MetricsConfig(port=0)) is None  # 0: off


def test_the_agent_serves_report_latency_gpus_and_workers(scheduler_factory, tmp_path: Path) -> None:
    scheduler = scheduler_factory(agents={"report_interval_s": 0.2})
    section = AgentSection(scheduler_address=scheduler.address, hostname="node-m", rpc_timeout_s=2.0,
                           reconnect_max_backoff_s=0.2, work_dir=str(tmp_path / "agent"), reconcile_interval_s=0.05,
                           **daemon_security("node-m"))
    gpus = FakeGpus("node-m", count=2)
    agent = Agent(section, gpus, backoff=Backoff(0.2, initial_s=0.02), version="test", users=AS_ITSELF)
    endpoint = serve_metrics(agent.metrics.registry, MetricsConfig(port=free_port()))
    assert endpoint is not None
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: (value(scrape(endpoint.url), "aryl_agent_reports_total", outcome="ok") or 0) >= 3,
                 what="three status reports in the agent's metrics")
        samples = scrape(endpoint.url)
        assert value(samples, "aryl_agent_registrations_total") == 1
        assert number(samples, "aryl_agent_report_latency_seconds_count") >= 3
        assert 0 < number(samples, "aryl_agent_report_latency_seconds_sum") < 10
        for gpu in ("0", "1"):
            assert value(samples, "aryl_agent_gpu_healthy", gpu=gpu, model="Fake-A100-80GB") == 1
            assert value(samples, "aryl_agent_gpu_utilization_ratio", gpu=gpu, model="Fake-A100-80GB") is not None
        assert value(samples, "aryl_agent_workers", phase="RUNNING") == 0
    finally:
        agent.stop()
        thread.join(timeout=10)
        endpoint.close()
        gpus.close()


def test_the_router_serves_requests_latency_and_demand(scheduler) -> None:
    port = free_port()
    for name in ("infer-1", "infer-2"):  # the demand reported may not exceed the inference pool
        register_fake_server(scheduler.address, name, pool="inference", gpus=1)

    async def scenario() -> None:
        backend = await FakeBackend("b1").start()
        router_port = free_port()
        config = router_section(static_backends=[backend.url], scheduler_address=scheduler.address,
                                servers_needed=2, report_interval_s=0.2, evaluate_interval_s=0.05,
                                listen=f"127.0.0.1:{router_port}", **daemon_security())
        stop = asyncio.Event()
        served = asyncio.create_task(serve(config, stop, MetricsConfig(port=port)))
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            await until(lambda: _answers(url), what="the router's metrics port")
            samples = await asyncio.to_thread(scrape, url)
            assert value(samples, "aryl_router_requests_total", code="2xx") is None
            router_url = f"http://127.0.0.1:{router_port}"

            async with aiohttp.ClientSession() as session:
                for _ in range(5):
                    async with session.post(router_url + "/v1/infer", json={"x": 1}) as response:
                        assert response.status == 200
            samples = await asyncio.to_thread(scrape, url)
            assert value(samples, "aryl_router_requests_total", code="2xx") == 5
            assert value(samples, "aryl_router_request_duration_seconds_count", code="2xx") == 5
            assert value(samples, "aryl_router_backends", state="SERVING", routable="true") == 1
            assert value(samples, "aryl_router_demand_servers_needed") == 2
            assert number(samples, "aryl_router_observed_rps", window="short") > 0
            await until(lambda: value(scrape(url), "aryl_router_demand_servers_reported") == 2,
                        what="the demand reported to the scheduler")
            assert number(scrape(url), "aryl_router_demand_reports_total") >= 1
        finally:
            stop.set()
            await served
            await backend.stop()

    run(scenario())


def _answers(url: str) -> bool:
    try:
        scrape(url)
    except OSError:
        return False
    return True
