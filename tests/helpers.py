"""Small builders for tests that talk to a real scheduler over gRPC."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc

from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

T = TypeVar("T")

POOLS = {"training": types_pb2.POOL_TRAINING, "inference": types_pb2.POOL_INFERENCE}


def register_fake_server(
    address: str, hostname: str, pool: str = "training", gpus: int = 4
) -> agent_pb2.RegisterServerResponse:
    """Register a server with ``gpus`` fake GPUs through the AgentService, as an agent would."""
    with grpc.insecure_channel(address) as channel:
        return agent_pb2_grpc.AgentServiceStub(channel).RegisterServer(
            agent_pb2.RegisterServerRequest(
                hostname=hostname,
                pool=POOLS[pool],
                gpus=[
                    agent_pb2.GpuInfo(index=i, uuid=f"GPU-{hostname}-{i}", model="Fake-GPU", memory_total_bytes=80 << 30)
                    for i in range(gpus)
                ],
                agent_address=hostname,
                agent_version="test",
            ),
            timeout=10,
        )


def job_spec(name: str = "job", *, user: str = "alice", gpus: int = 1, workers: int = 1, max_workers: int = 0,
             **fields) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(name=name, user=user, command=["python", "train.py"], gpus_per_worker=gpus,
                             min_workers=workers, max_workers=max_workers, **fields)


def scheduler_stub(address: str) -> tuple[grpc.Channel, scheduler_pb2_grpc.SchedulerServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, scheduler_pb2_grpc.SchedulerServiceStub(channel)


def wait_for(predicate: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.05, what: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def job_state(stub: scheduler_pb2_grpc.SchedulerServiceStub, job_id: str) -> int:
    return stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=5).job.state


def processes_mentioning(marker: str) -> list[int]:
    """Pids of live processes whose environment or command line mentions ``marker``."""
    needle = marker.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if needle in Path(f"/proc/{entry}/environ").read_bytes() or needle in Path(f"/proc/{entry}/cmdline").read_bytes():
                status = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if status != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found
