"""A demoted tenant's request waits for the other interactive requests at the engines, never long
(server/core/engine_turns.py)."""

from __future__ import annotations

import asyncio

import pytest

from server.core import engine_turns
from server.core.engine_turns import Turns

WAIT_S = 10.0


@pytest.fixture(autouse=True)
def no_beat(monkeypatch: pytest.MonkeyPatch) -> None:
    """No moment's wait for simultaneous arrivals, and a long bound: only the others hold a request."""
    monkeypatch.setattr(engine_turns, "HOLD_MIN_S", 0.0)
    monkeypatch.setattr(engine_turns, "HOLD_MAX_S", 60.0)


async def turns_of_the_loop(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def far() -> float:
    return asyncio.get_running_loop().time() + 60.0


def test_a_demoted_request_waits_until_the_interactive_ones_are_answered() -> None:
    async def main() -> None:
        turns = Turns()
        with turns.counted(interactive=True):
            waiting = asyncio.ensure_future(turns.wait(far()))
            await turns_of_the_loop()
            assert not waiting.done()
        await asyncio.wait_for(waiting, WAIT_S)

    asyncio.run(main())


def test_bulk_requests_are_not_waited_for() -> None:
    async def main() -> None:
        turns = Turns()
        with turns.counted(interactive=False):
            await asyncio.wait_for(turns.wait(far()), WAIT_S)
            assert turns.running == 0

    asyncio.run(main())


def test_the_wait_ends_when_the_last_of_several_is_answered() -> None:
    async def main() -> None:
        turns = Turns()
        with turns.counted(interactive=True):
            with turns.counted(interactive=True):
                waiting = asyncio.ensure_future(turns.wait(far()))
                await turns_of_the_loop()
            await turns_of_the_loop()
            assert not waiting.done() and turns.running == 1
        await asyncio.wait_for(waiting, WAIT_S)
        assert turns.running == 0

    asyncio.run(main())


def test_the_wait_is_bounded_while_others_keep_the_engines_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_turns, "HOLD_MAX_S", 0.01)

    async def main() -> None:
        turns = Turns()
        with turns.counted(interactive=True):
            await asyncio.wait_for(turns.wait(far()), WAIT_S)

    asyncio.run(main())


def test_the_wait_ends_by_the_requests_deadline() -> None:
    async def main() -> None:
        turns = Turns()
        with turns.counted(interactive=True):
            await asyncio.wait_for(turns.wait(asyncio.get_running_loop().time()), WAIT_S)

    asyncio.run(main())


def test_an_interactive_request_that_fails_is_no_longer_counted() -> None:
    async def main() -> None:
        turns = Turns()
        with pytest.raises(RuntimeError), turns.counted(interactive=True):
            raise RuntimeError("the engine failed")
        assert turns.running == 0
        await asyncio.wait_for(turns.wait(far()), WAIT_S)

    asyncio.run(main())
