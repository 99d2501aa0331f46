"""``dl2``: DL2 (Peng et al., 2019), a learned scheduler -- a small network that decides, one action at a
time, how many workers each job gets; trained by ``aryl-sim train-dl2`` (``simulator/dl2_train.py``):
supervised on ``optimus``'s decisions, then by reinforcement learning on average JCT.

One cycle (``Decision``): the network reads the encoding (``dl2_model``: the oldest ``JOB_SLOTS`` active
jobs, with the workers each has *in this decision so far*, in features relative to the cluster) and picks an
action -- add a unit to a job, remove one, or stop -- until it stops, no action is legal, or ``MAX_STEPS``
pass. One network scores every job alike (a shared per-job network with a pooled cluster context), so which
row a job is in does not matter, only what it is; that, and features that are shares of the cluster, is
what lets weights trained on 4-GPU servers decide on 8-GPU ones. Every running job starts
from its current workers, so a cycle's actions are its changes. Illegal actions are masked (never
chosen):

- a running job in its protection window (``core.protection``: resized less than
  ``policy.min_resize_interval_s`` ago, or ``policy.max_disruptions_per_hour`` reached) keeps its size
  (anti-thrashing: a network that changed its mind every cycle would restart jobs every cycle);
- *add* to slot i: a job there, not removed from in this decision, below ``max_workers``, and its unit
  (the ``min_workers`` gang for a job without workers, else one worker) fits the free GPUs in count and
  in the largest free block. The unit is placed at once by the core's placement
  (``FreeCapacity.place_gang``, all or nothing); when it does not fit after all, the job is blocked for
  the rest of the decision (the step is spent);
- *remove* from slot i: before the decision's first addition (removals first, then additions: a network
  cannot alternate them), a job that was running at the snapshot, above ``min_workers``: its highest rank
  goes. At ``min_workers`` its whole gang goes -- a *preemption* (the job is requeued and resumes from its last
  checkpoint) -- only where the weights were trained with preemption among their actions
  (``Network.preempts``, ``aryl-sim train-dl2 --preemption``): a network that never met the action in
  training has no learned sense of what it costs (an early warm-up network given it preempted ~35 workers a
  cycle, average JCT 29.6 h vs 1.4 h without). Trained with it, its price is in the reward: the simulator
  charges a preempted job the work since its checkpoint, the restart and its wait in the queue, all of which
  lengthen the JCT that the reward counts (``simulator.dl2_train``);
- *stop*: once no visible job without workers can start (work-conserving for queued gangs: GPUs left idle
  while a gang that fits waits never shorten a JCT here, and a network that stopped there would stop there
  every cycle -- a stall). The network still chooses which jobs start, in which order, and who grows.

A job is never both grown and shrunk in one decision, so no GPU moves between jobs and the plan always
has an apply order; workers stay within ``0`` or ``min_workers..max_workers`` and gangs are whole by
construction, and the plan passes the same invariants checker and appliers as any policy's (a bad
network can waste GPUs, never double-book one or break a gang). Jobs past the last slot: a running one keeps
its size this cycle; a queued one whose ``min_workers`` gang fits the GPUs the network left free starts at it
once the network has stopped, the oldest first (``Decision.backfill``: work-conserving past the window, as
*stop* is within it -- with the window alone, jobs past it waited in 15% of the Philly sample's cycles while 88
of 128 GPUs stood free on average, which no weights could change).

Live (and in the simulator's evaluation), the network's most likely legal action is taken
(deterministic). Training hands the policy a ``Sampler`` that draws actions from the network's
distribution and records each step. Weights: ``policy.dl2_model`` (a file from ``train-dl2``; "" for the
weights shipped with Aryl); ``policy.dl2_online_learning`` keeps training them in the service
(``dl2_online``). Must never: write anything, or read the wall clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.placement import FreeCapacity
from scheduler_service.core.plan import KeepPending, Plan, PreemptJob, Reason, ScaleJob, StartJob, WorkerPlacement
from scheduler_service.core.protection import protection
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot, JobView
from scheduler_service.core.throughput import JobEstimate, estimate
from scheduler_service.lifecycle import JobState
from scheduler_service.policies.dl2_model import (
    BUNDLED_MODEL,
    JOB_FEATURES,
    JOB_SLOTS,
    STOP,
    UNIT_PER_FREE,
    Network,
    Pooling,
    SlotFeatures,
    action_count,
    encode_globals,
    encode_slot,
    input_size,
    load_network,
    unit_per_free,
)
from scheduler_service.policies.worker_targets import active_jobs, training_servers

MAX_STEPS = 4 * JOB_SLOTS  # actions per decision at most (a bound on a cycle's cost)


class Decision:
    """One cycle's decision in progress: the visible jobs, their workers so far, the free GPUs."""

    def __init__(self, snapshot: ClusterSnapshot, params: PolicyParams, *, preempt: bool = False) -> None:
        self.snapshot = snapshot
        self.preempt = preempt  # a removal may take a job's last gang (module doc)
        active = active_jobs(snapshot)
        self.slots: list[JobView] = active[:JOB_SLOTS]
        self.unseen: list[JobView] = active[JOB_SLOTS:]
        self.waiting = [j for j in self.unseen if j.state is JobState.PENDING]  # what ``backfill`` may start
        self.capacity = FreeCapacity.of(snapshot)
        # What the features are relative to (``dl2_model``): the training GPUs, the largest schedulable server,
        # the demand.
        sizes = [len(s.healthy_gpus) for s in training_servers(snapshot)]
        self.total_gpus = sum(sizes)
        self.server_gpus = max(sizes, default=0)
        self.demand_gpus = sum(j.min_workers * j.gpus_per_worker for j in active)
        n = len(self.slots)
        self.workers: list[list[WorkerPlacement]] = [
            [WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in j.workers] if j.state == JobState.RUNNING
            else [] for j in self.slots]
        self.start = [len(w) for w in self.workers]
        # Anti-thrashing (``core.protection``: ``policy.min_resize_interval_s`` since its last start or
        # resize, ``policy.max_disruptions_per_hour``): a running job in its window keeps its size.
        self.held = [j.state == JobState.RUNNING and protection(j, snapshot.now, params) is not None
                     for j in self.slots]
        self.added = [False] * n
        self.backfilled: dict[int, tuple[WorkerPlacement, ...]] = {}  # unseen queued jobs started (``backfill``)
        self.removed = [False] * n
        self.blocked = [False] * n
        self.adding = False  # an addition was made: removals are over for this decision
        self.estimates: list[JobEstimate] = [
            estimate(j, now=snapshot.now, default_runtime_s=params.default_runtime_s, alpha=params.amdahl_alpha)
            for j in self.slots]
        # The observation is written in place (``observation`` hands out a copy): the rows, then the globals.
        self._x = np.zeros(input_size(), dtype=np.float32)
        self._features = self._x[:JOB_SLOTS * JOB_FEATURES].reshape(JOB_SLOTS, JOB_FEATURES)
        self.pooling = Pooling.of(n)  # the rows present never change within a decision
        # Per row, what ``mask`` reads, kept current by ``_refresh`` (an empty row is never legal): the GPUs of
        # its next unit, its GPUs per worker, whether an add would be legal as far as the row alone goes
        # (everything but the free GPUs), whether a removal would, whether it has no workers yet.
        self._unit_gpus = np.zeros(JOB_SLOTS, dtype=np.float32)
        self._gpw = np.array([j.gpus_per_worker for j in self.slots] + [0] * (JOB_SLOTS - n), dtype=np.float32)
        self._gpw_max = float(self._gpw.max())
        self._may_add = np.zeros(JOB_SLOTS, dtype=bool)
        self._may_remove = np.zeros(JOB_SLOTS, dtype=bool)
        self._empty = np.zeros(JOB_SLOTS, dtype=bool)
        for i in range(n):
            self._refresh(i)

    # -- what the network sees -------------------------------------------------------------------

    def slot_features(self, i: int) -> SlotFeatures:
        job, w, est = self.slots[i], len(self.workers[i]), self.estimates[i]
        speed = est.model.speed(w) if w else 0.0
        gain = 1.0 if w == 0 else (est.model.speed(w + 1) / speed - 1.0 if speed > 0 else 0.0)
        saving = float("inf") if w == 0 else self.saving_s(i)
        return SlotFeatures(running=self.start[i] > 0, gpus_per_worker=job.gpus_per_worker,
                            min_workers=job.min_workers, max_workers=job.max_workers, workers=w, gain=gain,
                            saving_s=saving,
                            remaining_s=est.remaining_time(max(w, job.min_workers, 1)),
                            waited_s=self.snapshot.now - job.submitted_at, added=self.added[i],
                            removed=self.removed[i], total_gpus=self.total_gpus, server_gpus=self.server_gpus,
                            arrival=i)

    def saving_s(self, i: int) -> float:
        """Seconds of remaining time one more worker saves the job in slot ``i`` (at its workers so far)."""
        w = len(self.workers[i])
        return max(self.estimates[i].jct_reduction(w, 1), 0.0) if w else float("inf")

    def _refresh(self, i: int) -> None:
        """Row ``i``'s features and legality after a change to it (module doc: the rules)."""
        self._features[i] = encode_slot(self.slot_features(i))
        job, w = self.slots[i], len(self.workers[i])
        unit = job.min_workers if w == 0 else 1
        self._unit_gpus[i] = unit * job.gpus_per_worker
        self._empty[i] = w == 0
        self._may_add[i] = (not self.removed[i] and not self.blocked[i] and not self.held[i]
                            and w + unit <= job.max_workers)
        self._may_remove[i] = (self.start[i] > 0 and not self.added[i] and not self.held[i]
                               and (w > job.min_workers or (self.preempt and w > 0)))

    def observation(self) -> np.ndarray:
        free = self.capacity.total
        self._features[:, UNIT_PER_FREE] = unit_per_free(self._unit_gpus, free)
        self._x[JOB_SLOTS * JOB_FEATURES:] = encode_globals(
            free, self.total_gpus, self.capacity.largest_block(), self.server_gpus, self.demand_gpus,
            len(self.slots), len(self.unseen))
        return self._x.copy()

    def mask(self) -> np.ndarray:
        """Legal actions (module doc)."""
        legal = np.zeros(action_count(), dtype=bool)
        add = legal[:JOB_SLOTS]
        np.logical_and(self._may_add, self._unit_gpus <= self.capacity.total, out=add)
        block = self.capacity.largest_block()
        if block < self._gpw_max:
            add &= self._gpw <= block
        if not self.adding:
            legal[JOB_SLOTS:STOP] = self._may_remove
        # Work-conserving for queued gangs: no stop while a visible job without workers could start.
        legal[STOP] = not (add & self._empty).any()
        return legal

    # -- acting ----------------------------------------------------------------------------------

    def apply(self, action: int) -> bool:
        """Carry out a legal ``action``; False for stop or an add that could not be placed."""
        if action == STOP:
            return False
        if action < JOB_SLOTS:
            i = action
            job, w = self.slots[i], len(self.workers[i])
            placed = self.capacity.place_gang(job, job.min_workers if w == 0 else 1, first_rank=w)
            if placed is None:
                self.blocked[i] = True
                self._may_add[i] = False
                return False
            self.workers[i].extend(placed)
            self.added[i] = True
            self.adding = True
        else:
            i = action - JOB_SLOTS
            job, w = self.slots[i], len(self.workers[i])
            keep = w - 1 if w > job.min_workers else 0
            self.capacity.release_many((x.server_id, x.gpu_indices) for x in self.workers[i][keep:])
            del self.workers[i][keep:]
            self.removed[i] = True
        self._refresh(i)
        return True

    def backfill(self) -> None:
        """Once the network has stopped: each queued job past the window whose ``min_workers`` gang fits the free
        GPUs starts at it, the oldest first (module doc); one that does not fit waits, and a later one may."""
        # Gang shapes (and GPU types asked for) that did not fit: the free GPUs only shrink here, so a later job of
        # the same shape would not fit either (a decision at 1,000 jobs tried ~40 such gangs).
        failed: set[tuple[int, int, tuple[str, ...]]] = set()
        for job in self.waiting:
            shape = (job.min_workers, job.gpus_per_worker, job.gpu_types)
            if shape not in failed and job.min_workers * job.gpus_per_worker <= self.capacity.total:
                placed = self.capacity.place_gang(job, job.min_workers)
                if placed is not None:
                    self.backfilled[job.job_id] = placed
                else:
                    failed.add(shape)

    def preempted(self) -> list[JobView]:
        """The jobs this decision preempts: running at the snapshot, without workers now."""
        return [job for i, job in enumerate(self.slots) if self.start[i] > 0 and not self.workers[i]]

    def plan(self, who: str = "dl2") -> Plan:
        starts: list[StartJob] = []
        scales: list[ScaleJob] = []
        preemptions: list[PreemptJob] = []
        pending: list[KeepPending] = []
        for i, job in enumerate(self.slots):
            workers, before = tuple(self.workers[i]), self.start[i]
            if job.state == JobState.PENDING:
                if workers:
                    starts.append(StartJob(job.job_id, workers, Reason.PLACED, f"{who}: {len(workers)} worker(s)"))
                elif self.blocked[i]:
                    pending.append(KeepPending(job.job_id, *self.capacity.explain_unplaceable(job, job.min_workers)))
                else:
                    pending.append(KeepPending(job.job_id, Reason.WAITING_FOR_GANG,
                                               f"{who}: the network gave the free GPUs to other jobs"))
            elif not workers:
                preemptions.append(PreemptJob(job.job_id, Reason.PREEMPTED_BY_POLICY,
                                              f"{who}: the network gave its GPUs to other jobs"))
            elif len(workers) != before:
                grew = len(workers) > before
                scales.append(ScaleJob(job.job_id, workers, Reason.SCALED_OUT if grew else Reason.SCALED_IN,
                                       f"{who}: {len(workers)} worker(s)"))
        waits = f"{who}: decides for the {JOB_SLOTS} oldest active jobs; this one waits its turn"
        backfill = (f"{who}: backfilled at its minimum: past the {JOB_SLOTS} oldest active jobs the network decides "
                    "for, its gang fits GPUs the network left free")
        backfilled = self.backfilled
        for job in self.waiting:
            placed = backfilled.get(job.job_id)
            if placed is not None:
                starts.append(StartJob(job.job_id, placed, Reason.BACKFILLED, backfill))
            else:
                pending.append(KeepPending(job.job_id, Reason.BLOCKED_BY_EARLIER_JOB, waits))
        return Plan(starts=tuple(starts), scales=tuple(scales), preemptions=tuple(preemptions), pending=tuple(pending))


# --------------------------------------------------------------------------------------------------
# Choosing actions
# --------------------------------------------------------------------------------------------------


def masked_logits(logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    return np.where(legal, logits, -np.inf)


class Chooser(Protocol):
    """How an action is picked from the network's output (greedy live; sampled and recorded in training)."""

    def choose(self, observation: np.ndarray, legal: np.ndarray, logits: np.ndarray) -> int: ...

    def cycle_done(self, decision: Decision) -> None: ...


class Greedy:
    """The most likely legal action (the lowest index on a tie): deterministic."""

    def choose(self, observation: np.ndarray, legal: np.ndarray, logits: np.ndarray) -> int:
        return int(np.argmax(masked_logits(logits, legal)))

    def cycle_done(self, decision: Decision) -> None:
        return None


def decide(snapshot: ClusterSnapshot, params: PolicyParams, network: Network, chooser: Chooser) -> Decision:
    """Run the action loop on ``snapshot`` (module doc) and return the finished decision."""
    decision = Decision(snapshot, params, preempt=network.preempts)
    for _ in range(MAX_STEPS):
        legal = decision.mask()
        if not legal[:STOP].any():
            break
        observation = decision.observation()
        logits = network.logits(observation, decision.pooling)
        action = chooser.choose(observation, legal, logits)
        if action == STOP:
            break
        decision.apply(action)
    decision.backfill()
    chooser.cycle_done(decision)
    return decision


@dataclass(frozen=True)
class Dl2Policy:
    """Uses ``default_runtime_s`` and ``amdahl_alpha`` (remaining-time features of jobs that declare no
    work), ``min_resize_interval_s``, ``dl2_model`` and ``dl2_online_learning``. The network is read through
    ``current`` every cycle, so that online learning can swap in new weights between cycles."""

    params: PolicyParams
    current: Callable[[], Network]
    chooser: Chooser = field(default_factory=Greedy)
    name: str = "dl2"

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        return decide(snapshot, self.params, self.current(), self.chooser).plan()

    def close(self) -> None:
        """Stop online learning's thread, if any (the service calls this when it stops)."""
        stop = getattr(self.chooser, "stop", None)
        if stop is not None:
            stop()


def model_path(params: PolicyParams) -> str:
    return params.dl2_model or str(BUNDLED_MODEL)


def create_dl2(params: PolicyParams) -> Dl2Policy:
    """The registered policy: its weights loaded now, so that a missing or mismatched file stops the
    service at start (``ModelFileError``, a ValueError saying what to do)."""
    network = load_network(model_path(params))
    if params.dl2_online_learning:
        from scheduler_service.policies.dl2_online import OnlineLearner

        try:
            learner = OnlineLearner(network, params)  # imports torch: only when asked for
        except ModuleNotFoundError as exc:
            raise ValueError(f"policy.dl2_online_learning needs PyTorch ({exc}): pip install 'aryl[dl2]', or turn "
                             "it off") from None
        return Dl2Policy(params, learner.network, chooser=learner)
    return Dl2Policy(params, lambda: network)


policies.register("dl2")(create_dl2)
