"""POST /classify (vLLM): sequence-classification models."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared, answer
from server.kinds.labels import label
from server.protocols.openai import ClassifyRequest, openapi_body

router = APIRouter(tags=["classification"])
CLASSIFIERS = ("classification", "cross-encoder")


def prepare_classify(raw: bytes, ctx: RequestContext) -> Prepared[ClassifyRequest, None]:
    body = inputs.parse(ClassifyRequest, raw)
    ctx.select_model(body.model)
    ctx.require("/classify", *CLASSIFIERS)
    tokens = inputs.tokenize_inputs(body.input, ctx, body.truncate_prompt_tokens)
    return Prepared(body, tokens)


def render_classify(prep: Prepared[ClassifyRequest, None], outcome: Outcome, ctx: RequestContext) -> bytes:
    probs = outputs.activate(outcome.vectors)
    data = [
        {"index": i, "label": label(ctx, int(row.argmax())), "probs": row.tolist(), "num_classes": len(row)}
        for i, row in enumerate(probs)
    ]
    return outputs.to_json(outputs.envelope("classify", ctx, data=data, usage=prep.usage()))


@router.post("/classify", openapi_extra=openapi_body(ClassifyRequest))
async def classify(request: Request) -> Response:
    return await answer(request, prepare_classify, render_classify)
