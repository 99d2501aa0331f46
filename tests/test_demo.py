"""The loaning story end to end with real processes (it is ``make demo``): scheduler, agents, model
servers, ``aryl-router`` and training programs. Load drops -> servers drained and loaned -> the
elastic job scales out onto them; load rises -> servers reclaimed, the elastic job scaled in (not
preempted), only the inelastic job requeued, the router serving from them again; and not one
inference request failed, none answered by a server while it was on loan. Run as ``aryl-demo``, it
says what it starts before the timeline begins and leaves nothing in the temporary directory unless
asked to keep it (``--keep``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from aryl_demo.demo import run
from protos.aryl.v1 import types_pb2
from tests.helpers import processes_mentioning, wait_for


def test_the_demo_story_loans_scales_reclaims_and_fails_no_request(tmp_path: Path) -> None:
    outcome = run(tmp_path / "demo")

    assert outcome.requests_sent > 200 and outcome.requests_failed == []
    assert outcome.requests_ok == outcome.requests_sent
    assert len(outcome.served_while_loaned) == 2 and set(outcome.served_while_loaned.values()) == {0}
    assert outcome.loans_made == 2 and outcome.servers_reclaimed == 2
    resnet, vit, bert = (outcome.jobs[name] for name in ("resnet50", "vit-huge", "bert-large"))
    assert outcome.resnet_scaled_out_to > 4                    # grew onto a loaned server
    assert resnet.state == types_pb2.JOB_STATE_RUNNING and resnet.preemptions == 0
    assert resnet.progress >= outcome.resnet_progress_before_reclaim  # resizes resume from checkpoints
    assert vit.preemptions == 1                                # the one job reclaim could not shrink
    assert bert.preemptions == 0 and bert.incarnation == 1     # untouched on the training pool
    # The demo leaves nothing running: daemons stopped, then every worker they started.
    wait_for(lambda: not processes_mentioning(str(tmp_path)), timeout=20, what="no demo process left")


def run_demo_program(tmp_path: Path, *args: str) -> tuple[list[str], Path]:
    """``aryl-demo`` as ``make demo`` runs it, with TMPDIR pointed at a fresh folder: its output lines
    and that folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    done = subprocess.run([str(Path(sys.executable).parent / "aryl-demo"), *args], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp)}, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wait_for(lambda: not processes_mentioning(str(tmp)), timeout=20, what="no demo process left")
    return done.stdout.splitlines(), tmp


def test_the_demo_says_what_it_starts_and_leaves_nothing_in_the_temporary_directory(tmp_path: Path) -> None:
    lines, tmp = run_demo_program(tmp_path)

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    # Every start-up wait is announced before the timeline's first event (issue 21: a silent 17 s).
    timeline_starts = first("  event  ")
    for announced in ("Compiling the scheduling kernels", "kernels ready in", "Starting the scheduler",
                      "scheduler answering", "Starting node agents", "agents registered", "Starting aryl-router"):
        assert first(announced) < timeline_starts, announced
    # The router's first demand (measured before any traffic) is shown before the midday traffic
    # starts, and every rate the demo prints for the router is the one it measured.
    assert first("demand_changed") < first("== Midday")
    demand_lines = [line for line in lines if "demand_changed" in line or "  load  " in line]
    assert demand_lines and all("measured" in line for line in demand_lines)
    assert any(" 0 failed" in line for line in lines)
    # Nothing left behind, and the last line says where it was.
    assert [p.name for p in tmp.iterdir()] == []
    assert "removed" in lines[-1] and str(tmp) in lines[-1] and "--keep" in lines[-1]


def test_the_demo_keeps_its_database_and_logs_when_asked(tmp_path: Path) -> None:
    lines, tmp = run_demo_program(tmp_path, "--keep")

    [kept] = tmp.glob("aryl-demo-*")
    assert (kept / "aryl.db").is_file() and (kept / "scheduler.log").is_file() and (kept / "router.log").is_file()
    assert lines[-1] == f"logs and database kept in {kept}"
