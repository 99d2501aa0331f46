"""Agents: a server registers, reports its status, and is told its desired state.

Most status reports say nothing new: the same generation, the same GPU health, no worker exit. Those
are answered from memory (``ReportDigests``) and their telemetry (GPU load, progress, last seen) is
written at most every ``telemetry_write_s``; liveness is in memory anyway. So a fleet of 1,000s of
agents costs the database little. Where the service gives it a writer (``write_telemetry_behind``),
that write happens behind the answer, on the writer's one thread, the latest report per server
(the service's ``write_behind.LatestWriter``): a report never waits for a database write that decides
nothing, nor takes an RPC thread from the calls that do. The writer takes many servers' reports at a
time (``write_behind_many``): one transaction of a few statements for all of them
(``AgentStore.record_telemetry``). A report whose only news is a newer observed generation writes just
that (one statement). A registration leaves the digest a first report would (``register``). Anything
else that may need a decision (a health change, an exit, a LOST server reporting again) goes through the
full path at once. Per server, a report written behind never overwrites what a report that arrived after
it recorded (``_ReportOrder``).

Never: decide what a server runs (the policy does), or hold SQL (the store does).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from scheduler_service.app.memory import Heartbeats, ReportDigest, ReportDigests, health_of
from scheduler_service.app.notices import Announcer
from scheduler_service.app.term import Term
from scheduler_service.core.clock import Clock
from scheduler_service.errors import AlreadyExists, GpuTaken, NotFound
from scheduler_service.lifecycle import ServerState
from scheduler_service.records import DesiredServerState, ServerRegistration, StatusReport
from scheduler_service.store.agents import AgentStore
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.server_admin import ServerAdminStore
from scheduler_service.store.transactions import Transactions

log = structlog.get_logger("aryl.agents")


@dataclass(frozen=True)
class BehindReport:
    """A telemetry-only report answered from memory, to be written behind its answer (``Agents.write_behind``)."""

    ticket: int  # its place among the reports as they arrived (``_ReportOrder``)
    arrived_at: float
    report: StatusReport

    @property
    def server_id(self) -> str:
        return self.report.server_id


class WriteBehind(Protocol):
    """Where such reports go (``write_behind.LatestWriter``, keyed by server): the latest per server waits."""

    def offer(self, item: BehindReport) -> bool: ...  # False: not taken (write it now)

    def withdraw(self, key: str) -> None: ...  # the server's waiting report, if any, is dropped


@dataclass
class _ServerOrder:
    lock: threading.Lock = field(default_factory=threading.Lock)
    newest: int = -1  # the ticket of the newest report recorded


class _ReportOrder:
    """Reports are numbered as they arrive (``ticket``); per server, a report written behind its
    answer is skipped when a report that arrived after it was recorded first: its progress would go
    back, which the progress window reads as a resume from a checkpoint (``store.agents``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tickets = itertools.count()
        self._servers: dict[str, _ServerOrder] = {}

    def ticket(self) -> int:
        with self._lock:
            return next(self._tickets)

    @contextmanager
    def recording(self, server_id: str, ticket: int, *, behind: bool) -> Iterator[bool]:
        """Hold the server's turn; yields whether to record the report (always, unless ``behind`` and
        a later one was recorded)."""
        with self._lock:
            order = self._servers.setdefault(server_id, _ServerOrder())
        with order.lock:
            if behind and ticket < order.newest:
                yield False
                return
            yield True
            order.newest = max(order.newest, ticket)

    @contextmanager
    def recording_behind(self, items: Sequence[BehindReport]) -> Iterator[list[BehindReport]]:
        """Hold the turns of ``items``' servers (one item each), taken in the servers' order so that two
        holders never wait for each other; yields the items to record (those no later report of their
        server was recorded before)."""
        with self._lock:
            orders = [(item, self._servers.setdefault(item.server_id, _ServerOrder()))
                      for item in sorted(items, key=lambda item: item.server_id)]
        with ExitStack() as held:
            for _, order in orders:
                held.enter_context(order.lock)
            current = [item for item, order in orders if item.ticket >= order.newest]
            yield current
            for item, order in orders:
                order.newest = max(order.newest, item.ticket)


class Agents:
    """``telemetry_write_s``: a report that says nothing new is still written at least this often."""

    def __init__(
        self, db: Transactions, store: AgentStore, desired: DesiredStates, clock: Clock, *, term: Term,
        heartbeats: Heartbeats, digests: ReportDigests, notices: Announcer, telemetry_write_s: float,
        admin: ServerAdminStore,
    ) -> None:
        self._db = db
        self._store = store
        self._admin = admin
        self._desired = desired
        self._clock = clock
        self._term = term
        self._heartbeats = heartbeats
        self._digests = digests
        self._notices = notices
        self._telemetry_write_s = telemetry_write_s
        self._order = _ReportOrder()
        self._behind: WriteBehind | None = None

    def write_telemetry_behind(self, writer: WriteBehind) -> None:
        """From now on, telemetry-only reports are answered from memory and offered to ``writer``, which
        calls ``write_behind`` with each (see the module's docstring). Without one, such a report is
        written on the caller's thread before it is answered."""
        self._behind = writer

    def read_in_transaction_only(self, watched: Callable[[str], bool]) -> None:
        """From now on, a decision's transaction reads the desired state of only the servers ``watched`` says
        this process streams, to push right after its commit; the others' are read after commit by whoever
        streams them (the desired-state streams' own process, ``push_process``, in its own interpreter), so the
        decision's transaction, and every agent of it, does not wait for a read this process would not use."""
        self._desired.read_in_transaction = watched

    def announce_changes(self) -> None:
        """From now on, each desired-generation bump is announced on the change feed (PostgreSQL's NOTIFY,
        ``store.change_feed``), delivered at commit, so that every replica's desired-state streams' process
        (``push_process``) follows this scheduler's decisions, a standby's included."""
        self._desired.announce = True

    def register(self, reg: ServerRegistration) -> DesiredServerState:
        now = self._clock.now()
        self._heartbeats.heard(reg.hostname)  # before the write, as in ``report_status``
        try:
            touched, recorded = self._db.write(lambda session: (
                self._store.register(session, reg, now), self._store.reported_state(session, reg.hostname)))
        except GpuTaken as exc:
            raise AlreadyExists(
                f"a GPU UUID reported by {reg.hostname} is already registered to another server"
            ) from exc
        self._digests.forget([reg.hostname])
        self._notices.servers_changed(touched)
        # The registration recorded what a first report would (the server heard from, its GPUs), so that
        # report needs the full path only if it says more: after a failover or a restart, 1,000s of agents
        # register at once, and their first reports each took a transaction of their own. The mark comes
        # before the desired state is read: a change committed after that read forgets the digest.
        since = self._digests.since(reg.hostname)
        state = self.desired_state(reg.hostname)
        self._keep_digest(reg.hostname, since, self._term.epoch, observed=recorded.observed_generation,
                          desired=state.generation, health=recorded.health)
        return state

    def report_status(self, report: StatusReport) -> int:
        """Record an agent's report (GPU telemetry and health, what its workers do); returns the
        server's desired generation. A server that was LOST comes back to its home state. Reports
        that say nothing new take the fast paths (see the module's docstring)."""
        answer = self.answer_from_memory(report)
        if answer is not None:
            return answer
        ticket = self._order.ticket()
        digest, due = self._unchanged_since_digest(report)
        if digest is not None and not due:
            answer = self._record_observed_generation(report, digest)
            if answer is not None:
                return answer
        # Heard before the write: a LOST server this report brings back must not look silent to a liveness
        # sweep between the commit and here (it marked the server LOST again, the report's answer aside).
        self._heartbeats.heard(report.server_id)
        if self._behind is not None:
            self._behind.withdraw(report.server_id)  # this report says all that one would, and newer
        with self._order.recording(report.server_id, ticket, behind=False):
            return self._record(report, self._clock.now())

    def _record(self, report: StatusReport, now: float) -> int:
        """The full path: everything ``report`` (arrived at ``now``) says, in one transaction; what it
        changed announced."""
        since = self._digests.since(report.server_id)
        recorded = self._db.write(
            lambda session: self._store.record_report(session, report, now, epoch=self._term.epoch)
        )
        if not recorded.touched and recorded.state != ServerState.LOST:
            self._keep_digest(report.server_id, since, self._term.epoch, observed=recorded.observed_generation,
                              desired=recorded.desired_generation, health=health_of(report))
        if recorded.touched:
            self._notices.servers_changed(recorded.touched)  # also requests a cycle
        elif recorded.cycle_needed:
            self._notices.state_changed()
        return recorded.desired_generation

    def write_behind(self, item: BehindReport) -> None:
        """On the writer's thread: a telemetry-only report answered from memory, recorded in full
        (unless a report that arrived after it was). A failure (the server deleted, a new term) is
        logged and its digest forgotten: the server's next report takes the full path and its agent
        is answered with the error there."""
        report = item.report
        try:
            with self._order.recording(report.server_id, item.ticket, behind=True) as current:
                if current:
                    self._record(report, item.arrived_at)
        except Exception as exc:  # noqa: BLE001 - the agent hears of it at its next report
            self._digests.forget([report.server_id])
            log.warning("a status report's telemetry could not be written; the server's next report takes the "
                        "full path", server=report.server_id, error=str(exc))

    def write_behind_many(self, items: Sequence[BehindReport]) -> None:
        """On the writer's thread: ``write_behind`` for many servers' reports (one each), in one transaction
        of a few statements (``AgentStore.record_telemetry``) where they are what such reports usually are:
        at 1,000 agents a transaction per report took 40% of the scheduler's interpreter. A report that path
        leaves, or a batch that fails, is written report by report, as ``write_behind`` writes it."""
        left: list[BehindReport] = []
        with self._order.recording_behind(items) as current:
            since = {item.server_id: self._digests.since(item.server_id) for item in current}
            epoch = self._term.epoch
            try:
                recorded = self._db.write(lambda session: self._store.record_telemetry(
                    session, [(item.report, item.arrived_at) for item in current], epoch=epoch))
            except Exception as exc:  # noqa: BLE001 - each report's own path says which one, and why
                log.warning("a batch of status reports' telemetry could not be written; writing them one by one",
                            reports=len(current), error=str(exc))
                recorded = {}
            for item in current:
                done = recorded.get(item.server_id)
                if done is None:
                    left.append(item)
                    continue
                self._keep_digest(item.server_id, since[item.server_id], epoch, observed=done.observed_generation,
                                  desired=done.desired_generation, health=health_of(item.report))
        if any(done.cycle_needed for done in recorded.values()):
            self._notices.state_changed()
        for item in left:  # after the batch's turns are let go: ``write_behind`` takes its own
            self.write_behind(item)

    def _keep_digest(self, server_id: str, since: int, epoch: int, *, observed: int, desired: int,
                     health: tuple[tuple[int, bool], ...]) -> None:
        """The digest of what was just recorded for ``server_id`` under ``epoch``, written now; kept only if
        nothing forgot the server since the mark ``since`` (``ReportDigests.put``)."""
        self._digests.put(server_id, ReportDigest(epoch=epoch, observed_generation=observed, desired_generation=desired,
                                                  health=health, written_at=self._clock.monotonic()), since)

    def answer_from_memory(self, report: StatusReport) -> int | None:
        """``report_status``'s fast path, safe on any thread and touching no database: when ``report``
        carries nothing that needs the database now, record that the server was heard from and return
        the desired generation to answer with; otherwise None (call ``report_status``). A report whose
        telemetry is due is answered here too where a writer writes it behind the answer."""
        digest, due = self._unchanged_since_digest(report)
        if digest is None or report.observed_generation > digest.observed_generation:
            return None
        if due:
            if self._behind is None or self._telemetry_write_s <= 0:
                return None  # written before the answer (telemetry_write_s 0: every report, as it comes)
            if not self._behind.offer(BehindReport(self._order.ticket(), self._clock.now(), report)):
                return None  # the writer stopped: on the caller's thread, as without one
            self._digests.written(report.server_id, digest, self._clock.monotonic())
        self._heartbeats.heard(report.server_id)
        return digest.desired_generation

    def _unchanged_since_digest(self, report: StatusReport) -> tuple[ReportDigest | None, bool]:
        """The server's digest when ``report`` says nothing new but (perhaps) a newer observed
        generation: same epoch, same GPU health, no exit the scheduler did not ask for; and whether
        its telemetry is due (last written ``telemetry_write_s`` ago or more). None when it must take
        the full path."""
        digest = self._digests.get(report.server_id)
        epoch = self._term.epoch
        if (
            digest is None
            or digest.epoch != epoch
            or report.scheduler_epoch != epoch
            or health_of(report) != digest.health
            or any(w.phase == "EXITED" and not w.stop_requested for w in report.workers)
            # A stop ended by a checkpoint acknowledgement: the requeued job's resume point (reported once).
            or any(w.stop_acknowledged for w in report.workers)
        ):
            return None, False
        return digest, self._clock.monotonic() - digest.written_at >= self._telemetry_write_s

    def _record_observed_generation(self, report: StatusReport, digest: ReportDigest) -> int | None:
        """A report whose only news is a newer observed generation (the agent converged after a push:
        100s of them follow a burst of decisions): one UPDATE of the server's heartbeat columns, no
        telemetry (written on its own schedule). Returns the desired generation, or None when the
        server turned out to be LOST (the full path brings it back)."""
        row = self._db.write(lambda session: self._store.record_observed_generation(session, report))
        if row is None:
            return None
        self._heartbeats.heard(report.server_id)
        self._digests.advance(report.server_id, digest, observed=row.observed, desired=row.desired)
        if row.state in (ServerState.RECLAIMING, ServerState.SERVING):
            # A reclaimed server waits for exactly this confirmation to serve again; routing too.
            self._notices.state_changed()
        return int(row.desired)

    def deregister(self, server_id: str, reason: str) -> None:
        """The server's agent leaves the cluster (it was stopped and stops its workers): LOST and LEFT at
        once, and a cycle is requested, whose plan shrinks or requeues its jobs (``core.faults``,
        reason SERVER_LEFT: not a failure). It comes back when its agent registers again."""
        change = self._db.write(lambda session: self._admin.deregister(session, server_id, reason))
        self._digests.forget([server_id])
        self._notices.servers_changed({server_id, *change.touched})

    def desired_state(self, server_id: str) -> DesiredServerState:
        state = self.desired_states([server_id]).get(server_id)
        if state is None:
            raise NotFound(f"server {server_id} is not registered")
        return state

    def desired_states(self, server_ids: Sequence[str]) -> dict[str, DesiredServerState]:
        """The desired state of each registered server among ``server_ids``, from one consistent
        read: three queries however many servers (the agent streams' fan-out after a commit)."""
        ids = sorted(set(server_ids))
        return self._db.read(lambda session: self._desired.read(session, ids))

    def desired_generations(self, server_ids: Sequence[str]) -> dict[str, int]:
        """The desired generation of each registered server among ``server_ids`` (the streams' re-reads check
        these first, ``notify.DesiredStateFeed.generations``)."""
        ids = sorted(set(server_ids))
        return self._db.read(lambda session: self._desired.generations(session, ids))
