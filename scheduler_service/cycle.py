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
from scheduler_service.core.demand_forecast import DemandForecaster
from scheduler_service.core.plan import ApplyResult, LoanStep, Plan
from scheduler_service.core.registry import Policy
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.lifecycle import ServerState


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
    """``forecaster``: the inference demand's forecaster (``core.demand_forecast``), fed here -- each
    snapshot's demand, and each reclaimed server's time from its RECLAIM to its RETURN step -- so that the
    service and the simulator feed it alike; its view goes into the snapshot's demand. None: no forecast
    (the snapshot's demand carries none)."""

    def __init__(self, state: ClusterState, policy: Policy, clock: Clock, *, seed: int = 0,
                 forecaster: DemandForecaster | None = None) -> None:
        self.state = state
        self.policy = policy
        self._clock = clock
        self._seed = seed
        self.forecaster = forecaster

    def run_once(self) -> CycleReport:
        start = self._clock.monotonic()
        snapshot = self.state.snapshot(seed=self._seed)
        if self.forecaster is not None and snapshot.demand is not None:
            self.forecaster.observe(snapshot.now, snapshot.demand.servers_needed)
            snapshot = replace(snapshot, demand=replace(snapshot.demand,
                                                        forecast=self.forecaster.view(snapshot.now)))
        decided = self._clock.monotonic()
        plan = only_changed_reasons(self.policy.schedule(snapshot), snapshot)
        decide_s = self._clock.monotonic() - decided
        result = self.state.apply(plan)
        if self.forecaster is not None and result.server_steps:
            reclaiming = {s.server_id: s.state_since for s in snapshot.servers if s.state == ServerState.RECLAIMING}
            for server_id, step in result.server_steps:
                if step == LoanStep.RETURN and server_id in reclaiming:
                    self.forecaster.observe_reclaim(snapshot.now - reclaiming[server_id])
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
