"""What the SQL applier's re-checks read: ``SessionFacts``, ``core.apply_rules.ApplyFacts`` over a session.

The *facts* are the plan's jobs, and the servers, GPUs, allocations and open loans it touches, loaded in
a few queries once per ``store.applier.Applier.apply`` and kept up to date in memory as its actions apply,
so re-checking an action costs no round trip. The rules that read them are ``core.apply_rules``'s; the
writes are ``store.applier``'s.

Never: write (it only reads the session, then follows what the applier reports it wrote), or decide
whether an action is allowed (the rules do).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable

import sqlalchemy as sa
from sqlalchemy.orm import Session

from scheduler_service.core.apply_rules import LOAN_STEPS, JobFacts, LoanState
from scheduler_service.core.plan import Plan, PreemptJob, ScaleJob, ServerAction, StartJob
from scheduler_service.core.snapshot import AdminState
from scheduler_service.lifecycle import JobState, ServerState
from scheduler_service.store import models as m

_Pair = tuple[str, int]  # (server id, GPU index)


class SessionFacts:
    """``core.apply_rules.ApplyFacts`` over the session: the plan's jobs (ORM rows, kept alive here:
    the identity map is weak), and the servers it places workers on or steps through the loan cycle --
    their states, usable GPUs, allocations and open loans -- read in a few queries per ``apply`` and
    kept up to date in memory as each action commits to its savepoint (``applied``), so re-checking an
    action costs no round trip. Allocations are read for those servers and for the plan's jobs
    wherever they run; a GPU elsewhere reads as unheld, which the rules never ask about."""

    def __init__(self, jobs: dict[int, m.Job], states: dict[str, str], usable: set[_Pair],
                 allocations: Iterable[tuple[str, int, int]], servers: dict[str, m.Server],
                 loans: dict[str, m.Loan], cordoned: set[str]) -> None:
        self._jobs = jobs
        # Read now, while every row is loaded: an applied start expires its row (written without the ORM), and
        # reading it afterwards would cost a round trip. A job's batch limits are its spec's: never changed here.
        self._batched = frozenset(job.id for job in jobs.values() if job.batch_init is not None)
        self._states = states
        self._cordoned = cordoned          # of the servers the plan places on or steps
        self._usable = usable
        self._servers = servers            # ORM rows of the servers the plan steps (it writes them)
        self._loans = loans                # their open loans (ORM rows)
        self._holders: dict[str, dict[int, int]] = defaultdict(dict)  # server -> GPU -> job
        self._by_job: dict[int, set[_Pair]] = defaultdict(set)
        for server_id, index, job_id in allocations:
            self._holders[server_id][index] = job_id
            self._by_job[job_id].add((server_id, index))

    @classmethod
    def load(cls, session: Session, plan: Plan) -> SessionFacts:
        job_ids = sorted({p.job_id for p in plan.preemptions} | {s.job_id for s in plan.scales}
                         | {s.job_id for s in plan.starts})
        placing: tuple[StartJob | ScaleJob, ...] = (*plan.starts, *plan.scales)
        placed_on = sorted({w.server_id for action in placing for w in action.workers})
        stepped = sorted({a.server_id for a in plan.server_actions})
        touched = sorted({*placed_on, *stepped})
        jobs: dict[int, m.Job] = {}
        if job_ids:
            jobs = {job.id: job for job in session.scalars(sa.select(m.Job).where(m.Job.id.in_(job_ids)))}
        s, g, a = m.SERVERS.c, m.GPUS.c, m.ALLOCATIONS.c
        servers: dict[str, m.Server] = {}
        loans: dict[str, m.Loan] = {}
        if stepped:
            servers = {server.id: server
                       for server in session.scalars(sa.select(m.Server).where(m.Server.id.in_(stepped)))}
            loans = {loan.server_id: loan for loan in session.scalars(
                sa.select(m.Loan).where(m.Loan.server_id.in_(stepped), m.Loan.state != LoanState.RETURNED))}
        states = {sid: server.state for sid, server in servers.items()}
        cordoned = {sid for sid, server in servers.items() if server.admin_state != AdminState.NONE}
        usable: set[_Pair] = set()
        if placed_on:
            unstepped = [sid for sid in placed_on if sid not in servers]
            for sid, state, admin in session.execute(
                sa.select(s.id, s.state, s.admin_state).where(s.id.in_(unstepped))
            ):
                states[sid] = state
                if admin != AdminState.NONE:
                    cordoned.add(sid)
            usable = {(sid, index) for sid, index in session.execute(
                sa.select(g.server_id, g.index).where(g.server_id.in_(placed_on), g.healthy))}
        allocations: list[tuple[str, int, int]] = []
        if touched or job_ids:
            allocations = [(row.server_id, row.gpu_index, row.job_id) for row in session.execute(
                sa.select(a.server_id, a.gpu_index, a.job_id).where(sa.or_(a.server_id.in_(touched),
                                                                           a.job_id.in_(job_ids))))]
        return cls(jobs, states, usable, allocations, servers, loans, cordoned)

    # -- ApplyFacts --------------------------------------------------------------------------------

    def job(self, job_id: int) -> JobFacts | None:
        job = self._jobs.get(job_id)
        if job is None:
            return None
        return JobFacts(job.id, JobState(job.state), job.gpus_per_worker, job.min_workers, job.max_workers)

    def server_state(self, server_id: str) -> ServerState | None:
        state = self._states.get(server_id)
        return ServerState(state) if state is not None else None

    def server_cordoned(self, server_id: str) -> bool:
        return server_id in self._cordoned

    def open_loan(self, server_id: str) -> LoanState | None:
        loan = self._loans.get(server_id)
        return LoanState(loan.state) if loan is not None else None

    def gpu_usable(self, server_id: str, index: int) -> bool:
        return (server_id, index) in self._usable

    def gpu_holder(self, server_id: str, index: int) -> int | None:
        return self._holders[server_id].get(index) if server_id in self._holders else None

    def jobs_on(self, server_id: str) -> Collection[int]:
        return self._holders[server_id].values() if server_id in self._holders else ()

    # -- what the applier reads and writes ---------------------------------------------------------

    def may_have_batch_limits(self, job_id: int) -> bool:
        """False only for one of the plan's jobs that has no batch limits (a job the facts did not load may)."""
        return job_id not in self._jobs or job_id in self._batched

    def row(self, job_id: int) -> m.Job:
        """The job's ORM row (the rules found it)."""
        return self._jobs[job_id]

    def server_row(self, server_id: str) -> m.Server:
        return self._servers[server_id]

    def loan_row(self, server_id: str) -> m.Loan | None:
        return self._loans.get(server_id)

    def held_by(self, job_ids: Iterable[int]) -> dict[int, list[_Pair]]:
        """Each job's (server, GPU) pairs now (``apply_order``'s ``held``)."""
        return {job_id: sorted(self._by_job[job_id]) for job_id in job_ids if job_id in self._by_job}

    def applied(self, action: StartJob | ScaleJob | PreemptJob | ServerAction, loan: m.Loan | None = None) -> None:
        """``action`` committed to its savepoint: a job action's GPUs change hands; a loan step moves
        the server and its open loan (``loan``: the row the step wrote)."""
        if isinstance(action, ServerAction):
            rule = LOAN_STEPS[action.kind]
            self._states[action.server_id] = rule.target
            if rule.loan_after == LoanState.RETURNED or loan is None:
                self._loans.pop(action.server_id, None)
            else:
                self._loans[action.server_id] = loan
            return
        for server_id, index in self._by_job.pop(action.job_id, set()):
            if self._holders[server_id].get(index) == action.job_id:
                del self._holders[server_id][index]
        if isinstance(action, PreemptJob):
            return
        for w in action.workers:
            for index in w.gpu_indices:
                self._holders[w.server_id][index] = action.job_id
                self._by_job[action.job_id].add((w.server_id, index))

    def undo_start(self, action: StartJob) -> None:
        """A start recorded by ``applied`` that the database then refused: its GPUs are free again."""
        self._by_job.pop(action.job_id, None)
        for w in action.workers:
            for index in w.gpu_indices:
                if self._holders[w.server_id].get(index) == action.job_id:
                    del self._holders[w.server_id][index]
