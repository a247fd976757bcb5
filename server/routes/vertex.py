"""Vertex AI's prediction contract, on the route WARMPOOL_PREDICT_ROUTE names (AIP_PREDICT_ROUTE sets
it): {"instances": [...], "parameters": {...}} is answered {"predictions": [...]}, one prediction per
instance, in instance order.

Each instance is one input of TEI's route for the model's kind, and `parameters` are that route's
options (TEI's own names: normalize, dimensions, truncate, prompt_name, long_inputs, raw_scores, ...):

- embedding: a text, or {"text": text} ({"content": text} too) -> its vector, as /embed;
- sparse: the same -> [{index, value}], as /embed_sparse;
- classifier: a text, or a pair ([text, text] or {"text", "text_pair"}) -> [{label, score}] best
  first, as /predict;
- cross-encoder: a pair -> its score (a sigmoid unless raw_scores), as /score gives it.

Errors leave in TEI's shape and name the instance (`instances[3]`).
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import Field

from server import kinds
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepare, Prepared, Render, answer, checked_priority
from server.http.errors import APIError
from server.protocols.openai import Body, openapi_body
from server.routes import sparse, tei


class VertexPredictRequest(Body):
    instances: list[Any] = Field(min_length=1)
    parameters: dict[str, Any] | None = None


OPENAPI = openapi_body(VertexPredictRequest)
_TEXT_KEYS = ("text", "content")


def instance_text(value: Any, where: str) -> str:
    if isinstance(value, dict):
        found = [key for key in _TEXT_KEYS if key in value]
        value = value[found[0]] if len(found) == 1 and len(value) == 1 else None
    if not isinstance(value, str):
        raise inputs.bad_request(f'{where} must be a text or {{"text": text}}', where)
    return value


def instance_pair(value: Any, where: str, pair_only: bool) -> list[str]:
    """[text] or [text, text], as TEI's /predict takes one input."""
    if isinstance(value, dict) and "text_pair" in value:
        value = [value.get("text"), value["text_pair"]] if set(value) == {"text", "text_pair"} else None
    elif isinstance(value, str | dict) and not pair_only:
        value = [instance_text(value, where)]
    if not (isinstance(value, list) and len(value) in (1, 2) and all(isinstance(v, str) for v in value)):
        raise inputs.bad_request(f'{where} must be [text, text] or {{"text", "text_pair"}}', where)
    if pair_only and len(value) != 2:
        raise inputs.bad_request(f"{where} must be a pair: a cross-encoder scores [query, text]", where)
    return value


def prepare_predict(raw: bytes, ctx: RequestContext) -> Prepared[Prepared[Any, Any], Render]:
    """The body as TEI's request for the model's kind, prepared by TEI's route; its render goes along."""
    body = inputs.parse(VertexPredictRequest, raw)
    kind = kinds.of(ctx)
    parameters = dict(body.parameters or {})
    if "inputs" in parameters:
        raise inputs.bad_request("'parameters' must not carry 'inputs': give them as 'instances'", "parameters")
    if parameters.get("encoding_format") in outputs.RAW:  # predictions are JSON
        raise inputs.bad_request("Vertex's predictions are JSON: encoding_format bytes does not apply", "parameters")
    if parameters.get("priority") is not None:  # the request's priority, wherever Vertex's caller put it
        ctx.priority = checked_priority(parameters["priority"], "parameters.priority")
    where = [f"instances[{i}]" for i in range(len(body.instances))]
    prepare: Prepare
    render: Render
    if isinstance(kind, kinds.Labels):
        cross = isinstance(kind, kinds.CrossEncoder)
        pairs = [instance_pair(v, w, cross) for v, w in zip(body.instances, where, strict=True)]
        prepare, render = tei.prepare_predict, (render_scores if cross else tei.render_nested_predict)
        parameters["inputs"] = pairs
    else:
        texts = [instance_text(v, w) for v, w in zip(body.instances, where, strict=True)]
        sparse_model = isinstance(kind, kinds.Sparse)
        prepare = sparse.prepare_embed_sparse if sparse_model else tei.prepare_embed
        render = sparse.render_embed_sparse if sparse_model else tei.render_embed
        parameters["inputs"] = texts
    try:
        body_bytes = orjson.dumps(parameters)
    except TypeError:  # an integer past 64 bits: no option takes one
        raise inputs.bad_request("'parameters' holds a number out of range", "parameters") from None
    try:
        inner = prepare(body_bytes, ctx)
    except APIError as exc:
        raise _as_instances(exc) from None
    return Prepared(inner, inner.tokens, render)


def render_scores(prep: Prepared[Any, Any], outcome: Outcome, ctx: RequestContext) -> bytes:
    return outputs.to_json([float(s) for s in outputs.scores(outcome.vectors, prep.body.raw_scores)[:, 0]])


def render_predict(prep: Prepared[Prepared[Any, Any], Render], outcome: Outcome, ctx: RequestContext) -> bytes:
    inner = prep.state(prep.body, outcome, ctx)
    assert isinstance(inner, bytes)  # raw bodies are refused at prepare
    return b'{"predictions":' + inner + b"}"


_INPUTS = re.compile(r"\binputs\b")


def _as_instances(exc: APIError) -> APIError:
    """TEI's errors name `inputs[i]`; the client sent `instances[i]` (or a parameter)."""
    exc.message = _INPUTS.sub("instances", exc.message)
    if exc.param is not None:
        exc.param = _INPUTS.sub("instances", exc.param)
    exc.args = (exc.message,)
    return exc


async def predict(request: Request) -> Response:
    return await answer(request, prepare_predict, render_predict, shape="tei")
