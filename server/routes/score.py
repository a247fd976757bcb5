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

from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from common.wire import Tokens
from server import kinds
from server.core import inputs, outputs
from server.core.ids import random_hex
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared, answer
from server.kinds.image_text import shared_space_pairs
from server.kinds.pairs import PairAsk, Pairs
from server.protocols.openai import DocumentImage, DocumentText, RerankRequest, ScoreContent, ScoreRequest, openapi_body
from server.texts import passages
from server.texts.passages import Passages
from server.tokenizing.tokenizer import Direction
from server.vision import multimodal

router = APIRouter(tags=["scoring"])
SCORERS = ("cross-encoder", "embedding", "sparse", "multi-vector")


@dataclass(frozen=True)
class Scored:
    """A scoring request's pairs as the engine runs them, and, for long documents chunked, its passages."""

    pairs: Pairs
    passages: Passages | None = None
    count: int = 0  # the request's pairs (the passages fold back into these)

    def scores(self, vectors: np.ndarray, ctx: RequestContext, raw: bool = False) -> tuple[np.ndarray, list[Span]]:
        """Each of the request's pairs' score, and where chunked, its best passage's span."""
        scores = pair_scores(vectors, self.pairs, ctx, raw)
        if self.passages is None:
            return scores, []
        return self.passages.fold(scores, self.count)


Span = tuple[int, int]
Ranked = tuple[Scored, list[Any], bool]  # a rerank's pairs, its documents as given, answered in TEI's shape


def tokenize_pairs(
    lefts: list[str],
    rights: list[str],
    ctx: RequestContext,
    truncate: int | None,
    fields: tuple[str, str],
    direction: Direction = "right",
) -> tuple[list[Tokens], Pairs]:
    """The pairs' engine inputs, as the model's kind encodes them (server/kinds/pairs.py). Errors
    name the request's own `fields`."""
    return kinds.of(ctx).pairs(PairAsk(lefts, rights, truncate, fields, direction), ctx)


def pair_scores(vectors: np.ndarray, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
    """Each pair's score, as the model's kind scores it."""
    return kinds.of(ctx).scores(vectors, pairs, ctx, raw)


def long_mode(body: ScoreRequest | RerankRequest, truncate: int | None, ctx: RequestContext) -> int | str | None:
    """The truncation a request's pairs get, or "chunk": a truncation the request asks for wins, then
    its `long_inputs`, then WARMPOOL_LONG_INPUTS (refuse: None, too long is a 400)."""
    if truncate is not None:
        return truncate
    mode = body.long_inputs or ctx.settings.long_inputs
    return {"refuse": None, "truncate": -1, "chunk": "chunk"}[mode]


def scored_pairs(
    lefts: list[str],
    rights: list[str],
    ctx: RequestContext,
    truncate: int | str | None,
    fields: tuple[str, str],
    body: ScoreRequest | RerankRequest,
    direction: Direction = "right",
) -> tuple[list[Tokens], Scored]:
    """The pairs' engine inputs; under "chunk", long right sides as passages (server/texts/passages.py)."""
    if truncate != "chunk":
        assert not isinstance(truncate, str)
        tokens, pairs = tokenize_pairs(lefts, rights, ctx, truncate, fields, direction)
        return tokens, Scored(pairs)
    kind = kinds.of(ctx)
    prompt = kind.pair_prompt(ctx, None)
    cut_lefts, cut_rights, owners, spans = passages.split(lefts, rights, ctx, fields, kind.reads_pairs, prompt)
    # each passage fits beside its query (passages.SLACK); a query too long for its window was refused
    tokens, pairs = tokenize_pairs(cut_lefts, cut_rights, ctx, -1, fields, direction)
    return tokens, Scored(pairs, Passages(owners, spans, body.passage_scoring), len(rights))


def passage_of(spans: list[Span], i: int) -> dict[str, Any]:
    """A result's winning passage, where documents were chunked."""
    return {"passage": {"start": spans[i][0], "end": spans[i][1]}} if spans else {}


def score_items(side: str | list[str] | ScoreContent, field: str) -> list[multimodal.Item]:
    """A side of /score as items: texts, or vLLM's {"content": [parts]} (one input per part)."""
    if isinstance(side, str):
        return [("text", side)]
    if isinstance(side, list):
        return [("text", text) for text in side]
    return [multimodal.part_item(p.model_dump(), f"{field}.content[{i}]") for i, p in enumerate(side.content)]


def prepare_score(raw: bytes, ctx: RequestContext) -> Prepared[ScoreRequest, Scored]:
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
    if kinds.of(ctx).takes_images:
        tokens, pairs = shared_space_pairs(lefts, rights, ctx, truncate, fields)
        return Prepared(body, tokens, Scored(pairs))
    for field, items in zip(fields, (lefts, rights), strict=True):
        if any(kind == "image" for kind, _ in items):
            multimodal.vision_of(ctx, field)  # a text-only model: a 400 that says which models take images
    texts = [s for _, s in lefts], [s for _, s in rights]
    tokens, scored = scored_pairs(*texts, ctx, long_mode(body, truncate, ctx), fields, body)
    return Prepared(body, tokens, scored)


def render_score(prep: Prepared[ScoreRequest, Scored], outcome: Outcome, ctx: RequestContext) -> bytes:
    scores, spans = prep.state.scores(outcome.vectors, ctx)
    data = [{"index": i, "object": "score", "score": float(s), **passage_of(spans, i)} for i, s in enumerate(scores)]
    return outputs.to_json(outputs.envelope("score", ctx, data=data, usage=prep.usage()))


def prepare_rerank(raw: bytes, ctx: RequestContext) -> Prepared[RerankRequest, Ranked]:
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
    if kinds.of(ctx).takes_images or any(isinstance(d, DocumentImage) for d in given):
        return _rerank_images(body, given, ctx, field, truncate, tei)
    documents: list[Any] = [d.text if isinstance(d, DocumentText) else d for d in given]
    mode = long_mode(body, truncate, ctx)
    queries = [body.query] * len(documents)
    tokens, scored = scored_pairs(queries, documents, ctx, mode, ("query", field), body, body.truncation_direction)
    return Prepared(body, tokens, (scored, documents, tei))


def _rerank_images(
    body: RerankRequest, given: list[Any], ctx: RequestContext, field: str, truncate: int | None, tei: bool
) -> Prepared[RerankRequest, Ranked]:
    """A text query against texts and images (Jina's {"image": ...} documents), on a CLIP or SigLIP
    model: the cosine of the query's vector and each document's, in the shared space."""
    items: list[multimodal.Item] = [
        ("image", d.image) if isinstance(d, DocumentImage) else ("text", d.text if isinstance(d, DocumentText) else d)
        for d in given
    ]
    tokens, pairs = shared_space_pairs([("text", body.query)] * len(items), items, ctx, truncate, ("query", field))
    documents = [d if isinstance(d, DocumentImage) else s for d, (_, s) in zip(given, items, strict=True)]
    return Prepared(body, tokens, (Scored(pairs), documents, tei))


def ranked(
    prep: Prepared[RerankRequest, Ranked], vectors: np.ndarray, ctx: RequestContext
) -> tuple[np.ndarray, list[int], list[Span]]:
    """The scores, the documents' indices best first cut to top_n, and the winning passages' spans."""
    scores, spans = prep.state[0].scores(vectors, ctx, raw=prep.body.raw_scores)
    order = sorted(range(len(scores)), key=lambda i: -scores[i])
    return scores, order[: prep.body.top_n or len(scores)], spans


def render_rerank(prep: Prepared[RerankRequest, Ranked], outcome: Outcome, ctx: RequestContext) -> bytes:
    """Jina/Cohere's {"results": [{index, relevance_score, document}]}, or TEI's bare ranked list."""
    _, documents, tei = prep.state
    scores, order, spans = ranked(prep, outcome.vectors, ctx)
    if tei:
        text = prep.body.return_text
        return outputs.to_json(
            [
                {
                    "index": i,
                    "score": float(scores[i]),
                    **({"text": documents[i]} if text else {}),
                    **passage_of(spans, i),
                }
                for i in order
            ]
        )
    results = []
    for i in order:
        result: dict[str, Any] = {"index": i, "relevance_score": float(scores[i]), **passage_of(spans, i)}
        if prep.body.return_documents:
            document = documents[i]
            result["document"] = (
                {"image": document.image} if isinstance(document, DocumentImage) else {"text": document}
            )
        results.append(result)
    return outputs.to_json(
        {
            "id": f"rerank-{random_hex()}",
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
