"""The loaning story end to end with real processes (it is ``make demo``): scheduler, agents, model
servers, ``aryl-router`` and training programs. Load drops -> servers drained and loaned -> the
elastic job scales out onto them; load rises -> servers reclaimed, the elastic job scaled in (not
preempted), only the inelastic job requeued, the router serving from them again; and not one
inference request failed, none answered by a server while it was on loan. Run as ``aryl-demo``, it
says what it starts before the timeline begins and leaves nothing in the temporary directory unless
asked to keep it (``--keep``).

One run of the demo (~40 s) checks all of it: ``aryl-demo --keep`` through its ``main``, in this process
so that the story's outcome (``demo.run``'s value) is at hand beside its output; the folder it kept is
then removed by the same function a run without ``--keep`` ends with."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from aryl_demo import demo
from protos.aryl.v1 import types_pb2
from tests.helpers import processes_mentioning, wait_for


def test_the_demo_story_its_output_and_its_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))  # for the processes it starts, as `TMPDIR=... make demo`
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # and for this one: its folder goes there
    outcomes: list[demo.DemoOutcome] = []
    real_run = demo.run

    def run_and_keep_outcome(workdir: Path, **kwargs: bool) -> demo.DemoOutcome:
        outcomes.append(real_run(workdir, **kwargs))
        return outcomes[-1]

    monkeypatch.setattr(demo, "run", run_and_keep_outcome)
    status = demo.main(["--keep"])
    lines = capsys.readouterr().out.splitlines()
    assert status == 0, "\n".join(lines[-40:])
    [outcome] = outcomes

    # The story.
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
    batches = [line.split("BATCH_CHOSEN", 1)[1].strip() for line in lines
               if " resnet50 " in line and "job_batch_changed" in line]
    assert len(set(batches)) >= 2, batches                     # its batch follows its allocation (issue 17)

    # What it says: every start-up wait is announced before the timeline's first event (issue 21: a
    # silent 17 s).
    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    timeline_starts = first("  event  ")
    for announced in ("scheduling kernels ready in", "Starting the scheduler",
                      "scheduler answering", "Starting node agents", "agents registered", "Starting aryl-router"):
        assert first(announced) < timeline_starts, announced
    assert first("data plane: haproxy (pid") > first("Starting aryl-router")  # HAProxy carries the demo's requests
    # The router's first demand (measured before any traffic) is shown before the midday traffic
    # starts, and every rate the demo prints for the router is the one it measured.
    assert first("demand_changed") < first("== Midday")
    demand_lines = [line for line in lines if "demand_changed" in line or "  load  " in line]
    assert demand_lines and all("measured" in line for line in demand_lines)
    assert any(" 0 failed" in line for line in lines)

    # Its folder: kept when asked, with the database and logs, and nothing else in the temporary
    # directory; the demo leaves nothing running (daemons stopped, then every worker they started).
    [kept] = tmp.iterdir()
    assert kept.name.startswith("aryl-demo-")
    assert (kept / "aryl.db").is_file() and (kept / "scheduler.log").is_file() and (kept / "router.log").is_file()
    assert lines[-1] == f"logs and database kept in {kept.resolve()}"
    wait_for(lambda: not processes_mentioning(str(tmp)), timeout=20, what="no demo process left")
    # Without --keep the run ends by removing it with this function: then nothing is left.
    assert demo._remove(kept.resolve())
    assert list(tmp.iterdir()) == []


def test_a_warm_start_does_not_announce_a_compile(capsys: pytest.CaptureFixture[str]) -> None:
    """Kernels loaded from numba's cache (quickly) are only said to be ready; a compile (slow) is announced
    while it runs."""
    demo.prepare_kernels(lambda: None, patience_s=2.0)
    warm = capsys.readouterr().out
    assert "Compiling" not in warm and "scheduling kernels ready in" in warm and "loaded from numba's cache" in warm
    demo.prepare_kernels(lambda: time.sleep(0.3), patience_s=0.05)
    cold = capsys.readouterr().out
    assert cold.index("Compiling the scheduling kernels") < cold.index("ready in") and "(compiled)" in cold

    def broken() -> None:
        raise RuntimeError("no compiler")

    with pytest.raises(RuntimeError, match="no compiler"):
        demo.prepare_kernels(broken)
