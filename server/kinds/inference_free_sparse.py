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

from common.wire import Tokens
from server.core import inputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared
from server.kinds.base import Ask
from server.kinds.multi_vector import role_of
from server.kinds.pairs import PairAsk, Pairs
from server.kinds.sparse import Sparse

ROW_BYTES_PER_ENTRY = 4  # a query's row is vocabulary-wide float32, as the engine's SPLADE rows are


@dataclass(frozen=True)
class Static:
    """A request's query rows, made without the engine."""

    rows: np.ndarray  # [inputs, vocabulary]


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


class InferenceFreeSparse(Sparse):
    """A sparse model whose queries (`prompt_name` query) are their tokens' static weights; its
    documents go through the model; a request's role stands in for a prompt."""

    name = "inference-free-sparse"

    def embed(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, Any]:
        if ask.dimensions is not None or ask.encoding.encoding_format != "float":
            return super().embed(ask, ctx)  # its 400
        if role_of(ctx, ask.prompt_name) == "query":
            return Prepared(ask, [], rows(ask.inputs, ctx, ask.field))
        return self.encoded(ask, ctx, "")

    def rows(self, prep: Prepared[Ask, Any], outcome: Outcome) -> np.ndarray:
        return prep.state.rows if isinstance(prep.state, Static) else super().rows(prep, outcome)

    def pairs(self, ask: PairAsk, ctx: RequestContext) -> tuple[list[Tokens], Pairs]:
        """Queries by their tokens' static weights, documents by the model."""
        queries = list(dict.fromkeys(ask.lefts))
        static = rows(queries, ctx, ask.fields[0]).rows
        documents = PairAsk(ask.rights, ask.rights, ask.truncate, (ask.fields[1], ask.fields[1]), ask.direction)
        tokens, pairs = super().pairs(documents, ctx)
        at = {text: i for i, text in enumerate(queries)}
        return tokens, Pairs(len(ask.lefts), False, [at[t] for t in ask.lefts], pairs.right, static=static)

    def scores(self, vectors: Any, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
        assert pairs.static is not None
        return (pairs.static[pairs.left].astype(np.float64) * vectors[pairs.right].astype(np.float64)).sum(axis=1)  # type: ignore[no-any-return]
