"""The user-facing SchedulerService: jobs (submit, get, list, cancel, arrays), the event stream, the
cluster's views (servers, loans), explanations, forecasts (what-if, reclaim previews) and job logs.

Its operators' RPCs (servers taken out, queues) are ``operator_rpcs``'s. Streams wait on in-process
fan-outs fed after commits (``scheduler_service.notify``): one read per change serves every
WatchEvents stream, so an idle stream costs no database work and holds no thread (the server is
asyncio). Watch streams are counted per principal, per role and in all (``stream_limits``); an event
stream that falls its buffer behind is ended (RESOURCE_EXHAUSTED), and every stream whose caller's
token is revoked, or whose client certificate expires, is ended by ``auth`` (UNAUTHENTICATED).
What this module must never do: hold SQL or decide (it validates, calls ``app`` and converts).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any

import grpc
import structlog
from google.rpc import error_details_pb2, status_pb2

from protos.aryl.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.api import auth, convert, job_validation, validation
from scheduler_service.api.agent_logs import AgentLogReader
from scheduler_service.api.forecast import add_eta, what_if_response
from scheduler_service.api.operator_rpcs import OperatorRpcs
from scheduler_service.api.servicer_base import refuse_stream
from scheduler_service.api.status import ANSWERED_BY_KEY, rpc
from scheduler_service.api.stream_limits import StreamLimits, TooManyStreams
from scheduler_service.app.demand_forecast import DemandForecastInfo
from scheduler_service.app.forecast import Forecasts
from scheduler_service.app.jobs import KeyInUse
from scheduler_service.app.replicas import Replicas
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.registry import ReclaimPreviewer
from scheduler_service.errors import InvalidArgument
from scheduler_service.group_commit import GroupCommitter
from scheduler_service.notify.event_feed import SlowReader
from scheduler_service.records import EventInfo, JobInfo, JobSubmission

log = structlog.get_logger("aryl.api")

ALL_EVENTS = "all events"  # the WatchEvents topic of unfiltered streams

# Converted events kept for WatchEvents streams (the newest; about what a burst of decisions writes).
EVENT_MESSAGES_KEPT = 4096

# ResourceInfo.resource_type of the job named by an ALREADY_EXISTS answer to SubmitJob.
JOB_RESOURCE_TYPE = "aryl.v1.Job"


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


class SchedulerServicer(OperatorRpcs, scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(
        self, *args: Any, policy_name: str, clock_now: Callable[[], float],
        submissions: GroupCommitter[JobSubmission, JobInfo], policy: ReclaimPreviewer, policy_params: PolicyParams,
        log_reader: AgentLogReader | None = None,
        cancellations: GroupCommitter[tuple[int, str, str], JobInfo] | None = None,
        stream_limits: StreamLimits | None = None, forecasts: Forecasts | None = None,
        allow_loader_env: bool = False, demand_forecast: Callable[[], DemandForecastInfo | None] | None = None,
        gpu_speeds: Mapping[str, float] | None = None,
        replicas: Replicas | None = None,
    ) -> None:
        super().__init__(*args, stream_limits=stream_limits)
        self._replicas = replicas  # PostgreSQL: the registry of replicas as last read (GetCluster shows it)
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
        submission = job_validation.job_submission(request.spec, request.idempotency_key, now=self._now(),
                                               allow_loader_env=self._allow_loader_env)
        # Admission feedback first: with scheduling.deadline_admission = reject, a job that would miss its
        # deadline is refused (FAILED_PRECONDITION) before anything is queued.
        admit = self.app.deadlines.admit  # without a deadline it reads nothing: no thread hop
        admission = admit(submission) if submission.deadline is None else await self.run(admit, submission)
        if auth.caller() is not None:  # committed on another thread: the actor goes with the submission
            submission = dataclasses.replace(submission, submitted_by=auth.actor())
        # If the call is cancelled (deadline, client gone), its submission is withdrawn unless its group
        # is already committing (then the job is queued: a retry with the same key and spec is answered
        # with it).
        try:
            record = await self._submissions.submit_on_loop(submission)
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
        view = job_validation.submitted_jobs_view(request.view)
        show = convert.job_ids_view if view == scheduler_pb2.SUBMITTED_JOBS_VIEW_IDS else convert.job_summary

        def answer() -> scheduler_pb2.SubmitJobsResponse:
            # In a worker thread: checking 10,000 specs must not stall the event loop. One transaction
            # for the whole call (not the group committer: all or none, whatever else is submitted).
            for i, job in enumerate(request.jobs):
                auth.own_spec(job.spec, f"jobs[{i}].spec")
            subs = job_validation.job_submissions(request.jobs, request.array_indices, now=now,
                                              allow_loader_env=self._allow_loader_env)
            records = self.app.jobs.submit_all_or_none(subs, array=bool(request.array_indices))
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
        flt = job_validation.job_filter(request.states, request.user, request.queue)
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
            record = await self._cancellations.submit_on_loop((job_id, reason, actor))
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
                async for rows in feed.watch_chunks(after, topic=topic, match=exact, catch_up=catch_up,
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
        if self._replicas is not None:
            me = self._replicas.me
            response.replicas.extend(convert.scheduler_replica(r, live=live, leader=r.address == me)
                                     for r, live in self._replicas.known())
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
