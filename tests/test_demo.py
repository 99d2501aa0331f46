"""The loaning story end to end with real processes (it is ``make demo``): scheduler, agents, model
servers, ``aryl-router`` and training programs. Load drops -> servers drained and loaned -> the
elastic job scales out onto them; load rises -> servers reclaimed, the elastic job scaled in (not
preempted), only the inelastic job requeued, the router serving from them again; and not one
inference request failed, none answered by a server while it was on loan."""

from __future__ import annotations

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
