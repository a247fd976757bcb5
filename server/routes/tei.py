"""Text Embeddings Inference's surface: POST / (and SageMaker's /invocations) by model kind,
GET /info, POST /embed, /embed_all (each token's vector), /predict and /similarity
(/embed_sparse: routes/sparse.py). /rerank and /tokenize
answer in TEI's shape when asked in it (routes/score.py, routes/tokenize.py). Errors leave in
TEI's shape: {"error": message, "error_type": ...}.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from server import kinds
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepare, Prepared, Render, answer, in_shape
from server.core.services import Services, services
from server.kinds.base import Ask
from server.kinds.labels import label
from server.protocols.openai import VectorEncoding, openapi_body
from server.protocols.tei import (
    SimilarityRequest,
    TEIEmbedAllRequest,
    TEIEmbedRequest,
    TEIOptions,
    TEIPredictRequest,
    truncation,
)
from server.routes import score, sparse
from server.routes.classify import CLASSIFIERS
from server.routes.models import input_modalities
from server.tokenizing.tokenizer import TextOrPair

router = APIRouter(tags=["tei"])


def tei_ask(body: TEIEmbedRequest | TEIEmbedAllRequest) -> Ask:
    dimensions = body.dimensions if isinstance(body, TEIEmbedRequest) else None
    long_inputs = body.long_inputs if isinstance(body, TEIEmbedRequest) else None
    normalize = body.normalize if isinstance(body, TEIEmbedRequest) else None
    encoding = VectorEncoding.of(body) if isinstance(body, TEIEmbedRequest) else VectorEncoding()
    return Ask(
        body.inputs,
        "inputs",
        truncation(body),
        long_inputs,
        body.prompt_name,
        direction=body.truncation_direction,
        dimensions=dimensions,
        normalize=normalize,
        encoding=encoding,
    )


def prepare_embed(raw: bytes, ctx: RequestContext) -> Prepared[Ask, Any]:
    body = inputs.parse(TEIEmbedRequest, raw)
    ctx.require("/embed", "embedding")
    return kinds.of(ctx).embed(tei_ask(body), ctx)


def render_embed(prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> bytes | outputs.RawBody:
    """A bare list of vectors; normalized unless asked otherwise, as TEI does for every model (or
    vLLM's raw bytes, our extension: the metadata header holds where each vector is)."""
    vectors = [item["embedding"] for item in kinds.of(ctx).items(prep, outcome, ctx)]
    encoding = prep.body.encoding
    if encoding.encoding_format in outputs.RAW:
        return outputs.raw_vectors(vectors, encoding.encoding_format, encoding.embed_dtype, encoding.endianness, {})
    return outputs.to_json(vectors)


def prepare_embed_all(raw: bytes, ctx: RequestContext) -> Prepared[Ask, Any]:
    body = inputs.parse(TEIEmbedAllRequest, raw)
    ctx.require("/embed_all", "embedding", "multi-vector")
    return kinds.of(ctx).embed_tokens(tei_ask(body), ctx)


def render_embed_all(prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
    """Per input, the last hidden state of each of its tokens (special tokens included), as TEI;
    a multi-vector model's token vectors, those it scores."""
    return outputs.to_json(kinds.of(ctx).token_items(prep, outcome, ctx))


def predict_items(value: str | list[str] | list[list[str]]) -> tuple[list[TextOrPair], bool]:
    """TEI's predict inputs as texts and pairs, and whether they were one input: a text, or a list
    of one or two texts (a text, a pair); else a batch of such lists."""
    if isinstance(value, str):
        return [value], True
    if not value:
        raise inputs.bad_request("'inputs' must not be empty", "inputs")
    single = all(isinstance(v, str) for v in value)
    sequences: list[Any] = [value] if single else value
    items: list[TextOrPair] = []
    for i, seq in enumerate(sequences):
        if not isinstance(seq, list) or len(seq) not in (1, 2):
            where = "inputs" if single else f"inputs[{i}]"
            raise inputs.bad_request(f"{where} must be a text, [text] or a [text, text] pair", "inputs")
        items.append((seq[0], seq[1]) if len(seq) == 2 else seq[0])
    return items, single


def prepare_predict(raw: bytes, ctx: RequestContext) -> Prepared[TEIPredictRequest, bool]:
    body = inputs.parse(TEIPredictRequest, raw)
    ctx.require("/predict", *CLASSIFIERS)
    items, single = predict_items(body.inputs)
    ctx.admit(len(items), "inputs")
    limit = inputs.truncation_limit(truncation(body), ctx)
    direction = body.truncation_direction
    capped: list[TextOrPair] = []
    for i, item in enumerate(items):
        sides = item if isinstance(item, tuple) else (item,)
        cut = [inputs.capped(text, ctx.folder, f"inputs[{i}]", limit is not None, direction) for text in sides]
        capped.append((cut[0], cut[1]) if len(cut) == 2 else cut[0])
    pairs = [item for item in capped if isinstance(item, tuple)]
    if pairs and len(pairs) == len(capped):  # a cross-encoder's pairs: each distinct text tokenized once
        tokens = ctx.tokenizers.encode_pairs(pairs, limit, direction)
    else:
        tokens = ctx.tokenizers.encode_batch(capped, limit, direction)
    for i, tok in enumerate(tokens):
        inputs.check_length(len(tok.input_ids), ctx.folder, f"inputs[{i}]")
    return Prepared(body, tokens, single)


def predictions(prep: Prepared[TEIPredictRequest, bool], outcome: Outcome, ctx: RequestContext) -> list[Any]:
    """Per input, every label with its score, best first."""
    raw = prep.body.raw_scores
    scores = outputs.scores(outcome.vectors, raw)
    return [
        [{"label": label(ctx, int(j)), "score": float(row[j])} for j in np.argsort(-row, kind="stable")]
        for row in scores
    ]


def render_predict(prep: Prepared[TEIPredictRequest, bool], outcome: Outcome, ctx: RequestContext) -> bytes:
    """One input's list bare, as TEI answers /predict; a batch as a list of lists."""
    results = predictions(prep, outcome, ctx)
    return outputs.to_json(results[0] if prep.state else results)


def render_nested_predict(prep: Prepared[TEIPredictRequest, bool], outcome: Outcome, ctx: RequestContext) -> bytes:
    """POST / always nests, as the Hugging Face Inference API answers text classification."""
    return outputs.to_json(predictions(prep, outcome, ctx))


def prepare_similarity(raw: bytes, ctx: RequestContext) -> Prepared[SimilarityRequest, score.Pairs]:
    body = inputs.parse(SimilarityRequest, raw)
    ctx.require("/similarity", *score.SCORERS)
    options = body.parameters or TEIOptions()
    sentences = body.inputs.sentences
    if not sentences:
        raise inputs.bad_request("'inputs.sentences' must not be empty", "inputs.sentences")
    prompt = kinds.of(ctx).pair_prompt(ctx, options.prompt_name)
    tokens, pairs = score.tokenize_pairs(
        [prompt + body.inputs.source_sentence] * len(sentences),
        [prompt + s for s in sentences],
        ctx,
        truncation(options),
        ("inputs.source_sentence", "inputs.sentences"),
        options.truncation_direction,
    )
    return Prepared(body, tokens, pairs)


def render_similarity(prep: Prepared[SimilarityRequest, score.Pairs], outcome: Outcome, ctx: RequestContext) -> bytes:
    return outputs.to_json([float(s) for s in score.pair_scores(outcome.vectors, prep.state, ctx)])


def prepare_root(raw: bytes, ctx: RequestContext) -> Prepared[Prepared[Any, Any], Render]:
    """POST / by the model's kind, as TEI routes it: an embedding model embeds (or, given
    {"inputs": {"source_sentence", "sentences"}}, answers similarity), a sparse one embeds sparse,
    a reranker reranks ({"query", "texts"}) or predicts; anything else predicts. The inner
    request's render goes along."""
    body = inputs.parse_object(raw)
    prepare: Prepare
    render: Render
    kind = kinds.of(ctx)
    if isinstance(kind, kinds.Sparse):
        prepare, render = sparse.prepare_embed_sparse, sparse.render_embed_sparse
    elif isinstance(kind, kinds.Dense):
        similarity = isinstance(body.get("inputs"), dict)
        prepare, render = (prepare_similarity, render_similarity) if similarity else (prepare_embed, render_embed)
    elif isinstance(kind, kinds.CrossEncoder) and "query" in body:
        prepare, render = score.prepare_rerank, score.render_rerank
        if "documents" in body:  # the route's answer follows the request's shape
            raise inputs.bad_request("POST / reranks TEI's shape: name the documents 'texts'", "documents")
    else:
        prepare, render = prepare_predict, render_nested_predict
    inner = prepare(raw, ctx)
    return Prepared(inner, inner.tokens, render)


def render_root(
    prep: Prepared[Prepared[Any, Any], Render], outcome: Outcome, ctx: RequestContext
) -> bytes | outputs.RawBody:
    return prep.state(prep.body, outcome, ctx)


def info(svc: Services) -> dict[str, Any]:
    """TEI's Info: the model, its kind and the server's limits (GET /info, gRPC's Info)."""
    model = svc.default_model()
    folder, settings = model.folder, svc.settings
    model_type = kinds.KINDS[folder.output].tei_type(folder)
    return {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": settings.dtype if settings.dtype != "auto" else "float32",
        "model_type": model_type,
        "max_concurrent_requests": settings.admission_permits,
        "max_input_length": folder.max_model_len,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_requests": settings.max_batch_size,
        "max_client_batch_size": settings.max_inputs_per_request,
        "auto_truncate": False,
        "tokenization_workers": settings.executor_threads,
        "version": metadata.version("warmpool"),
        "sha": None,
        "docker_label": None,
        "prompts": sorted(folder.prompts),
        "input_modalities": input_modalities(folder),
    }


@router.get("/info")
async def get_info(request: Request) -> Response:
    with in_shape("tei"):
        return JSONResponse(info(services(request)))


@router.post("/", openapi_extra=openapi_body(TEIEmbedRequest))
@router.post("/invocations", openapi_extra=openapi_body(TEIEmbedRequest))
async def root(request: Request) -> Response:
    return await answer(request, prepare_root, render_root, shape="tei")


@router.post("/embed", openapi_extra=openapi_body(TEIEmbedRequest))
async def embed(request: Request) -> Response:
    return await answer(request, prepare_embed, render_embed, shape="tei")


@router.post("/embed_all", openapi_extra=openapi_body(TEIEmbedAllRequest))
async def embed_all(request: Request) -> Response:
    return await answer(request, prepare_embed_all, render_embed_all, shape="tei")


@router.post("/predict", openapi_extra=openapi_body(TEIPredictRequest))
async def predict(request: Request) -> Response:
    return await answer(request, prepare_predict, render_predict, shape="tei")


@router.post("/similarity", openapi_extra=openapi_body(SimilarityRequest))
async def similarity(request: Request) -> Response:
    return await answer(request, prepare_similarity, render_similarity, shape="tei")
