"""Texts and images into one space (a CLIP or SigLIP model), in each peer's request shape:
- vLLM's chat-style `messages` on /v1/embeddings: one conversation, one vector; its content parts
  (`text`, `image_url`) hold either text (the texts joined by a space) or one image (CLIP and
  SigLIP embed one modality at a time, as vLLM serves them);
- Infinity's `modality: "image"` on /v1/embeddings (and /embeddings): `input` is a list of images;
- Cohere's `images` (data: URLs) and `inputs` (one vector per input's content parts) on /v2/embed.

An image is a data: URL, base64, or (WARMPOOL_IMAGE_URLS=allowlist) an http(s) URL: server/vision/images.py;
a URL's image is fetched and decoded after prepare (server/vision/url_images.py), a placeholder until then.
SigLIP's texts are padded to the full length with its pad token, as its processor pads them
(inputs.tokenize_inputs, for every route: its text tower pools the last position, padding included).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import Field, StrictStr

from common.vision import Vision
from common.wire import Tokens
from server.core import inputs
from server.core.inputs import RequestContext
from server.core.pipeline import Prepared
from server.http.errors import field_of
from server.kinds.base import Ask
from server.protocols.openai import Body, ContentPart, Part, VectorEncoding
from server.vision import image_fetch, images
from server.vision.url_images import Pending

Item = tuple[Literal["text", "image"], str]  # one input: a text, or an image's source


class Message(Part):
    role: str = "user"
    content: StrictStr | list[ContentPart]


class MultimodalRequest(Body, VectorEncoding):
    """/v1/embeddings with `messages` (vLLM) or `modality` (Infinity), or any body for a CLIP or SigLIP model."""

    input: StrictStr | list[StrictStr] | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    modality: Literal["text", "image"] = "text"
    model: str | None = None
    dimensions: int | None = Field(None, ge=1)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    user: str | None = None


def names_images(raw: bytes) -> bool:
    """The body is the multimodal shape: it has a `messages` or `modality` key (the byte test first:
    a text body pays no second parse; a string value "messages" is caught by the parse)."""
    if b'"messages"' not in raw and b'"modality"' not in raw:
        return False
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False  # the route's own parse says what is wrong
    return isinstance(data, dict) and ("messages" in data or "modality" in data)


def image_model(ctx: RequestContext) -> str | None:
    """Images sent without a model name go to the first configured model that takes them (the
    default model where it does, or where none does)."""
    if ctx.folder.vision is not None:
        return None
    return next((n for n in ctx.configured if n in ctx.served and ctx.served[n].folder.vision is not None), None)


def vision_of(ctx: RequestContext, field: str) -> Vision:
    if ctx.folder.vision is None:
        raise inputs.bad_request(
            f"model '{ctx.model_name}' embeds text only: images need a CLIP or SigLIP model", field
        )
    return ctx.folder.vision


def prepare(raw: bytes, ctx: RequestContext) -> Prepared[Ask, Encoded]:
    body = inputs.parse(MultimodalRequest, raw)
    takes_images = body.messages is not None or body.modality == "image"
    ctx.select_model(image_model(ctx) if body.model is None and takes_images else body.model)
    ctx.require("/v1/embeddings", "embedding")
    field = "messages" if body.messages is not None else "input"
    vision_of(ctx, field)
    if body.dimensions is not None and body.dimensions > ctx.folder.dimensions:
        raise inputs.bad_request(f"dimensions={body.dimensions} is larger than the model's {ctx.folder.dimensions}")
    if body.messages is not None:
        if body.input is not None:
            raise inputs.bad_request("send 'messages' or 'input', not both", "messages")
        items = [conversation([m.model_dump() for m in body.messages], "messages")]
    elif body.input is None:
        raise inputs.bad_request("'input' (or 'messages') is required", "input")
    else:
        sources = [body.input] if isinstance(body.input, str) else body.input
        if not sources:
            raise inputs.bad_request("'input' must not be empty", "input")
        items = [(body.modality, s) for s in sources]
    encoded = encode(items, ctx, field, body.truncate_prompt_tokens)
    ask = Ask(None, field, dimensions=body.dimensions, encoding=VectorEncoding.of(body), request=body)
    return Prepared(ask, encoded.tokens, encoded)


def conversation(messages: list[dict[str, Any]], where: str) -> Item:
    """One conversation's content parts as one input: its texts joined, or its one image."""
    texts: list[str] = []
    pictures: list[str] = []
    for message in messages:
        content = message.get("content")
        for part in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
            kind, source = part_item(part, where)
            (texts if kind == "text" else pictures).append(source)
    if pictures and (texts or len(pictures) > 1):
        raise inputs.bad_request(
            f"{where}: this model embeds one text or one image per input, not both or several images",
            field_of(where),
        )
    if pictures:
        return "image", pictures[0]
    if not texts:
        raise inputs.bad_request(f"{where} has no text and no image", field_of(where))
    return "text", " ".join(texts)


@dataclass(frozen=True)
class Encoded:
    tokens: list[Tokens]  # the engine's inputs, in the order of the items (an image URL's a placeholder)
    pictures: list[images.Picture | Pending]  # the images among them, as sent, in order

    def described(self) -> list[images.Picture]:
        """The images as sent, once the URLs among them are fetched (after prepare)."""
        described = [p.picture if isinstance(p, Pending) else p for p in self.pictures]
        return [p for p in described if p is not None]  # every URL's is there by the time this is read


def part_item(part: dict[str, Any], where: str) -> Item:
    """A chat-style content part (`text` or `image_url`) as an item."""
    if part.get("type") == "text" and isinstance(part.get("text"), str):
        return "text", part["text"]
    if part.get("type") == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if not isinstance(url, str):
            raise inputs.bad_request(f"{where}: an image_url part needs a url", field_of(where))
        return "image", url
    raise inputs.bad_request(f"{where}: a content part is text or image_url", field_of(where))


def encode(items: list[Item], ctx: RequestContext, field: str, truncate: int | None = None) -> Encoded:
    """The inputs as engine inputs, in order (admitted first, one permit each): texts tokenized
    (SigLIP's padded), images decoded and preprocessed."""
    vision = vision_of(ctx, field)
    ctx.admit(len(items), field)  # tokenize_inputs' own admit is then covered by the permits held
    out: list[Tokens | None] = [None] * len(items)
    texts = [(i, source) for i, (kind, source) in enumerate(items) if kind == "text"]
    if texts:
        tokens = inputs.tokenize_inputs([t for _, t in texts], ctx, truncate, field)  # SigLIP's padded there
        for (i, _), tok in zip(texts, tokens, strict=True):
            out[i] = tok
    at = [i for i, (kind, _) in enumerate(items) if kind == "image"]
    wheres = {i: f"{field}[{i}]" if len(items) > 1 else field for i in at}
    urls = [Pending(items[i][1], wheres[i], vision) for i in at if images.is_url(items[i][1])]
    for pending in urls:
        image_fetch.allowed(pending.url, ctx.settings, pending.where)  # refused before anything is fetched
    if urls:
        if ctx.url_images is None:
            raise RuntimeError("image URLs are fetched by the pipeline (pipeline.prepare_in_time)")
        ctx.url_images.add(urls)  # fetched on the loop from now, while the inline images decode here
    fetched = iter(urls)
    pictures: list[images.Picture | Pending] = []
    for i in at:
        if images.is_url(items[i][1]):
            pending = next(fetched)
            out[i] = pending.placeholder()
            pictures.append(pending)
        else:
            data = images.read_source(items[i][1], ctx.settings, wheres[i])
            out[i], picture = images.image_input(data, vision, ctx.settings, wheres[i])
            pictures.append(picture)
    return Encoded([t for t in out if t is not None], pictures)


def cohere_items(
    texts: list[str] | None, pictures: list[Any] | None, entries: list[Any] | None
) -> tuple[list[Item], str]:
    """Cohere's one field of inputs (`texts`, `images` or `inputs`) as items, and its name."""
    given = [(name, value) for name, value in (("texts", texts), ("images", pictures), ("inputs", entries)) if value]
    if len(given) != 1:
        raise inputs.bad_request("send one of 'texts', 'images' or 'inputs', not empty", "texts")
    field, values = given[0]
    if field == "texts":
        return [("text", t) for t in values], field
    if field == "images":
        if not all(isinstance(v, str) for v in values):
            raise inputs.bad_request("'images' is a list of data: URLs", field)
        return [("image", v) for v in values], field
    items = []
    for i, entry in enumerate(values):
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), list):
            raise inputs.bad_request(f"inputs[{i}] must be {{'content': [parts]}}", field)
        items.append(conversation([entry], f"inputs[{i}]"))
    return items, field
