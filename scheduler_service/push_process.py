"""The agents' desired-state streams in a process of their own, so that a push never waits for the
scheduler's interpreter lock (its cycles, group commits and status reports; issue 35 item 2).

Nouns:
- The *push process* (``aryl-pushes``, a child of the scheduler) serves ``WatchDesiredState`` alone
  (``api.agent_servicer.DesiredStateStreams``), with the scheduler's TLS and identities, on a port of its own
  on the scheduler's host. ``RegisterServer`` names that port in its initial metadata
  (``api.agent_servicer.DESIRED_STATE_PORT_KEY``); an agent that knows the key watches there, one that does
  not watches the scheduler itself, which still serves the stream.
- The *feed* is a socket from the scheduler to it. After each commit the desired states read inside the
  committing transaction go down it as they are, sent by the committing thread itself (``desired_states_committed``:
  no hop to another thread or to the event loop); servers whose state changed without being read there
  (``desired_state_changed``) are re-read by the push process from the database. It reads nothing else and
  writes nothing: each read takes the newest term's epoch (``store.desired.newest_epoch``), so any replica's
  push process could serve the streams. A state never replaces a newer generation. Since every commit's
  change reaches it down the feed (and a new push process reads each stream's state when it starts), its
  streams re-read their state only every ``FED_REFRESH_S`` or ``agents.desired_state_refresh_s``, whichever
  is longer (``notify.DesiredStateFeed``): those re-reads took a third of its interpreter at 1,000 agents,
  and a change-driven read waited behind them.
- On PostgreSQL any replica's push process may serve the streams: a standby's follows the leader's commits on
  the change feed (``store.change_feed``: each bumped server's new generation, notified by the bumping
  statement and delivered at commit) and re-reads the watched servers it holds at an older generation. The leader
  names a live standby's to the agents that register (``app.replicas``: its address is in the registry of
  replicas, beaten on the lease thread), its own as their fallback. Its
  scheduler tells it whether it leads (``PushFeed.leading``): while it does, the notices (its own commits,
  which come down the feed already) are ignored.
- The *supervisor* (a thread of the scheduler) starts it again, on the same port, whenever it dies; its
  streams end with it (the agents watch again and are sent the current state first). A push process whose
  feed stops being read (``MAX_BACKLOG`` frames behind) is ended and started again the same way. It ends
  itself when the scheduler's end of the feed closes (the scheduler stopped or died).

Never: decide or write anything, nor block the committing thread (a frame that does not fit in the socket
waits in a backlog that a thread of its own sends).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import pickle
import select
import signal
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from aryl_common.backoff import Backoff
from protos.aryl.v1 import agent_pb2_grpc
from scheduler_service.api.agent_servicer import DesiredStateStreams
from scheduler_service.app.notices import Notifier
from scheduler_service.config import SchedulerConfig
from scheduler_service.grpc_server import bind_server
from scheduler_service.notify.desired_states import DesiredStateFeed
from scheduler_service.records import DesiredServerState
from scheduler_service.store.change_feed import follow_desired_notices
from scheduler_service.store.db import create_engine_for, session_factory
from scheduler_service.store.desired import DesiredStates
from scheduler_service.store.transactions import Transactions

log = structlog.get_logger("aryl.pushes")

_HEADER = struct.Struct("!I")  # each frame: its length, then a pickled (kind, payload)
MAX_BACKLOG = 10_000  # frames waiting to be sent: a push process this far behind is not reading; it is restarted
START_TIMEOUT_S = 120.0  # a push process that does not serve by then is ended and started again
RESTART_BACKOFF_MAX_S = 10.0
STOP_TIMEOUT_S = 10.0
FED_REFRESH_S = 300.0  # the streams' safety re-read where the feed tells every change (see the module's docstring)


def _frame(kind: str, payload: Any) -> bytes:
    data = pickle.dumps((kind, payload), protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class PushFeed:
    """The scheduler's end of the feed (see the module's docstring). ``send_*`` may be called from any
    thread; they never block on the push process: the frame goes straight into the socket, or, when that
    would block (or a backlog waits already, to keep the order), into the backlog."""

    def __init__(self, on_stuck: Any = None) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._backlog: deque[bytes] = deque()
        self._sending = False  # the sender thread holds a frame taken from the backlog
        self._wake = threading.Condition(self._lock)
        self._closed = False
        self._on_stuck = on_stuck  # called (once per push process) when the backlog overflows
        self._leads: bool | None = None  # whether the scheduler leads, as last told (``leading``)
        self.sent = 0  # frames sent (tests, metrics)
        self._sender = threading.Thread(target=self._send_backlog, name="aryl-push-feed", daemon=True)
        self._sender.start()

    def attach(self, sock: socket.socket | None) -> None:
        """Feed ``sock`` (a new push process) from now on; what waited for the old one is dropped (the new
        one reads every watched server's state when its streams start)."""
        with self._lock:
            if sock is not None:
                sock.setblocking(False)
            self._sock = sock
            self._backlog.clear()
            leads = self._leads
        if sock is not None and leads is not None:
            self._send(_frame("leading", leads))  # a new push process is told the role first

    def leading(self, leads: bool) -> None:
        """Tell the push process whether its scheduler leads (its commits come down this feed) or not (it follows
        the leader's on the change feed, ``store.change_feed``); told again to each new push process."""
        with self._lock:
            self._leads = leads
        self._send(_frame("leading", leads))

    def states_committed(self, states: Mapping[str, DesiredServerState]) -> None:
        if states:
            self._send(_frame("states", dict(states)))

    def changed(self, server_ids: Iterable[str]) -> None:
        ids = tuple(server_ids)
        if ids:
            self._send(_frame("changed", ids))

    def _send(self, frame: bytes) -> None:
        stuck = None
        with self._lock:
            sock = self._sock
            if sock is None or self._closed:
                return
            if not self._backlog and not self._sending:
                try:
                    sent = sock.send(frame)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    return  # the push process is gone: the supervisor starts another, which reads afresh
                self.sent += 1
                if sent == len(frame):
                    return
                frame = frame[sent:]
            self._backlog.append(frame)
            if len(self._backlog) > MAX_BACKLOG:
                self._backlog.clear()
                self._sock = None  # nothing more for it: it is ended and another started
                stuck = sock
            self._wake.notify()
        if stuck is not None and self._on_stuck is not None:
            self._on_stuck()

    def _send_backlog(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not (self._backlog and self._sock is not None):
                    self._wake.wait()
                if self._closed:
                    return
                sock, frame = self._sock, self._backlog.popleft()
                self._sending = True
            try:
                assert sock is not None
                view = memoryview(frame)
                while view:
                    select.select([], [sock], [], 1.0)
                    try:
                        view = view[sock.send(view):]
                    except BlockingIOError:
                        continue
            except (OSError, ValueError):
                pass  # the push process is gone (or replaced): its successor reads afresh
            finally:
                with self._lock:
                    self._sending = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._sock = None
            self._backlog.clear()
            self._wake.notify_all()
        self._sender.join(timeout=STOP_TIMEOUT_S)


class FeedingNotifier:
    """The scheduler's ``Notifier`` (``app.notices``) with the push process fed too: desired states go down
    the feed first (the faster way to the agents), then to ``inner`` (the streams this process serves)."""

    def __init__(self, inner: Notifier, feed: PushFeed) -> None:
        self._inner = inner
        self._feed = feed

    def events_appended(self) -> None:
        self._inner.events_appended()

    def desired_state_changed(self, server_ids: Iterable[str]) -> None:
        ids = tuple(server_ids)
        self._feed.changed(ids)
        self._inner.desired_state_changed(ids)

    def desired_states_committed(self, states: Mapping[str, DesiredServerState]) -> None:
        self._feed.states_committed(states)
        self._inner.desired_states_committed(states)

    def cycle_requested(self) -> None:
        self._inner.cycle_requested()

    def jobs_queued(self) -> None:
        self._inner.jobs_queued()


class PushProcess:
    """Starts the push process, feeds it (``feed``) and starts it again whenever it dies (the supervisor).

    ``host`` is where it listens (the scheduler's listen host), on the port given (``server.desired_state_port``;
    0: the first start takes a free port, every later one the same). The attribute ``port`` is None while no
    push process serves (before the first start, between a death and the next start): ``RegisterServer`` then
    names none, and agents watch the scheduler itself."""

    def __init__(self, config: SchedulerConfig, host: str, port: int = 0) -> None:
        self._config = config
        self._host = host
        self._ctx = mp.get_context("spawn")  # never fork a process that has started gRPC
        self.feed = PushFeed(on_stuck=self._stuck)
        self.port: int | None = None
        self._bound = port  # the port every start binds (0 before a first start on any free port)
        self._proc: Any = None
        self._stop = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.starts = 0  # push processes started (tests, metrics)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> int:
        """Start the push process and its supervisor; returns its port once it serves (raises if it does not)."""
        self._start_one()
        self._supervisor = threading.Thread(target=self._supervise, name="aryl-push-supervisor", daemon=True)
        self._supervisor.start()
        assert self.port is not None
        return self.port

    def _start_one(self) -> None:
        ours, theirs = socket.socketpair()
        proc = self._ctx.Process(target=_child_main, args=(self._config, theirs, self._host, self._bound),
                                 name="aryl-pushes", daemon=True)
        try:
            proc.start()
        finally:
            theirs.close()
        self._proc = proc
        self.starts += 1
        try:
            port = _read_ready(ours, proc, START_TIMEOUT_S)
        except BaseException:
            ours.close()
            _end(proc)
            raise
        self._bound = port
        self.feed.attach(ours)
        self.port = port
        log.info("desired-state streams served by their own process", pid=proc.pid, port=port)

    def _supervise(self) -> None:
        backoff = Backoff(RESTART_BACKOFF_MAX_S, initial_s=0.2)
        while not self._stop.is_set():
            proc = self._proc
            proc.join(timeout=1.0)
            if proc.is_alive() or self._stop.is_set():
                continue
            self.port = None
            self.feed.attach(None)
            log.error("the desired-state streams' process died; starting another (agents watch again)",
                      pid=proc.pid, exitcode=proc.exitcode)
            while not self._stop.is_set():
                try:
                    self._start_one()
                    backoff.reset()
                    break
                except Exception as exc:  # noqa: BLE001 - logged, and tried again
                    delay = backoff.next_delay()
                    log.error("the desired-state streams' process did not start; trying again",
                              error=repr(exc), retry_in_s=delay)
                    self._stop.wait(delay)

    def _stuck(self) -> None:
        """Its feed's backlog overflowed: end it; the supervisor starts another."""
        proc = self._proc
        log.error("the desired-state streams' process stopped reading its feed; ending it", pid=proc.pid)
        proc.kill()

    def close(self) -> None:
        """End the supervisor, then the push process (its streams end; agents watch the scheduler again)."""
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.join(timeout=STOP_TIMEOUT_S)
        self.port = None
        self.feed.close()
        if self._proc is not None:
            _end(self._proc)


def _read_ready(sock: socket.socket, proc: Any, timeout_s: float) -> int:
    """The port the new push process serves on, from its one frame back; raises when it dies or does not
    serve within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the desired-state streams' process did not serve within {timeout_s:.0f}s")
        ready, _, _ = select.select([sock, proc.sentinel], [], [], min(left, 1.0))
        if sock in ready:
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"the desired-state streams' process exited (code {proc.exitcode}) before serving")
            data += chunk
            if len(data) >= _HEADER.size:
                (size,) = _HEADER.unpack_from(data)
                if len(data) >= _HEADER.size + size:
                    kind, port = pickle.loads(data[_HEADER.size:_HEADER.size + size])
                    if kind != "serving":
                        raise RuntimeError(f"the desired-state streams' process failed to start: {port}")
                    return int(port)
        elif proc.sentinel in ready and not proc.is_alive():
            raise RuntimeError(f"the desired-state streams' process exited (code {proc.exitcode}) before serving")


def _end(proc: Any) -> None:
    if proc.is_alive():
        proc.terminate()  # SIGTERM: it stops serving, its streams end
        proc.join(timeout=STOP_TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()


# ---------------------------------------------------------------------------------------------
# The push process itself


def _child_main(config: SchedulerConfig, sock: socket.socket, host: str, port: int) -> None:
    from aryl_common.logs import configure_logging  # the child's own logging, as the scheduler's

    configure_logging(config.logging.format, config.logging.level)
    try:
        asyncio.run(_serve(config, sock, host, port))
    except BaseException as exc:
        try:
            sock.setblocking(True)
            sock.sendall(_frame("failed", repr(exc)))
        except OSError:
            pass
        raise


async def _serve(config: SchedulerConfig, sock: socket.socket, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    db = config.database
    engine = create_engine_for(db.url, statement_timeout_ms=db.statement_timeout_ms,
                               lock_timeout_ms=db.lock_timeout_ms, transaction_timeout_ms=db.transaction_timeout_ms,
                               pool_size=2)
    reads = Transactions(session_factory(engine), publish=lambda states: None)
    desired = DesiredStates(epoch=None)  # the newest term's, read with each state
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aryl-pushes-read")
    feed: DesiredStateFeed[DesiredServerState] = DesiredStateFeed(
        loop, lambda ids: reads.read(lambda session: desired.read(session, sorted(set(ids)))), reader,
        generations=lambda ids: reads.read(lambda session: desired.generations(session, sorted(set(ids)))))
    server, bound = bind_server(config, None, listen=f"{host}:{port}")
    agent_pb2_grpc.add_AgentServiceServicer_to_server(
        DesiredStateStreams(feed, refresh_s=max(FED_REFRESH_S, config.agents.desired_state_refresh_s),
                            grace_period_s=config.scheduling.default_grace_period_s), server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await server.start()
    await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    reader_stream, writer = await asyncio.open_connection(sock=sock)
    writer.write(_frame("serving", bound))
    await writer.drain()
    role = _Role()
    feeding = asyncio.create_task(_follow(reader_stream, feed, role))
    noticing = None
    if engine.dialect.name == "postgresql":  # a standby's streams follow the leader's commits there

        def noticed(generations: Mapping[str, int]) -> None:
            if not role.leads:
                feed.noticed(generations)

        def missed() -> None:
            if not role.leads:
                feed.reread_watched()

        noticing = asyncio.create_task(follow_desired_notices(engine, noticed, missed, stop))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait((feeding, stopping), return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    if noticing is not None:
        noticing.cancel()
    if feeding.done() and feeding.exception() is not None:
        log.error("the desired-state feed failed", error=repr(feeding.exception()))
    feeding.cancel()
    await server.stop(config.server.shutdown_grace_s)
    writer.close()
    reader.shutdown(wait=False, cancel_futures=True)
    engine.dispose()
    os._exit(0)  # nothing left to flush; gRPC's threads need not be waited for


class _Role:
    """Whether the push process's scheduler leads: its commits come down the feed, and the change feed's
    notices (the same commits) are ignored; else (a standby) the notices tell the leader's. Leading until told
    otherwise: on SQLite there are no notices, and a standby is told at once."""

    leads = True


async def _follow(stream: asyncio.StreamReader, feed: DesiredStateFeed[DesiredServerState], role: _Role) -> None:
    """Hand each frame of the feed to ``feed`` until the scheduler's end closes."""
    while True:
        try:
            header = await stream.readexactly(_HEADER.size)
            (size,) = _HEADER.unpack(header)
            kind, payload = pickle.loads(await stream.readexactly(size))
        except asyncio.IncompleteReadError:
            log.info("the scheduler closed the desired-state feed; stopping")
            return
        if kind == "states":
            feed.publish_threadsafe(payload)
        elif kind == "changed":
            feed.changed_threadsafe(payload)
        elif kind == "leading":
            if role.leads and not payload:
                feed.reread_watched()  # deposed: what the new leader committed before this frame was not followed
            role.leads = bool(payload)
