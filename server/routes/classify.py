"""POST /classify (vLLM) and POST /predict (TEI): sequence-classification models."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import inputs, outputs
from server.engine_client import Outcome
from server.inputs import RequestContext
from server.pipeline import Prepared, answer, envelope
from server.protocol import ClassifyRequest, TEIPredictRequest, openapi_body
from server.tokenizer import TextOrPair

router = APIRouter(tags=["classification"])
CLASSIFIERS = ("classification", "cross-encoder")


def label(ctx: RequestContext, index: int) -> str:
    return ctx.folder.id2label.get(index, f"LABEL_{index}")


def prepare_classify(raw: bytes, ctx: RequestContext) -> Prepared[ClassifyRequest]:
    body = inputs.parse(ClassifyRequest, raw)
    ctx.select_model(body.model)
    ctx.require("/classify", *CLASSIFIERS)
    tokens = inputs.tokenize_inputs(body.input, ctx, body.truncate_prompt_tokens)
    return Prepared(body, tokens)


def render_classify(prep: Prepared[ClassifyRequest], outcome: Outcome, ctx: RequestContext) -> bytes:
    probs = outputs.activate(outcome.vectors)
    data = [
        {"index": i, "label": label(ctx, int(row.argmax())), "probs": row.tolist(), "num_classes": len(row)}
        for i, row in enumerate(probs)
    ]
    return outputs.to_json(envelope("classify", ctx, data=data, usage=prep.usage()))


def prepare_predict(raw: bytes, ctx: RequestContext) -> Prepared[TEIPredictRequest]:
    body = inputs.parse(TEIPredictRequest, raw)
    ctx.require("/predict", *CLASSIFIERS)
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts:
        raise inputs.bad_request("'inputs' must not be empty", "inputs")
    ctx.admit(len(texts), "inputs")
    truncate = ctx.folder.max_model_len if body.truncate else None
    items: list[TextOrPair] = []
    for i, item in enumerate(texts):
        if isinstance(item, list) and len(item) != 2:
            raise inputs.bad_request(f"inputs[{i}] must be a text or a pair of texts", "inputs")
        sides: list[str] = item if isinstance(item, list) else [str(item)]
        capped = [inputs.capped(text, ctx.folder, f"inputs[{i}]", truncate is not None) for text in sides]
        items.append((capped[0], capped[1]) if len(capped) == 2 else capped[0])
    pairs = [item for item in items if isinstance(item, tuple)]
    if pairs and len(pairs) == len(items):  # a cross-encoder's pairs: each distinct text tokenized once
        tokens = ctx.tokenizers.encode_pairs(pairs, truncate)
    else:
        tokens = ctx.tokenizers.encode_batch(items, truncate)
    for i, tok in enumerate(tokens):
        inputs.check_length(len(tok.input_ids), ctx.folder, f"inputs[{i}]")
    return Prepared(body, tokens, extra=isinstance(body.inputs, str))


def render_predict(prep: Prepared[TEIPredictRequest], outcome: Outcome, ctx: RequestContext) -> bytes:
    """Per input, every label with its score, best first; a bare list for a single text, as TEI."""
    scores = outcome.vectors.astype(np.float64) if prep.body.raw_scores else outputs.activate(outcome.vectors)
    results = [
        [{"label": label(ctx, int(j)), "score": float(row[j])} for j in np.argsort(-row, kind="stable")]
        for row in scores
    ]
    return outputs.to_json(results[0] if prep.extra else results)


@router.post("/classify", openapi_extra=openapi_body(ClassifyRequest))
async def classify(request: Request) -> Response:
    return await answer(request, prepare_classify, render_classify)


@router.post("/predict", openapi_extra=openapi_body(TEIPredictRequest))
async def predict(request: Request) -> Response:
    return await answer(request, prepare_predict, render_predict)
