"""The pure decision core: a frozen cluster snapshot in, a plan out.

Must never import grpc, SQLAlchemy, pynvml, or read the wall clock: ``now`` and the seed arrive in
the snapshot, so a plan is a deterministic function of its input. The service and the simulator
both drive this same code.
"""

from scheduler_service.core.plan import KeepPending, Plan, Reason, StartJob, WorkerPlacement
from scheduler_service.core.registry import PolicyRegistry, UnknownPolicy, policies
from scheduler_service.core.snapshot import ClusterSnapshot, DemandView, JobView, ServerView, WorkerView

__all__ = [
    "ClusterSnapshot",
    "DemandView",
    "JobView",
    "KeepPending",
    "Plan",
    "PolicyRegistry",
    "Reason",
    "ServerView",
    "StartJob",
    "UnknownPolicy",
    "WorkerPlacement",
    "WorkerView",
    "policies",
]
