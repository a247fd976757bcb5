"""Request inputs: parse the body, admit its inputs, tokenize them, check them.

Each function here is synchronous and thread safe, and all but the first admission permit (taken
on the event loop, so a full server refuses at once) run on the executor, never on the loop, where
a long text would stall every other request and the probes.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.wire import Tokens
from server.core.admission import Admission
from server.core.services import ServedModel
from server.http.errors import APIError, Shape, bad_request, field_of, from_validation
from server.tokenizing.tokenizer import Direction, TokenizerPool, runs

if TYPE_CHECKING:
    from server.vision.url_images import UrlImages

M = TypeVar("M", bound=BaseModel)

# Real text runs 3-6 characters per token; 32 leaves room for long words and rare scripts.
CHARS_PER_TOKEN = 32


def parse(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise from_validation(list(exc.errors())) from None


def parse_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, for routes that choose their request shape by its fields."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data


def validate(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation(list(exc.errors())) from None


@dataclass
class RequestContext:
    """What one request's prepare and render steps may read, and the admission permits it holds."""

    model: ServedModel  # the one the request names, once select_model has run; the default before
    served: Mapping[str, ServedModel]
    settings: Settings
    admission: Admission | None = None
    admitted: int = 0
    abandoned: bool = False  # the request was answered while prepare still ran: take no more permits
    shape: Shape = "openai"  # the surface the request speaks: its errors leave in that shape
    configured: tuple[str, ...] = ()  # every model's name, ready or not
    chosen: bool = False  # the request named its model: no other is picked for it
    priority: int = 0  # lower runs first; above 0 is bulk work, kept out of the admission reserve
    demoted: bool = False  # its tenant presses past its quota: bulk work, whatever priority the body asks
    tenant: str = ""  # its tenant's name, where keys name tenants (the engines' routing weighs their shares)
    url_images: UrlImages | None = None  # its image URLs, fetched on the event loop (set by the pipeline)
    adapter: str = ""  # the LoRA adapter of `model` the request names (its inputs carry it); "": the base
    allowed: frozenset[str] | None = None  # the models and adapters the request's tenant may use; None: all

    def ask_priority(self, asked: int) -> None:
        """The priority the request asks for; bulk (1) at least while it is demoted."""
        self.priority = max(asked, 1) if self.demoted else asked

    @property
    def folder(self) -> ModelFolder:
        return self.model.folder

    @property
    def tokenizers(self) -> TokenizerPool:
        return self.model.tokenizers

    @property
    def model_name(self) -> str:
        """The name the request's answer echoes: its adapter's, or its model's."""
        return self.adapter or self.model.name

    def select_model(self, name: str | None) -> None:
        """The model a request's `model` field names (the default when it names none), or a LoRA
        adapter of one (its base serves it); 404 for a name not served, 503 for a model still starting."""
        if name is None:
            return
        self.check_allowed(name)
        self.chosen = True
        self.adapter = ""
        if name == self.model.name:
            return
        base = next((m for m in self.served.values() if m.serves_adapter(name)), None)
        if base is not None:
            self.adapter = name
            if base is not self.model:
                self._use(base)
            return
        if name not in self.served:
            if name in self.configured:
                raise ModelStarting(name)
            served = ", ".join(f"'{n}'" for n in self.configured or self.served)
            adapters = ", ".join(f"'{a}'" for m in self.served.values() for a, _ in m.adapters or ())
            raise APIError(
                404,
                f"model '{name}' does not exist; this server serves {served}"
                + (f" and the adapters {adapters}" if adapters else ""),
                param="model",
                code="model_not_found",
            )
        self._use(self.served[name])

    def check_allowed(self, name: str) -> None:
        """404 for a model or adapter outside the tenant's list, as OpenAI answers a model one may not
        use (which other models exist is not the tenant's business)."""
        if self.allowed is not None and name not in self.allowed:
            raise APIError(
                404,
                f"model '{name}' does not exist or this API key may not use it",
                param="model",
                code="model_not_found",
            )

    def _use(self, model: ServedModel) -> None:
        """Another model serves the request: the permits held move to its admission pool (with
        several models each has its own, so a flood on one cannot starve the others)."""
        pool = model.admission or self.admission
        if pool is not self.admission and self.admission is not None and pool is not None:
            held, self.admitted = self.admitted, 0
            self.admission.release(held)
            self.admission = pool
            taken = pool.try_acquire(held, bulk=self.priority > 0)
            if taken is None:
                raise overloaded()
            self.admitted = taken
        self.model = model

    def require(self, route: str, *kinds: str) -> None:
        """The model must serve `route`. A request that named no model goes to the first model (in
        the configured order) of the first of `kinds` served (a reranker before an embedder for
        /rerank): TEI's routes name no model."""
        if not self.chosen and len(self.served) > 1:
            order = [self.served[n] for n in self.configured if n in self.served] or list(self.served.values())
            fit = next((m for kind in kinds for m in order if m.folder.kind == kind), None)
            if fit is not None and fit is not self.model:
                self._use(fit)
        require_kind(self.folder, route, *kinds)

    def admit(self, inputs: int, field: str = "input") -> None:
        """Bound the request's size, then take one permit per input before any tokenizing."""
        limit = self.settings.max_inputs_per_request
        if inputs > limit:
            raise bad_request(f"'{field}' has {inputs} inputs, more than the limit of {limit} per request", field)
        if self.admission is None:
            return
        if self.abandoned:
            raise overloaded()  # nobody reads this: the request has been answered already
        permits = self.admission.try_acquire(inputs, held=self.admitted, bulk=self.priority > 0)
        if permits is None:
            raise overloaded()
        self.admitted += permits

    def budget_response(self, estimate: int, field: str) -> None:
        """Refuse a request whose answer would take more than max_response_bytes, before it is built."""
        limit = self.settings.max_response_bytes
        if estimate > limit:
            raise bad_request(
                f"the answer would take about {estimate / 2**20:.0f} MiB, more than WARMPOOL_MAX_RESPONSE_BYTES "
                f"({limit / 2**20:.0f} MiB) allows: send fewer or shorter inputs",
                field,
            )

    def release(self) -> None:
        if self.admission is not None and self.admitted:
            self.admission.release(self.admitted)
            self.admitted = 0

    def abandon(self, work: concurrent.futures.Future[Any]) -> None:
        """The request is answered (timeout, client gone) while `work`, its prepare step, still runs
        on the executor: its permits go back once that thread is done with them, not before."""
        self.abandoned = True
        work.add_done_callback(lambda _: self.release())  # on the worker thread, as it finishes
        work.cancel()  # not started yet (a busy executor): it never will be, and releases now


class ModelStarting(APIError):
    """A request names a model still starting (or not loaded): 503, or held until it has started or
    loaded (pipeline.answer)."""

    def __init__(self, name: str) -> None:
        super().__init__(503, f"model '{name}' is starting", code="not_ready", headers={"Retry-After": "1"})
        self.model = name


def overloaded() -> APIError:
    return APIError(
        429,
        "server is overloaded: too many inputs in flight; retry later",
        code="overloaded",
        headers={"Retry-After": "1"},
    )


def tokenize_inputs(
    value: str | list[str] | list[int] | list[list[int]],
    ctx: RequestContext,
    truncate: int | None,
    field: str = "input",
    *,
    prompt: str = "",
    direction: Direction = "right",
) -> list[Tokens]:
    """Text or token ids -> checked token lists, one per input (admitted first). A `prompt` goes
    before each text, as sentence-transformers puts it, so its tokens count toward the length and
    the truncation; token ids are taken as given. `direction` is the side truncation cuts."""
    info, tokenizers = ctx.folder, ctx.tokenizers
    if isinstance(value, str):
        texts: list[Any] = [value]
    elif value and isinstance(value[0], int):
        texts = [value]
    else:
        texts = list(value)
    if not texts:
        raise bad_request(f"'{field}' must not be empty", field)
    ctx.admit(len(texts), field)
    where = [f"{field}[{i}]" if len(texts) > 1 else field for i in range(len(texts))]
    if isinstance(texts[0], str):
        limit = truncation_limit(truncate, ctx)
        texts = [
            capped(prompt + text, info, name, limit is not None, direction)
            for text, name in zip(texts, where, strict=True)
        ]
        tokens: list[Tokens] = []
        for part in runs(texts):  # a too-long text ends it before the texts after it are tokenized
            for tok in tokenizers.encode_batch(part, limit, direction):
                check_length(len(tok.input_ids), info, where[len(tokens)])
                tokens.append(tok)
    else:
        limit = truncation_limit(truncate, ctx, text=False)
        vocab = info.vocab_size or tokenizers.vocab_size
        tokens = [Tokens(_cut(_checked_ids(ids, i, vocab, field), limit, direction)) for i, ids in enumerate(texts)]
        for tok, name in zip(tokens, where, strict=True):
            check_length(len(tok.input_ids), info, name)
    pad_to = info.vision.text_pad_to if info.vision is not None else None
    if pad_to:  # SigLIP: padded to its full length as its processor pads (its text tower pools the last position)
        pad = [info.vision.text_pad_id] if info.vision is not None else []
        tokens = [Tokens(t.input_ids + pad * (pad_to - len(t.input_ids))) for t in tokens]
    return tokens


def truncation_limit(truncate: int | None, ctx: RequestContext, text: bool = True, pair: bool = False) -> int | None:
    """The token count to cut inputs to, or None. A text (or a pair) keeps its special tokens when
    cut, so the limit must leave room for at least one token besides them."""
    if truncate is None:
        return None
    info = ctx.folder
    if truncate == -1:
        return info.max_model_len
    specials = ctx.tokenizers.special_tokens_pair if pair else ctx.tokenizers.special_tokens
    least = specials + 1 if text else 1
    if truncate < least or truncate > info.max_model_len:
        raise bad_request(
            f"truncate_prompt_tokens must be -1 or between {least} and the model's maximum of "
            f"{info.max_model_len} tokens, got {truncate}",
            "truncate_prompt_tokens",
        )
    return truncate


def max_chars(info: ModelFolder) -> int:
    """Characters an input may have: CHARS_PER_TOKEN per token the model takes. A longer text is
    refused (or cut, when truncation was asked for) before it reaches the tokenizer, whose cost
    grows with the characters, not with the tokens kept."""
    return CHARS_PER_TOKEN * info.max_model_len


def capped(text: str, info: ModelFolder, where: str, truncating: bool, direction: Direction = "right") -> str:
    limit = max_chars(info)
    if len(text) <= limit:
        return text
    if truncating:  # far more characters than the tokens kept need: the cut is never reached
        return text[-limit:] if direction == "left" else text[:limit]
    raise bad_request(
        f"{where} has {len(text)} characters, more than the {limit} this model's {info.max_model_len}-token "
        "maximum allows; shorten it or set truncate_prompt_tokens",
        field_of(where),
    )


def _cut(ids: list[int], limit: int | None, direction: Direction) -> list[int]:
    if limit is None or len(ids) <= limit:
        return ids
    return ids[-limit:] if direction == "left" else ids[:limit]


def _checked_ids(ids: list[int], index: int, vocab: int, field: str) -> list[int]:
    if not ids:
        raise bad_request(f"{field}[{index}] is an empty token list", field)
    bad = next((t for t in ids if t < 0 or t >= vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} in {field}[{index}] is outside the vocabulary (0..{vocab - 1})", field)
    return ids


def check_length(n_tokens: int, info: ModelFolder, where: str) -> None:
    if n_tokens > info.max_model_len:
        raise bad_request(
            f"{where} has {n_tokens} tokens, more than the model's maximum of {info.max_model_len}; "
            "shorten it or set truncate_prompt_tokens",
            field_of(where),
        )


def require_kind(info: ModelFolder, route: str, *kinds: str) -> None:
    if info.kind not in kinds:
        raise APIError(
            400,
            f"{route} is not supported by model kind '{info.kind}' (it serves {', '.join(kinds)} models)",
            code="unsupported_route",
        )
