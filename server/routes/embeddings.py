"""POST /v1/embeddings (OpenAI) and POST /pooling (vLLM)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.core import inputs, outputs
from server.core.engine_client import Outcome
from server.core.inputs import RequestContext
from server.core.pipeline import Prepared, answer, envelope
from server.kinds import late_interaction, m3, static_sparse
from server.protocols.openai import EmbeddingRequest, PoolingRequest, openapi_body
from server.routes import sparse
from server.texts import chunking, late_chunking
from server.texts.prompts import prompt_text
from server.vision import multimodal

router = APIRouter(tags=["embeddings"])


def check_dimensions(dimensions: int | None, ctx: RequestContext) -> None:
    if dimensions is not None and dimensions > ctx.folder.dimensions:
        raise inputs.bad_request(
            f"dimensions={dimensions} is larger than the model's {ctx.folder.dimensions}", "dimensions"
        )


def prepare_embeddings(raw: bytes, ctx: RequestContext) -> Prepared[Any]:
    if multimodal.names_images(raw):  # vLLM's messages, Infinity's modality
        return multimodal.prepare(raw, ctx)
    body = inputs.parse(EmbeddingRequest, raw)
    ctx.select_model(body.model)
    if ctx.folder.vision is not None:  # a CLIP or SigLIP model's texts (SigLIP's padded)
        return multimodal.prepare(raw, ctx)
    ctx.require("/v1/embeddings", "embedding", "sparse")
    check_dimensions(body.dimensions, ctx)
    sparse.check_sparse_options(body, ctx)
    if ctx.folder.kind == "sparse" and (body.dimensions is not None or body.encoding_format != "float"):
        raise inputs.bad_request(
            "a sparse (SPLADE) model answers {indices, values}: 'dimensions' and base64 do not apply", "encoding_format"
        )
    if static_sparse.static_queries(ctx, body.prompt_name):
        return Prepared(body, [], static_sparse.rows(body.input, ctx, "input"))
    prompt = "" if ctx.folder.idf is not None else prompt_text(ctx.folder, body.prompt_name)  # a role, not a prompt
    if body.late_chunking:
        if body.truncate_prompt_tokens is not None or body.outputs is not None or body.long_inputs is not None:
            raise inputs.bad_request(
                "late_chunking windows the whole document itself: truncate_prompt_tokens, long_inputs and "
                "outputs do not apply",
                "late_chunking",
            )
        tokens, late = late_chunking.tokenize(body.input, ctx, prompt)
        return Prepared(body, tokens, late)
    wanted = m3.asked(body.outputs, ctx)
    if ctx.folder.m3 is not None and "sparse" not in (wanted or ()) and (body.top_k, body.threshold) != (None, None):
        raise inputs.bad_request("'top_k' and 'threshold' prune the sparse output: ask for it in 'outputs'", "top_k")
    if wanted is not None and (body.dimensions is not None or body.encoding_format != "float"):
        raise inputs.bad_request("'dimensions' and base64 apply to the dense vector alone, not to 'outputs'", "outputs")
    tokens, windows = chunking.tokenize(body.input, ctx, body.truncate_prompt_tokens, body.long_inputs, prompt=prompt)
    if wanted is not None:
        return Prepared(body, m3.marked(tokens, wanted, ctx, "input"), windows)
    sparse.budget_rows(ctx, len(tokens), "input")
    return Prepared(body, tokens, windows)


def render_embeddings(prep: Prepared[Any], outcome: Outcome, ctx: RequestContext) -> bytes:
    if isinstance(prep.body, multimodal.MultimodalRequest):
        return multimodal.render(prep, outcome, ctx)
    body = prep.body
    if prep.tokens and prep.tokens[0].outputs:  # bge-m3's outputs, of each input or (chunked) each window
        data = [
            {"object": "embedding", "index": i, **item} for i, item in enumerate(m3.items(outcome.vectors, prep, ctx))
        ]
        return outputs.to_json(envelope("embd", ctx, data=data, usage=prep.usage()))
    if isinstance(prep.extra, static_sparse.Static):
        pooled = prep.extra.rows
    elif isinstance(prep.extra, late_chunking.LateChunks):
        pooled = late_chunking.pooled(outcome.vectors, prep.extra, normalize=False)
    else:
        pooled = chunking.combine(outcome.vectors, prep.extra, sparse=ctx.folder.kind == "sparse")
    if ctx.folder.kind == "sparse":
        rows = sparse.weights(pooled, body, ctx, "input")
        data = [
            {"object": "embedding", "index": i, "embedding": {"indices": indices, "values": values}}
            for i, (indices, values) in enumerate(rows)
        ]
        return outputs.to_json(envelope("embd", ctx, data=data, usage=prep.usage()))
    vectors = outputs.embeddings(pooled, body.dimensions, ctx.folder.normalize)
    data = [
        {"object": "embedding", "index": i, "embedding": outputs.encode_vector(v, body.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    return outputs.to_json(envelope("embd", ctx, data=data, usage=prep.usage()))


def prepare_pooling(raw: bytes, ctx: RequestContext) -> Prepared[PoolingRequest]:
    body = inputs.parse(PoolingRequest, raw)
    ctx.select_model(body.model)
    if ctx.folder.kind == "multi-vector":  # vLLM's token_embed: every token's vector
        if body.outputs is not None:
            raise inputs.bad_request(
                "'outputs' selects a bge-m3 model's outputs; this one answers token vectors", "outputs"
            )
        role = late_interaction.role_of(ctx, body.prompt_name, body.input_type)
        return Prepared(body, late_interaction.tokenize(body.input, ctx, role, body.truncate_prompt_tokens), role)
    prompt = prompt_text(ctx.folder, body.prompt_name)
    wanted = m3.asked(body.outputs, ctx)
    if wanted is not None and body.encoding_format != "float":
        raise inputs.bad_request("base64 applies to a single vector per input, not to 'outputs'", "encoding_format")
    tokens = inputs.tokenize_inputs(body.input, ctx, body.truncate_prompt_tokens, prompt=prompt)
    return Prepared(body, tokens if wanted is None else m3.marked(tokens, wanted, ctx, "input"))


def render_pooling(prep: Prepared[PoolingRequest], outcome: Outcome, ctx: RequestContext) -> bytes:
    """The engine's output as is: pooled hidden states (before Normalize) or classifier logits; a
    multi-vector model's token vectors (those it scores), a list per input."""
    fmt = prep.body.encoding_format
    if prep.tokens and prep.tokens[0].outputs:
        data = [
            {"object": "pooling", "index": i, "data": item}
            for i, item in enumerate(m3.items(outcome.vectors, prep, ctx))
        ]
        return outputs.to_json(envelope("pool", ctx, data=data, usage=prep.usage()))
    if prep.extra is not None:
        rows = late_interaction.token_vectors(prep, outcome, ctx)
        data = [{"object": "pooling", "index": i, "data": outputs.encode_vector(v, fmt)} for i, v in enumerate(rows)]
        return outputs.to_json(envelope("pool", ctx, data=data, usage=prep.usage()))
    data = [
        {"object": "pooling", "index": i, "data": outputs.encode_vector(v, fmt)}
        for i, v in enumerate(outcome.vectors.astype("float32"))
    ]
    return outputs.to_json(envelope("pool", ctx, data=data, usage=prep.usage()))


@router.post("/v1/embeddings", openapi_extra=openapi_body(EmbeddingRequest))
@router.post("/embeddings", openapi_extra=openapi_body(EmbeddingRequest))  # Infinity's path
async def create_embeddings(request: Request) -> Response:
    return await answer(request, prepare_embeddings, render_embeddings)


@router.post("/pooling", openapi_extra=openapi_body(PoolingRequest))
async def pooling(request: Request) -> Response:
    return await answer(request, prepare_pooling, render_pooling)
