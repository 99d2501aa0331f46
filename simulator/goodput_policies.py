"""The policies of the goodput job model, looked up by name in the policy registry
(``scheduler_service.core.registry``), and what each is told.

Every name is the registered policy's: ``policies.create(name, params)`` builds it (``params``: its
``PolicyParams``), once ``GOODPUT_POLICIES`` has it (another name is refused first). It runs one of two ways:

- **the authors' rules** -- for the policies the Pollux study's simulator ran (``tiresias``, ``optimus``,
  ``pollux``: ``AUTHORS_RULES``, each naming the registered policy class it stands for): their pure
  decision functions (``tiresias_decide``, ``optimus_allocate``, ``pollux_decide``), imported from the
  policies, not copied, fed with the exact state that simulator kept (Tiresias' queues between cycles, the
  oracle's step times and remaining iterations, each Pollux job's own fitted goodput model), which no
  ``ClusterSnapshot`` carries. That is what makes them reproduce the authors' figures (``tests/
  test_pollux_reproduction.py``). Their allocations (one node per GPU) become a plan
  (``plan_for_allocations``: starts, resizes, preemptions) that the cluster applies by the rules like any
  other. They read no ``PolicyParams``: a run that passes some is refused, saying so;
- **on snapshots** -- every other policy of ``GOODPUT_POLICIES`` (``sjf``, ``aryl-noloan``): the registered
  policy itself, on the cluster's snapshots, each job declared as ``OracleDeclaration`` says. Its
  ``PolicyParams`` are the run's.

Both run behind the registry's ``FaultsFirst`` and through the scheduler's own ``SchedulingCycle``. What
this module must never do: apply a plan or move a job (``simulator.goodput_cluster`` does, by the rules).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from scheduler_service.core.goodput import progress_rate, split_batch
from scheduler_service.core.most_free import place_in_order
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan, PreemptJob, Reason, ScaleJob, StartJob, WorkerPlacement, unorderable
from scheduler_service.core.registry import FaultsFirst, Policy, policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView, WorkerView
from scheduler_service.policies.optimus import OptimusJob, OptimusPolicy, optimus_allocate, optimus_place
from scheduler_service.policies.pollux import PolluxJob, PolluxPolicy, pollux_decide
from scheduler_service.policies.tiresias import TiresiasJob, TiresiasPolicy, TiresiasState, tiresias_decide
from simulator.goodput_cluster import JobDeclaration, allocation_of, node_index
from simulator.goodput_jobs import SimJob, packed

# The policies the goodput job model runs (docs/evaluation.md, section 3, reports each): the authors' three
# and two of Aryl's that need no inference cluster. A name list, not a registry: each is built by
# ``policies.create``.
GOODPUT_POLICIES = ("tiresias", "optimus", "pollux", "sjf", "aryl-noloan")


class Decider(Protocol):
    """One policy's cycle over the simulated jobs: (active jobs in arrival order, their previous
    allocations, now) -> allocations, one node index per GPU. Holds what the policy keeps between cycles."""

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]: ...


@dataclass
class TiresiasDecider:
    """``tiresias_decide`` on the requested GPUs as gangs; its queues carried from cycle to cycle."""

    stands_for: ClassVar[type] = TiresiasPolicy
    nodes: int
    gpus_per_node: int
    state: TiresiasState = field(default_factory=TiresiasState)

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        self.state, run = tiresias_decide(self.state, [TiresiasJob(j.index, j.spec.num_replicas) for j in active],
                                          now, self.nodes * self.gpus_per_node)
        kept = {k: previous[k] for k in run if previous.get(k)}
        capacity = dict.fromkeys(range(self.nodes), self.gpus_per_node)
        return place_in_order(run, {j.index: j.spec.num_replicas for j in active}, kept, capacity)


@dataclass
class OptimusOracleDecider:
    """``optimus_allocate`` with the oracle's step times and remaining iterations
    (``simulator.goodput_sim``'s module doc)."""

    stands_for: ClassVar[type] = OptimusPolicy
    nodes: int
    gpus_per_node: int
    _memo: dict[tuple[str, int, int], float] = field(default_factory=dict)

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        jobs = [OptimusJob(j.index, 1 if j.app.name == "ncf" else j.spec.batch_size // j.app.min_atomic_bsz,
                           self._remaining(j), self._step_time(j)) for j in active]
        count = optimus_allocate(jobs, self.nodes * self.gpus_per_node)
        return optimus_place(count, previous, dict.fromkeys(range(self.nodes), self.gpus_per_node))

    @staticmethod
    def _remaining(job: SimJob) -> float:
        """Iterations left at the requested batch size, counted to the end of the current epoch."""
        app, batch = job.app, job.spec.batch_size
        if app.completion_epoch <= job.epoch:
            return 1.0
        return app.iterations_after(batch, app.completion_epoch) - app.iterations_after(batch, job.epoch)

    def _step_time(self, job: SimJob) -> Callable[[int], float]:
        app, batch = job.app, job.spec.batch_size

        def step_time(replicas: int) -> float:
            key = (app.name, batch, replicas)
            known = self._memo.get(key)
            if known is None:
                # The authors' oracle: a packed placement, and at least two passes on one GPU.
                split = split_batch(batch, replicas, app.max_atomic_bsz, max_batch_size=app.max_batch_size,
                                    init_bsz=0 if replicas == 1 else None)
                step, sync = app.step_times(packed(replicas, self.gpus_per_node), split.atomic_bsz)
                known = self._memo[key] = step + (step - sync) * split.accum_steps
            return known

        return step_time


@dataclass
class PolluxDecider:
    """``pollux_decide`` on the jobs' own goodput models (fitted to what each ran), least attained
    service first; a job may take at most twice the most GPUs it has run on (at least 1, at most 64
    and as many as its smallest atomic batch allows in its largest batch); NCF one GPU (the authors')."""

    stands_for: ClassVar[type] = PolluxPolicy
    nodes: int
    gpus_per_node: int
    adaptive_batch: bool = True

    def decide(self, active: list[SimJob], previous: dict[int, list[int]], now: float) -> dict[int, list[int]]:
        ordered = sorted(active, key=lambda j: (j.attained_gpu_s, j.spec.submit_time))
        jobs = []
        for j in ordered:
            app = j.app
            seen = max((r for _, r, _ in j.profile), default=0)
            most = 1 if app.name == "ncf" else min(max(2 * seen, 1), 64, app.max_batch_size // app.min_atomic_bsz)
            held: dict[int, int] = {}
            for node in previous.get(j.index, ()):
                held[node] = held.get(node, 0) + 1
            jobs.append(PolluxJob(j.index, most, held, now - j.spec.submit_time, max(j.restarts, 0), j.model()))
        return pollux_decide(jobs, dict.fromkeys(range(self.nodes), self.gpus_per_node))


AUTHORS_RULES: tuple[type[TiresiasDecider] | type[OptimusOracleDecider] | type[PolluxDecider], ...] = (
    TiresiasDecider, OptimusOracleDecider, PolluxDecider)


class UnreadParams(ValueError):
    """Policy parameters given to a policy that runs the authors' rules here and reads none."""


@dataclass
class GoodputPolicy:
    """A registered policy as the goodput job model runs it: ``build(jobs)`` the policy for the cycle,
    ``declaration`` what its jobs declare, ``adaptive_batch`` whether jobs choose their own batch size
    (Pollux's jobs under ``pollux``), ``follow_up_due`` whether the decision made now needs another cycle
    at once (``AuthorsRules``)."""

    name: str
    registered: FaultsFirst
    rules: Decider | None
    declaration: JobDeclaration
    params: PolicyParams
    _built: AuthorsRules | None = None

    @property
    def adaptive_batch(self) -> bool:
        return bool(getattr(self.rules, "adaptive_batch", False))

    def build(self, jobs: Sequence[SimJob]) -> Policy:
        if self.rules is None:
            return self.registered
        self._built = AuthorsRules(self.name, self.rules, jobs)
        return FaultsFirst(self._built, self.params)

    def follow_up_due(self, now: float) -> bool:
        return self._built is not None and self._built.follow_up_due(now)


def goodput_policy(name: str, params: PolicyParams | None, nodes: int, gpus_per_node: int) -> GoodputPolicy:
    """The registered policy ``name`` on the goodput job model of ``nodes`` x ``gpus_per_node`` GPUs.
    ValueError for a policy this job model does not run, and ``UnreadParams`` for ``params`` given to one
    that runs the authors' rules (they read none)."""
    if name not in GOODPUT_POLICIES:
        raise ValueError(f"the goodput job model runs {', '.join(GOODPUT_POLICIES)}, not {name!r}")
    registered = policies.create(name, params)
    rules = next((r for r in AUTHORS_RULES if isinstance(registered.policy, r.stands_for)), None)
    if rules is None:
        # Jobs are declared elastic for a policy that scales elastic jobs (the aryl family's ``elastic``);
        # a gang-only policy (``sjf``) is shown gangs.
        elastic = bool(getattr(registered.policy, "elastic", False))
        return GoodputPolicy(name, registered, None, OracleDeclaration(nodes, gpus_per_node, elastic),
                             params or PolicyParams())
    if params is not None:
        raise UnreadParams(f"{name} in the goodput job model runs the authors' rules and reads no policy "
                           f"parameters (--param applies to {', '.join(parameterised())} there)")
    return GoodputPolicy(name, registered, rules(nodes, gpus_per_node), AuthorsDeclaration(nodes * gpus_per_node),
                         PolicyParams())


def parameterised() -> tuple[str, ...]:
    """The goodput job model's policies that read ``PolicyParams`` (``--param``): those that run on snapshots."""
    return tuple(n for n in GOODPUT_POLICIES
                 if not any(isinstance(policies.create(n).policy, r.stands_for) for r in AUTHORS_RULES))


class AuthorsRules:
    """A ``Policy`` that decides by the authors' rules (``Decider``) on the jobs' true state, and plans the
    change from the snapshot's allocations to the decided ones (``plan_for_allocations``).

    A decision may swap GPUs between running jobs (two jobs each moving onto the other's node, the nodes
    full): no plan applies that one action at a time (``core.plan.unorderable``), and the service could
    not either. Such a plan is cut in two, as a service would have to do it: in the first, one job of the
    swap (the lowest id blocked) is preempted, which frees its GPUs for the other; the second, at the same
    instant (``follow_up_due``: its driver runs another cycle), starts it where it was decided. In the
    goodput job model the job loses nothing by it: a preemption and a start at one instant are one
    re-allocation (one restart), as the authors' simulator moves it."""

    def __init__(self, name: str, decider: Decider, jobs: Sequence[SimJob]) -> None:
        self.name = name
        self.decider = decider
        self.jobs = {job.index: job for job in jobs}  # every job of the run, by index
        self._follow_up: tuple[float, Mapping[int, list[int]]] | None = None

    def follow_up_due(self, now: float) -> bool:
        """Is the rest of the decision made at ``now`` still to be planned (a swap cut in two)?"""
        return self._follow_up is not None and self._follow_up[0] == now

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        if self._follow_up is not None and self._follow_up[0] == snapshot.now:
            decided = self._follow_up[1]
        else:
            active = [self.jobs[v.job_id] for v in snapshot.jobs]
            previous = {v.job_id: allocation_of(v.workers) for v in snapshot.jobs if v.workers}
            decided = self.decider.decide(active, previous, snapshot.now)
        self._follow_up = None
        held = {v.job_id: [(w.server_id, g) for w in v.workers for g in w.gpu_indices] for v in snapshot.jobs}
        now_decided = dict(decided)
        plan = plan_for_allocations(snapshot, now_decided, self.name)
        while blocked := [a for a in unorderable(plan, held) if isinstance(a, ScaleJob)]:
            del now_decided[min(a.job_id for a in blocked)]
            plan = plan_for_allocations(snapshot, now_decided, self.name)
            self._follow_up = (snapshot.now, decided)
        return plan


def plan_for_allocations(snapshot: ClusterSnapshot, decided: Mapping[int, list[int]], who: str) -> Plan:
    """The plan that takes every job from its allocation in ``snapshot`` to its allocation in ``decided``
    (one node index per GPU, in rank order; a job left out gets none): a start, a resize or a preemption
    for each job whose allocation changes, in job order; nothing for the others.

    Which GPUs of a node a worker gets is the plan's choice (the goodput job model counts GPUs per node):
    a job keeps the GPUs it holds on a node it stays on, and takes others first from GPUs free now, then
    from those a preemption frees, then from those a job that only shrinks gives up, and only then from
    those a job that also grows elsewhere gives up -- so that the plan has an order in which every action
    applies (``core.plan.apply_order``); the run refuses a plan the rules refuse in part."""
    node_of = {s.server_id: node_index(s.server_id) for s in snapshot.servers}
    server_of = {n: s for s, n in node_of.items()}
    held: dict[int, dict[int, list[int]]] = {}        # job -> node -> the GPUs it holds there, ascending
    for view in snapshot.jobs:
        for w in view.workers:
            held.setdefault(view.job_id, {}).setdefault(node_of[w.server_id], []).extend(w.gpu_indices)
    for nodes in held.values():
        for gpus in nodes.values():
            gpus.sort()
    previous = {v.job_id: allocation_of(v.workers) for v in snapshot.jobs if v.workers}
    changed = [k for k in sorted(set(previous) | set(decided)) if decided.get(k) != previous.get(k)]
    need = {k: _counts(decided[k]) for k in changed if k in decided}
    free = {node_of[s.server_id]: [g for g in s.gpu_indices if g not in s.unhealthy_gpus and
                                   g not in {gpu for gpu, _ in s.allocated}] for s in snapshot.servers}
    # GPUs given up, by node, in the order they are taken: preemptions', pure shrinks', then the others'.
    given_up: dict[int, list[int]] = {}
    grows = {k for k in need if any(c > len(held.get(k, {}).get(n, ())) for n, c in need[k].items())}
    for tier in (lambda k: k not in need, lambda k: k in need and k not in grows, lambda k: k in grows):
        for k in changed:
            if k in previous and tier(k):
                for n, gpus in sorted(held[k].items()):
                    given_up.setdefault(n, []).extend(gpus[need.get(k, {}).get(n, 0):])
    starts, scales, preemptions = [], [], []
    for k in changed:
        if k not in need:
            preemptions.append(PreemptJob(k, Reason.PREEMPTED_BY_POLICY, f"{who}: its GPUs went to other jobs"))
            continue
        gpus_on: dict[int, list[int]] = {}
        for n, count in need[k].items():
            kept = held.get(k, {}).get(n, [])[:count]
            extra = count - len(kept)
            take = free[n][:extra]
            del free[n][:len(take)]
            rest = extra - len(take)
            take += given_up.get(n, [])[:rest]
            del given_up.get(n, [])[:rest]
            gpus_on[n] = sorted(kept) + take
        workers = tuple(WorkerPlacement(rank, server_of[n], (gpus_on[n].pop(0),)) for rank, n in enumerate(decided[k]))
        if k not in previous:
            starts.append(StartJob(k, workers, Reason.PLACED, f"{who}: placed on {len(workers)} GPU(s)"))
        else:
            fewer = len(workers) < len(previous[k])
            scales.append(ScaleJob(k, workers, Reason.SCALED_IN if fewer else Reason.SCALED_OUT,
                                   f"{who}: {len(previous[k])} -> {len(workers)} GPU(s)"))
    return Plan(starts=tuple(starts), scales=tuple(scales), preemptions=tuple(preemptions))


def _counts(nodes: list[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for n in nodes:
        counts[n] = counts.get(n, 0) + 1
    return counts


@dataclass(frozen=True)
class AuthorsDeclaration:
    """Jobs under the authors' rules: any size from 1 GPU to the cluster's (their rules set each job's
    limits: Tiresias' gang, Optimus' and Pollux's largest sizes); shown as the cluster holds them."""

    total_gpus: int

    def shape(self, job: SimJob) -> tuple[int, int, int]:
        return 1, 1, self.total_gpus

    def view(self, job: SimJob, shown: JobView, now: float) -> JobView:
        return shown

    def allocation(self, workers: Sequence[WorkerView]) -> list[int]:
        """In rank order: the order the rules decided (``plan_for_allocations`` ranks GPUs so)."""
        return allocation_of(workers)


@dataclass(frozen=True)
class OracleDeclaration:
    """Jobs for a registered policy deciding on snapshots. Each job is a gang of its requested GPUs
    (``min_workers``, 1 GPU per worker), with ``elastic`` up to 16x that, within what its batch allows (the
    smallest atomic batch per GPU) and one GPU for NCF, as ``optimus``. It declares what an oracle knows,
    as ``optimus`` is given: its progress rate per worker count at its requested batch size (this epoch's
    efficiency, a packed placement) as its throughput points, and its training target and progress as its
    total work and work done. The batch size stays the requested one (the policies do not choose it).
    Nothing else of the cluster's view of it is shown (no pending reason, disruption or checkpoint)."""

    nodes: int
    gpus_per_node: int
    elastic: bool

    def shape(self, job: SimJob) -> tuple[int, int, int]:
        app, batch = job.app, job.spec.batch_size
        request = 1 if app.name == "ncf" else job.spec.num_replicas
        most = request
        if self.elastic and app.name != "ncf":
            most = max(request, min(16 * request, batch // app.min_atomic_bsz, self.nodes * self.gpus_per_node))
        return 1, request, most

    def view(self, job: SimJob, shown: JobView, now: float) -> JobView:
        app, batch = job.app, job.spec.batch_size
        _, request, most = self.shape(job)
        gain = app.gain(batch, min(job.epoch, app.completion_epoch))
        points = []
        for w in range(1, most + 1):
            split = split_batch(batch, w, app.max_atomic_bsz, init_bsz=app.init_batch_size,
                                max_batch_size=app.max_batch_size)
            step, sync = app.step_times(packed(w, self.gpus_per_node), split.atomic_bsz)
            points.append((w, progress_rate(gain, step + (step - sync) * split.accum_steps)))
        target = app.epoch_end(app.completion_epoch)
        return JobView(job_id=job.index, state=shown.state, gpus_per_worker=1, min_workers=request, max_workers=most,
                       priority=0, submitted_at=job.spec.submit_time, workers=shown.workers,
                       throughput_points=tuple(points), total_work=target, work_done=min(job.progress, target),
                       started_at=shown.started_at, last_resized_at=shown.last_resized_at)

    def allocation(self, workers: Sequence[WorkerView]) -> list[int]:
        """In node order, whatever the ranks (a resize that keeps a job's GPUs per node is no re-allocation
        of its SimJob): how this job model has always read a registered policy's placements."""
        return sorted(allocation_of(workers))
