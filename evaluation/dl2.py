"""The evaluation's ``dl2`` section (``python -m evaluation --only dl2``): ``drf``, ``optimus``, ``dl2``
after its supervised warm-up only, and ``dl2`` after reinforcement learning, beside DL2's published
figures (Peng et al., 2019: average JCT -44.1% vs DRF, -17.5% vs Optimus).

Weights: the files ``aryl-sim train-dl2`` wrote (``WEIGHTS``: the one shipped with Aryl is seed 0; the others
differ only by ``--seed``), each with its warm-up stage beside it; their ``meta`` holds the command and the
training mix (Pollux 1-4 and, with ``--philly-samples``, Philly jobs from before the window of the Philly
sample here: ``simulator.dl2_train.PHILLY_SAMPLES``). The
spread is over those training seeds (the simulation itself is deterministic). Nothing here is tuned toward
the paper's figures: the settings are the Pollux section's, and the training's.

The main tables are clairvoyant on purpose: the jobs declare their training target and report progress (the
Pollux workloads' oracle work, as the paper's and the Pollux study's Optimus+Oracle get), and the shipped
networks were trained on exactly those features. A second table runs the held-out and Philly settings
non-clairvoyant (``ESTIMATES``, as the headline: each job declares a run time off by ``exp(0.8 z)``, no total
work; ``simulator.estimates``), three estimate seeds: what a user of the shipped weights would see, outside
what they were trained on (``_estimated``).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import Plan
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.lifecycle import JobState
from scheduler_service.policies.dl2 import Dl2Policy, Greedy, decide
from scheduler_service.policies.dl2_model import BUNDLED_MODEL, POLICY_ARRAYS, Network, load_network
from simulator.dl2_train import Environment, checkpoints_path, jct_of, load_checkpoints, pollux_environment
from simulator.engine import SimulationResult, simulate
from simulator.estimates import Estimates
from simulator.model import ClusterSpec, DemandPoint, TraceJob
from simulator.traces import JobMapping, load_philly

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "scheduler_service/policies/data"
ESTIMATES = "lognormal:0.8"  # the non-clairvoyant table's user estimates (the headline's)
ESTIMATE_SEEDS = (0, 1, 2)
NO_ESTIMATES_WHY = ("the main tables: the jobs declare their training target and report progress, the features the "
                    "networks were trained on; the non-clairvoyant runs (user estimates) are under 'estimated'")
WEIGHTS = {0: BUNDLED_MODEL, 1: MODELS / "dl2-seed1.npz", 2: MODELS / "dl2-seed2.npz"}
PAPER = {"vs_drf_pct": -44.1, "vs_optimus_pct": -17.5}
TRAIN_WORKLOADS = (1, 2, 3, 4)
TEST_WORKLOADS = (5, 6, 7, 8)
PHILLY_JOBS = 400
MAX_TIME_S = 7 * 86400.0


def _log(message: str) -> None:
    import sys

    print(f"[evaluation:dl2] {message}", file=sys.stderr, flush=True)


def _run(jobs: tuple[TraceJob, ...], env: Environment, policy: str | Dl2Policy) -> SimulationResult:
    return simulate(list(jobs), [DemandPoint(0.0, 0, 0.0)], env.spec, policy, PolicyParams(), seed=0,
                    min_cycle_gap_s=60.0, drain_ack_s=None, max_time_s=env.max_time_s)


def _fixed(network: Network) -> Dl2Policy:
    return Dl2Policy(PolicyParams(), lambda: network)


def _scores(env: Environment, names: list[str], nets: dict[str, Network]) -> dict[str, dict[str, Any]]:
    """Per policy: average JCT (s) per workload (unfinished jobs counted to the run's end) and completions."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        jcts, done = [], 0
        for jobs in env.workloads:
            result = _run(jobs, env, _fixed(nets[name]) if name in nets else name)
            jcts.append(jct_of(result, env))
            done += sum(1 for j in result.jobs if j.end is not None)
        out[name] = {"avg_jct_s": jcts, "completed": done, "jobs": sum(len(w) for w in env.workloads)}
    return out


def philly_sample(shared: Path) -> Environment:
    """The first ``PHILLY_JOBS`` jobs of the Philly 15-day window on 16 servers x 8 GPUs, half of them elastic
    (up to 4x), Amdahl speed-ups: a setting DL2 was not trained on (8-GPU servers, other job shapes)."""
    mapping = JobMapping(seed=0, elastic_share=0.5, max_scale=4, gpus_per_server=8)
    jobs = load_philly(shared / "traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz", mapping=mapping,
                       limit=PHILLY_JOBS)
    return Environment((tuple(jobs),), ClusterSpec(16, 0, 8))


def dl2_section(shared: Path, assets: Path, earlier: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The section (``evaluation.document.SECTIONS``): markdown and raw figures."""
    started = time.perf_counter()
    # Only weights of the current recipe: ``train-dl2`` writes the checkpoints of the curves beside them.
    seeds = [s for s, path in WEIGHTS.items() if path.exists() and checkpoints_path(path).exists()]
    nets: dict[str, Network] = {}
    meta: dict[int, dict[str, Any]] = {}
    for s in seeds:
        final = load_network(WEIGHTS[s])
        nets[f"dl2-rl/{s}"] = final
        nets[f"dl2-warmup/{s}"] = load_network(WEIGHTS[s].with_suffix(".warmup.npz"))
        meta[s] = final.meta
    names = ["drf", "optimus", *[f"dl2-warmup/{s}" for s in seeds], *[f"dl2-rl/{s}" for s in seeds]]
    settings = {key: replace(env, max_time_s=MAX_TIME_S) for key, env in (
        ("train", pollux_environment(shared, TRAIN_WORKLOADS)), ("test", pollux_environment(shared, TEST_WORKLOADS)),
        ("philly", philly_sample(shared)))}
    # What the jobs tell the policies in the main tables: their training target and progress (module doc: why);
    # user estimates in ``estimated``.
    raw: dict[str, Any] = {"seeds": seeds, "meta": {str(s): m for s, m in meta.items()}, "estimates": "exact",
                           "estimates_why": NO_ESTIMATES_WHY}
    for key, env in settings.items():
        _log(f"{key}: {len(names)} policies")
        raw[key] = _scores(env, names, nets)
    raw["estimated"] = _estimated(settings, ["drf", "optimus", *[f"dl2-rl/{s}" for s in seeds]], nets)
    raw["headroom"] = {key: _headroom(env) for key, env in settings.items()}
    raw["curves"] = _curves(settings, raw, seeds, nets)
    if seeds:
        raw["window"] = {key: _window(env, nets[f"dl2-rl/{seeds[0]}"]) for key, env in settings.items()}
    if raw["curves"]:
        _plot_curves(raw, assets / CURVES_PNG)
    text = _markdown(raw, seeds, time.perf_counter() - started)
    return text, raw


CURVES_PNG = "dl2-learning.png"
ESTIMATED_SETTINGS = ("test", "philly")


def _estimated(settings: dict[str, Environment], names: list[str], nets: dict[str, Network]) -> dict[str, Any]:
    """Non-clairvoyant (module doc): per setting of ``ESTIMATED_SETTINGS`` and policy, the average JCT (s) over
    the setting's workloads for each of ``ESTIMATE_SEEDS``, the jobs declaring ``ESTIMATES``."""
    estimates = Estimates.parse(ESTIMATES)
    out: dict[str, Any] = {"estimates": ESTIMATES, "estimate_seeds": list(ESTIMATE_SEEDS)}
    for key in ESTIMATED_SETTINGS:
        env = settings[key]
        _log(f"{key}, non-clairvoyant ({ESTIMATES}): {len(names)} policies x {len(ESTIMATE_SEEDS)} seeds")
        out[key] = {name: [_mean([jct_of(_run(tuple(estimates.apply(jobs, seed)), env,
                                              _fixed(nets[name]) if name in nets else name), env)
                                  for jobs in env.workloads]) for seed in ESTIMATE_SEEDS]
                    for name in names}
    return out


def _estimated_rows(raw: dict[str, Any], seeds: list[int]) -> list[str]:
    """The non-clairvoyant table's rows: per setting, each policy's mean over the estimate seeds (and, for dl2,
    the training seeds) with its range, beside the same policy with the jobs' true work."""
    est = raw.get("estimated")
    if not est or not seeds:
        return []
    rows = []
    for key in ESTIMATED_SETTINGS:
        cells = []
        for names in (["drf"], ["optimus"], [f"dl2-rl/{s}" for s in seeds]):
            values = [v for n in names for v in est[key][n]]
            exact = _mean([_mean(raw[key][n]["avg_jct_s"]) for n in names])
            cells.append(f"{_mean(values) / 3600:.2f} h ({min(values) / 3600:.2f}..{max(values) / 3600:.2f}; "
                         f"true work: {exact / 3600:.2f} h)")
        dl2 = _mean([v for s in seeds for v in est[key][f"dl2-rl/{s}"]])
        best = min(_mean(est[key]["drf"]), _mean(est[key]["optimus"]))
        rows.append(f"| {SETTING_LABELS[key]} | {' | '.join(cells)} | {(dl2 / best - 1) * 100:+.1f}% |")
    return rows


SETTING_LABELS = {"train": "Pollux 1-4 (trained on)", "test": "Pollux 5-8 (held out)",
                  "philly": "Philly sample (unseen)"}
# The RL remedies of issue 34 as measured on the seed-0 warm-up shipped at 40eb998 (greedy average JCT on
# workloads 1-4, 2-day runs as in training; 2.047 h before RL), one setting changed at a time, by
# ``aryl-sim train-dl2``'s RL flags (the earlier recipe by the code before them): (recipe, iterations x
# episodes, figures). Measured once, quoted.
REMEDIES = (
    ("earlier recipe: Monte-Carlo returns, discount per cycle (0.99), value head shared and untrained, lr 3e-4",
     "20 x 2 / 100 x 2", "mean of seeds 2.06 -> 2.10; seed 0 2.03 -> 2.51 at 100"),
    ("critic of its own, pre-trained on 4 warm-up rollouts (R^2 0.91); GAE (0.99, lambda 0.95 per cycle); PPO "
     "(clip 0.2, 4 passes); lr 3e-4", "10 x 4", "2.021 (5), 2.049 (10)"),
    ("the same, lr 1e-3", "12 x 4", "2.052 (4), 2.064 (8), 2.070 (12)"),
    ("discount in time (4 h, GAE lambda 1 h) instead of per cycle, lr 1e-3", "12 x 4",
     "2.027 (4), 2.034 (8), 2.036 (12)"),
    ("the same, 8 episodes per iteration", "20 x 8", "2.037 (5), 2.039 (10), 2.033 (15), 2.045 (20)"),
    ("+ the input-driven baseline (Mao et al. 2019: the batch's other episodes on the same workload, same time)",
     "40 x 8", "2.034 (10), 2.016 (20), 2.010 (30), 2.023 (40)"),
    ("the same, lr 3e-3", "20 x 8", "2.145 (10), 2.159 (20)"),
)


# Preemption in DL2's actions (issue 34, item 2), measured on this section's settings before the shipped recipe
# (seeds 0 and 1; ``aryl-sim train-dl2`` with the flags named): (recipe, per setting "warm-up -> RL" cells).
PREEMPTION = (
    ("no preemption (`--no-preemption`; the weights shipped before 2026-11-30)",
     ("1.878 -> 1.878; 1.886 -> 1.767 (none)", "2.154 -> 2.152; 2.152 -> 2.172 (none)",
      "1.844 -> 1.848; 1.851 -> 1.849 (none)")),
    ("preemption, the teacher demonstrating `optimus`'s own (the code before `teacher_wants`), the price in the "
     "JCT only (`--preemption-cost 0`)",
     ("2.076 -> 2.094; 2.064 -> 2.135 (35 -> 934; 159 -> 520)",
      "2.859 -> 2.878; 2.520 -> 5.301 (1,452 -> 2,160; 969 -> 10,958)",
      "1.847 -> 1.860; 1.853 -> 1.849 (0 -> 6; 0 -> 0)")),
    ("preemption, a teacher that never preempts, each preemption charged at once (`--preemption`, shipped)",
     ("1.955 -> 1.873; 1.992 -> 1.705 (50 -> 1; 52 -> 9)", "2.246 -> 2.116; 2.073 -> 1.873 (541 -> 3; 201 -> 74)",
      "1.850 -> 1.862; 1.855 -> 1.853 (0 -> 21; 0 -> 0)")),
)


class _WindowWatch:
    """The live ``dl2`` (greedy), counting per cycle whether jobs waited *past* its window of ``JOB_SLOTS``
    visible jobs (unseen by the network; not started by the backfill either: their gang did not fit) and the GPUs
    left free then."""

    name = "dl2"

    def __init__(self, network: Network) -> None:
        self.network = network
        self.cycles = 0
        self.blind: list[int] = []   # per cycle with unseen pending jobs: the GPUs left free by the decision

    def schedule(self, snapshot: ClusterSnapshot) -> Plan:
        decision = decide(snapshot, PolicyParams(), self.network, Greedy())
        self.cycles += 1
        if any(j.state is JobState.PENDING and j.job_id not in decision.backfilled for j in decision.unseen):
            self.blind.append(decision.capacity.total)
        return decision.plan()


def _window(env: Environment, network: Network) -> dict[str, float]:
    """How often the window of visible jobs left jobs waiting with GPUs free (one seed's network, its runs)."""
    watch = _WindowWatch(network)
    for jobs in env.workloads:
        _run(jobs, env, watch)  # type: ignore[arg-type]
    blind = [g for g in watch.blind if g > 0]
    return {"cycles": watch.cycles, "blind_share": len(blind) / max(watch.cycles, 1),
            "free_gpus_when_blind": _mean([float(g) for g in blind]) if blind else 0.0}


def _same(a: Network, b: Network) -> bool:
    return all(np.array_equal(getattr(a, n), getattr(b, n)) for n in POLICY_ARRAYS)


def _curves(settings: dict[str, Environment], raw: dict[str, Any], seeds: list[int],
            nets: dict[str, Network]) -> dict[str, dict[str, dict[str, float]]]:
    """Per seed, per setting: the greedy policy's average JCT (s, mean over the setting's workloads) at every
    RL checkpoint the training kept (``.checkpoints.npz``); the warm-up (iteration 0) and the final network
    are the table's own runs, the ones between are run here."""
    curves: dict[str, dict[str, dict[str, float]]] = {}
    for s in seeds:
        path = checkpoints_path(WEIGHTS[s])
        if not path.exists():
            continue
        final = nets[f"dl2-rl/{s}"]
        curves[str(s)] = {key: {} for key in settings}
        for iteration, network in load_checkpoints(path, final):
            known = next((name for name in (f"dl2-warmup/{s}", f"dl2-rl/{s}") if _same(network, nets[name])), None)
            for key, env in settings.items():
                if known is not None:
                    jcts = raw[key][known]["avg_jct_s"]
                else:
                    _log(f"curve: seed {s}, iteration {iteration}, {key}")
                    jcts = [jct_of(_run(jobs, env, _fixed(network)), env) for jobs in env.workloads]
                curves[str(s)][key][str(iteration)] = _mean(jcts)
    return curves


def _plot_curves(raw: dict[str, Any], path: Path) -> None:
    """Average JCT vs RL iteration per setting: each seed, their mean, and ``drf``'s and ``optimus``'s level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(SETTING_LABELS)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4))
    for ax, key in zip(axes, keys, strict=True):
        series = [sorted((int(k), v / 3600) for k, v in raw["curves"][s][key].items()) for s in raw["curves"]]
        for seed, points in zip(raw["curves"], series, strict=True):
            ax.plot([k for k, _ in points], [v for _, v in points], marker=".", linewidth=0.8, alpha=0.6,
                    label=f"dl2, seed {seed}")
        common = sorted(set.intersection(*[{k for k, _ in p} for p in series]))
        ax.plot(common, [_mean([dict(p)[k] for p in series]) for k in common], color="black", linewidth=2,
                label="dl2, mean of seeds")
        ax.axhline(_mean(raw[key]["optimus"]["avg_jct_s"]) / 3600, color="grey", linestyle=":",
                   label="optimus (teacher)")
        ax.axhline(_mean(raw[key]["drf"]["avg_jct_s"]) / 3600, color="grey", linestyle="--", label="drf")
        ax.set_title(SETTING_LABELS[key], fontsize=9)
        ax.set_xlabel("RL iteration (0 = warm-up)")
        ax.set_ylabel("average JCT (h), greedy")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# The section before the order-free encoding (encoding 1: an MLP over 32 fixed slots, trained on workloads 1-4
# alone; main at 40c54da, mean of seeds 0-2, greedy): measured once, quoted for comparison.
ENCODING_1 = {"test": (2.45, 2.38), "philly": (4.37, 4.24)}  # (warm-up, after RL), h


def _encoding(raw: dict[str, Any]) -> str:
    versions = sorted({m.get("encoding_version") for m in raw["meta"].values()}, key=str)
    return ", ".join(str(v) for v in versions) or "?"


def _mix(raw: dict[str, Any]) -> str:
    """What the seeds trained on, from their weights' ``meta``."""
    mixes = {tuple(m.get("training_mix") or [f"pollux-{n}" for n in m.get("workloads", [])])
             for m in raw["meta"].values()}
    if len(mixes) != 1:
        return "differs by seed (their commands above)"
    mix = next(iter(mixes))
    pollux = [m.split("-")[1] for m in mix if m.startswith("pollux-")]
    philly = [m for m in mix if m.startswith("philly@")]
    text = f"Pollux workloads {', '.join(pollux)}"
    if philly:
        shapes = ", ".join(f"{p.split(':')[1].split('x')[1]} x {p.split('x')[-1]} GPUs" for p in philly)
        text += (f" and {len(philly)} Philly samples of {philly[0].split(':')[1].split('x')[0]} jobs from before "
                 f"the evaluation's window (`simulator/dl2_train.py` `PHILLY_SAMPLES`; clusters {shapes})")
    return text


def _transfer(raw: dict[str, Any], seeds: list[int]) -> str:
    """How the network does on the unseen Philly sample against the best heuristic (issue 34: within 10%),
    and against the fixed-slot network before this encoding (``ENCODING_1``)."""
    if not seeds:
        return ""
    best = min(_mean(raw["philly"][n]["avg_jct_s"]) for n in ("drf", "optimus"))
    rl = _mean([_mean(raw["philly"][f"dl2-rl/{s}"]["avg_jct_s"]) for s in seeds])
    warm = _mean([_mean(raw["philly"][f"dl2-warmup/{s}"]["avg_jct_s"]) for s in seeds])
    test = _mean([_mean(raw["test"][f"dl2-rl/{s}"]["avg_jct_s"]) for s in seeds])
    gap = (rl / best - 1) * 100
    verdict = "within" if gap <= 10 else "not within"
    text = (f"On the unseen Philly sample dl2 after RL averages {rl / 3600:.2f} h (warm-up {warm / 3600:.2f} h), "
            f"{gap:+.1f}% against the best heuristic ({best / 3600:.2f} h): {verdict} issue 34's 10%. The fixed-slot "
            f"network before this encoding had {ENCODING_1['philly'][0]:.2f} -> {ENCODING_1['philly'][1]:.2f} h "
            f"there, and {ENCODING_1['test'][0]:.2f} -> {ENCODING_1['test'][1]:.2f} h on Pollux 5-8 (now "
            f"{test / 3600:.2f} h after RL).")
    window = raw.get("window")
    if window:
        parts = [f"{SETTING_LABELS[key]} {w['blind_share']:.0%} of {w['cycles']} cycles"
                 + (f" ({w['free_gpus_when_blind']:.0f} GPUs free on average then)" if w["blind_share"] else "")
                 for key, w in window.items()]
        text += (f" Jobs past the window of the 32 oldest active jobs -- unseen by the network, started only by the "
                 f"backfill where their gang fits -- still waited while GPUs were free (seed {seeds[0]}'s network "
                 f"after RL): {'; '.join(parts)}. Before the backfill (the same section at 91b0e7a, the networks "
                 f"then): Philly 15% of 2,110 cycles, 88 GPUs free on average then; Pollux 14-15%, 5-8 GPUs.")
    return text


# What the headroom paragraph runs beside the table's policies: Aryl's own policy, same cycle, same information.
HEADROOM_POLICY = "aryl"


def _headroom(env: Environment) -> dict[str, float]:
    """How far below the teacher a policy can go on ``env`` (reference figures, not targets): ``HEADROOM_POLICY``'s
    average JCT (s), and a floor no policy reaches, each job alone on the cluster from its submission at its
    fastest size (no queue, no restart), averaged as the table averages."""
    aryl = _mean([jct_of(_run(jobs, env, HEADROOM_POLICY), env) for jobs in env.workloads])
    gpus = env.spec.training_servers * env.spec.gpus_per_server
    floors = []
    for jobs in env.workloads:
        fastest = [j.work / max(speed for workers, speed in j.throughput
                                if workers <= j.max_workers and workers * j.gpus_per_worker <= gpus)
                   for j in jobs]
        floors.append(_mean(fastest))
    return {"aryl_avg_jct_s": aryl, "floor_avg_jct_s": _mean(floors)}


def _headroom_text(raw: dict[str, Any], seeds: list[int]) -> str:
    """The headroom figures beside the warm-up's: what RL's 5% below its warm-up (issue 34) would ask."""
    room = raw.get("headroom")
    if not room or not seeds:
        return ""
    parts = []
    for key, label in SETTING_LABELS.items():
        warm = _mean([_mean(raw[key][f"dl2-warmup/{s}"]["avg_jct_s"]) for s in seeds])
        best = min(_mean(raw[key][n]["avg_jct_s"]) for n in ("drf", "optimus"))
        parts.append(f"{label}: warm-up {warm / 3600:.2f} h (5% below: {0.95 * warm / 3600:.2f} h), `drf`/`optimus` "
                     f"at best {best / 3600:.2f} h, `{HEADROOM_POLICY}` {room[key]['aryl_avg_jct_s'] / 3600:.2f} h, "
                     f"the floor {room[key]['floor_avg_jct_s'] / 3600:.2f} h")
    return ("How far below its teacher a policy can go on these settings (reference figures, not targets): "
            f"`{HEADROOM_POLICY}` (Aryl's own policy, through the same cycle with the same information) and a floor "
            "no policy reaches, each job alone on the cluster from its submission at its fastest size (no queue, "
            "no restart). " + "; ".join(parts) + ".")


def _episode_cost(seeds: list[int]) -> str:
    """The RL episode's wall time and the training time per seed, from the files ``train-dl2`` wrote."""
    costs = []
    for s in seeds:
        path = WEIGHTS[s].with_suffix(".json")
        if path.exists():
            report = json.loads(path.read_text())
            costs.append((s, report.get("rl_episode_s", float("nan")), report.get("train_wall_s", float("nan"))))
    if not costs:
        return ""
    return ("One RL episode costs " + ", ".join(f"{c:.2f} s (seed {s}, trained in {w:.0f} s)" for s, c, w in costs)
            + " on this 2-core machine, shared with other work while they ran.")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _cell(raw: dict[str, Any], key: str, family: str, seeds: list[int]) -> tuple[str, list[float]]:
    """'mean h (min..max over seeds)' of a dl2 family's average JCT over a setting's workloads."""
    per_seed = [_mean(raw[key][f"{family}/{s}"]["avg_jct_s"]) for s in seeds]
    if not per_seed:
        return "n/a", []
    spread = f" ({min(per_seed) / 3600:.2f}..{max(per_seed) / 3600:.2f}, sd {statistics.pstdev(per_seed) / 3600:.2f})" \
        if len(per_seed) > 1 else ""
    return f"{_mean(per_seed) / 3600:.2f} h{spread}", per_seed


def _markdown(raw: dict[str, Any], seeds: list[int], wall_s: float) -> str:
    rows = []
    for key, label in (("train", "Pollux realistic 1-4 (trained on)"), ("test", "Pollux realistic 5-8 (held out)"),
                       ("philly", f"Philly, first {PHILLY_JOBS} jobs, 16 x 8 GPUs (unseen jobs)")):
        drf = _mean(raw[key]["drf"]["avg_jct_s"])
        opt = _mean(raw[key]["optimus"]["avg_jct_s"])
        warm, _ = _cell(raw, key, "dl2-warmup", seeds)
        rl, rl_seeds = _cell(raw, key, "dl2-rl", seeds)
        rl_mean = _mean(rl_seeds) if rl_seeds else float("nan")
        done = {n: raw[key][n]["completed"] for n in raw[key]}
        total = next(iter(raw[key].values()))["jobs"]
        incomplete = ", ".join(f"{n} {c}/{total}" for n, c in done.items() if c < total * len(seeds or [1]) and
                               c < total) or "none"
        rows.append(f"| {label} | {drf / 3600:.2f} h | {opt / 3600:.2f} h | {warm} | {rl} | "
                    f"{(rl_mean / drf - 1) * 100:+.1f}% | {(rl_mean / opt - 1) * 100:+.1f}% | {incomplete} |")
    commands = "; ".join(f"seed {s}: `{m.get('command', '?')}` ({m.get('train_wall_s', '?')} s)"
                         for s, m in raw["meta"].items())
    per_seed = []
    for s in seeds:
        changes = []
        for key in SETTING_LABELS:
            warm_s = _mean(raw[key][f"dl2-warmup/{s}"]["avg_jct_s"])
            rl_s = _mean(raw[key][f"dl2-rl/{s}"]["avg_jct_s"])
            changes.append(f"{warm_s / 3600:.3f} -> {rl_s / 3600:.3f} h ({(rl_s / warm_s - 1) * 100:+.1f}%)")
        m = raw["meta"][str(s)]
        per_seed.append(f"| {s} | {' | '.join(changes)} | {m.get('train_wall_s', '?')} s |")
    verdict = _verdict(raw, seeds)
    return f"""## DL2: learned scheduling vs DRF and Optimus

`drf` (dominant resource fairness over GPUs: progressive filling between users, then jobs), `optimus`
(Optimus with the snapshot's knowledge: greedy by marginal cut in remaining time), and `dl2` after its
supervised warm-up only (imitating `optimus`, with DAgger) and after reinforcement learning (PPO with a
critic of its own, pre-trained on the warm-up's rollouts; GAE; the input-driven baseline; reward = minus
active jobs x time, discounted in time: `simulator/dl2_train.py`). The network (encoding version
{_encoding(raw)}, `scheduler_service/policies/dl2_model.py`) is order-free: one shared per-job network
embeds each of the 32 oldest active jobs, a pooled (mean and max) cluster context goes back to every job, and
each job gets its own add and remove logits, stop and the value coming from the pooled context; every
feature is relative to the cluster (shares of its GPUs and of a server, log-scaled), none a GPU count. Queued
jobs past those 32 start at their minimum, oldest first, where their gang fits the GPUs the network left free
once it stops (`Decision.backfill`, since 2026-11-30; in training too). All
four run through the service's own cycle on 16 servers x 4 GPUs for the Pollux workloads
(`pollux-data/workloads-realistic`, every job elastic up to 16x its request, speeds from Pollux's measured
profiles), cycles on events at least 60 s apart, restarts 30 s. Training mix: {_mix(raw)}; Pollux 5-8 are
held out, and the Philly sample here is the first jobs of a later window of the trace, jobs the network
never saw (the training samples end before that window; their clusters are listed above). The RL settings
were chosen on workloads 1-4 alone, the Philly training samples without a look at any evaluation figure.
Average JCT per setting is the mean over its workloads of each run's average JCT; a job still unfinished after
{MAX_TIME_S / 86400:.0f} simulated days counts as completing then. dl2 cells: mean over the training seeds
{seeds} (min..max, standard deviation). Training: {commands}.

| setting | drf | optimus | dl2 warm-up | dl2 after RL | dl2 (RL) vs drf | dl2 (RL) vs optimus | unfinished |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

RL against its own warm-up, per training seed (greedy policy, average JCT):

| seed | {' | '.join(SETTING_LABELS.values())} | training time |
|---|---|---|---|---|
{chr(10).join(per_seed)}

{verdict}

![dl2 learning curves](evaluation/{CURVES_PNG})

Learning curves (`docs/evaluation/{CURVES_PNG}`): the greedy policy at every 5th RL iteration of each seed
(the networks the training kept, `.checkpoints.npz` beside the weights), on the trained, held-out and
Philly settings, with `optimus` (the teacher) and `drf` as lines.

How the RL stage got here -- the remedies of issue 34, each measured on the seed-0 warm-up shipped before them
(commit 40eb998's `dl2.warmup.npz`), greedy average JCT on the training workloads 1-4 (2.047 h before RL;
2-day runs, as in training), one setting changed at a time:

| RL recipe | iterations x episodes | greedy avg JCT (h) along the run (iteration) |
|---|---|---|
{chr(10).join(f"| {recipe} | {size} | {figures} |" for recipe, size, figures in REMEDIES)}

Reading: the critic removed the earlier drift (its untrained value loss took most of the clipped step); a
discount per cycle made RL worse at lr 1e-3 -- each restart or resize brings events and so cycles, which
discount the rest of the run more, so churning looked good -- and a discount in time did not; the
input-driven baseline, which stops counting later arrivals as an action's doing, is the only remedy whose
sampled episodes trend down (seed 0: 2.025 h in the first iteration, 1.99-2.01 h in the last ten of 40). Without
preemption among the network's actions the gain stayed small (~1-2% on the trained workloads) against the
run-to-run noise of a greedy policy (+-1% between neighbouring checkpoints), and a larger step diverged; with
it (below) RL has more to change, as the per-seed table above shows. The shipped weights (the table, the
curves) are the chosen recipe's, retrained with the order-free encoding and preemption on the training mix
(these remedies were measured with the earlier fixed-slot network on workloads 1-4 alone, and not measured
again). The KL
leash to the warm-up (`--kl-to-warmup`) is built but was not needed at lr 1e-3 (off). {_episode_cost(seeds)}
{_transfer(raw, seeds)}
{_headroom_text(raw, seeds)}
**Preemption** (since 2026-11-30): the network may remove a running job's whole gang at its minimum, which the
simulator charges as a cluster would -- the work since the job's last checkpoint (every 30 min) is lost, a
restart costs 30 s, and the job waits in the queue again. The reward counts all of it in the JCT it sums; as
the preemption is decided at one step and paid over many later cycles, each one is also charged at once, its
lost work and restart in hours (`RlSettings.preemption_cost` = 1). The teacher never preempts
(`simulator.dl2_train.teacher_wants`). How that recipe was reached, seeds 0 and 1, this section's settings,
average JCT in hours, warm-up -> after RL (preemptions over the setting's runs), measured once and quoted:

| recipe | {' | '.join(SETTING_LABELS.values())} |
|---|---|---|---|
{chr(10).join(f"| {recipe} | {' | '.join(cells)} |" for recipe, cells in PREEMPTION)}

Reading: `optimus` preempts by arrival order alone (a job queued earlier takes a later one's gang); imitated,
that made the warm-up preempt hundreds of times on the held-out workloads, and RL, meeting the price only
spread over the cycles after, learned to preempt more (seed 1: 10,958 preemptions on Pollux 5-8, 5.30 h).
With a teacher that never preempts and the price charged where it is decided, the warm-up still preempts where
its imitation errs (no preemption is ever demonstrated, but the action is legal), and RL cuts those nearly to
none: part of RL's gain over its warm-up with preemption, in the per-seed table above, is that repair, and
the rest is a policy better than the earlier weights' on the held-out workloads (seed 1: 1.87 h against 2.17 h
without preemption).

The paper (DL2, Peng et al. 2019, on its own testbed and traces): average JCT {PAPER['vs_drf_pct']}% vs DRF,
{PAPER['vs_optimus_pct']}% vs Optimus. Assumptions that differ from the paper: the teacher is `optimus`
(the paper imitates the cluster's existing scheduler, DRF-like); jobs are Pollux's profiled models, not the
paper's parameter-server jobs (DL2 allocates workers *and* parameter servers; here only workers); the
network sees the {32} oldest active jobs (those past them start only by the backfill); DRF's users are the
jobs themselves (the traces carry no users for these runs); `optimus` here uses the declared throughput
curves, not an oracle of step times.

Non-clairvoyant: the tables above give every policy the jobs' true work, the features the networks were trained
on. Here the jobs of the held-out and Philly settings declare a user estimate instead (`{ESTIMATES}`, as the
headline: a run time off by `exp(0.8 z)`, no total work; `simulator.estimates`), estimate seeds
{list(ESTIMATE_SEEDS)}; dl2 after RL, mean over the training seeds too (range over all runs); the networks were
never trained under estimates:

| setting | drf | optimus | dl2 after RL | dl2 vs the better heuristic |
|---|---|---|---|---|
{chr(10).join(_estimated_rows(raw, seeds))}

This section took {wall_s:.0f} s.
"""


TARGET_PCT = -5.0  # issue 34: RL improves on its own warm-up by at least 5% on held-out and Philly, every seed


def _verdict(raw: dict[str, Any], seeds: list[int]) -> str:
    """Whether issue 34's target holds, from the figures above (never a fixed sentence)."""
    def change(key: str, s: int) -> float:
        warm = _mean(raw[key][f"dl2-warmup/{s}"]["avg_jct_s"])
        return (_mean(raw[key][f"dl2-rl/{s}"]["avg_jct_s"]) / warm - 1) * 100

    parts = []
    for key in ("test", "philly"):
        values = [change(key, s) for s in seeds]
        met = sum(v <= TARGET_PCT for v in values)
        parts.append(f"{SETTING_LABELS[key]}: {met} of {len(seeds)} seeds "
                     f"({', '.join(f'{v:+.1f}%' for v in values)})")
    return (f"Target (issue 34: RL at least {-TARGET_PCT:.0f}% below its warm-up on the held-out settings, every "
            f"seed): {'; '.join(parts)}.")


def main() -> None:  # for a quick look: python -m evaluation.dl2
    text, raw = dl2_section(REPO.parent / "shared", REPO / "docs/evaluation", {})
    print(text)
    print(json.dumps({k: v for k, v in raw.items() if k != "meta"}, indent=1)[:2000])


if __name__ == "__main__":
    main()
