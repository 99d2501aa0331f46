"""The Aryl policy (our reconstruction of Lyra, EuroSys'23) and the baselines that share its parts.

One cycle, in order (each step works on the state the previous ones left):

0. **Loan cycle.** From the inference demand: drained loans become active; loans still draining are
   cancelled first when inference needs servers back; then loaned servers are **reclaimed** by their whole
   cost (``solvers.reclaim.reclaim_solve``: exact over every subset while they are few, else greedy on server
   preemption cost): elastic jobs that stay at or above
   ``min_workers`` are scaled in, the others preempted and requeued. Vacated reclaimed servers return
   to serving. Idle inference servers beyond demand + a buffer, idle long enough, are **loaned**
   while training has work for them (hysteresis: the buffer is the band between loan and reclaim).
1. **Joint sizing** (``sizing.joint_sizing``; the elastic variants but ``aryl-nojoint``). One multiple-choice
   knapsack over every queued job (wait, or start at ``min_workers .. max_workers``) and every running
   elastic job outside its protection window (``min_workers`` plus 0 .. its extras), on the free GPUs plus
   those the extras hold. The objective: the sum of the jobs' completion rates, 1 / (estimated remaining
   time + a restart for a size change) -- maximising it runs short jobs first and grows a job only while
   the GPUs speed it up more than they would anywhere else (elastic jobs scale sub-linearly); a queued
   job's rates are multiplied by its response ratio, (waited + run) / run, so a long job rises as it
   waits instead of jumping every queue at ``starvation_s``. Tiers before the rates: within quota before
   borrowing, higher priority class, higher priority, fair share. **Preempt-to-admit**: when every queued job it
   weighs is of one tier and none is of a lower one, running jobs of that tier outside their protection window,
   whose time left something measured or declared says and checkpointed at most ``restart_cost_s`` ago, are in it
   too, from size 0 (preempted, requeued) up, keeping one worth its rate times its response ratio plus what a
   preemption costs it (the work since its checkpoint, a restart); one whose GPUs queued jobs complete more on is
   preempted once step 2 starts a job on them (``sizing.settle_suspensions``), else kept as it was. Why this and not
   Pollux's power mean of speed-ups: it is the rate at which jobs complete, so it reads the estimates where Pollux
   reads none;
   docs/evaluation.md ("Loaning + goodput") measures both, non-clairvoyant.
2. **Base demands.** The queue in order: priority, then shortest estimated remaining GPU-time, then
   arrival (``aryl-nojoint``, ``sjf``, ``aryl-noelastic``: starving jobs first). A job the joint sizing
   deferred waits, or takes GPUs that admitted gangs could not use (``base._start_deferred``). Each
   other job gets ``min_workers`` as a gang, or waits; later jobs backfill around a waiting one, except
   onto the servers reserved for the first starving job that does not fit (those whose jobs end soonest;
   a job estimated to finish before them may still use them). Base workers prefer training-owned servers.
   A gang may take GPUs from other jobs' elastic *extra* workers (they are scaled in for it:
   shrink-to-admit). Queues (``core.quota``): a job its queue may not take the GPUs for waits aside;
   jobs within their queue's quota come first, then higher priority classes, then fair share;
   a gang that still does not fit may preempt, cheapest first, jobs of queues that borrow (when it is
   within its own quota) or of lower classes of its own queue. Growth in step 3 stays within quotas.
3. **Elastic extras.** A multiple-choice knapsack (``solvers.knapsack``) over the elastic jobs: option
   k = k more workers than ``min_workers``, weight k x gpus_per_worker, value = the joint sizing's
   completion-rate gain (``aryl-nojoint``: JCT reduction minus a restart cost when the size changes), plus,
   for an option that turns a predicted deadline miss into a hit, ``deadline_weight`` x the job's remaining
   time at ``min_workers`` (as a rate for the joint sizing). Capacity: the GPUs
   left after step 2, including loaned ones and those extras already hold. Extra workers prefer
   loaned servers, so a reclaim shrinks, not kills. A reclaim's preemption cost counts a deadline it
   would make a job miss (``deadline_weight`` x the job's remaining GPU-time).
   Anti-thrashing (``core.protection``, one window for every step): a job in its protection window
   (started or resized less than ``min_resize_interval_s`` ago, or ``max_disruptions_per_hour``
   reached) keeps its size in steps 1 and 3, keeps its extras in step 2 (queued gangs, starving jobs) and is
   not preempted for quota or priority; an inference reclaim prefers servers without protected jobs
   and overrides the window only when those do not suffice, saying so in the job's message.
   On a cluster of several GPU types, the joint sizing's deferred jobs still waiting then start at
   ``min_workers`` on GPUs no step took (``base.backfill_idle``: the sizing shares every type's GPUs out as one
   pool, but a job grows on its own type only), and step 3 runs once more to share out what is left.

Goodput (issue 17): a job that reports step times and gradient statistics and declares batch limits has
a fitted goodput model (``core.goodput_fit``); the elastic variants value it by that model (JCT
reductions from its goodput at the best batch size per size, the reclaim's scale-in cost from the same
model) and send the batch chosen with its allocation (``Plan.batches``). Jobs without one: as before.

GPU types (issue 33 item 4): on a cluster of several types whose speeds it knows -- the declared speed of each type
(``ClusterSnapshot.gpu_speed``, relative to the reference type the jobs' speed curves are of) and each job's measured
speed per type (``JobView.type_speeds``) -- a worker's rate on a server scales by its job's speed on that server's
type over its reference type's (``cycle.type_factors``): a running job's estimates are at its type's speed, a queued
job is valued at the speed of the type it would start on, so a loaned server of a slower type is valued as slower.
A gang starts on the type where it runs fastest at the size that type has room for (``_Cycle.type_preference``: its
speed there times its speed curve at the free GPUs, not its speed per GPU); step 3 shares out each type's GPUs among
the jobs on that type (a job grows on its own type only); a job moves to a type where it runs faster at the room
there than it can on its own (a slower type with GPUs to spare included) once that saves more than two restarts
and raises the rate at which the cluster completes jobs -- its own gain and what the GPUs it leaves add to the jobs on
its type, against what those it takes would have added to the jobs on the new one (``sizing.type_worth``, step 3's
knapsack of that type; the joint variants) -- at the smallest size that does, and step 3 never shrinks it below that
size while it stays on the type (``base.move_to_faster_types``, ``_Job.floor``); a loan's payback is longer on a
slower server (``loans.demand_outlook``). One type, or no speed known: exactly as before.

Variants (same code, same placement, so comparisons isolate the mechanism): ``aryl`` (loaning and
elasticity), ``aryl-noloan``, ``aryl-noelastic``, ``sjf`` (neither: separate clusters, jobs run at
``min_workers``), ``aryl-naivereclaim`` (``aryl`` with a naive reclaim: most recently loaned first), and
``aryl-nogoodput`` (``aryl`` on declared throughput only: no goodput model, no batch choice),
``aryl-nojoint`` (``aryl`` with the earlier two steps: queued gangs first, then extras by JCT reduction),
``aryl-noshrink`` (no shrink-to-admit), ``aryl-nopreempt`` (no preempt-to-admit), ``aryl-reactive`` (loans and
reclaims on the need now, no forecast) and
``aryl-risk`` (``aryl`` with risk-valued loans: an extra worker valued by its expected time before its loaned
server goes back, ``loans.loan_risk``; ``aryl`` values it at its full rate).

The package, one module per phase (each imports ``cycle`` and no other; this module runs them in order):
``cycle`` (the cycle's scratch state and the helpers the steps share), ``loans`` (step 0), ``sizing`` (the
joint sizing, step 1, and the extras, step 3), ``base`` (step 2), ``job_changes`` (the plan's job changes).

Pure: no I/O, no wall clock; deterministic for a given snapshot and the moves' floors of the cycle before
(``ArylPolicy._floors``, the one decision a cycle carries to the next: a restarted scheduler forgets them, and its
jobs are then sized as any).
"""


from __future__ import annotations

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import LoanNote, Plan, Reason
from scheduler_service.core.protection import protected_jobs
from scheduler_service.core.registry import ReclaimDecision, ReclaimPreviewUnsupported, policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import JobEstimate
from scheduler_service.policies.aryl.base import backfill_idle, base_demands, move_to_faster_types, relocate_displaced
from scheduler_service.policies.aryl.cycle import (
    _Cycle,
    _Job,
    _running_jobs,
    _server_gpus,
    _server_id,
    _state,
    goodput_estimate,
)
from scheduler_service.policies.aryl.job_changes import plan_batches, plan_scales, size_notes
from scheduler_service.policies.aryl.loans import (
    _goodput_scale_in_cost,
    _loaned_oldest_first,
    choose_reclaim,
    loan_cycle,
    loan_risk,
)
from scheduler_service.policies.aryl.sizing import (
    completion_rates,
    elastic_extras,
    joint_sizing,
    response_ratio,
    settle_suspensions,
    type_worth,
)

# What other modules and the tests import from the package (the policy's parts live in its modules).
__all__ = [
    "ArylPolicy",
    "_Job",
    "_goodput_scale_in_cost",
    "_running_jobs",
    "choose_reclaim",
    "completion_rates",
    "goodput_estimate",
    "response_ratio",
]


class ArylPolicy:
    """``goodput``: jobs with a fitted goodput model (``core.goodput_fit``) are valued by it -- their
    completion-time estimates (the knapsack's JCT reductions, the queue order's remaining GPU-time, the
    reclaim's costs) come from their goodput at the best batch size for each size, and the plan carries
    that batch (``Plan.batches``) for every job with batch limits that holds workers. Jobs without a
    fitted model are decided exactly as without it."""

    def __init__(self, name: str, params: PolicyParams, *, loaning: bool, elastic: bool,
                 naive_reclaim: bool = False, goodput: bool = False, joint: bool = False, shrink: bool = True,
                 forecast: bool = True, risk: bool = False, suspend: bool = True) -> None:
        self.name = name
        self.joint = joint and elastic
        self.shrink = shrink  # queued gangs may take running jobs' extra workers (shrink-to-admit)
        self.suspend = suspend and shrink  # the joint sizing may preempt running jobs to admit queued ones
        self.params = params
        self.loaning = loaning
        self.elastic = elastic
        self.naive_reclaim = naive_reclaim
        self.goodput = goodput
        self.forecast = forecast  # reclaim ahead of the demand forecast, loan only what it leaves
        self.risk = risk and forecast  # extras on loaned servers valued by the chance they stay (``loans.loan_risk``)
        self._carried: dict[int, tuple[JobView, int, JobEstimate]] = {}  # the last cycle's (``_Cycle.carry``)
        self._floors: dict[int, tuple[str, int]] = {}  # the moves' floors the last cycle left (``_Cycle.kept_floors``)

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        cycle = _Cycle(
            snapshot=snapshot,
            servers=dict(zip(map(_server_id, snapshot.servers), snapshot.servers, strict=True)),
            server_state=dict(zip(map(_server_id, snapshot.servers), map(_state, snapshot.servers), strict=True)),
            running=_running_jobs(snapshot),
            params=self.params,
            goodput_servers=_server_gpus(snapshot) if self.goodput else 0,
            carried=self._carried,
            floors=self._floors,
        )
        cycle.protected = protected_jobs((j.view for j in cycle.running.values()), snapshot.now, self.params)
        if self.loaning:
            loan_cycle(cycle, naive_reclaim=self.naive_reclaim, elastic=self.elastic, forecast=self.forecast)
        else:
            cycle.loan_note = LoanNote(Reason.NOT_LOANED_BY_POLICY,
                                       f"policy {self.name!r} never loans inference servers to training")
        cycle.rebuild_capacity()
        if self.loaning and self.risk:
            cycle.loan_risk = loan_risk(cycle)
        relocate_displaced(cycle)
        if self.joint:
            joint_sizing(cycle, shrink=self.shrink, suspend=self.suspend)
        base_demands(cycle, joint=self.joint, loaning=self.loaning, shrink=self.shrink)
        settle_suspensions(cycle)
        move_to_faster_types(cycle, type_worth if self.joint else None)
        if self.elastic:
            elastic_extras(cycle, joint=self.joint)
            if self.joint and len(cycle.capacity.gpu_types) > 1 and backfill_idle(cycle):
                elastic_extras(cycle, joint=self.joint)
        else:
            for job in cycle.running.values():
                if len(job.workers) < job.view.max_workers:
                    cycle.holds[job.view.job_id] = (
                        Reason.HELD_NOT_ELASTIC, f"policy {self.name!r} runs jobs at min_workers (no elastic scaling)")
        scales = tuple(plan_scales(cycle))  # first: it may grow this cycle's starts to full size
        self._carried = cycle.carry()
        self._floors = cycle.kept_floors()
        return Plan(
            starts=tuple(cycle.starts),
            scales=scales,
            preemptions=tuple(cycle.preemptions),
            server_actions=tuple(cycle.server_actions),
            pending=tuple(cycle.pending),
            held=size_notes(cycle, scales),
            loan_note=cycle.loan_note,
            batches=plan_batches(cycle) if self.goodput else (),
        )

    def preview_reclaim(self, snapshot: ClusterSnapshot, count: int) -> ReclaimDecision:
        """Dry run (``core.registry.ReclaimPreviewer``): what this policy's reclaim would choose if
        inference needed ``count`` loaned servers back now. Changes nothing."""
        if not self.loaning:
            raise ReclaimPreviewUnsupported(self.name)
        return choose_reclaim(_running_jobs(snapshot), _loaned_oldest_first(snapshot), count, self.params,
                              snapshot.now, naive=self.naive_reclaim,
                              goodput_servers=_server_gpus(snapshot) if self.goodput else 0)


def _register(name: str, *, loaning: bool, elastic: bool, naive_reclaim: bool = False, goodput: bool = False,
              joint: bool = True, shrink: bool = True, forecast: bool = True, risk: bool = False,
              suspend: bool = True) -> None:
    policies.register(name)(
        lambda params: ArylPolicy(name, params, loaning=loaning, elastic=elastic, naive_reclaim=naive_reclaim,
                                  goodput=goodput, joint=joint, shrink=shrink, forecast=forecast, risk=risk,
                                  suspend=suspend)
    )


# The elastic variants use a job's goodput model where it has one (jobs without one: as before).
_register("aryl", loaning=True, elastic=True, goodput=True)
_register("aryl-noloan", loaning=False, elastic=True, goodput=True)
_register("aryl-noelastic", loaning=True, elastic=False)
_register("sjf", loaning=False, elastic=False)  # separate clusters: the paper's baseline
# The reclaim ablation: the full policy, but reclaim takes the most recently loaned servers back.
_register("aryl-naivereclaim", loaning=True, elastic=True, naive_reclaim=True, goodput=True)
# The goodput ablation: the full policy, elastic on declared throughput only (no fit, no batch choice).
_register("aryl-nogoodput", loaning=True, elastic=True)
# The sizing ablation: the full policy with the earlier two steps -- queued gangs first, shortest first (taking
# other jobs' extras), then the spare GPUs to running jobs by the JCT reduction they buy -- instead of one
# joint decision over every running and queued job.
_register("aryl-nojoint", loaning=True, elastic=True, goodput=True, joint=False)
# The shrink-to-admit ablation: the full policy, but a queued gang starts only on free GPUs -- running jobs keep
# their extra workers (the joint sizing shares out the free GPUs alone; step 3 still resizes running jobs).
_register("aryl-noshrink", loaning=True, elastic=True, goodput=True, shrink=False)
# The preempt-to-admit ablation: the full policy, but the joint sizing never preempts a running job to admit
# queued ones (it still takes their extra workers).
_register("aryl-nopreempt", loaning=True, elastic=True, goodput=True, suspend=False)
# The forecast ablation: the full policy, but loans and reclaims follow the inference need now alone (reactive:
# a reclaim starts when the need exceeds what serves, and any server beyond the need now may be loaned).
_register("aryl-reactive", loaning=True, elastic=True, goodput=True, forecast=False)
# Risk-valued loans: the full policy, and an extra worker is valued by its expected time before its loaned server
# goes back (``loans.loan_risk``). Not the default: in docs/evaluation.md's inference section it moved average JCT
# by +0.0% (ServeGen) and +0.4% (Alibaba), GPU-hours lost by +2.1% and -0.1% (3 seeds each).
_register("aryl-risk", loaning=True, elastic=True, goodput=True, risk=True)
