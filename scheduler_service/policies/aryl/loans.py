"""Step 0 of an Aryl cycle: the loan cycle. From the inference demand, drained loans become active, loans
still draining are cancelled when inference needs servers back, loaned servers are reclaimed
(``choose_reclaim``: the cheapest set by whole cost, exact while small, else greedy; a deadline a preemption
makes a job miss counted in),
vacated reclaimed servers serve again, and idle inference servers beyond demand are loaned while training
has work for them.

Must never place a queued job or size a running one beyond the reclaim's scale-ins (steps 1 and 2:
``base``, ``sizing``). Pure: no I/O, no wall clock; deterministic for a given snapshot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler_service.core.goodput_fit import job_goodput
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import LoanNote, LoanStep, PreemptJob, Reason, clock_time
from scheduler_service.core.predict import predicted_remaining
from scheduler_service.core.protection import (
    Mechanism,
    overridden,
    protection,
    reclaim_penalty,
    reclaim_scale_in_penalty,
)
from scheduler_service.core.registry import ReclaimDecision
from scheduler_service.core.snapshot import ClusterSnapshot, DemandView, ServerView
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.policies.aryl.cycle import LoanRisk, _Cycle, _Job, _work_lost, goodput_estimate
from scheduler_service.solvers.reclaim import ReclaimInstance, reclaim_most_recent_first, reclaim_solve

_TRAINING_OR_DRAINING = (ServerState.TRAINING, ServerState.LOANED, ServerState.DRAINING)


def loan_cycle(cycle: _Cycle, *, naive_reclaim: bool, elastic: bool, forecast: bool = True) -> None:
    """Step 0: the loans and reclaims the inference demand calls for (the module doc). ``naive_reclaim``:
    reclaim the most recently loaned servers (``choose_reclaim``); ``elastic``: training's demand counts
    its running jobs' growth; ``forecast``: reclaim ahead of the demand's forecast and loan only what it
    leaves (``demand_outlook``), else on the need now alone (reactive)."""
    p, snap = cycle.params, cycle.snapshot
    inference = [s for s in snap.servers if s.pool == Pool.INFERENCE]
    by_state: dict[ServerState, list[ServerView]] = {}
    for s in sorted(inference, key=lambda s: (s.state_since, s.server_id)):
        by_state.setdefault(s.state, []).append(s)
    # Vacated reclaimed servers serve again once their agent confirms it stopped the workers, or
    # at the reclaim's hard deadline, set by the RECLAIM step (``core.apply_rules.ApplySettings.reclaim_deadline``;
    # the router still routes there only once the agent confirms).
    for s in by_state.get(ServerState.RECLAIMING, []):
        if s.allocated:
            continue
        why = (
            "training workers stopped; serving inference again" if s.agent_converged
            # The stored deadline, not this policy's params: they may have changed since the RECLAIM.
            else f"reclaim deadline of {s.reclaim_deadline - s.state_since:.0f}s passed before the agent "
                 "confirmed the workers stopped; returned to inference by force"
            if s.reclaim_deadline is not None and snap.now >= s.reclaim_deadline else None
        )
        if why is not None:
            cycle.act(s.server_id, LoanStep.RETURN, ServerState.SERVING, Reason.RETURNED_TO_SERVING, why)
    # Servers an operator took out: a loan still draining is cancelled (training may not use a
    # cordoned server), and a drained one on loan is reclaimed the normal way (its jobs shrink or
    # requeue as for any reclaim).
    for s in by_state.get(ServerState.DRAINING, []):
        if s.cordoned:
            cycle.act(s.server_id, LoanStep.CANCEL, ServerState.SERVING, Reason.LOAN_CANCELLED,
                      f"server {s.server_id} is cordoned ({s.admin}): not lent to training")
    # A drain honours protection windows until its deadline, as on any server (``core.faults``): a loaned
    # server holding a protected job is taken back once the window ends or the deadline passes.
    taken_out = [s for s in by_state.get(ServerState.LOANED, []) if s.draining
                 and not _drain_waits(cycle, s)]
    if taken_out:
        _reclaim(cycle, taken_out, len(taken_out), why="an operator drains it", naive=naive_reclaim,
                 mechanism=Mechanism.DRAIN, need="must meet the operator's deadline")
    if snap.demand is None:  # no demand signal yet: never loan blind
        cycle.loan_note = LoanNote(Reason.NOT_LOANED_NO_DEMAND,
                                   "no server loaned: no inference demand reported yet (loans follow the "
                                   "router's demand signal)")
        return
    outlook = demand_outlook(snap.demand, len(inference), p, forecast=forecast, speed=_lent_speed(cycle, inference))
    needed = outlook.needed
    serving = list(cycle.server_state.values()).count(ServerState.SERVING)
    coming_back = sum(1 for s in by_state.get(ServerState.RECLAIMING, [])
                      if cycle.server_state[s.server_id] == ServerState.RECLAIMING)
    deficit = outlook.reclaim_to - serving - coming_back
    draining = [s for s in by_state.get(ServerState.DRAINING, []) if not s.cordoned]
    if deficit > 0:
        for s in reversed(draining):  # the most recent loans are the cheapest to cancel
            if deficit == 0:
                break
            cycle.act(s.server_id, LoanStep.CANCEL, ServerState.SERVING, Reason.LOAN_CANCELLED,
                      outlook.reclaim_why or f"inference needs {needed} server(s) again")
            deficit -= 1
        if deficit > 0:
            _reclaim(cycle, [s for s in by_state.get(ServerState.LOANED, []) if not s.draining], deficit,
                     why=outlook.reclaim_why or f"inference needs {needed} serving server(s)", naive=naive_reclaim)
    for s in draining:
        if cycle.server_state[s.server_id] != ServerState.DRAINING:
            continue
        # The router's acknowledgement is the normal path; the timeout covers deployments without
        # a router (demand reported by hand or by the user's own load balancer).
        why = (
            "the router reports no requests in flight; lent to training" if s.drained
            else f"drained for {p.drain_timeout_s:.0f}s; lent to training"
            if snap.now - s.state_since >= p.drain_timeout_s else None
        )
        if why is not None:
            cycle.act(s.server_id, LoanStep.ACTIVATE, ServerState.LOANED, Reason.LOAN_ACTIVE, why)
    surplus = serving - outlook.keep - p.loan_buffer_servers
    if deficit <= 0 and surplus > 0:
        _loan(cycle, by_state.get(ServerState.SERVING, []), surplus, outlook, elastic=elastic)
    else:
        cycle.loan_note = LoanNote(
            Reason.NOT_LOANED_NO_SURPLUS,
            f"{_no_loan(cycle)}: inference needs {outlook.keep_text} + {p.loan_buffer_servers} spare "
            f"(policy.loan_buffer_servers); {serving} serving" + (f", {coming_back} coming back" if coming_back
                                                                  else ""))


@dataclass(frozen=True)
class DemandOutlook:
    """What the loan cycle holds inference to: ``needed`` serving servers now (the routers' signal),
    ``reclaim_to`` serving or coming back now (reclaim starts ahead of a forecast rise), and ``keep``
    that no loan may take (a loan must not be needed back before it pays for its restarts)."""

    needed: int
    reclaim_to: int
    keep: int
    reclaim_why: str = ""   # the reason a reclaim ahead of the need gives ("" when the need now asks for it)
    keep_text: str = ""


def demand_outlook(demand: DemandView, inference_servers: int, params: PolicyParams, *, forecast: bool,
                   speed: float = 1.0) -> DemandOutlook:
    """The need now and, with ``forecast`` and a forecast in the demand (``core.demand_forecast``), ahead:

    - ``reclaim_to``: the forecast's upper band over the *lead* -- the measured reclaim latency (the reclaim
      deadline, ``policy.reclaim_deadline_s``, before any is measured) plus the decision lag: a reclaim
      started now serves then, so a rise within it must be reclaimed for now;
    - ``keep``: the band over the lead plus a loan's *payback*, ``2 x policy.restart_cost_s / speed`` (a loan
      costs the job that grows onto it one restart and its reclaim another, and a server ``speed`` times as fast
      as training's reference GPUs, ``_lent_speed``, earns them back at that pace): a server needed back sooner
      than that costs training more than it gains.

    The band's quantile is ``1 - policy.inference_short_budget``: the need rises beyond it within the horizon
    at about that share of moments, and then is met reactively, one reclaim latency late. Never beyond the
    inference cluster. Without a forecast: the need now, for all three (reactive)."""
    needed = demand.servers_needed
    view = demand.forecast if forecast else None
    if view is None:
        return DemandOutlook(needed, needed, needed, keep_text=f"{needed} server(s)")
    q = 1.0 - params.inference_short_budget
    lead = view.lead_s(params.reclaim_deadline_s)
    soon = view.forecast(lead, q)
    later = view.forecast(lead + 2.0 * params.restart_cost_s / (speed if speed > 0 else 1.0), q)
    reclaim_to = max(needed, min(inference_servers, math.ceil(soon.upper - 1e-9)))
    keep = max(reclaim_to, min(inference_servers, math.ceil(later.upper - 1e-9)))
    measured = ("measured" if view.reclaim_latency_s is not None
                else "not measured yet: policy.reclaim_deadline_s")
    why = (f"the demand forecast says inference needs {reclaim_to} serving server(s) within {lead:.0f}s, the time "
           f"a reclaim takes to serve (reclaim latency {measured}, plus the decision lag; upper band at "
           f"{q:.1%}, policy.inference_short_budget = {params.inference_short_budget:g}); it needs {needed} now"
           ) if reclaim_to > needed else ""
    keep_text = (f"{needed} server(s) now and up to {keep} within {later.horizon_s:.0f}s by its forecast"
                 if keep > needed else f"{needed} server(s)")
    return DemandOutlook(needed, reclaim_to, keep, why, keep_text)


# The horizons the risk-valued loans are worked out for (``loan_risk``): from 10 minutes to a day; a job with
# longer left is valued at the day's risk.
RISK_WINDOWS_S = (600.0, 1800.0, 3600.0, 3 * 3600.0, 6 * 3600.0, 12 * 3600.0, 24 * 3600.0)


def _lent_speed(cycle: _Cycle, inference: list[ServerView]) -> float:
    """How fast a loaned server computes for training, relative to training's reference GPUs: its GPU type's
    declared speed (``ClusterSnapshot.gpu_speed``), averaged over the inference servers; 1.0 on a cluster of one
    type or where no speed is declared (a loan is valued as before types had speeds)."""
    types, declared = cycle.server_types(), cycle.declared_speeds
    if not declared or not inference or len(types) <= 1:
        return 1.0
    return sum(declared.get(s.gpu_type, 1.0) for s in inference) / len(inference)


def loan_risk(cycle: _Cycle) -> LoanRisk | None:
    """The risk-valued loans (after step 0's loans and reclaims): how likely a loaned server is to go back to
    inference within each of ``RISK_WINDOWS_S``, from the demand forecast: the expected share of the loaned
    servers that the need's rises, as the forecast saw them from its anchors, take back within the window
    plus the reclaim lead (a reclaim starts that far ahead of the need). None without a forecast or a loaned
    server. The sizing values an extra worker by it (``sizing.completion_rates``): the "liveput" of spot-instance
    training, applied to loaned servers."""
    demand = cycle.snapshot.demand
    view = demand.forecast if demand is not None else None
    if view is None:
        return None
    states = [state for sid, state in cycle.server_state.items() if cycle.servers[sid].pool == Pool.INFERENCE]
    loaned = sum(state in (ServerState.LOANED, ServerState.DRAINING) for state in states)
    if not loaned:
        return None
    serving = sum(state in (ServerState.SERVING, ServerState.RECLAIMING) for state in states)
    lead = view.lead_s(cycle.params.reclaim_deadline_s)
    shares = view.reclaimed_shares([w + lead for w in RISK_WINDOWS_S], serving, loaned)
    return LoanRisk(RISK_WINDOWS_S, shares)


def _reclaim(cycle: _Cycle, loaned: list[ServerView], count: int, *, why: str, naive: bool,
             mechanism: Mechanism = Mechanism.RECLAIM, need: str = "") -> None:
    decision = choose_reclaim(cycle.running, loaned, count, cycle.params, cycle.snapshot.now, naive=naive,
                              goodput_servers=cycle.goodput_servers)
    chosen = set(decision.servers)
    # A protected job is disrupted only when the servers without one did not suffice (``choose_reclaim``).
    need = need or (f"needs {len(decision.servers)} loaned server(s) back and those without protected jobs "
                    "do not suffice")
    # Under ``policy.reclaim_protection`` "shrink" a protected job is shrunk where that costs least, not last
    # (said so unless the loaned servers without protected jobs were too few anyway).
    shielded = {w.server_id for job_id in cycle.protected if job_id in cycle.running
                for w in cycle.running[job_id].workers}
    unshielded = sum(server.server_id not in shielded for server in loaned)
    shrink_need = need if cycle.params.reclaim_protection == "strict" or unshielded < len(decision.servers) else (
        f"needs {len(decision.servers)} loaned server(s) back, and shrinking it costs less than the other choices "
        "(policy.reclaim_protection = shrink)")
    for job_id in decision.preempted:
        job = cycle.running.pop(job_id)
        shield = cycle.protected.get(job_id)
        preemption = PreemptJob(
            job_id, Reason.PREEMPTED_FOR_RECLAIM,
            f"its loaned server(s) {', '.join(sorted(chosen & {w.server_id for w in job.workers}))} "
            f"went back to inference; below min_workers={job.view.min_workers}, requeued"
            + (f"; {overridden(shield, mechanism, need)}" if shield else ""))
        if naive:  # the baseline: whatever runs there is preempted
            cycle.preemptions.append(preemption)
        else:  # restarted elsewhere if it fits (``base.relocate_displaced``), else preempted
            cycle.displaced.append((job, preemption))
    for job_id, _, after in decision.scaled_in:
        job = cycle.running[job_id]
        job.workers = [w for w in job.workers if w.server_id not in chosen]
        assert len(job.workers) == after
        job.reclaimed = True
        shield = cycle.protected.get(job_id)
        if shield is not None:
            job.override = overridden(shield, mechanism, shrink_need if mechanism == Mechanism.RECLAIM else need)
        job.scaled_in(Reason.SCALED_IN_FOR_RECLAIM)
    for server_id in decision.servers:
        cycle.act(server_id, LoanStep.RECLAIM, ServerState.RECLAIMING, Reason.RECLAIMED_FOR_INFERENCE, why)


def _loan(cycle: _Cycle, serving: list[ServerView], surplus: int, outlook: DemandOutlook, *, elastic: bool
          ) -> None:
    p, snap = cycle.params, cycle.snapshot
    demand = _training_demand_gpus(cycle, elastic=elastic)
    if demand <= 0:
        cycle.loan_note = LoanNote(Reason.NOT_LOANED_NO_TRAINING_DEMAND,
                                   f"{_no_loan(cycle)}: training needs no more GPUs than are free")
        return
    idle = [s for s in serving
            if snap.now - s.state_since >= p.loan_idle_s and not s.unhealthy_gpus and not s.cordoned]
    if not idle:
        waiting = [s for s in serving if snap.now - s.state_since < p.loan_idle_s and not s.unhealthy_gpus]
        cycle.loan_note = LoanNote(
            Reason.NOT_LOANED_NOT_IDLE,
            f"{_no_loan(cycle)}: {surplus} serving server(s) to spare, but "
            + (f"none has served {p.loan_idle_s:.0f}s (policy.loan_idle_s) in its state yet; the first may "
               f"be loaned at {clock_time(min(s.state_since for s in waiting) + p.loan_idle_s)}" if waiting
               else "none is fit to lend (unhealthy GPUs, or taken out by an operator)"))
        return
    cycle.loan_note = LoanNote(None)  # loans this cycle: their LOAN events say why
    for s in idle[:surplus]:  # longest idle first
        if demand <= 0:
            break
        cycle.act(s.server_id, LoanStep.LOAN, ServerState.DRAINING, Reason.LOANED_IDLE_SERVER,
                  f"inference needs {outlook.keep_text} + {p.loan_buffer_servers} spare; training waits for "
                  f"{demand} GPU(s)")
        demand -= len(s.gpu_indices)


def _training_demand_gpus(cycle: _Cycle, *, elastic: bool) -> int:
    """GPUs training could use now beyond what is free on training-capable servers. A running job grows on its
    own GPU type only (``core.placement``): on a cluster of several types, only the growth of jobs running on an
    inference server's type counts (a loan cannot serve the others)."""
    snap = cycle.snapshot
    pending = sum(j.min_workers * j.gpus_per_worker for j in snap.pending_jobs())
    types = cycle.server_types()
    lendable = {s.gpu_type for s in snap.servers if s.pool == Pool.INFERENCE} if len(types) > 1 else set(types)
    growth = sum(
        (j.view.max_workers - len(j.workers)) * j.view.gpus_per_worker
        for j in cycle.running.values() if cycle.servers[j.workers[0].server_id].gpu_type in lendable
    ) if elastic else 0
    free, state = 0, cycle.server_state
    for s in snap.servers:
        if state[s.server_id] in _TRAINING_OR_DRAINING and not s.cordoned:
            free += len(s.free_gpus)
    return pending + growth - free


def _drain_waits(cycle: _Cycle, server: ServerView) -> bool:
    """Does an operator's drain of this loaned server wait (``core.protection``)? While a job on it is in
    its protection window and the drain's deadline (if any) has not passed."""
    deadline = server.drain_deadline
    if deadline is not None and cycle.snapshot.now >= deadline:
        return False
    return any(job_id in cycle.protected and any(w.server_id == server.server_id for w in job.workers)
               for job_id, job in cycle.running.items())


def _no_loan(cycle: _Cycle) -> str:
    """How a loan note begins: whether some server is lent already."""
    lent = any(state in (ServerState.DRAINING, ServerState.LOANED) for state in cycle.server_state.values())
    return "no further server loaned" if lent else "no server loaned"


def choose_reclaim(running: dict[int, _Job], loaned: list[ServerView], count: int, params: PolicyParams,
                   now: float, *, naive: bool = False, goodput_servers: int = 0) -> ReclaimDecision:
    """The cheapest servers to return by their whole cost (``solvers.reclaim.reclaim_solve``: exact while the
    subsets to try are few, else greedy on server preemption cost, recomputed after each pick). Loans younger
    than ``min_loan_s`` are taken only when the older ones do not suffice. ``naive``: the baseline
    the greedy is measured against -- the most recently loaned servers, whatever runs on them.
    ``goodput_servers`` > 0 (the servers' GPUs; a goodput-aware policy): a job with a fitted goodput
    model also pays, per worker it loses, the completion time its goodput model says that worker saves
    (``_goodput_scale_in_cost``), and its deadline cost reads its goodput estimate; 0: as without."""
    old = [s for s in loaned if s.loan_started_at is None or now - s.loan_started_at >= params.min_loan_s]
    candidates = old if len(old) >= count else loaned
    count = min(count, len(candidates))
    if count <= 0:
        return ReclaimDecision((), (), (), 0.0)
    index = {s.server_id: i for i, s in enumerate(candidates)}
    jobs = sorted(
        (j for j in running.values() if any(w.server_id in index for w in j.workers)), key=lambda j: j.view.job_id
    )
    # Anti-thrashing (``core.protection``): a protected job weighs a penalty per worker stopped, so the
    # reclaim stops one only when the servers without do not suffice (inference must get its servers back);
    # shrinking one weighs the same (``policy.reclaim_protection`` "strict") or one more restart of the job
    # ("shrink"). The decision's cost leaves the stop penalties out.
    shields = [protection(j.view, now, params) for j in jobs]
    penalty = [reclaim_penalty(shield) for shield in shields]
    shrink_penalty = [reclaim_scale_in_penalty(shield, params, len(j.workers) * j.view.gpus_per_worker)
                      for j, shield in zip(jobs, shields, strict=True)]
    stop_like = [m if m == sm else 0.0 for m, sm in zip(penalty, shrink_penalty, strict=True)]  # no real cost
    triples: dict[tuple[int, int], int] = {}
    for ji, job in enumerate(jobs):
        for w in job.workers:
            if w.server_id in index:
                key = (ji, index[w.server_id])
                triples[key] = triples.get(key, 0) + 1
    instance = ReclaimInstance.from_triples(
        [(j, s, n) for (j, s), n in sorted(triples.items())],
        n_servers=len(candidates),
        job_workers=[len(j.workers) for j in jobs],
        job_min=[j.view.min_workers for j in jobs],
        # A preemption loses the work since the checkpoint and pays a restart, like a scale-in does;
        # so even a job that has just checkpointed is cheaper to shrink than to requeue.
        # A preemption that makes a job miss the deadline it would meet costs that deadline too.
        job_cost=[_with_deadline_cost(j, now, params, _work_lost(j, now)
                                      + params.restart_cost_s * len(j.workers) * j.view.gpus_per_worker,
                                      goodput_servers)
                  + m * len(j.workers) for j, m in zip(jobs, penalty, strict=True)],
        scale_in_cost=[params.restart_cost_s * j.view.gpus_per_worker + m
                       + _goodput_scale_in_cost(j, now, params, goodput_servers)
                       for j, m in zip(jobs, shrink_penalty, strict=True)],
    )
    if naive:
        loaned_at = [s.loan_started_at if s.loan_started_at is not None else s.state_since for s in candidates]
        outcome = reclaim_most_recent_first(instance, count, loaned_at)
    else:
        outcome = reclaim_solve(instance, count)
    return ReclaimDecision(
        servers=tuple(candidates[int(i)].server_id for i in outcome.servers),
        preempted=tuple(jobs[ji].view.job_id for ji in range(len(jobs)) if outcome.preempted[ji]),
        scaled_in=tuple(
            (jobs[ji].view.job_id, len(jobs[ji].workers), int(outcome.new_workers[ji]))
            for ji in range(len(jobs))
            if not outcome.preempted[ji] and int(outcome.new_workers[ji]) < len(jobs[ji].workers)
        ),
        cost_gpu_s=float(outcome.total_cost) - sum(
            penalty[ji] * len(jobs[ji].workers) if outcome.preempted[ji]
            else stop_like[ji] * (len(jobs[ji].workers) - int(outcome.new_workers[ji]))
            for ji in range(len(jobs))),
    )


def _goodput_scale_in_cost(job: _Job, now: float, params: PolicyParams, gpus_per_server: int) -> float:
    """What one worker fewer costs a job with a fitted goodput model beyond its restart, in GPU-seconds:
    the completion time its goodput model says the worker saves, x its GPUs per worker (0 for other
    jobs, and when ``gpus_per_server`` is 0)."""
    view = job.view
    if gpus_per_server <= 0 or job_goodput(view) is None or len(job.workers) <= 1:
        return 0.0
    est = goodput_estimate(view, now, params, gpus_per_server)
    w = len(job.workers)
    return max(0.0, est.remaining_time(w - 1) - est.remaining_time(w)) * view.gpus_per_worker


def _with_deadline_cost(job: _Job, now: float, params: PolicyParams, cost: float, goodput_servers: int = 0
                        ) -> float:
    """``cost`` (GPU-seconds) of preempting ``job``, plus ``deadline_weight`` x its remaining GPU-time
    when it meets its deadline at its size and would miss it requeued: restarted now at
    ``min_workers`` (a restart's cost, the work lost since its checkpoint redone, the rest). Jobs
    without a deadline (or with ``deadline_weight`` 0) cost exactly ``cost``."""
    view = job.view
    if view.deadline is None or not params.deadline_weight:
        return cost
    est = goodput_estimate(view, now, params, goodput_servers)
    size, low = len(job.workers), view.min_workers
    at_size = predicted_remaining(view, size, now, est, params.amdahl_alpha)
    if now + at_size > view.deadline:
        return cost  # it misses anyway: the preemption does not make it miss
    at_min = predicted_remaining(view, low, now, est, params.amdahl_alpha)
    since = max(t for t in (view.last_checkpoint_at, view.last_resized_at, view.started_at, 0.0) if t is not None)
    redo = max(now - since, 0.0) * (at_min / at_size if at_size > 0 else 1.0)  # the lost work, at min_workers
    if now + params.restart_cost_s + redo + at_min <= view.deadline:
        return cost
    return cost + params.deadline_weight * at_size * size * view.gpus_per_worker


def _loaned_oldest_first(snapshot: ClusterSnapshot) -> list[ServerView]:
    """The LOANED servers in the order the reclaim considers them: longest in that state first."""
    return sorted((s for s in snapshot.servers if s.state == ServerState.LOANED),
                  key=lambda s: (s.state_since, s.server_id))
