"""Pre- and post-processing that runs on the executor, never on the event loop (vLLM #39763).

Parsing, validation and tokenizing before the engine; normalising, truncating and JSON/base64
encoding after it. Each function here is synchronous and thread safe.
"""

from __future__ import annotations

import asyncio
import base64
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from orchestrator.settings import Settings
from server.admission import Admission
from server.errors import APIError, bad_request, from_validation
from server.modelinfo import ModelInfo
from server.tokenizer import TokenizerPool, Tokens

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M", bound=BaseModel)


def make_async(fn: Callable[P, R], executor: Executor) -> Callable[P, asyncio.Future[R]]:
    """Run fn on the executor; the awaiting coroutine keeps the loop free meanwhile."""

    def wrapper(*args: P.args, **kwargs: P.kwargs) -> asyncio.Future[R]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(executor, functools.partial(fn, *args, **kwargs))

    return wrapper


def parse(model: type[M], raw: bytes) -> M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise from_validation(list(exc.errors())) from None


@dataclass
class Context:
    """What one request's prepare and render steps may read, and the admission permits it holds."""

    info: ModelInfo
    tokenizers: TokenizerPool
    settings: Settings
    admission: Admission | None = None
    admitted: int = 0

    @property
    def model_name(self) -> str:
        return self.settings.model_name

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise APIError(
                404,
                f"model '{name}' does not exist; this server serves '{self.model_name}'",
                param="model",
                code="model_not_found",
            )

    def require(self, route: str, *kinds: str) -> None:
        require_kind(self.info, route, *kinds)

    def admit(self, inputs: int, field: str = "input") -> None:
        """Bound the request's size, then take one permit per input before any tokenizing."""
        limit = self.settings.max_inputs_per_request
        if inputs > limit:
            raise bad_request(f"'{field}' has {inputs} inputs, more than the limit of {limit} per request", field)
        if self.admission is None:
            return
        permits = self.admission.try_acquire(inputs, held=self.admitted)
        if permits is None:
            raise overloaded()
        self.admitted += permits

    def release(self) -> None:
        if self.admission is not None and self.admitted:
            self.admission.release(self.admitted)
            self.admitted = 0


def overloaded() -> APIError:
    return APIError(
        429,
        "server is overloaded: too many inputs in flight; retry later",
        code="overloaded",
        headers={"Retry-After": "1"},
    )


def tokenize_inputs(
    value: str | list[str] | list[int] | list[list[int]],
    ctx: Context,
    truncate: int | None,
    field: str = "input",
) -> list[Tokens]:
    """Text or token ids -> checked token lists, one per input (admitted first)."""
    info, tokenizers = ctx.info, ctx.tokenizers
    limit = truncation_limit(truncate, info)
    if isinstance(value, str):
        texts: list[Any] = [value]
    elif value and isinstance(value[0], int):
        texts = [value]
    else:
        texts = list(value)
    if not texts:
        raise bad_request(f"'{field}' must not be empty", field)
    ctx.admit(len(texts), field)
    if isinstance(texts[0], str):
        if limit is None:
            tokens = tokenizers.encode_batch(texts)
        else:
            tokens = [tokenizers.encode(text, truncate=limit) for text in texts]
    else:
        vocab = info.vocab_size or tokenizers.vocab_size
        tokens = [Tokens(_checked_ids(ids, i, vocab, field)[:limit]) for i, ids in enumerate(texts)]
    for i, tok in enumerate(tokens):
        check_length(len(tok.input_ids), info, f"{field}[{i}]" if len(tokens) > 1 else field)
    return tokens


def truncation_limit(truncate: int | None, info: ModelInfo) -> int | None:
    if truncate is None:
        return None
    if truncate == -1:
        return info.max_model_len
    if truncate == 0 or truncate > info.max_model_len:
        raise bad_request(
            f"truncate_prompt_tokens must be -1 or between 1 and the model's maximum of "
            f"{info.max_model_len} tokens, got {truncate}",
            "truncate_prompt_tokens",
        )
    return truncate


def _checked_ids(ids: list[int], index: int, vocab: int, field: str) -> list[int]:
    if not ids:
        raise bad_request(f"{field}[{index}] is an empty token list", field)
    bad = next((t for t in ids if t < 0 or t >= vocab), None)
    if bad is not None:
        raise bad_request(f"token id {bad} in {field}[{index}] is outside the vocabulary (0..{vocab - 1})", field)
    return ids


def check_length(n_tokens: int, info: ModelInfo, where: str) -> None:
    if n_tokens > info.max_model_len:
        raise bad_request(
            f"{where} has {n_tokens} tokens, more than the model's maximum of {info.max_model_len}; "
            "shorten it or set truncate_prompt_tokens",
            where.split("[")[0],
        )


def normalize(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def embeddings(vectors: np.ndarray, dimensions: int | None, norm: bool) -> np.ndarray:
    """Pooled vectors as the model's modules define them, truncated to `dimensions` (Matryoshka)."""
    if dimensions is not None:
        if dimensions > vectors.shape[1]:
            raise bad_request(
                f"dimensions={dimensions} is larger than the model's {vectors.shape[1]}",
                "dimensions",
            )
        vectors = vectors[:, :dimensions]
        norm = True
    return normalize(vectors) if norm else vectors.astype(np.float32)


def encode_vector(vector: np.ndarray, encoding_format: str) -> np.ndarray | str:
    """base64 of little-endian float32 (what the openai client decodes), or the array for to_json."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector


def to_json(body: Any) -> bytes:
    """orjson writes float32 arrays in their shortest round-trip form, ~10x faster than json."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def require_kind(info: ModelInfo, route: str, *kinds: str) -> None:
    if info.kind not in kinds:
        raise APIError(
            400,
            f"{route} is not supported by model kind '{info.kind}' (it serves {', '.join(kinds)} models)",
            code="unsupported_route",
        )
