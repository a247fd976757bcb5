"""bge-m3's three outputs on the HTTP side: which a request asks for, and each answered as the
peers answer it: the dense vector, lexical weights as {indices, values} (one weight per token id,
its largest over the text's tokens, special tokens dropped, as FlagEmbedding keeps them), and the
ColBERT vectors of every token but the first. The engine runs one forward for all three."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from common.wire import Tokens
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.protocols.openai import SparseOptions
from server.texts import chunking


def asked(names: Sequence[str] | None, ctx: RequestContext, field: str = "outputs") -> tuple[str, ...] | None:
    """The outputs a request names, in a fixed order; None where it asks for the dense vector
    alone (the usual path). A model without bge-m3's heads, or whose heads are pickles the
    server may not load, is a 400 for any other output."""
    if names is None or set(names) == {"dense"}:
        return None
    m3 = ctx.folder.m3
    if m3 is None:
        raise inputs.bad_request(
            "'outputs' other than dense need a bge-m3 model (sparse_linear, colbert_linear)", field
        )
    if m3.pickled and ctx.settings.allow_bin_weights != "on":
        raise inputs.bad_request(
            f"this model's heads ({m3.sparse.name}, {m3.colbert.name}) are torch pickles, not loaded by default: "
            "set WARMPOOL_ALLOW_BIN_WEIGHTS=on, or convert them to safetensors",
            field,
        )
    return tuple(name for name in ("dense", "sparse", "multi_vector") if name in names)


def marked(tokens: list[Tokens], wanted: tuple[str, ...], ctx: RequestContext, field: str) -> list[Tokens]:
    """The inputs marked for their outputs, once their answer's size is known to fit."""
    counts = [len(t.input_ids) for t in tokens]
    size = 0
    if "multi_vector" in wanted:
        size += sum(n - 1 for n in counts) * ctx.folder.hidden_size * outputs.JSON_FLOAT_BYTES
    if "sparse" in wanted:
        size += sum(counts) * outputs.ENTRY_BYTES
    ctx.budget_response(size, field)
    return [t._replace(head="m3", outputs=wanted) for t in tokens]


def lexical(weights: np.ndarray, ids: list[int], unused: frozenset[int], options: SparseOptions) -> dict[str, Any]:
    """A text's lexical weights: per token id its largest weight above 0 (or `threshold`), special
    tokens dropped; the `top_k` largest if asked; indices ascending."""
    best: dict[int, float] = {}
    for token, weight in zip(ids, weights.tolist(), strict=True):
        if token not in unused and weight > (options.threshold or 0.0) and weight > best.get(token, 0.0):
            best[token] = weight
    kept = sorted(best, key=lambda t: -best[t])[: options.top_k] if options.top_k is not None else list(best)
    indices = sorted(kept)
    return {"indices": indices, "values": [best[t] for t in indices]}


def items(rows: np.ndarray, prep: Any, ctx: RequestContext) -> list[dict[str, Any]]:
    """Per input its outputs: `embedding` (the dense vector, normalised as the model's modules
    say), `sparse` and `multi_vector`, only those asked. A text embedded as windows (long inputs
    chunked) gets its windows' token-weighted mean, the largest weight per token id over all of
    them, and their ColBERT vectors one after another."""
    windows = prep.extra if isinstance(prep.extra, chunking.Windows) else None
    options = prep.body if isinstance(prep.body, SparseOptions) else SparseOptions(top_k=None, threshold=None)
    answers, start = [], 0
    for count in windows.counts if windows is not None else [1] * len(rows):
        part, tokens = rows[start : start + count], prep.tokens[start : start + count]
        start += count
        item: dict[str, Any] = {}
        if "dense" in part[0]:
            lengths = [len(t.input_ids) for t in tokens]
            dense = chunking.combine(np.stack([r["dense"] for r in part]), chunking.Windows([count], lengths))
            item["embedding"] = outputs.embeddings(dense, None, ctx.folder.normalize)[0]
        if "sparse" in part[0]:
            weights = np.concatenate([r["sparse"] for r in part])
            ids = [i for t in tokens for i in t.input_ids]
            item["sparse"] = lexical(weights, ids, ctx.tokenizers.special_ids, options)
        if "multi_vector" in part[0]:
            item["multi_vector"] = np.concatenate([r["multi_vector"] for r in part])
        answers.append(item)
    return answers
