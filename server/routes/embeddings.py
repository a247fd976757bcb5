"""POST /v1/embeddings, OpenAI's shape."""

from __future__ import annotations

import time
from dataclasses import dataclass

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import processing
from server.errors import APIError
from server.ipc import Outcome
from server.modelinfo import ModelInfo
from server.protocol import EmbeddingRequest, openapi_body
from server.runtime import Runtime, Timings, json_response, runtime
from server.tokenizer import TokenizerPool, Tokens

router = APIRouter(tags=["embeddings"])


@dataclass
class Prepared:
    body: EmbeddingRequest
    tokens: list[Tokens]
    tokenization_ms: float


def check_model(rt: Runtime, name: str | None) -> None:
    if name is not None and name != rt.settings.model_name:
        raise APIError(
            404,
            f"model '{name}' does not exist; this server serves '{rt.settings.model_name}'",
            param="model",
            code="model_not_found",
        )


def prepare(raw: bytes, rt: Runtime, info: ModelInfo, tokenizers: TokenizerPool) -> Prepared:
    started = time.perf_counter()
    body = processing.parse(EmbeddingRequest, raw)
    check_model(rt, body.model)
    processing.require_kind(info, "/v1/embeddings", "embedding")
    if body.dimensions is not None and body.dimensions > info.dimensions:
        raise processing.bad_request(
            f"dimensions={body.dimensions} is larger than the model's {info.dimensions}",
            "dimensions",
        )
    tokens = processing.tokenize_inputs(
        body.input,
        info,
        tokenizers,
        body.truncate_prompt_tokens,
        rt.settings.max_inputs_per_request,
    )
    return Prepared(body, tokens, (time.perf_counter() - started) * 1000)


def render(prep: Prepared, outcome: Outcome, info: ModelInfo, model_name: str) -> bytes:
    body = prep.body
    vectors = processing.embeddings(outcome.vectors, info, body.dimensions, info.normalize)
    n_tokens = sum(len(t.input_ids) for t in prep.tokens)
    return processing.to_json(
        {
            "object": "list",
            "data": [
                {
                    "object": "embedding",
                    "index": i,
                    "embedding": processing.encode_vector(v, body.encoding_format),
                }
                for i, v in enumerate(vectors)
            ],
            "model": model_name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        }
    )


@router.post("/v1/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
async def create_embeddings(request: Request) -> Response:
    rt = runtime(request)
    timings = Timings()
    info, tokenizers = rt.loaded()
    prep = await rt.run(prepare, await request.body(), rt, info, tokenizers)
    timings.tokenization_ms = prep.tokenization_ms
    outcome = await rt.pool(prep.tokens, timings)
    return json_response(await rt.run(render, prep, outcome, info, rt.settings.model_name), timings)
