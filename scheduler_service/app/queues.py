"""Queues: an admin creates, changes, lists and deletes them (``arylctl queues ...``); submissions are
checked against them (an unknown queue is refused, naming it) and their priority class is resolved to
its configured value, fixed on the job from then on.

Each change is one transaction and asks for a cycle (a new quota may let jobs start, or borrowed GPUs
go back). Usage is counted by ``core.quota`` on the policy's own snapshot, so ``queues list`` and the
policy agree.

Who may call: the RPCs are admin-only (``api.auth.METHOD_ROLES``: a method not listed is an admin's).

Never: decide placement or preemption (the policy does), or hold SQL (``store.queues`` does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from scheduler_service.app.notices import Announcer
from scheduler_service.core.clock import Clock
from scheduler_service.core.quota import DEFAULT_QUEUE, QuotaLedger
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.errors import InvalidArgument, NotFound
from scheduler_service.lifecycle import JobState
from scheduler_service.records import JobSubmission, QueueSettings, QueueStatus
from scheduler_service.store.queues import QueueStore, queue_names
from scheduler_service.store.transactions import Transactions

# The classes when the configuration names none: "" (no class) is 0.
DEFAULT_PRIORITY_CLASSES: Mapping[str, int] = {"low": -100, "normal": 0, "high": 100}


class Queues:
    def __init__(self, db: Transactions, clock: Clock, notices: Announcer, *,
                 snapshot: Callable[[], ClusterSnapshot],
                 priority_classes: Mapping[str, int] | None = None) -> None:
        self._db = db
        self._store = QueueStore()
        self._clock = clock
        self._notices = notices
        self._snapshot = snapshot
        self.priority_classes = dict(DEFAULT_PRIORITY_CLASSES if priority_classes is None else priority_classes)

    # -- admin ----------------------------------------------------------------------------------------

    def create(self, settings: QueueSettings) -> QueueStatus:
        now = self._clock.now()
        self._db.write(lambda session: self._store.create(session, settings, now))
        self._notices.state_changed()
        return self.status(settings.name)

    def update(self, name: str, change: dict[str, object]) -> QueueStatus:
        now = self._clock.now()
        self._db.write(lambda session: self._store.update(session, name, change, now))
        self._notices.state_changed()
        return self.status(name)

    def delete(self, name: str) -> None:
        """Delete a queue without active jobs; "default" returns to its unconfigured self (the rest)."""
        self._db.write(lambda session: self._store.delete(session, name))
        self._notices.state_changed()

    def all(self) -> list[QueueStatus]:
        """Every configured queue and "default", with usage as the policy counts it."""
        return statuses(self._snapshot())

    def status(self, name: str) -> QueueStatus:
        found = next((s for s in self.all() if s.name == name), None)
        if found is None:
            raise NotFound(f"queue {name!r} does not exist")
        return found

    def describe(self, name: str) -> str:
        """One line on the queue ``name`` for ``ExplainJob`` ("" for a queue deleted since)."""
        found = next((s for s in self.all() if s.name == (name or DEFAULT_QUEUE)), None)
        return describe(found) if found is not None else ""

    # -- submissions ----------------------------------------------------------------------------------

    def admit(self, subs: Sequence[JobSubmission]) -> tuple[list[JobSubmission], dict[int, Exception]]:
        """The submissions with their priority class's value filled in, and the refused ones by index:
        an unknown queue (NotFound, naming it and the queues there are) or an unknown priority class
        (InvalidArgument, naming the classes configured)."""
        wanted = {sub.queue or DEFAULT_QUEUE for sub in subs}
        known = {DEFAULT_QUEUE} | (self._db.read(queue_names) if wanted - {DEFAULT_QUEUE} else set())
        admitted: list[JobSubmission] = []
        refused: dict[int, Exception] = {}
        for i, sub in enumerate(subs):
            queue = sub.queue or DEFAULT_QUEUE
            if queue not in known:
                refused[i] = NotFound(f"queue {queue!r} does not exist (queues: {', '.join(sorted(known))}); "
                                      "an admin creates it with `arylctl queues create`")
            elif sub.priority_class and sub.priority_class not in self.priority_classes:
                classes = ", ".join(f"{n} ({v})" for n, v in sorted(self.priority_classes.items()))
                refused[i] = InvalidArgument("spec.priority_class", f"unknown class {sub.priority_class!r}; "
                                                                    f"configured: {classes or 'none'}")
            value = self.priority_classes.get(sub.priority_class, 0)
            admitted.append(sub if value == sub.priority_value else dataclasses.replace(sub, priority_value=value))
        return admitted, refused


def statuses(snapshot: ClusterSnapshot) -> list[QueueStatus]:
    """Each queue's settings and usage in ``snapshot`` (``core.quota``'s ledger), by name."""
    ledger = QuotaLedger.of(snapshot, count_usage=True)
    configured = {q.name for q in snapshot.queues}
    pending: dict[str, int] = {}
    running: dict[str, int] = {}
    for job in snapshot.jobs:
        counts = running if job.state in (JobState.RUNNING, JobState.SCALING) else pending
        counts[job.queue or DEFAULT_QUEUE] = counts.get(job.queue or DEFAULT_QUEUE, 0) + 1
    return [
        QueueStatus(q.name, q.cohort, q.quota_gpus, q.borrow_limit_gpus, q.fair_share, q.used_gpus, q.borrowed_gpus,
                    pending.get(q.name, 0), running.get(q.name, 0), q.name in configured, ledger.cohort_idle(q),
                    q.rest)
        for q in ledger.summary() if q.name in configured or q.name == DEFAULT_QUEUE
    ]


def describe(status: QueueStatus) -> str:
    """One line on a queue for ``ExplainJob``: usage against quota, borrowing, what the cohort has idle."""
    limit = f"borrow limit {status.borrow_limit_gpus}" if status.borrow_limit_gpus is not None else "no borrow limit"
    cohort = f"cohort `{status.cohort}`" if status.cohort else "no cohort"
    quota = f"{status.quota_gpus}-GPU quota" + (" (the rest: what the other queues' quotas leave)"
                                                  if status.quota_is_rest else "")
    return (f"queue `{status.name}`: {status.used_gpus} GPU(s) in use of its {quota}, "
            f"{status.borrowed_gpus} borrowed ({limit}; {cohort}: {status.cohort_idle_gpus} idle)")
