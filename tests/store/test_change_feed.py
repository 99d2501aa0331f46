"""The desired-state change feed on PostgreSQL's LISTEN/NOTIFY (``store.change_feed``), on a real server: a
notice reaches a listener only when its transaction commits, in commit order; a listener whose connection is
ended listens again and says that it may have missed notices meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest
import sqlalchemy as sa

from scheduler_service.store.change_feed import DESIRED_STATE_CHANNEL, follow_desired_notices, parse_notices
from tests.helpers import scaled_timeout, wait_for

APP = "aryl-change-feed-test"  # the listener's connections, found by name in pg_stat_activity


def test_each_server_s_newest_generation_is_kept_and_malformed_notices_left_out() -> None:
    assert parse_notices(["a:3", "b:1", "a:2", "junk", "c:x", "host:with:colons:4"]) == {
        "a": 3, "b": 1, "host:with:colons": 4}


def _listener_pid(engine: sa.Engine) -> int | None:
    with engine.connect() as conn:
        return conn.scalar(sa.text("SELECT pid FROM pg_stat_activity WHERE application_name = :app AND query = :q"),
                           {"app": APP, "q": f"LISTEN {DESIRED_STATE_CHANNEL}"})


async def _listening(engine: sa.Engine) -> int:
    """The pid of the listener's backend, once it listens."""
    return await asyncio.to_thread(wait_for, lambda: _listener_pid(engine), timeout=30, what="the listener")


def _notify(conn: sa.Connection, payload: str) -> None:
    conn.execute(sa.text("SELECT pg_notify(:channel, :payload)"),
                 {"channel": DESIRED_STATE_CHANNEL, "payload": payload})


@pytest.mark.postgres
def test_notices_arrive_at_commit_in_order_and_after_a_lost_connection(postgres_url: str) -> None:
    listening = sa.create_engine(postgres_url, connect_args={"application_name": APP})
    other = sa.create_engine(postgres_url)

    async def scenario() -> None:
        got: asyncio.Queue[Mapping[str, int]] = asyncio.Queue()
        gap = asyncio.Event()
        stop = asyncio.Event()
        follower = asyncio.create_task(follow_desired_notices(listening, got.put_nowait, gap.set, stop))
        try:
            first_pid = await _listening(listening)
            open_tx = other.connect()
            try:
                tx = open_tx.begin()
                await asyncio.to_thread(_notify, open_tx, "gpu-1:1")
                await asyncio.to_thread(_notify, open_tx, "gpu-1:2")

                def committed(payload: str) -> None:
                    with other.begin() as conn:
                        _notify(conn, payload)

                await asyncio.to_thread(committed, "gpu-2:7")
                async with asyncio.timeout(scaled_timeout(30)):
                    assert await got.get() == {"gpu-2": 7}  # the open transaction's notices are not out yet
                    await asyncio.to_thread(tx.commit)
                    seen: dict[str, int] = {}
                    while seen.get("gpu-1") != 2:
                        seen.update(await got.get())
            finally:
                open_tx.close()

            # Its connection ended: it listens again on another, and says it may have missed notices.
            def terminate(pid: int) -> None:
                with other.begin() as conn:
                    conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

            await asyncio.to_thread(terminate, first_pid)
            async with asyncio.timeout(scaled_timeout(30)):
                await gap.wait()
            assert await _listening(listening) != first_pid
            await asyncio.to_thread(committed, "gpu-3:5")
            async with asyncio.timeout(scaled_timeout(30)):
                assert await got.get() == {"gpu-3": 5}
        finally:
            stop.set()
            async with asyncio.timeout(scaled_timeout(30)):
                await follower

    try:
        asyncio.run(scenario())
    finally:
        listening.dispose()
        other.dispose()
