"""The fidelity gate of the heterogeneous job model (issue 33, item 3): ``sia`` and ``gavel`` on the Sia study's
workloads and cluster, ours (``simulator.hetero``) against the authors' simulator, average JCT within 5%.

Run it with ``make sia-gate`` (or ``python -m simulator.hetero_gate``). It needs ``SIA_REF_GIT``: a git
directory holding the public repository ``siasosp23/artifacts`` at commit ``ARTIFACT_COMMIT`` (a clone or a
mirror, bare or not). The artifact has **no licence**, so nothing of it enters this repository: the
profiles (``sia-simulator/traces/<model>/``) and the workloads are extracted from that git directory into a
temporary folder for the run and deleted after it. The authors' figures come from their own simulator,
run by the reference harness (``run-reference.sh``, ``SIA_REF_HARNESS``; default
``../shared/reference/sia-simulator/run-reference.sh``) into ``--authors-dir`` (default
``$ARYL_SIA_AUTHORS_DIR``, else ``$TMPDIR/aryl-sia-gate``; a run already there,
``<policy>-<set>-<workload>/summary.json``, is reused:
``sia`` takes ~15 minutes a workload on a busy 2-core machine, ``gavel`` about one).

Printed: per workload and policy, our average JCT and the authors', the difference, restarts per job (ours /
theirs), and
decision times (ours: a whole ``schedule`` call; the authors': their CBC solve, as it logs it, ``sia`` only).
Exit status 1 when a difference exceeds ``--tolerance`` (0.05), 2 when the inputs are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from simulator.goodput_jobs import load_workload
from simulator.hetero import run_hetero

ARTIFACT_COMMIT = "aaf7a0de7b6cb5eab06ea020467ede5d2fd18e70"
MODELS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
DEFAULT_WORKLOADS = ("saturn/workload-2", "philly/workload-3")   # the smallest of each 160-job set
DEFAULT_AUTHORS_DIR = Path(os.environ.get("ARYL_SIA_AUTHORS_DIR", Path(tempfile.gettempdir()) / "aryl-sia-gate"))
DEFAULT_HARNESS = Path(__file__).resolve().parent.parent.parent / "shared/reference/sia-simulator/run-reference.sh"

HOW_TO = """The Sia gate needs the authors' public artifact, which this repository may not hold (it has no licence):
  git clone --bare https://github.com/siasosp23/artifacts.git /tmp/sia-artifacts.git
  SIA_REF_GIT=/tmp/sia-artifacts.git make sia-gate
(any clone or mirror holding commit {commit} will do)."""


def extract(git_dir: str, paths: list[str], into: Path) -> None:
    """The files under ``paths`` (in ``sia-simulator/``) at ``ARTIFACT_COMMIT``, written under ``into``."""
    listing = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", ARTIFACT_COMMIT, "--",
                              *(f"sia-simulator/{p}" for p in paths)], check=True, capture_output=True,
                             text=True).stdout
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        blob = meta.split()[2]
        target = into / path.removeprefix("sia-simulator/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(subprocess.run(["git", "--git-dir", git_dir, "cat-file", "blob", blob], check=True,
                                          capture_output=True).stdout)


def authors_folder(policy: str, workload: str, out: Path) -> Path | None:
    """The folder under ``out`` of a finished run of the authors' simulator, if there is one."""
    name = f"{policy}-{workload.replace('/', '-')}"
    for folder in (out / name, out / f"out-{name}"):   # the second as the harness's examples name them
        if (folder / "summary.json").exists():
            return folder
    return None


def authors_run(policy: str, workload: str, out: Path, harness: Path, git_dir: str) -> Path:
    """The authors' simulator's output folder for one run (run by the harness unless already there)."""
    folder = authors_folder(policy, workload, out) or out / f"{policy}-{workload.replace('/', '-')}"
    if not (folder / "summary.json").exists():
        if not harness.exists():
            raise FileNotFoundError(f"no reference harness at {harness} (set SIA_REF_HARNESS)")
        env = dict(os.environ, SIA_REF_GIT=git_dir, SIA_REF_OUT=str(folder))
        print(f"running the authors' simulator: {policy} on {workload} (log: {folder})", flush=True)
        subprocess.run(["bash", str(harness), policy, f"workloads/{workload}.csv"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    return folder


def authors_figures(folder: Path) -> dict[str, float]:
    summary = json.loads((folder / "summary.json").read_text())
    avg = float(next(iter(summary["avgs"].values())))
    figures = {"avg_jct_s": avg}
    stats = folder / "stats.txt"   # the authors' print_run_stats.py, as the harness saves it
    if stats.exists():
        found = re.search(r"Average num restarts per job = ([\d.]+)", stats.read_text(errors="replace"))
        if found:
            figures["restarts_per_job"] = float(found.group(1))
    log = folder / "simulator-stdout.log"
    if log.exists():
        pattern = r"Total time \(CPU seconds\):\s+[\d.]+\s+\(Wallclock seconds\):\s+([\d.]+)"  # CBC's, per solve
        times = [float(t) for t in re.findall(pattern, log.read_text(errors="replace"))]
        if times:
            times.sort()
            figures["solve_mean_ms"] = 1000 * sum(times) / len(times)
            figures["solve_p95_ms"] = 1000 * times[int(0.95 * (len(times) - 1))]
    return figures


ROW = "{workload:20} {policy:6} {ours:>8} {authors:>9} {diff:>7} {restarts:>12} {decide:>18} {solve:>16}"
HEADER = ROW.format(workload="workload", policy="policy", ours="ours h", authors="authors h", diff="diff",
                    restarts="restarts", decide="decide ms mean/p95", solve="authors solve ms")


def row_text(workload: str, policy: str, figures: dict[str, float]) -> str:
    """One printed row of the gate (``figures`` as ``gate`` returns them)."""
    theirs_restarts = figures["authors_restarts_per_job"]
    solve = (f"{figures['solve_mean_ms']:.0f}/{figures['solve_p95_ms']:.0f}" if "solve_mean_ms" in figures else "-")
    return ROW.format(workload=workload, policy=policy, ours=f"{figures['ours'] / 3600:.3f}",
                      authors=f"{figures['authors'] / 3600:.3f}", diff=f"{100 * figures['diff']:+6.1f}%",
                      restarts=f"{figures['restarts_per_job']:5.2f}/"
                               + (f"{theirs_restarts:.2f}" if theirs_restarts >= 0 else "-"),
                      decide=f"{figures['decision_mean_ms']:.0f}/{figures['decision_p95_ms']:.0f}", solve=solve)


def gate(git_dir: str, workloads: list[str], policies: list[str], authors_dir: Path, harness: Path,
         report: Callable[[str], None] = print, run_missing: bool = True) -> dict[str, dict[str, dict[str, float]]]:
    """Ours and the authors' figures per workload and policy: ``ours`` and ``authors`` (average JCT, s), ``diff``
    (ours / authors - 1), restarts per job (ours, ``authors_restarts_per_job``: -1 where their summary lacks
    it), our decision times and the authors' CBC solve times where their log has them. The authors' runs
    missing from ``authors_dir`` are run by the harness (``sia``: ~15 minutes a workload), or, with
    ``run_missing`` False, left out of the figures (said through ``report``). ``report`` is given each row's
    text as it is known."""
    authors_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="aryl-sia-inputs."))
    results: dict[str, dict[str, dict[str, float]]] = {}
    try:
        extract(git_dir, [f"traces/{m}" for m in MODELS] + [f"workloads/{w}.csv" for w in workloads], scratch)
        report(HEADER)
        for workload in workloads:
            jobs = load_workload(scratch / "workloads" / f"{workload}.csv")
            for policy in policies:
                if not run_missing and authors_folder(policy, workload, authors_dir) is None:
                    report(f"{workload} {policy}: the authors' run is not in {authors_dir}: left out")
                    continue
                ours = run_hetero(jobs, scratch / "traces", policy)
                theirs = authors_figures(authors_run(policy, workload, authors_dir, harness, git_dir))
                times = sorted(ours.decision_s)
                figures = {
                    "ours": round(ours.average_jct, 1), "authors": round(theirs["avg_jct_s"], 1),
                    "diff": ours.average_jct / theirs["avg_jct_s"] - 1,
                    "restarts_per_job": round(sum(ours.restarts.values()) / max(1, len(ours.restarts)), 3),
                    "authors_restarts_per_job": theirs.get("restarts_per_job", -1.0),
                    "decision_mean_ms": round(1000 * sum(times) / max(1, len(times)), 1),
                    "decision_p95_ms": round(1000 * times[int(0.95 * (len(times) - 1))], 1) if times else 0.0,
                    **{k: round(v, 1) for k, v in theirs.items() if k not in ("avg_jct_s", "restarts_per_job")}}
                results.setdefault(workload, {})[policy] = figures
                report(row_text(workload, policy, figures))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.hetero_gate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                        help="comma-separated <set>/<workload> of the artifact (default: %(default)s)")
    parser.add_argument("--policies", default="sia,gavel")
    parser.add_argument("--authors-dir", default=str(DEFAULT_AUTHORS_DIR))
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--json", help="write the figures here as JSON")
    args = parser.parse_args(argv)
    git_dir = os.environ.get("SIA_REF_GIT")
    if not git_dir:
        print(HOW_TO.format(commit=ARTIFACT_COMMIT), file=sys.stderr)
        return 2
    results = gate(git_dir, [w.strip() for w in args.workloads.split(",") if w.strip()],
                   [p.strip() for p in args.policies.split(",") if p.strip()], Path(args.authors_dir),
                   Path(os.environ.get("SIA_REF_HARNESS", str(DEFAULT_HARNESS))),
                   report=lambda line: print(line, flush=True))
    failed = any(abs(f["diff"]) > args.tolerance for per in results.values() for f in per.values())
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    print("gate: " + ("FAILED (a difference beyond" if failed else "passed (every difference within")
          + f" {100 * args.tolerance:.0f}%)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
