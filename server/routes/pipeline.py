"""The request path every pooling route shares: prepare on the executor, engine, render on the executor.

A route supplies two synchronous functions: `prepare(raw, ctx) -> Prepared` and
`render(prepared, outcome, ctx) -> bytes`. Both run on the executor, never on the event loop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from fastapi import Request
from fastapi.responses import Response

from orchestrator.settings import Settings
from server.errors import APIError
from server.ipc import Outcome
from server.modelinfo import ModelInfo
from server.processing import require_kind
from server.runtime import Timings, json_response, runtime
from server.tokenizer import TokenizerPool, Tokens

B = TypeVar("B")


@dataclass(frozen=True)
class Context:
    """What prepare and render may read: the loaded model and the settings."""

    info: ModelInfo
    tokenizers: TokenizerPool
    settings: Settings

    @property
    def model_name(self) -> str:
        return self.settings.model_name

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"model '{name}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
            )

    def require(self, route: str, *kinds: str) -> None:
        require_kind(self.info, route, *kinds)


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
    ctx = Context(info, tokenizers, rt.settings)
    raw = await request.body()
    prepared = await rt.run(prepare, raw, ctx)
    timings.tokenization_ms = (time.perf_counter() - timings.started) * 1000
    outcome = await rt.pool(prepared.tokens, timings)
    return json_response(await rt.run(render, prepared, outcome, ctx), timings)


def envelope(prefix: str, ctx: Context, **fields: Any) -> dict[str, Any]:
    """vLLM's common response fields."""
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": ctx.model_name,
        **fields,
    }
