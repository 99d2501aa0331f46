"""The desired-state change feed on PostgreSQL's LISTEN/NOTIFY, so that any replica may serve the agents'
desired-state streams while the leader alone decides (issue 35 item 2).

Nouns:
- A *notice* is one server's new desired generation, ``"<server id>:<generation>"`` on the channel
  ``DESIRED_STATE_CHANNEL``. ``store.desired.DesiredStates.bump`` sends one per bumped server from inside
  the bumping statement (``notice_column``: no round trip of its own), so PostgreSQL delivers it only if,
  and once, the transaction commits, in commit order.
- ``follow_desired_notices`` listens on a connection of its own and hands each batch of notices to its
  caller (the desired-state streams' own process of a standby, ``scheduler_service.push_process``), which
  re-reads only the servers whose state it holds at an older generation. A connection lost and opened again
  may have missed notices: the caller is told (``on_gap``) and re-reads every state it holds.

Never: decide or write anything; a notice names what changed, the state is read from the tables.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import Engine

from aryl_common.backoff import Backoff

log = structlog.get_logger("aryl.store")

DESIRED_STATE_CHANNEL = "aryl_desired_state"
RECONNECT_MAX_S = 10.0
IDLE_CHECK_S = 30.0  # a listening connection silent this long is asked a question, so a dead one is noticed


def notice_column(server_id: Any, generation: Any) -> sa.ColumnElement[Any]:
    """The SQL that notifies one server's new ``generation`` (a column of a RETURNING clause: evaluated per
    row of the statement, delivered at commit)."""
    payload = server_id + sa.literal(":") + sa.cast(generation, sa.String)
    return sa.func.pg_notify(sa.literal(DESIRED_STATE_CHANNEL), payload).label("noticed")


def parse_notices(payloads: Iterable[str]) -> dict[str, int]:
    """Each notified server's newest generation among ``payloads``; malformed ones are left out (logged)."""
    newest: dict[str, int] = {}
    for payload in payloads:
        server_id, _, generation = payload.rpartition(":")
        try:
            value = int(generation)
        except ValueError:
            log.warning("ignored a malformed desired-state notice", payload=payload[:200])
            continue
        if server_id and value > newest.get(server_id, -1):
            newest[server_id] = value
    return newest


async def follow_desired_notices(
    engine: Engine, on_notices: Callable[[Mapping[str, int]], None], on_gap: Callable[[], None],
    stop: asyncio.Event,
) -> None:
    """Listen on ``DESIRED_STATE_CHANNEL`` on a connection of ``engine``'s (PostgreSQL) until ``stop``:
    each batch of notices to ``on_notices``, on the running loop; ``on_gap`` after every reconnection (notices
    may have been missed meanwhile). A failed connection is opened again with backoff."""
    loop = asyncio.get_running_loop()
    backoff = Backoff(RECONNECT_MAX_S, initial_s=0.2)
    connected_before = False
    while not stop.is_set():
        try:
            conn = await asyncio.to_thread(_listening_connection, engine)
        except Exception as exc:  # noqa: BLE001 - logged, and tried again
            delay = backoff.next_delay()
            log.warning("cannot listen for desired-state notices; trying again", error=repr(exc), retry_in_s=delay)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            continue
        backoff.reset()
        if connected_before:
            on_gap()
        connected_before = True
        try:
            await _drain(loop, conn, on_notices, stop)
        except Exception as exc:  # noqa: BLE001 - the connection failed: open another
            log.warning("lost the desired-state notices' connection; listening again", error=repr(exc))
        finally:
            with contextlib.suppress(Exception):
                conn.close()


def _listening_connection(engine: Engine) -> Any:
    """The driver's connection (psycopg2), of its own (out of the pool), in autocommit, listening on the channel."""
    raw = engine.raw_connection()
    conn: Any = raw.driver_connection
    assert conn is not None, "a connection just checked out has its driver's"
    raw.detach()  # it lives as long as the listening; the pool never hands it out
    try:
        conn.autocommit = True
        with conn.cursor() as cursor:
            cursor.execute(f"LISTEN {DESIRED_STATE_CHANNEL}")
    except BaseException:
        conn.close()
        raise
    return conn


async def _drain(loop: asyncio.AbstractEventLoop, conn: Any, on_notices: Callable[[Mapping[str, int]], None],
                 stop: asyncio.Event) -> None:
    readable = asyncio.Event()
    fd = conn.fileno()  # kept: a failed connection no longer tells it, and its reader must still be removed
    loop.add_reader(fd, readable.set)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            woken = asyncio.ensure_future(readable.wait())
            done, _ = await asyncio.wait((woken, stopping), timeout=IDLE_CHECK_S,
                                         return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            if not done:  # silent: is the connection alive? (a dead one raises)
                with conn.cursor() as cursor:
                    cursor.execute("SELECT 1")
            readable.clear()
            conn.poll()
            if conn.notifies:
                payloads = [notice.payload for notice in conn.notifies]
                conn.notifies.clear()
                newest = parse_notices(payloads)
                if newest:
                    on_notices(newest)
    finally:
        stopping.cancel()
        loop.remove_reader(fd)
