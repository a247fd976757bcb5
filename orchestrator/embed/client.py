"""Requests to /v1/embeddings: chunks of rows, several in flight, answered in input order.

Each request is bulk work (`priority` above 0, as the Batch API's lines), so a server also serving
interactive traffic answers that first. A full server (429), no engine or a gateway without one
(502, 503, 504) and a lost connection are tried again with backoff, a bounded number of times;
every attempt has a deadline of its own.
"""

from __future__ import annotations

import asyncio
import base64
import random
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

from orchestrator.embed.corpus import Row

BULK_PRIORITY = 1000  # as the Batch API's lines (server/batches/runner.py): interactive requests go first
RETRY_STATUSES = frozenset({429, 502, 503, 504})
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 10.0


class EmbedError(RuntimeError):
    """Rows the server refused, or a server that stayed unavailable: exit code 1."""


@dataclass(frozen=True)
class Requests:
    model: str | None = None
    concurrency: int = 4
    retries: int = 8  # attempts after the first
    timeout_s: float = 300.0  # one attempt, the whole answer included

    def body(self, texts: list[str]) -> dict[str, Any]:
        body: dict[str, Any] = {"input": texts, "encoding_format": "base64", "priority": BULK_PRIORITY}
        if self.model is not None:
            body["model"] = self.model
        return body


async def embed_in_order(
    client: httpx.AsyncClient,
    chunks: AsyncIterator[list[Row]],
    done: Callable[[list[Row], np.ndarray], Awaitable[None]],
    how: Requests,
) -> None:
    """Every chunk embedded, `done` called chunk by chunk in input order; at most `how.concurrency`
    requests in flight (a chunk answered early waits for those before it). Raises EmbedError at the
    first chunk that fails: the chunks before it have been handed to `done`."""
    window: deque[tuple[list[Row], asyncio.Task[np.ndarray]]] = deque()
    try:
        async for chunk in chunks:
            window.append((chunk, asyncio.create_task(embed_chunk(client, [r.text for r in chunk], how))))
            if len(window) >= how.concurrency:
                rows, task = window.popleft()
                await done(rows, await task)
        while window:
            rows, task = window.popleft()
            await done(rows, await task)
    finally:
        for _, task in window:
            task.cancel()
        await asyncio.gather(*(task for _, task in window), return_exceptions=True)


async def embed_chunk(client: httpx.AsyncClient, texts: list[str], how: Requests) -> np.ndarray:
    """The chunk's vectors as float32 rows, retried with backoff where the server may recover."""
    delay = BACKOFF_FIRST_S
    for attempt in range(how.retries + 1):
        last = attempt == how.retries
        try:
            async with asyncio.timeout(how.timeout_s):
                response = await client.post("/v1/embeddings", json=how.body(texts))
                await response.aread()
        except (httpx.TransportError, TimeoutError) as exc:
            if last:
                raise EmbedError(f"no answer after {how.retries + 1} attempts: {type(exc).__name__} {exc}") from exc
        else:
            if response.status_code == 200:
                return decoded(response.json(), len(texts))
            if response.status_code not in RETRY_STATUSES or last:
                raise EmbedError(f"the server answered {response.status_code}: {_message(response)}")
            delay = max(delay, _retry_after(response))
        await asyncio.sleep(min(delay, BACKOFF_MAX_S) * random.uniform(0.5, 1.0))  # jittered: pods spread out
        delay = min(delay * 2, BACKOFF_MAX_S)
    raise AssertionError("unreachable")


def decoded(answer: dict[str, Any], count: int) -> np.ndarray:
    data = sorted(answer["data"], key=lambda item: item["index"])
    if len(data) != count:
        raise EmbedError(f"the server answered {len(data)} embeddings for {count} inputs")
    return np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in data])


def _retry_after(response: httpx.Response) -> float:
    try:
        return min(float(response.headers.get("retry-after", 0)), BACKOFF_MAX_S)
    except ValueError:
        return 0.0


def _message(response: httpx.Response) -> str:
    try:
        error = response.json().get("error", {})
        return str(error.get("message", error) if isinstance(error, dict) else error)[:500]
    except ValueError:
        return response.text[:500]
