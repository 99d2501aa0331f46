"""What the agent knows about its server's GPUs: an inventory at start-up and a status sample per report.

Nouns: a *GPU backend* answers two questions, ``inventory()`` (which GPUs exist: index, UUID,
model, memory) and ``sample()`` (how each one is doing now: utilisation, memory, temperature,
health). ``NvmlBackend`` asks the NVIDIA driver through pynvml; ``FakeBackend`` invents GPUs for
try-outs and tests, and lets a test inject a fault. ``select_backend`` picks one from the config.

This module only observes. It never decides what an unhealthy GPU means for jobs (the scheduler
does), and it never touches processes.

GPU indices are NVML's, which follow PCI bus order; workers started on these GPUs must therefore
run with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so ``CUDA_VISIBLE_DEVICES`` means the same GPUs.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import structlog

from node_agent.config import GpusSection


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as registered with the scheduler; fixed for the life of the agent."""

    index: int
    uuid: str
    model: str
    memory_total_bytes: int


@dataclass(frozen=True)
class GpuSample:
    """One GPU's status at one moment; 0 means "not reported" for the counters the driver lacks."""

    index: int
    utilization: float  # 0..1
    memory_used_bytes: int
    temperature_c: float
    healthy: bool = True
    health_reason: str = ""  # empty when healthy; otherwise "; "-joined reason codes with counts
    ecc_uncorrectable: int = 0
    retired_pages: int = 0


class GpuBackend(Protocol):
    """Where GPU facts come from. Implementations must be safe to call from the agent's report loop."""

    name: str

    def inventory(self) -> list[GpuInfo]:
        """The server's GPUs in index order. Called at registration; must not change while running."""
        ...

    def sample(self) -> list[GpuSample]:
        """Current status of every GPU in ``inventory()``, same order. Must not raise for one bad GPU:
        report that GPU unhealthy with a reason instead."""
        ...

    def close(self) -> None:
        """Release driver handles. Idempotent."""
        ...


class GpuBackendUnavailable(Exception):
    """The requested GPU backend cannot work on this machine; the message says why."""


def assess_health(
    *,
    ecc_uncorrectable: int = 0,
    retired_pages: int = 0,
    retired_pages_pending: bool = False,
    row_remap_pending: bool = False,
    row_remap_failed: bool = False,
) -> tuple[bool, str]:
    """Healthy or not, and why, from the driver's error counters.

    Uncorrectable (double-bit) ECC errors since the driver loaded mean data may have been corrupted;
    a pending page retirement or row remap only takes effect after a GPU reset. Either way the GPU
    should not run new work until an operator resets it. Retired pages alone, already in effect,
    are not a fault.
    """
    reasons = []
    if ecc_uncorrectable > 0:
        reasons.append(f"ECC_UNCORRECTABLE: {ecc_uncorrectable}")
    if retired_pages_pending:
        reasons.append(f"RETIRED_PAGES_PENDING: {retired_pages} retired, GPU reset needed")
    if row_remap_pending:
        reasons.append("ROW_REMAP_PENDING: GPU reset needed")
    if row_remap_failed:
        reasons.append("ROW_REMAP_FAILED")
    return (not reasons, "; ".join(reasons))


# --------------------------------------------------------------------------------------------------
# NVML


def import_pynvml() -> ModuleType:
    """Import the ``pynvml`` module (NVIDIA's own bindings, package nvidia-ml-py)."""
    try:
        import pynvml
    except ImportError as exc:
        raise GpuBackendUnavailable(f"pynvml is not installed (pip install nvidia-ml-py): {exc}") from exc
    return pynvml


class NvmlBackend:
    """Real GPUs through NVML. Construction initialises NVML; GpuBackendUnavailable when it cannot."""

    name = "nvml"

    def __init__(self, nvml: Any = None) -> None:
        """``nvml``: the pynvml module, or a stand-in with the same names (tests); imported when None."""
        self._nvml = nvml if nvml is not None else import_pynvml()
        # Errors that mean "this GPU/driver does not report that counter", not "the GPU is broken".
        self._not_reported = tuple(
            getattr(self._nvml, name)
            for name in ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")
            if hasattr(self._nvml, name)
        )
        self._initialised = False
        try:
            self._nvml.nvmlInit()
        except self._nvml.NVMLError as exc:
            raise GpuBackendUnavailable(f"NVML could not initialise: {exc}") from exc
        self._initialised = True
        try:
            count = self._nvml.nvmlDeviceGetCount()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._inventory = [self._describe(i, h) for i, h in enumerate(self._handles)]
        except self._nvml.NVMLError as exc:
            self.close()
            raise GpuBackendUnavailable(f"NVML could not list the GPUs: {exc}") from exc
        if not self._inventory:
            self.close()
            raise GpuBackendUnavailable("NVML works but reports no GPUs on this machine")

    def _describe(self, index: int, handle: Any) -> GpuInfo:
        nvml = self._nvml
        return GpuInfo(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            model=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total_bytes=int(nvml.nvmlDeviceGetMemoryInfo(handle).total),
        )

    def inventory(self) -> list[GpuInfo]:
        return list(self._inventory)

    def sample(self) -> list[GpuSample]:
        samples = []
        for index, handle in enumerate(self._handles):
            try:
                samples.append(self._sample_one(index, handle))
            except self._nvml.NVMLError as exc:
                # E.g. NVMLError_GpuIsLost (fell off the bus): the GPU exists but cannot be used.
                samples.append(GpuSample(index, 0.0, 0, 0.0, healthy=False, health_reason=f"NVML_ERROR: {exc}"))
        return samples

    def _sample_one(self, index: int, handle: Any) -> GpuSample:
        nvml = self._nvml
        utilization = self._optional(nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        temperature = self._optional(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
        ecc = self._optional(
            nvml.nvmlDeviceGetTotalEccErrors, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        )
        # Page retirement (pre-Ampere) and row remapping (Ampere and later) are alternatives; each GPU
        # reports one of them and answers NotSupported for the other.
        retired = [
            self._optional(nvml.nvmlDeviceGetRetiredPages, handle, cause)
            for cause in (
                nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
            )
        ]
        retired_pages = sum(len(pages) for pages in retired if pages is not None)
        pending = self._optional(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        remap = self._optional(nvml.nvmlDeviceGetRemappedRows, handle)
        ecc_uncorrectable = int(ecc or 0)
        healthy, reason = assess_health(
            ecc_uncorrectable=ecc_uncorrectable,
            retired_pages=retired_pages,
            retired_pages_pending=pending == nvml.NVML_FEATURE_ENABLED,
            row_remap_pending=bool(remap and remap[2]),
            row_remap_failed=bool(remap and remap[3]),
        )
        return GpuSample(
            index=index,
            utilization=(utilization.gpu / 100.0) if utilization is not None else 0.0,
            memory_used_bytes=int(memory.used),
            temperature_c=float(temperature or 0.0),
            healthy=healthy,
            health_reason=reason,
            ecc_uncorrectable=ecc_uncorrectable,
            retired_pages=retired_pages,
        )

    def _optional(self, query: Callable[..., Any], *args: Any) -> Any:
        """``query(*args)``, or None where this GPU or driver does not report it."""
        try:
            return query(*args)
        except self._not_reported:
            return None

    def close(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass  # shutting down anyway; nothing to do about a driver that will not let go


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else value


# --------------------------------------------------------------------------------------------------
# Fake GPUs

# Fixed namespace so fake UUIDs are stable across runs, releases and machines.
_FAKE_GPU_NAMESPACE = uuid.UUID("6d1f0a52-3c1e-4f0b-9a57-0a7e5a0c1a11")


def fake_gpu_uuid(hostname: str, index: int) -> str:
    """A stable NVML-style UUID for fake GPU ``index`` on ``hostname``.

    Derived from both, so two fake agents on one machine (different ``--hostname``) never collide:
    the scheduler's store holds GPU UUIDs unique across the cluster.
    """
    return f"GPU-{uuid.uuid5(_FAKE_GPU_NAMESPACE, f'{hostname}/{index}')}"


@dataclass(frozen=True)
class _Fault:
    reason: str
    ecc_uncorrectable: int
    retired_pages: int


class FakeBackend:
    """Pretend GPUs: stable UUIDs, smoothly varying utilisation, and faults injected on request.

    Utilisation follows a slow wave per GPU (different phase per GPU, seeded by the hostname) plus
    a little noise, so dashboards and status reports show movement. It does not reflect any work:
    the agent runs no processes on fake GPUs.
    """

    name = "fake"

    def __init__(
        self,
        hostname: str,
        *,
        count: int = 4,
        model: str = "Fake-A100-80GB",
        memory_gb: int = 80,
        clock: Callable[[], float] = time.monotonic,
        period_s: float = 300.0,
    ) -> None:
        if count < 0:
            raise ValueError(f"fake GPU count must be >= 0, got {count}")
        self.hostname = hostname
        self._inventory = [
            GpuInfo(index=i, uuid=fake_gpu_uuid(hostname, i), model=model, memory_total_bytes=memory_gb * 1024**3)
            for i in range(count)
        ]
        self._clock = clock
        self._period_s = period_s
        self._rng = random.Random(f"fake-gpus/{hostname}")
        self._phases = [self._rng.uniform(0, 2 * math.pi) for _ in range(count)]
        self._faults: dict[int, _Fault] = {}
        self._lock = threading.Lock()

    def inventory(self) -> list[GpuInfo]:
        return list(self._inventory)

    def sample(self) -> list[GpuSample]:
        now = self._clock()
        with self._lock:
            faults = dict(self._faults)
            noise = [self._rng.uniform(-0.03, 0.03) for _ in self._inventory]
        samples = []
        for gpu, phase, jitter in zip(self._inventory, self._phases, noise, strict=True):
            wave = 0.5 + 0.4 * math.sin(2 * math.pi * now / self._period_s + phase)
            utilization = min(1.0, max(0.0, wave + jitter))
            fault = faults.get(gpu.index)
            samples.append(
                GpuSample(
                    index=gpu.index,
                    utilization=utilization,
                    memory_used_bytes=int(gpu.memory_total_bytes * 0.9 * utilization),
                    temperature_c=round(35.0 + 45.0 * utilization, 1),
                    healthy=fault is None,
                    health_reason=fault.reason if fault else "",
                    ecc_uncorrectable=fault.ecc_uncorrectable if fault else 0,
                    retired_pages=fault.retired_pages if fault else 0,
                )
            )
        return samples

    def mark_unhealthy(
        self, index: int, reason: str, *, ecc_uncorrectable: int = 0, retired_pages: int = 0
    ) -> None:
        """Inject a fault: GPU ``index`` reports unhealthy with ``reason`` until ``mark_healthy``."""
        self._check_index(index)
        if not reason:
            raise ValueError("an injected fault needs a reason (it is what the scheduler shows)")
        with self._lock:
            self._faults[index] = _Fault(reason, ecc_uncorrectable, retired_pages)

    def mark_healthy(self, index: int) -> None:
        """Clear an injected fault (as if an operator reset the GPU)."""
        self._check_index(index)
        with self._lock:
            self._faults.pop(index, None)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self._inventory):
            raise ValueError(f"no fake GPU {index} on {self.hostname} (it has {len(self._inventory)})")

    def close(self) -> None:
        pass


def select_backend(gpus: GpusSection, hostname: str) -> GpuBackend:
    """The backend ``gpus.backend`` names. ``auto``: NVML when it works, else fake GPUs, saying why.

    ``nvml`` raises GpuBackendUnavailable rather than falling back: a production GPU server with a
    broken driver must not register invented GPUs.
    """
    if gpus.backend in ("auto", "nvml"):
        try:
            return NvmlBackend()
        except GpuBackendUnavailable as exc:
            if gpus.backend == "nvml":
                raise GpuBackendUnavailable(f"gpus.backend is 'nvml' but {exc}") from exc
            structlog.get_logger("node_agent.gpus").warning(
                "NVML unavailable, using FAKE GPUs (set gpus.backend=nvml to make this an error)",
                reason=str(exc),
                fake_count=gpus.fake_count,
                fake_model=gpus.fake_model,
            )
    return FakeBackend(hostname, count=gpus.fake_count, model=gpus.fake_model, memory_gb=gpus.fake_memory_gb)
