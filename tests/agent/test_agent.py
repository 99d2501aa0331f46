"""The node agent (and the router's demand reporter): GPU backends, config, desired-state fencing,
the control loop against an in-process fake AgentService, and the real daemons against a real
scheduler, started as their console scripts.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from aryl_common.backoff import Backoff
from aryl_common.config import ConfigError
from aryl_common.signals import run_until_signalled
from node_agent.agent import Agent
from node_agent.config import AgentSection, GpusSection, load_agent_config
from node_agent.desired import DesiredStateTracker, Verdict
from node_agent.gpus import (
    FakeBackend,
    GpuBackendUnavailable,
    NvmlBackend,
    assess_health,
    fake_gpu_uuid,
    import_pynvml,
    select_backend,
)
from node_agent.main import cli_overrides, parse_args
from protos.aryl.v1 import agent_pb2, inference_pb2, inference_pb2_grpc, scheduler_pb2, types_pb2
from tests.fixtures.daemons import console_script, running_daemon
from tests.harness import (
    AS_ITSELF,
    FakeScheduler,
    desired_state,
    register_fake_server,
    scheduler_stub,
    secure_channel,
)
from tests.helpers import wait_for


@pytest.fixture(autouse=True)
def uncached_loggers() -> Iterator[None]:
    """capture_logs only sees loggers that were not cached under an earlier configure_logging()."""
    saved = structlog.get_config()
    structlog.configure(cache_logger_on_first_use=False)
    yield
    structlog.configure(**saved)


# --------------------------------------------------------------------------------------------------
# Fake GPUs


def test_fake_gpu_uuids_are_stable_per_hostname_and_index() -> None:
    first = FakeBackend("node-a", count=4).inventory()
    again = FakeBackend("node-a", count=4).inventory()
    assert [g.uuid for g in first] == [g.uuid for g in again]
    assert len({g.uuid for g in first}) == 4
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) == len("GPU-") + 36 for g in first)
    assert first[2].uuid == fake_gpu_uuid("node-a", 2)


def test_fake_gpu_uuids_differ_between_hostnames() -> None:
    # Two fake agents on one machine must never register the same GPU (UNIQUE uuid in the store).
    a = {g.uuid for g in FakeBackend("node-a", count=8).inventory()}
    b = {g.uuid for g in FakeBackend("node-b", count=8).inventory()}
    assert not a & b


def test_fake_inventory_follows_the_configuration() -> None:
    gpus = FakeBackend("n", count=3, model="Fake-H100", memory_gb=94).inventory()
    assert [g.index for g in gpus] == [0, 1, 2]
    assert {g.model for g in gpus} == {"Fake-H100"}
    assert {g.memory_total_bytes for g in gpus} == {94 * 1024**3}


def test_fake_utilisation_is_plausible_and_varies_over_time() -> None:
    now = [0.0]
    backend = FakeBackend("n", count=4, clock=lambda: now[0], period_s=100.0)
    series = []
    for step in range(20):
        now[0] = step * 10.0
        samples = backend.sample()
        assert [s.index for s in samples] == [0, 1, 2, 3]
        for s, gpu in zip(samples, backend.inventory(), strict=True):
            assert 0.0 <= s.utilization <= 1.0
            assert 0 <= s.memory_used_bytes <= gpu.memory_total_bytes
            assert 20.0 < s.temperature_c < 90.0
            assert s.healthy and s.health_reason == ""
        series.append(samples[0].utilization)
    assert max(series) - min(series) > 0.3, series


def test_fault_injection_marks_one_gpu_unhealthy_until_cleared() -> None:
    backend = FakeBackend("n", count=4)
    backend.mark_unhealthy(2, "ECC_UNCORRECTABLE: 3", ecc_uncorrectable=3)
    samples = backend.sample()
    assert [s.healthy for s in samples] == [True, True, False, True]
    assert samples[2].health_reason == "ECC_UNCORRECTABLE: 3"
    assert samples[2].ecc_uncorrectable == 3
    backend.mark_healthy(2)
    assert all(s.healthy for s in backend.sample())


def test_fault_injection_refuses_bad_input() -> None:
    backend = FakeBackend("n", count=2)
    with pytest.raises(ValueError, match="no fake GPU 2"):
        backend.mark_unhealthy(2, "XID 79")
    with pytest.raises(ValueError, match="reason"):
        backend.mark_unhealthy(0, "")


# --------------------------------------------------------------------------------------------------
# NVML, through a stand-in for the pynvml module (no GPU or driver is needed)


class FakeNvml:
    """The pynvml names NvmlBackend uses. ``gpus``: per GPU, values or exception classes to raise."""

    NVML_TEMPERATURE_GPU = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_GpuIsLost(NVMLError):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    def __init__(self, gpus: list[dict], *, init_error: type[Exception] | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.shutdowns = 0

    def _get(self, handle: int, key: str, default: object = None) -> Any:
        """The value a test scripted for this GPU (of the type the NVML call returns), or ``default``."""
        value = self.gpus[handle].get(key, default)
        if isinstance(value, type) and issubclass(value, Exception):
            raise value(key)
        return value

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-real-{h}"

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=141 << 30, used=self._get(h, "used", 1 << 30))

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self._get(h, "util", 50))

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return self._get(h, "temp", 40)

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        return self._get(h, "ecc", 0)

    def nvmlDeviceGetRetiredPages(self, h: int, cause: int) -> list[int]:
        return self._get(h, "retired", [])

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: int) -> int:
        return self._get(h, "pending", 0)

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        return self._get(h, "remap", (0, 0, 0, 0))


def test_nvml_inventory_and_healthy_sample() -> None:
    backend = NvmlBackend(FakeNvml([{}, {"util": 90, "temp": 71}]))
    assert [(g.index, g.uuid, g.model) for g in backend.inventory()] == [
        (0, "GPU-real-0", "NVIDIA H200"),
        (1, "GPU-real-1", "NVIDIA H200"),
    ]
    s0, s1 = backend.sample()
    assert s0.healthy and s1.healthy
    assert s1.utilization == pytest.approx(0.9) and s1.temperature_c == 71


def test_nvml_counters_a_gpu_does_not_support_are_not_reported_not_faults() -> None:
    ns = FakeNvml.NVMLError_NotSupported
    backend = NvmlBackend(FakeNvml([{"ecc": ns, "retired": ns, "pending": ns, "remap": ns, "util": ns, "temp": ns}]))
    (sample,) = backend.sample()
    assert sample.healthy, sample.health_reason
    assert (sample.ecc_uncorrectable, sample.retired_pages, sample.utilization) == (0, 0, 0.0)


@pytest.mark.parametrize(
    ("gpu", "reason"),
    [
        ({"ecc": 3}, "ECC_UNCORRECTABLE: 3"),
        ({"retired": [0x1000, 0x2000], "pending": 1}, "RETIRED_PAGES_PENDING"),
        ({"remap": (0, 1, 1, 0)}, "ROW_REMAP_PENDING"),
        ({"remap": (0, 1, 0, 1)}, "ROW_REMAP_FAILED"),
        ({"util": FakeNvml.NVMLError_GpuIsLost}, "NVML_ERROR"),  # fell off the bus
    ],
)
def test_nvml_faults_make_the_gpu_unhealthy_with_a_reason(gpu: dict, reason: str) -> None:
    healthy_gpu, faulty_gpu = NvmlBackend(FakeNvml([{}, gpu])).sample()
    assert healthy_gpu.healthy
    assert not faulty_gpu.healthy
    assert reason in faulty_gpu.health_reason


def test_retired_pages_already_in_effect_are_not_a_fault() -> None:
    (sample,) = NvmlBackend(FakeNvml([{"retired": [1, 2], "pending": 0}])).sample()
    assert sample.healthy and sample.retired_pages == 4  # counted once per retirement cause


def test_health_reasons_combine() -> None:
    assert assess_health() == (True, "")
    healthy, reason = assess_health(ecc_uncorrectable=1, row_remap_failed=True)
    assert not healthy and reason == "ECC_UNCORRECTABLE: 1; ROW_REMAP_FAILED"


def test_nvml_backend_is_unavailable_without_a_library_or_gpus() -> None:
    with pytest.raises(GpuBackendUnavailable, match="could not initialise"):
        NvmlBackend(FakeNvml([{}], init_error=FakeNvml.NVMLError_LibraryNotFound))
    empty = FakeNvml([])
    with pytest.raises(GpuBackendUnavailable, match="no GPUs"):
        NvmlBackend(empty)
    assert empty.shutdowns == 1  # NVML is released again


# --------------------------------------------------------------------------------------------------
# Backend selection


@pytest.fixture
def nvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the real pynvml fail as it does on a machine without the NVIDIA driver."""
    pynvml = import_pynvml()

    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)


def test_auto_falls_back_to_fake_gpus_and_says_why(nvml_missing: None) -> None:
    with capture_logs() as logs:
        backend = select_backend(GpusSection(backend="auto", fake_count=2), hostname="h")
    assert backend.name == "fake"
    assert [g.uuid for g in backend.inventory()] == [fake_gpu_uuid("h", 0), fake_gpu_uuid("h", 1)]
    (warning,) = [e for e in logs if e["log_level"] == "warning"]
    assert "FAKE GPUs" in warning["event"]
    assert "Library Not Found" in warning["reason"]


def test_nvml_backend_fails_loudly_instead_of_faking(nvml_missing: None) -> None:
    with pytest.raises(GpuBackendUnavailable, match=r"gpus.backend is 'nvml' but NVML could not initialise"):
        select_backend(GpusSection(backend="nvml"), hostname="h")


def test_backend_selection_on_this_machine() -> None:
    # Unpatched pynvml: on a machine without the driver auto must fall back and nvml must refuse;
    # on a GPU machine both must use NVML.
    try:
        NvmlBackend().close()
        nvml_works = True
    except GpuBackendUnavailable:
        nvml_works = False
    auto = select_backend(GpusSection(backend="auto"), hostname="h")
    try:
        assert auto.name == ("nvml" if nvml_works else "fake")
    finally:
        auto.close()
    if not nvml_works:
        with pytest.raises(GpuBackendUnavailable):
            select_backend(GpusSection(backend="nvml"), hostname="h")


def test_fake_backend_needs_no_nvml() -> None:
    backend = select_backend(GpusSection(backend="fake", fake_count=5, fake_model="X"), hostname="h")
    assert backend.name == "fake" and len(backend.inventory()) == 5


# --------------------------------------------------------------------------------------------------
# Configuration


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("ARYL_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_config_precedence_defaults_file_env_cli(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        '[agent]\nscheduler_address = "file:1"\npool = "inference"\nhostname = "from-file"\n'
        '[gpus]\nbackend = "nvml"\n'
    )
    clean_env.setenv("ARYL_AGENT__SCHEDULER_ADDRESS", "env:2")
    clean_env.setenv("ARYL_AGENT__HOSTNAME", "from-env")

    from_file_and_env = load_agent_config(path)
    assert from_file_and_env.agent.scheduler_address == "env:2"  # env beats file
    assert from_file_and_env.agent.pool == "inference"  # file beats default
    assert from_file_and_env.agent.rpc_timeout_s == 5.0  # default
    assert from_file_and_env.gpus.backend == "nvml"

    with_cli = load_agent_config(path, cli_overrides(parse_args(["--scheduler", "cli:3", "--fake-gpus", "2"])))
    assert with_cli.agent.scheduler_address == "cli:3"  # CLI beats env
    assert with_cli.agent.hostname == "from-env"
    assert (with_cli.gpus.backend, with_cli.gpus.fake_count) == ("fake", 2)  # --fake-gpus implies fake


def test_config_file_named_by_env(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("agent:\n  pool: inference\n")
    clean_env.setenv("ARYL_CONFIG", str(path))
    assert load_agent_config().agent.pool == "inference"


def test_advertise_address_defaults_to_the_hostname(clean_env: pytest.MonkeyPatch) -> None:
    assert load_agent_config(overrides={"agent": {"hostname": "gpu-07"}}).agent.agent_address == "gpu-07"
    clean_env.setenv("ARYL_AGENT__ADVERTISE_ADDRESS", "10.0.0.7")
    assert load_agent_config(overrides={"agent": {"hostname": "gpu-07"}}).agent.agent_address == "10.0.0.7"


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("ARYL_AGENT__POOL", "batch", "agent.pool"),
        ("ARYL_AGENT__SCHEDULR_ADDRESS", "x:1", "schedulr_address"),  # typo: an error, not a default
        ("ARYL_GPUS__FAKE_COUNT", "-1", "gpus.fake_count"),
        ("ARYL_GPUS__BACKEND", "cuda", "gpus.backend"),
    ],
)
def test_invalid_configuration_is_a_config_error(
    clean_env: pytest.MonkeyPatch, name: str, value: str, problem: str
) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(ConfigError, match=problem):
        load_agent_config()


def test_invalid_cli_value_is_a_config_error(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=re.escape("gpus.fake_count")):
        load_agent_config(overrides=cli_overrides(parse_args(["--fake-gpus", "-3"])))


def test_fake_gpus_and_gpu_backend_are_exclusive() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--fake-gpus", "2", "--gpu-backend", "nvml"])


def test_bad_config_exits_2(clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from node_agent.main import main

    clean_env.setenv("ARYL_AGENT__POOL", "batch")
    assert main([]) == 2
    assert "agent.pool" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------------
# Desired state: epoch fencing and generation ordering (pure)


def desired(epoch: int, generation: int, workers: int = 0) -> agent_pb2.DesiredState:
    """A desired state of ``workers`` bare workers: fencing reads only the epoch and the generation."""
    return desired_state(generation, *(agent_pb2.DesiredWorker(job_id="j", rank=r) for r in range(workers)),
                         epoch=epoch, server_id="s")


def latest_of(tracker: DesiredStateTracker) -> agent_pb2.DesiredState:
    """The tracker's latest desired state, which a test has offered one to."""
    assert tracker.latest is not None
    return tracker.latest


def test_newer_generations_are_accepted_in_order() -> None:
    tracker = DesiredStateTracker()
    assert tracker.observed_generation == 0 and tracker.latest is None
    assert tracker.offer(desired(1, 1)) is Verdict.ACCEPTED
    assert tracker.offer(desired(1, 3, workers=2)) is Verdict.ACCEPTED  # gaps are fine
    assert tracker.observed_generation == 3 and len(latest_of(tracker).workers) == 2


def test_duplicates_and_reordered_deliveries_are_ignored() -> None:
    tracker = DesiredStateTracker()
    tracker.offer(desired(1, 5))
    assert tracker.offer(desired(1, 5)) is Verdict.OLD_GENERATION
    assert tracker.offer(desired(1, 4, workers=9)) is Verdict.OLD_GENERATION
    assert tracker.observed_generation == 5 and not latest_of(tracker).workers


def test_generation_zero_means_no_desired_state() -> None:
    tracker = DesiredStateTracker()
    assert tracker.offer(desired(1, 0)) is Verdict.OLD_GENERATION
    assert tracker.latest is None


def test_a_stale_epoch_is_refused() -> None:
    tracker = DesiredStateTracker()
    tracker.offer(desired(2, 1))
    assert tracker.offer(desired(1, 99)) is Verdict.STALE_EPOCH
    assert tracker.observed_generation == 1


def test_a_newer_epoch_is_accepted_whatever_its_generation() -> None:
    tracker = DesiredStateTracker()
    tracker.offer(desired(1, 40))
    assert tracker.offer(desired(2, 3)) is Verdict.ACCEPTED_NEW_EPOCH
    assert tracker.observed_generation == 3
    assert tracker.offer(desired(1, 41)) is Verdict.STALE_EPOCH  # the old term is fenced off now


def test_registration_epoch_raises_the_fence() -> None:
    tracker = DesiredStateTracker()
    assert tracker.observe_epoch(3)
    assert tracker.offer(desired(2, 10)) is Verdict.STALE_EPOCH
    assert not tracker.observe_epoch(2)  # a deposed scheduler answering a registration
    assert tracker.observe_epoch(3) and tracker.newest_epoch == 3
    assert tracker.offer(desired(3, 1)) is Verdict.ACCEPTED


# --------------------------------------------------------------------------------------------------
# Backoff


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap() -> None:
    import random

    backoff = Backoff(4.0, initial_s=0.5, rng=random.Random(7))
    delays = [backoff.next_delay() for _ in range(8)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True)), delays
    assert len(set(delays)) == len(delays)  # jittered
    assert backoff.failures == 8
    backoff.reset()
    assert backoff.next_delay() <= 0.5


def test_a_signal_stops_the_daemon_loop_from_the_main_thread() -> None:
    stop = threading.Event()
    stopped_from: list[str] = []

    def request_stop() -> None:
        stopped_from.append(threading.current_thread().name)
        stop.set()

    def run() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # handled by run_until_signalled, not fatal
        assert stop.wait(5), "stop() was never called"

    previous = signal.getsignal(signal.SIGTERM)
    run_until_signalled(run, request_stop, poll_s=0.01)
    assert stopped_from == ["MainThread"]
    assert signal.getsignal(signal.SIGTERM) is previous  # handlers restored


def test_the_daemon_loop_reraises_what_run_raised() -> None:
    def run() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_until_signalled(run, lambda: None, poll_s=0.01)


# --------------------------------------------------------------------------------------------------
# The agent's control loop against an in-process fake AgentService (tests.harness.FakeScheduler)


@pytest.fixture
def fake_scheduler() -> Iterator[FakeScheduler]:
    scheduler = FakeScheduler(epoch=5)
    yield scheduler
    scheduler.stop()


class RunningAgent:
    def __init__(self, address: str, work_dir: Path, hostname: str = "fake-node", gpus: int = 2) -> None:
        config = AgentSection(
            insecure=True,  # the fake AgentService listens in plaintext
            scheduler_address=address,
            hostname=hostname,
            rpc_timeout_s=2.0,
            reconnect_max_backoff_s=0.2,
            work_dir=str(work_dir),
            reconcile_interval_s=0.05,
        )
        self.backend = FakeBackend(hostname, count=gpus)
        self.agent = Agent(config, self.backend, backoff=Backoff(0.2, initial_s=0.02), version="test", users=AS_ITSELF)
        self.thread = threading.Thread(target=self.agent.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.agent.stop()
        self.thread.join(timeout=5)
        assert not self.thread.is_alive(), "agent did not stop within 5 s"


@pytest.fixture
def running_agent(fake_scheduler: FakeScheduler, tmp_path: Path) -> Iterator[RunningAgent]:
    agent = RunningAgent(f"127.0.0.1:{fake_scheduler.port}", tmp_path / "agent")
    yield agent
    agent.stop()


def test_agent_registers_its_gpus_and_reports_status(
    fake_scheduler: FakeScheduler, running_agent: RunningAgent
) -> None:
    service = fake_scheduler.service
    wait_for(lambda: len(service.reports) >= 3, what="three status reports")
    (registration,) = service.registrations
    assert registration.hostname == "fake-node" and registration.pool == types_pb2.POOL_TRAINING
    assert registration.agent_address == "fake-node" and registration.agent_version == "test"
    assert registration.logs_address.startswith("fake-node:") and registration.inference_endpoint == ""
    assert [g.uuid for g in registration.gpus] == [fake_gpu_uuid("fake-node", i) for i in range(2)]
    report = service.reports[-1]
    assert report.server_id == "fake-node" and report.scheduler_epoch == 5
    assert [g.index for g in report.gpus] == [0, 1] and not report.workers


def test_agent_reports_injected_gpu_faults(fake_scheduler: FakeScheduler, running_agent: RunningAgent) -> None:
    running_agent.backend.mark_unhealthy(1, "XID 79")
    report = wait_for(
        lambda: next((r for r in reversed(fake_scheduler.service.reports) if not r.gpus[1].healthy), None),
        what="a report with GPU 1 unhealthy",
    )
    assert report.gpus[1].health_reason == "XID 79" and report.gpus[0].healthy


def test_agent_reports_the_generation_it_accepted_and_fences_stale_epochs(
    fake_scheduler: FakeScheduler, running_agent: RunningAgent
) -> None:
    service = fake_scheduler.service
    wait_for(lambda: service.streams_opened, what="the desired-state stream")
    with capture_logs() as logs:
        for state in (desired(5, 1, workers=2), desired(5, 1), desired(4, 9), desired(5, 2, workers=1)):
            service.push(state)
        wait_for(lambda: service.reports[-1].observed_generation == 2, what="observed_generation 2")
    assert all(r.observed_generation in (0, 1, 2) for r in service.reports)
    received = [e for e in logs if e["event"].startswith("desired state received")]
    assert [e["generation"] for e in received] == [1, 2]  # once per generation; dup and stale dropped
    assert received[0]["event"] == "desired state received: 2 workers"
    assert any(e["event"].startswith("refused desired state from a stale scheduler epoch") for e in logs)


@contextmanager
def replaced(scheduler: FakeScheduler, *, epoch: int) -> Iterator[FakeScheduler]:
    """Stop ``scheduler`` once the agent reported to it; start another with ``epoch`` on its port."""
    wait_for(lambda: scheduler.service.reports, what="a first report")
    scheduler.stop()
    successor = FakeScheduler(epoch=epoch, port=scheduler.port)
    try:
        yield successor
    finally:
        successor.stop()


def test_agent_reregisters_after_the_scheduler_restarts(
    fake_scheduler: FakeScheduler, running_agent: RunningAgent
) -> None:
    with replaced(fake_scheduler, epoch=6) as restarted:
        report = wait_for(lambda: restarted.service.reports, what="reports to the restarted scheduler")[0]
        assert report.scheduler_epoch == 6
        assert [r.hostname for r in restarted.service.registrations] == ["fake-node"]


def test_agent_refuses_a_deposed_scheduler_at_registration(
    fake_scheduler: FakeScheduler, running_agent: RunningAgent
) -> None:
    with replaced(fake_scheduler, epoch=4) as deposed:
        wait_for(lambda: len(deposed.service.registrations) >= 3, what="repeated registration attempts")
        assert not deposed.service.reports and not deposed.service.streams_opened


@contextmanager
def agent_of(scheduler: FakeScheduler, work_dir: Path) -> Iterator[RunningAgent]:
    """An agent registering with ``scheduler``, stopped on the way out."""
    agent = RunningAgent(f"127.0.0.1:{scheduler.port}", work_dir)
    try:
        yield agent
    finally:
        agent.stop()


def acted_on(scheduler: FakeScheduler, generation: int) -> bool:
    """Whether the agent's last report to ``scheduler`` says it acted on ``generation``."""
    return bool(scheduler.service.reports) and scheduler.service.reports[-1].observed_generation == generation


def test_agent_watches_on_the_port_the_registration_names(tmp_path: Path) -> None:
    pushes = FakeScheduler(epoch=5)  # the desired-state streams' own process
    main = FakeScheduler(epoch=5, desired_state_port=pushes.port)
    try:
        with capture_logs() as logs, agent_of(main, tmp_path / "agent"):
            wait_for(lambda: pushes.service.streams_opened, what="a stream on the named port")
            pushes.service.push(desired(5, 1, workers=1))
            wait_for(lambda: acted_on(main, 1), what="the state pushed there acted on")
            # It dies and comes back on its port: the agent watches there again, without registering again.
            pushes.stop()
            pushes = FakeScheduler(epoch=5, port=pushes.port)
            wait_for(lambda: pushes.service.streams_opened, what="a stream on the process started again")
            pushes.service.push(desired(5, 2))
            wait_for(lambda: acted_on(main, 2), what="the state pushed by the process started again acted on")
        assert main.service.streams_opened == 0 and len(main.service.registrations) == 1
        watching = [e for e in logs if e["event"].startswith("watching the desired state on")]
        assert len(watching) == 2 and {e["port"] for e in watching} == {pushes.port}
    finally:
        main.stop()
        pushes.stop()


def test_agent_watches_another_replica_s_process_first_and_falls_back_to_the_scheduler_s_own(tmp_path: Path) -> None:
    standby = FakeScheduler(epoch=5)  # a standby's desired-state streams' process, named by host:port
    own = FakeScheduler(epoch=5)  # the scheduler's own process, named by its port
    main = FakeScheduler(epoch=5, desired_state_port=own.port, desired_state_address=f"127.0.0.1:{standby.port}")
    try:
        with capture_logs() as logs, agent_of(main, tmp_path / "agent"):
            wait_for(lambda: standby.service.streams_opened, what="a stream on the named replica's process")
            standby.service.push(desired(5, 1, workers=1))
            wait_for(lambda: acted_on(main, 1), what="the state pushed by the standby's process acted on")
            assert own.service.streams_opened == 0
            standby.stop()  # its scheduler died: it does not come back; the scheduler's own is watched
            wait_for(lambda: own.service.streams_opened, what="a stream on the scheduler's own process")
            own.service.push(desired(5, 2))
            wait_for(lambda: acted_on(main, 2), what="the state pushed by the scheduler's own process acted on")
        assert main.service.streams_opened == 0 and len(main.service.registrations) == 1
        watching = [e for e in logs if e["event"].startswith("watching the desired state on")]
        assert [e["port"] for e in watching] == [standby.port, own.port]
        assert any(e["event"].endswith("is unreachable; watching the next one") for e in logs)
    finally:
        main.stop()
        own.stop()
        standby.stop()


def test_agent_watches_the_scheduler_where_the_named_port_is_unreachable(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections, never speaks: unreachable
        main = FakeScheduler(epoch=5, desired_state_port=silent.getsockname()[1])
        try:
            with capture_logs() as logs, agent_of(main, tmp_path / "agent"):
                wait_for(lambda: main.service.streams_opened, what="the scheduler's own stream")
                main.service.push(desired(5, 1, workers=1))
                wait_for(lambda: acted_on(main, 1), what="the state pushed by the scheduler acted on")
            assert len(main.service.registrations) == 1
            assert any(e["event"].startswith("the scheduler's desired-state streams' process is unreachable")
                       for e in logs)
        finally:
            main.stop()


def test_agent_stops_promptly_while_the_scheduler_is_unreachable(tmp_path: Path) -> None:
    agent = RunningAgent("127.0.0.1:1", tmp_path / "agent")
    time.sleep(0.3)  # let it fail and back off a few times (not an assertion)
    started = time.monotonic()
    agent.stop()
    assert time.monotonic() - started < 2.0


# --------------------------------------------------------------------------------------------------
# The real daemons, as console scripts, against a real scheduler


def test_agent_daemon_registers_with_a_real_scheduler_and_exits_cleanly(scheduler, tmp_path: Path) -> None:
    log_path = tmp_path / "agent.log"
    args = [
        console_script("aryl-agent"),
        "--scheduler", scheduler.address,
        "--hostname", "t-agent-1",
        "--pool", "training",
        "--fake-gpus", "4",
        "--work-dir", str(tmp_path / "agent"),
    ]
    channel, stub = scheduler_stub(scheduler.address)
    with channel, running_daemon(args, log_path) as check_alive:

        def listed() -> types_pb2.Server | None:
            check_alive()
            servers = stub.ListServers(scheduler_pb2.ListServersRequest(), timeout=5).servers
            return next((s for s in servers if s.hostname == "t-agent-1"), None)

        server = wait_for(listed, timeout=30, what="t-agent-1 in ListServers")
        assert server.pool == types_pb2.POOL_TRAINING
        assert server.gpus_total == 4 and len(server.gpus) == 4
        assert sorted(g.uuid for g in server.gpus) == sorted(fake_gpu_uuid("t-agent-1", i) for i in range(4))
        first_seen = server.last_seen_at.ToDatetime(tzinfo=UTC)
        # Status reports keep arriving: last_seen moves forward and stays close to now.
        server = wait_for(
            lambda: (s := listed()) and s.last_seen_at.ToDatetime(tzinfo=UTC) > first_seen and s,
            timeout=15,
            what="last_seen_at to advance (status reports)",
        )
        age = (datetime.now(UTC) - server.last_seen_at.ToDatetime(tzinfo=UTC)).total_seconds()
        assert abs(age) < 10, f"last_seen_at is {age:.1f}s old"
    assert "registered with the scheduler" in log_path.read_text()


def test_router_daemon_reports_demand_to_a_real_scheduler_and_exits_cleanly(scheduler, tmp_path: Path) -> None:
    # Static demand mode against a real scheduler (the proxy itself is tested in tests/router/test_router.py).
    for name in ("inf-1", "inf-2", "inf-3"):  # demand is at most the inference pool's size
        register_fake_server(scheduler.address, name, pool="inference", gpus=1)
    args = [
        console_script("aryl-router"),
        "--listen", "127.0.0.1:0",
        "--scheduler", scheduler.address,
        "--servers-needed", "3",
        "--source", "test-router",
        "--interval", "0.2",
    ]
    channel = secure_channel(scheduler.address)
    stub = inference_pb2_grpc.InferenceServiceStub(channel)
    with channel, running_daemon(args, tmp_path / "router.log") as check_alive:

        def reported() -> bool:
            check_alive()
            demand = stub.GetDemand(inference_pb2.GetDemandRequest(), timeout=5).demand
            return demand.servers_needed == 3 and demand.source == "test-router"

        wait_for(reported, timeout=30, what="the router's demand at the scheduler")
