"""Agents' requests checked: a server's registration (its GPUs, addresses and inference endpoint, and
where that endpoint may point) and its status reports (GPU samples and workers); every refusal names
the field and the reason.

Validation runs before anything touches the database, so a rejected request changes nothing. What this
module must never do: read or write state, or check a report against what the server registered (the
store does, under the server's lock).
"""

from __future__ import annotations

import fnmatch
import ipaddress
import math
import re
import urllib.parse
from collections.abc import Sequence

from aryl_common.channels import MAX_WORKERS_PER_SERVER
from protos.aryl.v1 import agent_pb2
from scheduler_service.api.validation import NAME_MAX, byte_count, duration, finite, job_id, pool, server_id, text
from scheduler_service.errors import InvalidArgument, PermissionDenied
from scheduler_service.records import GpuReport, GpuSample, ServerRegistration, StatusReport, WorkerReport

# A registration's inventory; a status report has at most one sample per GPU. Also the most
# workers a server's desired state can carry, which sizes the agents' receive limit.
MAX_GPUS_PER_SERVER = MAX_WORKERS_PER_SERVER


def registration(req: agent_pb2.RegisterServerRequest) -> ServerRegistration:
    hostname = server_id("hostname", req.hostname)
    server_pool = pool("pool", req.pool, required=True)
    assert server_pool is not None
    if len(req.gpus) > MAX_GPUS_PER_SERVER:
        raise InvalidArgument("gpus", f"at most {MAX_GPUS_PER_SERVER} GPUs per server")
    indices: set[int] = set()
    uuids: set[str] = set()
    gpus = []
    for i, g in enumerate(req.gpus):
        if g.index >= MAX_GPUS_PER_SERVER:
            raise InvalidArgument(f"gpus[{i}].index", f"must be below {MAX_GPUS_PER_SERVER} (got {g.index})")
        if g.index in indices:
            raise InvalidArgument(f"gpus[{i}].index", f"GPU index {g.index} is listed twice")
        uuid = text(f"gpus[{i}].uuid", g.uuid, max_len=128, required=True)
        if uuid in uuids:
            raise InvalidArgument(f"gpus[{i}].uuid", f"GPU UUID {uuid} is listed twice")
        indices.add(g.index)
        uuids.add(uuid)
        gpus.append(GpuReport(g.index, uuid, text(f"gpus[{i}].model", g.model, max_len=128),
                              byte_count(f"gpus[{i}].memory_total_bytes", g.memory_total_bytes)))
    return ServerRegistration(
        hostname=hostname, pool=server_pool, gpus=tuple(gpus),
        agent_address=text("agent_address", req.agent_address, max_len=NAME_MAX) or hostname,
        agent_version=text("agent_version", req.agent_version, max_len=64),
        logs_address=text("logs_address", req.logs_address, max_len=NAME_MAX, pattern=_HOST_PORT,
                          hint="expected host:port"),
        inference_endpoint=text("inference_endpoint", req.inference_endpoint, max_len=512, pattern=_HTTP_URL,
                                hint="expected an http(s):// URL"),
    )


_HOST_PORT = re.compile(r"[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5}")
_HTTP_URL = re.compile(r"https?://[^\s]+")
_PHASES = {
    agent_pb2.WORKER_PHASE_STARTING: "STARTING",
    agent_pb2.WORKER_PHASE_RUNNING: "RUNNING",
    agent_pb2.WORKER_PHASE_STOPPING: "STOPPING",
    agent_pb2.WORKER_PHASE_EXITED: "EXITED",
}
MAX_WORKERS_PER_REPORT = 4096


def worker_report(field: str, w: agent_pb2.WorkerStatus) -> WorkerReport:
    if w.phase not in _PHASES:
        raise InvalidArgument(f"{field}.phase", f"must be STARTING, RUNNING, STOPPING or EXITED (got {w.phase})")
    return WorkerReport(
        job_id=job_id(f"{field}.job_id", w.job_id), rank=w.rank, incarnation=w.incarnation,
        phase=_PHASES[w.phase], exit_code=w.exit_code,
        progress=finite(f"{field}.progress", w.progress),
        samples_per_second=finite(f"{field}.samples_per_second", w.samples_per_second),
        checkpoint_progress=finite(f"{field}.checkpoint_progress", w.checkpoint_progress),
        # Free text from a worker's environment: bounded, control characters replaced, never refused.
        message="".join(c if c.isprintable() else " " for c in w.message[:512]),
        stop_requested=w.stop_requested, cannot_start=w.cannot_start,
        step_time_s=finite(f"{field}.step_time_s", w.step_time_s),
        pass_time_s=finite(f"{field}.pass_time_s", w.pass_time_s),
        local_batch_size=w.local_batch_size, accum_steps=w.accum_steps,
        grad_sqr=finite(f"{field}.grad_sqr", w.grad_sqr), grad_var=finite(f"{field}.grad_var", w.grad_var),
        samples=finite(f"{field}.samples", w.samples),
        checkpoint_acked=w.checkpoint_acked,
        ack_checkpoint_progress=finite(f"{field}.ack_checkpoint_progress", w.ack_checkpoint_progress),
        ack_checkpoint_age_s=duration(f"{field}.ack_checkpoint_age", w.ack_checkpoint_age),
        stop_acknowledged=w.stop_acknowledged,
    )


def status_report(req: agent_pb2.ReportStatusRequest) -> StatusReport:
    # At most one sample per GPU, checked before anything else looks at the samples: the store
    # writes each changed one (an UPDATE and an event) with the server's row locked, so 100,000
    # samples in a 200 KB report would hold that lock for minutes. (The store checks the samples
    # against the server's registered GPUs.)
    if len(req.gpus) > MAX_GPUS_PER_SERVER:
        raise InvalidArgument(
            "gpus", f"at most one sample per GPU, and a server has at most {MAX_GPUS_PER_SERVER} (got {len(req.gpus)})"
        )
    samples = []
    indices: set[int] = set()
    for i, g in enumerate(req.gpus):
        if g.index in indices:
            raise InvalidArgument(f"gpus[{i}].index", f"GPU {g.index} is reported twice; one sample per GPU")
        indices.add(g.index)
        if not (math.isfinite(g.utilization) and math.isfinite(g.temperature_c)):
            raise InvalidArgument(f"gpus[{i}]", "utilization and temperature must be finite numbers")
        samples.append(
            GpuSample(g.index, min(max(g.utilization, 0.0), 1.0),
                      byte_count(f"gpus[{i}].memory_used_bytes", g.memory_used_bytes), g.temperature_c, g.healthy,
                      text(f"gpus[{i}].health_reason", g.health_reason, max_len=256))
        )
    if len(req.workers) > MAX_WORKERS_PER_REPORT:
        raise InvalidArgument("workers", f"at most {MAX_WORKERS_PER_REPORT} workers per report")
    workers = tuple(worker_report(f"workers[{i}]", w) for i, w in enumerate(req.workers))
    return StatusReport(server_id("server_id", req.server_id), req.scheduler_epoch, tuple(samples),
                        req.observed_generation, workers)


def peer_host(peer: str) -> str:
    """The IP address of a gRPC peer string (``ipv4:10.0.0.7:5000``, ``ipv6:[::1]:5000``); "" if none."""
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rsplit(":", 1)[0]
    if kind == "ipv6":
        return rest.rsplit(":", 1)[0].strip("[]")
    return ""


def allowed_endpoint(registration: ServerRegistration, allow: Sequence[str], peer: str = "") -> None:
    """PermissionDenied unless the registration's inference endpoint (if any) points where
    ``[inference] endpoint_allow`` allows: its host an IP address in one of the CIDRs or a name matching
    one of the patterns (names are not resolved); with no patterns, only the registering agent's own:
    its address, its hostname, or the IP address it connects from (``peer``, ``peer_host``). A router
    forwards users' requests there, so nobody may point it elsewhere."""
    endpoint = registration.inference_endpoint
    if not endpoint:
        return
    host = (urllib.parse.urlsplit(endpoint).hostname or "").lower()
    if not allow:
        own = {registration.agent_address.lower(), registration.hostname.lower(), peer_host(peer).lower()} - {""}
        if host in own:
            return
        raise PermissionDenied(
            f"inference_endpoint {endpoint!r}: host {host!r} is not this server's own address "
            f"({', '.join(sorted(own))}); an operator allows other hosts with inference.endpoint_allow"
        )
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for pattern in allow:
        try:
            network = ipaddress.ip_network(pattern, strict=False)
        except ValueError:
            if address is None and fnmatch.fnmatchcase(host, pattern.lower()):
                return
            continue
        if address is not None and address.version == network.version and address in network:
            return
    raise PermissionDenied(
        f"inference_endpoint {endpoint!r}: host {host!r} matches none of inference.endpoint_allow "
        f"({', '.join(allow)})"
    )
