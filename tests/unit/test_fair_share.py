"""Fair share between users within a queue (``core.quota``): a user's share is the GPUs their running
jobs hold; queued jobs are taken in order of the share their user would hold before each starts
(progressive filling). Hand-computed cases through the ``aryl`` and ``fifo`` policies."""

from __future__ import annotations

import dataclasses

from scheduler_service.core.invariants import check_plan
from scheduler_service.core.quota import QuotaLedger
from scheduler_service.core.snapshot import QueueView
from scheduler_service.policies import create_policy
from tests.harness import NOW, pending_job, running_job, snapshot_of, training_server


def job(jid: int, user: str, submitted: float, gpus: int = 2):
    return dataclasses.replace(pending_job(jid, gpus, submitted=submitted), queue="team", user=user)


def test_a_light_user_goes_before_a_heavy_one_by_hand() -> None:
    # 8 GPUs; alice runs job 1 on t1 (4 GPUs), bob runs nothing. Queued, 2 GPUs each: alice's jobs 2 and 3
    # (submitted first), bob's 4 and 5. Shares before each job: j4 = 0 (bob), j5 = 2 (bob + j4), j2 = 4
    # (alice), j3 = 6. Order: 4, 5, 2, 3; the 4 free GPUs (t2) take bob's two.
    alice = dataclasses.replace(running_job(1, [("t1", (0, 1, 2, 3))], low=1), queue="team", user="alice")
    jobs = [alice, job(2, "alice", NOW - 400), job(3, "alice", NOW - 300), job(4, "bob", NOW - 200),
            job(5, "bob", NOW - 100)]
    queues = (QueueView("team", 8),)
    snap = dataclasses.replace(snapshot_of([training_server("t1"), training_server("t2")], jobs), queues=queues)
    ledger = QuotaLedger.of(snap)
    assert ledger.user_gpus == {("team", "alice"): 4}
    assert [j.job_id for j in ledger.order(snap.pending_jobs(), lambda j: (0, j.submitted_at))] == [4, 5, 2, 3]
    for policy in ("aryl", "fifo"):
        plan = create_policy(policy).schedule(snap)
        check_plan(snap, plan)
        assert sorted(s.job_id for s in plan.starts) == [4, 5], policy


def test_equal_users_alternate_and_fair_share_can_be_off() -> None:
    # Nobody runs anything; alice queued 2 and 3 before bob's 4 and 5. Shares: j2 = 0, j4 = 0, j3 = 2,
    # j5 = 2 -> order 2, 4, 3, 5 (ties by submission); 4 free GPUs run 2 and 4. Without fair share the
    # queue keeps submission order: 2 and 3.
    jobs = [job(2, "alice", NOW - 400), job(3, "alice", NOW - 300), job(4, "bob", NOW - 200),
            job(5, "bob", NOW - 100)]
    for fair, expected in ((True, [2, 4]), (False, [2, 3])):
        snap = dataclasses.replace(snapshot_of([training_server("t1")], jobs),
                                   queues=(QueueView("team", 8, fair_share=fair),))
        plan = create_policy("aryl").schedule(snap)
        assert sorted(s.job_id for s in plan.starts) == expected, fair
