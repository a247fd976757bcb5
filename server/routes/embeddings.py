"""POST /v1/embeddings (OpenAI) and POST /pooling (vLLM)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import kinds
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared, answer
from server.kinds import m3
from server.kinds.base import Ask
from server.protocols.openai import EmbeddingRequest, PoolingRequest, SparseOptions, VectorEncoding, openapi_body
from server.texts.prompts import prompt_text
from server.vision import multimodal

router = APIRouter(tags=["embeddings"])


def ask_of(body: EmbeddingRequest) -> Ask:
    return Ask(
        body.input,
        truncate=body.truncate_prompt_tokens,
        long_inputs=body.long_inputs,
        prompt_name=body.prompt_name,
        dimensions=body.dimensions,
        encoding=VectorEncoding.of(body),
        outputs=None if body.outputs is None else tuple(body.outputs),
        sparse=SparseOptions(top_k=body.top_k, threshold=body.threshold),
        late_chunking=body.late_chunking,
    )


def prepare_embeddings(raw: bytes, ctx: RequestContext) -> Prepared[Ask, Any]:
    if multimodal.names_images(raw):  # vLLM's messages, Infinity's modality
        return multimodal.prepare(raw, ctx)
    body = inputs.parse(EmbeddingRequest, raw)
    ctx.select_model(body.model)
    if kinds.of(ctx).takes_images:  # its texts as its processor makes them (SigLIP's padded)
        return multimodal.prepare(raw, ctx)
    ctx.require("/v1/embeddings", "embedding", "sparse")
    return kinds.of(ctx).embed(ask_of(body), ctx)


def render_embeddings(prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> bytes | outputs.RawBody:
    items = kinds.of(ctx).items(prep, outcome, ctx)
    encoding = prep.body.encoding
    if encoding.encoding_format in outputs.RAW:
        vectors = [item["embedding"] for item in items]
        meta = outputs.envelope("embd", ctx, usage=prep.usage())
        return outputs.raw_vectors(vectors, encoding.encoding_format, encoding.embed_dtype, encoding.endianness, meta)
    data = [{"object": "embedding", "index": i, **item} for i, item in enumerate(items)]
    return outputs.to_json(outputs.envelope("embd", ctx, data=data, usage=prep.usage()))


def prepare_pooling(raw: bytes, ctx: RequestContext) -> Prepared[PoolingRequest, Any]:
    body = inputs.parse(PoolingRequest, raw)
    ctx.select_model(body.model)
    kind = kinds.of(ctx)
    if isinstance(kind, kinds.MultiVector):  # vLLM's token_embed: every token's vector
        asked = None if body.outputs is None else tuple(body.outputs)
        ask = Ask(
            body.input,
            truncate=body.truncate_prompt_tokens,
            prompt_name=body.prompt_name,
            outputs=asked,
            input_type=body.input_type,
        )
        inner = kind.embed_tokens(ask, ctx)
        return Prepared(body, inner.tokens, inner)
    prompt = prompt_text(ctx.folder, body.prompt_name)
    wanted = m3.asked(body.outputs, ctx)
    if wanted is not None and body.encoding_format != "float":
        raise inputs.bad_request(
            f"encoding_format={body.encoding_format} applies to a single vector per input, not to 'outputs'",
            "encoding_format",
        )
    tokens = inputs.tokenize_inputs(body.input, ctx, body.truncate_prompt_tokens, prompt=prompt)
    if wanted is None:
        return Prepared(body, tokens)
    return Prepared(body, m3.marked(tokens, wanted, ctx, "input"), m3.Asked(wanted, None))


def render_pooling(
    prep: Prepared[PoolingRequest, Any], outcome: Outcome, ctx: RequestContext
) -> bytes | outputs.RawBody:
    """The engine's output as is: pooled hidden states (before Normalize) or classifier logits; a
    multi-vector model's token vectors (those it scores), a list per input."""
    body, state = prep.body, prep.state
    if isinstance(state, m3.Asked):
        options = SparseOptions(top_k=None, threshold=None)
        items = m3.answers(outcome.vectors, prep.tokens, None, options, ctx)
        data = [{"object": "pooling", "index": i, "data": item} for i, item in enumerate(items)]
        return outputs.to_json(outputs.envelope("pool", ctx, data=data, usage=prep.usage()))
    encoding = (body.encoding_format, body.embed_dtype, body.endianness)
    rows = kinds.of(ctx).token_items(state, outcome, ctx) if state is not None else outcome.vectors.astype("float32")
    if body.encoding_format in outputs.RAW:
        return outputs.raw_vectors(list(rows), *encoding, outputs.envelope("pool", ctx, usage=prep.usage()))
    data = [{"object": "pooling", "index": i, "data": outputs.encode_vector(v, *encoding)} for i, v in enumerate(rows)]
    return outputs.to_json(outputs.envelope("pool", ctx, data=data, usage=prep.usage()))


@router.post("/v1/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
@router.post("/embeddings", openapi_extra=openapi_body(EmbeddingRequest))  # Infinity's path
async def create_embeddings(request: Request) -> Response:
    return await answer(request, prepare_embeddings, render_embeddings)


@router.post("/pooling", openapi_extra=openapi_body(PoolingRequest))
async def pooling(request: Request) -> Response:
    return await answer(request, prepare_pooling, render_pooling)
