"""Inference-free sparse queries: a SparseEncoder Router folder whose query route is a
SparseStaticEmbedding (OpenSearch's neural sparse models) encodes a query as each of its tokens'
static weight (an IDF), once per token, special tokens left out: a lookup here, no engine work.
Documents take the model (engine/heads/sparse.py) as any SPLADE input does."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.core import inputs
from server.core.inputs import RequestContext
from server.kinds.late_interaction import role_of

ROW_BYTES_PER_ENTRY = 4  # a query's row is vocabulary-wide float32, as the engine's SPLADE rows are


@dataclass(frozen=True)
class Static:
    """A request's query rows, made without the engine."""

    rows: np.ndarray  # [inputs, vocabulary]


def static_queries(ctx: RequestContext, prompt_name: str | None) -> bool:
    """The request's inputs are an inference-free model's queries (`prompt_name` query); a document,
    and every input to a model without a static query side, goes to the engine."""
    return ctx.folder.idf is not None and role_of(ctx, prompt_name) == "query"


@functools.lru_cache(maxsize=16)
def _weights(path: Path) -> np.ndarray:
    from safetensors.numpy import load_file  # numpy only: the HTTP process never imports torch

    return load_file(str(path))["weight"].astype(np.float32)


def rows(value: Any, ctx: RequestContext, field: str) -> Static:
    """Each query's vocabulary-wide row: its tokens' weights (at most the model's maximum tokens,
    as SparseStaticEmbedding's tokenizer call cuts), sized against the response budget first."""
    given = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value)
    if not given:
        raise inputs.bad_request(f"'{field}' must not be empty", field)
    ctx.admit(len(given), field)
    assert ctx.folder.idf is not None
    weights = _weights(ctx.folder.idf)
    ctx.budget_response(len(given) * weights.shape[0] * ROW_BYTES_PER_ENTRY, field)
    out = np.zeros((len(given), weights.shape[0]), dtype=np.float32)
    limit = ctx.folder.max_model_len
    for i, item in enumerate(given):
        where = f"{field}[{i}]" if len(given) > 1 else field
        if isinstance(item, str):
            ids = ctx.tokenizers.tokenize(inputs.capped(item, ctx.folder, where, True), add_special_tokens=False)
        else:
            ids = [int(t) for t in item]
            if any(t < 0 or t >= weights.shape[0] for t in ids):
                raise inputs.bad_request(
                    f"{where} has a token id outside the vocabulary (0..{weights.shape[0] - 1})", field
                )
        ids = ids[:limit]
        out[i, ids] = weights[ids]
    return Static(out)
