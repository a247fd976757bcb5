"""A request's image URLs: handed over by its prepare step (on the executor) as it meets them,
fetched on the event loop (server/vision/image_fetch.py), each decoded on the executor as its body
arrives, so that no executor thread, the ones that tokenize every request, waits on an image host.

The pipeline awaits them after prepare (pipeline.prepare_in_time), within the request's deadline and
its client's presence; each URL's input stands in the prepared inputs as a placeholder (its
positions, its pixels a Pending) until then. One deadline for all of a request's fetches
(WARMPOOL_IMAGE_URL_TIMEOUT from its preparation's start); the groups handed over (/score's two
sides, /rerank's query and documents) are fetched one after another, each WINDOW ahead of its
decoding: a request holds WINDOW bodies at most.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Protocol, TypeVar

from common.settings import Settings
from common.vision import Vision
from common.wire import Tokens
from server.vision import image_fetch, images


@dataclass(eq=False)
class Pending:
    """An image URL among a request's inputs: what it becomes once fetched and decoded."""

    url: str
    where: str
    vision: Vision
    tokens: Tokens | None = None
    picture: images.Picture | None = None

    def placeholder(self) -> Tokens:
        """Its input until then: the positions it will take (what admission and batching count)."""
        return Tokens([0] * self.vision.positions, pixels=self)


class HasTokens(Protocol):
    tokens: list[Tokens]


P = TypeVar("P", bound=HasTokens)


class UrlImages:
    def __init__(self, loop: asyncio.AbstractEventLoop, executor: Executor, settings: Settings) -> None:
        self.deadline = time.monotonic() + settings.image_url_timeout
        self._loop, self._executor, self._settings = loop, executor, settings
        self._handed: list[list[Pending]] = []  # appended by prepare's thread
        self._groups: list[asyncio.Task[None]] = []  # the loop's alone
        self._closed = False

    def add(self, group: list[Pending]) -> None:
        """Called by prepare, on the executor: their fetches begin now, on the loop (before the rest of
        the request is prepared), after the groups handed over before."""
        self._handed.append(group)
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is exiting
            self._loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        while not self._closed and len(self._groups) < len(self._handed):
            after = self._groups[-1] if self._groups else None
            self._groups.append(self._loop.create_task(self._fetch(self._handed[len(self._groups)], after)))

    async def after(self, preparing: Awaitable[P]) -> P:
        """What prepare made, with every URL's placeholder replaced by its image once fetched and
        decoded; the first failure, in the inputs' order, raised. Whatever ends it, nothing goes on."""
        try:
            prepared = await preparing
            self._begin()
            for group in self._groups:
                await group
            prepared.tokens = [(t.pixels.tokens or t) if isinstance(t.pixels, Pending) else t for t in prepared.tokens]
            return prepared
        finally:
            self.close()

    def close(self) -> None:
        """What is still fetching or decoding dropped (the request failed, timed out, or its client left)."""
        self._closed = True
        for group in self._groups:
            image_fetch.drop(group)

    async def _fetch(self, group: list[Pending], after: asyncio.Task[None] | None) -> None:
        if after is not None:
            await asyncio.wait([after])
            if after.cancelled() or after.exception() is not None:
                return  # the request fails with the group before
        bodies = image_fetch.fetch_each([(p.url, p.where) for p in group], self._settings, self.deadline)
        try:
            for pending in group:
                data = await anext(bodies)
                pending.tokens, pending.picture = await self._loop.run_in_executor(
                    self._executor, images.image_input, data, pending.vision, self._settings, pending.where
                )
        finally:
            await bodies.aclose()
