"""Sparse (SPLADE) embeddings: the engine answers each input's whole [vocabulary] row of weights;
only the non-zero ones are answered, in index order, as {indices, values}; scored by the dot
product, as SparseEncoder.similarity is."""

from __future__ import annotations

import functools
from typing import Any, ClassVar

import numpy as np

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.wire import Tokens
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.core.outcome import Outcome
from server.core.pipeline import Prepared
from server.kinds.base import Ask, Item, OutputKind, check_dimensions, check_float_encoding
from server.kinds.dense import late, only_dense, windowed
from server.kinds.pairs import PairAsk, Pairs, dot_products, encode_pairs
from server.protocols.openai import SparseOptions
from server.texts import chunking
from server.texts.prompts import prompt_text

ROW_BYTES_PER_ENTRY = 4  # the engine sends each input's whole [vocabulary] float32 row


def budget_rows(ctx: RequestContext, inputs_: int, field: str) -> None:
    """Before any work: the engine's rows for a sparse model are vocabulary-wide, whatever the answer
    keeps of them (30,522 x 4 bytes an input: 128 MiB is ~1,100 inputs)."""
    ctx.budget_response(inputs_ * ctx.folder.vocab_size * ROW_BYTES_PER_ENTRY, field)


def weights(
    rows: np.ndarray, options: SparseOptions, ctx: RequestContext, field: str = "inputs"
) -> list[tuple[list[int], list[float]]]:
    """Each row's non-zero weights as (indices ascending, values): those above `threshold`, the
    `top_k` largest of them; sized (outputs.ENTRY_BYTES a weight) against the response budget first."""
    kept = rows > (options.threshold or 0.0)
    if options.top_k is not None:
        beyond = np.argsort(-rows, axis=1, kind="stable")[:, options.top_k :]
        np.put_along_axis(kept, beyond, False, axis=1)
    ctx.budget_response(int(kept.sum()) * outputs.ENTRY_BYTES, field)
    found = []
    for row, keep in zip(rows, kept, strict=True):
        indices = np.flatnonzero(keep)
        found.append((indices.tolist(), row[indices].astype(np.float32).tolist()))
    return found


class Sparse(OutputKind):
    """SPLADE: each input's non-zero vocabulary weights as {indices, values}; pairs scored by the dot product."""

    name = "sparse"
    capabilities: ClassVar[tuple[str, ...]] = ("embed",)

    def card(self, folder: ModelFolder, settings: Settings) -> dict[str, Any]:
        return {"outputs": ["sparse"], "pooling": "splade"}

    def tei_type(self, folder: ModelFolder) -> dict[str, Any]:
        return {"embedding": {"pooling": "splade"}}

    def embed(self, ask: Ask, ctx: RequestContext) -> Prepared[Ask, Any]:
        check_dimensions(ask.dimensions, ctx)
        check_float_encoding(ask, "a sparse (SPLADE) model's {indices, values}")
        if ask.dimensions is not None:
            raise inputs.bad_request(
                "a sparse (SPLADE) model answers {indices, values}: 'dimensions' does not apply", "dimensions"
            )
        return self.encoded(ask, ctx, prompt_text(ctx.folder, ask.prompt_name))

    def encoded(self, ask: Ask, ctx: RequestContext, prompt: str) -> Prepared[Ask, Any]:
        """The inputs through the model: windows of long inputs, their rows sized first."""
        if ask.late_chunking:
            return late(ask, ctx, prompt)
        only_dense(ask.outputs, ask.outputs_field)
        tokens, windows = windowed(ask, ctx, prompt)
        budget_rows(ctx, len(tokens), ask.field)
        return Prepared(ask, tokens, windows)

    def rows(self, prep: Prepared[Ask, Any], outcome: Outcome) -> np.ndarray:
        """One vocabulary-wide row per input: its windows' largest weights."""
        return chunking.combine(outcome.vectors, prep.state, sparse=True)

    def items(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[Item]:
        found = weights(self.rows(prep, outcome), prep.body.sparse, ctx, prep.body.field)
        return [{"embedding": {"indices": indices, "values": values}} for indices, values in found]

    def lexical(self, prep: Prepared[Ask, Any], outcome: Outcome, ctx: RequestContext) -> list[dict[str, Any]]:
        return [item["embedding"] for item in self.items(prep, outcome, ctx)]

    def pairs(self, ask: PairAsk, ctx: RequestContext) -> tuple[list[Tokens], Pairs]:
        budget = functools.partial(budget_rows, ctx)
        return encode_pairs(ask, ctx, cross=False, budget=budget)

    def scores(self, vectors: Any, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
        return dot_products(vectors, pairs, cosine=False)
