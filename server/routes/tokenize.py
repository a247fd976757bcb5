"""POST /tokenize and /detokenize (vLLM): the tokenizer alone, no engine round trip."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import processing
from server.processing import Context
from server.protocol import DetokenizeRequest, TokenizeRequest, openapi_body
from server.runtime import Timings, json_response, runtime

router = APIRouter(tags=["tokenize"])


def tokenize(raw: bytes, ctx: Context) -> bytes:
    body = processing.parse(TokenizeRequest, raw)
    ctx.check_model(body.model)
    tokens = ctx.tokenizers.tokenize(body.prompt, body.add_special_tokens)
    return processing.to_json(
        {"count": len(tokens), "max_model_len": ctx.info.max_model_len, "tokens": tokens, "token_strs": None}
    )


def detokenize(raw: bytes, ctx: Context) -> bytes:
    body = processing.parse(DetokenizeRequest, raw)
    ctx.check_model(body.model)
    vocab = ctx.tokenizers.vocab_size
    bad = next((t for t in body.tokens if t < 0 or t >= vocab), None)
    if bad is not None:
        raise processing.bad_request(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", "tokens")
    return processing.to_json({"prompt": ctx.tokenizers.decode(body.tokens)})


async def _run(request: Request, fn: Callable[[bytes, Context], bytes]) -> Response:
    rt = runtime(request)
    timings = Timings()
    info, tokenizers = rt.loaded()
    body = await rt.run(fn, await request.body(), Context(info, tokenizers, rt.settings))
    return json_response(body, timings)


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
async def tokenize_route(request: Request) -> Response:
    return await _run(request, tokenize)


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize_route(request: Request) -> Response:
    return await _run(request, detokenize)
