"""Long inputs: refused (the default), truncated, or embedded as overlapping windows.

`chunk` embeds a text longer than the model takes as windows of at most its maximum tokens, each
sharing OVERLAP tokens with the one before and each with the model's special tokens, as vLLM's
chunked processing does; the text's vector is its windows' mean weighted by their tokens (dense),
or their maximum (sparse weights). Every window is one input to admission and the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from common.wire import Tokens
from server.core import inputs
from server.core.inputs import RequestContext
from server.http.errors import APIError, field_of
from server.tokenizing.tokenizer import Direction

LongInputs = Literal["refuse", "truncate", "chunk"]
OVERLAP = 32  # tokens each window repeats of the one before it: no token is seen only at an edge


@dataclass(frozen=True)
class Windows:
    """How a chunked request's token lists map back to its inputs."""

    counts: list[int]  # windows per input, in order
    lengths: list[int]  # tokens per window


def tokenize(
    value: Any,
    ctx: RequestContext,
    truncate: int | None,
    mode: LongInputs | None,
    field: str = "input",
    *,
    prompt: str = "",
    direction: Direction = "right",
) -> tuple[list[Tokens], Windows | None]:
    """inputs.tokenize_inputs, or the windows of every text under `chunk`. A truncation the request
    asks for wins; `mode` (else WARMPOOL_LONG_INPUTS) decides for a text too long otherwise."""
    mode = mode or ctx.settings.long_inputs
    texts = [value] if isinstance(value, str) else value
    if truncate is not None or mode == "refuse" or not texts or not all(isinstance(t, str) for t in texts):
        return inputs.tokenize_inputs(value, ctx, truncate, field, prompt=prompt, direction=direction), None
    if mode == "truncate":
        return inputs.tokenize_inputs(value, ctx, -1, field, prompt=prompt, direction=direction), None
    ctx.admit(len(texts), field)
    info = ctx.folder
    limit = inputs.max_chars(info) * ctx.settings.max_windows
    for i, text in enumerate(texts):
        if len(prompt + text) > limit:
            raise inputs.bad_request(
                f"{field}[{i}] has {len(prompt + text)} characters, more than the {limit} that "
                f"{ctx.settings.max_windows} windows of this model take (WARMPOOL_MAX_WINDOWS)",
                field,
            )
    overlap = min(OVERLAP, (info.max_model_len - ctx.tokenizers.special_tokens) // 2)  # < a window's text
    flat: list[Tokens] = []
    counts = []
    room = info.max_model_len - ctx.tokenizers.special_tokens
    most = room + (ctx.settings.max_windows - 1) * (room - overlap)  # the tokens max_windows windows hold
    for i, text in enumerate(texts):  # one at a time: a refused text leaves the rest untokenized
        if ctx.tokenizers.surely_longer(prompt + text, most):
            raise too_many_windows(f"{field}[{i}]", None, ctx)
        raw = ctx.tokenizers.encode_raw(prompt + text)
        count = ctx.tokenizers.window_count(raw, info.max_model_len, overlap)
        if count > ctx.settings.max_windows:
            raise too_many_windows(f"{field}[{i}]", count, ctx)
        ctx.admit(len(flat) + count, field)  # a permit per window, taken before its token lists are made
        flat += ctx.tokenizers.windows(raw, info.max_model_len, overlap)
        counts.append(count)
    return flat, Windows(counts, [len(w.input_ids) for w in flat])


def too_many_windows(where: str, count: int | None, ctx: RequestContext) -> APIError:
    """The 400 for a text past WARMPOOL_MAX_WINDOWS: its windows counted, or (None) known to be too many."""
    most, tokens = ctx.settings.max_windows, ctx.folder.max_model_len
    if count is None:
        said = f"more than WARMPOOL_MAX_WINDOWS ({most}) windows of {tokens} tokens"
    else:
        said = f"{count} windows of {tokens} tokens, more than WARMPOOL_MAX_WINDOWS ({most})"
    return inputs.bad_request(f"{where} takes {said}", field_of(where))


def combine(vectors: np.ndarray, windows: Windows | None, sparse: bool = False) -> np.ndarray:
    """One row per input: its windows' token-weighted mean, or their maximum for sparse weights."""
    if windows is None:
        return vectors
    rows, start = [], 0
    for count in windows.counts:
        part = vectors[start : start + count].astype(np.float64)
        weights = np.asarray(windows.lengths[start : start + count], dtype=np.float64)[:, None]
        rows.append(part.max(axis=0) if sparse else (part * weights).sum(axis=0) / weights.sum())
        start += count
    return np.stack(rows).astype(np.float32)
