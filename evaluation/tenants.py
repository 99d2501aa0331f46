"""The "tenants" section of ``docs/evaluation.md`` (``python -m evaluation --only tenants``):
two teams share one training cluster through queues with quotas (``core.quota``), on a Philly sample,
with and without borrowing, beside one shared queue.

The setup, fixed before the first run and not changed after (nothing here is tuned toward a figure):

- **Sample**: the first ``SAMPLE_DAYS`` days of the busiest 15-day Philly window, each job kept when its
  keyed draw ``u(seed, "sample", name) < SAMPLE_SHARE``; mapped as the headline does (``JobMapping``:
  half the jobs elastic up to 4x, Amdahl speed-ups).
- **Teams**: each job belongs to team ``vision`` when ``u(seed, "team", name) < VISION_SHARE``, else to
  ``nlp``: vision submits three times as much as nlp (a heavy and a light tenant).
- **Cluster**: training servers of 8 GPUs, as many as the sample's offered load (its GPU-time at
  requested sizes over its days of arrivals) at ``RHO`` (offered / GPUs), and at least twice the
  largest gang (so each half can run any job). No inference cluster.
- **Configurations** (policy ``aryl``, the same cluster):
  ``shared``: no queue configured (one queue, the policy's own order: today's behaviour);
  ``quotas``: each team a queue with half the GPUs as its quota, in cohorts of their own (no borrowing);
  ``quotas + borrowing``: the same quotas in one cohort (a team borrows the other's idle quota, and gives
  it back -- shrinking elastic jobs first, then preempting the cheapest -- when the other needs it).
- **Estimates** ``ESTIMATES``: non-clairvoyant, as the headline -- the policy sees each job's user estimate,
  the true run time x exp(0.8 z) (``simulator.estimates``), never the true run time.
- **Seeds** ``SEEDS``: each changes the sample, the teams, the elastic draws, the estimate errors and the
  snapshots' seed; figures are means over seeds with the min..max spread.

What it shows: *isolation* (the light team's queueing under quotas vs one shared queue) and
*borrowing* (utilisation and the heavy team's JCT with borrowing vs hard quotas).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from evaluation.report import log, table
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.snapshot import QueueView
from simulator.engine import SimulationResult, simulate
from simulator.model import ClusterSpec, TraceJob
from simulator.results import summarize
from simulator.traces import JobMapping, _keyed_uniform, job_gpu_seconds, load_philly

SAMPLE_DAYS = 3
SAMPLE_SHARE = 1 / 8
VISION_SHARE = 0.75
RHO = 1.0
SEEDS = (0, 1, 2)
GPUS_PER_SERVER = 8
ESTIMATES = "lognormal:0.8"  # what the policy sees of a job's length (module doc)
TEAMS = ("vision", "nlp")
CONFIGS = ("shared", "quotas", "quotas + borrowing")


def philly_teams(shared: Path, seed: int) -> list[TraceJob]:
    """The sample of the module doc, each job in its team's queue."""
    mapping = JobMapping(seed=seed, elastic_share=0.5, max_scale=4, throughput_model="amdahl",
                         gpus_per_server=GPUS_PER_SERVER)
    jobs = load_philly(shared / "traces/philly-pollux/philly_jobs_15d_2017-10-10.csv.gz", mapping=mapping)
    return [replace(j, queue="vision" if _keyed_uniform(seed, "team", j.name) < VISION_SHARE else "nlp")
            for j in jobs
            if j.submit_time < SAMPLE_DAYS * 86400.0 and _keyed_uniform(seed, "sample", j.name) < SAMPLE_SHARE]


def cluster_servers(jobs: list[TraceJob]) -> int:
    offered = sum(job_gpu_seconds(j) for j in jobs) / (SAMPLE_DAYS * 86400.0)
    largest = max(j.min_workers * j.gpus_per_worker for j in jobs)
    return max(round(offered / RHO / GPUS_PER_SERVER), 2 * math.ceil(largest / GPUS_PER_SERVER))


def queues_for(config: str, gpus: int) -> tuple[QueueView, ...]:
    """The queues of a configuration (``shared``: none; the jobs' queue names are then not enforced)."""
    if config == "shared":
        return ()
    half = gpus // 2
    return tuple(QueueView(team, half, None, "lab" if config == "quotas + borrowing" else team, False)
                 for team in TEAMS)


def team_figures(result: SimulationResult, jobs: list[TraceJob]) -> dict[str, dict[str, float | None]]:
    """Per team: jobs, completed, mean and p95 queueing (s), mean JCT (s)."""
    team = {j.job_id: j.queue for j in jobs}
    out: dict[str, dict[str, float | None]] = {}
    for name in TEAMS:
        mine = [o for o in result.jobs if team[o.job_id] == name]
        queue = sorted(o.queue_s for o in mine if o.queue_s is not None)
        jct = [o.jct_s for o in mine if o.jct_s is not None]
        out[name] = {
            "jobs": float(len(mine)), "completed": float(len(jct)),
            "avg_queue_s": sum(queue) / len(queue) if queue else None,
            "p95_queue_s": queue[min(len(queue) - 1, int(0.95 * len(queue)))] if queue else None,
            "avg_jct_s": sum(jct) / len(jct) if jct else None,
        }
    return out


def tenants_section(shared: Path, assets: Path, raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:

    runs: dict[str, Any] = {}
    notes = []
    # config -> metric -> values per seed
    values: dict[str, dict[str, list[float]]] = {c: {} for c in CONFIGS}
    for seed in SEEDS:
        jobs = philly_teams(shared, seed)
        servers = cluster_servers(jobs)
        gpus = servers * GPUS_PER_SERVER
        counts = {t: sum(1 for j in jobs if j.queue == t) for t in TEAMS}
        notes.append(f"seed {seed}: {len(jobs)} jobs (vision {counts['vision']}, nlp {counts['nlp']}), "
                     f"{gpus} GPUs (quota {gpus // 2} each)")
        for config in CONFIGS:
            spec = ClusterSpec(servers, 0, GPUS_PER_SERVER, queues=queues_for(config, gpus))
            started = time.perf_counter()
            result = simulate(jobs, [], spec, "aryl", PolicyParams(), seed=seed, estimates=ESTIMATES)
            summary = summarize(result)
            teams = team_figures(result, jobs)
            elapsed = time.perf_counter() - started
            log(f"tenants seed {seed} {config}: {result.stop_reason}, {result.cycles} cycles, {elapsed:.1f}s")
            runs[f"seed {seed}|{config}"] = {"summary": summary, "teams": teams}  # no wall time: reproducible
            row = values[config]
            for team in TEAMS:
                for key in ("avg_queue_s", "p95_queue_s", "avg_jct_s"):
                    row.setdefault(f"{team}.{key}", []).append(teams[team][key] or 0.0)
                row.setdefault(f"{team}.completed", []).append(
                    (teams[team]["completed"] or 0.0) / max(teams[team]["jobs"] or 1.0, 1.0))
            row.setdefault("util", []).append(summary["gpu_utilization"]["training"])
            row.setdefault("preemptions", []).append(float(summary["preemptions"]))

    def spread(values_: list[float], scale: float, digits: int) -> str:
        mean = sum(values_) / len(values_)
        return f"{mean * scale:.{digits}f} ({min(values_) * scale:.{digits}f}-{max(values_) * scale:.{digits}f})"

    hours = 1 / 3600.0
    header = ["configuration", *(f"{t} {what}" for t in TEAMS for what in ("queue (h)", "p95 queue (h)", "JCT (h)")),
              "training util", "preemptions"]
    rows = [[config,
             *(spread(values[config][f"{t}.{k}"], hours, 2) for t in TEAMS
               for k in ("avg_queue_s", "p95_queue_s", "avg_jct_s")),
             spread(values[config]["util"], 1.0, 3), spread(values[config]["preemptions"], 1.0, 0)]
            for config in CONFIGS]
    done = [[config, *(spread(values[config][f"{t}.completed"], 100.0, 1) + "%" for t in TEAMS)] for config in CONFIGS]

    def mean(config: str, key: str) -> float:
        return sum(values[config][key]) / len(values[config][key])

    nlp_shared, nlp_quota = mean("shared", "nlp.avg_queue_s"), mean("quotas + borrowing", "nlp.avg_queue_s")
    util_hard, util_borrow = mean("quotas", "util"), mean("quotas + borrowing", "util")
    text = f"""## Two teams, one cluster: queues with quotas and borrowing

Setup (`evaluation/tenants.py`, fixed before the first run and not changed after): a Philly sample (the first
{SAMPLE_DAYS} days of the 15-day window, one job in {round(1 / SAMPLE_SHARE)} by a keyed draw, mapped as in the
headline) split into two teams by a keyed draw: `vision` gets {VISION_SHARE:.0%} of the jobs, `nlp` the rest. The
training cluster has as many 8-GPU servers as the sample's offered load (at least twice the largest gang);
no inference cluster. Non-clairvoyant: the policy sees user estimates (`{ESTIMATES}`), not run times.
Policy `aryl` in three configurations: **shared** (no queue configured: one queue,
today's behaviour), **quotas** (each team a queue with half the GPUs as its quota, separate cohorts: no
borrowing), **quotas + borrowing** (the same quotas in one cohort). Seeds {", ".join(map(str, SEEDS))}: mean
(min-max) over seeds.

{chr(10).join("- " + n for n in notes)}

{table(rows, header)}

Jobs completed (share of each team's jobs; runs stop when every job completed or the run stalls):

{table(done, ["configuration", *TEAMS])}

Reading:
- *Isolation*: the light team's queueing -- `nlp` waits {nlp_shared * hours:.2f} h on average in one shared
  queue and {nlp_quota * hours:.2f} h with its own quota and borrowing: its jobs start at once, whatever
  `vision` queues. At this load (offered load = GPUs) the shared queue is short too, so the gain is small
  in absolute terms; the heavy team pays for it (its queueing rises).
- *Borrowing*: hard quotas leave the light team's half idle while the heavy team queues (training
  utilisation {util_hard:.3f}, `vision` queueing in hours); lending idle quota within the cohort brings
  utilisation back to {util_borrow:.3f} (the shared queue's level) and `vision`'s JCT close to the shared
  queue's, at the price of a few preemptions that give borrowed GPUs back (`PREEMPTED_FOR_QUOTA`; the
  preemption column counts every preemption).
- Not shown here: loaned inference servers as borrowable capacity (no inference cluster in this setup),
  priority classes and fair share (one class, fair share off).
"""
    return text, runs
