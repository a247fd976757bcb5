"""POST /tokenize and /detokenize (vLLM), /tokenize asked with `inputs` and /decode (TEI): the
tokenizer alone, no engine round trip (admitted all the same)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.pipeline import answer_without_engine
from server.protocols.openai import DetokenizeRequest, TokenizeRequest, openapi_body
from server.protocols.tei import DecodeRequest, TEITokenizeRequest
from server.texts.prompts import prompt_text
from server.tokenizing.tokenizer import TooManyTokens

router = APIRouter(tags=["tokenize"])


def tokenize(raw: bytes, ctx: RequestContext) -> bytes:
    data = inputs.parse_object(raw)
    if "inputs" in data and "prompt" not in data:
        ctx.shape = "tei"
        return tei_tokenize(inputs.validate(TEITokenizeRequest, data), ctx)
    body = inputs.validate(TokenizeRequest, data)
    ctx.select_model(body.model)
    # Any length the body limit lets through: this is how clients size the chunks of a long text.
    # Tokenized on the executor with the call that releases the GIL; the answer is bounded by the body.
    tokens = ctx.tokenizers.tokenize(body.prompt, body.add_special_tokens)
    return outputs.to_json(
        {"count": len(tokens), "max_model_len": ctx.folder.max_model_len, "tokens": tokens, "token_strs": None}
    )


def tei_tokenize(body: TEITokenizeRequest, ctx: RequestContext) -> bytes:
    return outputs.to_json(tei_spans(body, ctx))


def tei_spans(body: TEITokenizeRequest, ctx: RequestContext) -> list[list[dict[str, Any]]]:
    """TEI's answer: per text, its tokens with their text and character span (in the text with
    its prompt, if one was named). A text longer than the model takes is refused, as TEI does, so a
    request answers at most its inputs x the model's maximum tokens."""
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    if not texts:
        raise inputs.bad_request("'inputs' must not be empty", "inputs")
    ctx.admit(len(texts), "inputs")
    prompt = prompt_text(ctx.folder, body.prompt_name) if body.prompt_name is not None else ""
    where = [f"inputs[{i}]" if len(texts) > 1 else "inputs" for i in range(len(texts))]
    texts = [
        inputs.capped(prompt + t, ctx.folder, name, truncating=False) for t, name in zip(texts, where, strict=True)
    ]
    limit = ctx.folder.max_model_len
    try:
        return ctx.tokenizers.spans(texts, body.add_special_tokens, limit, ctx.budget_response)
    except TooManyTokens as exc:
        raise inputs.bad_request(
            f"{where[exc.index]} has {exc.count} tokens, more than the model's maximum of {limit}", "inputs"
        ) from exc


def checked_ids(ids: list[int], ctx: RequestContext, field: str) -> list[int]:
    """Token ids the tokenizer may decode: within the vocabulary, and no more than a text may have."""
    if len(ids) > inputs.max_chars(ctx.folder):
        raise inputs.bad_request(
            f"'{field}' has {len(ids)} ids, more than the {inputs.max_chars(ctx.folder)} this model allows", field
        )
    vocab = ctx.tokenizers.vocab_size
    bad = next((t for t in ids if t < 0 or t >= vocab), None)
    if bad is not None:
        raise inputs.bad_request(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", field)
    return ids


def detokenize(raw: bytes, ctx: RequestContext) -> bytes:
    body = inputs.parse(DetokenizeRequest, raw)
    ctx.select_model(body.model)
    return outputs.to_json({"prompt": ctx.tokenizers.decode(checked_ids(body.tokens, ctx, "tokens"))})


def decode(raw: bytes, ctx: RequestContext) -> bytes:
    """TEI's /decode: one text per id list, as a list."""
    return outputs.to_json(decoded(inputs.parse(DecodeRequest, raw), ctx))


def decoded(body: DecodeRequest, ctx: RequestContext) -> list[str]:
    batch: list[list[int]] = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]  # type: ignore[list-item]
    ctx.admit(len(batch), "ids")
    checked = [checked_ids(ids, ctx, "ids") for ids in batch]
    return ctx.tokenizers.decode_batch(checked, body.skip_special_tokens)


@router.post("/tokenize", openapi_extra=openapi_body(TokenizeRequest))
async def tokenize_route(request: Request) -> Response:
    return await answer_without_engine(request, tokenize)


@router.post("/detokenize", openapi_extra=openapi_body(DetokenizeRequest))
async def detokenize_route(request: Request) -> Response:
    return await answer_without_engine(request, detokenize)


@router.post("/decode", openapi_extra=openapi_body(DecodeRequest))
async def decode_route(request: Request) -> Response:
    return await answer_without_engine(request, decode, shape="tei")
