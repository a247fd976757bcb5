"""Sparse (SPLADE) vectors: TEI's POST /embed_sparse, one weight per vocabulary entry that has one,
as TEI's `[[{"index": i, "value": w}, ...], ...]` (server/kinds/sparse.py makes them; bge-m3's
lexical weights too)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import kinds
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared, answer
from server.kinds.base import Ask
from server.protocols.openai import SparseOptions, openapi_body
from server.protocols.tei import TEIEmbedSparseRequest, truncation

router = APIRouter(tags=["tei"])


def prepare_embed_sparse(raw: bytes, ctx: RequestContext) -> Prepared[Ask, Any]:
    body = inputs.parse(TEIEmbedSparseRequest, raw)
    kind = kinds.of(ctx)
    m3 = isinstance(kind, kinds.M3)
    if not m3:
        ctx.require("/embed_sparse", "sparse")
    ask = Ask(
        body.inputs,
        "inputs",
        truncation(body),
        body.long_inputs,
        body.prompt_name,
        direction=body.truncation_direction,
        outputs=("sparse",) if m3 else None,  # bge-m3: its lexical weights
        outputs_field="inputs",
        sparse=SparseOptions(top_k=body.top_k, threshold=body.threshold),
    )
    return kinds.of(ctx).embed(ask, ctx)


def render_embed_sparse(prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
    """TEI's shape."""
    found = kinds.of(ctx).lexical(prep, outcome, ctx)
    return outputs.to_json(
        [[{"index": i, "value": v} for i, v in zip(w["indices"], w["values"], strict=True)] for w in found]
    )


@router.post("/embed_sparse", openapi_extra=openapi_body(TEIEmbedSparseRequest))
async def embed_sparse(request: Request) -> Response:
    return await answer(request, prepare_embed_sparse, render_embed_sparse, shape="tei")
