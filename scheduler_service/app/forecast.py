"""The scheduler's forecast: each job's predicted start and finish (the ETA beside "why pending"), and
what-if runs of the live cluster under another policy, other parameters or another inference pool.

Both run the simulator's engine forward from the cluster's snapshot (``simulator.forecast``: the same
policy code and cycle, a virtual clock, the jobs' predicted run times), never touching the cluster:
the snapshot is read, the simulation works on its own copy, nothing is written.

- *ETA*: a job's predicted start (while it waits) and finish, from the latest forecast. It never guesses
  silently: a job with no run-time estimate of its own (no ``estimated_runtime``, no throughput points with
  total work, no measured progress: ``core.predict.remaining_seconds`` knows nothing) gets no predicted
  finish, and a waiting job whose start waits on such jobs gets no predicted start either; its line says
  so, and what the forecast took in their place (``PolicyParams.default_runtime_s``), labelled a guess.
  ``refresh`` makes a forecast under the configured policy from a fresh snapshot; the service
  calls it after a cycle (``scheduler_service.service_loops``), at most one at a time, no sooner than
  ``min_gap_s`` after the previous one began and than ``MAX_DUTY`` of the time allows (a forecast that
  took 2 s waits 18 s more), so forecasts take a bounded share of the scheduler's time (and of its
  interpreter lock, which its RPC threads share) whatever the queue or the RPC load.
  RPCs read the latest one (``eta``), never compute one. Bounds: ``ForecastSettings`` (a week of
  virtual time, 2,000 cycles, 2 s of host time by default).
- *What-if*: ``what_if`` runs on request (admin only, ``api.auth``), validated first: an unknown
  policy or parameter is InvalidArgument naming the choices. Each of its two runs stops after
  ``simulator.forecast.WHAT_IF_WALL_BUDGET_S`` of host time, and one what-if runs at a time (another
  asked meanwhile is Aborted: try again).

The forecast is the simulator's engine (writing a second one inside the service would be the rule written
twice), but this module does not import the simulator: it declares what it needs of an engine
(``ForecastEngine``, and the shapes of what one returns) and is given one. The composition root,
``scheduler_service.server``, wires in ``simulator.forecast.SimulatorForecastEngine``: the one module of the
service that imports the simulator (tests/contract/test_layering.py).

Never: write, decide (the policy does), or hold SQL.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Protocol

from scheduler_service.core.clock import Clock
from scheduler_service.core.params import ParamError, PolicyParams, changed_params, params_from_text
from scheduler_service.core.predict import clock_time, remaining_seconds
from scheduler_service.core.registry import policies
from scheduler_service.core.snapshot import ClusterSnapshot
from scheduler_service.errors import Aborted, InvalidArgument


class JobForecast(Protocol):
    """One job in a forecast: a pending job's next start (a running job's first start) and its finish, in
    the snapshot's clock; ``after``: the jobs whose GPUs it takes when it starts (ascending), all of them
    finished by then when ``after_finished`` (else some shrank or were preempted)."""

    @property
    def job_id(self) -> int: ...
    @property
    def start(self) -> float | None: ...
    @property
    def finish(self) -> float | None: ...
    @property
    def after(self) -> tuple[int, ...]: ...
    @property
    def after_finished(self) -> bool: ...


class Forecast(Protocol):
    """A forecast of every active job of a snapshot. ``stop_reason``: why the engine's run stopped
    ("completed", "max_time", "stalled" or "budget"); ``horizon_end``: the virtual time it reached."""

    @property
    def made_at(self) -> float: ...
    @property
    def stop_reason(self) -> str: ...
    @property
    def horizon_end(self) -> float: ...
    def get(self, job_id: int) -> JobForecast | None: ...


class WhatIfRun(Protocol):
    """One of a what-if's two runs: its table column, policy, parameters and summary (metric -> value,
    nested mappings for grouped metrics; ``stop_reason`` among them)."""

    @property
    def label(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def params(self) -> PolicyParams: ...
    @property
    def summary(self) -> Mapping[str, object]: ...


class WhatIf(Protocol):
    """The next ``horizon_s`` now and under the alternative, with the table comparing them."""

    @property
    def horizon_s(self) -> float: ...
    @property
    def current(self) -> WhatIfRun: ...
    @property
    def alternative(self) -> WhatIfRun: ...
    @property
    def table(self) -> str: ...
    @property
    def wall_s(self) -> float: ...


class ForecastEngine(Protocol):
    """What the service needs of a forecast engine (``simulator.forecast.SimulatorForecastEngine``): run the
    scheduling forward from a snapshot (bounded by the engine's own settings), compare two settings over a
    horizon (ValueError when ``extra_inference_servers`` removes more servers than are idle), and load
    what its first run would otherwise pay for. Sent to the forecast's process (``ForecastProcess``), so it
    must pickle."""

    def forecast(self, snapshot: ClusterSnapshot, policy: str, params: PolicyParams) -> Forecast: ...
    def what_if(self, snapshot: ClusterSnapshot, current: tuple[str, PolicyParams],
                alternative: tuple[str, PolicyParams], *, horizon_s: float, extra_inference_servers: int
                ) -> WhatIf: ...
    def warm_up(self) -> None: ...


# A forecast follows a cycle no sooner than this after the previous one began (cycles may come every
# 100 ms under load; the ETA moves on the scale of minutes).
DEFAULT_MIN_GAP_S = 10.0
# Forecasts take at most this share of the time: after one that took T seconds the next waits T x (1/share - 1).
MAX_DUTY = 0.1


@dataclass(frozen=True, slots=True)
class JobEta:
    """One job's ETA as users read it (``Job.eta_*``, ExplainJob's ``eta``)."""

    start: float | None
    finish: float | None
    after: tuple[int, ...]
    note: str                # "" for a job that is not pending
    made_at: float


def unestimated_jobs(snapshot: ClusterSnapshot, alpha: float) -> frozenset[int]:
    """The active jobs of ``snapshot`` whose remaining run time nothing measured or declared says
    (``core.predict.remaining_seconds`` at their size now, ``min_workers`` while waiting): the forecast ran
    them for ``default_runtime_s``, a guess."""
    unknown = set()
    for job in snapshot.jobs:
        if job.state.is_terminal:
            continue
        size = job.num_workers if job.state.holds_gpus and job.workers else job.min_workers
        if remaining_seconds(job, size, snapshot.now, alpha=alpha) is None:
            unknown.add(job.job_id)
    return frozenset(unknown)


def _jobs_text(ids: tuple[int, ...]) -> str:
    return f"job {ids[0]}" if len(ids) == 1 else f"jobs {', '.join(str(j) for j in ids)}"


def eta_note(job: JobForecast | None, forecast: Forecast, now: float, *, guessed: tuple[int, ...] = (),
             default_runtime_s: float = 0.0) -> str:
    """One line on when a pending job is expected to start, and after which jobs. ``guessed``: the jobs
    it waits for whose run time is unknown (the forecast's default, ``default_runtime_s``, stood in): the
    start is then no prediction, and the line says so before the guess."""
    if job is None:
        return "no forecast for it yet (it arrived after the last one)"
    if job.start is None:
        if forecast.stop_reason == "stalled":
            return "not expected to start: the cluster as it is cannot place it (see why pending)"
        return f"not expected to start before {clock_time(forecast.horizon_end, now)} (the forecast's reach)"
    if guessed:
        unknown = _jobs_text(guessed)
        return (f"start unknown: it waits for {unknown}, whose run time is unknown (no estimated_runtime, no "
                f"progress reported yet); a guess, if {'it runs' if len(guessed) == 1 else 'each runs'} the "
                f"default {default_runtime_s / 3600:g} h: around {clock_time(job.start, now)}")
    text = f"expected to start around {clock_time(job.start, now)}"
    if job.after:
        jobs = ", ".join(str(j) for j in job.after)
        noun = "job" if len(job.after) == 1 else "jobs"
        if job.after_finished:
            text += f" (after {noun} {jobs} {'finishes' if len(job.after) == 1 else 'finish'})"
        else:
            text += f" (when {noun} {jobs} free{'s' if len(job.after) == 1 else ''} GPUs)"
    return text


# A forecast of this many active jobs or more runs in ``ForecastProcess``'s process. Measured on one core
# (aryl, one 8-GPU server, ``simulator.forecast.ForecastSettings``' defaults): a forecast runs to its 2 s
# budget at 1,000 jobs as at 50,000, where building its start costs 1 s more; sending the snapshot costs
# 4 ms at 1,000 jobs and 240 ms at 50,000. Below it, a small cluster (and a test's) starts no process.
FORECAST_PROCESS_MIN_JOBS = 1000
FORECAST_NICENESS = 10  # added to the forecast process's nice value (``os.nice``)

ForecastRun = Callable[[ClusterSnapshot, str, PolicyParams], Forecast]


class ForecastProcess:
    """``engine.forecast`` run in a process of its own (``Forecasts(run=...)``), so that a forecast of a long
    queue (seconds of Python for 10,000s of jobs) takes a core of its own instead of the interpreter lock
    the RPCs and cycles share. The process is started (spawned: the scheduler's threads are not forked)
    at the first forecast and kept, at a lower priority (``FORECAST_NICENESS``); one that died is
    replaced at the next. The snapshot goes to it
    and the forecast comes back pickled. A snapshot of fewer than ``min_jobs`` active jobs is forecast
    on the calling thread: milliseconds, less than the trip to the process (and no process is started
    for a small cluster).

    The process never outlives the scheduler, whatever ends it (``kill -9`` included): it asks the kernel
    for SIGKILL when its parent goes (``PR_SET_PDEATHSIG``), and a thread of its own ends it once its
    parent is no longer the scheduler (``_exit_with_parent``: also when the scheduler died before the
    request was made). Its multiprocessing resource tracker then ends too: it exits when the last holder
    of its pipe, this process, is gone. Call it from a thread that lives as long as the pool: the
    kernel's signal follows the thread that started the process."""

    def __init__(self, engine: ForecastEngine, min_jobs: int = FORECAST_PROCESS_MIN_JOBS) -> None:
        self.engine = engine
        self.min_jobs = min_jobs
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __call__(self, snapshot: ClusterSnapshot, policy: str, params: PolicyParams) -> Forecast:
        if len(snapshot.jobs) < self.min_jobs:
            return self.engine.forecast(snapshot, policy, params)
        with self._lock:
            if self._closed:  # the scheduler is stopping: no new process
                raise Aborted("the forecast process is closed (the scheduler is stopping)")
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_start_forecast_process,
                                                 initargs=(os.getpid(), self.engine))
            pool = self._pool
        try:
            return pool.submit(self.engine.forecast, snapshot, policy, params).result()
        except BrokenProcessPool:
            with self._lock:  # the process died (killed, out of memory): the next forecast starts another
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False)
            raise

    def close(self) -> None:
        """Stop the process (after the forecast it is running, if any); no other is started after."""
        with self._lock:
            pool, self._pool, self._closed = self._pool, None, True
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


# Linux's prctl(2) option: the signal this process gets when the thread that started it ends.
PR_SET_PDEATHSIG = 1
# How often the forecast process checks that its parent is still the scheduler (the backstop of the kernel's signal).
PARENT_CHECK_S = 0.2


def _start_forecast_process(scheduler_pid: int, engine: ForecastEngine) -> None:
    """In the forecast's process, first: die with the scheduler (``ForecastProcess``), yield the CPU
    to the scheduler's own process and the database (the ETA is best effort: on a busy machine a
    forecast reaches less far within its budget), and load the scheduling kernels."""
    _die_with_parent()
    if os.getppid() != scheduler_pid:  # the scheduler died before the kernel was asked
        os._exit(1)
    threading.Thread(target=_exit_with_parent, args=(scheduler_pid,), name="aryl-forecast-parent",
                     daemon=True).start()
    os.nice(FORECAST_NICENESS)
    # The scheduling kernels before the first forecast: their load (or compile) is not a forecast's to pay
    # out of its wall budget, which it would cut short.
    engine.warm_up()


def _die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the parent goes (Linux; elsewhere ``_exit_with_parent`` alone)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl to call: the watching thread still ends the process
        pass


def _exit_with_parent(scheduler_pid: int) -> None:
    """A thread of the forecast's process: exit at once when the parent is no longer the scheduler (it died
    and the process was handed to init or a subreaper)."""
    while os.getppid() == scheduler_pid:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


class Forecasts:
    """The latest forecast and the means to make one. ``snapshot``: the cluster's (``app.cluster``);
    ``engine``: the forecast engine (``ForecastEngine``); ``run``: how a forecast is run (the engine's own
    ``forecast`` on the calling thread unless given, e.g. a ``ForecastProcess`` of the same engine)."""

    def __init__(
        self, snapshot: Callable[[], ClusterSnapshot], clock: Clock, *, policy: str, params: PolicyParams,
        engine: ForecastEngine, min_gap_s: float = DEFAULT_MIN_GAP_S, run: ForecastRun | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._engine = engine
        self._run = run or engine.forecast
        self._clock = clock
        self.policy = policy
        # No online learning in a forecast: it must not train the live policy's network on made-up futures.
        self.params = dataclasses.replace(params, dl2_online_learning=False)
        self.min_gap_s = min_gap_s
        self._latest: Forecast | None = None
        # The jobs of the latest forecast's snapshot with no run-time estimate (``unestimated_jobs``).
        self._guessed: frozenset[int] = frozenset()
        self._running = threading.Lock()
        self._what_if = threading.Lock()
        self._last_began: float | None = None
        self._last_took = 0.0

    @property
    def latest(self) -> Forecast | None:
        return self._latest

    def due(self) -> bool:
        """Whether a forecast should follow the cycle that just ran: none running, ``min_gap_s`` passed
        since the last one began, and ``MAX_DUTY`` kept."""
        last = self._last_began
        if self._running.locked():
            return False
        gap = max(self.min_gap_s, self._last_took / MAX_DUTY)
        return last is None or self._clock.monotonic() - last >= gap

    def refresh(self) -> Forecast | None:
        """Make a forecast from a fresh snapshot and keep it; None (and nothing done) while another runs."""
        if not self._running.acquire(blocking=False):
            return None
        try:
            began = self._last_began = self._clock.monotonic()
            try:
                snapshot = self._snapshot()
                made = self._run(snapshot, self.policy, self.params)
                guessed = unestimated_jobs(snapshot, self.params.amdahl_alpha)
            finally:
                self._last_took = self._clock.monotonic() - began
            self._latest, self._guessed = made, guessed  # read together by ``eta`` (one reference each)
            return made
        finally:
            self._running.release()

    def eta(self, job_id: int, pending: bool) -> JobEta | None:
        """``job_id``'s ETA from the latest forecast (None before the first one). No predicted finish for a
        job without a run-time estimate; no predicted start (nor finish) for a waiting job whose start
        rests on such jobs: its note gives the forecast's guess, labelled so."""
        made, unknown = self._latest, self._guessed
        if made is None:
            return None
        job = made.get(job_id)
        if job is None:
            note = eta_note(job, made, self._clock.now()) if pending else ""
            return JobEta(None, None, (), note, made.made_at)
        guessed = tuple(j for j in job.after if j in unknown) if pending else ()
        note = eta_note(job, made, self._clock.now(), guessed=guessed,
                        default_runtime_s=self.params.default_runtime_s) if pending else ""
        start = job.start if pending and not guessed else None
        finish = job.finish if job_id not in unknown and not guessed else None
        return JobEta(start, finish, job.after if pending else (), note, made.made_at)

    def what_if(self, policy: str, changes: Mapping[str, str], inference_servers: int, horizon_s: float) -> WhatIf:
        """The next ``horizon_s`` under the configured policy and under ``policy`` ("" the configured one)
        with ``changes`` to its parameters and ``inference_servers`` more (or fewer) inference servers."""
        name = policy or self.policy
        if name not in policies.names():
            raise InvalidArgument("policy", f"unknown policy {name!r}; registered: {', '.join(policies.names())}")
        params = params_with(self.params, changes)
        if not 0 < horizon_s <= 168 * 3600:
            raise InvalidArgument("horizon_hours", f"must be > 0 and at most 168 (got {horizon_s / 3600:g})")
        if abs(inference_servers) > 10_000:
            raise InvalidArgument("inference_servers", f"at most 10000 either way (got {inference_servers})")
        if not self._what_if.acquire(blocking=False):
            raise Aborted("another what-if is running (one at a time); try again when it has answered")
        try:
            return self._engine.what_if(self._snapshot(), (self.policy, self.params), (name, params),
                                        horizon_s=horizon_s, extra_inference_servers=inference_servers)
        except ValueError as exc:  # more inference servers removed than are idle
            raise InvalidArgument("inference_servers", str(exc)) from exc
        finally:
            self._what_if.release()


def params_with(base: PolicyParams, changes: Mapping[str, str]) -> PolicyParams:
    """``base`` with ``changes`` (``[policy]`` names, text values as ``aryl-sim --param`` takes them:
    ``core.params.params_from_text``); InvalidArgument naming the known parameters for an unknown one, or
    the expected type for a bad value."""
    try:
        return params_from_text(base, changes)
    except ParamError as exc:
        raise InvalidArgument(f"params[{exc.key}]", exc.problem) from None
    except ValueError as exc:
        raise InvalidArgument("params", str(exc)) from exc


# What the api package reads of the forecast, through this module alone.
__all__ = ["ForecastEngine", "Forecasts", "JobEta", "WhatIf", "WhatIfRun", "changed_params", "eta_note",
           "params_with"]
