"""Online learning of the ``dl2`` policy in the live service (``policy.dl2_online_learning``, off by default).

With it on, the policy explores as in training: each action is drawn from the network's distribution
over the legal actions (seeded: ``OnlineLearner``'s ``seed``), and every step is recorded with its cycle's time
and number of active jobs. Whenever ``policy.dl2_online_batch_jobs`` jobs (8 by default) have left the active
set (completed, cancelled or failed) since the last batch, the cycles recorded so far become one batch, and a
background
thread makes one policy-gradient step with a value baseline on it (reward: minus active jobs x time, the JCT
objective, as in ``simulator.dl2_train.reinforce``; but Monte-Carlo returns discounted per cycle and the
weights file's value head -- the offline recipe before issue 34's remedies, which a live service, with one
run and no sibling episodes, cannot all use), then swaps the new weights in; the next cycle decides with
them. As offline (``simulator.dl2_train.Sampler``), a cycle that preempts is charged at once what each
preemption throws away -- the job's work since its last checkpoint and a restart (``policy.restart_cost_s``),
in job-hours at weight ``PREEMPTION_COST`` -- rather than only through the longer JCT it causes later, which
the returns, truncated at a batch's end and discounted per cycle, would mostly not see.

In the service the learner sees what it needs through the cycle alone: every cycle's snapshot holds the
active jobs (a job that left it has finished: its JCT so far is in the rewards of the cycles it waited or
ran through) and the cycle's time, and the steps it took are its decisions. ``SchedulerService`` builds the
policy once, so the learner lives as long as the service, and stops the thread when the service stops
(``Dl2Policy.close``). A learning step that raises is logged and skipped; the thread goes on.

Never blocks a cycle: a cycle only appends to a list and, at most, hands a batch to a bounded queue
without waiting (a batch that finds the queue full is dropped and counted). The learning thread owns the
torch model; the policy reads the weights through one reference, replaced whole. Every plan still goes
through the same invariants and appliers as any other policy's: learning changes which legal actions the
network prefers, never what is legal.
"""

from __future__ import annotations

import queue
import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from scheduler_service.core.params import PolicyParams
from scheduler_service.lifecycle import JobState
from scheduler_service.policies.dl2_model import Network, from_torch, torch_network

if TYPE_CHECKING:
    from scheduler_service.policies.dl2 import Decision

QUEUE_BATCHES = 2          # batches waiting for the thread at most (more are dropped)
GAMMA = 0.95
LEARNING_RATE = 1e-4
ENTROPY = 0.01
PREEMPTION_COST = 1.0      # job-hours charged per hour a preemption throws away (``RlSettings.preemption_cost``'s)

log = structlog.get_logger("aryl.dl2")


class OnlineLearner:
    """The ``Chooser`` of an online-learning ``dl2`` (sampling + recording) and its learning thread."""

    def __init__(self, network: Network, params: PolicyParams, *, seed: int = 0) -> None:
        import torch  # fail at start when torch is missing, not in the first cycle

        self._torch = torch
        self._network = network
        self.params = params
        self._rng = np.random.default_rng(seed)
        self._obs: list[np.ndarray] = []
        self._legal: list[np.ndarray] = []
        self._actions: list[int] = []
        # (time, active jobs, index of its last step, job-hours charged for its preemptions)
        self._cycles: list[tuple[float, int, int, float]] = []
        self._active: set[int] = set()
        self._completed = 0
        self._queue: queue.Queue[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None] = queue.Queue(
            QUEUE_BATCHES)
        self.updates = 0           # learning steps made (by the thread)
        self.handed = 0            # batches handed to it
        self.dropped_batches = 0   # batches dropped: the queue was full
        self.failed_steps = 0      # learning steps that raised (logged; the weights stayed as they were)
        self._scale: float | None = None  # returns are divided by it (set by the thread's first step)
        self._thread = threading.Thread(target=self._learn, name="dl2-online-learning", daemon=True)
        self._thread.start()

    def network(self) -> Network:
        return self._network

    # -- Chooser: runs inside the cycle; appends only ------------------------------------------------

    def choose(self, observation: np.ndarray, legal: np.ndarray, logits: np.ndarray) -> int:
        z = np.where(legal, logits.astype(np.float64), -np.inf)
        p = np.exp(z - z.max())
        action = int(self._rng.choice(len(p), p=p / p.sum()))
        self._obs.append(observation)
        self._legal.append(legal)
        self._actions.append(action)
        return action

    def cycle_done(self, decision: Decision) -> None:
        snapshot = decision.snapshot
        active = {j.job_id for j in snapshot.jobs if j.state in (JobState.PENDING, JobState.RUNNING)}
        self._completed += len(self._active - active)
        self._active = active
        lost_s = sum(job.since_checkpoint(snapshot.now) + self.params.restart_cost_s for job in decision.preempted())
        self._cycles.append((snapshot.now, len(active), len(self._actions) - 1, PREEMPTION_COST * lost_s / 3600.0))
        if self._completed >= self.params.dl2_online_batch_jobs and len(self._cycles) > 1:
            self._hand_over()

    def _hand_over(self) -> None:
        """The cycles recorded so far but the newest (whose reward needs the next cycle's time) as one batch;
        returns are truncated at the batch's end."""
        *done, newest = self._cycles
        last_step = done[-1][2]
        returns = np.zeros(last_step + 1, dtype=np.float32)
        running = 0.0
        for k in range(len(done) - 1, -1, -1):
            when, jobs, last, charged = done[k]
            until = done[k + 1][0] if k + 1 < len(done) else newest[0]
            running = -jobs * max(until - when, 0.0) / 3600.0 - charged + GAMMA * running
            first = done[k - 1][2] + 1 if k > 0 else 0
            returns[first:last + 1] = running
        if last_step >= 0:
            batch = (np.stack(self._obs[:last_step + 1]), np.stack(self._legal[:last_step + 1]),
                     np.asarray(self._actions[:last_step + 1]), returns)
            try:
                self._queue.put_nowait(batch)
                self.handed += 1
            except queue.Full:
                self.dropped_batches += 1
        del self._obs[:last_step + 1], self._legal[:last_step + 1], self._actions[:last_step + 1]
        self._cycles = [(newest[0], newest[1], newest[2] - last_step - 1, newest[3])]
        self._completed = 0

    # -- the learning thread ----------------------------------------------------------------------

    def _learn(self) -> None:
        torch = self._torch
        torch.set_num_threads(1)
        module = torch_network(self._network)
        optimiser = torch.optim.Adam(module.parameters(), lr=LEARNING_RATE)
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                self._step(module, optimiser, batch)
            except Exception as exc:  # noqa: BLE001 - one bad step must not end online learning
                self.failed_steps += 1
                log.warning("dl2 online learning: a learning step failed; the weights stay as they were",
                            error=repr(exc))

    def _step(self, module: Any, optimiser: Any, batch: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> None:
        """One policy-gradient step with a value baseline on ``batch``, then the new weights swapped in."""
        torch = self._torch
        obs, legal_np, actions_np, returns_np = batch
        if self._scale is None:  # the first batch's, then fixed: the value head's targets keep one unit
            self._scale = float(np.std(returns_np)) or 1.0
        scale = self._scale
        x, legal = torch.from_numpy(obs), torch.from_numpy(legal_np)
        actions = torch.from_numpy(actions_np.astype(np.int64))
        returns = torch.from_numpy(returns_np / scale)
        logits, values = module(x)
        logp = torch.log_softmax(logits.masked_fill(~legal, -1e9), dim=-1)
        chosen = logp.gather(1, actions.unsqueeze(1)).squeeze(1)
        advantage = (returns - values).detach()
        advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8) if len(advantage) > 1 else advantage
        entropy = -(logp.exp() * logp.masked_fill(~legal, 0.0)).sum(-1).mean()
        loss = -(chosen * advantage).mean() + 0.5 * ((values - returns) ** 2).mean() - ENTROPY * entropy
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        optimiser.step()
        self._network = from_torch(module, {**self._network.meta, "made_by": "online"})
        self.updates += 1

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Tests: wait until the thread has learnt from every batch handed over (True) or ``timeout`` passes."""
        import time

        end = time.monotonic() + timeout
        while self.updates + self.failed_steps < self.handed and time.monotonic() < end:
            time.sleep(0.01)
        return self.updates + self.failed_steps >= self.handed

    def stop(self) -> None:
        """End the learning thread (after the batch it is on); idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=5)

