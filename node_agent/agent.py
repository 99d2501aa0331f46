"""The node agent's control loop: register the server, report its status, receive its desired state.

Nouns: a *session* is one registration with the scheduler and what runs on it: a thread that
watches the desired-state stream and a loop that reports status every ``report_interval``. Any
failure in a session (scheduler unreachable, stream broken, report refused) ends it; the agent
then waits with exponential backoff and jitter and registers again, which is idempotent on the
scheduler's side (the hostname is the server's identity).

Workers: every accepted desired state is handed to the *supervisor* (``node_agent.supervisor``),
whose own thread starts and stops worker processes; the report loop sends what it sees, and the
generation it has acted on as ``observed_generation``. A *log service* (``node_agent.logs``) lets the
scheduler read worker logs; its address goes out with the registration. Workers outlive sessions
(the scheduler being unreachable stops nothing).

Leaving: ``leave()`` (what SIGTERM/SIGINT do, ``node_agent.main``) ends the loops, tells the
scheduler the server leaves the cluster (``Deregister``: its jobs are shrunk or requeued at once, not
as failures, and nothing more is placed there), then stops the workers with their grace periods.
``stop()`` (SIGTERM with ``agent.keep_workers_on_exit``) just ends the agent: the workers keep running
and the next agent started with the same work directory adopts them (``agent.stop_workers_on_exit``
stops them instead, without deregistering).

It never decides anything: placement, loans, restarts and health verdicts are the scheduler's.

Several schedulers (``agent.scheduler_address`` "a:50051,b:50051", ``docs/ha.md``): when a call fails
UNAVAILABLE or past its deadline, the next session goes to the leader a standby named, else to the
next address; the newest epoch seen is kept in the work directory (``node_agent.epoch_file``), so a
restarted agent still refuses a deposed scheduler.

The desired-state stream: where the registration's answer names the port of the scheduler's desired-state
streams' own process (``DESIRED_STATE_PORT_KEY``, ``server.desired_state_port`` on the scheduler), the stream
is watched there, on the scheduler's host, so that a push never waits for the scheduler's interpreter. Where it
also names another replica's process (``DESIRED_STATE_ADDRESS_KEY``, host:port: a standby's, ``docs/ha.md``),
that one is watched first, with the same TLS and token, and the scheduler's own is its fallback. Where a
process is not reachable within ``rpc_timeout_s``, or its stream fails before sending anything, the agent says
so in its log and watches the next one, and the scheduler itself once none is left, for the rest of the
session. A stream there that ends after serving (the process died and is being started again) is watched
there again, after a short backoff, without registering again: each new stream begins with the current state,
so nothing is missed; a process that does not come back (its scheduler died) is then unreachable, and the next
one is watched.

Every unary call carries a deadline (``rpc_timeout_s``); the stream has none, it lives as long as
the session. Shutdown (``stop()``, ``leave()``) ends the loops and cancels the stream; it completes
within one RPC deadline (plus one for deregistering, and the workers' grace periods when they are
stopped).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import grpc
import structlog
from google.protobuf import duration_pb2

from aryl_common.backoff import Backoff
from aryl_common.channels import (
    SchedulerAddresses,
    describe_rpc_error,
    desired_state_addresses,
    leader_hint,
    scheduler_channel,
)
from aryl_common.entry import package_version
from aryl_common.security import ClientSecurity
from node_agent import contract
from node_agent.config import AgentSection, UsersSection
from node_agent.desired import DesiredStateTracker, Verdict
from node_agent.epoch_file import EpochFile
from node_agent.gpus import GpuBackend, GpuInfo, GpuSample
from node_agent.logs import serve_worker_logs
from node_agent.metrics import AgentMetrics
from node_agent.supervisor import Supervisor
from node_agent.workers import Phase, WorkerView
from protos.aryl.v1 import agent_pb2, agent_pb2_grpc, types_pb2

# Used when the scheduler's answer carries no report interval (it always should).
DEFAULT_REPORT_INTERVAL_S = 5.0
# Floor on the interval the scheduler asks for, so a bad value cannot make the agent spin.
MIN_REPORT_INTERVAL_S = 0.1
# Reports in a row that show a newer desired generation than the stream delivered before the
# agent assumes the stream lost it and re-registers (which returns the current desired state).
# One is normal: the report can overtake the stream push of the same commit.
LAGGING_REPORTS_BEFORE_RESYNC = 2

POOLS = {"training": types_pb2.POOL_TRAINING, "inference": types_pb2.POOL_INFERENCE}
PHASES = {
    Phase.STARTING: agent_pb2.WORKER_PHASE_STARTING,
    Phase.RUNNING: agent_pb2.WORKER_PHASE_RUNNING,
    Phase.STOPPING: agent_pb2.WORKER_PHASE_STOPPING,
    Phase.EXITED: agent_pb2.WORKER_PHASE_EXITED,
}


# Failures after which the next session tries another scheduler (the leader a standby named, or the
# next address): this one is down, unreachable, or a standby.
MOVE_ON = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class SessionEnded(Exception):
    """The current session with the scheduler is over; the agent will register again. ``error``: the
    failed call, if one ended it; ``move_on``: register with another scheduler next (see ``MOVE_ON``)."""

    def __init__(self, message: str, *, error: grpc.RpcError | None = None, move_on: bool = False) -> None:
        super().__init__(message)
        self.error = error
        self.move_on = move_on or (isinstance(error, grpc.Call) and error.code() in MOVE_ON)


def gpu_info_message(gpu: GpuInfo) -> agent_pb2.GpuInfo:
    return agent_pb2.GpuInfo(
        index=gpu.index, uuid=gpu.uuid, model=gpu.model, memory_total_bytes=gpu.memory_total_bytes
    )


def gpu_status_message(sample: GpuSample) -> agent_pb2.GpuStatus:
    return agent_pb2.GpuStatus(
        index=sample.index,
        utilization=sample.utilization,
        memory_used_bytes=sample.memory_used_bytes,
        temperature_c=sample.temperature_c,
        healthy=sample.healthy,
        health_reason=sample.health_reason,
        ecc_uncorrectable=sample.ecc_uncorrectable,
        retired_pages=sample.retired_pages,
    )


def worker_status_message(view: WorkerView) -> agent_pb2.WorkerStatus:
    return agent_pb2.WorkerStatus(
        job_id=view.id.job_id,
        rank=view.id.rank,
        incarnation=view.id.incarnation,
        phase=PHASES[view.phase],
        exit_code=view.exit_code if view.phase is Phase.EXITED else 0,
        progress=view.progress.progress,
        samples_per_second=view.progress.samples_per_second,
        checkpoint_progress=view.progress.checkpoint_progress,
        **goodput_measures(view.progress),
        message=view.message,
        stop_requested=view.stop_requested,
        cannot_start=view.cannot_start,
        **ack_fields(view),
    )


def goodput_measures(progress: contract.Progress) -> dict[str, Any]:
    """``WorkerStatus``'s goodput fields: the progress file's goodput measures, as the worker wrote them."""
    return {key: getattr(progress, key) for key in contract.GOODPUT_KEYS}


def ack_fields(view: WorkerView) -> dict[str, Any]:
    """``WorkerStatus``'s acknowledgement fields: the ack's age, not its time (the clocks may differ)."""
    if view.ack is None:
        return {"stop_acknowledged": view.stop_acknowledged}
    age = duration_pb2.Duration()
    age.FromNanoseconds(int(max(time.time() - view.ack.saved_at, 0.0) * 1e9))
    return {"checkpoint_acked": True, "ack_checkpoint_progress": view.ack.checkpoint_progress,
            "ack_checkpoint_age": age, "stop_acknowledged": view.stop_acknowledged}


class Agent:
    """One server's agent. ``run()`` blocks until ``stop()``, which any other thread may call."""

    def __init__(
        self,
        config: AgentSection,
        gpus: GpuBackend,
        *,
        backoff: Backoff | None = None,
        version: str | None = None,
        users: UsersSection | None = None,
    ) -> None:
        self.config = config
        self.gpus = gpus
        self.epochs = EpochFile(config.work_path)
        self.desired = DesiredStateTracker(newest_epoch=self.epochs.load(), on_newer_epoch=self.epochs.save)
        self.addresses = SchedulerAddresses(config.scheduler_address)
        # Set when there is news worth reporting before the next interval (convergence, an exit).
        self._report_now = threading.Event()
        self.supervisor = Supervisor(config, self.desired, on_change=self._report_now.set, users=users)
        self.logs_address = ""  # host:port of the worker-log service once it runs
        self.version = version or package_version()  # reported to the scheduler with the registration
        self._backoff = backoff or Backoff.capped(config.reconnect_max_backoff_s)
        self._inventory = gpus.inventory()
        self.metrics = AgentMetrics(self._inventory)  # served by node_agent.main ([metrics] port)
        self._stopping = threading.Event()
        self._leaving = False  # set by leave(): deregister and stop the workers on the way out
        # The current session's "over" flag and stream, so stop() can end them from another thread.
        self._session_over = threading.Event()
        self._stream: grpc.Call | None = None
        self._stream_lock = threading.Lock()
        # Set while the watcher reconnects to a desired-state streams' process that had served and ended its
        # stream (it is being restarted): the reports lag the stream then by design, and re-registering for it
        # would only make the next session give up on the process before it is back (``_watch``).
        self._rewatching = threading.Event()
        self._log = structlog.get_logger("node_agent").bind(hostname=config.hostname, pool=config.pool)

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    def run(self) -> None:
        """Register, run sessions, reconnect on failure; return once ``stop()`` was called."""
        self._log.info(
            "agent starting",
            scheduler=self.config.scheduler_address,
            gpus=len(self._inventory),
            gpu_backend=self.gpus.name,
            version=self.version,
        )
        if (warning := self.supervisor.identities.start_warning()) is not None:
            self._log.warning(warning)
        self.supervisor.start()
        logs_server = self._serve_logs()
        channel = scheduler_channel(self.addresses.current, self.config.reconnect_max_backoff_s,
                                    self._security)
        try:
            while not self._stopping.is_set():
                try:
                    self._run_session(agent_pb2_grpc.AgentServiceStub(channel))
                except SessionEnded as exc:
                    if self._stopping.is_set():
                        break
                    if exc.move_on and self._move_on(exc):
                        channel.close()
                        channel = scheduler_channel(self.addresses.current, self.config.reconnect_max_backoff_s,
                                    self._security)
                        if exc.error is not None and leader_hint(exc.error):
                            self._stopping.wait(0.05)  # a standby named the leader: go there at once
                            continue
                    delay = self._backoff.next_delay()
                    self._log.warning(
                        "no session with the scheduler, registering again",
                        why=str(exc),
                        retry_in_s=round(delay, 2),
                        attempt=self._backoff.failures,
                    )
                    self._stopping.wait(delay)
        finally:
            self._cancel_stream()
            if self._leaving:
                self._deregister(agent_pb2_grpc.AgentServiceStub(channel))
            channel.close()
            if logs_server is not None:
                logs_server.stop(grace=0)
            self.supervisor.close(stop_workers=self._leaving or self.config.stop_workers_on_exit)
            self._log.info("agent stopped", observed_generation=self.supervisor.observed_generation)

    def _move_on(self, ended: SessionEnded) -> bool:
        """Point ``addresses`` at the next scheduler to try; whether it changed."""
        before = self.addresses.current
        after = self.addresses.after_failure(ended.error if ended.error is not None else ended)
        if after != before:
            self._log.warning("trying another scheduler", previous=before, scheduler=after,
                              leader_named=bool(ended.error is not None and leader_hint(ended.error)))
        return after != before

    def stop(self) -> None:
        """Ask ``run()`` to return: ends the report loop and cancels the stream. Thread-safe; not for
        use inside a signal handler (it takes locks), see ``aryl_common.signals.run_until_signalled``."""
        self._stopping.set()
        self._session_over.set()
        self._report_now.set()
        self._cancel_stream()

    def leave(self) -> None:
        """Like ``stop()``, and on the way out deregister from the scheduler and stop the workers (with
        their grace periods): the server leaves the cluster. Thread-safe; not for a signal handler."""
        self._leaving = True
        self.stop()

    def _deregister(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        """Tell the scheduler this server leaves (one attempt, one RPC deadline). If it cannot be told,
        it marks the server LOST once the agent has been silent for its ``agents.lost_after_s``."""
        request = agent_pb2.DeregisterRequest(server_id=self.config.hostname, reason="agent stopped")
        try:
            stub.Deregister(request, timeout=self.config.rpc_timeout_s)
        except grpc.RpcError as exc:
            self._log.warning("could not deregister; the scheduler will find the server lost when its agent "
                              "stays silent", why=describe_rpc_error(exc))
            return
        self._log.info("deregistered: the server left the cluster; stopping its workers")

    @functools.cached_property
    def _security(self) -> ClientSecurity:
        """What the agent presents to the scheduler (agent.insecure, agent.tls_*, agent.token_file)."""
        return self.config.client_security()

    def _serve_logs(self) -> grpc.Server | None:
        """Start the worker-log service unless ``logs_port`` is -1; a port that cannot be bound is
        logged and the agent runs on without serving logs (they stay on disk)."""
        if self.config.logs_port < 0:
            return None
        try:
            server, port = serve_worker_logs(
                self.supervisor.layout, self.config.hostname, self.config.logs_listen_host, self.config.logs_port,
                tls=self.config,
            )
        except (OSError, RuntimeError) as exc:
            self._log.error("cannot serve worker logs; the scheduler will not be able to show them", reason=str(exc))
            return None
        self.logs_address = f"{self.config.agent_address}:{port}"
        return server

    def _cancel_stream(self) -> None:
        with self._stream_lock:
            stream = self._stream
        if stream is not None:
            stream.cancel()

    # ---------------------------------------------------------------------------------------------
    # one session

    def _run_session(self, stub: agent_pb2_grpc.AgentServiceStub) -> None:
        """Register, then watch and report until something fails (SessionEnded) or the agent stops."""
        registered, push_addresses = self._register(stub)
        over = self._session_over = threading.Event()
        if self._stopping.is_set():  # stop() came during the registration call
            return
        server_id = registered.server_id
        interval = self._interval(registered.report_interval)
        if registered.HasField("desired"):
            self._accept(registered.desired, source="registration")
        self._log.info(
            "registered with the scheduler",
            server_id=server_id,
            scheduler_epoch=registered.scheduler_epoch,
            report_interval_s=interval,
        )

        why: list[SessionEnded] = []  # the watcher's reason, when it is what ends the session
        self._rewatching.clear()
        watcher = threading.Thread(
            target=self._watch, args=(stub, server_id, push_addresses, over, why), name="desired-state-watch",
            daemon=True,
        )
        watcher.start()
        try:
            lagging = 0
            while not over.is_set():
                response = self._report(stub, server_id)
                # Reset only once a report went through, so a scheduler that accepts registrations
                # but fails everything after them still sees the backoff grow.
                self._backoff.reset()
                if response.HasField("report_interval"):
                    interval = self._interval(response.report_interval)
                behind = response.desired_generation > self.desired.observed_generation
                lagging = lagging + 1 if behind and not self._rewatching.is_set() else 0
                if lagging >= LAGGING_REPORTS_BEFORE_RESYNC:
                    raise SessionEnded(
                        f"scheduler has desired generation {response.desired_generation} but the stream "
                        f"delivered only {self.desired.observed_generation}; resynchronising"
                    )
                self._report_now.wait(interval)
                self._report_now.clear()
            if not self._stopping.is_set():
                raise why[0] if why else SessionEnded("desired-state stream ended")
        finally:
            over.set()
            self._cancel_stream()
            watcher.join(timeout=self.config.rpc_timeout_s)

    def _register(
        self, stub: agent_pb2_grpc.AgentServiceStub
    ) -> tuple[agent_pb2.RegisterServerResponse, list[str]]:
        """Register; the answer and the desired-state streams' processes it names, in the order to try them:
        another replica's (``DESIRED_STATE_ADDRESS_KEY``), then the scheduler's own (``DESIRED_STATE_PORT_KEY``,
        on the host the agent reached the scheduler at)."""
        request = agent_pb2.RegisterServerRequest(
            hostname=self.config.hostname,
            pool=POOLS[self.config.pool],
            gpus=[gpu_info_message(g) for g in self._inventory],
            agent_address=self.config.agent_address,
            agent_version=self.version,
            logs_address=self.logs_address,
            inference_endpoint=self.config.inference_endpoint,
        )
        try:
            response, call = stub.RegisterServer.with_call(request, timeout=self.config.rpc_timeout_s)
            self.metrics.registrations.inc()
        except grpc.RpcError as exc:
            raise SessionEnded(f"registration failed: {describe_rpc_error(exc)}", error=exc) from exc
        push_addresses = desired_state_addresses(dict(call.initial_metadata() or ()), self.addresses.current)
        if not self.desired.observe_epoch(response.scheduler_epoch):
            raise SessionEnded(
                f"scheduler answered with epoch {response.scheduler_epoch}, older than epoch "
                f"{self.desired.newest_epoch} already seen: a deposed scheduler; waiting for the current one "
                f"(if the scheduler's database was deliberately reset, delete {self.epochs.path} and restart "
                "this agent)",
                move_on=True,
            )
        return response, push_addresses

    def _report(self, stub: agent_pb2_grpc.AgentServiceStub, server_id: str) -> agent_pb2.ReportStatusResponse:
        samples, statuses = self.gpus.sample(), self.supervisor.statuses()
        request = agent_pb2.ReportStatusRequest(
            server_id=server_id,
            scheduler_epoch=self.desired.newest_epoch,
            gpus=[gpu_status_message(s) for s in samples],
            workers=[worker_status_message(view) for view in statuses],
            observed_generation=self.supervisor.observed_generation,
        )
        self.metrics.sampled(samples, (view.phase for view in statuses), self.supervisor.observed_generation)
        sent = time.monotonic()
        try:
            response = stub.ReportStatus(request, timeout=self.config.rpc_timeout_s)
            self.metrics.report_sent(time.monotonic() - sent, ok=True)
            return response
        except grpc.RpcError as exc:
            self.metrics.report_sent(time.monotonic() - sent, ok=False)
            raise SessionEnded(f"status report failed: {describe_rpc_error(exc)}", error=exc) from exc

    def _watch(
        self, stub: agent_pb2_grpc.AgentServiceStub, server_id: str, push_addresses: list[str],
        over: threading.Event, why: list[SessionEnded],
    ) -> None:
        """Thread body: apply each pushed desired state; end the session when the stream ends. The stream is
        watched on the desired-state streams' processes the registration named (``push_addresses``, in order:
        another replica's, then the scheduler's own), each one given up for the next where it is unreachable,
        and on the scheduler itself (``stub``) once none is left; see the module's docstring."""
        left = list(push_addresses)
        pushes: grpc.Channel | None = None
        address = ""
        rewatch = Backoff.capped(self.config.reconnect_max_backoff_s)
        try:
            while not over.is_set():
                if pushes is None and left:
                    address = left.pop(0)
                    pushes = scheduler_channel(address, self.config.reconnect_max_backoff_s, self._security)
                watching = stub
                if pushes is not None:
                    if self._reachable(pushes, over):
                        watching = agent_pb2_grpc.AgentServiceStub(pushes)
                        self._log.info("watching the desired state on the scheduler's desired-state streams' "
                                       "process", address=address, port=int(address.rpartition(":")[2]))
                    elif over.is_set():
                        return
                    else:
                        self._log.warning("the scheduler's desired-state streams' process is unreachable; "
                                          + ("watching the next one" if left else "watching the scheduler itself"),
                                          address=address, waited_s=self.config.rpc_timeout_s)
                        pushes.close()
                        pushes = None
                        continue
                ended, delivered = self._follow(watching, server_id, over)
                if ended is None:  # the session is over (the agent stops, or the report loop ended it)
                    return
                if pushes is None:
                    why.append(ended)
                    return
                if not delivered:
                    self._log.warning("the desired-state stream of the scheduler's desired-state streams' process "
                                      "failed before sending anything; "
                                      + ("watching the next one" if left else "watching the scheduler itself"),
                                      address=address, why=str(ended))
                    pushes.close()
                    pushes = None
                    continue
                # It served, then ended: it died and is being started again on its port (or its scheduler died:
                # then it is unreachable next, and the next one is watched). Watch there again (its new stream
                # begins with the current state).
                self._rewatching.set()  # until its next stream delivers, or ends (``_follow``)
                delay = rewatch.next_delay()
                self._log.warning("the scheduler's desired-state streams' process ended the stream; watching "
                                  "again", address=address, why=str(ended), retry_in_s=round(delay, 2))
                over.wait(delay)
                # A channel of its own again: the old one's connection backoff, begun when the process died, could
                # outlast the readiness wait, and the agent would give up on a process already back.
                pushes.close()
                pushes = scheduler_channel(address, self.config.reconnect_max_backoff_s, self._security)
        finally:
            if pushes is not None:
                pushes.close()
            over.set()
            self._report_now.set()  # the report loop notices the session's end at once

    def _reachable(self, channel: grpc.Channel, over: threading.Event) -> bool:
        """Whether ``channel`` connects (TLS included) within ``rpc_timeout_s``; False as soon as ``over``."""
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + self.config.rpc_timeout_s
        try:
            while not over.is_set() and time.monotonic() < deadline:
                try:
                    ready.result(timeout=min(0.1, max(0.0, deadline - time.monotonic())))
                    return True
                except grpc.FutureTimeoutError:
                    continue
            return False
        finally:
            ready.cancel()

    def _follow(
        self, stub: agent_pb2_grpc.AgentServiceStub, server_id: str, over: threading.Event
    ) -> tuple[SessionEnded | None, bool]:
        """Apply each state of one WatchDesiredState stream until it ends: why it ended (None once ``over``:
        the session ended it) and whether it delivered any state."""
        stream = stub.WatchDesiredState(agent_pb2.WatchDesiredStateRequest(server_id=server_id))
        with self._stream_lock:
            self._stream = stream
        delivered = False
        try:
            if over.is_set():  # the session ended before the stream was published for cancelling
                return None, delivered
            for desired in stream:
                delivered = True
                self._rewatching.clear()
                self._accept(desired, source="stream")
            return SessionEnded("desired-state stream closed by the scheduler"), delivered
        except grpc.RpcError as exc:
            if over.is_set():
                return None, delivered
            return SessionEnded(f"desired-state stream failed: {describe_rpc_error(exc)}", error=exc), delivered
        finally:
            stream.cancel()
            self._rewatching.clear()
            with self._stream_lock:
                if self._stream is stream:
                    self._stream = None

    # ---------------------------------------------------------------------------------------------
    # desired state

    def _accept(self, desired: agent_pb2.DesiredState, *, source: str) -> Verdict:
        verdict = self.desired.offer(desired)
        fields = {
            "source": source,
            "scheduler_epoch": desired.scheduler_epoch,
            "generation": desired.generation,
        }
        if verdict is Verdict.STALE_EPOCH:
            self._log.warning(
                "refused desired state from a stale scheduler epoch", newest_epoch=self.desired.newest_epoch, **fields
            )
        elif verdict is Verdict.OLD_GENERATION:
            self._log.debug(
                "ignored duplicate or out-of-order desired state",
                observed_generation=self.desired.observed_generation,
                **fields,
            )
        else:
            # Accepted generations are new by construction, so this logs once per generation.
            self.supervisor.wake()
            self._log.info(
                f"desired state received: {len(desired.workers)} workers",
                server_state=types_pb2.ServerState.Name(desired.server_state),
                new_epoch=verdict is Verdict.ACCEPTED_NEW_EPOCH,
                **fields,
            )
        return verdict

    @staticmethod
    def _interval(duration: duration_pb2.Duration) -> float:
        seconds = duration.ToTimedelta().total_seconds()
        return max(MIN_REPORT_INTERVAL_S, seconds) if seconds > 0 else DEFAULT_REPORT_INTERVAL_S
