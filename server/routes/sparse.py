"""Sparse (SPLADE) vectors: TEI's POST /embed_sparse, one weight per vocabulary entry that has one.

The engine returns each input's full [vocabulary] row of SPLADE weights; only the non-zero ones
are answered, in index order: TEI's `[[{"index": i, "value": w}, ...], ...]` here, and
`{"indices": [...], "values": [...]}` (what Qdrant and Milvus store) on /v1/embeddings.
"""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.core import inputs, outputs
from server.core.engine_client import Outcome
from server.core.inputs import RequestContext
from server.core.pipeline import Prepared, answer
from server.kinds import m3, static_sparse
from server.protocols.openai import SparseOptions, openapi_body
from server.protocols.tei import TEIEmbedSparseRequest, truncation
from server.texts import chunking
from server.texts.prompts import prompt_text

router = APIRouter(tags=["tei"])

ROW_BYTES_PER_ENTRY = 4  # the engine sends each input's whole [vocabulary] float32 row


def budget_rows(ctx: RequestContext, inputs_: int, field: str) -> None:
    """Before any work: the engine's rows for a sparse model are vocabulary-wide, whatever the answer
    keeps of them (30,522 x 4 bytes an input: 128 MiB is ~1,100 inputs)."""
    if ctx.folder.kind == "sparse":
        ctx.budget_response(inputs_ * ctx.folder.vocab_size * ROW_BYTES_PER_ENTRY, field)


def prepare_embed_sparse(raw: bytes, ctx: RequestContext) -> Prepared[TEIEmbedSparseRequest]:
    body = inputs.parse(TEIEmbedSparseRequest, raw)
    if ctx.folder.m3 is None:
        ctx.require("/embed_sparse", "sparse")
    if static_sparse.static_queries(ctx, body.prompt_name):
        return Prepared(body, [], static_sparse.rows(body.inputs, ctx, "inputs"))
    prompt = "" if ctx.folder.idf is not None else prompt_text(ctx.folder, body.prompt_name)  # a role, not a prompt
    tokens, windows = chunking.tokenize(
        body.inputs,
        ctx,
        truncation(body),
        body.long_inputs,
        "inputs",
        prompt=prompt,
        direction=body.truncation_direction,
    )
    if ctx.folder.m3 is not None:  # bge-m3: its lexical weights
        wanted = m3.asked(["sparse"], ctx, "inputs")
        assert wanted is not None
        return Prepared(body, m3.marked(tokens, wanted, ctx, "inputs"), windows)
    budget_rows(ctx, len(tokens), "inputs")
    return Prepared(body, tokens, windows)


def weights(
    rows: np.ndarray, options: SparseOptions, ctx: RequestContext, field: str = "inputs"
) -> list[tuple[list[int], list[float]]]:
    """Each row's non-zero weights as (indices ascending, values): those above `threshold`, the
    `top_k` largest of them; sized (outputs.ENTRY_BYTES a weight) against the response budget first."""
    kept = rows > (options.threshold or 0.0)
    if options.top_k is not None:
        beyond = np.argsort(-rows, axis=1, kind="stable")[:, options.top_k :]
        np.put_along_axis(kept, beyond, False, axis=1)
    ctx.budget_response(int(kept.sum()) * outputs.ENTRY_BYTES, field)
    found = []
    for row, keep in zip(rows, kept, strict=True):
        indices = np.flatnonzero(keep)
        found.append((indices.tolist(), row[indices].astype(np.float32).tolist()))
    return found


def check_sparse_options(options: SparseOptions, ctx: RequestContext) -> None:
    """top_k and threshold prune a sparse model's (or bge-m3's lexical) weights: on any other
    model they are a 400."""
    if ctx.folder.kind != "sparse" and ctx.folder.m3 is None:
        for name in ("top_k", "threshold"):
            if getattr(options, name) is not None:
                raise inputs.bad_request(f"'{name}' applies to sparse (SPLADE) models only", name)


def render_embed_sparse(prep: Prepared[TEIEmbedSparseRequest], outcome: Outcome, ctx: RequestContext) -> bytes:
    """TEI's shape."""
    if prep.tokens and prep.tokens[0].outputs:
        found = [item["sparse"] for item in m3.items(outcome.vectors, prep, ctx)]
        rows = [(f["indices"], f["values"]) for f in found]
    else:
        found_rows = prep.extra.rows if isinstance(prep.extra, static_sparse.Static) else outcome.vectors
        windows = None if isinstance(prep.extra, static_sparse.Static) else prep.extra
        rows = weights(chunking.combine(found_rows, windows, sparse=True), prep.body, ctx)
    return outputs.to_json(
        [[{"index": i, "value": v} for i, v in zip(indices, values, strict=True)] for indices, values in rows]
    )


@router.post("/embed_sparse", openapi_extra=openapi_body(TEIEmbedSparseRequest))
async def embed_sparse(request: Request) -> Response:
    return await answer(request, prepare_embed_sparse, render_embed_sparse, shape="tei")
