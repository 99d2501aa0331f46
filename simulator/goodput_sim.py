"""The goodput job model in a cluster: Pollux workloads (``pollux-data/workloads*/workload-N.csv``) run on
``nodes`` x ``gpus_per_node`` GPUs, a decision every ``interval_s``, each job's progress from its
application's measured profile (``simulator.goodput_profiles``) and the goodput equations of
``scheduler_service.core.goodput``. It reproduces the setting of the Pollux study's simulator (OSDI'21,
section 5.3) so that Aryl's policies can be compared with the authors' published figures.

Modelling choices (each is the authors'; each changes the figures):

- **time**: fixed ticks of ``interval_s`` (60 s). Every job advances a tick, then the policy decides at
  the tick's end on the jobs submitted by then and not completed; a job submitted mid-tick waits for the
  next decision. Completion times are exact to the second (see below), so JCT is not a multiple of 60.
- **restart**: every allocation change -- the first start included, and a move to other GPUs of the same
  count -- costs ``restart_s`` (30 s) without progress, counted as attained service. A preempted or
  resized job loses no progress (no checkpoint interval), and jobs never fail.
- **no interference** between jobs sharing a node, and no cluster autoscaling (the study's defaults).
- **progress** within a tick: at the configuration's true step time and true efficiency gain
  (``Application.step_times`` and ``Application.gain``, gradient statistics of the current epoch),
  ``gain / step_time`` iterations-at-initial-batch per second, piecewise by epoch: crossing an epoch
  boundary takes ``round(to_go / rate)`` whole seconds (half to even; the progress is then set to the
  boundary exactly) and the new epoch's statistics apply from there; the job completes when it finishes
  its last epoch.
- **batch size**: fixed as the workload requests it (Tiresias, Optimus); split over the replicas as
  ``core.goodput.split_batch`` (one GPU running more than the initial batch makes two passes), the atomic
  batch cut so that the total stays within the largest validated batch.
- **placement**: the authors' rules return, per job, one node index per GPU; the job's placement is the
  GPUs per node in that order (consecutive equal indices; the plan's ranks keep it), which sets its
  measured step time. A registered policy's placement is read in node order, and a resize that keeps a
  job's GPUs per node is no re-allocation (``goodput_policies.OracleDeclaration.allocation``).
- **NCF** jobs never get more than one GPU (Optimus, Pollux).
- **Pollux's jobs** (``pollux``) choose their own batch size: before they have run, the smallest their GPUs
  allow; then, after every stretch of training and at every re-allocation, the best by their goodput model
  (``policies.pollux.GoodputModel``): the step-time parameters refitted
  (``policies.pollux_search.fit_perf_params_lbfgs``) each time they run a configuration (nodes, GPUs,
  atomic batch) not seen before, and the gradient statistics last measured. NCF keeps 32768.

The run is the scheduler's own cycle (``scheduler_service.cycle.SchedulingCycle``) at every tick's end
on a ``simulator.goodput_cluster.GoodputCluster``, the ``ClusterState`` port of this job model, which
applies every plan by the same rules as the main engine and the service (``core.plan.apply_order``,
``core.apply_rules``); the policy is looked up in the registry (``simulator.goodput_policies``). This
module is the tick driver and the run's figures; a job's physics are ``simulator.goodput_jobs``.

Policies: ``tiresias`` (``scheduler_service.policies.tiresias.tiresias_decide``, requested GPUs as the
gang; queue 0 in arrival order, queue 1 in demotion order) and ``optimus``
(``scheduler_service.policies.optimus.optimus_allocate``, the study's Optimus+Oracle: the oracle's step
time is the true one of a *packed* placement (4 GPUs per node) whatever the job's real placement, with
at least two passes on one GPU even at the initial batch size; ``max_gpus`` = batch size // smallest
atomic batch; the remaining iterations at the requested batch size from the start of the current epoch,
1 in the last). The decisions are the registered policies' own functions, imported, not copied; the
placement of both is ``core.most_free.place_in_order`` (kept jobs stay; the others take the most free node
first). ``pollux`` (``scheduler_service.policies.pollux.pollux_decide``, ``PolluxDecider``) on the jobs' own
fitted models. ``sjf`` and ``aryl-noloan``: the registered policies themselves on snapshots of the
simulated jobs (``simulator.goodput_policies.OracleDeclaration``: what the jobs declare), with ``--param``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from scheduler_service.core.params import PolicyParams
from scheduler_service.cycle import SchedulingCycle
from simulator.clock import VirtualClock
from simulator.goodput_cluster import GoodputCluster
from simulator.goodput_jobs import SimJob, WorkloadError, WorkloadJob, load_workload
from simulator.goodput_policies import GOODPUT_POLICIES, UnreadParams, goodput_policy, parameterised
from simulator.goodput_profiles import load_application

__all__ = ["GOODPUT_POLICIES", "GoodputRunResult", "PlanRefused", "SimJob", "UnreadParams", "WorkloadError",
           "WorkloadJob", "format_summaries", "load_workload", "parameterised", "run_workload", "summary"]


class PlanRefused(AssertionError):
    """The rules refused part of a plan of the goodput job model: nothing changes between a snapshot and
    its plan here, so a sound policy's plan applies in full; a refusal is a defect (of the policy, or of
    ``goodput_policies.plan_for_allocations``), and the run stops rather than diverge from its decisions."""


@dataclass(frozen=True)
class GoodputRunResult:
    policy: str
    jcts: dict[str, float]          # job name -> completion - submission, seconds
    restarts: dict[str, int]
    end_time: float                 # the last completion, seconds since the trace's start
    wall_s: float

    @property
    def average_jct(self) -> float:
        return sum(self.jcts.values()) / len(self.jcts) if self.jcts else 0.0


def run_workload(workload: list[WorkloadJob], data_dir: str | Path, policy: str, *, nodes: int = 16,
                 gpus_per_node: int = 4, interval_s: float = 60.0, restart_s: float = 30.0,
                 max_time_s: float = 30 * 86400.0, until_s: float | None = None,
                 params: PolicyParams | None = None) -> GoodputRunResult:
    """Simulate ``workload`` under ``policy`` (``GOODPUT_POLICIES``) until every job completed, or only the
    intervals up to ``until_s`` of simulated time (a bounded run: the jobs completed by then). ``params``:
    the policy's parameters (``parameterised()`` policies only: the others read none, and say so:
    ``UnreadParams``). ``PlanRefused`` if the rules refuse any action of a plan."""
    started = time.perf_counter()
    chosen = goodput_policy(policy, params, nodes, gpus_per_node)
    jobs = [SimJob(i, spec, load_application(data_dir, spec.application), adaptive=chosen.adaptive_batch)
            for i, spec in enumerate(workload)]
    clock = VirtualClock(0.0)
    cluster = GoodputCluster.of_nodes(jobs, nodes, gpus_per_node, clock, chosen.declaration, restart_s=restart_s)
    cycle = SchedulingCycle(cluster, chosen.build(jobs), clock)
    now = 0.0
    while any(j.completion_time is None for j in jobs):
        if until_s is not None and now >= until_s:
            break
        if now >= max_time_s:
            raise RuntimeError(f"{policy}: jobs still running at {max_time_s} s of simulated time")
        cluster.advance(now, interval_s)
        now += interval_s
        clock.advance_to(now)
        if not cluster.arrive():
            continue
        while True:
            result = cycle.run_once().result
            if result.rejected:
                raise PlanRefused(f"{policy} at t={now}: the rules refused {list(result.rejected[:5])}")
            if not chosen.follow_up_due(now):
                break
    return GoodputRunResult(
        policy=policy,
        jcts={j.spec.name: j.completion_time - j.spec.submit_time for j in jobs if j.completion_time is not None},
        restarts={j.spec.name: max(j.restarts, 0) for j in jobs},
        end_time=max((j.completion_time for j in jobs if j.completion_time is not None), default=now),
        wall_s=time.perf_counter() - started,
    )


def summary(result: GoodputRunResult, settings: dict[str, float]) -> dict[str, object]:
    """The figures of one run (``aryl-sim --job-model goodput``), JSON-ready."""
    jcts = sorted(result.jcts.values())
    return {
        "policy": result.policy, "job_model": "goodput", **settings,
        "jobs": len(jcts), "avg_jct_s": round(result.average_jct, 3), "median_jct_s": _quantile(jcts, 0.5),
        "p99_jct_s": _quantile(jcts, 0.99), "makespan_s": result.end_time,
        "avg_restarts": round(sum(result.restarts.values()) / len(result.restarts), 3),
        "wall_s": round(result.wall_s, 2), "jcts_s": dict(result.jcts),
    }


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (as numpy's default)."""
    position = (len(values) - 1) * q
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def format_summaries(summaries: list[dict[str, object]]) -> str:
    keys = ("jobs", "avg_jct_s", "median_jct_s", "p99_jct_s", "makespan_s", "avg_restarts", "wall_s")
    width = max(12, *(len(str(s["policy"])) + 2 for s in summaries))
    lines = ["metric".ljust(14) + "".join(str(s["policy"]).rjust(width) for s in summaries)]
    for key in keys:
        cells = []
        for s in summaries:
            value = s[key]
            digits = 3 if key == "avg_restarts" else 1
            cells.append((f"{value:.{digits}f}" if isinstance(value, float) else str(value)).rjust(width))
        lines.append(key.ljust(14) + "".join(cells))
    return "\n".join(lines) + "\n"
