"""HAProxy as the router's data plane: its configuration, its process, its runtime API and its statistics.

Every inference request goes through HAProxy; the router only programs it and reads it. Nouns:

- *slot*: one ``server`` line of the ``aryl_pool`` backend, made by ``server-template slot 1-N``
  (``router.haproxy_slots``). A free slot is in maintenance (``MAINT``); a slot holding a backend has its
  address (``set server aryl_pool/slotK addr IP port P``) and its state: ``ready`` (the backend is
  SERVING), ``drain`` (DRAINING: no new request, the ones in flight finish). A backend leaving the pool
  puts its slot back in maintenance (requests in flight there still finish). Slots, not ``add server``:
  a dynamic server can only be deleted once it holds no connection at all, idle keep-alive ones
  included, so a removal would have to be retried; a slot is freed by one command.
- *runtime API*: HAProxy's stats socket (a Unix socket, ``level admin``), one command per connection.
- *stats sample*: one ``show stat``, parsed into ``StatSample`` -- the pool backend's counters (requests,
  queue, HAProxy's own 5xx answers, the average times of its last 1,024 requests) and each slot's
  (sessions in flight, queued, dispatched, failed, UP/DOWN/DRAIN/MAINT).
- ``HaproxyPlane``: starts HAProxy (``haproxy -f CONFIG -db``, a child process of the router), restarts
  it if it dies (``run``), reconciles the slots with the backends the router wants (``program``), samples
  its statistics (``sample``) and says when a draining backend has nothing left in flight (``wait_idle``).

Requests for ``/aryl/...`` go to the router's own HTTP server (``aryl_control``), so its stats and health
endpoints stay on the proxy's address. A request that found no routable server gets HAProxy's 503
with a JSON body (``no_backend_available``); a connection that could not be opened is retried on another
server (``retries`` = ``router.max_attempts`` - 1, ``option redispatch``), as the Python proxy does.

Never: decide which backend serves (the router and the scheduler do), or route a request itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import ctypes
import io
import ipaddress
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from inference_router.config import RouterSection, split_host_port

POOL_BACKEND = "aryl_pool"
CONTROL_BACKEND = "aryl_control"
FRONTEND = "aryl_in"
SLOT_PREFIX = "slot"
# Debian installs haproxy in /usr/sbin, which is not on every user's PATH.
SEARCH_DIRS = ("/usr/sbin", "/usr/local/sbin", "/sbin")
READY_TIMEOUT_S = 30.0
INSTALL_HINT = ("install it (Debian/Ubuntu: apt-get install haproxy; `make demo` and `make test` do it), set "
                "router.haproxy_binary to its path, or set router.data_plane = \"python\" for the pure-Python proxy")


class HaproxyError(Exception):
    """HAProxy could not be found, started or driven; the message says what to fix."""


class HaproxyListenError(HaproxyError):
    """HAProxy could not bind the router's listen address."""


class RuntimeApiError(HaproxyError):
    """A runtime API command failed (the socket is gone, or HAProxy refused the command)."""


def find_haproxy(binary: str) -> str:
    """The executable ``binary`` names (a path, or a name on PATH or in /usr/sbin); HaproxyError if none."""
    if os.sep in binary:
        if os.access(binary, os.X_OK):
            return binary
        raise HaproxyError(f"router.haproxy_binary {binary!r} is not an executable; {INSTALL_HINT}")
    found = shutil.which(binary) or shutil.which(binary, path=os.pathsep.join(SEARCH_DIRS))
    if found is None:
        raise HaproxyError(f"{binary!r} was not found on PATH or in {', '.join(SEARCH_DIRS)}: the router's data "
                           f"plane is HAProxy; {INSTALL_HINT}")
    return found


# -- configuration -----------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


ERROR_BODIES = {
    503: ("Service Unavailable", "no_backend_available", "no routable server in the serving pool"),
    502: ("Bad Gateway", "backend_failed", "the backend could not be reached or its answer broke"),
    504: ("Gateway Timeout", "backend_timeout", "the backend did not answer in time"),
}


def error_file(status: int) -> str:
    """HAProxy's ``errorfile`` for ``status``: a whole HTTP answer with the router's JSON error body."""
    reason, code, detail = ERROR_BODIES[status]
    body = f'{{"error": "{code}", "detail": "{detail}"}}\n'
    retry = "Retry-After: 1\r\n" if status == 503 else ""
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nCache-Control: no-cache\r\n"
            f"{retry}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}")


def render_config(config: RouterSection, *, listen: tuple[str, int], control_port: int, socket_path: Path,
                  error_dir: Path) -> str:
    """HAProxy's configuration for the router's settings (pure: the same settings give the same text)."""
    host, port = listen
    bind_host = f"[{host}]" if ":" in host else host
    check = ""
    if config.health_check_interval_s > 0:
        # Active: one failed GET health_path takes a backend out, one pass puts it back (as the Python proxy).
        # Passive: unhealthy_after_failures connection failures in a row mark it down until a check passes.
        check = (f" check inter {_ms(config.health_check_interval_s)} fall 1 rise 1"
                 f" observe layer4 error-limit {config.unhealthy_after_failures} on-error mark-down")
    errorfiles = "\n".join(f"    errorfile {status} {error_dir / f'{status}.http'}" for status in sorted(ERROR_BODIES))
    threads = f"    nbthread {config.haproxy_threads}\n" if config.haproxy_threads else ""
    return f"""# Written by aryl-router (inference_router/haproxy.py); the router programs the slots at run time.
global
{threads}    stats socket {socket_path} mode 600 level admin
    stats timeout 30s
    hard-stop-after {_ms(config.shutdown_timeout_s)}

defaults
    mode http
    option http-keep-alive
    timeout connect {_ms(config.connect_timeout_s)}
    timeout client {_ms(config.request_timeout_s)}
    timeout server {_ms(config.request_timeout_s)}
    timeout queue {_ms(config.request_timeout_s)}
    timeout http-keep-alive {_ms(config.keepalive_timeout_s)}
    timeout http-request 30s
    timeout check {_ms(config.health_check_timeout_s)}
    retries {config.max_attempts - 1}
    option redispatch 1
{errorfiles}

frontend {FRONTEND}
    bind {bind_host}:{port}
    option forwardfor
    http-request set-header X-Forwarded-Proto http
    use_backend {CONTROL_BACKEND} if {{ path_beg /aryl/ }}
    default_backend {POOL_BACKEND}

backend {CONTROL_BACKEND}
    server control 127.0.0.1:{control_port}

backend {POOL_BACKEND}
    balance leastconn
    option httpchk GET {config.health_path}
    default-server init-addr none{check}
    server-template {SLOT_PREFIX} 1-{config.haproxy_slots} 127.0.0.1:1 disabled
"""


def backend_address(endpoint: str) -> tuple[str, int]:
    """``http://HOST:PORT`` -> ``(HOST, PORT)``; ValueError for what HAProxy's slots cannot take (https, a
    path prefix, no port is port 80)."""
    parts = urlsplit(endpoint)
    if parts.scheme != "http":
        raise ValueError(f"{endpoint!r}: the HAProxy data plane routes to http:// endpoints only")
    if parts.path not in ("", "/") or parts.query:
        raise ValueError(f"{endpoint!r}: the HAProxy data plane cannot add a path prefix")
    if parts.hostname is None:
        raise ValueError(f"{endpoint!r} names no host")
    return parts.hostname, parts.port or 80


async def resolve(host: str) -> str:
    """An IP address for ``host`` (HAProxy's ``set server addr`` takes addresses only)."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    infos = await asyncio.get_running_loop().getaddrinfo(host, None, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"{host} has no address")
    return str(infos[0][4][0])


# -- runtime API -------------------------------------------------------------------------------------


class RuntimeApi:
    """HAProxy's stats socket: one command per connection, the answer read to its end."""

    def __init__(self, socket_path: Path, timeout_s: float = 10.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s

    async def command(self, line: str) -> str:
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
                try:
                    writer.write(line.encode() + b"\n")
                    await writer.drain()
                    answer = (await reader.read()).decode()
                finally:
                    writer.close()
                    with contextlib.suppress(OSError):
                        await writer.wait_closed()
        except (OSError, TimeoutError) as exc:
            raise RuntimeApiError(f"HAProxy's runtime API ({self.socket_path}) did not answer {line!r}: "
                                  f"{exc!r}") from exc
        return answer

    async def set_server(self, slot: str, change: str) -> None:
        """``set server aryl_pool/SLOT CHANGE``; RuntimeApiError when HAProxy answers anything but success."""
        answer = (await self.command(f"set server {POOL_BACKEND}/{slot} {change}")).strip()
        # ``state``: empty on success; ``addr``: "IP changed from ..." or "no need to change ...".
        if answer and "changed from" not in answer and "no need to change" not in answer:
            raise RuntimeApiError(f"HAProxy refused 'set server {POOL_BACKEND}/{slot} {change}': {answer}")


# -- statistics --------------------------------------------------------------------------------------


def _int(row: Mapping[str, str], key: str) -> int:
    value = row.get(key) or ""
    return int(value) if value.lstrip("-").isdigit() else 0


@dataclass(frozen=True)
class SlotStats:
    """One slot's counters (cumulative since HAProxy started) and state."""

    in_flight: int          # scur: requests being served there now
    queued: int             # qcur
    dispatched: int         # stot
    failures: int           # econ + eresp: connections that failed, answers that broke
    status: str             # UP, DOWN, DRAIN, MAINT, ... ("UP 1/2" while checks go)
    hrsp_5xx: int

    @property
    def up(self) -> bool:
        return self.status.startswith("UP") or self.status.startswith("DRAIN") or self.status == "no check"


@dataclass(frozen=True)
class StatSample:
    """One ``show stat``; ``taken_at``: the monotonic time the command was sent."""

    taken_at: float
    requests: int           # the pool backend's req_tot: every request for the pool, 503s included
    queued: int             # the pool backend's qcur
    in_flight: int          # the pool backend's scur
    own_errors: int         # 5xx answers HAProxy made itself (502/503/504): backend 5xx - the slots' 5xx
    retries: int            # wretr + wredis: connections retried, requests sent to another server
    responses: dict[str, int]   # answers by status class ("1xx".."5xx", "other"), from the backend
    avg_ms: dict[str, int]  # queue, connect, response, total: averages over the last 1,024 requests
    slots: dict[str, SlotStats] = field(default_factory=dict)


def parse_show_stat(text: str, taken_at: float) -> StatSample:
    """The pool backend's and its slots' rows of ``show stat`` (CSV, header ``# pxname,svname,...``)."""
    reader = csv.DictReader(io.StringIO(text.removeprefix("# ")))
    backend: dict[str, str] | None = None
    slots: dict[str, SlotStats] = {}
    for row in reader:
        if row.get("pxname") != POOL_BACKEND:
            continue
        name = row.get("svname", "")
        if name == "BACKEND":
            backend = row
        elif name.startswith(SLOT_PREFIX):
            slots[name] = SlotStats(
                in_flight=_int(row, "scur"), queued=_int(row, "qcur"), dispatched=_int(row, "stot"),
                failures=_int(row, "econ") + _int(row, "eresp"), status=row.get("status", ""),
                hrsp_5xx=_int(row, "hrsp_5xx"))
    if backend is None:
        raise RuntimeApiError(f"'show stat' has no row for the {POOL_BACKEND} backend: {text[:200]!r}")
    classes = ("1xx", "2xx", "3xx", "4xx", "5xx", "other")
    return StatSample(
        taken_at=taken_at,
        requests=_int(backend, "req_tot"),
        queued=_int(backend, "qcur"),
        in_flight=_int(backend, "scur"),
        own_errors=max(0, _int(backend, "hrsp_5xx") - sum(s.hrsp_5xx for s in slots.values())),
        retries=_int(backend, "wretr") + _int(backend, "wredis"),
        responses={c: _int(backend, f"hrsp_{c}") for c in classes},
        avg_ms={k: _int(backend, f"{k[0]}time") for k in ("queue", "connect", "response", "total")},
        slots=slots,
    )


# -- the plane ---------------------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the forked child: have Linux send HAProxy SIGTERM when the router dies, even by SIGKILL, so no
    orphaned HAProxy keeps the listen port and routes to a pool nobody updates any more."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)



@dataclass
class Slot:
    """What the router programmed into one slot."""

    name: str
    server_id: str | None = None
    address: tuple[str, int] | None = None
    state: str = "maint"                 # ready | drain | maint
    programmed_at: float = 0.0           # monotonic time the last state change was acknowledged
    # The slot's counters when it was given to this backend (a slot's counters outlive its holders).
    base_dispatched: int = 0
    base_failures: int = 0


@dataclass(frozen=True)
class Wanted:
    """A backend as the router wants it in HAProxy: its endpoint and ``ready`` or ``drain``."""

    endpoint: str
    state: str


class HaproxyPlane:
    """HAProxy, started and supervised by the router; ``start``, then ``run`` (supervision) as a task."""

    def __init__(self, config: RouterSection, *, listen: tuple[str, int], control_port: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.listen = listen
        self.control_port = control_port
        self.clock = clock
        self.binary = find_haproxy(config.haproxy_binary)
        self._dir = runtime_dir()
        self.socket_path = self._dir / "admin.sock"
        self.config_path = self._dir / "haproxy.cfg"
        self.api = RuntimeApi(self.socket_path)
        self.slots = {f"{SLOT_PREFIX}{k}": Slot(f"{SLOT_PREFIX}{k}") for k in range(1, config.haproxy_slots + 1)}
        self.by_server: dict[str, Slot] = {}
        self.wanted: dict[str, Wanted] = {}
        self.unroutable: dict[str, str] = {}   # server_id -> why HAProxy cannot take it
        self.last_sample: StatSample | None = None
        self.restarts = 0
        self.soft_stop_sent = False
        self._process: asyncio.subprocess.Process | None = None
        self.stopping = False
        self._program_lock = asyncio.Lock()
        self._sample_lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self._log = structlog.get_logger("inference_router.haproxy")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- the process ---------------------------------------------------------------------------------

    def _write_config(self) -> None:
        for status in ERROR_BODIES:
            (self._dir / f"{status}.http").write_text(error_file(status))
        self.config_path.write_text(render_config(self.config, listen=self.listen, control_port=self.control_port,
                                                  socket_path=self.socket_path, error_dir=self._dir))

    async def start(self) -> None:
        """Start HAProxy and return once its runtime API answers; HaproxyListenError when it cannot bind
        the listen address, HaproxyError for anything else that stops it."""
        self._write_config()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._process = await asyncio.create_subprocess_exec(
            self.binary, "-f", str(self.config_path), "-db",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C at the terminal reaches the router, which stops HAProxy itself
            preexec_fn=_die_with_parent,
        )
        deadline = self.clock() + READY_TIMEOUT_S
        while True:
            if self._process.returncode is not None or self.clock() > deadline:
                output = await self._output_of_failed_start()
                if "cannot bind" in output or "Address already in use" in output:
                    raise HaproxyListenError(f"HAProxy cannot bind {self.listen[0]}:{self.listen[1]}: {output}")
                raise HaproxyError(f"HAProxy ({self.binary}) did not start: {output or 'no output'}")
            if self.socket_path.exists():
                try:
                    await self.api.command("show info")
                    break
                except RuntimeApiError:
                    pass
            await asyncio.sleep(0.02)
        assert self._process.stdout is not None
        asyncio.get_running_loop().create_task(self._relay_output(self._process.stdout))
        # A restarted HAProxy has every slot in maintenance: program them all again.
        for slot in self.slots.values():
            slot.server_id, slot.address, slot.state = None, None, "maint"
            slot.base_dispatched = slot.base_failures = 0
        self.by_server.clear()
        self.last_sample = None
        self._log.info("haproxy started", pid=self._process.pid, listen=f"{self.listen[0]}:{self.listen[1]}",
                       slots=len(self.slots), binary=self.binary)

    async def _output_of_failed_start(self) -> str:
        assert self._process is not None
        if self._process.returncode is None:
            self._process.kill()
        await self._process.wait()
        assert self._process.stdout is not None
        text = (await self._process.stdout.read()).decode(errors="replace")
        return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-2000:]

    async def _relay_output(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            text = line.decode(errors="replace").rstrip()
            level = self._log.error if "[ALERT]" in text else self._log.info  # WARNING: mostly state changes
            level("haproxy says", line=text)

    async def run(self, on_restart: Callable[[], None]) -> None:
        """Supervise: when HAProxy exits unasked, log it, start it again and call ``on_restart`` (the router
        reprograms the slots). Runs until cancelled."""
        delay = 0.1
        while True:
            assert self._process is not None
            code = await self._process.wait()
            if self.stopping:
                return
            self._log.error("haproxy exited; restarting it", exit_code=code, restarts=self.restarts)
            await asyncio.sleep(delay)
            try:
                async with self._program_lock:   # no program() half-way over the slots start() empties
                    await self.start()
            except HaproxyError as exc:
                self._log.error("haproxy failed to restart; trying again", error=str(exc))
                delay = min(delay * 2, self.config.reconnect_max_backoff_s)
                continue
            delay = 0.1
            self.restarts += 1
            on_restart()

    async def stop(self) -> None:
        """Soft stop (SIGUSR1): HAProxy stops listening, lets requests in flight finish within
        ``shutdown_timeout_s`` (``hard-stop-after``) and exits. Idempotent."""
        self.stopping = True
        process = self._process
        if process is not None and process.returncode is None:
            process.send_signal(signal.SIGUSR1)
            self.soft_stop_sent = True
            try:
                await asyncio.wait_for(process.wait(), self.config.shutdown_timeout_s + 5)
            except TimeoutError:
                process.kill()
                await process.wait()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- programming ---------------------------------------------------------------------------------

    async def program(self, wanted: Mapping[str, Wanted]) -> None:
        """Make the slots hold ``wanted`` (server_id -> endpoint and state): new backends get a free slot,
        changed ones their new state, gone ones go back to maintenance. Serialised; RuntimeApiError leaves
        the slots as far as they got (call again)."""
        async with self._program_lock:
            self.wanted = dict(wanted)
            for server_id in [s for s in self.by_server if s not in wanted]:
                await self._free(self.by_server[server_id])
            for server_id, want in sorted(wanted.items()):
                await self._place(server_id, want)
        async with self._changed:
            self._changed.notify_all()

    async def _free(self, slot: Slot) -> None:
        await self.api.set_server(slot.name, "state maint")
        self._log.info("backend left haproxy", server_id=slot.server_id, slot=slot.name)
        del self.by_server[slot.server_id or ""]
        slot.server_id, slot.state, slot.programmed_at = None, "maint", self.clock()

    async def _place(self, server_id: str, want: Wanted) -> None:
        try:
            host, port = backend_address(want.endpoint)
            address = (await resolve(host), port)
        except (ValueError, OSError) as exc:
            if self.unroutable.get(server_id) != str(exc):
                self._log.error("backend cannot be routed to by haproxy", server_id=server_id, error=str(exc))
            self.unroutable[server_id] = str(exc)
            if server_id in self.by_server:
                await self._free(self.by_server[server_id])
            return
        self.unroutable.pop(server_id, None)
        slot = self.by_server.get(server_id)
        if slot is not None and slot.address != address:
            await self._free(slot)   # a new address is a new backend
            slot = None
        if slot is None:
            free = next((s for s in self.slots.values() if s.server_id is None), None)
            if free is None:
                why = f"all {len(self.slots)} haproxy slots are taken (raise router.haproxy_slots)"
                if self.unroutable.get(server_id) != why:
                    self._log.error("backend cannot be routed to by haproxy", server_id=server_id, error=why)
                self.unroutable[server_id] = why
                return
            slot = free
            await self.api.set_server(slot.name, f"addr {address[0]} port {address[1]}")
            slot.server_id, slot.address = server_id, address
            before = self.last_sample.slots.get(slot.name) if self.last_sample is not None else None
            slot.base_dispatched = before.dispatched if before is not None else 0
            slot.base_failures = before.failures if before is not None else 0
            self.by_server[server_id] = slot
        if slot.state != want.state:
            await self.api.set_server(slot.name, f"state {want.state}")
            previous, slot.state, slot.programmed_at = slot.state, want.state, self.clock()
            self._log.info("haproxy slot programmed", server_id=server_id, slot=slot.name,
                           address=f"{address[0]}:{address[1]}", state=want.state, previous=previous)

    # -- statistics ----------------------------------------------------------------------------------

    async def sample(self) -> StatSample:
        """A fresh ``show stat`` (serialised; a caller arriving during one gets the next)."""
        async with self._sample_lock:
            taken_at = self.clock()
            sample = parse_show_stat(await self.api.command("show stat"), taken_at)
            self.last_sample = sample
        async with self._changed:
            self._changed.notify_all()
        return sample

    def slot_of(self, server_id: str) -> Slot | None:
        return self.by_server.get(server_id)

    def slot_stats(self, server_id: str) -> SlotStats | None:
        slot = self.by_server.get(server_id)
        if slot is None or self.last_sample is None:
            return None
        return self.last_sample.slots.get(slot.name)

    def idle_after_drain(self, server_id: str) -> bool:
        """The backend's slot is programmed ``drain`` and a sample taken after that shows nothing in flight
        or queued there (or HAProxy never had it)."""
        if server_id in self.unroutable and server_id not in self.by_server:
            return True   # HAProxy never had it (its endpoint cannot be routed to): nothing can be in flight there
        slot = self.by_server.get(server_id)
        sample = self.last_sample
        if slot is None or slot.state != "drain" or sample is None or sample.taken_at <= slot.programmed_at:
            return False
        stats = sample.slots.get(slot.name)
        return stats is not None and stats.in_flight == 0 and stats.queued == 0

    async def wait_idle(self, server_id: str) -> None:
        """Return once ``idle_after_drain(server_id)`` holds (checked after every program and sample)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.idle_after_drain(server_id))


# HAProxy refuses a stats socket path longer than this (a Unix socket address holds 108 bytes).
MAX_SOCKET_PATH = 97


def runtime_dir() -> Path:
    """A fresh private directory for HAProxy's config and socket: under the temporary directory, or under
    /tmp when that one's path is too long for a Unix socket (a test's or a CI job's TMPDIR can be)."""
    made = Path(tempfile.mkdtemp(prefix="aryl-haproxy-"))
    if len(str(made / "admin.sock")) <= MAX_SOCKET_PATH:
        return made
    made.rmdir()
    return Path(tempfile.mkdtemp(prefix="aryl-haproxy-", dir="/tmp"))


def choose_listen(address: str) -> tuple[str, int]:
    """``router.listen`` as HAProxy binds it: port 0 becomes a free port of that host, chosen now."""
    host, port = split_host_port(address)
    if port == 0:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family) as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
    return host, port
