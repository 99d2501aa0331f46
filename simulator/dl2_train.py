"""Training of the ``dl2`` policy in the simulator (``aryl-sim train-dl2``): reproducible, bounded.

1. **Supervised warm-up** on decision traces of a teacher, ``optimus``: the teacher's per-job worker counts
   (``optimus_allocate``, as the registered ``optimus`` computes them on each snapshot) are turned into
   DL2's own action sequence -- removals first (slot order), then additions (slot order: a job's gang,
   then one worker at a time up to its count), then stop -- and the run follows those actions, so the
   recorded states are the ones DL2 meets. Why ``optimus`` rather than ``aryl``: its decision is exactly a
   worker count per job, which DL2's add/remove actions express step by step, and it is DL2's own baseline;
   ``aryl``'s decision also loans servers, reserves GPUs for starving jobs and holds sizes for
   anti-thrashing, none of which the action space can express. Loss: cross-entropy over the legal
   actions; *agreement* is the share of recorded steps where the network's most likely legal action is
   the teacher's.
2. **Reinforcement learning**: policy gradient with a value baseline (advantage actor-critic with Monte
   Carlo returns, on-policy; no replay). Each iteration runs episodes (a workload under the sampling
   policy, ``Sampler``), then one gradient step per episode batch. Reward, at the last step of every
   cycle: ``-(active jobs) x (time to the next cycle)`` in job-hours, whose sum over a run is minus the
   total JCT (Little's law) -- the JCT objective. Returns are discounted by ``gamma`` per cycle; advantages
   are normalised per batch; an entropy bonus keeps exploring.

Everything is seeded (``torch.manual_seed``, numpy generators from the seed); torch uses ``threads``
threads (1 by default) so runs are reproducible and share a small machine. The learning curve (average JCT
of the sampled episodes, and of the greedy policy on the training workloads at the start and end) goes
to a PNG and a JSON beside the weights.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.policies.dl2 import Decision, Dl2Policy, Greedy, masked_logits
from scheduler_service.policies.dl2_model import (
    DEFAULT_HIDDEN,
    JOB_SLOTS,
    STOP,
    Network,
    from_torch,
    random_network,
    save_network,
    torch_network,
)
from scheduler_service.policies.optimus import OptimusPolicy, optimus_allocate
from scheduler_service.policies.worker_targets import active_jobs, training_gpus
from simulator.engine import SimulationResult, simulate
from simulator.model import ClusterSpec, DemandPoint, TraceJob

NO_DEMAND = [DemandPoint(0.0, 0, 0.0)]


@dataclass(frozen=True)
class Environment:
    """Where episodes run: the workloads, the cluster, the simulator's cycle settings."""

    workloads: tuple[tuple[TraceJob, ...], ...]
    spec: ClusterSpec
    params: PolicyParams = field(default_factory=PolicyParams)
    min_cycle_gap_s: float = 60.0
    cycle_interval_s: float = 300.0
    restart_overhead_s: float = 30.0
    # A bound on one episode's virtual time: a poor network can thrash (restart jobs every cycle) and make a
    # run last for ever; its unfinished jobs count as active until then, in rewards and in JCT (``jct_of``).
    max_time_s: float = 2 * 86400.0


@dataclass
class Steps:
    """Recorded decision steps: observations, legal masks, actions; and per cycle, its time and number of
    active jobs, and the index of its last step."""

    observations: list[np.ndarray] = field(default_factory=list)
    legal: list[np.ndarray] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    cycle_times: list[float] = field(default_factory=list)
    cycle_jobs: list[int] = field(default_factory=list)
    cycle_last_step: list[int] = field(default_factory=list)

    def record(self, observation: np.ndarray, legal: np.ndarray, action: int) -> None:
        self.observations.append(observation)
        self.legal.append(legal)
        self.actions.append(action)

    def close_cycle(self, snapshot: ClusterSnapshot) -> None:
        self.cycle_times.append(snapshot.now)
        self.cycle_jobs.append(len(active_jobs(snapshot)))
        self.cycle_last_step.append(len(self.actions) - 1)


class Sampler:
    """Draws each action from the network's distribution over the legal ones, and records it."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.steps = Steps()

    def choose(self, observation: np.ndarray, legal: np.ndarray, logits: np.ndarray, value: float) -> int:
        z = masked_logits(logits.astype(np.float64), legal)
        p = np.exp(z - z.max())
        action = int(self.rng.choice(len(p), p=p / p.sum()))
        self.steps.record(observation, legal, action)
        return action

    def cycle_done(self, snapshot: ClusterSnapshot) -> None:
        self.steps.close_cycle(snapshot)


@dataclass
class Demonstrator:
    """A policy that decides as the teacher (``optimus``) through DL2's actions, recording every step."""

    params: PolicyParams
    steps: Steps = field(default_factory=Steps)
    name: str = "dl2-teacher"

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        teacher = OptimusPolicy(self.params)
        active = active_jobs(snapshot)
        target = optimus_allocate([teacher._job(j, snapshot.now) for j in active], training_gpus(snapshot))
        decision = Decision(snapshot, self.params)
        want = [target[j.job_id] for j in decision.slots]
        for _ in range(4 * JOB_SLOTS + 64):
            legal = decision.mask()
            action = _toward(decision, want, legal)
            self.steps.record(decision.observation(), legal, action)
            if action == STOP:
                break
            decision.apply(action)
        self.steps.close_cycle(snapshot)
        return decision.plan("dl2-teacher")


@dataclass
class Dagger:
    """DAgger (Ross et al., 2011): the learner decides (greedy), the teacher labels every state the learner
    reaches with the action it would take there; the labels train the next learner. Cures the compounding
    of small imitation errors into states the teacher never visits."""

    params: PolicyParams
    network: Network
    steps: Steps = field(default_factory=Steps)
    name: str = "dl2-dagger"

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        teacher = OptimusPolicy(self.params)
        jobs = [teacher._job(j, snapshot.now) for j in active_jobs(snapshot)]
        target = optimus_allocate(jobs, training_gpus(snapshot))
        decision = Decision(snapshot, self.params)
        want = [target[j.job_id] for j in decision.slots]
        for _ in range(4 * JOB_SLOTS + 64):
            legal = decision.mask()
            observation = decision.observation()
            self.steps.record(observation, legal, _toward(decision, want, legal))
            logits, _ = self.network.forward(observation)
            action = int(np.argmax(masked_logits(logits, legal)))
            if action == STOP:
                break
            decision.apply(action)
        self.steps.close_cycle(snapshot)
        return decision.plan("dl2-dagger")


def _toward(decision: Decision, want: Sequence[int], legal: np.ndarray) -> int:
    """The teacher's next action, in Optimus's own order: the first removal still needed (slot order); else
    the gang of the first job without workers that gets some (arrival order); else one more worker for the
    job below its count whose remaining time that cuts most (the greatest marginal gain); else stop."""
    n = len(decision.slots)
    for i in range(n):
        if len(decision.workers[i]) > want[i] and legal[JOB_SLOTS + i]:
            return JOB_SLOTS + i
    for i in range(n):
        if not decision.workers[i] and want[i] > 0 and legal[i]:
            return i
    grow = [i for i in range(n) if 0 < len(decision.workers[i]) < want[i] and legal[i]]
    if grow:
        return max(grow, key=lambda i: (decision.saving_s(i), -i))
    if legal[STOP]:
        return STOP
    return next(i for i in range(n) if legal[i] and not decision.workers[i])  # stop is illegal: a gang fits


# --------------------------------------------------------------------------------------------------
# Episodes
# --------------------------------------------------------------------------------------------------


def run_episode(env: Environment, jobs: Sequence[TraceJob], policy: Any, seed: int) -> float:
    """Average JCT (s) of one simulated run of ``jobs`` under ``policy`` (an instance), ``jct_of``."""
    return jct_of(episode(env, jobs, policy, seed), env)


def episode(env: Environment, jobs: Sequence[TraceJob], policy: Any, seed: int) -> SimulationResult:
    return simulate(list(jobs), NO_DEMAND, env.spec, policy, env.params, seed=seed,
                    cycle_interval_s=env.cycle_interval_s, restart_overhead_s=env.restart_overhead_s,
                    min_cycle_gap_s=env.min_cycle_gap_s, drain_ack_s=None, max_time_s=env.max_time_s)


def run_end(result: SimulationResult, env: Environment) -> float:
    """When the run's jobs are taken to be done: its end, or for a run cut short (the time bound, or a stall:
    nothing can run), the time bound -- so that stalling never pays."""
    return result.end_time if result.stop_reason == "completed" else max(result.end_time, env.max_time_s)


def jct_of(result: SimulationResult, env: Environment) -> float:
    """Average JCT (s), a job unfinished at the run's end counted as completing at ``run_end`` (a lower bound)."""
    until = run_end(result, env)
    ends = [(j.end if j.end is not None else until) - j.submit
            for j in result.jobs]
    return float(np.mean(ends)) if ends else math.inf


def _fixed(network: Network) -> Callable[[], Network]:
    return lambda: network


def greedy_jct(env: Environment, network: Network, seed: int = 0) -> list[float]:
    """Average JCT of the deterministic (live) policy on each workload of ``env``."""
    return [run_episode(env, jobs, Dl2Policy(env.params, lambda: network, chooser=Greedy()), seed)
            for jobs in env.workloads]


def demonstrations(env: Environment, seed: int = 0) -> tuple[Steps, list[float]]:
    """The teacher's recorded steps on every workload, and its average JCT on each."""
    steps = Steps()
    jcts = []
    for jobs in env.workloads:
        teacher = Demonstrator(env.params)
        jcts.append(run_episode(env, jobs, teacher, seed))
        _extend(steps, teacher.steps)
    return steps, jcts


def _extend(into: Steps, more: Steps) -> None:
    base = len(into.actions)
    into.observations += more.observations
    into.legal += more.legal
    into.actions += more.actions
    into.cycle_times += more.cycle_times
    into.cycle_jobs += more.cycle_jobs
    into.cycle_last_step += [base + i for i in more.cycle_last_step]


# --------------------------------------------------------------------------------------------------
# Learning (torch)
# --------------------------------------------------------------------------------------------------


def _torch(threads: int, seed: int) -> Any:
    import torch

    torch.set_num_threads(max(1, threads))
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    return torch


@dataclass
class WarmupResult:
    network: Network
    agreement: float           # share of the recorded steps where the network picks the teacher's action
    steps: int
    epochs: int
    losses: list[float]


def imitate(env: Environment, *, seed: int, epochs: int, dagger_rounds: int, hidden: int = DEFAULT_HIDDEN,
            threads: int = 1) -> tuple[WarmupResult, list[float], Steps]:
    """The supervised warm-up: behaviour cloning of the teacher's runs, then ``dagger_rounds`` of DAgger, each
    retraining (from the current weights, ``epochs // 2`` epochs) on all the labels so far. Returns the
    result (agreement measured on all the labels), the teacher's average JCT per workload, and the labels."""
    steps, teacher_jct = demonstrations(env, seed)
    result = warm_up(steps, seed=seed, epochs=epochs, hidden=hidden, threads=threads)
    for round_ in range(dagger_rounds):
        for jobs in env.workloads:
            learner = Dagger(env.params, result.network)
            run_episode(env, jobs, learner, seed)
            _extend(steps, learner.steps)
        result = warm_up(steps, seed=seed + round_ + 1, epochs=max(1, epochs // 2), hidden=hidden, threads=threads,
                         start=result.network)
    return result, teacher_jct, steps


def warm_up(steps: Steps, *, seed: int, epochs: int, hidden: int = DEFAULT_HIDDEN, lr: float = 3e-3,
            batch: int = 256, threads: int = 1, start: Network | None = None) -> WarmupResult:
    """Supervised learning of the teacher's actions (cross-entropy over the legal actions)."""
    torch = _torch(threads, seed)
    network = start or random_network(hidden, seed)
    module = torch_network(network)
    x = torch.from_numpy(np.stack(steps.observations))
    legal = torch.from_numpy(np.stack(steps.legal))
    y = torch.tensor(steps.actions, dtype=torch.long)
    optimiser = torch.optim.Adam(module.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        total = 0.0
        for first in range(0, len(y), batch):
            idx = order[first:first + batch]
            logits, _ = module(x[idx])
            logits = logits.masked_fill(~legal[idx], -1e9)
            loss = torch.nn.functional.cross_entropy(logits, y[idx])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(y))
    trained = from_torch(module, {**network.meta, "made_by": "warm_up"})
    return WarmupResult(trained, agreement(trained, steps), len(y), epochs, losses)


def agreement(network: Network, steps: Steps) -> float:
    """Share of ``steps`` whose recorded action is the network's most likely legal action."""
    if not steps.actions:
        return 0.0
    x = np.stack(steps.observations)
    h = np.tanh(np.tanh(x @ network.w1 + network.b1) @ network.w2 + network.b2)
    logits = np.where(np.stack(steps.legal), h @ network.wp + network.bp, -np.inf)
    return float(np.mean(np.argmax(logits, axis=1) == np.asarray(steps.actions)))


def cycle_returns(steps: Steps, end_time: float, gamma: float) -> np.ndarray:
    """Each step's return: the discounted sum of the rewards of its cycle and the later ones (job-hours)."""
    n_cycles = len(steps.cycle_times)
    rewards = np.zeros(n_cycles)
    for k in range(n_cycles):
        until = steps.cycle_times[k + 1] if k + 1 < n_cycles else end_time
        rewards[k] = -steps.cycle_jobs[k] * max(until - steps.cycle_times[k], 0.0) / 3600.0
    returns = np.zeros(n_cycles)
    running = 0.0
    for k in range(n_cycles - 1, -1, -1):
        running = rewards[k] + gamma * running
        returns[k] = running
    per_step = np.zeros(len(steps.actions))
    first = 0
    for k, last in enumerate(steps.cycle_last_step):
        per_step[first:last + 1] = returns[k]
        first = last + 1
    return per_step


@dataclass
class RlResult:
    network: Network
    curve: list[float]          # average JCT (s) of the sampled episodes, per iteration
    wall_s: float


def reinforce(env: Environment, network: Network, *, seed: int, iterations: int, episodes: int = 2,
              gamma: float = 0.99, lr: float = 3e-4, entropy: float = 0.001, value_weight: float = 0.5,
              threads: int = 1, progress: bool = False) -> RlResult:
    """Policy gradient with a value baseline (module doc), from ``network``; ``episodes`` per iteration,
    on the workloads in turn. The defaults: a first try (gamma 0.95, lr 1e-3, entropy 0.01) made the greedy
    policy worse on the Pollux workloads (2.03 -> 2.36 h average JCT in 20 iterations, seed 0); these keep it
    about where the warm-up left it in so short a run (2.03 h) -- because 20 Adam steps at 3e-4 hardly move
    the weights, not because RL has converged: run for 100 iterations (same defaults, seed 0, workloads 1-4)
    it makes the greedy policy worse (2.03 -> 2.51 h; sampled episodes 2.03 h, 2.38 h by iteration 90).
    Why: the warm-up trains the policy head only, so the value head starts at zero -- no baseline at first, the
    advantage is the normalised return, which follows the cycle's place in the episode (correlation 0.61 on
    two sampled episodes), not the action;
    and the value loss's gradient (norm ~4.2 vs the policy term's ~0.4 on the first batch) takes most of the
    clipped step. Fitting the value head first (trunk frozen, R^2 ~0.58) slows the damage (2.03 -> 2.06 h at
    100 iterations) but gains nothing: one step's return carries ~100 cycles of other sampled actions, too
    noisy at tens of episodes for a policy already near its teacher."""
    torch = _torch(threads, seed)
    module = torch_network(network)
    optimiser = torch.optim.Adam(module.parameters(), lr=lr)
    started = time.perf_counter()
    curve: list[float] = []
    scale: float | None = None
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=iterations, desc="dl2 RL", unit="it")
    done = 0
    for _ in range(iterations):
        current = from_torch(module, network.meta)
        batches: list[tuple[Steps, np.ndarray]] = []
        jcts = []
        for _ in range(episodes):
            jobs = env.workloads[done % len(env.workloads)]
            sampler = Sampler(seed * 100_003 + done)
            policy = Dl2Policy(env.params, _fixed(current), chooser=sampler)
            result = episode(env, jobs, policy, seed)
            jcts.append(jct_of(result, env))
            if sampler.steps.actions:
                batches.append((sampler.steps, cycle_returns(sampler.steps, run_end(result, env), gamma)))
            done += 1
        curve.append(float(np.mean(jcts)))
        if batches:
            x = torch.from_numpy(np.concatenate([np.stack(s.observations) for s, _ in batches]))
            legal = torch.from_numpy(np.concatenate([np.stack(s.legal) for s, _ in batches]))
            actions = torch.tensor([a for s, _ in batches for a in s.actions], dtype=torch.long)
            returns_np = np.concatenate([r for _, r in batches])
            if scale is None:
                scale = float(np.std(returns_np)) or 1.0
            returns = torch.from_numpy((returns_np / scale).astype(np.float32))
            logits, values = module(x)
            logits = logits.masked_fill(~legal, -1e9)
            logp = torch.log_softmax(logits, dim=-1)
            chosen = logp.gather(1, actions.unsqueeze(1)).squeeze(1)
            advantage = (returns - values).detach()
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
            probs = logp.exp()
            ent = -(probs * logp.masked_fill(~legal, 0.0)).sum(-1).mean()
            loss = (-(chosen * advantage).mean() + value_weight * ((values - returns) ** 2).mean()
                    - entropy * ent)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            optimiser.step()
        if bar is not None:
            bar.update(1)
            bar.set_postfix(avg_jct_h=f"{curve[-1] / 3600:.3f}")
    if bar is not None:
        bar.close()
    return RlResult(from_torch(module, {**network.meta, "made_by": "reinforce"}), curve,
                    time.perf_counter() - started)


# --------------------------------------------------------------------------------------------------
# The whole recipe (the CLI's)
# --------------------------------------------------------------------------------------------------


@dataclass
class TrainingReport:
    warmup: Network
    final: Network
    teacher_jct: list[float]
    warmup_agreement: float
    warmup_jct: list[float]
    final_jct: list[float]
    curve: list[float]
    warmup_s: float
    rl_s: float

    def as_json(self) -> dict[str, Any]:
        return {"teacher_avg_jct_s": self.teacher_jct, "warmup_agreement": self.warmup_agreement,
                "warmup_avg_jct_s": self.warmup_jct, "final_avg_jct_s": self.final_jct,
                "rl_curve_avg_jct_s": self.curve, "warmup_s": self.warmup_s, "rl_s": self.rl_s}


def train(env: Environment, *, seed: int, warmup_epochs: int, dagger_rounds: int, rl_iterations: int,
          episodes: int = 2, hidden: int = DEFAULT_HIDDEN, threads: int = 1, progress: bool = False) -> TrainingReport:
    """Warm-up (``imitate``), then ``reinforce``; the greedy policy's JCT after each."""
    started = time.perf_counter()
    warm, teacher_jct, _ = imitate(env, seed=seed, epochs=warmup_epochs, dagger_rounds=dagger_rounds, hidden=hidden,
                                   threads=threads)
    warmup_jct = greedy_jct(env, warm.network, seed)
    warmup_s = time.perf_counter() - started
    rl = reinforce(env, warm.network, seed=seed, iterations=rl_iterations, episodes=episodes, threads=threads,
                   progress=progress)
    final_jct = greedy_jct(env, rl.network, seed)
    return TrainingReport(warm.network, rl.network, teacher_jct, warm.agreement, warmup_jct, final_jct, rl.curve,
                          warmup_s, time.perf_counter() - started - warmup_s)


def write_outputs(report: TrainingReport, out: Path, provenance: dict[str, Any], *, plot: bool = True) -> None:
    """``out`` (the RL weights), ``<out>.warmup.npz``, ``<out>.json`` and ``<out>.png`` (learning curve)."""
    save_network(report.final, out, stage="rl", **provenance)
    save_network(report.warmup, out.with_suffix(".warmup.npz"), stage="warmup", **provenance)
    out.with_suffix(".json").write_text(json.dumps({**provenance, **report.as_json()}, indent=1) + "\n")
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(np.arange(1, len(report.curve) + 1), np.asarray(report.curve) / 3600, label="RL, sampled episodes")
        for value, label, style in ((np.mean(report.teacher_jct), "teacher (optimus)", ":"),
                                    (np.mean(report.warmup_jct), "warm-up, greedy", "--"),
                                    (np.mean(report.final_jct), "after RL, greedy", "-.")):
            ax.axhline(float(value) / 3600, linestyle=style, label=label, color="grey" if style == ":" else None)
        ax.set_xlabel("RL iteration")
        ax.set_ylabel("average JCT (h)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=100)
        plt.close(fig)


# --------------------------------------------------------------------------------------------------
# The environment of the documented training, and the CLI (``aryl-sim train-dl2``)
# --------------------------------------------------------------------------------------------------

POLLUX_FOLDER = "pollux-data/workloads-realistic"
PROFILES = "traces/pollux-throughput-profiles"


def pollux_environment(shared: Path, numbers: Sequence[int], *, folder: str = POLLUX_FOLDER,
                       seed: int = 0) -> Environment:
    """Pollux's workloads ``numbers`` on 16 servers x 4 GPUs (the Pollux simulator's cluster), every job
    elastic up to 16x its request, speeds from Pollux's measured profiles -- the setting of
    ``evaluation.pollux``'s section -- with cycles on events, at least 60 s apart."""
    from simulator.traces import JobMapping, load_pollux_workload

    mapping = JobMapping(seed=seed, elastic_share=1.0, max_scale=16, gpus_per_server=4)
    workloads = tuple(tuple(load_pollux_workload(shared / folder / f"workload-{n}.csv", profiles_dir=shared / PROFILES,
                                                 mapping=mapping)) for n in numbers)
    return Environment(workloads, ClusterSpec(16, 0, 4))


DEFAULTS = {"workloads": "1,2,3,4", "seed": 0, "warmup_epochs": 40, "dagger_rounds": 2, "rl_iterations": 20,
            "episodes": 2, "threads": 1}


def add_train_dl2_parser(sub: Any) -> None:
    import argparse

    parser = sub.add_parser(
        "train-dl2", help="train the dl2 policy's network: warm-up on optimus, then RL (simulator.dl2_train)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parent.parent.parent / "shared",
                        help="the public data folder (holds pollux-data/ and traces/)")
    parser.add_argument("--workloads", default=DEFAULTS["workloads"],
                        help=f"comma-separated numbers of {POLLUX_FOLDER}/workload-N.csv to train on")
    parser.add_argument("--out", type=Path, required=True,
                        help="the weights file to write (.npz); beside it .warmup.npz, .json and .png")
    parser.add_argument("--seed", type=int, default=DEFAULTS["seed"])
    parser.add_argument("--warmup-epochs", type=int, default=DEFAULTS["warmup_epochs"])
    parser.add_argument("--dagger-rounds", type=int, default=DEFAULTS["dagger_rounds"])
    parser.add_argument("--rl-iterations", type=int, default=DEFAULTS["rl_iterations"])
    parser.add_argument("--episodes", type=int, default=DEFAULTS["episodes"], help="episodes per RL iteration")
    parser.add_argument("--threads", type=int, default=DEFAULTS["threads"], help="torch threads")
    parser.add_argument("--no-plot", action="store_true", help="skip the learning-curve PNG")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="a progress bar on stderr")


def train_dl2_command(args: Any) -> int:
    import sys

    from aryl_common.entry import BadInput

    try:
        numbers = [int(n) for n in str(args.workloads).split(",") if n.strip()]
        if not numbers:
            raise ValueError("--workloads names no workload")
        env = pollux_environment(args.shared, numbers)
    except (ValueError, OSError) as exc:
        raise BadInput(f"error: {exc}") from exc
    started = time.perf_counter()
    report = train(env, seed=args.seed, warmup_epochs=args.warmup_epochs, dagger_rounds=args.dagger_rounds,
                   rl_iterations=args.rl_iterations, episodes=args.episodes, threads=args.threads,
                   progress=args.progress and sys.stderr.isatty())
    wall = time.perf_counter() - started
    command = (f"aryl-sim train-dl2 --out {args.out} --workloads {args.workloads} --seed {args.seed} "
               f"--warmup-epochs {args.warmup_epochs} --dagger-rounds {args.dagger_rounds} "
               f"--rl-iterations {args.rl_iterations} --episodes {args.episodes} --threads {args.threads}")
    write_outputs(report, args.out, {"command": command, "seed": args.seed, "workloads": numbers,
                                     "train_wall_s": round(wall, 1)}, plot=not args.no_plot)
    h = 3600.0
    print(f"teacher (optimus) avg JCT {np.mean(report.teacher_jct) / h:.3f} h; warm-up agreement "
          f"{report.warmup_agreement:.1%}, avg JCT {np.mean(report.warmup_jct) / h:.3f} h; after RL "
          f"{np.mean(report.final_jct) / h:.3f} h; trained in {wall:.0f} s; wrote {args.out}")
    return 0
