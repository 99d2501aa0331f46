"""Invariants every plan must keep, checked by replaying the plan on its snapshot.

Used by the tests on every plan they make, and available to the service as a guard. Returns the
violations found (empty: the plan is sound):

- no GPU double-booked; every GPU a worker gets exists, is healthy, and a worker gets exactly
  ``gpus_per_worker`` GPUs on one server;
- gangs all-or-nothing: a started job gets ``min_workers..max_workers`` workers; no running job below
  its minimum or above its maximum; ranks are 0..n-1;
- training only on training-owned servers and on inference servers while loaned; reclaimed servers
  left empty; only existing, legal loan steps;
- every job is acted on at most once per plan, and only from a state that allows the action;
- the plan can be applied one action at a time (``core.plan.apply_order``): no job actions whose GPU
  moves form a cycle (scales that take each other's GPUs), which no order could apply in full.
"""

from __future__ import annotations

from scheduler_service.core.plan import LoanStep, Plan, ServerAction, WorkerPlacement, unorderable
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.lifecycle import SERVER_LIFECYCLE, JobState, ServerState

_STEP_TARGET = {
    LoanStep.LOAN: ServerState.DRAINING,
    LoanStep.ACTIVATE: ServerState.LOANED,
    LoanStep.CANCEL: ServerState.SERVING,
    LoanStep.RECLAIM: ServerState.RECLAIMING,
    LoanStep.RETURN: ServerState.SERVING,
}


def check_plan(snapshot: ClusterSnapshot, plan: Plan) -> list[str]:
    problems: list[str] = []
    servers = {s.server_id: s for s in snapshot.servers}
    jobs = {j.job_id: j for j in snapshot.jobs}

    acted = [s.job_id for s in plan.starts] + [s.job_id for s in plan.scales] + [p.job_id for p in plan.preemptions]
    for job_id in {j for j in acted if acted.count(j) > 1}:
        problems.append(f"job {job_id} is acted on more than once")

    # Server states after the plan's loan steps.
    state = {sid: s.state for sid, s in servers.items()}
    for action in plan.server_actions:
        if action.server_id not in servers:
            problems.append(f"loan step on unknown server {action.server_id}")
            continue
        target = _STEP_TARGET[action.kind]
        if not SERVER_LIFECYCLE.allows(state[action.server_id], target):
            problems.append(f"server {action.server_id}: {action.kind} from {state[action.server_id]} is illegal")
        state[action.server_id] = target

    # Worker placement after the plan: start from the snapshot's, then apply the job actions.
    placement: dict[int, tuple[WorkerPlacement, ...]] = {
        j.job_id: tuple(WorkerPlacement(w.rank, w.server_id, w.gpu_indices) for w in j.workers)
        for j in snapshot.jobs
        if j.state in (JobState.RUNNING, JobState.SCALING)
    }
    for p in plan.preemptions:
        if p.job_id not in placement:
            problems.append(f"job {p.job_id} is preempted but not running")
        placement.pop(p.job_id, None)
    for s in plan.scales:
        if s.job_id not in placement:
            problems.append(f"job {s.job_id} is scaled but not running")
        placement[s.job_id] = s.workers
    for start in plan.starts:
        job = jobs.get(start.job_id)
        if job is None or job.state != JobState.PENDING:
            problems.append(f"job {start.job_id} is started but not pending")
        placement[start.job_id] = start.workers

    owner: dict[tuple[str, int], int] = {}
    for job_id, workers in placement.items():
        job = jobs.get(job_id)
        if job is None:
            problems.append(f"unknown job {job_id} holds workers")
            continue
        if not job.min_workers <= len(workers) <= job.max_workers:
            problems.append(
                f"job {job_id} runs {len(workers)} worker(s), outside {job.min_workers}..{job.max_workers}"
            )
        if sorted(w.rank for w in workers) != list(range(len(workers))):
            problems.append(f"job {job_id} has ranks {sorted(w.rank for w in workers)}, not 0..{len(workers) - 1}")
        for w in workers:
            server = servers.get(w.server_id)
            if server is None:
                problems.append(f"job {job_id} rank {w.rank} on unknown server {w.server_id}")
                continue
            if state[w.server_id] not in (ServerState.TRAINING, ServerState.LOANED):
                problems.append(f"job {job_id} rank {w.rank} on {w.server_id}, which is {state[w.server_id]}")
            if len(w.gpu_indices) != job.gpus_per_worker:
                problems.append(f"job {job_id} rank {w.rank} has {len(w.gpu_indices)} GPU(s), "
                                f"not {job.gpus_per_worker}")
            for gpu in w.gpu_indices:
                if gpu not in server.gpu_indices:
                    problems.append(f"job {job_id} uses GPU {gpu} that {w.server_id} does not have")
                elif gpu in server.unhealthy_gpus:
                    problems.append(f"job {job_id} uses unhealthy GPU {w.server_id}:{gpu}")
                other = owner.setdefault((w.server_id, gpu), job_id)
                if other != job_id or sum(1 for x in w.gpu_indices if x == gpu) > 1:
                    problems.append(f"GPU {w.server_id}:{gpu} is double-booked (jobs {other} and {job_id})")
    # A GPU held in the snapshot by a job that the plan leaves alone stays held: covered above, since
    # ``placement`` starts from the snapshot. Reclaimed/serving servers must be empty after the plan:
    for sid, st in state.items():
        if st in (ServerState.RECLAIMING, ServerState.SERVING, ServerState.DRAINING):
            holders = {job for (server_id, _), job in owner.items() if server_id == sid}
            if holders:
                problems.append(f"server {sid} is {st} but still runs job(s) {sorted(holders)}")
    moved = {s.job_id for s in plan.scales} | {p.job_id for p in plan.preemptions}
    held = {j.job_id: [(w.server_id, g) for w in j.workers for g in w.gpu_indices] for j in snapshot.jobs
            if j.job_id in moved}
    blocked = unorderable(plan, held)
    if blocked:
        names = [f"server {a.server_id}" if isinstance(a, ServerAction) else f"job {a.job_id}" for a in blocked]
        problems.append(f"no order applies the plan one action at a time: {', '.join(names)} wait on a cycle of "
                        "GPU moves (each takes a GPU another frees)")
    return problems
