"""The typed Python client of the Aryl scheduler: submit and watch training jobs from Python.

Nouns: a *job spec* (:class:`JobSpec`) is what a user asks for — a command, a GPU shape
(``gpus_per_worker`` × ``min_workers..max_workers``) and hints; a *job* (:class:`Job`) is the
scheduler's record of it (id, state, placement); an *event* is one entry of the scheduler's
append-only log of state changes, each with a reason code.

Usage::

    from arylctl.client import ArylClient, NotFound, job_spec

    spec = job_spec(
        name="resnet50",
        command=["torchrun", "train.py", "--epochs", "90"],
        gpus_per_worker=4,
        min_workers=1,
        max_workers=4,  # elastic: the scheduler may grow it to 4 workers
        estimated_runtime_s=3600,
    )
    with ArylClient("scheduler.example:50051") as aryl:
        job = aryl.submit_job(spec, idempotency_key="resnet50-run-7")
        print(job.job_id, job.state)
        # The job's log from the start, then live; breaking out of the loop ends the stream.
        for event in aryl.watch_events(after_event_id=0, job_id=job.job_id):
            print(event.event_id, event.reason, event.message)
            if event.to_state in ("COMPLETED", "FAILED", "CANCELLED"):
                break
        try:
            aryl.cancel_job(job.job_id, reason="done experimenting")
        except NotFound:
            pass

Methods take keyword arguments and return the protobuf messages of ``protos/aryl/v1`` (read
``types.proto`` for the fields). The address defaults to ``$ARYL_SERVER``, else
``127.0.0.1:50051``; the addresses of several schedulers sharing one database may be given
comma-separated (``a:50051,b:50051``): unary calls follow the leader a standby names, and fail over
among every address the client knows — those it was given and the leader named — never staying
with a named leader that stopped answering: on UNAVAILABLE from it the next try goes back to the
given addresses at once, and a standby naming it again within ``DEAD_LEADER_S`` is not followed
(``docs/ha.md``; how: ``arylctl.connection``). Every unary call carries a deadline (``timeout``,
seconds); event streams do not, and are cancelled by :meth:`EventStream.cancel`, by leaving a
``with`` block or by breaking out of the loop and dropping the stream.

Failures arrive as :class:`ArylError` subclasses carrying the gRPC status ``code`` and the
server's ``message`` — never as raw ``grpc.RpcError``.

Retries: :meth:`ArylClient.submit_job` is the one call retried here, because it is made safe to
retry: it always sends an idempotency key (a random one when the caller gives none), and the
scheduler answers a resubmission with the same key and spec with the job the first try queued.
A submission that failed UNAVAILABLE or DEADLINE_EXCEEDED (the scheduler may or may not have
queued it) is tried again with the same key: ``SUBMIT_ATTEMPTS`` tries when no scheduler was ever
reached (a wrong address fails fast), and for up to ``SUBMIT_RETRY_S`` once one was (a restart or a
takeover, which take seconds, is waited out). A submission that fails anyway raises with its key
(``ArylError.idempotency_key``, and a note on the exception): submitting again with that key is safe.
(The rules are ``arylctl.retries``'s.)

What this module must never do: decide anything (validation of a spec is the server's job; the
helpers here only build messages and reject what cannot be expressed in one), or retry any other
call on its own — whether a retry is safe is the caller's to know.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Final

import grpc

from arylctl.connection import (  # DEFAULT_ADDRESS, MAX_MESSAGE_BYTES, default_address: re-exported (documented API)
    DEFAULT_ADDRESS,
    MAX_MESSAGE_BYTES,
    SchedulerConnection,
    default_address,
)
from arylctl.errors import (  # re-exported: the client's documented API
    Aborted,
    AlreadyExists,
    ArylError,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    OutOfRange,
    Unavailable,
    aryl_error,
)
from arylctl.retries import (  # SUBMIT_*, SubmitRetry, new_idempotency_key: re-exported (documented API)
    SUBMIT_ATTEMPTS,
    SUBMIT_RETRY_S,
    SubmitRetry,
    new_idempotency_key,
    submit_with_retries,
)
from arylctl.spec import (  # built there; re-exported: the client's documented API
    RESTART_POLICIES,
    job_spec,
    job_spec_from_mapping,
    normalize_job_spec_mapping,
    parse_deadline,
)
from arylctl.streams import EventStream
from protos.aryl.v1 import inference_pb2, scheduler_pb2, types_pb2

__all__ = [
    "DEFAULT_ADDRESS",
    "MAX_MESSAGE_BYTES",
    "RESTART_POLICIES",
    "SUBMIT_ATTEMPTS",
    "SUBMIT_RETRY_S",
    "TERMINAL_JOB_STATES",
    "Aborted",
    "AlreadyExists",
    "ArylClient",
    "ArylError",
    "DeadlineExceeded",
    "EventStream",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "OutOfRange",
    "SubmitRetry",
    "Unavailable",
    "default_address",
    "job_spec",
    "job_spec_from_mapping",
    "new_idempotency_key",
    "normalize_job_spec_mapping",
    "parse_deadline",
]

TERMINAL_JOB_STATES: Final = frozenset(
    {types_pb2.JOB_STATE_COMPLETED, types_pb2.JOB_STATE_FAILED, types_pb2.JOB_STATE_CANCELLED}
)

JobSpec = types_pb2.JobSpec
Job = types_pb2.Job
Event = types_pb2.Event
Server = types_pb2.Server
Loan = types_pb2.Loan


# ---------------------------------------------------------------------------------------------
# The client


# What-if waits at least this long (``ArylClient.what_if``).
WHAT_IF_TIMEOUT_S: Final = 60.0


class ArylClient(SchedulerConnection):
    """A connection to one scheduler (``SchedulerService`` and ``InferenceService``); how it connects and fails
    over: ``arylctl.connection``.

    Thread-safe: one client may be shared by threads. Close it (or use ``with``) when done.
    """

    # -- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the channel; open event streams end. Idempotent."""
        self._closed.set()
        self._channel.close()

    def __enter__(self) -> ArylClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ArylClient({self.address!r}, timeout={self.timeout})"

    # -- jobs ----------------------------------------------------------------------------------

    def submit_job(
        self, spec: types_pb2.JobSpec, *, idempotency_key: str = "", attempts: int | None = None,
        retry_s: float = SUBMIT_RETRY_S, on_retry: Callable[[SubmitRetry], None] | None = None,
    ) -> types_pb2.Job:
        """Queue a job; returns it as recorded (PENDING, with its ``job_id``): ``submit(...).job``."""
        return self.submit(spec, idempotency_key=idempotency_key, attempts=attempts, retry_s=retry_s,
                           on_retry=on_retry).job

    def submit(
        self, spec: types_pb2.JobSpec, *, idempotency_key: str = "", attempts: int | None = None,
        retry_s: float = SUBMIT_RETRY_S, on_retry: Callable[[SubmitRetry], None] | None = None,
    ) -> scheduler_pb2.SubmitJobResponse:
        """Queue a job; returns the whole answer: the job as recorded and the scheduler's admission
        feedback (its predicted finish, and whether its deadline looks feasible: ``deadline_status``,
        ``admission_note``). With ``scheduling.deadline_admission = reject`` a job that would miss its
        deadline raises :class:`FailedPrecondition`.

        The submission carries ``idempotency_key`` (<= 128 chars), or a fresh random one when it
        is empty, and is tried again with that same key while it fails :class:`Unavailable` or
        :class:`DeadlineExceeded` (each try with the client's timeout): ``SUBMIT_ATTEMPTS`` tries
        while no scheduler was ever reached, else until ``retry_s`` seconds have passed since the
        first failure (``attempts``, when given, bounds the tries in any case); ``on_retry`` hears
        of each retry before its wait. The scheduler answers a resubmission of a job it already
        queued (same user, key and spec) with that job, so a lost answer never queues the job
        twice. A failure raises with ``idempotency_key`` set on the error. Keys are per user. Submitting
        again with a key the user already used for a different spec raises
        :class:`AlreadyExists`, whose ``job_id`` is the job that holds the key; with the same spec
        it returns that job (as it is now, perhaps running) instead of queueing another.
        """
        key = idempotency_key or new_idempotency_key()
        request = scheduler_pb2.SubmitJobRequest(spec=spec, idempotency_key=key)
        answer: scheduler_pb2.SubmitJobResponse = submit_with_retries(
            lambda: self._unary(self._scheduler.SubmitJob, request), key=key, attempts=attempts, retry_s=retry_s,
            on_retry=on_retry, reached=self._reached, closed=self._closed)
        return answer


    def submit_jobs(
        self, jobs: Sequence[tuple[types_pb2.JobSpec, str]], *, array_indices: Sequence[int] = (),
        attempts: int | None = None, retry_s: float = SUBMIT_RETRY_S,
        on_retry: Callable[[SubmitRetry], None] | None = None,
    ) -> list[types_pb2.Job]:
        """Queue many jobs in one call, all or none (at most 10,000): ``jobs`` are (spec, idempotency
        key) pairs; with ``array_indices`` (one per job) they form one job array. Returns them as
        recorded, in order (the list view: no env). Retried as ``submit_job`` is (give every job a
        key, so a lost answer never queues one twice); a bad spec raises :class:`InvalidArgument`
        naming ``jobs[i]`` and nothing is queued."""
        request = scheduler_pb2.SubmitJobsRequest(
            jobs=[scheduler_pb2.SubmitJobRequest(spec=spec, idempotency_key=key) for spec, key in jobs],
            array_indices=list(array_indices),
        )
        answer = submit_with_retries(lambda: self._unary(self._scheduler.SubmitJobs, request),
                                     key=jobs[0][1] if jobs else "", attempts=attempts, retry_s=retry_s,
                                     on_retry=on_retry, reached=self._reached, closed=self._closed)
        return list(answer.jobs)

    def cancel_job_array(self, array_job_id: str, *, reason: str = "") -> list[str]:
        """Cancel every job of an array that has not ended; the ids of the jobs cancelled."""
        request = scheduler_pb2.CancelJobArrayRequest(array_job_id=array_job_id, reason=reason)
        return list(self._unary(self._scheduler.CancelJobArray, request).cancelled_job_ids)

    def get_job(self, job_id: str, *, include_events: bool = False) -> scheduler_pb2.GetJobResponse:
        """One job; with ``include_events`` also its events from the log, oldest first."""
        request = scheduler_pb2.GetJobRequest(job_id=job_id, include_events=include_events)
        return self._unary(self._scheduler.GetJob, request)

    def list_jobs(
        self,
        *,
        states: Sequence[types_pb2.JobState] = (),
        user: str = "",
        queue: str = "",
        page_size: int = 0,
        page_token: str = "",
    ) -> scheduler_pb2.ListJobsResponse:
        """One page of jobs, newest first. ``states`` are ``types_pb2.JobState`` values (empty: all);
        ``page_size`` 0 means the server's default (100, at most 1000)."""
        request = scheduler_pb2.ListJobsRequest(
            states=list(states), user=user, queue=queue, page_size=page_size, page_token=page_token
        )
        return self._unary(self._scheduler.ListJobs, request)

    def iter_jobs(
        self, *, states: Sequence[types_pb2.JobState] = (), user: str = "", queue: str = "", page_size: int = 0
    ) -> Iterator[types_pb2.Job]:
        """All jobs matching the filters, newest first, fetching pages as iteration goes."""
        token = ""
        while True:
            page = self.list_jobs(states=states, user=user, queue=queue, page_size=page_size, page_token=token)
            yield from page.jobs
            if not page.next_page_token:
                return
            if page.next_page_token == token:
                raise ArylError(grpc.StatusCode.INTERNAL, f"server repeated page token {token!r}")
            token = page.next_page_token

    def cancel_job(self, job_id: str, *, reason: str = "") -> types_pb2.Job:
        """Cancel a job (its workers get SIGTERM, then SIGKILL after the grace period).

        Raises :class:`FailedPrecondition` when the job has already finished.
        """
        request = scheduler_pb2.CancelJobRequest(job_id=job_id, reason=reason)
        return self._unary(self._scheduler.CancelJob, request).job

    # -- queues (admin) ---------------------------------------------------------------------------

    def create_queue(self, name: str, quota_gpus: int, *, cohort: str = "", borrow_limit_gpus: int | None = None,
                     fair_share: bool = True) -> scheduler_pb2.Queue:
        """Create a queue with a guaranteed GPU quota; it borrows idle GPUs of its ``cohort`` up to
        ``borrow_limit_gpus`` (None: no limit). Raises :class:`AlreadyExists` if it exists."""
        queue = scheduler_pb2.Queue(name=name, quota_gpus=quota_gpus, cohort=cohort, fair_share=fair_share,
                                    borrow_limit_gpus=borrow_limit_gpus)
        return self._unary(self._scheduler.CreateQueue, scheduler_pb2.CreateQueueRequest(queue=queue)).queue

    def update_queue(self, name: str, *, quota_gpus: int | None = None, cohort: str | None = None,
                     borrow_limit_gpus: int | None = None, unlimited_borrowing: bool = False,
                     fair_share: bool | None = None, quota_rest: bool = False) -> scheduler_pb2.Queue:
        """Change the given settings of a queue (None: unchanged); configuring "default" creates its row.
        ``quota_rest`` ("default" only): its quota becomes the rest again, what the other queues leave."""
        request = scheduler_pb2.UpdateQueueRequest(
            name=name, quota_gpus=quota_gpus, cohort=cohort, borrow_limit_gpus=borrow_limit_gpus,
            unlimited_borrowing=unlimited_borrowing, fair_share=fair_share, quota_rest=quota_rest)
        return self._unary(self._scheduler.UpdateQueue, request).queue

    def delete_queue(self, name: str) -> None:
        """Delete a queue with no active jobs; "default" is reset instead (unconfigured: its quota the rest)."""
        self._unary(self._scheduler.DeleteQueue, scheduler_pb2.DeleteQueueRequest(name=name))

    def list_queues(self) -> list[scheduler_pb2.Queue]:
        """Every queue with its quota and usage ("default" first when unconfigured)."""
        return list(self._unary(self._scheduler.ListQueues, scheduler_pb2.ListQueuesRequest()).queues)

    def explain_job(self, job_id: str) -> scheduler_pb2.ExplainJobResponse:
        """Why a job is pending or was preempted: a summary and the recorded decisions."""
        return self._unary(self._scheduler.ExplainJob, scheduler_pb2.ExplainJobRequest(job_id=job_id))

    def what_if(
        self, *, policy: str = "", params: Mapping[str, str] | None = None, inference_servers: int = 0,
        horizon_hours: float = 24.0,
    ) -> scheduler_pb2.WhatIfResponse:
        """Simulate the next ``horizon_hours`` of the cluster as it is now under the configured policy and
        under ``policy`` ("": the configured one) with ``params`` changed and ``inference_servers`` more
        (fewer when negative) inference servers; admin only, changes nothing. The call waits at least
        WHAT_IF_TIMEOUT_S (the scheduler's two runs take up to 10 s each)."""
        request = scheduler_pb2.WhatIfRequest(policy=policy, params=dict(params or {}),
                                              inference_servers=inference_servers, horizon_hours=horizon_hours)
        try:
            response: scheduler_pb2.WhatIfResponse = self._scheduler.WhatIf(
                request, timeout=max(self.timeout, WHAT_IF_TIMEOUT_S))
        except grpc.RpcError as exc:
            raise aryl_error(exc) from exc
        return response

    def preview_reclaim(self, servers: int) -> scheduler_pb2.PreviewReclaimResponse:
        """Dry run: what reclaiming ``servers`` loaned servers would do now. Changes nothing."""
        return self._unary(self._scheduler.PreviewReclaim, scheduler_pb2.PreviewReclaimRequest(servers=servers))

    def read_job_log(
        self, job_id: str, *, rank: int = 0, offset: int = 0, max_bytes: int = 0
    ) -> scheduler_pb2.GetJobLogsResponse:
        """One chunk of a worker's stdout/stderr from the agent of the server it ran on. ``offset``
        < 0 reads that many bytes before the end; continue from the answer's ``next_offset``.
        An offset past the end of the log raises :class:`OutOfRange`."""
        request = scheduler_pb2.GetJobLogsRequest(job_id=job_id, rank=rank, offset=offset, max_bytes=max_bytes)
        return self._unary(self._scheduler.GetJobLogs, request)

    def follow_job_log(
        self, job_id: str, *, rank: int = 0, offset: int = 0, poll_s: float = 1.0,
        stop: threading.Event | None = None, until_finished: bool = False,
    ) -> Iterator[bytes]:
        """Yield the log from ``offset`` on, then new output as it is written, until ``stop`` is set
        (or forever). Polls with the offset, so nothing is read twice or skipped.

        With ``until_finished`` it also ends once the job is in a terminal state (COMPLETED,
        FAILED, CANCELLED) and the log has no more bytes: each time it reaches the end of the log
        it asks for the job's state, and a finished job's log is read to its end once more (the
        output written between the last read and the state check) before returning. A PENDING or
        PREEMPTED job may run again, so it is followed on."""
        stop = stop or threading.Event()
        finished = False
        while not stop.is_set():
            chunk = self.read_job_log(job_id, rank=rank, offset=offset)
            if chunk.data:
                yield chunk.data
            offset = chunk.next_offset
            if chunk.next_offset < chunk.size:
                continue
            if finished:
                return  # at the end of the log, read after the job had finished: nothing can follow
            if until_finished and self.get_job(job_id).job.state in TERMINAL_JOB_STATES:
                finished = True  # one more read: output written since this chunk was read
                continue
            stop.wait(poll_s)

    # -- events --------------------------------------------------------------------------------

    def watch_events(
        self,
        *,
        after_event_id: int | None = None,
        job_id: str = "",
        server_id: str = "",
        idle_timeout: float | None = None,
    ) -> EventStream:
        """Stream events from the log: first those with ``event_id > after_event_id`` (``None``:
        none, only new events; 0: the whole log), then new ones as they happen.

        The stream has no deadline. With ``idle_timeout`` it ends after that many seconds without
        an event (replay-until-caught-up); the wait for the connection itself is bounded by the
        client's ``timeout`` and does not count as idle time.
        """
        request = scheduler_pb2.WatchEventsRequest(job_id=job_id, server_id=server_id)
        if after_event_id is not None:
            request.after_event_id = after_event_id
        if idle_timeout is not None:
            self.wait_until_connected()
        call = self._scheduler.WatchEvents(request)
        return EventStream(call, idle_timeout=idle_timeout, client_closed=self._closed)

    def wait_until_connected(self) -> None:
        """Block until the channel is connected; fail as fast as a unary call would when the
        first connection attempt fails (a refused port must not cost the whole timeout).

        Raises :class:`Unavailable` (the attempt failed) or :class:`DeadlineExceeded` (no answer
        within the client's ``timeout``)."""
        settled = threading.Event()
        states: list[grpc.ChannelConnectivity] = []
        connectivity = grpc.ChannelConnectivity
        final = (connectivity.READY, connectivity.TRANSIENT_FAILURE, connectivity.SHUTDOWN)

        def on_change(state: grpc.ChannelConnectivity) -> None:
            if state in final:
                states.append(state)
                settled.set()

        self._channel.subscribe(on_change, try_to_connect=True)
        try:
            if not settled.wait(self.timeout):
                raise DeadlineExceeded(
                    grpc.StatusCode.DEADLINE_EXCEEDED, f"no connection to {self.address} within {self.timeout:g}s"
                )
        finally:
            self._channel.unsubscribe(on_change)
        if states[0] != connectivity.READY:
            raise Unavailable(grpc.StatusCode.UNAVAILABLE, f"failed to connect to {self.address}")

    # -- cluster -------------------------------------------------------------------------------

    def get_cluster(self) -> scheduler_pb2.GetClusterResponse:
        """Capacity per pool, job counts by state, inference demand, policy and epoch."""
        return self._unary(self._scheduler.GetCluster, scheduler_pb2.GetClusterRequest())

    def list_servers(self, *, pool: types_pb2.Pool = types_pb2.POOL_UNSPECIFIED) -> list[types_pb2.Server]:
        """Servers with their GPUs; ``pool`` is a ``types_pb2.Pool`` value (unspecified: all)."""
        response = self._unary(self._scheduler.ListServers, scheduler_pb2.ListServersRequest(pool=pool))
        return list(response.servers)

    def cordon_server(self, server_id: str, *, reason: str = "") -> scheduler_pb2.ServerAdminResponse:
        """No new workers or loans on the server; what runs there keeps running. Raises
        :class:`NotFound` for an unknown server."""
        return self._unary(self._scheduler.CordonServer,
                           scheduler_pb2.CordonServerRequest(server_id=server_id, reason=reason))

    def uncordon_server(self, server_id: str) -> scheduler_pb2.ServerAdminResponse:
        """Undo a cordon or a drain: the server takes new work again."""
        return self._unary(self._scheduler.UncordonServer, scheduler_pb2.UncordonServerRequest(server_id=server_id))

    def drain_server(
        self, server_id: str, *, reason: str = "", timeout_s: float = 0.0, force: bool = False
    ) -> scheduler_pb2.ServerAdminResponse:
        """Cordon the server and move work off it: elastic jobs shrink off (or requeue); the others
        finish there, or are requeued after ``timeout_s`` (0: no deadline), or now with ``force``."""
        request = scheduler_pb2.DrainServerRequest(server_id=server_id, reason=reason, timeout_seconds=timeout_s,
                                                   force=force)
        return self._unary(self._scheduler.DrainServer, request)

    def delete_server(self, server_id: str, *, force: bool = False) -> scheduler_pb2.DeleteServerResponse:
        """Remove the server from the cluster. Raises :class:`FailedPrecondition` while workers run
        there, unless the server is LOST or ``force`` (then its jobs move off first)."""
        return self._unary(self._scheduler.DeleteServer,
                           scheduler_pb2.DeleteServerRequest(server_id=server_id, force=force))

    def list_loans(self, *, include_returned: bool = False) -> list[types_pb2.Loan]:
        """Loans of inference servers to training; active and reclaiming ones unless told otherwise."""
        return list(self.list_loans_response(include_returned=include_returned).loans)

    def list_loans_response(self, *, include_returned: bool = False) -> scheduler_pb2.ListLoansResponse:
        """``list_loans`` with the scheduler's reason for loaning no (further) server (``not_loaned``)."""
        request = scheduler_pb2.ListLoansRequest(include_returned=include_returned)
        return self._unary(self._scheduler.ListLoans, request)

    # -- inference demand ----------------------------------------------------------------------

    def report_demand(
        self, servers_needed: int, *, observed_rps: float = 0.0, source: str = "arylctl"
    ) -> inference_pb2.ReportDemandResponse:
        """Tell the scheduler how many inference servers must be serving (it loans the rest)."""
        request = inference_pb2.ReportDemandRequest(
            servers_needed=servers_needed, observed_rps=observed_rps, source=source
        )
        return self._unary(self._inference.ReportDemand, request)

    def get_demand(self) -> types_pb2.InferenceDemand:
        """The inference demand last reported."""
        return self._unary(self._inference.GetDemand, inference_pb2.GetDemandRequest()).demand
