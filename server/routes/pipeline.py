"""The request path every pooling route shares: prepare on the executor, engine, render on the executor.

A route supplies two synchronous functions: `prepare(raw, ctx) -> Prepared` and
`render(prepared, outcome, ctx) -> bytes`. Both run on the executor, never on the event loop:
prepare through Runtime.run, render handed to the executor by the engine client the moment the
request's last row arrives.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Request
from fastapi.responses import Response

from server.errors import APIError
from server.ipc import Outcome
from server.processing import Context
from server.runtime import Timings, json_response, runtime
from server.tokenizer import Tokens

B = TypeVar("B")


@dataclass
class Prepared(Generic[B]):
    body: B
    tokens: list[Tokens]
    extra: Any = None

    @property
    def n_tokens(self) -> int:
        return sum(len(t.input_ids) for t in self.tokens)

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.n_tokens, "total_tokens": self.n_tokens}


Prepare = Callable[[bytes, Context], Prepared[Any]]
Render = Callable[[Prepared[Any], Outcome, Context], bytes]


async def serve(request: Request, prepare: Prepare, render: Render) -> Response:
    rt = runtime(request)
    timings = Timings()
    info, tokenizers = rt.loaded()
    ctx = Context(info, tokenizers, rt.settings, rt.admission)
    try:
        # Every request needs a permit for its first input: take it here, on the loop, so a full
        # server refuses at once; the rest are taken after parsing, before tokenizing.
        ctx.admit(1)
        prepared = await rt.run(prepare, await request.body(), ctx)
        timings.tokenization_ms = (time.perf_counter() - timings.started) * 1000
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            outcome = await rt.pool(prepared.tokens, timings, gone, lambda out: render(prepared, out, ctx))
        finally:
            gone.cancel()
        body = outcome.rendered
    except APIError as exc:
        if exc.status == 429:
            rt.metrics.rejections.labels(reason="overloaded").inc()
        raise
    finally:
        ctx.release()
    request.state.access = {"inputs": len(prepared.tokens), "tokens": prepared.n_tokens, "timings": timings}
    return json_response(body, timings)


async def _client_gone(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def envelope(prefix: str, ctx: Context, **fields: Any) -> dict[str, Any]:
    """vLLM's common response fields."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": ctx.model_name,
        **fields,
    }
