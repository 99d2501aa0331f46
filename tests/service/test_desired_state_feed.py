"""``notify.DesiredStateFeed`` when the database refuses a read for now (``Unavailable``: a statement or lock
timed out, as a soak on a loaded machine saw): the streams keep their last state and the read is retried, so
one slow read does not end every agent stream waiting on it; a refusal that lasts, or any other failure,
reaches the streams as before."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pytest

from scheduler_service.errors import Unavailable
from scheduler_service.notify.desired_states import DesiredStateFeed


@dataclass(frozen=True)
class State:
    generation: int


class Database:
    """``load`` for the feed: answers each server's generation, refusing the reads it is told to."""

    def __init__(self, refusals: int, error: Exception | None = None) -> None:
        self.generation = 1
        self.refusals = refusals
        self.error = error or Unavailable("the scheduler's database is busy (a lock or statement timed out); retry")
        self.reads = 0

    def load(self, server_ids: Sequence[str]) -> Mapping[str, State]:
        self.reads += 1
        if self.refusals:
            self.refusals -= 1
            raise self.error
        return {s: State(self.generation) for s in server_ids}


async def first_states(feed: DesiredStateFeed[State], count: int) -> list[int]:
    seen = []
    async for state in feed.watch("s1", refresh_s=60.0):
        seen.append(state.generation)
        if len(seen) == count:
            break
    return seen


def run(coro):  # one event loop per test, closed at the end
    return asyncio.run(asyncio.wait_for(coro, timeout=30.0))


def test_a_refused_read_is_retried_and_the_stream_carries_on() -> None:
    async def scenario() -> tuple[list[int], int]:
        db = Database(refusals=0)
        feed: DesiredStateFeed[State] = DesiredStateFeed(asyncio.get_running_loop(), db.load,
                                                         retry_base_s=0.01, retry_max_s=0.02)
        stream = feed.watch("s1", refresh_s=60.0)
        seen = [(await anext(stream)).generation]
        db.refusals, db.generation = 3, 2  # the next three reads time out, then generation 2 is read
        feed.changed_threadsafe(["s1"])
        seen.append((await anext(stream)).generation)
        await stream.aclose()
        return seen, db.reads

    seen, reads = run(scenario())
    assert seen == [1, 2] and reads == 5  # the first read, three refused, the one that got through


def test_a_refusal_that_lasts_or_another_failure_reaches_the_stream() -> None:
    async def scenario(db: Database, retries: int) -> None:
        feed: DesiredStateFeed[State] = DesiredStateFeed(asyncio.get_running_loop(), db.load, retries=retries,
                                                         retry_base_s=0.01, retry_max_s=0.02)
        await first_states(feed, 1)

    lasting = Database(refusals=10)
    with pytest.raises(Unavailable, match="busy"):
        run(scenario(lasting, retries=2))
    assert lasting.reads == 3  # the read and its two retries
    other = Database(refusals=1, error=RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        run(scenario(other, retries=5))
    assert other.reads == 1  # not retried: not a refusal for now
