"""Explain reasons for non-events, from the policy's own decision: why a running elastic job below
max_workers keeps its size (``KeepSize``: the anti-thrash interval, no gain, no spare GPUs, GPUs held
for a starving job, a policy that does not scale) and why no inference server is loaned
(``LoanNote``: no demand yet, inference needs every server plus the buffer, training needs nothing,
not idle long enough, a policy that never loans). Each is recorded once per decision, not once per
cycle: one event when it changes, none while it stands.

The policy's answers on snapshots; the service's over real gRPC on SQLite and PostgreSQL, shown by
``arylctl explain`` and ``arylctl loans`` (run in-process against the real scheduler)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from protos.aryl.v1 import inference_pb2, inference_pb2_grpc, scheduler_pb2, types_pb2
from scheduler_service.core import JobView, Reason
from scheduler_service.core.params import PolicyParams
from scheduler_service.core.plan import clock_time
from scheduler_service.cycle import only_changed_reasons
from scheduler_service.policies import create_policy
from tests.fixtures.cli import run
from tests.harness import (
    NOW,
    inference_server,
    job_spec,
    pending_job,
    register_fake_server,
    running_job,
    scheduler_stub,
    secure_channel,
    snapshot_of,
    training_server,
)
from tests.helpers import wait_for


def elastic_at_one(resized: float) -> JobView:
    return running_job(1, [("t1", (0,))], low=1, high=4, resized=resized)


def test_a_job_resized_recently_is_held_by_the_resize_interval_with_the_next_possible_time() -> None:
    policy = create_policy("aryl", PolicyParams(min_resize_interval_s=120, restart_cost_s=1))
    plan = policy.schedule(snapshot_of([training_server("t1", 4)], [elastic_at_one(NOW - 40)]))
    assert plan.scales == ()
    [held] = plan.held
    assert (held.job_id, held.reason) == (1, Reason.HELD_RESIZE_INTERVAL)
    assert held.message == (f"held at 1 of 1-4 worker(s): resized at {clock_time(NOW - 40)}; resizes at most every "
                            f"120s (policy.min_resize_interval_s), next possible at {clock_time(NOW + 80)}")
    # Past the interval it grows, and the note is cleared (the scale's own event says why).
    grown = policy.schedule(snapshot_of([training_server("t1", 4)], [running_job(
        1, [("t1", (0,))], low=1, high=4, resized=NOW - 200)]))
    assert [len(s.workers) for s in grown.scales] == [4] and grown.held == ()


def test_no_gain_no_spare_gpus_and_a_reservation_each_say_why_the_job_keeps_its_size() -> None:
    no_gain = create_policy("aryl", PolicyParams(min_resize_interval_s=0, restart_cost_s=1e9))
    [held] = no_gain.schedule(snapshot_of([training_server("t1", 4)], [elastic_at_one(0.0)])).held
    assert held.reason == Reason.HELD_NO_GAIN and "policy.restart_cost_s" in held.message

    full = create_policy("aryl", PolicyParams(min_resize_interval_s=0))
    busy = running_job(2, [("t1", (1, 2, 3))], low=1)
    [held] = full.schedule(snapshot_of([training_server("t1", 4)], [elastic_at_one(0.0), busy])).held
    assert held.reason == Reason.HELD_NO_SPARE_GPUS

    starving = create_policy("aryl", PolicyParams(min_resize_interval_s=0, starvation_s=0, restart_cost_s=1))
    plan = starving.schedule(snapshot_of([training_server("t1", 4), training_server("t2", 4)],
                                         [elastic_at_one(0.0), running_job(2, [("t2", (0, 1, 2))], low=1),
                                          pending_job(3, gpus=4, workers=2)]))
    [held] = plan.held
    assert held.reason == Reason.HELD_FOR_RESERVATION and "starving job 3" in held.message


def test_a_note_is_recorded_once_per_decision_and_cleared_when_it_no_longer_holds() -> None:
    policy = create_policy("aryl", PolicyParams(min_resize_interval_s=120))
    snapshot = snapshot_of([training_server("t1", 4)], [elastic_at_one(NOW - 40)])
    [held] = policy.schedule(snapshot).held
    later = snapshot_of([training_server("t1", 4)], [elastic_at_one(NOW - 40)], now=NOW + 2)
    recorded = dataclasses.replace(later, jobs=tuple(dataclasses.replace(j, size_note=held.summary)
                                                      for j in later.jobs))
    assert only_changed_reasons(policy.schedule(recorded), recorded).held == ()  # the same decision: nothing new
    assert only_changed_reasons(policy.schedule(later), later).held == (held,)  # not recorded yet: recorded

    # Once it has grown to max_workers, nothing holds it back: the standing note is cleared, without an event.
    at_max = snapshot_of([training_server("t1", 4)], [dataclasses.replace(
        running_job(1, [("t1", (0,)), ("t1", (1,)), ("t1", (2,)), ("t1", (3,))], low=1, high=4, resized=NOW - 40),
        size_note=held.summary)])
    [cleared] = only_changed_reasons(policy.schedule(at_max), at_max).held
    assert (cleared.job_id, cleared.reason, cleared.summary) == (1, None, "")


@pytest.mark.parametrize(("policy", "servers", "demand", "params", "reason", "message"), [
    ("aryl", [inference_server("i1"), inference_server("i2")], None, {}, Reason.NOT_LOANED_NO_DEMAND,
     "no server loaned: no inference demand reported yet (loans follow the router's demand signal)"),
    ("aryl", [inference_server("i1"), inference_server("i2")], 0, {"loan_buffer_servers": 2},
     Reason.NOT_LOANED_NO_SURPLUS,
     "no server loaned: inference needs 0 server(s) + 2 spare (policy.loan_buffer_servers); 2 serving"),
    ("aryl", [inference_server("i1"), inference_server("i2")], 2, {"loan_buffer_servers": 0},
     Reason.NOT_LOANED_NO_SURPLUS,
     "no server loaned: inference needs 2 server(s) + 0 spare (policy.loan_buffer_servers); 2 serving"),
    ("aryl", [inference_server("i1")], 0, {"loan_buffer_servers": 0}, Reason.NOT_LOANED_NO_TRAINING_DEMAND,
     "no server loaned: training needs no more GPUs than are free"),
    ("sjf", [inference_server("i1")], 0, {}, Reason.NOT_LOANED_BY_POLICY,
     "policy 'sjf' never loans inference servers to training"),
])
def test_why_no_server_is_loaned(policy, servers, demand, params, reason, message) -> None:
    plan = create_policy(policy, PolicyParams(**params)).schedule(snapshot_of(servers, [], demand))
    assert plan.server_actions == ()
    assert plan.loan_note is not None and (plan.loan_note.reason, plan.loan_note.message) == (reason, message)


def test_spare_servers_not_idle_long_enough_say_when_the_first_may_be_loaned() -> None:
    policy = create_policy("aryl", PolicyParams(loan_idle_s=300, loan_buffer_servers=0))
    plan = policy.schedule(snapshot_of([inference_server("i1", since=NOW - 100)], [pending_job(1, gpus=8)], 0))
    assert plan.loan_note is not None and plan.loan_note.reason == Reason.NOT_LOANED_NOT_IDLE
    assert plan.loan_note.message.endswith(f"the first may be loaned at {clock_time(NOW + 200)}")
    loaned = policy.schedule(snapshot_of([inference_server("i1", since=NOW - 400)], [pending_job(1, gpus=8)], 0))
    assert [a.server_id for a in loaned.server_actions] == ["i1"]
    assert loaned.loan_note is not None and loaned.loan_note.reason is None  # clears the standing note


# -- the service: recorded once, shown by arylctl ------------------------------------------------

def explain(stub, job_id: str) -> scheduler_pb2.ExplainJobResponse:
    return stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=job_id), timeout=5)


def report_demand(address: str, servers: int) -> None:
    with secure_channel(address) as channel:
        inference_pb2_grpc.InferenceServiceStub(channel).ReportDemand(
            inference_pb2.ReportDemandRequest(servers_needed=servers, observed_rps=1.0, source="test"), timeout=5)


def test_explain_and_loans_show_the_non_events_once(scheduler_factory, capsys) -> None:
    scheduler = scheduler_factory(policy={"min_resize_interval_s": 3600, "restart_cost_s": 1,
                                          "loan_buffer_servers": 1, "loan_idle_s": 0})
    channel, stub = scheduler_stub(scheduler.address)
    try:
        register_fake_server(scheduler.address, "t1", gpus=4)
        register_fake_server(scheduler.address, "i1", pool="inference", gpus=4)
        blocker = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("blocker", gpus=3)), timeout=5).job
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=blocker.job_id), timeout=5).job.state
                 == types_pb2.JOB_STATE_RUNNING, what="the blocker to run")
        elastic = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(
            spec=job_spec("elastic", workers=1, max_workers=4)), timeout=5).job
        wait_for(lambda: "HELD_NO_SPARE_GPUS" in explain(stub, elastic.job_id).summary, what="no spare GPUs")

        # GPUs free up; the job was resized (started) moments ago, so the anti-thrash interval holds it.
        stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=blocker.job_id, reason="done"), timeout=5)
        summary = wait_for(lambda: "HELD_RESIZE_INTERVAL" in (s := explain(stub, elastic.job_id).summary) and s,
                           what="the resize interval note")
        assert "held at 1 of 1-4 worker(s): resized at " in summary
        assert "resizes at most every 3600s (policy.min_resize_interval_s), next possible at " in summary
        report_demand(scheduler.address, 0)
        since = wait_for(lambda: (r := stub.ListLoans(scheduler_pb2.ListLoansRequest(), timeout=5)).not_loaned
                         .startswith("NOT_LOANED_NO_SURPLUS") and r.not_loaned_since, what="the loan note")
        time.sleep(1.0)  # several cycles (0.2 s apart) decide the same: none may record it again

        decisions = [d.reason for d in explain(stub, elastic.job_id).decisions]
        assert decisions.count("HELD_NO_SPARE_GPUS") == 1 and decisions.count("HELD_RESIZE_INTERVAL") == 1
        assert stub.GetJob(scheduler_pb2.GetJobRequest(job_id=elastic.job_id), timeout=5).job.size_note \
            .startswith("HELD_RESIZE_INTERVAL: held at 1 of 1-4 worker(s)")

        code, out, _ = run(capsys, "--server", scheduler.address, "explain", elastic.job_id)
        assert code == 0 and "HELD_RESIZE_INTERVAL" in out and "next possible at" in out
        code, out, _ = run(capsys, "--server", scheduler.address, "job", elastic.job_id)
        assert code == 0 and "Size held" in out and "HELD_RESIZE_INTERVAL: held at 1 of 1-4 worker(s)" in out

        # The one inference server is the loan buffer: nothing is loaned, and `arylctl loans` says why.
        loans = stub.ListLoans(scheduler_pb2.ListLoansRequest(), timeout=5)
        assert list(loans.loans) == []
        assert loans.not_loaned == ("NOT_LOANED_NO_SURPLUS: no server loaned: inference needs 0 server(s) + 1 spare "
                                    "(policy.loan_buffer_servers); 1 serving")
        assert loans.not_loaned_since == since  # the same decision: not recorded again
        code, out, _ = run(capsys, "--server", scheduler.address, "loans")
        assert code == 0 and "Not loaning (since " in out and "NOT_LOANED_NO_SURPLUS" in out
        code, out, _ = run(capsys, "--server", scheduler.address, "cluster")
        assert code == 0 and "NOT_LOANED_NO_SURPLUS" in out
        events = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=elastic.job_id, include_events=True), timeout=5)
        assert [e.kind for e in events.events].count(types_pb2.EVENT_KIND_JOB_SIZE_HELD) == 2
    finally:
        channel.close()
