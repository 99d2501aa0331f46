"""Group commit for callers on an event loop (``GroupCommitter.submit_on_loop``, what SubmitJob and
CancelJob use): each caller gets its own answer as a future of its loop, a group's answers reach the
loop in one wake-up, and a caller that gives up is withdrawn exactly as ``submit``'s are.

Real threads, a real event loop and a commit function written here.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import pytest

from scheduler_service.errors import Unavailable
from scheduler_service.group_commit import GroupCommitter
from tests.fixtures.gated_groups import gated_committer


async def _until(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 5)


def test_callers_on_a_loop_get_their_own_answers_and_a_group_wakes_the_loop_once() -> None:
    with gated_committer() as (handler, committer):

        async def main() -> tuple[str, list[str | BaseException], int]:
            loop = asyncio.get_running_loop()
            first = committer.submit_on_loop("a")
            await _until(handler.in_flight)
            # Queued behind the group in flight: they form the next group.
            behind = [committer.submit_on_loop(item) for item in ("b", "bad", "c", "d")]
            wakeups = 0
            threadsafe = loop.call_soon_threadsafe

            def counted(*args: object, **kwargs: object) -> asyncio.Handle:
                nonlocal wakeups
                wakeups += 1
                return threadsafe(*args, **kwargs)  # type: ignore[arg-type]

            loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
            handler.gate.set()
            answers = await asyncio.gather(*behind, return_exceptions=True)
            return await first, answers, wakeups

        first, answers, wakeups = asyncio.run(main())
        assert first == "A"
        assert answers[0] == "B" and answers[2:] == ["C", "D"]
        assert isinstance(answers[1], ValueError)
        assert handler.groups == [["a"], ["b", "bad", "c", "d"]]
        assert wakeups == 2  # one per group: the first group's answer, then the second's four in one call


def test_a_loop_caller_that_gives_up_before_its_group_commits_is_never_applied() -> None:
    with gated_committer() as (handler, committer):

        async def main() -> tuple[str, str, bool]:
            first = committer.submit_on_loop("a")
            await _until(handler.in_flight)
            gone, waiting = committer.submit_on_loop("gone"), committer.submit_on_loop("b")
            gone.cancel()  # as the RPC's task being cancelled (deadline, client gone) cancels what it awaits
            await asyncio.sleep(0)
            handler.gate.set()
            return await first, await waiting, gone.cancelled()

        first, waiting, cancelled = asyncio.run(main())
        assert (first, waiting, cancelled) == ("A", "B", True)
        assert [item for group in handler.groups for item in group] == ["a", "b"]
        assert committer.alive


def test_a_loop_caller_that_gives_up_once_its_group_commits_leaves_the_group_applied() -> None:
    with gated_committer() as (handler, committer):

        async def main() -> str:
            running = committer.submit_on_loop("a")
            await _until(handler.in_flight)
            running.cancel()  # too late to withdraw it: the group is being committed
            handler.gate.set()
            return await committer.submit_on_loop("b")

        assert asyncio.run(main()) == "B"
        assert handler.groups == [["a"], ["b"]]


def test_a_stopped_committer_fails_its_loop_callers_and_refuses_new_ones() -> None:
    entered, proceed = threading.Event(), threading.Event()

    def fatal(items: Sequence[int]) -> list[int | Exception]:
        entered.set()
        assert proceed.wait(10)
        raise SystemExit("the commit function escaped")

    committer: GroupCommitter[int, int] = GroupCommitter(fatal, name="test-commit")

    async def main() -> None:
        in_group = committer.submit_on_loop(1)
        await _until(entered)
        queued = committer.submit_on_loop(2)  # behind the group that kills the thread
        proceed.set()
        with pytest.raises(Unavailable):
            await in_group
        with pytest.raises(Unavailable):
            await queued
        with pytest.raises(Unavailable, match="test-commit"):
            committer.submit_on_loop(3)

    asyncio.run(main())
    committer.close()
