"""The request pipeline's preparation step: bounded by the request's deadline and its client."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from common.settings import Settings
from common.startup import StartupState
from common.wire import Tokens
from server.core.admission import Admission
from server.core.inputs import RequestContext
from server.core.pipeline import Prepared, at_priority, prepare_in_time
from server.core.services import Services
from server.http.errors import APIError, ClientDisconnected


@pytest.fixture
def svc() -> Iterator[Services]:
    with ThreadPoolExecutor(2) as executor:
        yield Services(settings=Settings(max_concurrent_inputs=10), startup=StartupState(), executor=executor)


def context(svc: Services) -> RequestContext:
    return RequestContext(None, {}, svc.settings, svc.admission)  # type: ignore[arg-type]  (no model needed)


class SlowPrepare:
    """A prepare step that takes 3 permits, then waits until released; then asks to cover 5 inputs."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.late_admit: Exception | None = None

    def __call__(self, raw: bytes, ctx: RequestContext) -> Prepared[Any]:
        ctx.admit(3)
        self.release.wait(10)
        try:
            ctx.admit(5)
        except APIError as exc:
            self.late_admit = exc
        return Prepared(raw, [])


def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def test_preparation_past_the_deadline_is_a_503_and_gives_its_permits_back_when_done(svc: Services) -> None:
    """A prepare step still running at the request's deadline: the request gets 503 at once; the
    thread may take no further permit, and its own go back when it ends."""
    slow = SlowPrepare()
    ctx = context(svc)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with pytest.raises(APIError) as caught:
            await prepare_in_time(svc, slow, b"{}", ctx, loop.create_future(), loop.time() + 0.05)
        assert caught.value.status == 503 and "preparing" in caught.value.message

    asyncio.run(scenario())
    assert svc.admission.used == 3  # still held by the running thread
    slow.release.set()
    until(lambda: svc.admission.used == 0, "the permits back")
    assert isinstance(slow.late_admit, APIError)


def test_a_client_that_leaves_during_preparation_is_a_499(svc: Services) -> None:
    """The client's disconnect ends the wait for preparation too (ClientDisconnected: 499)."""
    slow = SlowPrepare()
    ctx = context(svc)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        gone = loop.create_future()
        loop.call_later(0.05, gone.set_result, None)
        with pytest.raises(ClientDisconnected):
            await prepare_in_time(svc, slow, b"{}", ctx, gone, loop.time() + 60)

    asyncio.run(scenario())
    slow.release.set()
    until(lambda: svc.admission.used == 0, "the permits back")


def test_a_prompt_preparation_returns_its_result(svc: Services) -> None:
    """Within the deadline the prepared request comes back and the permits stay with the request."""
    slow = SlowPrepare()
    slow.release.set()
    ctx = context(svc)

    async def scenario() -> Prepared[Any]:
        loop = asyncio.get_running_loop()
        return await prepare_in_time(svc, slow, b"raw", ctx, loop.create_future(), loop.time() + 60)

    assert asyncio.run(scenario()).body == b"raw"
    assert ctx.admitted == 5 and slow.late_admit is None  # admit(n) covers n inputs in all


def tokens_prepare(raw: bytes, ctx: RequestContext) -> Prepared[Any]:
    ctx.admit(2)
    return Prepared(raw, [Tokens([1, 2]), Tokens([3])])


def test_the_bodys_priority_wins_over_the_header_and_reaches_the_inputs(svc: Services) -> None:
    """`priority` in the body is read before prepare takes its permits, beats x-priority's, and
    every input carries it to the engine."""
    ctx = context(svc)
    ctx.priority = 3  # from the header
    prepared = at_priority(tokens_prepare, b'{"input": ["a", "b"], "priority": -2}', ctx)
    assert ctx.priority == -2
    assert [t.priority for t in prepared.tokens] == [-2, -2]


def test_without_a_body_priority_the_headers_stands(svc: Services) -> None:
    ctx = context(svc)
    ctx.priority = 4
    assert [t.priority for t in at_priority(tokens_prepare, b'{"input": ["a", "b"]}', ctx).tokens] == [4, 4]


@pytest.mark.parametrize("value", ['"high"', "1.5", "true", str(2**40)])
def test_a_body_priority_that_is_not_a_bounded_integer_is_a_400(svc: Services, value: str) -> None:
    with pytest.raises(APIError) as caught:
        at_priority(tokens_prepare, b'{"input": "a", "priority": ' + value.encode() + b"}", context(svc))
    assert caught.value.status == 400 and caught.value.param == "priority"


def test_a_demoted_requests_body_cannot_ask_above_bulk(svc: Services) -> None:
    """Its tenant presses past its quota (server/tenants/guard.py): bulk, whatever the body asks."""
    ctx = context(svc)
    ctx.demoted, ctx.priority = True, 1
    prepared = at_priority(tokens_prepare, b'{"input": ["a", "b"], "priority": -3}', ctx)
    assert ctx.priority == 1
    assert [t.priority for t in prepared.tokens] == [1, 1]


def test_a_body_that_turns_the_request_bulk_is_held_to_the_bulk_share(svc: Services) -> None:
    """The first permit is taken at the header's priority; a body saying bulk is then refused
    where bulk work no longer fits, however few inputs it has."""
    admission = Admission(100, reserve=0.25)
    assert admission.try_acquire(80) == 80  # interactive work holds more than the bulk share
    ctx = RequestContext(None, {}, svc.settings, admission)  # type: ignore[arg-type]
    ctx.admit(1)
    with pytest.raises(APIError) as caught:
        at_priority(lambda raw, c: (c.admit(1), Prepared(raw, []))[1], b'{"input": "a", "priority": 5}', ctx)
    assert caught.value.status == 429
