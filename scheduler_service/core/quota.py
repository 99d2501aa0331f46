"""Queues with quotas and borrowing, priority classes and fair share: the rules a policy asks before it
starts or grows a job, and the order it considers queued jobs in. Pure: no I/O, no clock.

Nouns
-----
- *Queue*: every job belongs to one (``JobView.queue``; "default" when none is named). An admin
  configures queues (``QueueView``): a guaranteed *quota* of GPUs, a *borrow limit* beyond it (None: no
  limit), a *cohort* (queues that lend each other their idle quota; "": a cohort of its own), and
  whether its users get a *fair share*.
- *Usage*: the GPUs a queue's running jobs hold (workers x gpus_per_worker), as the plan changes them.
- *Borrowed*: usage beyond the quota. A queue may borrow only what its cohort has *idle*: the cohort's
  quotas plus the GPUs of loaned inference servers (cohort-wide borrowable capacity: no queue owns
  them), minus what the cohort's queues use. Borrowing is never beyond ``quota + borrow limit``.
- *The default queue*: when an admin has not configured it, its quota is *the rest* (what the other
  queues' quotas leave of the training servers' healthy GPUs), it may borrow without limit, and it has
  no fair share (jobs keep the policy's own order). Configured without a quota (``QueueView.quota_gpus``
  None: a cohort, a borrow limit or fair share set), its quota is still the rest, so deleting the other
  queues gives their GPUs back to it. With no queue configured at all nothing is enforced: every job
  may use every GPU, exactly as before queues existed.
- *Quota first*: jobs that fit within their queue's quota are considered before jobs that would borrow.
- *Return*: a job that fits within its queue's quota but finds no free GPUs may take them back from
  queues that borrow (any cohort: a guarantee is owed whoever borrowed): elastic extras shrink first
  (the policy's own step), then whole jobs of borrowing queues are preempted, least cost first, and only
  while their queue stays over its quota.
- *Priority class*: a name a job is submitted with, mapped to a number by the configuration and fixed
  on the job at submission (as Kubernetes copies a PriorityClass's value into the pod). Within a queue a
  higher class goes first, and a queued job may preempt running jobs of *lower* classes of its own queue
  only (never equal or higher ones, never another queue's).
- *Fair share* (within a queue, between users): a user's share is the GPUs their running jobs hold.
  GPUs are the one resource Aryl schedules, so dominant-resource fairness reduces to this count; it is
  chosen over usage-decayed fair share because it needs nothing but the snapshot (a decayed history
  would have to be stored and replayed, and would make the pure core depend on past cycles). Queued
  jobs are taken in order of the share their user *would* hold before each one starts: a user's k-th
  job in the policy's order counts the GPUs of the user's k-1 earlier ones (progressive filling), so
  two users with equal usage alternate, and a heavy user waits behind a light one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_service.core.plan import Reason
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, QueueView
from scheduler_service.lifecycle import JobState, Pool, ServerState

DEFAULT_QUEUE = "default"
_RUNNING = (JobState.RUNNING, JobState.SCALING)


@dataclass(slots=True)
class QueueUsage:
    """One queue's quota and usage at a point of the plan."""

    name: str
    cohort: str
    quota_gpus: int
    borrow_limit_gpus: int | None
    fair_share: bool
    used_gpus: int = 0
    rest: bool = False  # the quota is what the other queues leave ("default" only)

    @property
    def borrowed_gpus(self) -> int:
        return max(0, self.used_gpus - self.quota_gpus)

    @property
    def cohort_key(self) -> str:
        """Queues with the same key lend each other idle quota ("" cohort: the queue alone)."""
        return self.cohort or f"queue:{self.name}"


@dataclass(frozen=True, slots=True)
class Verdict:
    """May a job take ``gpus`` more GPUs? ``borrowing``: beyond its queue's quota. When refused,
    ``reason`` and ``message`` say which rule refused it, in numbers."""

    allowed: bool
    borrowing: bool = False
    reason: Reason | None = None
    message: str = ""


ALLOWED = Verdict(True)


class QuotaLedger:
    """Each queue's quota and usage as one cycle's plan changes it: ``check`` before a job starts or
    grows, ``charge``/``release`` as GPUs change hands. Not enforced (every check passes) when no
    queue is configured."""

    def __init__(self, queues: Sequence[QueueView], held: Iterable[tuple[JobView, int]], *,
                 training_gpus: int, loaned_gpus: int, count_usage: bool = False) -> None:
        """``count_usage``: count each queue's usage even when nothing is enforced (for reports; a
        policy's ledger without queues skips it)."""
        self.enforced = bool(queues)
        self.loaned_gpus = loaned_gpus
        rest = max(0, training_gpus - sum(q.quota_gpus for q in queues if q.quota_gpus is not None))
        self.queues: dict[str, QueueUsage] = {
            q.name: QueueUsage(q.name, q.cohort, rest if q.quota_gpus is None else q.quota_gpus, q.borrow_limit_gpus,
                               q.fair_share, rest=q.quota_gpus is None)
            for q in queues}
        if DEFAULT_QUEUE not in self.queues:
            self.queues[DEFAULT_QUEUE] = QueueUsage(DEFAULT_QUEUE, "", rest, None, False, rest=True)
        # The GPUs each (queue, user) holds now: fair share reads them.
        self.user_gpus: dict[tuple[str, str], int] = {}
        # The lowest priority class running in each queue (``has_victims``' quick test).
        self._lowest_class: dict[str, int] = {}
        if not self.enforced and not count_usage:  # only the classes matter (every cycle: kept cheap)
            for job, gpus in held:
                if gpus:
                    queue, low = job.queue or DEFAULT_QUEUE, self._lowest_class.get(job.queue or DEFAULT_QUEUE)
                    self._lowest_class[queue] = job.priority_class if low is None else min(low, job.priority_class)
            return
        for job, gpus in held:
            self._queue(job.queue).used_gpus += gpus
            k = (job.queue or DEFAULT_QUEUE, job.user)
            self.user_gpus[k] = self.user_gpus.get(k, 0) + gpus
            if gpus:
                low = self._lowest_class.get(k[0])
                self._lowest_class[k[0]] = job.priority_class if low is None else min(low, job.priority_class)

    @classmethod
    def of(cls, snapshot: ClusterSnapshot, held: Iterable[tuple[JobView, int]] | None = None, *,
           count_usage: bool = False) -> QuotaLedger:
        """The ledger of ``snapshot`` with each job holding ``held`` GPUs (default: its workers there)."""
        training = loaned = 0
        for s in snapshot.servers if snapshot.queues or count_usage else ():  # no queue: none to count against
            if s.pool == Pool.TRAINING and s.state == ServerState.TRAINING:
                training += len(s.healthy_gpus)
            elif s.state == ServerState.LOANED:
                loaned += len(s.healthy_gpus)
        if held is None:
            held = ((j, j.num_workers * j.gpus_per_worker) for j in snapshot.jobs if j.state in _RUNNING)
        return cls(snapshot.queues, held, training_gpus=training, loaned_gpus=loaned, count_usage=count_usage)

    def _queue(self, name: str) -> QueueUsage:
        """A job's queue; one deleted since the job was queued counts as a queue with no quota."""
        queue = self.queues.get(name or DEFAULT_QUEUE)
        if queue is None:
            queue = self.queues[name] = QueueUsage(name, "", 0, 0, False)
        return queue

    def queue_of(self, job: JobView) -> QueueUsage:
        return self._queue(job.queue)

    def cohort_idle(self, queue: QueueUsage) -> int:
        """GPUs the queue's cohort may still lend: its quotas plus the loaned servers', minus its usage."""
        key = queue.cohort_key
        members = [q for q in self.queues.values() if q.cohort_key == key]
        return max(0, sum(q.quota_gpus for q in members) + self.loaned_gpus - sum(q.used_gpus for q in members))

    def within_quota(self, job: JobView, gpus: int) -> bool:
        queue = self.queue_of(job)
        return not self.enforced or queue.used_gpus + gpus <= queue.quota_gpus

    def check(self, job: JobView, gpus: int) -> Verdict:
        """May ``job`` take ``gpus`` more GPUs under its queue's quota and borrowing rules?"""
        if not self.enforced:
            return ALLOWED
        q = self.queue_of(job)
        if q.used_gpus + gpus <= q.quota_gpus:
            return ALLOWED
        limit = q.borrow_limit_gpus
        if limit is not None and q.used_gpus + gpus > q.quota_gpus + limit:
            return Verdict(False, True, Reason.QUOTA_BORROW_LIMIT,
                           f"queue `{q.name}` may hold at most {q.quota_gpus + limit} GPUs (quota {q.quota_gpus} + "
                           f"borrow limit {limit}); it holds {q.used_gpus} and this needs {gpus}")
        idle = self.cohort_idle(q)
        if gpus > idle:
            where = f"cohort `{q.cohort}`" if q.cohort else "cohort"
            if q.used_gpus >= q.quota_gpus:
                message = (f"queue `{q.name}` is at its quota of {q.quota_gpus} GPUs and cannot borrow: "
                           f"{where} has {idle} idle")
            else:
                message = (f"queue `{q.name}` holds {q.used_gpus} of its quota of {q.quota_gpus} GPUs; this needs "
                           f"{gpus} and cannot borrow the {q.used_gpus + gpus - q.quota_gpus} beyond it: {where} has "
                           f"{idle} idle")
            return Verdict(False, True, Reason.WAITING_FOR_QUOTA, message)
        return Verdict(True, True)

    def headroom(self, job: JobView) -> int | None:
        """The most GPUs ``job``'s queue may still add (None: no limit)."""
        if not self.enforced:
            return None
        q = self.queue_of(job)
        room = max(q.quota_gpus - q.used_gpus, self.cohort_idle(q))
        if q.borrow_limit_gpus is not None:
            room = min(room, q.quota_gpus + q.borrow_limit_gpus - q.used_gpus)
        return max(0, room)

    def charge(self, job: JobView, gpus: int) -> None:
        self.queue_of(job).used_gpus += gpus

    def release(self, job: JobView, gpus: int) -> None:
        self.queue_of(job).used_gpus -= gpus

    # -- ordering ---------------------------------------------------------------------------------

    def order(self, jobs: Iterable[JobView], key: Callable[[JobView], Any]) -> list[JobView]:
        """Queued jobs in the order to consider them: by ``key``'s first element (the policy's urgent
        flag, e.g. starving), then quota first (within quota before borrowing, as usage stands now),
        then priority class (higher first), then fair share in queues that have it, then the rest of
        ``key``. With no queue configured, no class and no fair share this is ``sorted(jobs, key=key)``."""
        jobs = list(jobs)
        if not self.enforced and len({j.priority_class for j in jobs}) <= 1:
            return sorted(jobs, key=key)  # nothing to add to the policy's own order
        keys = {j.job_id: key(j) for j in jobs}
        share: dict[int, int] = {}
        if self.enforced:
            fair = {name for name, q in self.queues.items() if q.fair_share}
            by_user: dict[tuple[str, str], list[JobView]] = {}
            for j in jobs:
                if (j.queue or DEFAULT_QUEUE) in fair:
                    by_user.setdefault((j.queue or DEFAULT_QUEUE, j.user), []).append(j)
            user_gpus = self.user_gpus
            for (queue, user), mine in by_user.items():
                held = user_gpus.get((queue, user), 0)
                for j in sorted(mine, key=lambda j: (-j.priority_class, keys[j.job_id])):
                    share[j.job_id] = held
                    held += j.min_workers * j.gpus_per_worker
        def rank(j: JobView) -> tuple[Any, ...]:
            k = keys[j.job_id]
            head, rest = (k[0], k[1:]) if isinstance(k, tuple) and k else (0, (k,))
            borrows = self.enforced and not self.within_quota(j, j.min_workers * j.gpus_per_worker)
            return (head, borrows, -j.priority_class, share.get(j.job_id, 0), *rest)
        return sorted(jobs, key=rank)

    # -- preemption ---------------------------------------------------------------------------------

    def may_preempt(self, job: JobView, victim: JobView) -> Reason | None:
        """May queued ``job`` (admitted) preempt running ``victim``? PREEMPTED_FOR_QUOTA when ``job``
        is within its quota and ``victim``'s queue borrows (the caller releases each victim's GPUs as it
        picks it, so a queue stops being a victim once it is back within its quota); PREEMPTED_FOR_PRIORITY
        when both are in one queue and ``victim``'s class is lower; else None."""
        same = (victim.queue or DEFAULT_QUEUE) == (job.queue or DEFAULT_QUEUE)
        if same and victim.priority_class < job.priority_class:
            return Reason.PREEMPTED_FOR_PRIORITY
        if (self.enforced and not same and self.within_quota(job, job.min_workers * job.gpus_per_worker)
                and self.queue_of(victim).used_gpus > self.queue_of(victim).quota_gpus):
            return Reason.PREEMPTED_FOR_QUOTA
        return None

    def has_victims(self, job: JobView) -> bool:
        """Might a running job be one ``job`` may preempt? A quick test, O(queues), before the exact
        one (``may_preempt``, per candidate): a lower class runs in its queue, or ``job`` is within its
        quota while some other queue borrows. From the usage the ledger began with, so it may say yes
        where none is left, never no where one is."""
        queue = job.queue or DEFAULT_QUEUE
        low = self._lowest_class.get(queue)
        if low is not None and low < job.priority_class:
            return True
        return self.enforced and self.within_quota(job, job.min_workers * job.gpus_per_worker) and any(
            name != queue and q.used_gpus > q.quota_gpus for name, q in self.queues.items())

    # -- reporting ------------------------------------------------------------------------------------

    def summary(self) -> list[QueueUsage]:
        return sorted(self.queues.values(), key=lambda q: q.name)


def preemption_order(victims: Iterable[tuple[JobView, float, int]]) -> list[JobView]:
    """Victims, cheapest first: by cost per GPU freed (cost: the GPU-seconds of work lost since its last
    checkpoint plus restart costs, the same cost ``solvers.reclaim`` minimises), then job id."""
    return [v for v, _, _ in sorted(victims, key=lambda t: (t[1] / max(t[2], 1), t[0].job_id))]
