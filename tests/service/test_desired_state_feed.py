"""``notify.DesiredStateFeed`` when the database refuses a read for now (``Unavailable``: a statement or lock
timed out, as a soak on a loaded machine saw): the streams keep their last state and the read is retried, so
one slow read does not end every agent stream waiting on it; a refusal that lasts, or any other failure,
reaches the streams as before."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
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


class Generations:
    """``load`` and ``generations`` for the feed, per server: what each read asked for, in order."""

    def __init__(self, *servers: str) -> None:
        self.now = dict.fromkeys(servers, 1)
        self.loads: list[list[str]] = []
        self.checks: list[list[str]] = []
        self.check_error: Exception | None = None
        self.checked: Callable[[int], object] = lambda count: None  # told each check's count, on the reading thread

    def load(self, server_ids: Sequence[str]) -> Mapping[str, State]:
        self.loads.append(list(server_ids))
        return {s: State(self.now[s]) for s in server_ids if s in self.now}

    def generations(self, server_ids: Sequence[str]) -> Mapping[str, int]:
        answer = {s: self.now[s] for s in server_ids if s in self.now}
        self.checks.append(list(server_ids))
        self.checked(len(self.checks))  # after the read: a test that changes ``now`` when told changes the next one
        if self.check_error is not None:
            raise self.check_error
        return answer


async def _checked(db: Generations, count: int) -> None:
    """Until ``count`` generation reads were made (they run on the feed's executor's threads)."""
    loop = asyncio.get_running_loop()
    while len(db.checks) < count:
        told = asyncio.Event()

        def tell(_count: int, told: asyncio.Event = told) -> None:
            loop.call_soon_threadsafe(told.set)

        db.checked = tell
        if len(db.checks) < count:
            await told.wait()


async def _settled(feed: DesiredStateFeed[State]) -> None:
    """Until the feed's reader has nothing left to read."""
    while feed._reader is not None and not feed._reader.done():
        await feed._reader


def test_a_reread_reads_the_whole_state_only_of_servers_whose_generation_moved() -> None:
    async def scenario() -> tuple[Generations, list[int]]:
        db = Generations("s1", "s2")
        feed: DesiredStateFeed[State] = DesiredStateFeed(asyncio.get_running_loop(), db.load,
                                                         generations=db.generations, recheck_gather_s=0.01)
        one, two = feed.watch("s1", refresh_s=60.0), feed.watch("s2", refresh_s=60.0)
        assert (await anext(one)).generation == 1 and (await anext(two)).generation == 1
        await _settled(feed)
        feed.reread_watched()  # nothing moved: the generations are read, no whole state
        await _checked(db, 1)
        await _settled(feed)
        db.now["s2"] = 2
        feed.reread_watched()  # s2 moved: its whole state alone is read, and its stream yields it
        seen = [(await anext(two)).generation]
        db.check_error = RuntimeError("the generations cannot be read")
        db.now["s1"] = 3
        feed.reread_watched()  # then every rechecked server's whole state is read, as before the check
        seen.append((await anext(one)).generation)
        await one.aclose()
        await two.aclose()
        return db, seen

    db, seen = run(scenario())
    assert seen == [2, 3]
    assert db.checks == [["s1", "s2"], ["s1", "s2"], ["s1", "s2"]]
    first = sorted(s for load in db.loads[:-2] for s in load)  # the streams' first reads, together or apart
    assert first == ["s1", "s2"] and db.loads[-2:] == [["s2"], ["s1", "s2"]]


def test_a_streams_periodic_reread_checks_the_generation_first() -> None:
    async def scenario() -> tuple[Generations, list[int]]:
        db = Generations("s1")
        feed: DesiredStateFeed[State] = DesiredStateFeed(asyncio.get_running_loop(), db.load,
                                                         generations=db.generations, recheck_gather_s=0.01)
        seen: list[int] = []

        async def agent() -> None:  # the stream's re-reads run while its agent waits on it
            async for state in feed.watch("s1", refresh_s=0.02):
                seen.append(state.generation)
                if len(seen) == 2:
                    return

        watching = asyncio.create_task(agent())
        await _checked(db, 3)  # three periodic re-reads, nothing moved
        db.now["s1"] = 2
        await watching  # the next re-read finds it moved and reads it whole
        return db, seen

    db, seen = run(scenario())
    assert seen == [1, 2]
    assert db.loads == [["s1"], ["s1"]] and len(db.checks) >= 4


def test_rechecks_are_gathered_into_one_read() -> None:
    async def scenario() -> Generations:
        db = Generations("s1", "s2", "s3")
        feed: DesiredStateFeed[State] = DesiredStateFeed(asyncio.get_running_loop(), db.load,
                                                         generations=db.generations, recheck_gather_s=0.05)
        streams = [feed.watch(s, refresh_s=60.0) for s in ("s1", "s2", "s3")]
        for stream in streams:
            await anext(stream)
        await _settled(feed)
        for server in ("s3", "s1", "s2"):  # three streams' periodic re-reads, asked one after the other
            feed._request((server,), recheck=True)
        await _checked(db, 1)
        await _settled(feed)
        for stream in streams:
            await stream.aclose()
        return db

    db = run(scenario())
    assert db.checks == [["s1", "s2", "s3"]]  # one read of the three generations, nothing read whole again
    assert sorted(s for load in db.loads for s in load) == ["s1", "s2", "s3"]
