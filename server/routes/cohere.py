"""Cohere's embed surface: POST /v1/embed and /v2/embed (Cohere's rerank routes are in
routes/score.py). Errors leave in Cohere's shape: {"id", "message"}.

`input_type` picks the model's matching sentence-transformers prompt; `truncate` END (Cohere's
default) cuts the end of a long text, START its start, NONE refuses it; `max_tokens` cuts sooner;
`output_dimension` shortens the vectors (Matryoshka) as `dimensions` does on /v1/embeddings.
`long_inputs: chunk` (or WARMPOOL_LONG_INPUTS=chunk, where the request sets no `truncate`) embeds
a long text as overlapping windows, as on /v1/embeddings.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import kinds
from server.core import inputs, outputs
from server.core.ids import random_uuid
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared, answer
from server.kinds.base import Ask, check_dimensions
from server.protocols.cohere import CohereEmbedRequest
from server.protocols.openai import openapi_body
from server.texts.prompts import prompt_for_input_type
from server.vision import multimodal

router = APIRouter(tags=["cohere"])


def prepare_embed(raw: bytes, ctx: RequestContext) -> Prepared[Ask, Any]:
    body = inputs.parse(CohereEmbedRequest, raw)
    ctx.select_model(body.model)
    ctx.require("/v2/embed", "embedding")
    kind = kinds.of(ctx)
    if kind.takes_images:  # a CLIP or SigLIP model: texts, images or both kinds of inputs
        check_dimensions(body.output_dimension, ctx)
        items, field = multimodal.cohere_items(body.texts, body.images, body.inputs)
        limit = None if body.truncate == "NONE" else min(body.max_tokens or -1, ctx.folder.max_model_len)
        encoded = multimodal.encode(items, ctx, field, limit)
        return Prepared(Ask(None, field, dimensions=body.output_dimension, request=body), encoded.tokens, encoded)
    if body.texts is None:
        field = "images" if body.images is not None else "inputs" if body.inputs is not None else "texts"
        raise inputs.bad_request(
            "'texts' is required: this model embeds text only (images need a CLIP or SigLIP model)", field
        )
    truncate = None
    if body.truncate != "NONE":
        truncate = -1 if body.max_tokens is None else min(body.max_tokens, ctx.folder.max_model_len)
    unset = body.long_inputs is None and not {"truncate", "max_tokens"} & body.model_fields_set
    chunk = body.max_tokens is None and (body.long_inputs == "chunk" or (unset and ctx.settings.long_inputs == "chunk"))
    ask = Ask(
        body.texts,
        "texts",
        None if chunk else truncate,
        "chunk" if chunk else "refuse",
        prompt=prompt_for_input_type(ctx.folder, body.input_type),
        direction="left" if body.truncate == "START" else "right",
        dimensions=body.output_dimension,
        request=body,
    )
    return kind.embed(ask, ctx)


def by_type(prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> dict[str, list[Any]]:
    """The embeddings in every type asked for (float when none is)."""
    kind = kinds.of(ctx)
    assert isinstance(kind, kinds.Dense)  # the route serves embedding models alone
    vectors = kind.vectors(prep, outcome, ctx)
    types = prep.body.request.embedding_types
    return {name: outputs.encode_vectors(vectors, name) for name in dict.fromkeys(types or ["float"])}


def envelope(prep: Prepared[Ask, Any], version: str, **fields: Any) -> bytes:
    """Cohere's answer: `texts` echoes the texts sent, `images` describes the images (of `images` or
    `inputs`) as they were sent, in order."""
    pictures = prep.state.described() if isinstance(prep.state, multimodal.Encoded) else []
    return outputs.to_json(
        {
            "id": random_uuid(),
            **fields,
            "texts": prep.body.request.texts,
            **({"images": [dataclasses.asdict(p) for p in pictures]} if pictures else {}),
            "meta": {"api_version": {"version": version}, "billed_units": {"input_tokens": prep.n_tokens}},
        }
    )


def render_v1(prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
    """v1 answers a bare list of floats unless embedding types were asked for."""
    if prep.body.request.embedding_types is None:
        floats = by_type(prep, outcome, ctx)["float"]
        return envelope(prep, "1", response_type="embeddings_floats", embeddings=floats)
    return envelope(prep, "1", response_type="embeddings_by_type", embeddings=by_type(prep, outcome, ctx))


def render_v2(prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
    return envelope(prep, "2", response_type="embeddings_by_type", embeddings=by_type(prep, outcome, ctx))


@router.post("/v1/embed", openapi_extra=openapi_body(CohereEmbedRequest))
async def embed_v1(request: Request) -> Response:
    return await answer(request, prepare_embed, render_v1, shape="cohere")


@router.post("/v2/embed", openapi_extra=openapi_body(CohereEmbedRequest))
async def embed_v2(request: Request) -> Response:
    return await answer(request, prepare_embed, render_v2, shape="cohere")
