"""POST /v1/embeddings (OpenAI), POST /pooling (vLLM) and POST /embed (TEI)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import processing
from server.ipc import Outcome
from server.processing import Context
from server.protocol import EmbeddingRequest, PoolingRequest, TEIEmbedRequest, openapi_body
from server.routes.pipeline import Prepared, envelope, serve

router = APIRouter(tags=["embeddings"])


def check_dimensions(dimensions: int | None, ctx: Context) -> None:
    if dimensions is not None and dimensions > ctx.info.dimensions:
        raise processing.bad_request(
            f"dimensions={dimensions} is larger than the model's {ctx.info.dimensions}", "dimensions"
        )


def prepare_embeddings(raw: bytes, ctx: Context) -> Prepared[EmbeddingRequest]:
    body = processing.parse(EmbeddingRequest, raw)
    ctx.check_model(body.model)
    ctx.require("/v1/embeddings", "embedding")
    check_dimensions(body.dimensions, ctx)
    tokens = processing.tokenize_inputs(body.input, ctx, body.truncate_prompt_tokens)
    return Prepared(body, tokens)


def render_embeddings(prep: Prepared[EmbeddingRequest], outcome: Outcome, ctx: Context) -> bytes:
    body = prep.body
    vectors = processing.embeddings(outcome.vectors, body.dimensions, ctx.info.normalize)
    data = [
        {"object": "embedding", "index": i, "embedding": processing.encode_vector(v, body.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    return processing.to_json({"object": "list", "data": data, "model": ctx.model_name, "usage": prep.usage()})


def prepare_pooling(raw: bytes, ctx: Context) -> Prepared[PoolingRequest]:
    body = processing.parse(PoolingRequest, raw)
    ctx.check_model(body.model)
    tokens = processing.tokenize_inputs(body.input, ctx, body.truncate_prompt_tokens)
    return Prepared(body, tokens)


def render_pooling(prep: Prepared[PoolingRequest], outcome: Outcome, ctx: Context) -> bytes:
    """The engine's output as is: pooled hidden states (before Normalize) or classifier logits."""
    fmt = prep.body.encoding_format
    data = [
        {"object": "pooling", "index": i, "data": processing.encode_vector(v, fmt)}
        for i, v in enumerate(outcome.vectors.astype("float32"))
    ]
    return processing.to_json(envelope("pool", ctx, data=data, usage=prep.usage()))


def prepare_tei_embed(raw: bytes, ctx: Context) -> Prepared[TEIEmbedRequest]:
    body = processing.parse(TEIEmbedRequest, raw)
    ctx.require("/embed", "embedding")
    check_dimensions(body.dimensions, ctx)
    truncate = -1 if body.truncate else None
    tokens = processing.tokenize_inputs(body.inputs, ctx, truncate, "inputs")
    return Prepared(body, tokens)


def render_tei_embed(prep: Prepared[TEIEmbedRequest], outcome: Outcome, ctx: Context) -> bytes:
    """TEI answers a bare list of vectors."""
    return processing.to_json(processing.embeddings(outcome.vectors, prep.body.dimensions, prep.body.normalize))


@router.post("/v1/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
async def create_embeddings(request: Request) -> Response:
    return await serve(request, prepare_embeddings, render_embeddings)


@router.post("/pooling", openapi_extra=openapi_body(PoolingRequest))
async def pooling(request: Request) -> Response:
    return await serve(request, prepare_pooling, render_pooling)


@router.post("/embed", openapi_extra=openapi_body(TEIEmbedRequest))
async def tei_embed(request: Request) -> Response:
    return await serve(request, prepare_tei_embed, render_tei_embed)
