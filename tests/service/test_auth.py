"""Identities, roles and mutual TLS on every RPC (docs/security.md), over real TLS sockets.

The test session's development CA (``tests.harness.TestPki``) is used; a scheduler runs with TLS and
tokens on a SQLite database (the audit test also on PostgreSQL). Each attack of issue 18's "Why"
that identities answer is a test here: another user's job cancelled or read, user-field spoofing, a
priority above the ceiling, a rogue registration under another server's name, a status report or
desired-state watch for a server that is not the caller's, demand from a non-router.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from grpc_health.v1 import health_pb2

from aryl_common.entry import BadInput
from aryl_common.security import ClientSecurity, Principal, hash_token, load_tokens, lookup_token, secure_channel
from arylctl import certs
from migrations import upgrade
from node_agent.config import AgentSection
from node_agent.logs import serve_worker_logs
from node_agent.workers import WorkDir
from protos.aryl.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
from scheduler_service.api.auth import METHOD_ROLES
from scheduler_service.config import SchedulerConfig
from scheduler_service.server import SchedulerService, ServerHandle, serve_in_background
from tests.harness import daemon_security, details_of, health_stub, job_spec, pki, scheduler_config, security_env

SERVICES = {
    "SchedulerService": (scheduler_pb2, scheduler_pb2_grpc.SchedulerServiceStub),
    "AgentService": (agent_pb2, agent_pb2_grpc.AgentServiceStub),
    "InferenceService": (inference_pb2, inference_pb2_grpc.InferenceServiceStub),
}


@pytest.fixture(scope="module")
def ca() -> tuple[Path, dict[str, str]]:
    """The test session's development CA (``tests.harness.TestPki``: users alice and bob, admin
    test-admin, agents gpu-1 and gpu-2, router r1), which the scheduler's settings in the session's
    environment name (environment variables take precedence over a config's values)."""
    return pki().dir, pki().tokens


def security_section(directory: Path, **extra: Any) -> dict[str, Any]:
    return dict(insecure=False, tls_cert=str(directory / "scheduler.crt"), tls_key=str(directory / "scheduler.key"),
                tls_client_ca=str(directory / "ca.crt"), tokens_file=str(directory / "tokens"), **extra)


def start_secure(url: str, directory: Path, **sections: dict[str, Any]) -> ServerHandle:
    return serve_in_background(scheduler_config(url, security=security_section(directory), **sections))


@pytest.fixture(scope="module")
def secure(ca: tuple[Path, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    url = f"sqlite:///{tmp_path_factory.mktemp('authdb') / 'aryl.db'}"
    upgrade(url)
    handle = start_secure(url, ca[0])
    yield handle
    handle.stop()


class Client:
    """Stubs of the three services as one principal, over mutual TLS with the certificate ``cert``."""

    def __init__(self, address: str, directory: Path, token: str, cert: str = "client") -> None:
        security = ClientSecurity(ca_file=str(directory / "ca.crt"), cert_file=str(directory / f"{cert}.crt"),
                                  key_file=str(directory / f"{cert}.key"), token=token)
        self.channel = secure_channel(address, security, [])
        self.scheduler = scheduler_pb2_grpc.SchedulerServiceStub(self.channel)
        self.agent = agent_pb2_grpc.AgentServiceStub(self.channel)
        self.inference = inference_pb2_grpc.InferenceServiceStub(self.channel)

    def stub(self, service: str) -> Any:
        return {"SchedulerService": self.scheduler, "AgentService": self.agent,
                "InferenceService": self.inference}[service]


@pytest.fixture(scope="module")
def as_(secure: ServerHandle, ca: tuple[Path, dict[str, str]]) -> Any:
    """``as_("user:alice")``: a Client of that principal (agents and routers with their own certificate)."""
    directory, tokens = ca
    made: dict[tuple[str, str], Client] = {}

    def client(principal: str, *, cert: str | None = None, token: str | None = None) -> Client:
        role, name = principal.split(":")
        cert = cert or {"agent": f"agent-{name}", "router": f"router-{name}"}.get(role, "client")
        key = (principal, cert + (token or ""))
        if key not in made:
            made[key] = Client(secure.address, directory, tokens[principal] if token is None else token, cert)
        return made[key]

    yield client
    for c in made.values():
        c.channel.close()


def refused(call: Any, request: Any, **kw: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(request, timeout=10, **kw)
        if hasattr(result, "__iter__") and not hasattr(result, "ListFields"):
            next(iter(result))
    return info.value


def method_names() -> list[tuple[str, str]]:
    return [(service, method.name) for service, (module, _) in SERVICES.items()
            for method in module.DESCRIPTOR.services_by_name[service].methods]


def request_of(service: str, method: str) -> Any:
    module = SERVICES[service][0]
    descriptor = module.DESCRIPTOR.services_by_name[service].methods_by_name[method]
    return getattr(module, descriptor.input_type.name)()


def registration(hostname: str, gpus: int = 2) -> agent_pb2.RegisterServerRequest:
    return agent_pb2.RegisterServerRequest(
        hostname=hostname, pool=types_pb2.POOL_TRAINING, agent_address=hostname, agent_version="test",
        gpus=[agent_pb2.GpuInfo(index=i, uuid=f"GPU-{hostname}-{i}", model="Fake", memory_total_bytes=1 << 30)
              for i in range(gpus)])


def test_a_token_is_found_by_its_digest_among_a_fleets_and_nothing_else_matches(tmp_path: Path) -> None:
    """``lookup_token`` over a token file with a token per agent (as ``arylctl certs init`` writes one): each
    token gives its own principal, whether the file lists it hashed or in the clear; an unknown token, the
    empty one, a listed token's digest presented as the token, and a token differing in one character give
    None."""
    lines = [f"agent gpu-{i} sha256:{hash_token(f'secret-{i}')}" for i in range(1000)]
    lines.append("user alice alice-plain-token")
    path = tmp_path / "tokens"
    path.write_text("\n".join(lines) + "\n")
    tokens = load_tokens(path)
    assert len(tokens) == 1001
    for i in (0, 1, 499, 999):
        assert lookup_token(tokens, f"secret-{i}") == Principal("agent", f"gpu-{i}")
    assert lookup_token(tokens, "alice-plain-token") == Principal("user", "alice")
    for wrong in ("secret-1000", "", hash_token("secret-7"), "secret-7 ", "Secret-7", "alice-plain-tokeN"):
        assert lookup_token(tokens, wrong) is None, wrong


# ---------------------------------------------------------------------------------------------
# Every RPC: decided, refused without credentials, refused to the wrong role


def test_every_rpc_has_its_roles_decided() -> None:
    """A new RPC must be given its roles (until then only admins may call it)."""
    assert {f"/aryl.v1.{s}/{m}" for s, m in method_names()} - set(METHOD_ROLES) == set()


@pytest.mark.parametrize(("service", "method"), method_names())
def test_every_rpc_without_credentials_is_unauthenticated(secure: ServerHandle, ca: Any, service: str,
                                                          method: str) -> None:
    anonymous = Client(secure.address, ca[0], token="")
    bad = Client(secure.address, ca[0], token="aryl_not-a-token")
    try:
        for client, says in ((anonymous, "no credentials"), (bad, "unknown or malformed bearer token")):
            error = refused(getattr(client.stub(service), method), request_of(service, method))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (method, error.details())
            assert says in details_of(error) and "ARYL_TOKEN" in details_of(error)
    finally:
        anonymous.channel.close()
        bad.channel.close()


WRONG_ROLE = {"user": "agent:gpu-1", "admin": "user:alice", "agent": "user:alice", "router": "user:alice"}


@pytest.mark.parametrize(("service", "method"), method_names())
def test_every_rpc_refuses_a_role_it_does_not_allow(as_: Any, service: str, method: str) -> None:
    roles = METHOD_ROLES[f"/aryl.v1.{service}/{method}"]
    wrong = next(p for p in ("agent:gpu-1", "router:r1", "user:alice") if p.split(":")[0] not in roles)
    error = refused(getattr(as_(wrong).stub(service), method), request_of(service, method))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (method, wrong, error.details())
    assert f"{method} needs role" in details_of(error) and f"you are {wrong}" in details_of(error)


def test_health_stays_open_without_a_token_but_not_without_tls(secure: ServerHandle, ca: Any) -> None:
    anonymous = Client(secure.address, ca[0], token="")
    try:
        health = health_stub(anonymous.channel)
        answer = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        anonymous.channel.close()
    with grpc.insecure_channel(secure.address) as plain:
        with pytest.raises(grpc.RpcError) as info:
            health_stub(plain).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


# ---------------------------------------------------------------------------------------------
# Mutual TLS


def test_the_handshake_needs_a_client_certificate_from_the_cluster_ca(secure: ServerHandle, ca: Any,
                                                                      tmp_path: Path) -> None:
    directory, tokens = ca
    no_cert = ClientSecurity(ca_file=str(directory / "ca.crt"), token=tokens["admin:test-admin"])
    other = tmp_path / "other"
    certs.init(other, certs.DevCluster())
    foreign = ClientSecurity(ca_file=str(directory / "ca.crt"), cert_file=str(other / "client.crt"),
                             key_file=str(other / "client.key"), token=tokens["admin:test-admin"])
    for security in (no_cert, foreign):
        with secure_channel(secure.address, security, []) as channel:
            error = refused(scheduler_pb2_grpc.SchedulerServiceStub(channel).GetCluster,
                            scheduler_pb2.GetClusterRequest())
            assert error.code() == grpc.StatusCode.UNAVAILABLE


def test_a_scheduler_asked_for_tls_without_its_files_refuses_to_start(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ARYL_SECURITY__")]:
        monkeypatch.delenv(key)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with pytest.raises(BadInput, match=r"security\.tls_cert, security\.tls_key.*arylctl certs init.*--insecure"):
        SchedulerService(SchedulerConfig(database={"url": url}))  # secure by default, and no files given


# ---------------------------------------------------------------------------------------------
# Users: the owner is the caller; another user's job is out of reach


@pytest.fixture
def alices_job(as_: Any) -> types_pb2.Job:
    spec = job_spec("secret", user="", gpus=1, env={"HF_TOKEN": "hf_secret", "WANDB_API_KEY": "wandb_secret"})
    return as_("user:alice").scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec), timeout=10).job


def test_the_owner_is_the_authenticated_caller(alices_job: types_pb2.Job) -> None:
    assert alices_job.spec.user == "alice"
    assert alices_job.spec.env["HF_TOKEN"] == "hf_secret"  # the owner sees her own environment


def test_another_users_job_cannot_be_read_cancelled_explained_watched_or_logged(
    as_: Any, alices_job: types_pb2.Job
) -> None:
    bob = as_("user:bob").scheduler
    job_id = alices_job.job_id
    calls = [
        (bob.GetJob, scheduler_pb2.GetJobRequest(job_id=job_id)),
        (bob.CancelJob, scheduler_pb2.CancelJobRequest(job_id=job_id)),
        (bob.ExplainJob, scheduler_pb2.ExplainJobRequest(job_id=job_id)),
        (bob.GetJobLogs, scheduler_pb2.GetJobLogsRequest(job_id=job_id)),
        (bob.WatchEvents, scheduler_pb2.WatchEventsRequest(job_id=job_id, after_event_id=0)),
        (bob.CancelJobArray, scheduler_pb2.CancelJobArrayRequest(array_job_id=job_id)),
    ]
    for call, request in calls:
        error = refused(call, request)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED, (call, error.details())
        assert "belongs to another user" in details_of(error) and "user:bob" in details_of(error)
    alice = as_("user:alice").scheduler
    assert alice.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=10).job.state == types_pb2.JOB_STATE_PENDING
    # An admin may do everything: here, read it with its environment.
    admin = as_("admin:test-admin").scheduler
    assert admin.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id), timeout=10).job.spec.env["HF_TOKEN"] == "hf_secret"


def test_list_views_carry_no_environment(as_: Any, alices_job: types_pb2.Job) -> None:
    jobs = as_("user:bob").scheduler.ListJobs(scheduler_pb2.ListJobsRequest(), timeout=10).jobs
    listed = [j for j in jobs if j.job_id == alices_job.job_id]
    assert listed and not listed[0].spec.env
    assert b"hf_secret" not in b"".join(j.SerializeToString() for j in jobs)


def test_the_user_field_cannot_name_someone_else(as_: Any) -> None:
    spoof = job_spec("spoof", user="bob")
    error = refused(as_("user:alice").scheduler.SubmitJob, scheduler_pb2.SubmitJobRequest(spec=spoof))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "spec.user 'bob' is not you (user:alice)" in details_of(error)
    batch = scheduler_pb2.SubmitJobsRequest(jobs=[scheduler_pb2.SubmitJobRequest(spec=job_spec("a", user="")),
                                                  scheduler_pb2.SubmitJobRequest(spec=spoof)])
    error = refused(as_("user:alice").scheduler.SubmitJobs, batch)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "jobs[1].spec.user" in details_of(error)
    # Naming oneself is fine; an admin submits on a user's behalf.
    mine = as_("user:alice").scheduler.SubmitJob(
        scheduler_pb2.SubmitJobRequest(spec=job_spec("mine", user="alice")), timeout=10).job
    assert mine.spec.user == "alice"
    theirs = as_("admin:test-admin").scheduler.SubmitJob(
        scheduler_pb2.SubmitJobRequest(spec=job_spec("for-bob", user="bob")), timeout=10).job
    assert theirs.spec.user == "bob"


def test_a_priority_above_the_ceiling_needs_an_admin(as_: Any) -> None:
    high = job_spec("high", user="", priority=101)
    error = refused(as_("user:alice").scheduler.SubmitJob, scheduler_pb2.SubmitJobRequest(spec=high))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "priority 101 is above 100 (security.max_user_priority)" in details_of(error)
    at_ceiling = job_spec("at", user="", priority=100)
    assert as_("user:alice").scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=at_ceiling), timeout=10)
    assert as_("admin:test-admin").scheduler.SubmitJob(
        scheduler_pb2.SubmitJobRequest(spec=job_spec("urgent", user="", priority=100_000)), timeout=10
    ).job.spec.priority == 100_000


# ---------------------------------------------------------------------------------------------
# Agents: only for their own server, certificate and token agreeing


def test_a_rogue_agent_cannot_register_report_or_watch_for_another_server(as_: Any) -> None:
    gpu1 = as_("agent:gpu-1").agent
    registered = gpu1.RegisterServer(registration("gpu-1"), timeout=10)
    assert registered.server_id == "gpu-1"
    for call, request in (
        (gpu1.RegisterServer, registration("gpu-2", gpus=8)),  # a fake 8-GPU server under another name
        (gpu1.ReportStatus, agent_pb2.ReportStatusRequest(server_id="gpu-2", scheduler_epoch=1)),
        (gpu1.WatchDesiredState, agent_pb2.WatchDesiredStateRequest(server_id="gpu-2")),
        (gpu1.Deregister, agent_pb2.DeregisterRequest(server_id="gpu-2")),
    ):
        error = refused(call, request)
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "agent 'gpu-1' may only act for its own server, not 'gpu-2'" in details_of(error)


def test_an_agent_token_with_another_servers_certificate_is_refused(as_: Any, ca: Any) -> None:
    # gpu-2's token presented over gpu-1's certificate: the certificate does not name gpu-2.
    stolen = as_("agent:gpu-2", cert="agent-gpu-1").agent
    error = refused(stolen.RegisterServer, registration("gpu-2"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "certificate does not name server 'gpu-2'" in details_of(error)
    # ... and with the generic client certificate neither.
    error = refused(as_("agent:gpu-2", cert="client").agent.RegisterServer, registration("gpu-2"))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_status_report_from_another_agent_cannot_end_a_job(as_: Any) -> None:
    gpu2 = as_("agent:gpu-2").agent
    epoch = gpu2.RegisterServer(registration("gpu-2"), timeout=10).scheduler_epoch
    report = agent_pb2.ReportStatusRequest(server_id="gpu-2", scheduler_epoch=epoch, workers=[
        agent_pb2.WorkerStatus(job_id="1", rank=0, phase=agent_pb2.WORKER_PHASE_EXITED, exit_code=0)])
    error = refused(as_("agent:gpu-1").agent.ReportStatus, report)
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED


# ---------------------------------------------------------------------------------------------
# Routers: demand and drain acknowledgements from routers only, under their own id


def test_demand_comes_from_routers_under_their_own_id(as_: Any) -> None:
    error = refused(as_("user:alice").inference.ReportDemand, inference_pb2.ReportDemandRequest(servers_needed=100000))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "needs role admin or router" in details_of(error)
    answer = as_("router:r1").inference.ReportDemand(
        inference_pb2.ReportDemandRequest(servers_needed=0, source="someone-else"), timeout=10)
    assert answer.demand.source == "r1"  # the certificate's router id, not the request's field


# ---------------------------------------------------------------------------------------------
# Audit: who did it, in the event log


def test_each_users_and_admins_action_names_its_actor(ca: Any, database_url: str) -> None:
    directory, tokens = ca
    handle = start_secure(database_url, directory)
    try:
        alice = Client(handle.address, directory, tokens["user:alice"])
        admin = Client(handle.address, directory, tokens["admin:test-admin"])
        job = alice.scheduler.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("a", user="")), timeout=10).job
        for_bob = admin.scheduler.SubmitJob(
            scheduler_pb2.SubmitJobRequest(spec=job_spec("b", user="bob")), timeout=10).job
        alice.scheduler.CancelJob(scheduler_pb2.CancelJobRequest(job_id=job.job_id, reason="mine"), timeout=10)
        Client(handle.address, directory, tokens["agent:gpu-1"], "agent-gpu-1").agent.RegisterServer(
            registration("gpu-1"), timeout=10)
        admin.scheduler.CordonServer(scheduler_pb2.CordonServerRequest(server_id="gpu-1", reason="audit"), timeout=10)
        for c in (alice, admin):
            c.channel.close()
    finally:
        handle.stop()
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT kind, job_id, server_id, actor FROM events ORDER BY id")).all()
    engine.dispose()
    actors = {(kind, str(job_id) if job_id else server_id): actor for kind, job_id, server_id, actor in rows}
    assert actors[("JOB_SUBMITTED", job.job_id)] == "user:alice"
    assert actors[("JOB_SUBMITTED", for_bob.job_id)] == "admin:test-admin"
    assert actors[("JOB_STATE_CHANGED", job.job_id)] == "user:alice"  # the cancel
    assert actors[("SERVER_ADMIN_CHANGED", "gpu-1")] == "admin:test-admin"
    assert actors[("SCHEDULER_STARTED", None)] == ""  # the scheduler's own


# ---------------------------------------------------------------------------------------------
# Files: the token file, arylctl login and certs init


def test_the_token_file_holds_hashes_and_bad_lines_are_named(ca: Any, tmp_path: Path) -> None:
    directory, tokens = ca
    text = (directory / "tokens").read_text()
    assert all(token not in text for token in tokens.values())
    assert {str(p) for p in load_tokens(directory / "tokens").values()} == set(tokens)
    bad = tmp_path / "tokens"
    bad.write_text("user alice sha256:abc\n")
    with pytest.raises(BadInput, match=r"tokens:1: sha256: must be followed by 64"):
        load_tokens(bad)
    bad.write_text("superuser eve tok\n")
    with pytest.raises(BadInput, match=r"tokens:1: expected 'ROLE NAME sha256:HEX'"):
        load_tokens(bad)


def test_certs_init_and_login_keep_secrets_private(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    run = [sys.executable, "-m", "arylctl.cli"]
    made = subprocess.run([*run, "certs", "init", str(tmp_path / "ca"), "--agent", "n1", "--router", "r"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    for name in ("ca.key", "scheduler.key", "client.key", "agent-n1.key", "router-r.key", "tokens", "token-n1"):
        assert stat.S_IMODE((tmp_path / "ca" / name).stat().st_mode) == 0o600, name
    token = (tmp_path / "ca" / "token-alice").read_text()
    login = subprocess.run([*run, "login"], input=token, env=env, capture_output=True, text=True, timeout=60,
                           check=False)
    assert login.returncode == 0, login.stderr
    stored = tmp_path / "config" / "aryl" / "token"
    assert stored.read_text() == token and stat.S_IMODE(stored.stat().st_mode) == 0o600
    security = ClientSecurity.from_env({"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert security.token == token.strip()


# ---------------------------------------------------------------------------------------------
# The agent's worker-log service: only the scheduler reads logs there


def test_an_agents_log_service_lets_only_the_scheduler_in(tmp_path: Path) -> None:
    ca = pki()
    layout = WorkDir(tmp_path / "agent", tmp_path / "checkpoints")
    server, port = serve_worker_logs(layout, "gpu-1", "127.0.0.1", 0, tls=AgentSection(**daemon_security("gpu-1")))
    request = agent_pb2.ReadWorkerLogRequest(job_id="7", rank=0)
    options: list[tuple[str, str | int]] = [("grpc.ssl_target_name_override", "gpu-1")]

    def read(cert: str) -> grpc.RpcError:
        security = ClientSecurity(ca_file=ca.path("ca.crt"), cert_file=ca.path(f"{cert}.crt"),
                                  key_file=ca.path(f"{cert}.key"))
        with secure_channel(f"127.0.0.1:{port}", security, options) as channel:
            return refused(agent_pb2_grpc.WorkerLogServiceStub(channel).ReadWorkerLog, request)

    try:
        # Another user, or another agent, with a certificate from the cluster's CA: refused.
        for cert in ("client", "agent-gpu-2"):
            error = read(cert)
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "only the scheduler" in details_of(error)
        # The scheduler's certificate gets in (this log does not exist: NOT_FOUND from the service itself).
        assert read("scheduler").code() == grpc.StatusCode.NOT_FOUND
        with grpc.insecure_channel(f"127.0.0.1:{port}") as plain:
            error = refused(agent_pb2_grpc.WorkerLogServiceStub(plain).ReadWorkerLog, request)
            assert error.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(None)


def test_arylctl_says_what_is_missing_for_tls_and_tokens(secure: ServerHandle) -> None:
    """Without the CA and client certificate the handshake fails, and without a token the scheduler says
    UNAUTHENTICATED; arylctl names the variables or command that fix each."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    run = [sys.executable, "-m", "arylctl.cli", "--server", secure.address, "--timeout", "5", "servers"]
    no_tls = subprocess.run(run, env={**env, "XDG_CONFIG_HOME": "/nonexistent"}, capture_output=True, text=True,
                            timeout=60, check=False)
    assert no_tls.returncode == 3 and "export ARYL_TLS_CA, ARYL_TLS_CERT and ARYL_TLS_KEY" in no_tls.stderr
    tls_only = {key: value for key, value in security_env().items() if key.startswith("ARYL_TLS_")}
    no_token = subprocess.run(run, env={**env, **tls_only, "XDG_CONFIG_HOME": "/nonexistent"}, capture_output=True,
                              text=True, timeout=60, check=False)
    assert "UNAUTHENTICATED" in no_token.stderr and "arylctl login" in no_token.stderr, no_token.stderr
