"""Queues in the service: the admin RPCs over real gRPC (create, set, list, delete, and their refusals),
submissions checked against them (an unknown queue or priority class is refused, naming it), quota
enforcement through real cycles with ``ExplainJob`` naming the rule, ``arylctl queues``, and migration
0010 up and down. On SQLite and PostgreSQL (the ``scheduler`` fixture), migrations on PostgreSQL."""

from __future__ import annotations

import grpc
import pytest
import sqlalchemy as sa

from arylctl.cli import main
from migrations import downgrade, upgrade
from protos.aryl.v1 import scheduler_pb2, types_pb2
from tests.harness import details_of, job_spec, register_fake_server, scheduler_stub, scratch_postgres
from tests.helpers import wait_for


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), details_of(err.value)


def queue(name: str, quota: int, **fields) -> scheduler_pb2.CreateQueueRequest:
    return scheduler_pb2.CreateQueueRequest(queue=scheduler_pb2.Queue(name=name, quota_gpus=quota, **fields))


def test_queue_admin_rpcs_validate_and_refuse_with_the_right_codes(scheduler) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        made = stub.CreateQueue(queue("vision", 4, cohort="lab", borrow_limit_gpus=2, fair_share=True)).queue
        assert (made.name, made.quota_gpus, made.borrow_limit_gpus, made.cohort, made.configured) == (
            "vision", 4, 2, "lab", True)
        for bad, field in ((queue("Vision!", 1), "queue.name"), (queue("", 1), "queue.name"),
                           (queue("nlp", -1), "queue.quota_gpus"),
                           (queue("nlp", 1, borrow_limit_gpus=-3), "queue.borrow_limit_gpus"),
                           (queue("nlp", 1, cohort="Lab Two"), "queue.cohort")):
            code, details = code_of(lambda bad=bad: stub.CreateQueue(bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(field), details
        assert code_of(lambda: stub.CreateQueue(queue("vision", 1)))[0] == grpc.StatusCode.ALREADY_EXISTS
        code, details = code_of(lambda: stub.UpdateQueue(scheduler_pb2.UpdateQueueRequest(name="nope", quota_gpus=1)))
        assert code == grpc.StatusCode.NOT_FOUND and "queue 'nope' does not exist" in details
        code, _ = code_of(lambda: stub.UpdateQueue(scheduler_pb2.UpdateQueueRequest(name="vision", quota_gpus=-1)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        changed = stub.UpdateQueue(scheduler_pb2.UpdateQueueRequest(name="vision", quota_gpus=8,
                                                                    unlimited_borrowing=True)).queue
        assert changed.quota_gpus == 8 and not changed.HasField("borrow_limit_gpus") and changed.cohort == "lab"
        names = [(q.name, q.configured) for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues]
        assert names == [("default", False), ("vision", True)]
        code, details = code_of(lambda: stub.DeleteQueue(scheduler_pb2.DeleteQueueRequest(name="default")))
        assert code == grpc.StatusCode.NOT_FOUND and "already the rest" in details  # unconfigured: nothing to reset
        stub.UpdateQueue(scheduler_pb2.UpdateQueueRequest(name="default", quota_gpus=2))  # configures it
        # Deleting "default" resets it: unconfigured, its quota the rest again.
        stub.DeleteQueue(scheduler_pb2.DeleteQueueRequest(name="default"))
        listed = {q.name: q for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues}
        assert (listed["default"].configured, listed["default"].quota_is_rest) == (False, True)
        for bad_update in (scheduler_pb2.UpdateQueueRequest(name="vision", quota_rest=True),
                    scheduler_pb2.UpdateQueueRequest(name="default", quota_rest=True, quota_gpus=1)):
            code, details = code_of(lambda bad=bad_update: stub.UpdateQueue(bad))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("quota_rest"), details
        # A queue with an active job cannot be deleted; without, it can.
        spec = job_spec("j")
        spec.queue = "vision"
        stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec))
        code, details = code_of(lambda: stub.DeleteQueue(scheduler_pb2.DeleteQueueRequest(name="vision")))
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "1 active job(s)" in details
        stub.CreateQueue(queue("empty", 0))
        stub.DeleteQueue(scheduler_pb2.DeleteQueueRequest(name="empty"))
        assert "empty" not in [q.name for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues]


def test_submissions_to_an_unknown_queue_or_class_are_refused(scheduler) -> None:
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        spec = job_spec("j")
        spec.queue = "vision"
        code, details = code_of(lambda: stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)))
        assert code == grpc.StatusCode.NOT_FOUND
        assert "queue 'vision' does not exist (queues: default)" in details
        spec.queue, spec.priority_class = "", "urgent"
        code, details = code_of(lambda: stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert "spec.priority_class: unknown class 'urgent'; configured: high (100), low (-100), normal (0)" in details
        spec.priority_class = "high"
        spec.gpu_types.extend(["A100", "A100"])
        code, details = code_of(lambda: stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "spec.gpu_types[1]: 'A100' is listed twice" in details
        del spec.gpu_types[1]
        job = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job
        assert (job.spec.priority_class, job.priority_class_value, list(job.spec.gpu_types)) == ("high", 100, ["A100"])


def test_quota_holds_a_job_and_explain_names_the_rule(scheduler) -> None:
    register_fake_server(scheduler.address, "t1", gpus=4, converge=True)
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        stub.CreateQueue(queue("vision", 2, cohort="lab"))
        stub.CreateQueue(queue("nlp", 2, cohort="other"))
        ids = []
        for name in ("a", "b"):
            spec = job_spec(name, gpus=2)
            spec.queue = "vision"
            ids.append(stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=spec)).job.job_id)

        def explained():
            answer = stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=ids[1]))
            return answer if "WAITING_FOR_QUOTA" in answer.summary else None

        answer = wait_for(explained, timeout=15)
        assert ("queue `vision` is at its quota of 2 GPUs and cannot borrow: cohort `lab` has 0 idle"
                in answer.summary)
        assert answer.queue_status == ("queue `vision`: 2 GPU(s) in use of its 2-GPU quota, 0 borrowed "
                                       "(no borrow limit; cohort `lab`: 0 idle)")
        first = stub.GetJob(scheduler_pb2.GetJobRequest(job_id=ids[0])).job
        assert first.state in (types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_SCALING)
        listed = {q.name: q for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues}
        assert (listed["vision"].used_gpus, listed["vision"].pending_jobs, listed["vision"].running_jobs) == (2, 1, 1)
        cluster = stub.GetCluster(scheduler_pb2.GetClusterRequest())
        assert [q.name for q in cluster.queues] == ["default", "nlp", "vision"]
        # The cohort grows: nlp joins lab and lends its idle 2 GPUs, so job b starts (borrowing).
        stub.UpdateQueue(scheduler_pb2.UpdateQueueRequest(name="nlp", cohort="lab"))
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=ids[1])).job.state
                 == types_pb2.JOB_STATE_RUNNING, timeout=15)
        listed = {q.name: q for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues}
        assert (listed["vision"].used_gpus, listed["vision"].borrowed_gpus) == (4, 2)
        servers = stub.ListServers(scheduler_pb2.ListServersRequest()).servers
        assert [s.gpu_type for s in servers] == ["Fake-GPU"]


def test_arylctl_queues(scheduler, capsys) -> None:
    def arylctl(*args: str) -> tuple[int, str, str]:
        code = main(["--server", scheduler.address, "queues", *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, _, err = arylctl("create", "vision", "--quota", "8", "--cohort", "lab", "--borrow-limit", "4")
    assert code == 0, err
    assert arylctl("set", "vision", "--quota", "6")[0] == 0
    code, _, err = arylctl("create", "nlp", "--quota", "-1")
    assert code != 0 and "quota_gpus: must be between 0 and 1000000 GPUs (got -1)" in err
    code, out, err = arylctl("list")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["QUEUE", "COHORT", "QUOTA", "USED", "BORROWED", "LIMIT", "PENDING", "RUNNING", "FAIR"]
    assert lines[1].split() == ["default", "-", "0", "(rest)", "0", "0", "-", "0", "0", "no"]
    assert lines[2].split() == ["vision", "lab", "6", "0", "0", "4", "0", "0", "yes"]
    assert arylctl("delete", "vision")[0] == 0
    assert "vision" not in arylctl()[1]


@pytest.mark.postgres
def test_migration_0010_up_and_down() -> None:
    with scratch_postgres("aryl_q") as url:
        upgrade(url, "0009")
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text(
                    "INSERT INTO jobs (name, \"user\", queue, command, env, gpus_per_worker, min_workers, max_workers, "
                    "priority, throughput, restart_policy, max_restarts, state, state_reason, state_message, "
                    "pending_reason, num_workers, restarts, preemptions, submitted_at, version) VALUES "
                    "('j', 'u', 'default', '[]', '{}', 1, 1, 1, 0, '{}', 'NEVER', 0, 'PENDING', '', '', '', 0, 0, 0, "
                    "0, 1)"))
            upgrade(url, "0010")
            with engine.begin() as conn:
                row = conn.execute(sa.text("SELECT priority_class, priority_value, gpu_types FROM jobs")).one()
                assert tuple(row) == ("", 0, None)
                conn.execute(sa.text("INSERT INTO queues (name, quota_gpus, created_at, updated_at) "
                                     "VALUES ('vision', 4, 0, 0)"))
                with pytest.raises(sa.exc.IntegrityError):
                    with conn.begin_nested():
                        conn.execute(sa.text("INSERT INTO queues (name, quota_gpus, created_at, updated_at) "
                                             "VALUES ('nlp', -1, 0, 0)"))
            downgrade(url, "0009")
            with engine.connect() as conn:
                inspector = sa.inspect(conn)
                assert "queues" not in inspector.get_table_names()
                assert "priority_class" not in {c["name"] for c in inspector.get_columns("jobs")}
        finally:
            engine.dispose()


def test_deleting_queues_gives_default_back_the_rest(scheduler, capsys) -> None:
    """Issue 36, item 4: queues `vision` and `nlp` with quota 2 each on a 4-GPU pool leave `default` 0
    GPUs (``queues create`` warns); ``queues set default --cohort ""`` meanwhile must not freeze that 0;
    after both are deleted a default-queue job runs on the idle cluster, and ``queues delete default``
    returns a configured default to "the rest"."""
    register_fake_server(scheduler.address, "t1", gpus=4, converge=True)

    def arylctl(*args: str) -> tuple[int, str, str]:
        code = main(["--server", scheduler.address, "queues", *args])
        out, err = capsys.readouterr()
        return code, out, err

    assert arylctl("create", "vision", "--quota", "2")[0] == 0
    code, _, err = arylctl("create", "nlp", "--quota", "2")
    assert code == 0, err
    assert "this leaves queue `default` no GPUs" in err and "arylctl queues delete nlp" in err, err
    channel, stub = scheduler_stub(scheduler.address)
    with channel:  # a job of default: explain says its quota is the rest
        waiting = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("w", gpus=1))).job.job_id
        answer = wait_for(lambda: (a := stub.ExplainJob(scheduler_pb2.ExplainJobRequest(job_id=waiting)))
                          and "WAITING_FOR_QUOTA" in a.summary and a, timeout=15)
        assert "its 0-GPU quota (the rest: what the other queues' quotas leave)" in answer.queue_status
        stub.CancelJob(scheduler_pb2.CancelJobRequest(job_id=waiting))
    code, _, err = arylctl("set", "default", "--cohort", "")
    assert code == 0, err
    channel, stub = scheduler_stub(scheduler.address)
    with channel:
        listed = {q.name: q for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues}
        assert (listed["default"].quota_gpus, listed["default"].configured) == (0, True)
        assert arylctl("delete", "vision")[0] == 0
        assert arylctl("delete", "nlp")[0] == 0
        listed = {q.name: q for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues}
        assert listed["default"].quota_gpus == 4  # the rest again, though configured (its cohort)
        job_id = stub.SubmitJob(scheduler_pb2.SubmitJobRequest(spec=job_spec("d", gpus=2))).job.job_id
        wait_for(lambda: stub.GetJob(scheduler_pb2.GetJobRequest(job_id=job_id)).job.state
                 in (types_pb2.JOB_STATE_RUNNING, types_pb2.JOB_STATE_SCALING), timeout=15)
        # A default given a fixed quota returns to the rest with `queues delete default`, jobs and all.
        assert arylctl("set", "default", "--quota", "0")[0] == 0
        code, out, err = arylctl("delete", "default")
        assert code == 0, err
        assert "rest" in out + err
        listed = {q.name: q for q in stub.ListQueues(scheduler_pb2.ListQueuesRequest()).queues}
        assert (listed["default"].quota_gpus, listed["default"].configured) == (4, False)
        # Or `queues set default --quota rest`, keeping its other settings.
        assert arylctl("set", "default", "--quota", "1", "--cohort", "lab")[0] == 0
        code, out, err = arylctl("set", "default", "--quota", "rest")
        assert code == 0, err
        assert out.splitlines()[1].split()[:4] == ["default", "lab", "4", "(rest)"]
        code, _, err = arylctl("set", "default", "--quota", "lots")
        assert code == 2 and "'lots' is not a number of GPUs (or 'rest', for \"default\")" in err, err
