"""The application layer: the scheduler service's use cases, over the store, in transactions.

One small class per use case, each built here from the same database sessions, clock and notifier:

- ``jobs`` (``Jobs``): submit, cancel, get, list, explain, locate a rank's logs;
- ``deadlines`` (``Deadlines``): predicted finishes, deadline outlooks, SubmitJob's admission feedback;
- ``explainer`` (``JobExplainer``): a job explained (ExplainJob) by the policy's parameters it is given;
- ``agents`` (``Agents``): register a server, record its status reports, its desired state;
- ``inference`` (``Inference``): demand, drain acknowledgements, the serving pool, reclaim previews;
- ``views`` (``ClusterViews``): servers, loans, the cluster summary, the event log;
- ``liveness`` (``Liveness``): servers whose agents went silent become LOST;
- ``server_admin`` (``ServerAdmin``): an operator's cordon, uncordon, drain and delete of a server;
- ``retention`` (``EventRetention``): events past their retention are pruned, in short chunks;
- ``term`` (``Term``): the scheduler's term and its epoch;
- ``cluster`` (``DatabaseCluster``): the scheduling cycle's port (``snapshot`` + ``apply``).

Servicers translate protobuf to the inputs of ``scheduler_service.records`` and call the use case
they need (from worker threads); the scheduling cycle runs on ``cluster``. Each call is one
transaction: it commits everything it changed (state + event log) or nothing. Notifications (agents'
desired state, event watchers, cycle triggers) go out through the ``Notifier`` port only after commit.

Never: decide placement here (the policy does), talk gRPC (the api package does), or hold SQL (the
store does).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.orm import Session, sessionmaker

from scheduler_service.app.agents import Agents
from scheduler_service.app.cluster import DatabaseCluster
from scheduler_service.app.deadlines import DeadlineAdmission, Deadlines
from scheduler_service.app.explain import JobExplainer
from scheduler_service.app.inference import Inference
from scheduler_service.app.jobs import Jobs
from scheduler_service.app.liveness import Liveness
from scheduler_service.app.memory import Heartbeats, ReportDigests
from scheduler_service.app.notices import Announcer, Notifier, NullNotifier
from scheduler_service.app.queues import Queues
from scheduler_service.app.retention import EventRetention
from scheduler_service.app.server_admin import ServerAdmin
from scheduler_service.app.term import Term
from scheduler_service.app.views import ClusterViews
from scheduler_service.core.apply_rules import DEFAULT_APPLY_SETTINGS, ApplySettings
from scheduler_service.core.clock import Clock
from scheduler_service.core.params import PolicyParams
from scheduler_service.store.agents import AgentStore
from scheduler_service.store.applier import Applier
from scheduler_service.store.changes import StateChanges
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.inference import DemandRules, InferenceStore
from scheduler_service.store.jobs import JobStore
from scheduler_service.store.liveness import LivenessStore
from scheduler_service.store.ports import DEFAULT_MASTER_PORTS, MasterPorts
from scheduler_service.store.server_admin import ServerAdminStore
from scheduler_service.store.snapshot import SnapshotReader
from scheduler_service.store.transactions import Transactions


class SchedulerApp:
    """The use cases of one scheduler, composed. ``master_ports``: the MASTER_PORT range a job's
    workers meet on, one port per (rank 0's server, job) (``store.ports``); ``telemetry_write_s``: how
    often a status report that says nothing new is still written; ``apply_settings``: what the plans are
    applied under (``core.apply_rules.ApplySettings``: how long a reclaimed server waits for its agent)."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        *,
        notifier: Notifier | None = None,
        master_ports: range = DEFAULT_MASTER_PORTS,
        telemetry_write_s: float = 15.0,
        apply_settings: ApplySettings = DEFAULT_APPLY_SETTINGS,
        deadline_admission: DeadlineAdmission = DeadlineAdmission.WARN,
        amdahl_alpha: float = PolicyParams.amdahl_alpha,
        priority_classes: Mapping[str, int] | None = None,
        demand_rules: DemandRules | None = None,
        gpu_speeds: Mapping[str, float] | None = None,
    ) -> None:
        self.notifier: Notifier = notifier or NullNotifier()
        db = Transactions(sessions, publish=self.notifier.desired_states_committed)
        changes = StateChanges(clock)
        self.term = Term(db, changes, clock)
        desired = DesiredStates(epoch=lambda: self.term.epoch)
        heartbeats, digests = Heartbeats(clock), ReportDigests()
        notices = Announcer(self.notifier, db, digests)
        self.cluster = DatabaseCluster(
            db, SnapshotReader(clock, demand_rules, gpu_speeds=gpu_speeds),
            Applier(changes, desired, clock, settings=apply_settings, ports=MasterPorts(master_ports)),
            notices,
        )
        self.queues = Queues(db, clock, notices, snapshot=self.cluster.snapshot, priority_classes=priority_classes)
        self.jobs = Jobs(db, JobStore(changes, desired, clock), clock, notices, queues=self.queues)
        self.deadlines = Deadlines(db, clock, admission=deadline_admission, alpha=amdahl_alpha)
        self.explainer = JobExplainer(self.jobs, self.deadlines, self.queues)
        admin = ServerAdminStore(changes, desired, clock)
        self.agents = Agents(
            db, AgentStore(changes, desired, clock), desired, clock, term=self.term, heartbeats=heartbeats,
            digests=digests, notices=notices, telemetry_write_s=telemetry_write_s, admin=admin,
        )
        self.server_admin = ServerAdmin(db, admin, notices)
        self.inference = Inference(db, InferenceStore(changes, clock, demand_rules), notices,
                                   snapshot=self.cluster.snapshot, clock=clock)
        self.views = ClusterViews(db, clock, demand_rules)
        self.liveness = Liveness(db, LivenessStore(changes, desired, clock), heartbeats, notices,
                                 remove_deleted=self.server_admin.remove_vacated)
        self.retention = EventRetention(db)


__all__ = ["Notifier", "NullNotifier", "SchedulerApp"]
