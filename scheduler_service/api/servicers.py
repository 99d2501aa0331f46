"""The three gRPC services: user-facing SchedulerService, AgentService, InferenceService.

Each method: validate -> call the use case it needs (``scheduler_service.app``) in a worker thread ->
convert the answer.
Streams wait on in-process fan-outs fed after commits (``scheduler_service.notify``): one read per
change serves every stream (the event log for WatchEvents, the serving pool for WatchServingPool, a
server's desired state for WatchDesiredState), so an idle stream costs no database work and holds no
thread (the server is asyncio). Watch streams are counted per principal, per role and in all
(``stream_limits``); an event stream that falls its buffer behind is ended (RESOURCE_EXHAUSTED), and
every stream whose caller's token is revoked, or whose client certificate expires, is ended by ``auth``
(UNAUTHENTICATED).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import structlog
from google.rpc import error_details_pb2, status_pb2

from protos.aryl.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
from scheduler_service.api import auth, convert, validation
from scheduler_service.api.agent_logs import AgentLogReader
from scheduler_service.api.forecast import add_eta, what_if_response
from scheduler_service.api.status import ANSWERED_BY_KEY, rpc
from scheduler_service.api.stream_limits import StreamLimits, TooManyStreams
from scheduler_service.app import SchedulerApp
from scheduler_service.app.demand_forecast import DemandForecastInfo
from scheduler_service.app.forecast import Forecasts
from scheduler_service.app.jobs import KeyInUse
from scheduler_service.batching import GroupCommitter
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.quota import DEFAULT_QUEUE
from scheduler_service.core.registry import ReclaimPreviewer
from scheduler_service.errors import InvalidArgument
from scheduler_service.notify.event_feed import SlowReader
from scheduler_service.notify.notifier import AsyncNotifier
from scheduler_service.records import AdminChange, EventInfo, JobInfo, JobSubmission, QueueSettings

T = TypeVar("T")
log = structlog.get_logger("aryl.api")

ALL_EVENTS = "all events"  # the WatchEvents topic of unfiltered streams

# Converted events kept for WatchEvents streams (the newest; about what a burst of decisions writes).
EVENT_MESSAGES_KEPT = 4096

# ResourceInfo.resource_type of the job named by an ALREADY_EXISTS answer to SubmitJob.
JOB_RESOURCE_TYPE = "aryl.v1.Job"


class _Base:
    def __init__(
        self, app: SchedulerApp, executor: ThreadPoolExecutor, notifier: AsyncNotifier, *,
        stream_limits: StreamLimits | None = None,
    ) -> None:
        self.app = app
        self._executor = executor
        self.notifier = notifier
        # Shared by the services whose watch streams count together (server.max_watch_streams*).
        self.stream_limits = stream_limits or StreamLimits(per_client=64, total=1024)

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        context = contextvars.copy_context()  # the caller (api.auth) goes along: events record it
        return await loop.run_in_executor(self._executor, lambda: context.run(fn, *args, **kwargs))

    async def require_job_owner(self, job_id: int, what: str = "") -> None:
        """PermissionDenied unless the caller owns job ``job_id`` or is an admin (api.auth)."""
        if auth.needs_owner_check():
            record, _ = await self.run(self.app.jobs.get, job_id)
            auth.require_owner(record.user, what or f"job {job_id}")



def event_topics(event: EventInfo) -> tuple[Hashable, ...]:
    """The WatchEvents topics an event wakes (``notify.EventFeed``): every stream's, its job's, its server's."""
    topics: tuple[Hashable, ...] = (ALL_EVENTS,)
    if event.job_id is not None:
        topics += (("job", event.job_id),)
    if event.server_id:
        topics += (("server", event.server_id),)
    return topics


def _stream_topic(job_id: int | None, server_id: str) -> Hashable:
    """The topic a WatchEvents stream waits on: its job's, else its server's, else every event's."""
    if job_id is not None:
        return ("job", job_id)
    return ("server", server_id) if server_id else ALL_EVENTS


async def refuse_stream(context: Any, exc: TooManyStreams) -> None:
    """RESOURCE_EXHAUSTED for a watch stream beyond a limit; the message names the limit and its setting."""
    log.warning("watch stream refused", peer=context.peer(), reason=str(exc))
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc),
                        trailing_metadata=((ANSWERED_BY_KEY, "aryl-scheduler"),))


class _StreamEnd:
    """Ends one stream with a status once, from its own task or from outside (a stream stuck in a send
    to a client that does not read is ended by the event dispatcher)."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self.sent = False

    async def send(self, code: grpc.StatusCode, message: str) -> None:
        if self.sent:
            return
        self.sent = True
        try:
            await self._context.abort(code, message, trailing_metadata=((ANSWERED_BY_KEY, "aryl-scheduler"),))
        except grpc.aio.AbortError:
            pass  # abort raises in its caller; the status went to the client
        except Exception as exc:  # noqa: BLE001 - the call ended meanwhile
            log.debug("stream already over", error=repr(exc))

    def send_soon(self, code: grpc.StatusCode, message: str) -> None:
        asyncio.get_running_loop().create_task(self.send(code, message))


class SchedulerServicer(_Base, scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(
        self, *args: Any, policy_name: str, clock_now: Callable[[], float],
        submissions: GroupCommitter[JobSubmission, JobInfo], policy: ReclaimPreviewer, policy_params: PolicyParams,
        log_reader: AgentLogReader | None = None,
        cancellations: GroupCommitter[tuple[int, str, str], JobInfo] | None = None,
        stream_limits: StreamLimits | None = None, forecasts: Forecasts | None = None,
        allow_loader_env: bool = False, demand_forecast: Callable[[], DemandForecastInfo | None] | None = None,
        gpu_speeds: Mapping[str, float] | None = None,
    ) -> None:
        super().__init__(*args, stream_limits=stream_limits)
        self._gpu_speeds = dict(gpu_speeds or {})  # scheduling.gpu_speeds: Job.type_speeds' bootstrap
        # The inference demand's forecast at the last cycle, over the policy's lead (``app.demand_forecast``).
        self._demand_forecast = demand_forecast
        self._allow_loader_env = allow_loader_env  # security.allow_loader_env: LD_* in a job's env accepted
        self._forecasts = forecasts  # the ETA of each job (Job.eta_*) and WhatIf (``app.forecast``)
        # Each event converted once for all the streams that send it (1,000s may watch): insertion
        # order, the oldest dropped beyond EVENT_MESSAGES_KEPT. Used on the event loop only.
        self._event_messages: dict[int, types_pb2.Event] = {}
        self._logs = log_reader or AgentLogReader(timeout_s=5.0)
        self.policy_name = policy_name
        self._policy = policy
        self._policy_params = policy_params  # the configured policy's (ExplainJob's protection windows)
        self._now = clock_now
        self._submissions = submissions
        self._cancellations = cancellations

    @rpc
    async def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest, context: Any) -> scheduler_pb2.SubmitJobResponse:
        auth.own_spec(request.spec)
        submission = validation.job_submission(request.spec, request.idempotency_key, now=self._now(),
                                               allow_loader_env=self._allow_loader_env)
        # Admission feedback first: with scheduling.deadline_admission = reject, a job that would miss its
        # deadline is refused (FAILED_PRECONDITION) before anything is queued.
        admit = self.app.deadlines.admit  # without a deadline it reads nothing: no thread hop
        admission = admit(submission) if submission.deadline is None else await self.run(admit, submission)
        if auth.caller() is not None:  # batched on another thread: the actor goes with the submission
            submission = dataclasses.replace(submission, submitted_by=auth.actor())
        # If the call is cancelled (deadline, client gone), wrap_future withdraws the submission unless
        # its batch is already committing (then the job is queued: a retry with the same key and spec
        # is answered with it).
        try:
            record = await asyncio.wrap_future(self._submissions.submit(submission))
        except KeyInUse as exc:
            await self._refuse_key_in_use(
                context, exc, owner=submission.user,
                description=f"job {exc.job_id} holds idempotency_key {submission.idempotency_key!r}")
            raise  # not reached: abort raises
        return scheduler_pb2.SubmitJobResponse(job=convert.job(record), **convert.admission_fields(admission))

    @staticmethod
    async def _refuse_key_in_use(context: Any, exc: KeyInUse, *, owner: str, description: str) -> None:
        """ALREADY_EXISTS naming the job holding the key, for programs as well as people: a
        google.rpc.ResourceInfo detail."""
        detail = error_details_pb2.ResourceInfo(
            resource_type=JOB_RESOURCE_TYPE, resource_name=str(exc.job_id), owner=owner, description=description,
        )
        status = status_pb2.Status(code=grpc.StatusCode.ALREADY_EXISTS.value[0], message=str(exc))
        status.details.add().Pack(detail)
        await context.abort(grpc.StatusCode.ALREADY_EXISTS, str(exc), trailing_metadata=(
            (ANSWERED_BY_KEY, "aryl-scheduler"), ("grpc-status-details-bin", status.SerializeToString())))

    @rpc
    async def SubmitJobs(
        self, request: scheduler_pb2.SubmitJobsRequest, context: Any
    ) -> scheduler_pb2.SubmitJobsResponse:
        now = self._now()
        view = validation.submitted_jobs_view(request.view)
        show = convert.job_ids_view if view == scheduler_pb2.SUBMITTED_JOBS_VIEW_IDS else convert.job_summary

        def answer() -> scheduler_pb2.SubmitJobsResponse:
            # In a worker thread: checking 10,000 specs must not stall the event loop. One transaction
            # for the whole call (not the group committer: all or none, whatever else is submitted).
            for i, job in enumerate(request.jobs):
                auth.own_spec(job.spec, f"jobs[{i}].spec")
            subs = validation.job_submissions(request.jobs, request.array_indices, now=now,
                                              allow_loader_env=self._allow_loader_env)
            records = self.app.jobs.submit_batch(subs, array=bool(request.array_indices))
            return scheduler_pb2.SubmitJobsResponse(jobs=[show(r) for r in records])

        try:
            return await self.run(answer)
        except KeyInUse as exc:
            await self._refuse_key_in_use(context, exc, owner="", description=str(exc))
            raise  # not reached: abort raises

    @rpc
    async def CancelJobArray(
        self, request: scheduler_pb2.CancelJobArrayRequest, context: Any
    ) -> scheduler_pb2.CancelJobArrayResponse:
        array_job_id = validation.job_id("array_job_id", request.array_job_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        await self.require_job_owner(array_job_id, f"job array {array_job_id}")
        cancelled = await self.run(self.app.jobs.cancel_array, array_job_id, reason)
        return scheduler_pb2.CancelJobArrayResponse(cancelled_job_ids=[str(job.id) for job in cancelled])

    @rpc
    async def GetJob(self, request: scheduler_pb2.GetJobRequest, context: Any) -> scheduler_pb2.GetJobResponse:
        job_id = validation.job_id("job_id", request.job_id)

        def answer() -> scheduler_pb2.GetJobResponse:
            record, events = self.app.jobs.get(job_id, include_events=request.include_events)
            auth.require_owner(record.user, f"job {job_id}")
            outlook = self.app.deadlines.outlooks([record])[record.id]
            shown = convert.job(record, outlook, gpu_speeds=self._gpu_speeds)
            return scheduler_pb2.GetJobResponse(job=add_eta(shown, record, self._forecasts),
                                                events=[convert.event(e) for e in events])

        return await self.run(answer)

    @rpc
    async def ListJobs(self, request: scheduler_pb2.ListJobsRequest, context: Any) -> scheduler_pb2.ListJobsResponse:
        flt = validation.job_filter(request.states, request.user, request.queue)
        token = validation.text("page_token", request.page_token, max_len=256)

        def answer() -> scheduler_pb2.ListJobsResponse:
            # Converted in the worker thread: building 100s of messages must not stall the event loop.
            records, next_token = self.app.jobs.page(flt, page_size=request.page_size, page_token=token)
            # The list view (no environment, a command prefix): GetJob has the whole spec.
            outlooks = self.app.deadlines.outlooks(records)
            jobs = [add_eta(convert.job_summary(r, outlooks[r.id]), r, self._forecasts) for r in records]
            return scheduler_pb2.ListJobsResponse(jobs=jobs, next_page_token=next_token)

        return await self.run(answer)

    @rpc
    async def CancelJob(self, request: scheduler_pb2.CancelJobRequest, context: Any) -> scheduler_pb2.CancelJobResponse:
        job_id = validation.job_id("job_id", request.job_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        await self.require_job_owner(job_id)
        actor = auth.actor() if auth.caller() is not None else ""  # the event names who cancelled
        if self._cancellations is None:
            record = await self.run(self.app.jobs.cancel, job_id, reason, actor)
        else:  # concurrent cancels share one transaction; a call cancelled first is withdrawn as above
            record = await asyncio.wrap_future(self._cancellations.submit((job_id, reason, actor)))
        return scheduler_pb2.CancelJobResponse(job=convert.job(record))

    @rpc
    async def WatchEvents(
        self, request: scheduler_pb2.WatchEventsRequest, context: Any
    ) -> AsyncIterator[types_pb2.Event]:
        job_id = validation.job_id("job_id", request.job_id) if request.job_id else None
        server_id = validation.server_id("server_id", request.server_id, required=False)
        if request.HasField("after_event_id"):
            if request.after_event_id < 0:
                raise InvalidArgument("after_event_id", f"must be >= 0 (got {request.after_event_id})")
            after: int | None = request.after_event_id
        else:
            after = None  # from now on
        if job_id is not None:
            await self.require_job_owner(job_id)
        feed = self.notifier.event_log
        assert feed is not None, "the service serves the event log before streams"

        def match(event: EventInfo) -> bool:
            return (job_id is None or event.job_id == job_id) and (not server_id or event.server_id == server_id)

        async def catch_up(after_id: int, upto: int, limit: int) -> list[EventInfo]:
            return await self.run(
                self.app.views.events_after, after_id, job_id=job_id, server_id=server_id, limit=limit, upto=upto
            )

        end = _StreamEnd(context)

        def too_slow(why: str) -> None:  # from the dispatcher: this stream may be stuck in a send
            log.warning("slow event stream ended", peer=context.peer(), reason=why)
            end.send_soon(grpc.StatusCode.RESOURCE_EXHAUSTED, why)

        # The stream's topic alone decides what it gets unless it filters by job and server both.
        exact = match if job_id is not None and server_id else None
        try:
            with self.stream_limits.admit(context.peer(), auth.principal()):
                topic = _stream_topic(job_id, server_id)
                # Everything queued since the last wake-up is written here, each event converted once for
                # every stream (``_event_message``): no item passes through the wrappers' async generators
                # (``status.rpc``, ``leader_gate``: a task per item), which cost about as much as the send.
                # A term's end still ends the stream: leader_gate cancels this generator mid-write.
                async for rows in feed.watch_batches(after, topic=topic, match=exact, catch_up=catch_up,
                                                     on_overflow=too_slow):
                    for row in rows:
                        if end.sent:
                            return
                        await context.write(self._event_message(row))
        except TooManyStreams as exc:
            await refuse_stream(context, exc)
        except SlowReader as exc:
            await end.send(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return
        yield  # never reached: an async generator, as the wrappers of a server-streaming method expect

    def _event_message(self, row: EventInfo) -> types_pb2.Event:
        message = self._event_messages.get(row.id)
        if message is None:
            message = self._event_messages[row.id] = convert.event(row)
            if len(self._event_messages) > EVENT_MESSAGES_KEPT:
                del self._event_messages[next(iter(self._event_messages))]
        return message

    @rpc
    async def GetCluster(
        self, request: scheduler_pb2.GetClusterRequest, context: Any
    ) -> scheduler_pb2.GetClusterResponse:
        summary = await self.run(self.app.views.summary)
        response = convert.cluster(summary, policy=self.policy_name, epoch=self.app.term.epoch)
        response.queues.extend(convert.queue(s) for s in await self.run(self.app.queues.all))
        return response

    @rpc
    async def ListServers(
        self, request: scheduler_pb2.ListServersRequest, context: Any
    ) -> scheduler_pb2.ListServersResponse:
        pool = validation.pool("pool", request.pool, required=False)
        return await self.run(
            lambda: scheduler_pb2.ListServersResponse(servers=[convert.server(r) for r in self.app.views.servers(pool)])
        )

    @rpc
    async def ListLoans(self, request: scheduler_pb2.ListLoansRequest, context: Any) -> scheduler_pb2.ListLoansResponse:
        loans = await self.run(self.app.views.loans, request.include_returned)
        note = await self.run(self.app.views.loan_note)
        forecast = await self.run(self._demand_forecast) if self._demand_forecast is not None else None
        return scheduler_pb2.ListLoansResponse(
            loans=[convert.loan(row) for row in loans], not_loaned=note.summary if note is not None else "",
            not_loaned_since=convert.timestamp(note.since) if note is not None else None,
            demand_forecast=convert.demand_forecast(forecast),
        )

    @rpc
    async def ExplainJob(
        self, request: scheduler_pb2.ExplainJobRequest, context: Any
    ) -> scheduler_pb2.ExplainJobResponse:
        job_id = validation.job_id("job_id", request.job_id)
        await self.require_job_owner(job_id)
        # Its anti-thrashing window (core.protection) by the configured policy's parameters, judged now.
        explained = await self.run(self.app.explainer.explain, job_id, now=self._now(), params=self._policy_params)
        job = add_eta(convert.job(explained.job, explained.outlook, gpu_speeds=self._gpu_speeds), explained.job,
                      self._forecasts)
        return convert.explanation(explained, job)


    @rpc
    async def WhatIf(self, request: scheduler_pb2.WhatIfRequest, context: Any) -> scheduler_pb2.WhatIfResponse:
        if self._forecasts is None:
            raise InvalidArgument("policy", "this scheduler makes no forecasts")
        forecasts = self._forecasts
        policy = validation.text("policy", request.policy, max_len=64)
        result = await self.run(forecasts.what_if, policy, dict(request.params), request.inference_servers,
                                request.horizon_hours * 3600.0)
        return what_if_response(result, forecasts.params)

    @rpc
    async def PreviewReclaim(
        self, request: scheduler_pb2.PreviewReclaimRequest, context: Any
    ) -> scheduler_pb2.PreviewReclaimResponse:
        if not 1 <= request.servers <= 100_000:
            raise InvalidArgument("servers", f"must be between 1 and 100000 (got {request.servers})")
        decision, loaned = await self.run(self.app.inference.preview_reclaim, request.servers, self._policy)
        return scheduler_pb2.PreviewReclaimResponse(
            server_ids=decision.servers,
            preempted_job_ids=[str(j) for j in decision.preempted],
            scaled_in=[
                scheduler_pb2.ScaleInPreview(job_id=str(j), workers_before=before, workers_after=after)
                for j, before, after in decision.scaled_in
            ],
            cost_gpu_seconds=decision.cost_gpu_s,
            loaned_servers=loaned,
        )


    @rpc
    async def GetJobLogs(
        self, request: scheduler_pb2.GetJobLogsRequest, context: Any
    ) -> scheduler_pb2.GetJobLogsResponse:
        job_id = validation.job_id("job_id", request.job_id)
        await self.require_job_owner(job_id)
        server_id, address = await self.run(self.app.jobs.log_source, job_id, request.rank)
        chunk = await self._logs.read(server_id, address, job_id, request.rank, request.offset, request.max_bytes)
        return scheduler_pb2.GetJobLogsResponse(
            data=chunk.data, offset=chunk.offset, next_offset=chunk.next_offset, size=chunk.size, server_id=server_id
        )


    # -- servers an operator takes out (arylctl servers cordon|uncordon|drain|delete) ----------------

    @rpc
    async def CordonServer(
        self, request: scheduler_pb2.CordonServerRequest, context: Any
    ) -> scheduler_pb2.ServerAdminResponse:
        server_id = validation.server_id("server_id", request.server_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        return await self.run(self._admin_answer, lambda: self.app.server_admin.cordon(server_id, reason))

    @rpc
    async def UncordonServer(
        self, request: scheduler_pb2.UncordonServerRequest, context: Any
    ) -> scheduler_pb2.ServerAdminResponse:
        server_id = validation.server_id("server_id", request.server_id)
        return await self.run(self._admin_answer, lambda: self.app.server_admin.uncordon(server_id))

    @rpc
    async def DrainServer(
        self, request: scheduler_pb2.DrainServerRequest, context: Any
    ) -> scheduler_pb2.ServerAdminResponse:
        server_id = validation.server_id("server_id", request.server_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        timeout_s = validation.finite("timeout_seconds", request.timeout_seconds)
        return await self.run(self._admin_answer, lambda: self.app.server_admin.drain(
            server_id, reason, timeout_s=timeout_s, force=request.force))

    @rpc
    async def DeleteServer(
        self, request: scheduler_pb2.DeleteServerRequest, context: Any
    ) -> scheduler_pb2.DeleteServerResponse:
        server_id = validation.server_id("server_id", request.server_id)

        def answer() -> scheduler_pb2.DeleteServerResponse:
            before = self.app.server_admin.server(server_id)
            change = self.app.server_admin.delete(server_id, force=request.force)
            now = self.app.server_admin.server(server_id) if not change.deleted else before
            return scheduler_pb2.DeleteServerResponse(
                deleted=change.deleted, message=change.message,
                server=convert.server(now) if now is not None else None,
            )

        return await self.run(answer)

    # Queues: admin-only (not listed in ``auth.METHOD_ROLES``, so only admins may call them).

    @rpc
    async def CreateQueue(self, request: scheduler_pb2.CreateQueueRequest, context: Any) -> scheduler_pb2.QueueResponse:
        q = request.queue
        settings = QueueSettings(
            name=validation.queue_name("queue.name", q.name),
            quota_gpus=validation.gpu_count("queue.quota_gpus", q.quota_gpus),
            borrow_limit_gpus=(validation.gpu_count("queue.borrow_limit_gpus", q.borrow_limit_gpus)
                               if q.HasField("borrow_limit_gpus") else None),
            cohort=validation.cohort_name("queue.cohort", q.cohort), fair_share=q.fair_share,
        )
        return await self.run(
            lambda: scheduler_pb2.QueueResponse(queue=convert.queue(self.app.queues.create(settings))))

    @rpc
    async def UpdateQueue(self, request: scheduler_pb2.UpdateQueueRequest, context: Any) -> scheduler_pb2.QueueResponse:
        name = validation.queue_name("name", request.name)
        change: dict[str, object] = {}
        if request.HasField("cohort"):
            change["cohort"] = validation.cohort_name("cohort", request.cohort)
        if request.HasField("quota_gpus"):
            change["quota_gpus"] = validation.gpu_count("quota_gpus", request.quota_gpus)
        if request.quota_rest:
            if name != DEFAULT_QUEUE:
                raise InvalidArgument("quota_rest", f'only "default" may have the rest as its quota, not {name!r}')
            if "quota_gpus" in change:
                raise InvalidArgument("quota_rest", "contradicts quota_gpus: give one of them")
            change["quota_gpus"] = None  # the rest (``core.quota``)
        if request.HasField("borrow_limit_gpus") and request.unlimited_borrowing:
            raise InvalidArgument("unlimited_borrowing", "contradicts borrow_limit_gpus: give one of them")
        if request.HasField("borrow_limit_gpus"):
            change["borrow_limit_gpus"] = validation.gpu_count("borrow_limit_gpus", request.borrow_limit_gpus)
        if request.unlimited_borrowing:
            change["borrow_limit_gpus"] = None
        if request.HasField("fair_share"):
            change["fair_share"] = request.fair_share
        return await self.run(
            lambda: scheduler_pb2.QueueResponse(queue=convert.queue(self.app.queues.update(name, change))))

    @rpc
    async def DeleteQueue(
        self, request: scheduler_pb2.DeleteQueueRequest, context: Any
    ) -> scheduler_pb2.DeleteQueueResponse:
        name = validation.queue_name("name", request.name)
        await self.run(self.app.queues.delete, name)
        return scheduler_pb2.DeleteQueueResponse()

    @rpc
    async def ListQueues(
        self, request: scheduler_pb2.ListQueuesRequest, context: Any
    ) -> scheduler_pb2.ListQueuesResponse:
        return await self.run(
            lambda: scheduler_pb2.ListQueuesResponse(queues=[convert.queue(s) for s in self.app.queues.all()]))

    def _admin_answer(self, change: Callable[[], AdminChange]) -> scheduler_pb2.ServerAdminResponse:
        done = change()
        server = self.app.server_admin.server(done.server_id)
        return scheduler_pb2.ServerAdminResponse(
            server=convert.server(server) if server is not None else None, message=done.message)


class AgentServicer(_Base, agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self, *args: Any, report_interval_s: float, grace_period_s: float, desired_state_refresh_s: float = 30.0,
        endpoint_allow: Sequence[str] = (),
    ) -> None:
        super().__init__(*args)
        self._endpoint_allow = tuple(endpoint_allow)  # [inference] endpoint_allow (api.validation)
        self._report_interval = report_interval_s
        self._refresh_s = desired_state_refresh_s
        self._grace = grace_period_s

    @rpc
    async def RegisterServer(
        self, request: agent_pb2.RegisterServerRequest, context: Any
    ) -> agent_pb2.RegisterServerResponse:
        registration = validation.registration(request)
        auth.require_server(registration.hostname)
        validation.allowed_endpoint(registration, self._endpoint_allow, context.peer())
        desired = await self.run(self.app.agents.register, registration)
        log.info("server registered", server=desired.server_id, pool=registration.pool, gpus=len(registration.gpus))
        return agent_pb2.RegisterServerResponse(
            server_id=desired.server_id, scheduler_epoch=desired.epoch,
            report_interval=convert.duration(self._report_interval),
            desired=convert.desired_state(desired, grace_period_s=self._grace),
        )

    @rpc
    async def ReportStatus(
        self, request: agent_pb2.ReportStatusRequest, context: Any
    ) -> agent_pb2.ReportStatusResponse:
        report = validation.status_report(request)
        auth.require_server(report.server_id)
        # Most reports say nothing new and are answered from memory, here on the loop: a thread hop
        # per report would cost more than the answer (1,000s of agents report every few seconds).
        generation = self.app.agents.answer_from_memory(report)
        if generation is None:
            generation = await self.run(self.app.agents.report_status, report)
        return agent_pb2.ReportStatusResponse(
            desired_generation=generation, report_interval=convert.duration(self._report_interval)
        )

    @rpc
    async def Deregister(self, request: agent_pb2.DeregisterRequest, context: Any) -> agent_pb2.DeregisterResponse:
        server_id = validation.server_id("server_id", request.server_id)
        reason = validation.text("reason", request.reason, max_len=1024)
        auth.require_server(server_id)
        await self.run(self.app.agents.deregister, server_id, reason)
        log.info("server deregistered: its agent left", server=server_id, reason=reason)
        return agent_pb2.DeregisterResponse()

    @rpc
    async def WatchDesiredState(
        self, request: agent_pb2.WatchDesiredStateRequest, context: Any
    ) -> AsyncIterator[agent_pb2.DesiredState]:
        server_id = validation.server_id("server_id", request.server_id)
        auth.require_server(server_id)
        assert self.notifier.desired_states is not None, "the service serves desired states before agents"
        async for desired in self.notifier.desired_states.watch(server_id, refresh_s=self._refresh_s):
            yield convert.desired_state(desired, grace_period_s=self._grace)


class InferenceServicer(_Base, inference_pb2_grpc.InferenceServiceServicer):
    @rpc
    async def ReportDemand(
        self, request: inference_pb2.ReportDemandRequest, context: Any
    ) -> inference_pb2.ReportDemandResponse:
        # More than the inference pool's servers: InvalidArgument from the store, which counts them.
        rps = validation.finite("observed_rps", request.observed_rps)
        source = auth.require_router() or validation.text("source", request.source, max_len=253) or context.peer()[:253]
        report, serving, loaned = await self.run(self.app.inference.report_demand, request.servers_needed, rps, source)
        return inference_pb2.ReportDemandResponse(
            demand=convert.demand(report), servers_serving=serving, servers_loaned=loaned
        )

    @rpc
    async def GetDemand(self, request: inference_pb2.GetDemandRequest, context: Any) -> inference_pb2.GetDemandResponse:
        return inference_pb2.GetDemandResponse(demand=convert.demand(await self.run(self.app.inference.latest_demand)))

    @rpc
    async def WatchServingPool(
        self, request: inference_pb2.WatchServingPoolRequest, context: Any
    ) -> AsyncIterator[inference_pb2.ServingPool]:
        source = auth.require_router() or validation.text("source", request.source, max_len=253) or context.peer()[:253]
        pool = self.notifier.serving_pool
        assert pool is not None, "the service serves the serving pool before streams"
        try:
            with self.stream_limits.admit(context.peer(), auth.principal()):
                log.info("serving pool watched", source=source)
                # One shared read per change (every server state change appends an event), yielded when
                # the servers changed.
                async for version, servers in pool.watch():
                    yield inference_pb2.ServingPool(
                        version=version,
                        servers=[
                            inference_pb2.RoutableServer(
                                server_id=sid, endpoint=endpoint, state=convert.server_state(state)
                            )
                            for sid, endpoint, state in servers
                        ],
                    )
        except TooManyStreams as exc:
            await refuse_stream(context, exc)

    @rpc
    async def ReportDrained(
        self, request: inference_pb2.ReportDrainedRequest, context: Any
    ) -> inference_pb2.ReportDrainedResponse:
        server_id = validation.server_id("server_id", request.server_id)
        source = auth.require_router() or validation.text("source", request.source, max_len=253) or context.peer()[:253]
        state = await self.run(self.app.inference.report_drained, server_id, source)
        return inference_pb2.ReportDrainedResponse(state=convert.server_state(state))

