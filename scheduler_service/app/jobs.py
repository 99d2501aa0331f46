"""Jobs: submit (one, a group commit of concurrent calls, or several all or none such as a job array),
cancel (one, a group commit, or a whole array), get, list a page, explain, and find a rank's logs.

Each call is one transaction; the agents of servers whose workers a cancel stopped, the event log
and the cycle are told after commit.

Never: decide placement (the policy does), or hold SQL (the store does).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence

from sqlalchemy.orm import Session

from scheduler_service.app.notices import Announcer
from scheduler_service.app.queues import Queues
from scheduler_service.core.clock import Clock
from scheduler_service.core.fit import never_fits
from scheduler_service.errors import AlreadyExists, FailedPrecondition, InvalidArgument, KeyTaken, NotFound
from scheduler_service.kill_points import kill_point
from scheduler_service.lifecycle import JobState
from scheduler_service.records import EventInfo, Explanation, JobFilter, JobInfo, JobSubmission
from scheduler_service.store.jobs import JobStore
from scheduler_service.store.transactions import Transactions

MAX_PAGE_SIZE = 1000

# The spec of a job as submitted: a resubmission with the same key must match it on each of these.
_SPEC_FIELDS = ("name", "user", "queue", "command", "env", "gpus_per_worker", "min_workers", "max_workers",
                "priority", "deadline", "throughput", "max_runtime_s", "restart_policy", "max_restarts",
                "working_dir", "working_dir_if_exists", "array_index", "priority_class", "gpu_types")


class KeyInUse(AlreadyExists):
    """The user's idempotency key names a job with a different spec; ``job_id`` is that job."""

    def __init__(self, job_id: int, message: str) -> None:
        super().__init__(message)
        self.job_id = job_id

DEFAULT_PAGE_SIZE = 100


class Jobs:
    def __init__(self, db: Transactions, store: JobStore, clock: Clock, notices: Announcer, *,
                 queues: Queues | None = None) -> None:
        self.queues = queues  # checks each submission's queue and priority class (None: not checked)
        self._db = db
        self._store = store
        self._clock = clock
        self._notices = notices

    def submit(self, sub: JobSubmission) -> JobInfo:
        [result] = self.submit_many([sub])
        if isinstance(result, Exception):
            raise result
        return result

    def submit_many(self, subs: Sequence[JobSubmission]) -> list[JobInfo | AlreadyExists | FailedPrecondition]:
        if self.queues is not None:  # an unknown queue or priority class is refused alone
            subs, wrong = self.queues.admit(subs)
            if wrong:
                rest = [sub for i, sub in enumerate(subs) if i not in wrong]
                answers = iter(self._submit_many(rest) if rest else [])
                return [wrong[i] if i in wrong else next(answers) for i in range(len(subs))]  # type: ignore[misc]
        return self._submit_many(subs)

    def _submit_many(self, subs: Sequence[JobSubmission]) -> list[JobInfo | AlreadyExists | FailedPrecondition]:
        """Queue several jobs in one transaction (the API's group commit of concurrent SubmitJob calls,
        ``scheduler_service.group_commit``). A submission whose user has used its idempotency key before
        is answered by itself alone: with that job when the spec is the same (a retry), else ``KeyInUse``.
        One whose gang can never fit the registered servers is refused alone (``never_fits``)."""
        now = self._clock.now()

        def insert(session: Session) -> tuple[dict[int, FailedPrecondition], list[JobInfo]]:
            # The fit check reads the servers in the insert's own transaction: one round of the
            # database per group, not two.
            refused = self._never_fit(subs, self._store.server_gpu_counts(session))
            fitting = [sub for i, sub in enumerate(subs) if i not in refused] if refused else subs
            return refused, self._store.insert(session, fitting, now) if fitting else []

        try:
            refused, jobs = self._db.write(insert)
        except KeyTaken as exc:
            if len(subs) == 1:
                return [self._resubmission(subs[0], exc)]
            # Some key collided: retry one by one so only the resubmissions are answered apart.
            return [r for sub in subs for r in self.submit_many([sub])]
        if jobs:
            kill_point("submit.committed")
            self._notices.jobs_queued()
        if not refused:
            return list(jobs)
        inserted = iter(jobs)
        return [refused[i] if i in refused else next(inserted) for i in range(len(subs))]

    def submit_all_or_none(self, subs: Sequence[JobSubmission], *, array: bool = False) -> list[JobInfo]:
        """Queue all of ``subs`` in one transaction, or none (``SubmitJobs``); with ``array`` the jobs
        queued form one job array. A submission whose user used its idempotency key before with the
        same spec is answered with that job and queues nothing (a retry of a call whose answer was
        lost); one whose key holds a different spec refuses them all (``KeyInUse``), as does
        one whose gang can never fit (``FailedPrecondition``); each refusal names ``jobs[i]``."""
        if self.queues is not None:
            subs, wrong = self.queues.admit(subs)
            if wrong:
                i, why = min(wrong), wrong[min(wrong)]
                if isinstance(why, InvalidArgument):
                    raise InvalidArgument(f"jobs[{i}].{why.field}", f"{why.reason}; nothing was queued")
                raise NotFound(f"jobs[{i}]: {why}; nothing was queued")
        refused = self._never_fit(subs)
        if refused:
            i = min(refused)
            raise FailedPrecondition(f"jobs[{i}]: {refused[i]}; nothing was queued")
        keys = [(sub.user, sub.idempotency_key) for sub in subs if sub.idempotency_key]
        for attempt in (1, 2):
            held = self._db.read(lambda session: self._store.by_keys(session, keys)) if keys else {}
            answers: list[JobInfo | None] = []
            for i, sub in enumerate(subs):
                job = held.get((sub.user, sub.idempotency_key)) if sub.idempotency_key else None
                if job is not None and not _same_spec(sub, job):
                    raise KeyInUse(job.id, f"jobs[{i}]: idempotency_key {sub.idempotency_key!r} of user {sub.user!r} "
                                           f"was already used by job {job.id} with a different spec; nothing was "
                                           "queued: submit it with another key")
                answers.append(job)
            new = [sub for sub, job in zip(subs, answers, strict=True) if job is None]
            try:
                inserted = iter(self._insert(new, array=array) if new else ())
            except KeyTaken:
                if attempt == 2:
                    raise
                continue  # a concurrent call took one of the keys between the read and the insert: read again
            if new:
                kill_point("submit.committed")
                self._notices.jobs_queued()
            return [job if job is not None else next(inserted) for job in answers]
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _insert(self, subs: Sequence[JobSubmission], *, array: bool) -> list[JobInfo]:
        now = self._clock.now()
        return self._db.write(lambda session: self._store.insert(session, subs, now, array=array))

    def _never_fit(self, subs: Sequence[JobSubmission],
                   server_gpus: Sequence[int] | None = None) -> dict[int, FailedPrecondition]:
        """The submissions (by index) whose gang could not fit even if every registered server -- training
        or inference, in any state -- were free (``core.fit``); ``server_gpus``: the servers' GPU counts
        (read here when not given). With no server registered yet nothing is refused: a cluster still
        starting (agents registering) is not known, and the job waits."""
        if server_gpus is None:
            server_gpus = self._db.read(self._store.server_gpu_counts)
        refused = {}
        for i, sub in enumerate(subs):
            why = never_fits(sub.gpus_per_worker, sub.min_workers, server_gpus, servers="training + inference servers")
            if why is not None:
                refused[i] = FailedPrecondition(
                    f"job {sub.name!r} can never run on this cluster: {why}; lower gpus_per_worker or min_workers, "
                    "or register larger servers first")
        return refused

    def _resubmission(self, sub: JobSubmission, exc: KeyTaken) -> JobInfo | AlreadyExists:
        """The answer to ``sub`` when its insert repeated an idempotency key: the job its user submitted with
        its key, when the specs are the same (a client that could not tell whether its first try
        landed retries with the same key), else ``KeyInUse`` naming that job."""
        key = sub.idempotency_key
        existing = self._db.read(lambda session: self._store.by_key(session, sub.user, key)) if key else None
        if existing is None:
            raise exc  # the job holding the key is gone since: let it surface
        if _same_spec(sub, existing):
            return existing
        return KeyInUse(existing.id, f"idempotency_key {key!r} of user {sub.user!r} was already used by job "
                                     f"{existing.id} with a different spec; submit with another key to queue a new job")

    def get(self, job_id: int, *, include_events: bool = False) -> tuple[JobInfo, tuple[EventInfo, ...]]:
        return self._db.read(lambda session: self._store.get(session, job_id, include_events=include_events))

    def page(self, flt: JobFilter, *, page_size: int = 0, page_token: str = "") -> tuple[list[JobInfo], str]:
        """One page of the jobs matching ``flt``, newest first, and the token of the next page ("" at
        the end)."""
        size = page_size or DEFAULT_PAGE_SIZE
        if size > MAX_PAGE_SIZE:
            raise InvalidArgument("page_size", f"must be at most {MAX_PAGE_SIZE} (got {size})")
        before = _decode_page_token(page_token, flt) if page_token else None
        jobs, more = self._db.read(lambda session: self._store.page(session, flt, size=size, before=before))
        return jobs, _encode_page_token(jobs[-1].id, flt) if more else ""

    def cancel(self, job_id: int, reason: str, actor: str = "") -> JobInfo:
        result = self.cancel_many([(job_id, reason, actor)])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def cancel_many(self, requests: Sequence[tuple[int, str, str]]) -> list[JobInfo | NotFound | FailedPrecondition]:
        """Cancel several jobs, each ``(job id, reason, actor)``, in one transaction (group commit: the API
        gathers concurrent CancelJob calls; each event names its own caller). A job that does not exist or
        has already ended fails only its own request; the same job twice is cancelled once and the second
        request is refused."""
        results, touched = self._db.write(lambda session: self._store.cancel(session, requests))
        if any(isinstance(r, JobInfo) for r in results):
            self._notices.servers_changed(touched)
        return results

    def cancel_array(self, array_job_id: int, reason: str) -> list[JobInfo]:
        """Cancel every job of the array that has not ended (one transaction); the jobs cancelled.
        ``NotFound`` when no job has that array id."""
        active, exists = self._db.read(lambda session: self._store.active_in_array(session, array_job_id))
        if not exists:
            raise NotFound(f"job array {array_job_id} not found (an array's id is the job id of its first job)")
        results = self.cancel_many([(job_id, reason, "") for job_id in active]) if active else []
        # A job that ended meanwhile is refused alone (FailedPrecondition): it is not cancelled, and not an error.
        return [r for r in results if isinstance(r, JobInfo)]

    def explain(self, job_id: int) -> Explanation:
        """The job, a summary, and one entry per decision. The event log records a resize as RUNNING ->
        SCALING -> RUNNING and a preemption as RUNNING -> PREEMPTED -> PENDING, both steps with the
        decision's reason; the listing shows the second step only (its message is the complete one).
        ``GetJob(include_events)`` and the event stream keep both."""
        job, events = self.get(job_id, include_events=True)
        decisions = tuple(e for e in events if e.reason)
        return Explanation(job, _summarize(job, decisions), _one_per_decision(decisions))

    def log_source(self, job_id: int, rank: int) -> tuple[str, str]:
        """(server id, agent logs address) of where ``rank`` of the job ran most recently."""
        return self._db.read(lambda session: self._store.log_source(session, job_id, rank))


def _same_spec(sub: JobSubmission, job: JobInfo) -> bool:
    # Compared as stored: JSON columns read back as lists and plain dicts, never tuples.
    def stored(value: object) -> object:
        return json.loads(json.dumps(value))

    return (all(stored(getattr(sub, f)) == stored(getattr(job, f)) for f in _SPEC_FIELDS)
            and sub.batch_limits == job.batch_limits)


def _encode_page_token(last_id: int, flt: JobFilter) -> str:
    return base64.urlsafe_b64encode(f"v1:{last_id}:{flt.digest()}".encode()).decode()


def _decode_page_token(token: str, flt: JobFilter) -> int:
    try:
        version, last_id, digest = base64.urlsafe_b64decode(token.encode()).decode().split(":")
        before = int(last_id)
    except (ValueError, UnicodeDecodeError):
        raise InvalidArgument("page_token", "is not a token returned by ListJobs") from None
    if version != "v1" or digest != flt.digest():
        raise InvalidArgument("page_token", "was issued for a different filter; start again without it")
    if not 0 < before <= 2**63 - 1:
        raise InvalidArgument("page_token", "is not a token returned by ListJobs")
    return before


# States a job passes through within the one transaction that applies a decision.
_PASSING_STATES = (JobState.SCALING, JobState.PREEMPTED)


def _one_per_decision(decisions: Sequence[EventInfo]) -> tuple[EventInfo, ...]:
    """The decisions without the first step of each two-step change: an event into a passing state
    followed at once by the event out of it, for the same reason."""
    return tuple(
        e for e, then in zip(decisions, (*decisions[1:], None), strict=True)
        if not (then is not None and e.to_state in _PASSING_STATES and then.from_state == e.to_state
                and then.reason == e.reason and then.job_id == e.job_id)
    )


def _summarize(job: JobInfo, decisions: Sequence[EventInfo]) -> str:
    state = JobState(job.state)
    if state == JobState.PENDING:
        why = job.pending_reason or "waiting for the next scheduling cycle"
        preempted = [e for e in decisions if e.to_state == JobState.PREEMPTED]
        if preempted:
            return f"Pending (requeued after preemption: {preempted[-1].message}); {why}"
        return f"Pending: {why}"
    if state in (JobState.RUNNING, JobState.SCALING):
        running = f"{state.title()} with {job.num_workers} worker(s): {job.state_reason}: {job.state_message}"
        # Why it is not resized, when the policy keeps it below max_workers (a non-event, recorded once).
        return f"{running}; {job.size_note}" if job.size_note else running
    if state == JobState.PREEMPTED:
        return f"Preempted: {job.state_reason}: {job.state_message}"
    return f"{state.title()}: {job.state_reason}: {job.state_message}"
