"""POST /classify (vLLM) and POST /predict (TEI): sequence-classification models."""

from __future__ import annotations

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import processing
from server.ipc import Outcome
from server.processing import Context
from server.protocol import ClassifyRequest, TEIPredictRequest, openapi_body
from server.routes.pipeline import Prepared, envelope, serve

router = APIRouter(tags=["classification"])
CLASSIFIERS = ("classification", "cross-encoder")


def activate(logits: np.ndarray) -> np.ndarray:
    """Softmax over the labels; a single-label head (cross-encoder) gets a sigmoid, as vLLM does."""
    logits = logits.astype(np.float64)
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def label(ctx: Context, index: int) -> str:
    return ctx.info.id2label.get(index, f"LABEL_{index}")


def prepare_classify(raw: bytes, ctx: Context) -> Prepared[ClassifyRequest]:
    body = processing.parse(ClassifyRequest, raw)
    ctx.check_model(body.model)
    ctx.require("/classify", *CLASSIFIERS)
    tokens = processing.tokenize_inputs(body.input, ctx, body.truncate_prompt_tokens)
    return Prepared(body, tokens)


def render_classify(prep: Prepared[ClassifyRequest], outcome: Outcome, ctx: Context) -> bytes:
    probs = activate(outcome.vectors)
    data = [
        {"index": i, "label": label(ctx, int(row.argmax())), "probs": row.tolist(), "num_classes": len(row)}
        for i, row in enumerate(probs)
    ]
    return processing.to_json(envelope("classify", ctx, data=data, usage=prep.usage()))


def prepare_predict(raw: bytes, ctx: Context) -> Prepared[TEIPredictRequest]:
    body = processing.parse(TEIPredictRequest, raw)
    ctx.require("/predict", *CLASSIFIERS)
    inputs = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not inputs:
        raise processing.bad_request("'inputs' must not be empty", "inputs")
    ctx.admit(len(inputs), "inputs")
    truncate = ctx.info.max_model_len if body.truncate else None
    tokens = []
    for i, item in enumerate(inputs):
        if isinstance(item, list) and len(item) != 2:
            raise processing.bad_request(f"inputs[{i}] must be a text or a pair of texts", "inputs")
        text, pair = (item[0], item[1]) if isinstance(item, list) else (str(item), None)
        tokens.append(ctx.tokenizers.encode(text, pair, truncate=truncate))
        processing.check_length(len(tokens[-1].input_ids), ctx.info, f"inputs[{i}]")
    return Prepared(body, tokens, extra=isinstance(body.inputs, str))


def render_predict(prep: Prepared[TEIPredictRequest], outcome: Outcome, ctx: Context) -> bytes:
    """Per input, every label with its score, best first; a bare list for a single text, as TEI."""
    scores = outcome.vectors.astype(np.float64) if prep.body.raw_scores else activate(outcome.vectors)
    results = [
        [{"label": label(ctx, int(j)), "score": float(row[j])} for j in np.argsort(-row, kind="stable")]
        for row in scores
    ]
    return processing.to_json(results[0] if prep.extra else results)


@router.post("/classify", openapi_extra=openapi_body(ClassifyRequest))
async def classify(request: Request) -> Response:
    return await serve(request, prepare_classify, render_classify)


@router.post("/predict", openapi_extra=openapi_body(TEIPredictRequest))
async def predict(request: Request) -> Response:
    return await serve(request, prepare_predict, render_predict)
