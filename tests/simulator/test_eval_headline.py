"""The headline's orchestration (evaluation/headline.py, its sections evaluation/headline_sections.py) end
to end on a tiny synthetic trace: the busy regime's sizing rule, the process pool, the seed aggregation and
the summaries' structure."""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from evaluation.document import splice_lead
from evaluation.headline import (
    ESTIMATED,
    EXACT,
    Inputs,
    Plan,
    aggregate,
    busy_regime,
    load_jobs,
    offered_load,
)
from evaluation.headline_sections import headline, lead_text


def tiny_inputs(tmp_path: Path) -> Inputs:
    """60 Philly-shaped jobs over 5 hours (1-8 GPUs, 20-115 minutes) and a day of ServeGen-shaped rates."""
    start = datetime(2017, 10, 10, 0, 0, 5, tzinfo=UTC)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(60):
        stamp = (start + timedelta(seconds=300 * i)).strftime("%Y-%m-%d %H:%M:%S")
        duration, gpus = 1200.0 + 97 * ((i * 37) % 60), (1, 2, 4, 8, 1, 2)[i % 6]
        lines.append(f"{stamp},{duration},{gpus},{duration * gpus},vc{i % 3}")
    trace = tmp_path / "philly.csv"
    trace.write_text("\n".join(lines) + "\n")
    rates = ["category,model,t_sec,total_rate_rps,active_clients"]
    rates += [f"language,m-small,{600 * k},{100 + 80 * math.sin(2 * math.pi * k / 144) + (k % 7)},3"
              for k in range(144)]
    rate = tmp_path / "rate.csv"
    rate.write_text("\n".join(rates) + "\n")
    return Inputs(trace, rate, tmp_path)


PLAN = Plan(seeds=(0, 1, 2), policies=("sjf", "aryl"), ablations=("aryl-noloan",), ablation_seeds=(1,),
            exact_policies=("sjf", "aryl"), light=True, light_seeds=(0,), peers_on_subset=("tiresias",),
            subset_jobs=30, subset_seeds=(0, 1), sensitivity_seeds=(0, 1),
            scaling=(("amdahl", 0.05), ("amdahl", 0.2)), plots=False)


def test_busy_regime_is_sized_from_the_offered_load(tmp_path: Path) -> None:
    inputs = tiny_inputs(tmp_path)
    jobs = load_jobs(inputs, 0)
    offered = offered_load(jobs)
    # by hand: each job's GPUs x its part of [first, last submission], over the window's length
    window = jobs[-1].submit_time - jobs[0].submit_time
    by_hand = sum(j.min_workers * j.gpus_per_worker * min(j.work, window - j.submit_time) for j in jobs) / window
    assert offered == pytest.approx(by_hand)
    regime = busy_regime(jobs)
    assert regime.training_servers == math.floor(offered / (0.9 * 8))
    assert offered / (regime.training_servers * 8) >= 0.9
    assert offered / ((regime.training_servers + 1) * 8) < 0.9  # the most servers that still holds
    assert regime.inference_servers == max(1, round(regime.training_servers / 2))
    assert regime.peak_quantile == 1.0  # provisioned for the peak (issue 31)


def test_headline_end_to_end_seeds_and_structure(tmp_path: Path) -> None:
    inputs = tiny_inputs(tmp_path)
    text, raw, sens_text, sens = headline(inputs, tmp_path, PLAN, workers=2)

    assert raw["regime"]["offered_load"] >= 0.9
    assert raw["estimates"] == ESTIMATED and raw["seeds"] == [0, 1, 2]
    for policy in ("sjf", "aryl"):
        entry = raw[policy]
        for key in ("avg_queue_s", "avg_jct_s"):
            assert entry[key] == entry["spread"][key]["mean"]
            assert len(entry["spread"][key]["per_seed"]) == 3
        assert entry["gpu_utilization"]["overall"] == entry["spread"]["gpu_utilization.overall"]["mean"]
        assert entry["spread"]["jobs_completed"]["per_seed"] == [60, 60, 60]
        assert entry["estimates"] == ESTIMATED and entry["rejected_actions"] == 0  # every plan applied whole
        assert raw["exact"][policy]["estimates"] == EXACT
        spread = entry["spread"]["avg_jct_s"]
        assert spread["min"] <= spread["mean"] <= spread["max"]
    # a seed changes what aryl sees (elastic draws, estimate errors): its figures differ across seeds
    assert len(set(raw["aryl"]["spread"]["avg_jct_s"]["per_seed"])) > 1
    # exact estimates with Amdahl: nothing a seed changes reaches sjf
    assert len(set(raw["exact"]["sjf"]["spread"]["avg_jct_s"]["per_seed"])) == 1
    ratio = raw["vs_sjf"]["aryl"]["jct_reduction"]
    per_seed = [s / a for s, a in zip(raw["sjf"]["spread"]["avg_jct_s"]["per_seed"],
                                      raw["aryl"]["spread"]["avg_jct_s"]["per_seed"], strict=True)]
    assert ratio["per_seed"] == pytest.approx(per_seed, abs=1e-3)
    assert raw["light"]["regime"]["training_servers"] == 80
    assert raw["light"][EXACT]["aryl"]["seeds"] == [0]
    # ablations on their own seeds, compared with aryl and sjf on the same seeds
    assert raw["ablations"]["aryl"]["spread"]["avg_jct_s"]["per_seed"] == [
        raw["aryl"]["spread"]["avg_jct_s"]["per_seed"][1]]
    assert raw["ablations"]["aryl-noloan"]["seeds"] == [1] and "aryl-noloan" not in raw
    # the peers' subset: its first 30 jobs on clusters sized by the same rule from its own load
    sub = raw["peers_subset"]
    assert sub["regime"]["jobs"] == 30 and sub["regime"]["offered_load"] >= 0.9
    assert set(sub) >= {"sjf", "tiresias", "aryl"} and sub["tiresias"]["spread"]["jobs_total"]["mean"] == 30
    assert set(sens["scaling"]) == {"amdahl alpha=0.05", "amdahl alpha=0.2"}
    # the alpha = 0.05 row is the headline's own runs (on the sensitivity's seeds), sjf the headline's throughout
    row = sens["scaling"]["amdahl alpha=0.05"]
    assert row["aryl"]["spread"]["avg_jct_s"]["per_seed"] == raw["aryl"]["spread"]["avg_jct_s"]["per_seed"][:2]
    assert sens["scaling"]["amdahl alpha=0.2"]["sjf"] == row["sjf"]
    assert row["sjf"]["spread"]["avg_jct_s"]["per_seed"] == raw["sjf"]["spread"]["avg_jct_s"]["per_seed"][:2]
    assert "| sjf |" in text and "busy" in lead_text(raw) and "alpha=0.2" in sens_text

    # identical seeds give identical figures: seed 0 twice, in this process instead of the pool
    again = Plan(seeds=(0, 0), policies=("sjf", "aryl"), ablations=(), exact_policies=(), light=False,
                 peers_on_subset=(), sensitivity_seeds=(0,), scaling=(("amdahl", 0.05),), plots=False)
    _, raw2, _, _ = headline(inputs, tmp_path, again, workers=1)
    for policy in ("sjf", "aryl"):
        for metric, stats in raw2[policy]["spread"].items():
            assert stats["min"] == stats["max"], metric
            assert stats["mean"] == raw[policy]["spread"][metric]["per_seed"][0], metric


def test_aggregate_means_and_ranges() -> None:
    runs = [{"avg_queue_s": 10.0, "gpu_utilization": {"overall": 0.5}, "estimates": "exact", "rejected_actions": 2},
            {"avg_queue_s": 30.0, "gpu_utilization": {"overall": 0.7}, "estimates": "exact", "rejected_actions": 1}]
    agg = aggregate(runs, [0, 1])
    assert agg["rejected_actions"] == 3
    assert agg["avg_queue_s"] == 20.0 and agg["gpu_utilization"]["overall"] == 0.6
    assert agg["spread"]["avg_queue_s"] == {"mean": 20.0, "min": 10.0, "max": 30.0, "per_seed": [10.0, 30.0]}
    assert "avg_jct_s" not in agg  # a metric no run has is left out


def test_lead_goes_under_the_title_and_is_replaced_in_place() -> None:
    doc = "# Evaluation\n\nRegenerate with ...\n\n<!-- section:headline -->\nx\n<!-- /section:headline -->\n"
    once = splice_lead(doc, "first\n")
    assert once.startswith("# Evaluation\n\n<!-- section:lead -->\nfirst\n<!-- /section:lead -->\n\nRegenerate")
    twice = splice_lead(once, "second\n")
    assert "first" not in twice and twice.count("section:lead -->") == 2


def _fake_headline(shared: Path, assets: Path, raw: dict) -> tuple[str, dict]:
    raw["_sensitivity"] = ("## sensitivity\n", {"pid": os.getpid()})
    return "## headline\n", {"pid": os.getpid()}


def _fake_sensitivity(shared: Path, assets: Path, raw: dict) -> tuple[str, dict]:
    return raw.pop("_sensitivity")


def _fake_other(shared: Path, assets: Path, raw: dict) -> tuple[str, dict]:
    return "## other\n", {"pid": os.getpid()}


def test_other_sections_run_beside_the_headline_and_keep_their_order(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import evaluation.document as document

    monkeypatch.setattr(document, "SECTIONS", {"headline": _fake_headline, "sensitivity": _fake_sensitivity,
                                                 "other": _fake_other})
    monkeypatch.setattr(document, "lead_text", lambda raw: "the lead\n")
    assert document.main(["--out", str(tmp_path), "--shared", str(tmp_path)]) == 0
    doc = (tmp_path / "evaluation.md").read_text()
    assert doc.startswith("# Evaluation\n\n<!-- section:lead -->\nthe lead\n")
    assert doc.index("## headline") < doc.index("## sensitivity") < doc.index("## other")
    raw = json.loads((tmp_path / "evaluation" / "summaries.json").read_text())
    assert raw["headline"]["pid"] == raw["sensitivity"]["pid"] == os.getpid()
    assert raw["other"]["pid"] != os.getpid()  # in a worker process, beside the headline
    # --only other: in this process, in place; the headline's figures are kept
    (tmp_path / "evaluation" / "summaries.json").write_text(json.dumps({**raw, "kept": 1}))
    assert document.main(["--out", str(tmp_path), "--shared", str(tmp_path), "--only", "other"]) == 0
    again = json.loads((tmp_path / "evaluation" / "summaries.json").read_text())
    assert again["other"]["pid"] == os.getpid() and again["kept"] == 1 and again["headline"] == raw["headline"]
    # Each section says the code it was computed at: the one rewritten by the second run, the kept ones by the
    # first (here the same commit; the version is this checkout's).
    version = document.source_version()
    assert len(version) >= 7 and (tmp_path / "evaluation.md").read_text().count(f"_Computed at `{version}`") == 3
