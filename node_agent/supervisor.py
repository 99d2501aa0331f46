"""The worker supervisor: converges this server's worker processes to the accepted desired state.

Nouns (records, shim, state file: see ``node_agent.workers``; how a worker is set up before it starts:
``node_agent.launch``): the *reconciler* is one thread that,
on every accepted desired state and every ``reconcile_interval_s``, (1) notes which worker
processes have exited, (2) converges, (3) sends SIGKILL to workers whose grace period is over, and
(4) saves the state file. Only that thread starts or signals processes, so neither the
desired-state watcher nor the report loop ever waits for a process; ``statuses()`` only reads.

Convergence, idempotent by worker identity ``(job_id, rank, incarnation)``:
- a desired worker with no record is started, unless a worker being stopped still holds the same
  (job, rank) or one of its GPUs: then it waits in STARTING until that one has exited;
- a live worker no longer desired is stopped (``node_agent.stopping``): a stop notice, SIGTERM to its
  process group, SIGKILL after its grace period or soon after it acknowledged the stop with a checkpoint;
- a desired worker that EXITED is not restarted (the scheduler restarts by bumping the incarnation);
  it is reported as EXITED as long as it is desired; once no longer desired, it is reported once
  more and forgotten.

How a stop proceeds, and why a short exit window after an acknowledgement: ``node_agent.stopping``.
While any worker is stopping the reconciler checks every ``STOPPING_POLL_S`` at most, so an exit or
an ack is seen within that.

Until the first desired state is accepted nothing is stopped: a restarted agent keeps the workers
it adopted from the state file running while it reconnects. Workers also keep running while the
scheduler is unreachable: the last accepted desired state stays in force. ``close()`` leaves them
running unless asked to stop them (``agent.stop_workers_on_exit``).

This module never decides what should run; it only makes it so.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog

from aryl_common.exits import describe_exit
from node_agent import contract
from node_agent.config import AgentSection, UsersSection
from node_agent.desired import DesiredStateTracker
from node_agent.identity import (
    PRIVATE_FILE_MODE,
    Identities,
    Refused,
    RunAs,
    agent_directory,
    parent_directory,
    private_directory,
    read_worker_file,
)
from node_agent.launch import (
    EXIT_CANNOT_START,
    SHIM,
    STOP_SIGNALS,
    install_shim,
    log_header,
    not_found_hint,
    open_log,
    signals_blocked,
    worker_environment,
    working_directory,
)
from node_agent.stopping import WorkerStopper
from node_agent.workers import (
    Phase,
    StateFileError,
    WorkDir,
    Worker,
    WorkerId,
    WorkerSpec,
    WorkerView,
    desired_specs,
    load_state,
    parse_exit_record,
    process_start_ticks,
    resolve_launch,
    save_state,
)

STOPPING_POLL_S = 0.1  # the reconciler's longest wait while a worker is stopping (module doc)


class Supervisor(WorkerStopper):
    """Runs the desired workers of one server (module doc). ``start()`` adopts what a previous
    agent left and starts the reconciler; ``wake()`` after accepting a desired state; ``close()``."""

    def __init__(
        self, config: AgentSection, desired: DesiredStateTracker, *, clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic, on_change: Callable[[], None] | None = None,
        users: UsersSection | None = None,
    ) -> None:
        self.layout = WorkDir(config.work_path, config.checkpoint_path)
        # Who workers run as, their environment (node_agent.identity); a bad map file stops the agent here.
        self.identities = Identities(users)
        self._config = config
        self._desired = desired
        # Wall time only for what people read (log headers, start times); grace deadlines run on the
        # monotonic clock, so a wall-clock jump neither SIGKILLs a checkpointing worker early nor
        # leaves a stuck one running for as long as the clock went back.
        self._clock = clock
        self._monotonic = monotonic
        self._workers: dict[WorkerId, Worker] = {}
        self._popens: dict[WorkerId, subprocess.Popen[bytes]] = {}  # shims this agent started
        self._progress: dict[WorkerId, contract.Progress] = {}  # last progress read, per worker
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        self._observed_generation = 0
        self._dirty = False
        self._save_failing = False  # the last save failed (logged once until one succeeds)
        # Called (outside the lock) after a pass that converged to a new generation or saw a worker
        # exit, so the agent reports at once instead of at its next interval: a reclaim waits for it.
        self._on_change = on_change
        self._exits_seen = 0
        self._shim = SHIM  # until ``start`` installs the copy workers run
        # The shim's interpreter: one the workers' uids can run (``Identities.shim_python``), chosen at ``start``.
        self._python = sys.executable
        self._log = structlog.get_logger("node_agent.supervisor").bind(hostname=config.hostname)

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    def start(self) -> None:
        """Create the work directory, adopt the workers of a previous agent, start the reconciler."""
        for directory in (self.layout.run_dir, self.layout.root / "jobs", self.layout.root / "logs",
                          self.layout.checkpoint_root):
            parent_directory(directory)  # 0711: each worker reaches its own directory, lists no other
        self._shim = install_shim(self.layout.root)
        self._python, warning = self.identities.shim_python()
        if warning is not None:
            self._log.warning(warning)
        elif self._python != sys.executable:
            self._log.info("worker shims run on an interpreter every uid can reach", python=self._python)
        if self.layout.state_file.exists():
            os.chmod(self.layout.state_file, PRIVATE_FILE_MODE)  # one saved by an older agent
        self._adopt()
        self.reconcile()
        self._thread = threading.Thread(target=self._reconcile_forever, name="worker-reconciler", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A new desired state was accepted: reconcile now rather than at the next tick."""
        self._wake.set()

    def close(self, *, stop_workers: bool = False) -> None:
        """End the reconciler. Workers keep running (a successor adopts them) unless ``stop_workers``:
        then they are stopped with their grace periods, and this returns once all have exited."""
        self._closing.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        if stop_workers:
            self._stop_all()
        with self._lock:
            self._save_or_warn()
        self._log.info(
            "worker supervisor closed",
            workers_left_running=sum(w.live for w in self._workers.values()),
        )

    @property
    def observed_generation(self) -> int:
        """The newest desired generation this server has converged to: its workers started and every
        worker it no longer wants has exited (not merely been signalled). The scheduler waits for this
        before it gives a reclaimed server back to inference."""
        with self._lock:
            return self._observed_generation

    # ---------------------------------------------------------------------------------------------
    # what the report loop reads

    def statuses(self) -> list[WorkerView]:
        """Every worker still desired, live, or exited but not reported yet; marks the exits reported."""
        with self._lock:
            views = [self._view(worker) for worker in sorted(self._workers.values(), key=lambda w: w.id)]
            for worker in self._workers.values():
                worker.reported_exit = worker.phase is Phase.EXITED
        return views

    def _view(self, worker: Worker) -> WorkerView:
        progress = contract.parse_progress(read_worker_file(self.layout.progress_file(worker.id)))
        if progress is not None:
            self._progress[worker.id] = progress
        return WorkerView(
            id=worker.id,
            phase=worker.phase,
            exit_code=worker.exit_code,
            message=worker.message,
            stop_requested=worker.stop_requested,
            progress=self._progress.get(worker.id, contract.Progress()),
            cannot_start=worker.cannot_start,
            ack=self._read_ack(worker),
            stop_acknowledged=worker.stop_acked_at > 0,
        )

    # ---------------------------------------------------------------------------------------------
    # the reconciler

    def _reconcile_forever(self) -> None:
        while not self._closing.is_set():
            with self._lock:
                stopping = any(w.phase is Phase.STOPPING for w in self._workers.values())
            interval = self._config.reconcile_interval_s
            self._wake.wait(min(interval, STOPPING_POLL_S) if stopping else interval)
            self._wake.clear()
            if self._closing.is_set():
                break
            try:
                self.reconcile()
            except Exception:  # noqa: BLE001 - a bug must not end supervision of running workers
                self._log.exception("reconciling workers failed; retrying at the next tick")

    def reconcile(self) -> None:
        """One pass (module doc). Called by the reconciler thread; tests may call it directly."""
        with self._lock:
            before = (self._observed_generation, self._exits_seen)
            # Read under the lock: a pass must never act on a state older than one already acted on.
            state = self._desired.latest
            self._note_exits()
            if state is not None:
                self._converge(desired_specs(state, self._config.stop_grace_s))
                if not any(w.phase is Phase.STOPPING for w in self._workers.values()):
                    self._observed_generation = state.generation
            self._escalate()
            if self._dirty:
                self._save_or_warn()
            changed = (self._observed_generation, self._exits_seen) != before
        if changed and self._on_change is not None:
            self._on_change()

    def _converge(self, desired: dict[WorkerId, WorkerSpec]) -> None:
        for worker in list(self._workers.values()):
            if worker.id not in desired:
                self._retire(worker)
        for spec in desired.values():
            current = self._workers.get(spec.id)
            if current is None:
                current = self._workers[spec.id] = Worker(spec)
            elif current.spec.batch != spec.batch:
                self._rebatch(current, spec)
            if current.phase is Phase.STARTING:
                self._start_when_free(current)

    def _retire(self, worker: Worker) -> None:
        """``worker`` is no longer desired: stop it, or forget it once its exit has been reported."""
        if worker.phase is Phase.RUNNING:
            self._stop(worker)
        elif worker.phase is Phase.STARTING or (worker.phase is Phase.EXITED and worker.reported_exit):
            self._forget(worker)

    def _rebatch(self, worker: Worker, desired: WorkerSpec) -> None:
        """The scheduler changed only ``worker``'s batch: no restart (``node_agent.contract``, why), the
        record takes the new batch and a live worker's batch file is rewritten; one not started yet
        gets it in its environment."""
        worker.spec = replace(worker.spec, local_batch_size=desired.local_batch_size, accum_steps=desired.accum_steps)
        self._dirty = True
        if worker.live:
            self._write_batch(worker.spec)
            self._log.info("batch changed in place", worker=str(worker.id), local_batch_size=desired.local_batch_size,
                           accum_steps=desired.accum_steps)

    def _write_batch(self, spec: WorkerSpec) -> None:
        """``ARYL_BATCH_FILE`` for ``spec`` (a job with batch limits); a failure is logged: the worker
        keeps the batch it runs, and reports it."""
        batch = spec.batch
        if batch is None:
            return
        try:
            contract.write_batch(self.layout.batch_file(spec.id), batch)
        except OSError as exc:
            self._log.warning("cannot write the batch file", worker=str(spec.id), error=str(exc))

    def _start_when_free(self, worker: Worker) -> None:
        blocker = self._blocker(worker.spec)
        if blocker is None:
            self._launch(worker)
        else:
            worker.message = f"waiting for worker {blocker.id} to exit"

    def _blocker(self, spec: WorkerSpec) -> Worker | None:
        """A worker being stopped that holds ``spec``'s (job, rank) or one of its GPUs. (Live workers
        that are not desired are all STOPPING once ``_retire`` ran.)"""
        gpus = set(spec.gpu_indices)
        for other in self._workers.values():
            same_rank = (other.id.job_id, other.id.rank) == (spec.id.job_id, spec.id.rank)
            if other.phase is Phase.STOPPING and (same_rank or gpus & set(other.spec.gpu_indices)):
                return other
        return None

    # ---------------------------------------------------------------------------------------------
    # processes

    def _launch(self, worker: Worker) -> None:
        """Start ``worker``'s shim; a worker that cannot start is EXITED with status 127 and a reason."""
        spec, log = worker.spec, self._log.bind(worker=str(worker.id))
        self._dirty = True
        worker.started_at = self._clock()
        problem = "the desired state gives no job id" if not spec.id.job_id else ""
        problem = problem or ("the desired state gives no command" if not spec.command else "")
        try:
            run_as = RunAs(spec.user) if problem else self.identities.resolve(spec.user)
        except Refused as exc:  # its owner: the job fails, no restart
            self._refuse_start(worker, str(exc))
            return
        cwd, note = working_directory(spec, self.layout, self._config.hostname, run_as)
        if cwd is None and not problem:
            self._refuse_start(worker, note)
            return
        popen = None
        try:
            if not problem and cwd is not None:
                env = worker_environment(spec, self.layout, os.environ, self._config.agent_address, self.identities,
                                         self._config.secrets_file)
                popen = self._spawn(spec, cwd, note, run_as, env)
        except Refused as exc:  # for a reason in its spec (its owner, its env): the job fails, no restart
            self._refuse_start(worker, str(exc))
            return
        except OSError as exc:
            problem = str(exc)
        if popen is None:
            worker.exited(EXIT_CANNOT_START, f"cannot start the worker: {problem}")
            log.error("worker not started", reason=problem)
            return
        self._popens[spec.id] = popen
        worker.pid, worker.start_ticks = popen.pid, process_start_ticks(popen.pid)
        worker.phase, worker.message = Phase.RUNNING, ""
        log.info(
            "worker started",
            pid=popen.pid,
            world_size=spec.world_size,
            gpus=list(spec.gpu_indices),
            command=shlex.join(spec.command),
            cwd=str(cwd),
            log_file=str(self.layout.log_file(spec.id.job_id, spec.id.rank)),
        )

    def _refuse_start(self, worker: Worker, why: str) -> None:
        """``worker`` cannot start here for a reason in its spec: EXITED, ``cannot_start`` (the job
        fails rather than restarting into the same refusal), and its log says why."""
        spec = worker.spec
        worker.exited(EXIT_CANNOT_START, why)
        worker.cannot_start = True
        self._log.error("worker not started", worker=str(worker.id), reason=why)
        try:
            log_path = self.layout.log_file(spec.id.job_id, spec.id.rank)
            agent_directory(log_path.parent)
            with open_log(log_path) as output:
                output.write(log_header(spec, self._clock()).encode())
                output.write(f"===== aryl-agent on {self._config.hostname}: not started: {why}\n".encode())
        except OSError as exc:
            self._log.warning("cannot write the worker's log", worker=str(worker.id), error=str(exc))

    def _spawn(
        self, spec: WorkerSpec, cwd: Path, note: str, run_as: RunAs, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        """Prepare the worker's directories (``node_agent.identity``: private to ``run_as``) and log,
        then start the shim as ``run_as``, leading a new session in ``cwd``; ``note`` (if any) goes to
        the log under the header."""
        exit_file = self.layout.exit_file(spec.id)
        for directory in (exit_file.parent, self.layout.checkpoint_dir(spec.id.job_id),
                          self.layout.job_dir(spec.id.job_id)):
            private_directory(directory, run_as)
        exit_file.unlink(missing_ok=True)
        self._write_batch(spec)
        log_path = self.layout.log_file(spec.id.job_id, spec.id.rank)
        agent_directory(log_path.parent)
        switch: dict[str, object] = {}
        if run_as.switches:  # no supplementary groups of the agent's either
            switch = {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}
        python = self._python
        with open_log(log_path) as output:
            output.write(log_header(spec, self._clock()).encode())
            if note:
                output.write(f"===== aryl-agent on {self._config.hostname}: {note}\n".encode())
            output.flush()
            # Write-ahead: the worker is on disk as launching before its shim exists, so a successor of
            # an agent killed right after the spawn adopts the shim instead of starting it twice. A
            # worker that cannot be recorded (a full disk) is not started: OSError, "cannot start".
            self._save()
            self._dirty = True  # what the spawn leads to is saved at the end of the pass
            with signals_blocked(STOP_SIGNALS):  # inherited: the shim unblocks them when it can relay
                return subprocess.Popen(  # type: ignore[call-overload]
                    [python, "-I", str(self._shim), "--exit-file", str(exit_file), "--", *spec.command],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,  # the shim leads a new process group: stopping reaches the tree
                    **switch,
                )

    def _note_exits(self) -> None:
        for worker in self._workers.values():
            if worker.live and not self._process_alive(worker):
                self._record_exit(worker)

    def _record_exit(self, worker: Worker) -> None:
        """The shim of ``worker`` is gone: take the exit status it recorded and say what happened."""
        popen = self._popens.pop(worker.id, None)
        recorded = parse_exit_record(read_worker_file(self.layout.exit_file(worker.id)))
        if recorded is not None:
            exit_code, message = recorded[0], recorded[1] or describe_exit(recorded[0])
        else:
            # Only a signal the shim does not handle (SIGKILL, mostly) ends it without a record; its
            # command's processes may remain.
            exit_code = popen.returncode if popen is not None and popen.returncode < 0 else -signal.SIGKILL
            message = f"the worker's shim was {describe_exit(exit_code)} before it recorded an exit status"
            if not worker.killed:
                self._kill_group(worker)
        if worker.stop_requested and not worker.stop_acked_at:
            self._take_ack(worker, self._monotonic())  # it acknowledged, then exited before the next pass
        if worker.stop_acked_at:
            acked = f"it acknowledged its checkpoint at progress {worker.acked_progress:g}"
            early = f"(before its {worker.spec.grace_s:g} s grace period ended)"
            message = (f"stopped by the agent (SIGTERM): {acked}, then SIGKILL "
                       f"{self._config.ack_exit_window_s:g} s later {early}" if worker.killed
                       else f"stopped by the agent (SIGTERM): {message}; {acked} {early}")
        elif worker.killed:
            message = f"killed with SIGKILL after the {worker.spec.grace_s:g} s grace period"
        elif worker.stop_requested:
            message = f"stopped by the agent (SIGTERM): {message}"
        elif exit_code == EXIT_CANNOT_START:
            message = f"{message}; {not_found_hint(worker.spec, self.identities.section.path)}"
        worker.exited(exit_code, message)
        self._exits_seen += 1
        self._dirty = True
        self._log.info("worker exited", worker=str(worker.id), exit_code=exit_code, why=message)

    def _stop_all(self) -> None:
        """Stop every live worker (grace, then SIGKILL) and wait until all have exited."""
        self._log.info("stopping all workers before the agent exits")
        while True:
            with self._lock:
                self._note_exits()
                for worker in self._workers.values():
                    if worker.phase is Phase.RUNNING:
                        self._stop(worker)
                self._escalate()
                if not any(w.live for w in self._workers.values()):
                    return
            time.sleep(min(0.1, self._config.reconcile_interval_s))

    # ---------------------------------------------------------------------------------------------
    # the state file

    def _adopt(self) -> None:
        """Take over the records a previous agent saved; live workers keep running, their exits
        are noted at the next pass (from the shim's exit file)."""
        try:
            records = load_state(self.layout.state_file)
        except StateFileError as exc:
            aside = self.layout.state_file.with_suffix(f".unreadable-{int(self._clock())}")
            self.layout.state_file.replace(aside)
            self._log.error("state file unreadable: moved aside, workers of the previous agent not adopted",
                            reason=str(exc), moved_to=str(aside))
            return
        latest_deadline = self._monotonic()
        with self._lock:
            for worker in records:
                if worker.launching:
                    resolve_launch(worker, self.layout.exit_file(worker.id))
                # A deadline beyond a whole grace period from now is not one of this boot's monotonic
                # clock (a state file from an agent that stored wall time): the grace starts over.
                if worker.phase is Phase.STOPPING:
                    worker.stop_deadline = min(worker.stop_deadline, latest_deadline + worker.spec.grace_s)
                self._workers[worker.id] = worker
                alive = worker.live and self._process_alive(worker)
                self._log.info(
                    "adopted worker" if alive else "found worker of the previous agent",
                    worker=str(worker.id),
                    phase=worker.phase.value,
                    pid=worker.pid,
                    running=alive,
                )

    def _forget(self, worker: Worker) -> None:
        del self._workers[worker.id]
        self._progress.pop(worker.id, None)
        self._popens.pop(worker.id, None)
        self._dirty = True
        if worker.phase is Phase.EXITED:
            last_of_job = not any(other.id.job_id == worker.id.job_id for other in self._workers.values())
            self.layout.batch_file(worker.id).unlink(missing_ok=True)
            self.layout.forget(worker.id, last_of_job=last_of_job)

    def _save(self) -> None:
        """Persist every record with a process or an exit, and the launching ones (pending STARTING
        ones are re-derived from the desired state)."""
        workers = [w for w in self._workers.values() if w.phase is not Phase.STARTING or w.launching]
        save_state(self.layout.state_file, workers)
        self._dirty = False
        if self._save_failing:
            self._save_failing = False
            self._log.info("state file saved again", path=str(self.layout.state_file))

    def _save_or_warn(self) -> None:
        """``_save``; a failure (a full disk, a read-only filesystem) is logged once and retried at the
        next pass while supervision and reports go on: only a restarted agent would miss the changes
        since the last save (and no worker starts unrecorded: ``_spawn`` saves first)."""
        try:
            self._save()
        except OSError as exc:
            if not self._save_failing:
                self._log.error("cannot save the state file; retrying at every pass", path=str(self.layout.state_file),
                                reason=str(exc))
            self._save_failing = True
