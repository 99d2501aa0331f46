"""Faults as policy input: what a scheduling cycle does with the jobs that ran on LOST servers.

Nouns:
- *LOST server*: one whose agent has gone silent (the service's liveness check marks it; the
  simulator injects it). Marking it is all the outside world does: the server keeps its allocations
  in the snapshot (``ServerView.state == LOST``) until a plan removes them. Its workers are gone --
  without a graceful checkpoint -- whatever the plan says.
- *Eviction*: the action this module decides for a job with a worker on a LOST server:
  - a RUNNING job that keeps at least ``min_workers`` workers elsewhere shrinks to them
    (``ScaleJob``): the survivors keep their servers and GPUs, renumbered 0..n-1 in their old rank
    order (every worker restarts at the new world size, a new incarnation);
  - any other such job -- too few workers left, or not RUNNING (a SCALING job is mid-restart and
    cannot be resized) -- is requeued (``PreemptJob``);
  both with reason ``SERVER_LOST`` -- or ``SERVER_LEFT`` where the agent deregistered (``AdminState.LEFT``:
  it stopped its workers itself and said so).
- *Drain*: a server an operator drains (``ServerView.draining``, not LOST): a RUNNING elastic job
  with a worker there shrinks to its workers elsewhere (as above), or is requeued when fewer than
  ``min_workers`` would be left; any other job is left to finish there until the drain's deadline
  (``ServerView.drain_deadline``), then requeued; reason ``SERVER_DRAINING``. Nothing new is placed
  there (the server is cordoned: ``core.placement``, ``core.apply_rules``).
  Anti-thrashing (``core.protection``, when the policy's params are given): a job in its protection
  window is not moved off before the drain's deadline -- it stays (a ``HELD_DRAIN_PROTECTED`` size note
  says until when) and moves off once the window ends; the deadline overrides the window (the operator's
  promise), and the eviction's message says so. A LOST server's jobs are never protected: their workers
  are gone already.

Every registered policy applies this first (``core.registry`` wraps each policy it creates in
``FaultsFirst``), so the service and the simulator run the same rule, and the policy's own steps
decide on ``Evictions.after``: the snapshot as it will be once the evictions are applied -- the lost
workers' GPUs and the requeued jobs' GPUs free, the shrunk jobs at their new size (just resized, so
anti-thrashing leaves them be). A requeued job is left out of that snapshot, so it queues again only
from the next cycle: its pending reason keeps saying why it was requeued, no plan acts on one job
twice, and both drivers run a cycle again after a commit (the service on every commit, the
simulator's engine after an eviction).

Unhealthy GPUs are not faults in this sense: the snapshot marks them (``ServerView.unhealthy_gpus``),
placement never chooses them, and a worker already on one runs on until its agent reports the
worker's exit (then ``worker_outcomes`` and the restart policy decide), as before.

Pure: reads the snapshot only; never I/O, never the wall clock.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from operator import attrgetter

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import KeepSize, Plan, PreemptJob, Reason, ScaleJob, WorkerPlacement, clock_time
from scheduler_service.core.protection import Mechanism, Protection, overridden, protection
from scheduler_service.core.snapshot import AdminState, ClusterSnapshot, JobView, ServerView, WorkerView, derived
from scheduler_service.lifecycle import JobState, ServerState

_rank = attrgetter("rank")


@dataclass(frozen=True, slots=True)
class Evictions:
    """The evictions one cycle makes (in job-id order), and the snapshot its policy decides on after
    them (``after``)."""

    scales: tuple[ScaleJob, ...]
    preemptions: tuple[PreemptJob, ...]
    after: ClusterSnapshot
    held: tuple[KeepSize, ...] = ()  # jobs a drain leaves where they are for now: protected (core.protection)

    def merge(self, plan: Plan) -> Plan:
        """This cycle's plan: the evictions plus ``plan`` (decided on ``after``). A job is acted on at
        most once per plan, so where ``plan`` changes a job this eviction shrinks (another resize, or
        a preemption) the two become one action: ``plan``'s placement or preemption, with the reason
        ``SERVER_LOST`` (the change that came first) and both messages."""
        shrunk = {s.job_id: s for s in self.scales}
        then_scaled = {s.job_id: s for s in plan.scales if s.job_id in shrunk}
        then_preempted = {p.job_id: p for p in plan.preemptions if p.job_id in shrunk}
        if not then_scaled and not then_preempted:
            scales, preemptions = (*self.scales, *plan.scales), (*self.preemptions, *plan.preemptions)
        else:
            scales = (
                *(replace(then_scaled[s.job_id], reason=s.reason,
                          message=f"{s.message}; {then_scaled[s.job_id].message}")
                  if s.job_id in then_scaled else s
                  for s in self.scales if s.job_id not in then_preempted),
                *(s for s in plan.scales if s.job_id not in shrunk),
            )
            preemptions = (
                *self.preemptions,
                *(PreemptJob(s.job_id, s.reason, f"{s.message}; {then_preempted[s.job_id].message}")
                  for s in self.scales if s.job_id in then_preempted),
                *(p for p in plan.preemptions if p.job_id not in shrunk),
            )
        held = plan.held
        if self.held:  # the drain's note replaces whatever the policy says of the job's size
            mine = {k.job_id for k in self.held}
            held = (*(k for k in plan.held if k.job_id not in mine), *self.held)
        return replace(plan, scales=tuple(scales), preemptions=tuple(preemptions), held=held)


def plan_evictions(snapshot: ClusterSnapshot, params: PolicyParams | None = None) -> Evictions | None:
    """The evictions for every job with a worker on a LOST server, or on a draining one (see the
    module docstring); None when there is none (the usual cycle: the snapshot is used as it is).
    With ``params``, a drain honours the jobs' protection windows until its deadline."""
    lost = {s.server_id for s in snapshot.servers if s.state == ServerState.LOST and s.allocated}
    draining = {s.server_id for s in snapshot.servers
                if s.draining and s.state != ServerState.LOST and s.allocated}
    if not lost and not draining:
        return None
    scales: list[ScaleJob] = []
    preemptions: list[PreemptJob] = []
    jobs: list[JobView] = []
    freed: dict[str, set[int]] = {}  # server -> GPUs the evictions free there
    held: list[KeepSize] = []
    for job in snapshot.jobs:
        shield = protection(job, snapshot.now, params) if params is not None else None
        decided = _evict_lost(snapshot, job, lost) or _drain_off(snapshot, job, draining, shield)
        if isinstance(decided, KeepSize):
            held.append(decided)
            decided = None
        if decided is None:
            jobs.append(job)
            continue
        if isinstance(decided, PreemptJob):
            preemptions.append(decided)
            released = list(job.workers)
        else:
            scales.append(decided)
            kept = {(w.server_id, g) for w in decided.workers for g in w.gpu_indices}
            released = [w for w in job.workers if (w.server_id, w.gpu_indices[0]) not in kept]
            jobs.append(replace(job, workers=tuple(WorkerView(w.rank, w.server_id, w.gpu_indices)
                                                   for w in decided.workers),
                                last_resized_at=snapshot.now))
        for w in released:
            freed.setdefault(w.server_id, set()).update(w.gpu_indices)
    if not scales and not preemptions:
        return Evictions((), (), snapshot, tuple(held)) if held else None
    servers = tuple(_without(s, freed[s.server_id]) if s.server_id in freed else s for s in snapshot.servers)
    # Derived, not rebuilt: the queues, GPU speeds and loan note hold in the cycle that evicts too.
    after = derived(snapshot, servers=servers, jobs=tuple(jobs))
    return Evictions(tuple(scales), tuple(preemptions), after, tuple(held))


def _evict_lost(snapshot: ClusterSnapshot, job: JobView, lost: set[str]) -> ScaleJob | PreemptJob | None:
    """A job with a worker on a LOST server: shrunk to its survivors, or requeued. A server whose agent
    deregistered (``AdminState.LEFT``) is named as having left, with reason SERVER_LEFT."""
    gone = [w for w in job.workers if w.server_id in lost]
    if not gone:
        return None
    where = sorted({w.server_id for w in gone})
    left = all(snapshot.server(sid).admin == AdminState.LEFT for sid in where)
    plural = "s" if len(where) > 1 else ""
    message = (f"server{plural} {', '.join(where)} left the cluster (agent deregistered)" if left
               else f"server{plural} {', '.join(where)} lost (agent silent)")
    reason = Reason.SERVER_LEFT if left else Reason.SERVER_LOST
    survivors = sorted((w for w in job.workers if w.server_id not in lost), key=_rank)
    if job.state == JobState.RUNNING and len(survivors) >= job.min_workers:
        return ScaleJob(job.job_id, _renumbered(survivors), reason,
                        f"{message}; continues with {len(survivors)} worker(s)")
    return PreemptJob(job.job_id, reason, message)


def _drain_off(snapshot: ClusterSnapshot, job: JobView, draining: set[str],
               shield: Protection | None = None) -> ScaleJob | PreemptJob | KeepSize | None:
    """A job with a worker on a draining server: a RUNNING elastic job shrinks to its workers elsewhere
    when they keep ``min_workers``, and is requeued otherwise; any other job is left to finish until
    the drain's deadline (``ServerView.drain_deadline``; None: no deadline) passes, then requeued. A
    SCALING job is mid-restart: it is resized once it runs again. A job in its protection window
    (``shield``) stays until the window ends (a KeepSize says so), or the deadline passes: then it goes,
    and the message says the deadline overrode its window."""
    there = sorted({w.server_id for w in job.workers if w.server_id in draining})
    if not there:
        return None
    message = f"server{'s' if len(there) > 1 else ''} {', '.join(there)} draining"
    deadlines = [d for d in (snapshot.server(sid).drain_deadline for sid in there) if d is not None]
    overdue = bool(deadlines) and snapshot.now >= min(deadlines)
    if shield is not None and job.state == JobState.RUNNING and (job.is_elastic or overdue):
        if not overdue:
            until = (f"until {clock_time(min(shield.until, *deadlines))}, the drain's deadline or the window's end"
                     if deadlines else "until the window ends")
            return KeepSize(job.job_id, Reason.HELD_DRAIN_PROTECTED,
                            f"{message}, but it is {shield.summary}; stays there {until}")
        message += "; " + overridden(shield, Mechanism.DRAIN, "must meet the operator's deadline")
    if job.state == JobState.RUNNING and job.is_elastic:
        survivors = sorted((w for w in job.workers if w.server_id not in draining), key=_rank)
        if len(survivors) >= job.min_workers:
            return ScaleJob(job.job_id, _renumbered(survivors), Reason.SERVER_DRAINING,
                            f"{message}; continues with {len(survivors)} worker(s) elsewhere")
        return PreemptJob(job.job_id, Reason.SERVER_DRAINING,
                          f"{message}; fewer than min_workers={job.min_workers} would be left elsewhere, "
                          "requeued")
    if overdue and job.state.holds_gpus:
        return PreemptJob(job.job_id, Reason.SERVER_DRAINING, f"{message}; the drain's deadline passed, requeued")
    return None


def _renumbered(survivors: list[WorkerView]) -> tuple[WorkerPlacement, ...]:
    """The survivors keep their servers and GPUs, renumbered 0..n-1 in their old rank order."""
    return tuple(WorkerPlacement(rank, w.server_id, w.gpu_indices) for rank, w in enumerate(survivors))


def _without(server: ServerView, gpus: set[int]) -> ServerView:
    """The server's view with ``gpus`` no longer allocated."""
    return replace(server, allocated=tuple((gpu, job) for gpu, job in server.allocated if gpu not in gpus))
