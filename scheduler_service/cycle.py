"""The scheduling cycle, shared by the service and the simulator:
observe (snapshot) -> decide (policy) -> apply (one transaction) -> act (agents are told after commit).

The cycle only talks to ports: a ``ClusterState`` (snapshot + apply) and the policy. The service's
ClusterState is ``SchedulerApp.cluster`` (``scheduler_service.app.cluster``), which notifies agents
itself after commit; a simulator supplies an in-memory ClusterState and a virtual clock. There is no
simulation branch here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from scheduler_service.core.clock import Clock
from scheduler_service.core.plan import ApplyResult, Plan
from scheduler_service.core.registry import Policy
from scheduler_service.core.snapshot import ClusterSnapshot


class ClusterState(Protocol):
    def snapshot(self, seed: int = 0) -> ClusterSnapshot: ...
    def apply(self, plan: Plan) -> ApplyResult: ...


@dataclass(frozen=True)
class CycleReport:
    snapshot_jobs: int
    plan: Plan
    result: ApplyResult
    decide_s: float
    total_s: float


class SchedulingCycle:
    def __init__(self, state: ClusterState, policy: Policy, clock: Clock, *, seed: int = 0) -> None:
        self.state = state
        self.policy = policy
        self._clock = clock
        self._seed = seed

    def run_once(self) -> CycleReport:
        start = self._clock.monotonic()
        snapshot = self.state.snapshot(seed=self._seed)
        decided = self._clock.monotonic()
        plan = only_changed_reasons(self.policy.schedule(snapshot), snapshot)
        decide_s = self._clock.monotonic() - decided
        result = self.state.apply(plan)
        return CycleReport(len(snapshot.jobs), plan, result, decide_s, self._clock.monotonic() - start)


def only_changed_reasons(plan: Plan, snapshot: ClusterSnapshot) -> Plan:
    """Drop pending reasons, size notes and the loan note equal to what is already shown: a reason is
    recorded (and an event written) when it changes, not on every cycle."""
    if not (plan.pending or plan.held or plan.loan_note is not None):
        return plan
    shown = {job.job_id: job for job in snapshot.jobs}
    changed = tuple(p for p in plan.pending if (j := shown.get(p.job_id)) is None or j.pending_reason != p.summary)
    held = tuple(h for h in plan.held if (j := shown.get(h.job_id)) is None or j.size_note != h.summary)
    loan_note = plan.loan_note
    if loan_note is not None and loan_note.summary == snapshot.loan_note:
        loan_note = None
    return replace(plan, pending=changed, held=held, loan_note=loan_note)
