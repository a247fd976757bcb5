"""POST /score (vLLM); POST /rerank, /v1/rerank (Jina/Cohere v1) and /v2/rerank (Cohere v2); a
/rerank asked in TEI's shape (`texts`) is answered in TEI's shape.

Cross-encoders score each (query, document) pair in one forward pass; for embedding models the
score is the cosine similarity of the two embeddings, as vLLM does for bi-encoders, for sparse
(SPLADE) models the dot product of the two weight vectors, as SparseEncoder.similarity is, and for
multi-vector (ColBERT) models MaxSim of the query's and the document's token vectors. On a CLIP or
SigLIP model either side may hold images (vLLM's {"content": [parts]} on /score, Jina's {"image"}
documents on /rerank), scored by the cosine in the shared space.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from common.wire import Tokens
from server.core import inputs, outputs
from server.core.engine_client import Outcome
from server.core.inputs import RequestContext
from server.core.pipeline import Prepared, answer, envelope
from server.kinds import late_interaction, static_sparse
from server.protocols.openai import DocumentImage, DocumentText, RerankRequest, ScoreContent, ScoreRequest, openapi_body
from server.routes import sparse
from server.tokenizing.tokenizer import Direction
from server.vision import multimodal

router = APIRouter(tags=["scoring"])
SCORERS = ("cross-encoder", "embedding", "sparse", "multi-vector")


@dataclass(frozen=True)
class Pairs:
    """Which token lists hold each pair's sides (bi-encoder), or one list per pair (cross)."""

    count: int
    cross: bool
    left: list[int]
    right: list[int]
    dot: bool = False  # a bi-encoder scored by the dot product (sparse models), not the cosine
    late: list[Tokens] | None = None  # a multi-vector model's token lists: scored by MaxSim
    static: np.ndarray | None = None  # an inference-free sparse model's query rows: `left` indexes these


def tokenize_pairs(
    lefts: list[str],
    rights: list[str],
    ctx: RequestContext,
    truncate: int | None,
    fields: tuple[str, str],
    direction: Direction = "right",
    static_queries: bool = True,
) -> tuple[list[Tokens], Pairs]:
    """Token lists for the pairs: one per pair for a cross-encoder, one per unique text for a
    bi-encoder (one admission permit per list). Errors name the request's own `fields`.

    Every text is checked once, before any pairing: a long query is refused (or cut) once, not
    tokenized again against each document."""
    if ctx.folder.kind == "multi-vector":
        return _late_pairs(lefts, rights, ctx, truncate, fields, direction)
    if ctx.folder.vision is not None:  # a CLIP or SigLIP model's texts, as /v1/embeddings encodes them
        return shared_space_pairs([("text", t) for t in lefts], [("text", t) for t in rights], ctx, truncate, fields)
    if ctx.folder.idf is not None and static_queries:  # queries by their tokens' static weights, documents by the model
        queries = list(dict.fromkeys(lefts))
        static = static_sparse.rows(queries, ctx, fields[0]).rows
        tokens, pairs = tokenize_pairs(rights, rights, ctx, truncate, (fields[1], fields[1]), direction, False)
        at = {text: i for i, text in enumerate(queries)}
        return tokens, Pairs(len(lefts), False, [at[t] for t in lefts], pairs.right, dot=True, static=static)
    cross = ctx.folder.kind == "cross-encoder"
    limit = inputs.truncation_limit(truncate, ctx, pair=cross)
    left_field, right_field = fields
    one_left = len(set(lefts)) == 1  # a query against every document
    origin: dict[str, str] = {}
    for i, text in enumerate(lefts):
        origin.setdefault(text, left_field if one_left else f"{left_field}[{i}]")
    for i, text in enumerate(rights):
        origin.setdefault(text, f"{right_field}[{i}]")
    ctx.admit(len(lefts) if cross else len(origin), right_field)
    texts = {text: inputs.capped(text, ctx.folder, name, limit is not None, direction) for text, name in origin.items()}
    if cross:
        if limit is None:  # each query alone must fit before it is paired with every document
            queries = list(dict.fromkeys(lefts))
            for query, tok in zip(queries, ctx.tokenizers.encode_batch([texts[q] for q in queries]), strict=True):
                inputs.check_length(len(tok.input_ids), ctx.folder, origin[query])
        tokens = ctx.tokenizers.encode_pairs(
            [(texts[q], texts[d]) for q, d in zip(lefts, rights, strict=True)], limit, direction
        )
        index = list(range(len(tokens)))
        pairs = Pairs(len(tokens), True, index, index)
        where = [f"{right_field}[{i}]" for i in index]
    else:
        unique = list(origin)
        position = {text: i for i, text in enumerate(unique)}
        tokens = ctx.tokenizers.encode_batch([texts[t] for t in unique], limit, direction)
        left, right = [position[t] for t in lefts], [position[t] for t in rights]
        pairs = Pairs(len(lefts), False, left, right, dot=ctx.folder.kind == "sparse")
        sparse.budget_rows(ctx, len(tokens), right_field)
        where = [origin[text] for text in unique]
    for tok, name in zip(tokens, where, strict=True):
        inputs.check_length(len(tok.input_ids), ctx.folder, name)
    return tokens, pairs


def shared_space_pairs(
    lefts: list[multimodal.Item],
    rights: list[multimodal.Item],
    ctx: RequestContext,
    truncate: int | None,
    fields: tuple[str, str],
) -> tuple[list[Tokens], Pairs]:
    """A CLIP or SigLIP model's pairs of texts and images, scored by the cosine in its shared space:
    each distinct input of a side encoded once (a query against N images is tokenized once)."""
    left, right = list(dict.fromkeys(lefts)), list(dict.fromkeys(rights))
    ctx.admit(len(left) + len(right), fields[1])  # both encodes below are covered by these permits
    tokens = multimodal.encode(left, ctx, fields[0], truncate).tokens
    tokens += multimodal.encode(right, ctx, fields[1], truncate).tokens
    left_at = {item: i for i, item in enumerate(left)}
    right_at = {item: len(left) + i for i, item in enumerate(right)}
    return tokens, Pairs(len(lefts), False, [left_at[x] for x in lefts], [right_at[x] for x in rights])


def _late_pairs(
    lefts: list[str],
    rights: list[str],
    ctx: RequestContext,
    truncate: int | None,
    fields: tuple[str, str],
    direction: Direction,
) -> tuple[list[Tokens], Pairs]:
    """A multi-vector model's pairs: each distinct left text encoded once as a query, each distinct
    right text once as a document (a text on both sides is encoded both ways)."""
    queries, documents = list(dict.fromkeys(lefts)), list(dict.fromkeys(rights))
    left_field, right_field = fields
    ctx.admit(len(queries) + len(documents), right_field)  # every list the engine runs, both roles
    tokens = late_interaction.tokenize(queries, ctx, "query", truncate, left_field, direction, vectors=False)
    tokens += late_interaction.tokenize(documents, ctx, "document", truncate, right_field, direction, vectors=False)
    query_at = {text: i for i, text in enumerate(queries)}
    document_at = {text: len(queries) + i for i, text in enumerate(documents)}
    left, right = [query_at[t] for t in lefts], [document_at[t] for t in rights]
    return tokens, Pairs(len(lefts), False, left, right, late=tokens)


def pair_scores(vectors: np.ndarray, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
    """Cross-encoder scores (logits when `raw`, else sigmoid, as CrossEncoder.predict gives them),
    or the cosine similarity (dot product, for sparse models; MaxSim of the token vectors, for
    multi-vector models) of each pair's vectors."""
    if pairs.late is not None:
        late = pairs.late
        queries = {a: late_interaction.kept(vectors[a], late[a], "query", ctx) for a in set(pairs.left)}
        documents = {b: late_interaction.kept(vectors[b], late[b], "document", ctx) for b in set(pairs.right)}
        pairs_at = zip(pairs.left, pairs.right, strict=True)
        return np.array([late_interaction.maxsim(queries[a], documents[b]) for a, b in pairs_at])
    if pairs.static is not None:
        return (pairs.static[pairs.left].astype(np.float64) * vectors[pairs.right].astype(np.float64)).sum(axis=1)
    if pairs.cross:
        return outputs.scores(vectors, raw)[:, 0]
    unit = (vectors if pairs.dot else outputs.normalize(vectors)).astype(np.float64)
    return (unit[pairs.left] * unit[pairs.right]).sum(axis=1)


def score_items(side: str | list[str] | ScoreContent, field: str) -> list[multimodal.Item]:
    """A side of /score as items: texts, or vLLM's {"content": [parts]} (one input per part)."""
    if isinstance(side, str):
        return [("text", side)]
    if isinstance(side, list):
        return [("text", text) for text in side]
    return [multimodal.part_item(p.model_dump(), f"{field}.content[{i}]") for i, p in enumerate(side.content)]


def prepare_score(raw: bytes, ctx: RequestContext) -> Prepared[ScoreRequest]:
    body = inputs.parse(ScoreRequest, raw)
    ctx.select_model(body.model)
    ctx.require("/score", *SCORERS)
    lefts, rights = score_items(body.text_1, "text_1"), score_items(body.text_2, "text_2")
    if not lefts or not rights:
        raise inputs.bad_request("text_1 and text_2 must not be empty", "text_2" if lefts else "text_1")
    if len(lefts) == 1:
        lefts = lefts * len(rights)
    elif len(lefts) != len(rights):
        raise inputs.bad_request(
            f"text_1 has {len(lefts)} inputs and text_2 has {len(rights)}: give one text_1 "
            "to score against every text_2, or as many text_1 as text_2 to score them pairwise",
            "text_2",
        )
    fields, truncate = ("text_1", "text_2"), body.truncate_prompt_tokens
    if ctx.folder.vision is not None:
        tokens, pairs = shared_space_pairs(lefts, rights, ctx, truncate, fields)
        return Prepared(body, tokens, pairs)
    for field, items in zip(fields, (lefts, rights), strict=True):
        if any(kind == "image" for kind, _ in items):
            multimodal.vision_of(ctx, field)  # a text-only model: a 400 that says which models take images
    tokens, pairs = tokenize_pairs([s for _, s in lefts], [s for _, s in rights], ctx, truncate, fields)
    return Prepared(body, tokens, pairs)


def render_score(prep: Prepared[ScoreRequest], outcome: Outcome, ctx: RequestContext) -> bytes:
    scores = pair_scores(outcome.vectors, prep.extra, ctx)
    data = [{"index": i, "object": "score", "score": float(s)} for i, s in enumerate(scores)]
    return outputs.to_json(envelope("score", ctx, data=data, usage=prep.usage()))


def prepare_rerank(raw: bytes, ctx: RequestContext) -> Prepared[RerankRequest]:
    data = inputs.parse_object(raw)
    tei = ctx.shape == "openai" and "texts" in data and "documents" not in data
    if tei:  # asked in TEI's shape: answered in it, errors included
        ctx.shape = "tei"
    body = inputs.validate(RerankRequest, data)
    ctx.select_model(body.model)
    ctx.require("/rerank", *SCORERS)
    field = "texts" if body.documents is None else "documents"
    given = body.texts if body.documents is None else body.documents
    if given is None:
        raise inputs.bad_request("missing required field 'documents'", "documents")
    if not given:
        raise inputs.bad_request(f"'{field}' must not be empty", field)
    if body.top_n is not None and body.top_n <= 0:
        raise inputs.bad_request(f"top_n must be a positive integer, got {body.top_n}", "top_n")
    truncate = -1 if body.truncate else body.truncate_prompt_tokens
    if ctx.folder.vision is not None or any(isinstance(d, DocumentImage) for d in given):
        return _rerank_images(body, given, ctx, field, truncate, tei)
    documents: list[Any] = [d.text if isinstance(d, DocumentText) else d for d in given]
    tokens, pairs = tokenize_pairs(
        [body.query] * len(documents), documents, ctx, truncate, ("query", field), body.truncation_direction
    )
    return Prepared(body, tokens, (pairs, documents, tei))


def _rerank_images(
    body: RerankRequest, given: list[Any], ctx: RequestContext, field: str, truncate: int | None, tei: bool
) -> Prepared[RerankRequest]:
    """A text query against texts and images (Jina's {"image": ...} documents), on a CLIP or SigLIP
    model: the cosine of the query's vector and each document's, in the shared space."""
    items: list[multimodal.Item] = [
        ("image", d.image) if isinstance(d, DocumentImage) else ("text", d.text if isinstance(d, DocumentText) else d)
        for d in given
    ]
    tokens, pairs = shared_space_pairs([("text", body.query)] * len(items), items, ctx, truncate, ("query", field))
    documents = [d if isinstance(d, DocumentImage) else s for d, (_, s) in zip(given, items, strict=True)]
    return Prepared(body, tokens, (pairs, documents, tei))


def ranked(prep: Prepared[RerankRequest], vectors: np.ndarray, ctx: RequestContext) -> tuple[np.ndarray, list[int]]:
    """The scores and the documents' indices best first, cut to top_n."""
    pairs = prep.extra[0]
    scores = pair_scores(vectors, pairs, ctx, raw=prep.body.raw_scores)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return scores, order[: prep.body.top_n or len(scores)]


def render_rerank(prep: Prepared[RerankRequest], outcome: Outcome, ctx: RequestContext) -> bytes:
    """Jina/Cohere's {"results": [{index, relevance_score, document}]}, or TEI's bare ranked list."""
    _, documents, tei = prep.extra
    scores, order = ranked(prep, outcome.vectors, ctx)
    if tei:
        text = prep.body.return_text
        return outputs.to_json(
            [{"index": i, "score": float(scores[i]), **({"text": documents[i]} if text else {})} for i in order]
        )
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if prep.body.return_documents:
            document = documents[i]
            result["document"] = (
                {"image": document.image} if isinstance(document, DocumentImage) else {"text": document}
            )
        results.append(result)
    return outputs.to_json(
        {
            "id": f"rerank-{uuid.uuid4().hex}",
            "model": ctx.model_name,
            "usage": {"prompt_tokens": prep.n_tokens, "total_tokens": prep.n_tokens},
            "results": results,
            "meta": {"billed_units": {"search_units": 1, "input_tokens": prep.n_tokens}},
        }
    )


@router.post("/score", openapi_extra=openapi_body(ScoreRequest))
async def score(request: Request) -> Response:
    return await answer(request, prepare_score, render_score)


@router.post("/rerank", openapi_extra=openapi_body(RerankRequest))
@router.post("/v1/rerank", openapi_extra=openapi_body(RerankRequest))
async def rerank(request: Request) -> Response:
    return await answer(request, prepare_rerank, render_rerank)


@router.post("/v2/rerank", openapi_extra=openapi_body(RerankRequest))
async def cohere_rerank(request: Request) -> Response:
    """Cohere v2: the same ranking, with Cohere's error body."""
    return await answer(request, prepare_rerank, render_rerank, shape="cohere")
