"""Shared test builders: the small functions and fakes that make what a test feeds the code under test.

One house for them, as Nomad's ``scheduler/tests`` and Ray autoscaler v2's ``tests/util.py`` are: a
builder written once here is the same in every test module, so a change to a value type is made in one
place, and no test module imports another. Sections, by what they build:

- *Core values*: ``ServerView``/``JobView``/``ClusterSnapshot`` for the pure policies, and plan actions
  (``StartJob``, ``ScaleJob``, ``ServerAction``) for the appliers. Hand-built snapshots are taken at
  ``NOW``; GPUs are numbered ``0..gpus-1``.
- *Simulator input*: trace jobs whose speed is easy to compute by hand.
- *Time*: ``ManualClock``, the ``Clock`` port moved by hand.
- *A scheduler over gRPC*: its configuration for tests, fake agent registrations and job specs.
- *Reading what gRPC answers*: the health and reflection stubs and a refusal's details, typed where grpc's
  own stubs leave them loose.
- *Agents*: desired states as the scheduler pushes them, and ``FakeScheduler``, an in-process
  AgentService that records what an agent sends.
- *Databases*: scratch PostgreSQL databases.

Builders only build: they assert nothing about the code under test. Waiting and process helpers (no
domain imports) are in ``tests/helpers.py``.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from queue import Empty, Queue
from typing import Any, Protocol, cast

import grpc
import pytest
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from sqlalchemy.engine import make_url

from aryl_common import security
from aryl_common.channels import DESIRED_STATE_ADDRESS_KEY, DESIRED_STATE_PORT_KEY
from aryl_common.security import ClientSecurity
from arylctl import certs
from node_agent.config import UsersSection
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.config import SchedulerConfig
from scheduler_service.core.plan import LoanStep, Reason, ScaleJob, ServerAction, StartJob, WorkerPlacement
from scheduler_service.core.snapshot import ClusterSnapshot, DemandView, JobView, ServerView, WorkerView
from scheduler_service.lifecycle import JobState, Pool, ServerState
from simulator.model import TraceJob
from tests.helpers import scaled_timeout

# --------------------------------------------------------------------------------------------------
# Core values: snapshots for the policies

NOW = 100_000.0  # the time of every hand-built snapshot

# A loan has a start while the server is lent out (draining, loaned or being reclaimed).
_LENT = (ServerState.DRAINING, ServerState.LOANED, ServerState.RECLAIMING)


def training_server(sid: str, gpus: int = 4, **fields: Any) -> ServerView:
    """A training-pool server in TRAINING with GPUs ``0..gpus-1``; ``fields`` are ServerView's others
    (``unhealthy_gpus``, ``allocated``, ...)."""
    return ServerView(sid, Pool.TRAINING, ServerState.TRAINING, tuple(range(gpus)), **fields)


def inference_server(sid: str, state: ServerState = ServerState.SERVING, gpus: int = 8, *, since: float = 0.0,
                     loan_at: float | None = None, **fields: Any) -> ServerView:
    """An inference-pool server in ``state`` since ``since``. A lent server's loan began at ``loan_at``,
    by default when it entered its state."""
    if state in _LENT and loan_at is None:
        loan_at = since
    return ServerView(sid, Pool.INFERENCE, state, tuple(range(gpus)), state_since=since, loan_started_at=loan_at,
                      **fields)


def pending_job(jid: int, gpus: int = 1, workers: int = 1, max_workers: int | None = None, *,
                submitted: float = NOW - 10, runtime: float = 3600.0, priority: int = 0) -> JobView:
    """A queued job of ``workers`` (up to ``max_workers``) workers of ``gpus`` GPUs each, estimated to run
    ``runtime`` seconds."""
    return JobView(jid, JobState.PENDING, gpus, workers, max_workers or workers, priority, submitted,
                   estimated_runtime_s=runtime)


def running_job(jid: int, placement: list[tuple[str, tuple[int, ...]]], *, low: int, high: int | None = None,
                resized: float = 0.0, runtime: float = 3600.0, state: JobState = JobState.RUNNING) -> JobView:
    """A job running one worker per ``(server, gpu indices)`` of ``placement``, in rank order, between
    ``low`` and ``high`` workers; started (and last resized) at ``resized``."""
    return JobView(jid, state, len(placement[0][1]), low, high or low, 0, 0.0,
                   workers=tuple(WorkerView(rank, sid, g) for rank, (sid, g) in enumerate(placement)),
                   estimated_runtime_s=runtime, started_at=resized, last_resized_at=resized)


def first_fit_workers(free: dict[str, list[int]], gpus: int, count: int, least: int = 1
                      ) -> list[tuple[str, tuple[int, ...]]]:
    """Up to ``count`` workers of ``gpus`` GPUs each, first fit in server-id order over ``free`` (server ->
    its free GPU indices, ascending; what is placed is taken from it), as ``running_job``'s placement.
    Fewer than ``least`` fit: none (``free`` is left as it was)."""
    placement: list[tuple[str, tuple[int, ...]]] = []
    for _ in range(count):
        sid = next((s for s in sorted(free) if len(free[s]) >= gpus), None)
        if sid is None:
            break
        placement.append((sid, tuple(free[sid][:gpus])))
        free[sid] = free[sid][gpus:]
    if len(placement) < least:
        for sid, taken in placement:
            free[sid] = sorted(free[sid] + list(taken))
        return []
    return placement


def with_allocations(servers: Iterable[ServerView], jobs: Iterable[JobView]) -> tuple[ServerView, ...]:
    """The servers with the GPUs the jobs' workers hold marked allocated (besides any already marked),
    as the service's snapshot shows them."""
    held: dict[str, set[tuple[int, int]]] = {}
    for job in jobs:
        for w in job.workers:
            held.setdefault(w.server_id, set()).update((g, job.job_id) for g in w.gpu_indices)
    return tuple(
        dataclasses.replace(s, allocated=tuple(sorted(held[s.server_id].union(s.allocated))))
        if s.server_id in held else s
        for s in servers
    )


def snapshot_of(servers: Iterable[ServerView], jobs: Iterable[JobView], demand: int | None = None, *,
                now: float = NOW) -> ClusterSnapshot:
    """A snapshot at ``now`` (jobs' GPUs marked allocated); ``demand``: inference needs that many
    servers (None: no demand reported yet)."""
    jobs = tuple(jobs)
    return ClusterSnapshot(
        now=now, servers=with_allocations(servers, jobs), jobs=jobs,
        demand=None if demand is None else DemandView(demand, 10.0 * demand, now),
    )


# --------------------------------------------------------------------------------------------------
# Core values: plan actions for the appliers


def placed(*workers: tuple[str, tuple[int, ...]]) -> tuple[WorkerPlacement, ...]:
    """Workers in rank order: ``placed(("s1", (0,)), ("s2", (1,)))`` is rank 0 on s1 GPU 0, rank 1 on s2."""
    return tuple(WorkerPlacement(rank, server, gpus) for rank, (server, gpus) in enumerate(workers))


def placed_on(server_id: str, *gpu_groups: tuple[int, ...]) -> tuple[WorkerPlacement, ...]:
    """Workers in rank order, all on one server: one per group of GPU indices."""
    return placed(*((server_id, gpus) for gpus in gpu_groups))


def start(job_id: int, *workers: tuple[str, tuple[int, ...]]) -> StartJob:
    return StartJob(job_id, placed(*workers), Reason.PLACED, "test placement")


def scale(job_id: int, *workers: tuple[str, tuple[int, ...]], reason: Reason = Reason.SCALED_OUT) -> ScaleJob:
    return ScaleJob(job_id, placed(*workers), reason, f"to {len(workers)} worker(s)")


def step(server_id: str, kind: LoanStep, reason: Reason = Reason.LOAN_ACTIVE) -> ServerAction:
    return ServerAction(server_id, kind, reason, f"{kind.lower()} {server_id}")


# --------------------------------------------------------------------------------------------------
# Simulator input


def linear_job(job_id: int, submit: float, gpus_per_worker: int, min_workers: int, max_workers: int,
               work: float) -> TraceJob:
    """A job whose speed is exactly its worker count (1 unit/s per worker)."""
    points = tuple((w, float(w)) for w in range(min_workers, max_workers + 1))
    return TraceJob(job_id, f"job-{job_id}", submit, gpus_per_worker, min_workers, max_workers, work, points)


# --------------------------------------------------------------------------------------------------
# Time

T0 = 1_700_000_000.0  # ManualClock's wall time at its start


class ManualClock:
    """The Clock port, moved by hand: ``advance`` moves the wall and the monotonic clock together;
    ``jump_wall`` moves the wall clock alone (NTP, a VM resumed). ``time`` is the wall time."""

    def __init__(self, now: float = T0) -> None:
        self.time = now
        self._monotonic = 0.0

    def now(self) -> float:
        return self.time

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> float:
        """Returns the new wall time."""
        self.time += seconds
        self._monotonic += seconds
        return self.time

    def jump_wall(self, seconds: float) -> None:
        self.time += seconds


# --------------------------------------------------------------------------------------------------
# A scheduler over gRPC

POOLS = {"training": types_pb2.POOL_TRAINING, "inference": types_pb2.POOL_INFERENCE}


class TestPki:
    """The test session's development CA (``arylctl certs init``), made once on first use: the
    scheduler's certificate and token file, an admin token every test client presents (admins may do
    everything, so existing tests run authenticated without caring about owners), users alice and bob,
    router r1, and per-server agent certificates issued on demand (an agent's certificate must name its
    server id: the scheduler checks it when it reads the agent's worker logs)."""

    ADMIN = "test-admin"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="aryl-test-pki-"))
        atexit.register(shutil.rmtree, self.dir, True)
        self.tokens = certs.init(self.dir, certs.DevCluster(users=("alice", "bob"), admins=(self.ADMIN,),
                                                            routers=("r1",), agents=("gpu-1", "gpu-2")))
        self._issued: set[str] = set()

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def token(self, principal: str = f"admin:{ADMIN}") -> str:
        return self.tokens[principal]

    def agent_cert(self, server_id: str) -> tuple[str, str]:
        """A certificate naming ``server_id`` (and localhost, 127.0.0.1), issued once."""
        stem = f"agent-{server_id}"
        if server_id not in self._issued and not (self.dir / f"{stem}.crt").exists():
            certs.issue_from(self.dir, stem, server_id)
        self._issued.add(server_id)
        return self.path(f"{stem}.crt"), self.path(f"{stem}.key")


    def scheduler_cert(self, host: str) -> tuple[str, str]:
        """A scheduler certificate that also names ``host`` (a scheduler listening on an address other than
        loopback, e.g. a chaos test's network-namespace host address: clients verify the name), issued once."""
        stem = f"scheduler-{host}"
        if not (self.dir / f"{stem}.crt").exists():
            certs.issue_from(self.dir, stem, certs.SCHEDULER_CERT_NAME, (*certs.DevCluster().scheduler_names, host))
        return self.path(f"{stem}.crt"), self.path(f"{stem}.key")


_PKI: list[TestPki] = []


def pki() -> TestPki:
    if not _PKI:
        _PKI.append(TestPki())
    return _PKI[0]


def security_section(**extra: Any) -> dict[str, Any]:
    """The scheduler's ``security`` section for tests: TLS with the session's CA, its token file."""
    ca = pki()
    return dict(insecure=False, tls_cert=ca.path("scheduler.crt"), tls_key=ca.path("scheduler.key"),
                tls_client_ca=ca.path("ca.crt"), tokens_file=ca.path("tokens"), **extra)


def client_security(principal: str = f"admin:{TestPki.ADMIN}") -> ClientSecurity:
    """What a test client presents: the generic client certificate and ``principal``'s token."""
    ca = pki()
    return ClientSecurity(ca_file=ca.path("ca.crt"), cert_file=ca.path("client.crt"), key_file=ca.path("client.key"),
                          token=ca.token(principal))


def secure_channel(address: str, options: Any = None, *, principal: str = f"admin:{TestPki.ADMIN}") -> grpc.Channel:
    """A channel to a test scheduler as ``principal`` (an admin by default), over mutual TLS."""
    return security.secure_channel(address, client_security(principal), list(options or []))


def secure_aio_channel(address: str, options: Any = None, *,
                       principal: str = f"admin:{TestPki.ADMIN}") -> grpc.aio.Channel:
    return security.secure_aio_channel(address, client_security(principal), list(options or []))


def daemon_security(server_id: str = "") -> dict[str, Any]:
    """An agent's or router's TLS settings (``AgentSection``/``RouterSection`` fields): the admin's token,
    and a certificate naming ``server_id`` (an agent's, for its log service), else the generic one."""
    ca = pki()
    cert, key = ca.agent_cert(server_id) if server_id else (ca.path("client.crt"), ca.path("client.key"))
    token_file = ca.dir / f"token-{TestPki.ADMIN}"
    return dict(insecure=False, tls_ca=ca.path("ca.crt"), tls_cert=cert, tls_key=key, token_file=str(token_file))


def daemon_env(server_id: str = "", section: str = "AGENT") -> dict[str, str]:
    """``daemon_security`` as ``ARYL_<SECTION>__*`` environment variables, for a daemon's process. An
    agent's also opts in to ``[users] run_as = "agent"`` (``AGENT_RUNS_AS_ITSELF``)."""
    env = {f"ARYL_{section}__{key.upper()}": str(value) for key, value in daemon_security(server_id).items()}
    if section == "AGENT":
        env.update(AGENT_RUNS_AS_ITSELF)
    return env


# Tests run as root on CI, from checkouts a mapped uid cannot read (/root/...): their agents run workers as
# themselves, an explicit opt-in (a root agent's default maps owners to uids and refuses the unmapped;
# tests/agent/test_run_as_user.py covers that default).
AGENT_RUNS_AS_ITSELF = {"ARYL_USERS__RUN_AS": "agent"}
AS_ITSELF = UsersSection(run_as="agent")  # the same, for a Supervisor built in process


def security_env() -> dict[str, str]:
    """The environment a test session runs under, so that processes it starts (aryl-scheduler,
    aryl-agent, aryl-router, arylctl) run with TLS and tokens as by default: the scheduler's files,
    the daemons' (generic certificate), and arylctl's (the admin's token)."""
    ca = pki()
    env = {f"ARYL_SECURITY__{key.upper()}": str(value) for key, value in security_section().items()}
    for section in ("AGENT", "ROUTER"):
        env.update(daemon_env(section=section))
    env.update({"ARYL_TLS_CA": ca.path("ca.crt"), "ARYL_TLS_CERT": ca.path("client.crt"),
                "ARYL_TLS_KEY": ca.path("client.key"), "ARYL_TOKEN": ca.token()})
    return env


def scheduler_config(database_url: str, **sections: dict[str, Any]) -> SchedulerConfig:
    """A scheduler for tests: loopback on a port the OS picks, fast cycles and reports; ``sections``
    override keys section by section (``policy={"loan_idle_s": 0}``)."""
    # Sections by name, each a dict of its keys: typed as the ``**kwargs`` of SchedulerConfig take them.
    base: dict[str, Any] = {
        "server": {"listen": "127.0.0.1:0", "shutdown_grace_s": 0.5, "worker_threads": 8},
        "database": {"url": database_url, "auto_migrate": False},
        "scheduling": {"cycle_interval_s": 0.2},
        "agents": {"report_interval_s": 0.5, "telemetry_write_s": 0.2},
        "logging": {"level": "warning"},
        "security": security_section(),
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    host = str(base["server"]["listen"]).rsplit(":", 1)[0]
    if host in ("127.0.0.1", "localhost", "", "0.0.0.0") or "tls_cert" in sections.get("security", {}) \
            or base["security"].get("insecure"):
        return SchedulerConfig(**base)
    # Listening elsewhere (a chaos test's namespace host address): a certificate naming that address, since
    # clients verify it. The session's ARYL_SECURITY__* variables (conftest) outrank arguments, so they
    # name it while the settings are read.
    cert, key = pki().scheduler_cert(host)
    names = {"ARYL_SECURITY__TLS_CERT": cert, "ARYL_SECURITY__TLS_KEY": key}
    saved = {name: os.environ.get(name) for name in names}
    base["security"].update(tls_cert=cert, tls_key=key)
    os.environ.update(names)
    try:
        return SchedulerConfig(**base)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def register_fake_server(
    address: str, hostname: str, pool: str = "training", gpus: int = 4, *, inference_endpoint: str = "",
    logs_address: str = "", converge: bool = False,
) -> agent_pb2.RegisterServerResponse:
    """Register a server with ``gpus`` fake GPUs through the AgentService, as an agent would (serving
    worker logs at ``logs_address``, if given); with ``converge``, then report its desired generation
    as applied (as an agent that caught up does)."""
    with secure_channel(address) as channel:
        agent = agent_pb2_grpc.AgentServiceStub(channel)
        registered = agent.RegisterServer(
            agent_pb2.RegisterServerRequest(
                hostname=hostname,
                pool=POOLS[pool],
                gpus=[
                    agent_pb2.GpuInfo(index=i, uuid=f"GPU-{hostname}-{i}", model="Fake-GPU",
                                      memory_total_bytes=80 << 30)
                    for i in range(gpus)
                ],
                agent_address=hostname,
                agent_version="test",
                inference_endpoint=inference_endpoint,
                logs_address=logs_address,
            ),
            timeout=scaled_timeout(10),
        )
        if converge:
            agent.ReportStatus(agent_pb2.ReportStatusRequest(
                server_id=hostname, scheduler_epoch=registered.scheduler_epoch,
                observed_generation=registered.desired.generation), timeout=scaled_timeout(5))
        return registered


def job_spec(name: str = "job", *, user: str = "alice", gpus: int = 1, workers: int = 1, max_workers: int = 0,
             **fields: Any) -> types_pb2.JobSpec:
    return types_pb2.JobSpec(name=name, user=user, command=["python", "train.py"], gpus_per_worker=gpus,
                             min_workers=workers, max_workers=max_workers, **fields)


def scheduler_stub(address: str) -> tuple[grpc.Channel, scheduler_pb2_grpc.SchedulerServiceStub]:
    channel = secure_channel(address)
    return channel, scheduler_pb2_grpc.SchedulerServiceStub(channel)


def job_state(stub: scheduler_pb2_grpc.SchedulerServiceStub, job_id: str) -> int:
    return stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=scaled_timeout(5)).job.state


# --------------------------------------------------------------------------------------------------
# Reading what gRPC answers, typed (grpc's stubs leave these loose)


class HealthChecker(Protocol):
    """The one method of the gRPC health service's stub that tests call."""

    def Check(self, request: health_pb2.HealthCheckRequest,  # gRPC's method name
              timeout: float | None = None) -> health_pb2.HealthCheckResponse: ...


def health_stub(channel: grpc.Channel) -> HealthChecker:
    """``health_pb2_grpc.HealthStub(channel)``, typed: its stubs (types-grpcio-health-checking) declare the
    class without the methods it gets at run time."""
    return cast(HealthChecker, health_pb2_grpc.HealthStub(channel))


class ReflectionReader(Protocol):
    """The one method of the gRPC reflection service's stub: a stream of requests, a stream of answers."""

    def ServerReflectionInfo(self, requests: Iterator[reflection_pb2.ServerReflectionRequest],  # gRPC's name
                             timeout: float | None = None) -> Iterator[reflection_pb2.ServerReflectionResponse]: ...


def reflection_stub(channel: grpc.Channel) -> ReflectionReader:
    """``reflection_pb2_grpc.ServerReflectionStub(channel)``, typed: its stubs (types-grpcio-reflection) give
    the method the type ``binascii.Incomplete``, an exception class, by a wrong import."""
    return cast(ReflectionReader, reflection_pb2_grpc.ServerReflectionStub(channel))


def details_of(error: grpc.RpcError) -> str:
    """A refusal's details. grpc types them ``str | None``; every refusal of ours carries a text, so None
    means the premise of the test is wrong."""
    text = error.details()
    assert text is not None, f"{error.code()} without details"
    return text


def as_call(error: grpc.RpcError) -> grpc.Call:
    """The refusal a synchronous stub raised, as the ``grpc.Call`` it also is (``rpc_status.from_call``
    takes one): grpc types what it raises as a bare ``RpcError``."""
    assert isinstance(error, grpc.Call), type(error)
    return error


# --------------------------------------------------------------------------------------------------
# Agents


def desired_worker(
    command: list[str],
    *,
    job: str = "job-a",
    rank: int = 0,
    incarnation: int = 1,
    world_size: int = 1,
    gpus: tuple[int, ...] = (0,),
    grace_s: float = 0.0,
    env: dict[str, str] | None = None,
) -> agent_pb2.DesiredWorker:
    """A worker as the scheduler asks an agent to run it (rendezvous at 10.0.0.1:29400)."""
    worker = agent_pb2.DesiredWorker(
        job_id=job, rank=rank, world_size=world_size, local_rank=rank, gpu_indices=list(gpus), command=command,
        env=env or {}, master_addr="10.0.0.1", master_port=29400, incarnation=incarnation,
    )
    if grace_s:
        worker.grace_period.FromMilliseconds(int(grace_s * 1000))
    return worker


def desired_state(generation: int, *workers: agent_pb2.DesiredWorker, epoch: int = 1,
                  server_id: str = "w-node") -> agent_pb2.DesiredState:
    """What one server should run, as the scheduler of term ``epoch`` pushes it."""
    return agent_pb2.DesiredState(server_id=server_id, scheduler_epoch=epoch, generation=generation, workers=workers)


class FakeAgentService(agent_pb2_grpc.AgentServiceServicer):
    """Records what the agent sends; the test pushes desired states through ``push``. ``desired_state_port``:
    the port RegisterServer names as its desired-state streams' own process's (0: none); ``desired_state_address``:
    the host:port it names as another replica's ('': none)."""

    def __init__(self, epoch: int, desired_state_port: int = 0, desired_state_address: str = "") -> None:
        self.epoch = epoch
        self.desired_state_port = desired_state_port
        self.desired_state_address = desired_state_address
        self.registrations: list[agent_pb2.RegisterServerRequest] = []
        self.reports: list[agent_pb2.ReportStatusRequest] = []
        self.streams_opened = 0
        self._pushed: Queue[agent_pb2.DesiredState] = Queue()

    def push(self, state: agent_pb2.DesiredState) -> None:
        self._pushed.put(state)

    def RegisterServer(self, request, context):  # gRPC's method names
        self.registrations.append(request)
        metadata = [(DESIRED_STATE_PORT_KEY, str(self.desired_state_port))] if self.desired_state_port else []
        if self.desired_state_address:
            metadata.append((DESIRED_STATE_ADDRESS_KEY, self.desired_state_address))
        if metadata:
            context.send_initial_metadata(tuple(metadata))
        response = agent_pb2.RegisterServerResponse(server_id=request.hostname, scheduler_epoch=self.epoch)
        response.report_interval.FromMilliseconds(50)
        return response

    def ReportStatus(self, request, context):
        self.reports.append(request)
        return agent_pb2.ReportStatusResponse(desired_generation=request.observed_generation)

    def WatchDesiredState(self, request, context):
        self.streams_opened += 1
        while context.is_active():
            try:
                yield self._pushed.get(timeout=0.05)
            except Empty:
                continue


class FakeScheduler:
    """A ``FakeAgentService`` (scheduler term ``epoch``) served on 127.0.0.1:``port`` (0: any free port), naming
    ``desired_state_port`` to agents as its desired-state streams' own process's port (0: none) and
    ``desired_state_address`` as another replica's ('': none)."""

    def __init__(self, epoch: int, port: int = 0, *, desired_state_port: int = 0,
                 desired_state_address: str = "") -> None:
        self.service = FakeAgentService(epoch, desired_state_port, desired_state_address)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        agent_pb2_grpc.add_AgentServiceServicer_to_server(self.service, self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port, f"cannot listen on port {port}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=0).wait()


# --------------------------------------------------------------------------------------------------
# Databases

DEFAULT_PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def postgres_admin_url() -> str:
    return os.environ.get("ARYL_TEST_DATABASE_URL", DEFAULT_PG_URL)


def postgres_unavailable(reason: str) -> None:
    """Skip the test; under CI=true, fail it (CI must run the PostgreSQL tests)."""
    if IN_CI:
        pytest.fail(f"PostgreSQL is required under CI=true but unreachable: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unreachable ({reason}); set ARYL_TEST_DATABASE_URL")


@contextmanager
def scratch_postgres(prefix: str) -> Iterator[str]:
    """Create an empty PostgreSQL database named ``<prefix>_<random>`` next to the admin URL's
    database; yield its URL; drop it afterwards. Skips (fails under CI=true) when unreachable."""
    admin_url = make_url(postgres_admin_url())
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        postgres_unavailable(str(exc.orig).strip().splitlines()[0])
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
