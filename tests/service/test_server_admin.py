"""Servers taken out of the cluster (issue 21): cordon, uncordon, drain and delete by an operator
(``arylctl servers ...``), and an agent that deregisters when stopped.

First the decisions, pure: placement and the aryl policy place nothing on a cordoned server and leave
what runs there alone; a drain shrinks elastic jobs off (or requeues them below their minimum),
leaves the others until its deadline, reclaims a loaned inference server; a deregistered server's
jobs are evicted as SERVER_LEFT. The use cases on SQLite and PostgreSQL: their refusals, a forced
delete and a deregistration through real cycles. Then the service end to end with real processes: a scheduler on
PostgreSQL over real gRPC, ``aryl-agent`` daemons with fake GPUs running ``examples/train.py``, and
the installed ``arylctl`` console script.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from protos.aryl.v1 import types_pb2
from scheduler_service.app import SchedulerApp
from scheduler_service.core.faults import plan_evictions
from scheduler_service.core.plan import LoanStep, Plan, PreemptJob, Reason, ScaleJob, StartJob
from scheduler_service.core.snapshot import AdminState
from scheduler_service.cycle import SchedulingCycle
from scheduler_service.errors import FailedPrecondition, InvalidArgument, NotFound
from scheduler_service.lifecycle import Pool, ServerState
from scheduler_service.policies import create_policy
from scheduler_service.records import GpuReport, JobSubmission, ServerRegistration, StatusReport
from scheduler_service.store.db import create_engine_for, session_factory
from tests.fixtures.cluster import REPO, Cluster, end_leftovers
from tests.harness import (
    NOW,
    ManualClock,
    daemon_env,
    inference_server,
    pending_job,
    placed,
    running_job,
    security_env,
    snapshot_of,
    training_server,
)
from tests.helpers import wait_for

J = types_pb2
ARYLCTL = str(Path(sys.executable).with_name("arylctl"))


def cordoned(server, admin: AdminState = AdminState.CORDONED, deadline: float | None = None):
    return dataclasses.replace(server, admin=admin, drain_deadline=deadline)


# -- decisions ------------------------------------------------------------------------------------


def test_nothing_new_is_placed_on_a_cordoned_server_and_what_runs_there_stays() -> None:
    # A long job (10 h): starting job 2 completes more than growing it would (the joint sizing's rates).
    elastic = running_job(1, [("a", (0,)), ("a", (1,))], low=1, high=4, resized=NOW - 3600, runtime=36000)
    snap = snapshot_of([cordoned(training_server("a", 4)), training_server("b", 2)],
                       [elastic, pending_job(2, gpus=2)])
    plan = create_policy("aryl").schedule(snap)
    assert plan.preemptions == ()
    starts = {s.job_id: s for s in plan.starts}
    assert [w.server_id for w in starts[2].workers] == ["b"]  # a has 2 free GPUs, but is cordoned
    for scale in plan.scales:  # the elastic job may not grow onto a; its workers there stay
        assert scale.job_id == 1 and {("a", (0,)), ("a", (1,))} <= {(w.server_id, w.gpu_indices)
                                                                    for w in scale.workers}
    # Alone, the job would grow onto a's free GPUs; cordoned, it cannot grow at all (b is taken).
    assert not plan.scales


def test_a_cordoned_inference_server_is_not_loaned_and_its_draining_loan_is_cancelled() -> None:
    idle = [cordoned(inference_server("i0", since=NOW - 3600)), inference_server("i1", since=NOW - 3600),
            cordoned(inference_server("i2", ServerState.DRAINING, since=NOW - 1))]
    plan = create_policy("aryl").schedule(snapshot_of([*idle, training_server("t", 1)],
                                                      [pending_job(1, gpus=8)], demand=0))
    steps = {(a.server_id, a.kind) for a in plan.server_actions}
    assert ("i0", LoanStep.LOAN) not in steps and ("i1", LoanStep.LOAN) in steps
    assert ("i2", LoanStep.CANCEL) in steps


def test_a_drain_shrinks_elastic_jobs_off_requeues_those_below_min_and_leaves_the_rest() -> None:
    shrinks = running_job(1, [("a", (0,)), ("b", (0,))], low=1, high=2)
    below_min = running_job(2, [("a", (1,)), ("b", (1,))], low=2, high=3)
    rigid = running_job(3, [("a", (2,))], low=1)
    snap = snapshot_of([cordoned(training_server("a"), AdminState.DRAINING), training_server("b")],
                       [shrinks, below_min, rigid])
    found = plan_evictions(snap)
    assert found is not None
    (scale,) = found.scales
    assert (scale.job_id, scale.reason, scale.workers) == (1, Reason.SERVER_DRAINING, placed(("b", (0,))))
    assert found.preemptions == (PreemptJob(2, Reason.SERVER_DRAINING, "server a draining; fewer than "
                                            "min_workers=2 would be left elsewhere, requeued"),)
    # The drain's deadline: none (the job finishes there), not yet, passed (requeued).
    for deadline, requeued in ((None, False), (NOW + 1, False), (NOW, True)):
        snap = snapshot_of([cordoned(training_server("a"), AdminState.DRAINING, deadline)], [rigid])
        found = plan_evictions(snap)
        assert (found is not None and found.preemptions == (
            PreemptJob(3, Reason.SERVER_DRAINING, "server a draining; the drain's deadline passed, requeued"),
        )) is requeued


def test_a_drained_loaned_server_is_reclaimed_the_normal_way() -> None:
    job = running_job(1, [("t", (0,)), ("i0", (0,))], low=1, high=2, resized=NOW - 3600)
    servers = [training_server("t", 1), cordoned(inference_server("i0", ServerState.LOANED, since=NOW - 3600),
                                                 AdminState.DRAINING)]
    plan = create_policy("aryl").schedule(snapshot_of(servers, [job], demand=0))
    assert [(a.server_id, a.kind) for a in plan.server_actions] == [("i0", LoanStep.RECLAIM)]
    assert [(s.job_id, [w.server_id for w in s.workers]) for s in plan.scales] == [(1, ["t"])]


def test_the_jobs_of_a_deregistered_server_are_evicted_as_having_left() -> None:
    left = dataclasses.replace(training_server("a"), state=ServerState.LOST, admin=AdminState.LEFT)
    snap = snapshot_of([left, training_server("b")], [running_job(1, [("a", (0,)), ("b", (0,))], low=1, high=2),
                                                      running_job(2, [("a", (1,))], low=1)])
    found = plan_evictions(snap)
    assert found is not None
    assert found.scales == (ScaleJob(1, placed(("b", (0,))), Reason.SERVER_LEFT,
                                     "server a left the cluster (agent deregistered); continues with 1 worker(s)"),)
    assert found.preemptions == (PreemptJob(2, Reason.SERVER_LEFT, "server a left the cluster (agent deregistered)"),)


# -- the service, end to end ----------------------------------------------------------------------

class AdminCluster(Cluster):
    """``tests.fixtures.cluster.Cluster`` whose agents may take extra flags."""

    # Its second positional parameter is a flag, not the GPU count: every caller passes gpus by name.
    def start_agent(self, hostname: str, *flags: str, gpus: int = 2) -> None:  # type: ignore[override]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
        env.update(ARYL_AGENT__RECONCILE_INTERVAL_S="0.1", ARYL_AGENT__CHECKPOINT_ROOT=str(self.checkpoints),
                   ARYL_AGENT__LOGS_LISTEN_HOST="127.0.0.1", ARYL_AGENT__ADVERTISE_ADDRESS="127.0.0.1",
                   ARYL_AGENT__STOP_GRACE_S="5", ARYL_LOGGING__LEVEL="info", ARYL_E2E_MARKER=str(self.tmp),
                   **daemon_env(hostname))
        args = [sys.executable, "-m", "node_agent.main", "--scheduler", self.scheduler.address, "--hostname",
                hostname, "--fake-gpus", str(gpus), "--work-dir", str(self.tmp / f"agent-{hostname}"), *flags]
        with (self.tmp / f"{hostname}.log").open("ab") as log:
            self.agents[hostname] = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
def cluster(tmp_path: Path, postgres_url: str) -> Iterator[AdminCluster]:
    c = AdminCluster(tmp_path, postgres_url)
    yield c
    c.close()
    end_leftovers(tmp_path)


def arylctl(cluster: Cluster, *argv: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARYL_")}
    env.update({k: v for k, v in security_env().items() if not k.startswith(("ARYL_AGENT__", "ARYL_ROUTER__"))})
    return subprocess.run([ARYLCTL, "--server", cluster.scheduler.address, *argv], check=False, capture_output=True,
                          text=True, timeout=30, env=env)


def server_rows(cluster: Cluster) -> dict[str, list[str]]:
    result = arylctl(cluster, "servers")
    assert result.returncode == 0, result.stderr
    return {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:]}


def where(job: types_pb2.Job) -> set[str]:
    return {w.server_id for w in job.workers}


def running_on(cluster: Cluster, job_id: str, what: str) -> types_pb2.Job:
    return cluster.wait_job(job_id, lambda j: j.state == J.JOB_STATE_RUNNING and j.workers, what)


LONG = ("--total-steps", "100000", "--step-time", "0.2")


@pytest.mark.postgres
def test_cordon_keeps_work_there_places_nothing_new_and_uncordon_undoes_it(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a")
    cluster.start_agent("node-b")
    wait_for(lambda: len(cluster.client.list_servers()) == 2, what="two servers")
    first = running_on(cluster, cluster.submit("first", *LONG, gpus=2), "running")
    (busy,) = where(first)
    idle = ({"node-a", "node-b"} - {busy}).pop()

    for name in (busy, idle):
        result = arylctl(cluster, "servers", "cordon", name, "--reason", "maintenance")
        assert result.returncode == 0, result.stderr
        assert f"server {name} cordoned" in result.stdout and "TRAINING,CORDONED" in result.stdout
    rows = server_rows(cluster)
    assert rows[busy][2] == rows[idle][2] == "TRAINING,CORDONED" and "maintenance" in " ".join(rows[idle])

    second = cluster.submit("second", *LONG, gpus=2)
    cluster.wait_job(second, lambda j: j.state == J.JOB_STATE_PENDING and j.pending_reason, "a pending reason")
    assert cluster.job(second).state == J.JOB_STATE_PENDING  # the idle server is cordoned
    again = cluster.job(first.job_id)
    assert (again.state, again.incarnation, where(again)) == (J.JOB_STATE_RUNNING, first.incarnation, {busy})

    result = arylctl(cluster, "servers", "uncordon", idle)
    assert result.returncode == 0 and f"server {idle} uncordoned" in result.stdout, result.stderr
    assert where(running_on(cluster, second, "placed once uncordoned")) == {idle}
    events = arylctl(cluster, "events", "--server-id", idle)
    assert "SERVER_ADMIN_CHANGED" in events.stdout and "CORDONED" in events.stdout, events.stderr


@pytest.mark.postgres
def test_drain_moves_elastic_work_off_waits_for_the_rest_then_delete_removes_the_server(cluster: Cluster) -> None:
    cluster.start_scheduler()
    cluster.start_agent("node-a")
    cluster.start_agent("node-b")
    wait_for(lambda: len(cluster.client.list_servers()) == 2, what="two servers")
    rigid = running_on(cluster, cluster.submit("rigid", *LONG, gpus=1), "running")
    (drained,) = where(rigid)
    other = ({"node-a", "node-b"} - {drained}).pop()
    elastic_id = cluster.submit("elastic", *LONG, gpus=1, workers=1, max_workers=3)
    cluster.wait_job(elastic_id, lambda j: j.state == J.JOB_STATE_RUNNING and drained in where(j),
                     "grown onto the server to drain")

    result = arylctl(cluster, "servers", "drain", drained)
    assert result.returncode == 0, result.stderr
    assert f"server {drained} draining" in result.stdout and "TRAINING,DRAINING" in result.stdout
    elastic = cluster.wait_job(elastic_id, lambda j: j.state == J.JOB_STATE_RUNNING and where(j) == {other},
                               "shrunk off the draining server")
    assert elastic.restarts == 0 and elastic.reason == "SERVER_DRAINING"
    kept = cluster.job(rigid.job_id)
    assert (kept.state, kept.incarnation, where(kept)) == (J.JOB_STATE_RUNNING, rigid.incarnation, {drained})
    assert server_rows(cluster)[drained][2] == "TRAINING,DRAINING"

    refused = arylctl(cluster, "servers", "delete", drained)
    assert refused.returncode != 0 and refused.stdout == ""
    assert f"server {drained} still runs workers of job(s) {rigid.job_id}" in refused.stderr
    assert "drain it first" in refused.stderr and "--force" in refused.stderr

    assert arylctl(cluster, "servers", "drain", drained, "--force").returncode == 0
    moved = cluster.wait_job(rigid.job_id, lambda j: j.state == J.JOB_STATE_RUNNING and where(j) == {other},
                             "requeued and running on the other server")
    assert moved.restarts == 0 and moved.preemptions == 1
    wait_for(lambda: server_rows(cluster)[drained][2] == "TRAINING,DRAINED", what="DRAINED")

    agent = cluster.agents.pop(drained)  # the operator stops its agent, which deregisters, then deletes it
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    assert server_rows(cluster)[drained][2] == "LOST,LEFT"
    result = arylctl(cluster, "servers", "delete", drained)
    assert result.returncode == 0 and result.stdout.strip() == f"server {drained} deleted", result.stderr
    assert set(server_rows(cluster)) == {other}
    assert "DELETED" in arylctl(cluster, "events", "--server-id", drained).stdout


@pytest.mark.postgres
def test_a_sigtermed_agent_deregisters_its_jobs_move_at_once_and_it_can_be_deleted(cluster: Cluster) -> None:
    # A long liveness grace: only the deregistration can explain the server's jobs moving.
    cluster.start_scheduler(agents={"lost_after_s": 600.0})
    cluster.start_agent("node-a")
    cluster.start_agent("node-b")
    wait_for(lambda: len(cluster.client.list_servers()) == 2, what="two servers")
    job = running_on(cluster, cluster.submit("moves", *LONG, gpus=2), "running")
    (leaving,) = where(job)
    other = ({"node-a", "node-b"} - {leaving}).pop()

    agent = cluster.agents.pop(leaving)
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    moved = cluster.wait_job(job.job_id, lambda j: j.state == J.JOB_STATE_RUNNING and where(j) == {other},
                             "requeued and running on the other server")
    assert moved.restarts == 0  # not a failure
    history = cluster.client.explain_job(job.job_id)
    assert any(f"server {leaving} left the cluster" in d.message and d.reason == "SERVER_LEFT"
               for d in history.decisions), history
    row = server_rows(cluster)[leaving]
    assert row[2] == "LOST,LEFT" and f"servers delete {leaving}" in " ".join(row)
    assert "deregistered" in (cluster.tmp / f"{leaving}.log").read_text()

    result = arylctl(cluster, "servers", "delete", leaving)
    assert result.returncode == 0 and f"server {leaving} deleted" in result.stdout, result.stderr
    assert set(server_rows(cluster)) == {other}
    cluster.start_agent(leaving)  # back: it registers again, schedulable
    wait_for(lambda: server_rows(cluster).get(leaving, [None, None, None])[2] == "TRAINING",
             what="the server registered again")


@pytest.mark.postgres
def test_an_agent_told_to_keep_its_workers_leaves_them_running_for_the_next_agent(cluster: AdminCluster) -> None:
    cluster.start_scheduler(agents={"lost_after_s": 600.0})
    cluster.start_agent("node-a", "--keep-workers")
    job = running_on(cluster, cluster.submit("stays", *LONG, gpus=2), "running")
    agent = cluster.agents.pop("node-a")
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    assert "deregistered" not in (cluster.tmp / "node-a.log").read_text()
    assert server_rows(cluster)["node-a"][2] == "TRAINING"
    cluster.start_agent("node-a")  # adopts the worker: the job never stopped
    progressed = cluster.wait_job(job.job_id, lambda j: j.progress > job.progress + 2, "progress after adoption")
    assert (progressed.state, progressed.incarnation, progressed.restarts, progressed.preemptions) == (
        J.JOB_STATE_RUNNING, job.incarnation, 0, 0)


# -- the use cases on SQLite and PostgreSQL: refusals, delete --force, deregistration ---------------


def test_the_admin_use_cases_refuse_what_they_must_and_delete_by_force_once_the_jobs_are_off(
    database_url: str,
) -> None:
    clock = ManualClock()
    engine = create_engine_for(database_url)
    try:
        app = SchedulerApp(session_factory(engine), clock)
        app.term.start("test")
        for name in ("a", "b"):
            app.agents.register(ServerRegistration(
                name, Pool.TRAINING, tuple(GpuReport(i, f"GPU-{name}-{i}", "m", 1) for i in range(2)), name, "t"))
        rigid = app.jobs.submit(JobSubmission("rigid", "alice", "default", ("train",), {}, 2, 1, 1)).id
        assert app.cluster.apply(Plan(starts=(StartJob(rigid, placed(("a", (0, 1))), Reason.PLACED, ""),))).started
        cycle = SchedulingCycle(app.cluster, create_policy("aryl"), clock)

        with pytest.raises(NotFound, match="server ghost is not registered"):
            app.server_admin.cordon("ghost")
        with pytest.raises(InvalidArgument, match="timeout_seconds"):
            app.server_admin.drain("a", timeout_s=-1)
        with pytest.raises(FailedPrecondition, match=f"still runs workers of job\\(s\\) {rigid}; drain it first"):
            app.server_admin.delete("a")

        # --force: DELETING (drained at once); the next cycle requeues the job; the sweep removes a.
        change = app.server_admin.delete("a", force=True)
        deleting = app.server_admin.server("a")
        assert not change.deleted and deleting is not None and deleting.admin_state == AdminState.DELETING
        with pytest.raises(FailedPrecondition, match="being deleted"):
            app.server_admin.uncordon("a")
        assert app.liveness.sweep_lost(1e9) == [] and app.server_admin.server("a") is not None  # jobs still there
        report = cycle.run_once()
        assert report.result.preempted == (rigid,) and report.result.started == ()  # nothing new on a
        app.liveness.sweep_lost(1e9)
        assert app.server_admin.server("a") is None
        assert [s.id for s in app.views.servers()] == ["b"]
        cycle.run_once()  # requeued: it starts on b
        record, events = app.jobs.get(rigid, include_events=True)
        assert record.state == "RUNNING" and {a.server_id for a in record.allocations} == {"b"}
        assert record.restarts == 0 and record.preemptions == 1
        assert any(e.reason == "SERVER_DRAINING" for e in events)

        # b's agent leaves: LOST and LEFT at once, the job requeued as SERVER_LEFT; reports are refused.
        app.agents.deregister("b", "agent stopped")
        with pytest.raises(FailedPrecondition, match="deregistered"):
            app.agents.report_status(StatusReport("b", app.term.epoch, (), 0))
        with pytest.raises(FailedPrecondition, match="agent deregistered"):
            app.server_admin.cordon("b")
        assert cycle.run_once().result.preempted == (rigid,)
        record, events = app.jobs.get(rigid, include_events=True)
        assert (record.state, record.restarts) == ("PENDING", 0)
        assert any(e.reason == "SERVER_LEFT" and "server b left the cluster" in e.message for e in events)
        # Registering again brings it back, schedulable.
        app.agents.register(ServerRegistration(
            "b", Pool.TRAINING, tuple(GpuReport(i, f"GPU-b-{i}", "m", 1) for i in range(2)), "b", "t"))
        server = app.server_admin.server("b")
        assert server is not None and (server.state, server.admin_state) == ("TRAINING", "")
    finally:
        engine.dispose()
