"""Can a job's gang ever fit this cluster, even with every GPU free? One rule for SubmitJob (which
refuses such a job) and for the policy (which says so in a queued job's pending reason once the
cluster has shrunk under it).

A gang of ``min_workers`` workers of ``gpus_per_worker`` GPUs each fits a set of servers, all free,
when one server has at least ``gpus_per_worker`` GPUs and the servers together hold ``min_workers``
such workers (a worker never spans servers): sum over servers of (GPUs // gpus_per_worker).

Which servers count is the caller's: SubmitJob counts every registered server, training and
inference, in any state (a LOST or UNHEALTHY one may come back; an inference server may be loaned);
the policy counts the servers it could ever place on (inference ones only if it loans).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence


def never_fits(gpus_per_worker: int, min_workers: int, server_gpus: Sequence[int], *, servers: str) -> str | None:
    """Why the gang cannot fit on servers with these GPU counts even when all are free, or None when
    it can. ``servers`` names them in the message ("training + inference servers"). With no server
    at all the answer is None: an empty cluster is not known yet, and the job may wait for one."""
    if not server_gpus:
        return None
    largest = max(server_gpus)
    if gpus_per_worker > largest:
        return f"needs {gpus_per_worker} GPUs per worker; the largest server has {largest} ({servers})"
    workers = sum(n // gpus_per_worker for n in server_gpus)
    if workers < min_workers:
        return (f"needs at least {min_workers} x {gpus_per_worker} GPUs; the cluster holds at most {workers} "
                f"worker(s) of {gpus_per_worker} GPUs ({sum(server_gpus)} GPUs on {len(server_gpus)} {servers})")
    return None
