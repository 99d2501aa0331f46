"""The soak's load: ``Driver`` sends submits, cancels and demand reports to the scheduler on its own
thread and event loop, in the shape ``Regime`` describes (``benchmarks.soak`` starts and stops it, and
checks the submissions and cancellations it had acknowledged against the database).

- **Submits** arrive as a Poisson stream; a fifth of the jobs are rigid (1..4 workers), the rest
  elastic (1..4 up to 8..32 workers), all of 8-GPU workers, each running ``SOAK_RUN_S`` seconds
  (uniform in the run-time range) once placed; then the agents report its workers exited 0 and the
  job completes. Every submission carries an idempotency key, and is made by the user it names.
- **Cancels** arrive as a Poisson stream too and pick a random recent job not yet cancelled. One
  that has ended meanwhile is refused FAILED_PRECONDITION: that is the one expected error.
- **Inference demand** (``ReportDemand``, every few seconds like a router) follows a sine between
  a fifth of the inference pool and all of it but one, so idle inference servers are lent to
  training while it is low (after a short drain timeout: no router acknowledges drains) and
  reclaimed while it rises.

With a ``pki`` every call carries an identity, as in production: each of the ``USERS`` submits with its
own token and cancels only its own jobs; the demand comes from the router ``ROUTER``.

Never: import from ``tests/``, or judge what it sees (errors are counted, by ``Method:CODE``, for the
summary to judge).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from aryl_common.security import secure_aio_channel
from benchmarks.fake_fleet import RUN_ENV, client_security, shards_for
from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2

log = logging.getLogger("aryl.soak")

RPC_TIMEOUT_S = 60.0
DEMAND_REPORT_S = 5.0
INFERENCE_SHARE = 0.2            # of the fleet's agents
SUBMITS_PER_S_PER_1000_AGENTS = 1.0
CANCEL_SHARE = 0.1               # cancels per submit
RIGID_SHARE = 0.2
RUN_S = (60.0, 240.0)
GPUS_PER_WORKER = 8
RECENT_JOBS = 200                # cancels pick among the latest acknowledged jobs
USERS = tuple(f"user-{i}" for i in range(10))  # who submits; each with a token of its own
ROUTER = "soak-router"           # who reports the inference demand
# The scheduler's settings: loans and reclaims within minutes, not the production half hour.
SETTINGS = {
    "ARYL_POLICY__LOAN_IDLE_S": "15", "ARYL_POLICY__DRAIN_TIMEOUT_S": "5", "ARYL_POLICY__MIN_LOAN_S": "60",
}


@dataclass(frozen=True)
class Regime:
    agents: int
    inference_agents: int
    submits_per_s: float
    cancels_per_s: float
    demand_period_s: float

    @property
    def training_agents(self) -> int:
        return self.agents - self.inference_agents

    def demand(self, t_s: float) -> int:
        """Inference servers needed at ``t_s``: a sine from all but one (t = 0) down to a fifth."""
        high, low = max(1, self.inference_agents - 1), max(1, self.inference_agents // 5)
        return round(low + (high - low) * (0.5 + 0.5 * math.cos(2 * math.pi * t_s / self.demand_period_s)))

    def describe(self) -> dict[str, object]:
        return {
            "agents": f"{self.agents} ({self.training_agents} training + {self.inference_agents} inference, "
                      f"{shards_for(self.agents)} shard processes, 8 GPUs each, one report per interval)",
            "submits": f"{self.submits_per_s:g}/s Poisson ({RIGID_SHARE:.0%} rigid 1..4 workers, the rest elastic "
                       f"1..4 up to 8..32 workers, 8 GPUs/worker, run {RUN_S[0]:.0f}..{RUN_S[1]:.0f} s once placed)",
            "cancels": f"{self.cancels_per_s:g}/s Poisson among the {RECENT_JOBS} latest jobs",
            "demand": f"ReportDemand every {DEMAND_REPORT_S:g} s, servers_needed a sine "
                      f"{self.demand(self.demand_period_s / 2)}..{self.demand(0)} over {self.demand_period_s:g} s",
            "scheduler": "defaults except " + ", ".join(f"{k.removeprefix('ARYL_').lower()}={v}"
                                                         for k, v in SETTINGS.items()),
        }


class Driver:
    """Submits, cancels and demand reports. With a ``pki`` each user calls with its own token (and the
    client certificate), and the demand comes from the router ``ROUTER`` with its certificate and
    token; without one, plaintext on one channel."""

    def __init__(self, address: str, regime: Regime, seed: int, pki: Path | None) -> None:
        self._address = address
        self._pki = pki
        self._regime = regime
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="soak-driver", daemon=True)
        self.acked: list[str] = []               # acknowledged job ids, in order
        self._owner: dict[str, str] = {}         # job id -> the user that submitted it
        self.cancelled: set[str] = set()         # acknowledged cancellations
        self._tried: set[str] = set()            # jobs a cancellation was sent for (never picked again)
        self.errors: Counter[str] = Counter()
        self.messages: dict[str, str] = {}       # the first message of each kind of error
        self._submit_latency: list[float] = []
        self.crashed: BaseException | None = None
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=RPC_TIMEOUT_S + 30)

    def drain_latency(self) -> list[float]:
        with self._lock:
            got, self._submit_latency = self._submit_latency, []
        return got

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except BaseException as exc:  # a broken driver fails the soak
            log.exception("the load driver failed")
            self.crashed = exc

    async def _run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            def channel(cert: str, principal: str) -> grpc.aio.Channel:
                opened = secure_aio_channel(self._address, client_security(self._pki, cert, principal), [])
                stack.push_async_callback(opened.close)
                return opened

            if self._pki is None:
                shared = channel("", "")
                jobs = {user: scheduler_pb2_grpc.SchedulerServiceStub(shared) for user in USERS}
                inference = inference_pb2_grpc.InferenceServiceStub(shared)
            else:
                jobs = {user: scheduler_pb2_grpc.SchedulerServiceStub(channel("client", user)) for user in USERS}
                inference = inference_pb2_grpc.InferenceServiceStub(channel(f"router-{ROUTER}", ROUTER))
            calls: set[asyncio.Task[None]] = set()
            loops = [self._poisson(self._regime.submits_per_s, lambda: self._submit(jobs), calls),
                     self._poisson(self._regime.cancels_per_s, lambda: self._cancel(jobs), calls),
                     self._demand(inference)]
            await asyncio.gather(*loops)
            await asyncio.gather(*calls)  # every call sent is answered before the checks

    async def _sleep(self, seconds: float) -> bool:
        """Sleep unless stopping; False once stopping."""
        end = time.monotonic() + seconds
        while not self._stop.is_set():
            left = end - time.monotonic()
            if left <= 0:
                return True
            await asyncio.sleep(min(left, 0.5))
        return False

    async def _poisson(
        self, rate: float, call: Callable[[], Coroutine[Any, Any, None]], calls: set[asyncio.Task[None]]
    ) -> None:
        if rate <= 0:
            return
        while await self._sleep(self._rng.expovariate(rate)):
            task = asyncio.create_task(call())
            calls.add(task)
            task.add_done_callback(calls.discard)

    def _spec(self) -> types_pb2.JobSpec:
        rng = self._rng
        if rng.random() < RIGID_SHARE:
            low = high = rng.randint(1, 4)
        else:
            low, high = rng.randint(1, 4), rng.randint(8, 32)
        return types_pb2.JobSpec(
            name=f"soak-{'rigid' if low == high else 'elastic'}-{uuid.uuid4().hex[:8]}",
            user=rng.choice(USERS), command=["python", "train.py"],
            env={RUN_ENV: f"{rng.uniform(*RUN_S):.0f}"}, gpus_per_worker=GPUS_PER_WORKER,
            min_workers=low, max_workers=high,
        )

    async def _submit(self, stubs: Mapping[str, scheduler_pb2_grpc.SchedulerServiceStub]) -> None:
        request = scheduler_pb2.SubmitJobRequest(spec=self._spec(), idempotency_key=uuid.uuid4().hex)
        sent = time.perf_counter()
        try:
            reply = await stubs[request.spec.user].SubmitJob(request, timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._error("SubmitJob", exc)
            return
        with self._lock:
            self._submit_latency.append(time.perf_counter() - sent)
            self.acked.append(reply.job.job_id)
            self._owner[reply.job.job_id] = request.spec.user

    async def _cancel(self, stubs: Mapping[str, scheduler_pb2_grpc.SchedulerServiceStub]) -> None:
        with self._lock:
            recent = [j for j in self.acked[-RECENT_JOBS:] if j not in self._tried]
        if not recent:
            return
        job_id = self._rng.choice(recent)
        self._tried.add(job_id)
        try:  # by its owner: a user may cancel only its own jobs
            await stubs[self._owner[job_id]].CancelJob(scheduler_pb2.CancelJobRequest(job_id=job_id, reason="soak"),
                                                       timeout=RPC_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            self._error("CancelJob", exc)
            return
        self.cancelled.add(job_id)

    def _error(self, method: str, exc: grpc.aio.AioRpcError) -> None:
        key = f"{method}:{exc.code().name}"
        self.errors[key] += 1
        self.messages.setdefault(key, exc.details() or "")

    async def _demand(self, stub: inference_pb2_grpc.InferenceServiceStub) -> None:
        while not self._stop.is_set():
            needed = self._regime.demand(time.monotonic() - self._started)
            try:
                await stub.ReportDemand(inference_pb2.ReportDemandRequest(
                    servers_needed=needed, observed_rps=10.0 * needed, source="aryl-soak"), timeout=RPC_TIMEOUT_S)
            except grpc.aio.AioRpcError as exc:
                self._error("ReportDemand", exc)
            await self._sleep(DEMAND_REPORT_S)
