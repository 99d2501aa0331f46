"""Beyond Sia (issue 33, item 5): ``aryl`` with loaning on a mixed cluster whose inference servers are a GPU
type of their own, against ``sia``, ``gavel`` and ``aryl-noloan``, none of which loans.

The setting, ``inference-pool``: the Sia study's cluster (``simulator.hetero.SIA_CLUSTER``) with its T4 pool
(``aws``, 6 x 4 GPUs; the T4 is an inference GPU) made an inference pool, training on the A100 and RTX
pools (2 x 8 + 3 x 8 = 40 GPUs). The T4s serve ServeGen ``m-small``'s request rate (``simulator.load``,
as ``evaluation.headline`` builds its demand: its maximum needs the whole pool with 20% headroom, the
series from simulated time 0, repeated), so ``aryl`` may lend the T4s not needed; a job placed on them runs
at the T4's speed by its T4 profile. The others train on the 40 GPUs alone.

What the policies are told (``simulator.hetero``'s module doc): ``aryl`` and ``aryl-noloan`` a user's run
time estimate, the truth on one reference GPU times ``exp(0.8 z)`` (``ESTIMATES``, as the headline draws
it, z per (seed, job)), a speed curve of the reference type, each type's declared speed and each job's measured
speed on every type from its arrival, as a one-GPU profile on each type tells it (``run_hetero(profiled=True)``,
``PROFILED``): the study tells ``sia`` exactly that of every job (its base speeds per type), so both start from the
same knowledge of each job's types (``--measured-speeds``: only the types a job has run on, as the live service
knows them without profiling; ``--no-type-speeds``: neither, as before issue 33 item 4); ``sia`` and ``gavel``
what their jobs measure, no length: nothing they see depends on the seed, so they run once per workload and their
figures stand for every seed.

Run with ``python -m simulator.hetero_inference`` (``SIA_REF_GIT`` as for ``simulator.hetero_gate``: the
workloads and profiles are read from the authors' artifact at run time and deleted after; nothing of it is
in this repository). Must never: tune a setting toward a target, or keep any of the artifact's files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from simulator.goodput_jobs import load_workload
from simulator.hetero import TypePool, run_hetero, summary
from simulator.hetero_gate import ARTIFACT_COMMIT, DEFAULT_WORKLOADS, HOW_TO, MODELS, extract
from simulator.load import demand_from_rate, load_servegen_rate
from simulator.model import DemandPoint

TRAINING = (TypePool("dgx-ext", 2, 8), TypePool("rtx", 3, 8))
INFERENCE = TypePool("aws", 6, 4)
POLICIES = ("sia", "gavel", "aryl-noloan", "aryl")
SEEDLESS = ("sia", "gavel")          # told nothing a seed draws (module doc)
SEEDS = (0, 1, 2)
ESTIMATES = "lognormal:0.8"
PROFILED = True                      # aryl is told each job's one-GPU speed per type, as sia is (module doc)
HEADROOM = 0.2                       # as evaluation.headline
TAIL_S = 10 * 86400.0                # demand laid this long past the last arrival
DEFAULT_RATE = Path(__file__).resolve().parent.parent.parent / \
    "shared/traces/servegen-llm-load/servegen_total_rate_10min.csv"


def inference_demand(rate_csv: str | Path, last_arrival_s: float, pool: TypePool = INFERENCE) -> list[DemandPoint]:
    """The servers of ``pool`` needed over time: ServeGen ``m-small``'s rate, its maximum needing the whole
    pool with ``HEADROOM`` (module doc)."""
    return demand_from_rate(load_servegen_rate(rate_csv, model="m-small"), inference_servers=pool.nodes,
                            headroom=HEADROOM, peak_quantile=1.0, duration_s=last_arrival_s + TAIL_S)


def compare(workload_csv: Path, traces_dir: Path, rate_csv: str | Path, *, policies: Sequence[str] = POLICIES,
            seeds: Sequence[int] = SEEDS, log: Callable[[str], None] = print, type_speeds: bool = True,
            profiled: bool = PROFILED) -> dict[str, dict[str, object]]:
    """Every policy on one workload in the ``inference-pool`` setting, per seed: ``{policy: {"seeds": {seed:
    summary}, "avg_jct_s": mean over seeds, "avg_jct_s_range": [min, max], "restarts_per_job": mean}}``."""
    jobs = load_workload(workload_csv)
    demand = inference_demand(rate_csv, max(j.submit_time for j in jobs))
    out: dict[str, dict[str, object]] = {}
    for policy in policies:
        runs: dict[int, dict[str, object]] = {}
        for seed in (seeds[:1] if policy in SEEDLESS else seeds):
            result = run_hetero(jobs, traces_dir, policy, pools=TRAINING, inference=INFERENCE, demand=demand,
                                estimates=ESTIMATES, seed=seed, type_speeds=type_speeds, profiled=profiled)
            runs[seed] = {k: v for k, v in summary(result).items() if k != "jcts_s"}
            log(f"{workload_csv.stem} {policy} seed {seed}: avg JCT {result.average_jct / 3600:.3f} h, "
                f"{runs[seed]['avg_restarts']} restarts/job, {len(result.jcts)}/{len(jobs)} done, "
                f"{result.wall_s:.0f} s")
        jcts = [float(str(r["avg_jct_s"])) for r in runs.values()]
        restarts = [float(str(r["avg_restarts"])) for r in runs.values()]
        out[policy] = {"seeds": runs, "avg_jct_s": round(statistics.fmean(jcts), 1),
                       "avg_jct_s_range": [round(min(jcts), 1), round(max(jcts), 1)],
                       "restarts_per_job": round(statistics.fmean(restarts), 3),
                       "by_model": by_model_over_seeds(list(runs.values()))}
    return out


def by_model_over_seeds(runs: Sequence[Mapping[str, object]]) -> dict[str, dict[str, float]]:
    """Per model, the mean over ``runs`` (one summary per seed, ``simulator.hetero.summary``) of its jobs' average
    JCT and average wait from submission to first start: ``{model: {"jobs", "avg_jct_s", "avg_first_wait_s"}}``."""
    per: dict[str, list[dict[str, float]]] = {}
    for run in runs:
        by_model = run["by_model"]
        assert isinstance(by_model, dict)
        for model, figures in by_model.items():
            per.setdefault(model, []).append(figures)
    return {model: {"jobs": rows[0]["jobs"],
                    "avg_jct_s": round(statistics.fmean(r["avg_jct_s"] for r in rows), 1),
                    "avg_first_wait_s": round(statistics.fmean(r["avg_first_wait_s"] for r in rows), 1)}
            for model, rows in sorted(per.items())}


def run_beyond(git_dir: str, workloads: Sequence[str], rate_csv: str | Path, *,
               policies: Sequence[str] = POLICIES, seeds: Sequence[int] = SEEDS,
               log: Callable[[str], None] = print,
               after_each: Callable[[dict[str, dict[str, dict[str, object]]]], None] | None = None,
               type_speeds: bool = True, profiled: bool = PROFILED) -> dict[str, dict[str, dict[str, object]]]:
    """``compare`` on each of ``workloads`` (``<set>/<workload>``), its inputs extracted from ``git_dir`` (the
    artifact, ``simulator.hetero_gate.extract``) into a temporary folder deleted after; ``after_each`` is
    called with the figures so far after every workload."""
    scratch = Path(tempfile.mkdtemp(prefix="aryl-sia-inputs."))
    results: dict[str, dict[str, dict[str, object]]] = {}
    try:
        extract(git_dir, [f"traces/{m}" for m in MODELS] + [f"workloads/{w}.csv" for w in workloads], scratch)
        for workload in workloads:
            results[workload] = compare(scratch / "workloads" / f"{workload}.csv", scratch / "traces", rate_csv,
                                        policies=policies, seeds=seeds, log=log, type_speeds=type_speeds,
                                        profiled=profiled)
            if after_each is not None:
                after_each(results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


HOW_TO_RUN = HOW_TO.replace("make sia-gate", "python -m simulator.hetero_inference")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.hetero_inference", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS))
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    parser.add_argument("--rate", default=str(DEFAULT_RATE), help="ServeGen's servegen_total_rate_10min.csv")
    parser.add_argument("--json", help="write the figures here as JSON (after each workload)")
    parser.add_argument("--measured-speeds", action="store_true",
                        help="show aryl a job's speed only on the types it has run on, not its one-GPU profile on "
                             "every type from its arrival")
    parser.add_argument("--no-type-speeds", action="store_true",
                        help="declare no GPU type's speed and show no job's measured speeds per type")
    args = parser.parse_args(argv)
    git_dir = os.environ.get("SIA_REF_GIT")
    if not git_dir:
        print(HOW_TO_RUN.format(commit=ARTIFACT_COMMIT), file=sys.stderr)
        return 2

    def save(results: dict[str, dict[str, dict[str, object]]]) -> None:
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")

    results = run_beyond(git_dir, [w.strip() for w in args.workloads.split(",") if w.strip()], args.rate,
                         policies=[p.strip() for p in args.policies.split(",") if p.strip()],
                         seeds=[int(s) for s in args.seeds.split(",") if s.strip()], after_each=save,
                         type_speeds=not args.no_type_speeds, profiled=not args.measured_speeds)
    for workload, figures in results.items():
        for policy, f in figures.items():
            spread = f["avg_jct_s_range"]
            assert isinstance(spread, list)
            low, high = float(spread[0]), float(spread[1])
            print(f"{workload:20} {policy:12} avg JCT {float(str(f['avg_jct_s'])) / 3600:6.3f} h "
                  f"(seeds {low / 3600:.3f}-{high / 3600:.3f}), {f['restarts_per_job']} restarts/job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
