"""Stopping workers, a part of the supervisor (``node_agent.supervisor.Supervisor``): a worker no longer
desired gets a stop notice (``node_agent.contract.StopNotice``) in its run directory, then SIGTERM to its
shim, which relays it to the whole process group; SIGKILL to the group after its grace period, or
``ack_exit_window_s`` after the worker acknowledged this stop with a saved checkpoint, whichever comes first.

Why a short exit window after an acknowledgement rather than SIGKILL at once: the ack says the
worker's state is safe, but a worker that acks and then exits by itself (the usual SIGTERM handler:
save, ack, return) ends with its own exit status and flushed output; the window only bounds the
teardown that hangs (NCCL, data-loader processes), which is what a grace period is usually spent on.

Must never decide which worker to stop (the reconciler does: ``Supervisor._retire``, ``_stop_all``), start
one, or take the supervisor's lock: its callers hold it. Grace deadlines run on the monotonic clock.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from typing import Any

from node_agent import contract
from node_agent.config import AgentSection
from node_agent.identity import read_worker_file
from node_agent.workers import Phase, WorkDir, Worker, WorkerId, process_alive, process_start_ticks


class WorkerStopper:
    """The stop protocol (module doc), as a part of ``Supervisor``: ``_stop`` begins a stop, ``_escalate``
    takes acknowledgements and SIGKILLs the groups whose deadline has passed. The state it works on is the
    supervisor's, declared here and set by ``Supervisor.__init__``."""

    layout: WorkDir
    _config: AgentSection
    _clock: Callable[[], float]  # wall time: the notice's deadline, for the worker to read
    _monotonic: Callable[[], float]  # grace deadlines
    _workers: dict[WorkerId, Worker]
    _popens: dict[WorkerId, subprocess.Popen[bytes]]  # shims this agent started
    _dirty: bool
    _log: Any  # the supervisor's bound structlog logger

    def _read_ack(self, worker: Worker) -> contract.CheckpointAck | None:
        """``worker``'s checkpoint acknowledgement, if it wrote one as this incarnation (the file is per
        incarnation already; the field guards against one copied from an older incarnation)."""
        ack = contract.parse_checkpoint_ack(read_worker_file(self.layout.ack_file(worker.id)))
        return ack if ack is not None and ack.incarnation == worker.id.incarnation else None

    def _stop(self, worker: Worker) -> None:
        worker.phase, worker.stop_requested = Phase.STOPPING, True
        worker.stop_deadline = self._monotonic() + worker.spec.grace_s
        # A fresh id per stop: only an ack written after this notice (it echoes the id) ends the stop.
        worker.stop_id, worker.stop_acked_at = os.urandom(8).hex(), 0.0
        self._dirty = True
        if self._process_alive(worker):
            self._write_stop_notice(worker)  # before the signal: a SIGTERM handler finds it
        self._signal(worker, signal.SIGTERM)
        self._log.info("stopping worker (SIGTERM)", worker=str(worker.id), pid=worker.pid, grace_s=worker.spec.grace_s)

    def _write_stop_notice(self, worker: Worker) -> None:
        """The stop notice (``node_agent.contract.StopNotice``), atomically, into the worker's own
        directory: a new file under a random name (never through a link the worker planted), renamed
        over the notice. A failure only means this stop cannot be acknowledged."""
        notice = contract.StopNotice(worker.stop_id, worker.spec.grace_s, self._clock() + worker.spec.grace_s)
        try:
            contract.write_stop_notice(self.layout.stop_notice_file(worker.id), notice)
        except OSError as exc:
            self._log.warning("cannot write the stop notice: the worker cannot acknowledge this stop",
                              worker=str(worker.id), error=str(exc))

    def _escalate(self) -> None:
        """Per stopping worker: take a new acknowledgement of its stop (its deadline moves to the end
        of the exit window), then SIGKILL the group once its deadline has passed."""
        now = self._monotonic()
        for worker in self._workers.values():
            if worker.phase is not Phase.STOPPING or worker.killed:
                continue
            if not worker.stop_acked_at:
                self._take_ack(worker, now)
            if now >= worker.stop_deadline:
                worker.killed, self._dirty = True, True
                self._kill_group(worker)
                if worker.stop_acked_at:
                    self._log.info("worker acknowledged its stop and did not exit: SIGKILL to its process group",
                                   worker=str(worker.id), pid=worker.pid,
                                   exit_window_s=self._config.ack_exit_window_s)
                else:
                    self._log.warning(
                        "worker ignored SIGTERM for its grace period: SIGKILL to its process group",
                        worker=str(worker.id),
                        pid=worker.pid,
                        grace_s=worker.spec.grace_s,
                    )

    def _take_ack(self, worker: Worker, now: float) -> None:
        ack = self._read_ack(worker)
        if ack is None or not ack.answers(worker.id.incarnation, worker.stop_id):
            return  # none, or one written before this stop's notice: the grace period runs on
        worker.stop_acked_at, worker.acked_progress, self._dirty = now, ack.checkpoint_progress, True
        worker.stop_deadline = min(worker.stop_deadline, now + self._config.ack_exit_window_s)
        self._log.info("worker acknowledged its stop: checkpoint saved, stopping it now", worker=str(worker.id),
                       checkpoint_progress=ack.checkpoint_progress,
                       grace_left_s=round(worker.stop_deadline - now, 3))

    def _signal(self, worker: Worker, signum: signal.Signals) -> None:
        if self._process_alive(worker):
            try:
                os.kill(worker.pid, signum)
            except ProcessLookupError:
                pass  # exited meanwhile; noted at the next pass

    def _kill_group(self, worker: Worker) -> None:
        """SIGKILL to the worker's process group (the shim's pid), unless that pid now names another
        process: a group that still has members keeps its id from being reused, so then it is gone."""
        if worker.pid <= 0 or (not self._process_alive(worker) and process_start_ticks(worker.pid) is not None):
            return
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already

    def _process_alive(self, worker: Worker) -> bool:
        if worker.pid <= 0:  # never spawned (or a damaged record): pid 0 would mean the agent's own group
            return False
        popen = self._popens.get(worker.id)
        if popen is not None:
            return popen.poll() is None
        return process_alive(worker.pid, worker.start_ticks)
