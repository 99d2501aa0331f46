"""The simulator's input values: trace jobs and inference demand. Plain frozen data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_service.core.snapshot import QueueView


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One training job of a trace, already mapped to what the scheduler sees.

    ``work`` is in samples (or any unit) at ``throughput`` samples/s; a job completes when it has done
    ``work`` units. ``throughput`` gives the job's speed at several worker counts (at least at
    ``min_workers``); between and beyond the points the core's ThroughputModel interpolates.
    """

    job_id: int                     # 1.. in trace order
    name: str
    submit_time: float              # seconds since the trace's start
    gpus_per_worker: int
    min_workers: int
    max_workers: int                # == min_workers: inelastic
    work: float                     # total work units
    throughput: tuple[tuple[int, float], ...]  # ((workers, units/s), ...), ascending workers
    model: str = ""                 # e.g. "bert", "imagenet", "philly"
    deadline: float | None = None   # seconds since the trace's start
    priority: int = 0
    # Queues, priority classes and GPU types (``core.quota``; trace columns in ``simulator.generic_trace``).
    queue: str = "default"
    user: str = ""
    priority_class: int = 0         # the class's value
    gpu_types: tuple[str, ...] = ()  # () any
    # What the job declares about its length (``simulator.estimates``), shown to the policy in place
    # of ``work``; the truth still drives progress and completion. ``declared_work``: None: the true
    # ``work`` (clairvoyant, the default); 0: none declared. ``declared_runtime_s``: a run time at
    # ``min_workers`` the user declared (None: none), as the service's ``estimated_runtime``.
    declared_work: float | None = None
    declared_runtime_s: float | None = None

    def runtime_at(self, workers: int) -> float:
        """Seconds to finish from scratch at ``workers`` workers (declared points only)."""
        speed = dict(self.throughput).get(workers)
        if speed is None:
            raise KeyError(f"job {self.job_id}: no throughput point at {workers} workers")
        return self.work / speed


@dataclass(frozen=True, slots=True)
class DemandPoint:
    time: float              # seconds since the trace's start
    servers_needed: int
    rate_rps: float = 0.0    # the request rate behind it (plots; the share of requests met short: simulator.results)
    # What the rate asks for before it is clipped to the inference cluster (``simulator.load``); None: as
    # ``servers_needed``. The policy sees ``servers_needed``; the shortfall is counted against this.
    servers_wanted: int | None = None


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    training_servers: int
    inference_servers: int
    gpus_per_server: int = 8
    # Typed training servers: (GPU type, servers) in server-id order, covering every training server
    # (empty: one unnamed type). Inference servers get ``inference_gpu_type``.
    training_gpu_types: tuple[tuple[str, int], ...] = ()
    inference_gpu_type: str = ""
    # Declared speed per GPU type, relative to 1.0 (a type not named runs at 1.0): a job's true speed
    # on that type is its trace speed times the factor.
    gpu_speed: tuple[tuple[str, float], ...] = ()
    queues: tuple[QueueView, ...] = ()  # the configured queues (empty: none, as without queues)


@dataclass(frozen=True, slots=True)
class ServerFailure:
    """One injected server failure: at ``time`` (seconds since the trace's start) the server dies --
    its agent goes silent, so the scheduler sees it LOST -- and ``down_s`` later it is back."""

    time: float
    server_id: str
    down_s: float


@dataclass(frozen=True, slots=True)
class FailureRate:
    """Random server failures: every server, from the start and again from each repair, runs for an
    exponentially distributed time with mean ``mtbf_s`` before it fails, then is down ``repair_s``."""

    mtbf_s: float
    repair_s: float
