"""Scoring requests' pairs: which engine inputs hold each pair's sides, and the bi-encoder and
cross-encoder ways of making them. Each output kind scores them its own way (server/kinds/)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from common.wire import Tokens
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.tokenizing.tokenizer import Direction


@dataclass(frozen=True)
class Pairs:
    """Which token lists hold each pair's sides (bi-encoder), or one list per pair (cross)."""

    count: int
    cross: bool
    left: list[int]
    right: list[int]
    late: list[Tokens] | None = None  # a multi-vector model's token lists: scored by MaxSim
    static: np.ndarray | None = None  # an inference-free sparse model's query rows: `left` indexes these


@dataclass(frozen=True)
class PairAsk:
    """A scoring request's texts, whatever surface it came by: each pair's left and right (a query
    repeated against every document), how they are cut, and the request's names for the two sides."""

    lefts: list[str]
    rights: list[str]
    truncate: int | None
    fields: tuple[str, str]
    direction: Direction = "right"


def encode_pairs(
    ask: PairAsk, ctx: RequestContext, cross: bool, budget: Callable[[int, str], None] | None = None
) -> tuple[list[Tokens], Pairs]:
    """Token lists for the pairs: one per pair for a cross-encoder, one per unique text for a
    bi-encoder (one admission permit per list). Errors name the request's own `fields`.

    Every text is checked once, before any pairing: a long query is refused (or cut) once, not
    tokenized again against each document. `budget` sizes a bi-encoder's rows before they are made."""
    lefts, rights, direction = ask.lefts, ask.rights, ask.direction
    limit = inputs.truncation_limit(ask.truncate, ctx, pair=cross)
    left_field, right_field = ask.fields
    one_left = len(set(lefts)) == 1  # a query against every document
    origin: dict[str, str] = {}
    for i, text in enumerate(lefts):
        origin.setdefault(text, left_field if one_left else f"{left_field}[{i}]")
    for i, text in enumerate(rights):
        origin.setdefault(text, f"{right_field}[{i}]")
    ctx.admit(len(lefts) if cross else len(origin), right_field)
    texts = {text: inputs.capped(text, ctx.folder, name, limit is not None, direction) for text, name in origin.items()}
    if cross:
        if limit is None:  # each query alone must fit before it is paired with every document
            queries = list(dict.fromkeys(lefts))
            for query, tok in zip(queries, ctx.tokenizers.encode_batch([texts[q] for q in queries]), strict=True):
                inputs.check_length(len(tok.input_ids), ctx.folder, origin[query])
        tokens = ctx.tokenizers.encode_pairs(
            [(texts[q], texts[d]) for q, d in zip(lefts, rights, strict=True)], limit, direction
        )
        index = list(range(len(tokens)))
        pairs = Pairs(len(tokens), True, index, index)
        where = [f"{right_field}[{i}]" for i in index]
    else:
        unique = list(origin)
        position = {text: i for i, text in enumerate(unique)}
        tokens = ctx.tokenizers.encode_batch([texts[t] for t in unique], limit, direction)
        pairs = Pairs(len(lefts), False, [position[t] for t in lefts], [position[t] for t in rights])
        if budget is not None:
            budget(len(tokens), right_field)
        where = [origin[text] for text in unique]
    for tok, name in zip(tokens, where, strict=True):
        inputs.check_length(len(tok.input_ids), ctx.folder, name)
    return tokens, pairs


def dot_products(vectors: np.ndarray, pairs: Pairs, cosine: bool = True) -> np.ndarray:
    """Each pair's dot product: of the unit vectors (the cosine), or of the vectors as they are."""
    unit = (outputs.normalize(vectors) if cosine else vectors).astype(np.float64)
    return (unit[pairs.left] * unit[pairs.right]).sum(axis=1)  # type: ignore[no-any-return]
