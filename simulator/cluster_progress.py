"""How a simulated job's work moves: ``SegmentProgress``, the job physics ``simulator.cluster``'s
``SimulatedCluster`` is built on (a base of ``simulator.cluster_apply.PlanApplication``).

Nouns:
- *Segment*: the stretch of a job's life at one placement, from a start or resize until the next
  resize, preemption or completion. Within a segment the job runs at one true speed,
  ``ThroughputModel(points=trace.throughput).speed(workers)``, so progress is linear and the
  completion time exact. A segment begins with ``restart_overhead_s`` without progress; periodic
  checkpoints come every ``checkpoint_interval_s`` after its start.
- *GPU-seconds lost* per job: the GPU time of the work a preemption threw away (productive seconds
  since the last checkpoint x the segment's GPUs) plus the GPU time of restart overheads (the
  overhead seconds actually spent, x the segment's GPUs).
- *Useful spans* (``useful_spans``): when each job's progress that stands was made, as
  ``(from, until, useful GPU-seconds per second)``; one per segment, from the end of its restart
  overhead until it ended, or until its last checkpoint when the work since was thrown away. The rate
  is the segment's speed x the job's *reference cost* (GPU-seconds per unit of work at
  ``min_workers`` on a GPU of speed 1.0: ``min_workers x gpus_per_worker / speed(min_workers)``), so a
  job's spans add up to its kept work at that cost (``simulator.results`` defines useful work by them).
  Segments still running when the run stops count up to then (``close_useful_spans``).

The state it reads and writes is the cluster's, declared here and set up by ``SimulatedCluster``.

Never: change allocations or lifecycle states (``simulator.cluster_apply`` does, on a plan's word),
or decide anything.
"""

from __future__ import annotations

import heapq
from math import floor

from scheduler_service.core.clock import Clock
from scheduler_service.core.snapshot import WorkerView
from simulator.cluster_records import JobRecord, ServerRecord


class SegmentProgress:
    """Progress within a segment, checkpoints, completions and useful spans, over the cluster's state."""

    # The cluster's state this reads and writes (``SimulatedCluster.__init__`` sets it).
    restart_overhead_s: float
    checkpoint_interval_s: float
    useful_spans: list[tuple[float, float, float]]  # (from, until, useful GPU-s per s)
    _clock: Clock
    _speed: dict[str, float]  # declared speed per GPU type (empty: all 1.0)
    _servers: dict[str, ServerRecord]
    _running: dict[int, JobRecord]
    _completions: list[tuple[float, int, int]]  # heap of (end time, job id, segment version)

    @property
    def now(self) -> float:
        return self._clock.now()

    def _work_at(self, job: JobRecord, when: float) -> float:
        productive = when - job.seg_start - self.restart_overhead_s
        if productive <= 0:
            return job.seg_work
        return min(job.seg_work + job.seg_speed * productive, job.trace.work)

    def _last_checkpoint(self, job: JobRecord, when: float) -> tuple[float | None, float]:
        """(time, work) of the newest checkpoint at ``when``: periodic ones every interval after the
        segment's start, else the one the segment began from."""
        periods = floor((when - job.seg_start) / self.checkpoint_interval_s)
        if periods >= 1:
            at = job.seg_start + periods * self.checkpoint_interval_s
            return at, self._work_at(job, at)
        return job.checkpoint_at, job.checkpoint_work

    def _begin_segment(self, job: JobRecord, now: float, workers: tuple[WorkerView, ...], work: float) -> None:
        """The job (re)starts now at ``workers`` from ``work`` done; schedule its completion."""
        job.workers = workers
        job.seg_start = now
        job.seg_work = work
        job.seg_speed = job.model.speed(len(workers))
        if self._speed:  # declared speed of its GPU type (all its workers share one)
            job.seg_speed *= self._speed.get(self._servers[workers[0].server_id].gpu_type, 1.0)
        job.seg_gpus = len(workers) * job.trace.gpus_per_worker
        job.last_resized_at = now
        job.view = None
        if job.seg_speed > 0:
            end = now + self.restart_overhead_s + (job.trace.work - work) / job.seg_speed
            heapq.heappush(self._completions, (end, job.trace.job_id, job.seg_version))

    def _end_segment(self, job: JobRecord, now: float, *, kept_until: float) -> None:
        """Close the running segment at ``now``: charge the restart overhead it actually spent, and
        record its useful span, the progress made until ``kept_until`` (``now``, or the checkpoint it
        falls back to: a time before the segment's progress began keeps none)."""
        job.outcome.overhead_gpu_s += min(self.restart_overhead_s, now - job.seg_start) * job.seg_gpus
        self._record_useful_span(job, kept_until)
        job.seg_version += 1

    def _record_useful_span(self, job: JobRecord, until: float) -> None:
        began = job.seg_start + self.restart_overhead_s
        if until > began and job.seg_speed > 0:
            rate = job.seg_speed * job.reference_cost
            self.useful_spans.append((began, until, rate))
            job.outcome.useful_gpu_s += rate * (until - began)

    def close_useful_spans(self) -> None:
        """The run stops now: record the useful spans of the segments still running, up to now (their
        progress stands; nothing is thrown away). Call once, at the end."""
        now = self.now
        for job_id in sorted(self._running):
            self._record_useful_span(self._running[job_id], now)

    def _lose_work_since(self, job: JobRecord, checkpoint_work: float, now: float) -> None:
        """The job falls back to ``checkpoint_work``: charge the GPU time of the work done since."""
        lost_work = self._work_at(job, now) - checkpoint_work
        if lost_work > 0 and job.seg_speed > 0:
            job.outcome.lost_work_gpu_s += lost_work / job.seg_speed * job.seg_gpus
