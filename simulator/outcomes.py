"""What a simulation records as it runs, filled in by the simulated cluster (``simulator.cluster``) and
read by the results (``simulator.results``): each job's history (``JobOutcome``), each server's loans
(``ServerOutcome``) and the cluster's usage over time (``UtilisationSample``). Plain data; what this
module must never do: simulate or decide anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_service.lifecycle import Pool


@dataclass(slots=True)
class JobOutcome:
    """One trace job's history. Times are seconds since the trace's start; ``start``/``end`` are None
    while the job has not started/finished (a run stopped by a guard leaves them so)."""

    job_id: int
    name: str
    submit: float
    gpus_per_worker: int
    min_workers: int
    max_workers: int
    start: float | None = None          # first start
    end: float | None = None            # completion
    preemptions: int = 0
    scale_outs: int = 0                 # resizes to more workers
    scale_ins: int = 0                  # resizes to fewer workers
    moves: int = 0                      # resizes to the same number of workers elsewhere
    lost_work_gpu_s: float = 0.0        # GPU time of work thrown away by preemptions
    overhead_gpu_s: float = 0.0         # GPU time spent restarting (starts, restarts, resizes)
    deadline: float | None = None       # the trace job's (None: none)
    reclaim_preemptions: int = 0        # preemptions because a loaned server went back (PREEMPTED_FOR_RECLAIM)
    reclaim_scale_ins: int = 0          # shrinks for the same reason (SCALED_IN_FOR_RECLAIM)
    useful_gpu_s: float = 0.0           # its useful spans' GPU-seconds (at simulator.cluster's reference cost)

    @property
    def gpu_seconds_lost(self) -> float:
        return self.lost_work_gpu_s + self.overhead_gpu_s

    @property
    def queue_s(self) -> float | None:
        """First start minus submission."""
        return None if self.start is None else self.start - self.submit

    @property
    def jct_s(self) -> float | None:
        """Completion minus submission."""
        return None if self.end is None else self.end - self.submit

    @property
    def met_deadline(self) -> bool | None:
        """Completed by its deadline (None: it has none; a job that never completed missed it)."""
        if self.deadline is None:
            return None
        return self.end is not None and self.end <= self.deadline


@dataclass(slots=True)
class ServerOutcome:
    server_id: str
    pool: Pool
    loans: int = 0      # LOAN steps committed (a loan begun; a cancelled one counts too)
    reclaims: int = 0   # RECLAIM steps committed


@dataclass(frozen=True, slots=True)
class UtilisationSample:
    """The cluster's usage from ``time`` until the next sample (piecewise constant), in GPUs unless
    named otherwise."""

    time: float
    training_gpus: int          # training-pool GPUs allocated to training jobs
    inference_gpus: int         # inference-pool GPUs serving inference: min(needed, SERVING) x GPUs/server
    loaned_training_gpus: int   # inference-pool GPUs allocated to training jobs (on loan)
    loaned_servers: int         # inference servers in state LOANED
    servers_needed: int         # the inference demand signal (0 before the first demand point)
    rate_rps: float             # the request rate behind it
    servers_wanted: int = 0     # the need before it was clipped to the inference cluster (``DemandPoint``)


def same_levels(a: UtilisationSample, b: UtilisationSample) -> bool:
    """Do the two samples show the same levels (whatever their times)?"""
    return (a.training_gpus, a.inference_gpus, a.loaned_training_gpus, a.loaned_servers, a.servers_needed,
            a.rate_rps, a.servers_wanted) == (b.training_gpus, b.inference_gpus, b.loaned_training_gpus,
                                              b.loaned_servers, b.servers_needed, b.rate_rps, b.servers_wanted)
