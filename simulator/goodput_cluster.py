"""The goodput job model's cluster: the scheduling cycle's ``ClusterState`` port (``snapshot`` + ``apply``)
over ``nodes`` x ``gpus_per_node`` GPUs and the jobs of a Pollux workload (``simulator.goodput_jobs``).

One applier for both job models: the servers, GPUs, allocations and job lifecycles are held by the main
engine's ``SimulatedCluster`` (``simulator.cluster``), and every plan is applied by it -- in
``core.plan.apply_order``, each action re-checked by ``core.apply_rules`` -- as the service's applier
applies the service's plans (``tests/contract/test_apply_contract.py`` holds all of them to the same results, this
one included). What this module adds is the job model's physics:

- a job's progress and completion are its ``SimJob``'s, not the simulated cluster's linear segments:
  there a job has no work of its own to finish (infinite work) and completes when its SimJob says so
  (``arrive``, at a decision);
- every applied change of a job's allocation (a start, a resize, a preemption) reallocates its SimJob:
  its new placement (GPUs per node, in the order ``JobDeclaration.allocation`` reads), its restart, its
  batch size;
- the snapshot shows each job as the run's ``JobDeclaration`` declares it (``simulator.goodput_policies``):
  its worker range, and what a registered policy is told of its speed and work.

Nouns: a *node* is a training server (``n0``, ``n1``, ...); a job's *allocation* is one node index per
GPU (one worker per GPU). What this module must never do: decide (the policies do), look at which policy
runs, or change a job's allocation other than through a plan the rules allowed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from scheduler_service.core.clock import Clock
from scheduler_service.core.plan import ApplyResult, Plan
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, WorkerView
from simulator.cluster import SimulatedCluster
from simulator.goodput_jobs import SimJob, placement_of
from simulator.model import ClusterSpec, TraceJob


class JobDeclaration(Protocol):
    """What a job of the goodput model declares to the policy and to the applier's rules."""

    def shape(self, job: SimJob) -> tuple[int, int, int]:
        """Its GPUs per worker, ``min_workers`` and ``max_workers``, fixed for its life."""
        ...

    def view(self, job: SimJob, shown: JobView, now: float) -> JobView:
        """The job as the snapshot shows it, from its state in the cluster (``shown``: workers,
        lifecycle state, start and resize times) and its SimJob."""
        ...

    def allocation(self, workers: Sequence[WorkerView]) -> list[int]:
        """The job's allocation as its SimJob runs it (one node index per GPU; its placement is the GPUs
        per node in this order), from its workers by rank."""
        ...


def node_index(server_id: str) -> int:
    """``n7`` -> 7: the node's index."""
    return int(server_id[1:])


def allocation_of(workers: Sequence[WorkerView]) -> list[int]:
    """The node of each GPU of these workers, in rank order."""
    return [node_index(w.server_id) for w in sorted(workers, key=lambda w: w.rank) for _ in w.gpu_indices]


class GoodputCluster:
    """The ``ClusterState`` port over the goodput job model, plus what its driver
    (``simulator.goodput_sim.run_workload``) calls: ``advance`` (every job runs for a tick) and
    ``arrive`` (the jobs submitted by now join, the completed ones leave)."""

    def __init__(self, jobs: Sequence[SimJob], cluster: SimulatedCluster, declaration: JobDeclaration, *,
                 restart_s: float) -> None:
        """``cluster``: the simulated cluster to hold the allocations, empty of jobs (``of_nodes`` builds
        the usual one); ``restart_s``: what every re-allocation costs a job (``SimJob.reallocate``)."""
        self.jobs = {job.index: job for job in jobs}  # SimJob.index is its job id
        if len(self.jobs) != len(jobs):
            raise ValueError("two jobs have one index")
        self._cluster = cluster
        self._declaration = declaration
        self._restart_s = restart_s
        self._waiting = sorted(jobs, key=lambda j: (j.spec.submit_time, j.index))  # not yet submitted
        self._active: dict[int, SimJob] = {}  # submitted and not completed, by index

    @classmethod
    def of_nodes(cls, jobs: Sequence[SimJob], nodes: int, gpus_per_node: int, clock: Clock,
                 declaration: JobDeclaration, *, restart_s: float) -> GoodputCluster:
        """``nodes`` training servers of ``gpus_per_node`` GPUs. The simulated cluster's own progress model
        is never used here: no restart overhead of its own, no checkpoints that matter (a goodput job loses
        no progress), no router. Nodes are named n0, n1, ..., as this job model's runs always named them:
        policies break ties by server id, so another naming would move the registered policies' figures."""
        cluster = SimulatedCluster(ClusterSpec(nodes, 0, gpus_per_node), clock, restart_overhead_s=0.0,
                                   drain_ack_s=None, training_server_ids=[f"n{i}" for i in range(nodes)])
        return cls(jobs, cluster, declaration, restart_s=restart_s)

    def advance(self, start: float, seconds: float) -> None:
        """Every job runs from ``start`` for ``seconds`` at its placement (a job without one stands still)."""
        for job in self.jobs.values():
            job.advance(start, seconds)

    def arrive(self) -> int:
        """At a decision (now): the jobs submitted by now join, pending; the jobs that completed leave
        and free their GPUs. Returns how many jobs are active (submitted and not completed)."""
        now = self._cluster.now
        for job in [j for j in self._active.values() if j.completion_time is not None]:
            self._cluster.finish(job.index)
            del self._active[job.index]
        while self._waiting and self._waiting[0].spec.submit_time <= now:
            job = self._waiting.pop(0)
            gpus, low, high = self._declaration.shape(job)
            self._cluster.submit(TraceJob(job.index, job.spec.name, job.spec.submit_time, gpus, low, high,
                                          work=math.inf, throughput=((1, 1.0),), model=job.app.name))
            self._active[job.index] = job
        return len(self._active)

    def snapshot(self, seed: int = 0) -> ClusterSnapshot:
        """The simulated cluster's snapshot, each job shown as the declaration says."""
        shown = self._cluster.snapshot(seed=seed)
        now = shown.now
        return replace(shown, jobs=tuple(self._declaration.view(self.jobs[v.job_id], v, now) for v in shown.jobs))

    def apply(self, plan: Plan) -> ApplyResult:
        """Apply ``plan`` through the simulated cluster (its rules, its order), then reallocate the
        SimJob of every job whose allocation the applied actions changed."""
        before = {k: self._allocation(k) for k in self._active}
        result = self._cluster.apply(plan)
        for key in sorted(set(result.started) | set(result.scaled) | set(result.preempted)):
            after = self._allocation(key)
            if after != before.get(key):
                self._active[key].reallocate(placement_of(after), self._restart_s)
        return result

    def _allocation(self, job_id: int) -> list[int]:
        return self._declaration.allocation(self._cluster.workers_of(job_id))
