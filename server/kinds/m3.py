"""bge-m3's three outputs on the HTTP side: which a request asks for, and each answered as the
peers answer it: the dense vector, lexical weights as {indices, values} (one weight per token id,
its largest over the text's tokens, special tokens dropped, as FlagEmbedding keeps them), and the
ColBERT vectors of every token but the first. The engine runs one forward for all three."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.wire import Tokens
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared
from server.kinds.base import Ask, Item, check_dimensions
from server.kinds.dense import Dense, late, only_dense, windowed
from server.protocols.openai import SparseOptions
from server.texts import chunking


def asked(names: Sequence[str] | None, ctx: RequestContext, field: str = "outputs") -> tuple[str, ...] | None:
    """The outputs a request names, in a fixed order; None where it asks for the dense vector
    alone (the usual path). A model without bge-m3's heads, or whose heads its engine refused
    (common/m3.py), is a 400 for any other output."""
    m3 = ctx.folder.m3
    if m3 is None or names is None or set(names) == {"dense"}:
        only_dense(names, field)
        return None
    if m3.refused is not None:
        why = f"this model's bge-m3 heads were not loaded ({m3.refused}): it answers 'dense' alone"
        raise inputs.bad_request(why, field)
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


def answers(
    rows: Any,
    tokens: list[Tokens],
    windows: chunking.Windows | None,
    options: SparseOptions,
    ctx: RequestContext,
) -> list[Item]:
    """Per input its outputs: `embedding` (the dense vector, normalised as the model's modules
    say), `sparse` and `multi_vector`, only those asked. A text embedded as windows (long inputs
    chunked) gets its windows' token-weighted mean, the largest weight per token id over all of
    them, and their ColBERT vectors one after another."""
    found, start = [], 0
    for count in windows.counts if windows is not None else [1] * len(rows):
        part, mine = rows[start : start + count], tokens[start : start + count]
        start += count
        item: dict[str, Any] = {}
        if "dense" in part[0]:
            lengths = [len(t.input_ids) for t in mine]
            dense = chunking.combine(np.stack([r["dense"] for r in part]), chunking.Windows([count], lengths))
            item["embedding"] = outputs.embeddings(dense, None, ctx.folder.normalize)[0]
        if "sparse" in part[0]:
            weights = np.concatenate([r["sparse"] for r in part])
            ids = [i for t in mine for i in t.input_ids]
            item["sparse"] = lexical(weights, ids, ctx.tokenizers.special_ids, options)
        if "multi_vector" in part[0]:
            item["multi_vector"] = np.concatenate([r["multi_vector"] for r in part])
        found.append(item)
    return found


@dataclass(frozen=True)
class Asked:
    """A request for outputs beside the dense vector: which, and the windows of its long inputs."""

    outputs: tuple[str, ...]
    windows: chunking.Windows | None


class M3(Dense):
    """bge-m3: a dense model whose requests may also ask for its lexical weights and ColBERT vectors."""

    name = "m3"

    def card(self, folder: ModelFolder, settings: Settings) -> dict[str, Any]:
        assert folder.m3 is not None
        if folder.m3.refused is not None:  # its engine left the heads unread
            return super().card(folder, settings)
        return {"outputs": ["dense", "sparse", "multi_vector"], "pooling": folder.pooling}

    def embed(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, Any]:
        check_dimensions(ask.dimensions, ctx)
        prompt = self.prompt(ask, ctx)
        if ask.late_chunking:
            return late(ask, ctx, prompt)
        wanted = asked(ask.outputs, ctx, ask.outputs_field)
        if "sparse" not in (wanted or ()) and (ask.sparse.top_k, ask.sparse.threshold) != (
            None,
            None,
        ):
            raise inputs.bad_request(
                "'top_k' and 'threshold' prune the sparse output: ask for it in 'outputs'", "top_k"
            )
        if wanted is not None and ask.encoding.encoding_format != "float":
            raise inputs.bad_request(
                f"encoding_format={ask.encoding.encoding_format} applies to the dense vector alone, not to 'outputs'",
                "encoding_format",
            )
        if wanted is not None and ask.dimensions is not None:
            raise inputs.bad_request("'dimensions' applies to the dense vector alone, not to 'outputs'", "outputs")
        tokens, windows = windowed(ask, ctx, prompt)
        if wanted is None:
            return Prepared(ask, tokens, windows)
        return Prepared(ask, marked(tokens, wanted, ctx, ask.field), Asked(wanted, windows))

    def items(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[Item]:
        if not isinstance(prep.state, Asked):
            return super().items(prep, outcome, ctx)
        return answers(outcome.vectors, prep.tokens, prep.state.windows, prep.body.sparse, ctx)

    def lexical(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[dict[str, Any]]:
        return [item["sparse"] for item in self.items(prep, outcome, ctx)]
