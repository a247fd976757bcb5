"""POST /tokenize and /detokenize (vLLM): the tokenizer alone, no engine round trip (admitted all the same)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server import inputs, outputs
from server.inputs import RequestContext
from server.pipeline import answer_without_engine
from server.protocol import DetokenizeRequest, TokenizeRequest, openapi_body

router = APIRouter(tags=["tokenize"])


def tokenize(raw: bytes, ctx: RequestContext) -> bytes:
    body = inputs.parse(TokenizeRequest, raw)
    ctx.select_model(body.model)
    prompt = inputs.capped(body.prompt, ctx.folder, "prompt", truncating=False)
    tokens = ctx.tokenizers.tokenize(prompt, body.add_special_tokens)
    return outputs.to_json(
        {"count": len(tokens), "max_model_len": ctx.folder.max_model_len, "tokens": tokens, "token_strs": None}
    )


def detokenize(raw: bytes, ctx: RequestContext) -> bytes:
    body = inputs.parse(DetokenizeRequest, raw)
    ctx.select_model(body.model)
    if len(body.tokens) > inputs.max_chars(ctx.folder):
        raise inputs.bad_request(
            f"'tokens' has {len(body.tokens)} ids, more than the {inputs.max_chars(ctx.folder)} this model allows",
            "tokens",
        )
    vocab = ctx.tokenizers.vocab_size
    bad = next((t for t in body.tokens if t < 0 or t >= vocab), None)
    if bad is not None:
        raise inputs.bad_request(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", "tokens")
    return outputs.to_json({"prompt": ctx.tokenizers.decode(body.tokens)})


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
async def tokenize_route(request: Request) -> Response:
    return await answer_without_engine(request, tokenize)


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize_route(request: Request) -> Response:
    return await answer_without_engine(request, detokenize)
