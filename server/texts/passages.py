"""Long documents in scoring requests (`long_inputs: "chunk"` on /rerank, /score): a document longer
than the room the model leaves it beside its query is scored as overlapping passages, and takes the
best passage's score (or their mean). Each passage is an ordinary document to the model's kind (a
cross-encoder's pair, a bi-encoder's or ColBERT model's document), so every kind scores it as it
scores a document; its character span in the document says which passage won."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from server.core import inputs
from server.core.inputs import RequestContext
from server.texts.chunking import OVERLAP, too_many_windows

Scoring = Literal["max", "mean"]
SLACK = 8  # tokens a passage keeps free (a 16th of a smaller window): its text alone may take a few more
LEAST_ROOM = 16  # a query leaving less than this to its documents is refused, not chunked to shreds


@dataclass(frozen=True)
class Passages:
    """Which scored pair belongs to which of the request's pairs, and where its passage is."""

    owners: list[int]  # per scored pair, the index of the request's pair it is a passage of
    spans: list[tuple[int, int]]  # per scored pair, its passage's [start, end) in the document's characters
    scoring: Scoring

    def fold(self, scores: np.ndarray, count: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Each request pair's score (its passages' best, or their mean) and its best passage's span."""
        best = np.full(count, -np.inf)
        total, passages = np.zeros(count), np.zeros(count)
        won: list[tuple[int, int]] = [(0, 0)] * count
        for score, owner, span in zip(scores.astype(np.float64), self.owners, self.spans, strict=True):
            if score > best[owner]:
                best[owner], won[owner] = score, span
            total[owner] += score
            passages[owner] += 1
        return (best if self.scoring == "max" else total / passages), won


def room(ctx: RequestContext, left: str, cross: bool, prompt: str) -> int:
    """The document tokens one passage may hold: the model's window less what its query (a
    cross-encoder's pair) or its prompt (a bi-encoder's document) and the special tokens take."""
    tokenizers, window = ctx.tokenizers, ctx.folder.max_model_len
    if cross:
        beside = tokenizers.pair_overhead(left)
    else:  # a ColBERT model's document marker is one token more
        beside = tokenizers.special_tokens + (len(tokenizers.encode_raw(prompt)) if prompt else 0)
        beside += tokenizers.markers is not None
    return window - beside - min(SLACK, window // 16)


def split(
    lefts: Sequence[str], rights: Sequence[str], ctx: RequestContext, fields: tuple[str, str], cross: bool, prompt: str
) -> tuple[list[str], list[str], list[int], list[tuple[int, int]]]:
    """The pairs with each long right side cut into passages: (lefts, passages, owners, spans). Each
    document's passages are counted, bounded by WARMPOOL_MAX_WINDOWS and admitted (a permit each)
    before any passage of it is made."""
    left_field, right_field = fields
    most_chars = inputs.max_chars(ctx.folder) * ctx.settings.max_windows
    out_lefts: list[str] = []
    out_rights: list[str] = []
    owners: list[int] = []
    spans: list[tuple[int, int]] = []
    rooms: dict[str, int] = {}
    for i, (left, right) in enumerate(zip(lefts, rights, strict=True)):
        where = f"{right_field}[{i}]"
        if len(right) > most_chars:
            raise too_many_windows(where, None, ctx)
        if left not in rooms:
            if not cross:  # scored apart, the query must fit its own window (passages are cut to theirs)
                length = len(ctx.tokenizers.encode_raw(prompt + left)) + ctx.tokenizers.special_tokens
                inputs.check_length(length, ctx.folder, left_field)
            rooms[left] = room(ctx, left, cross, prompt)
            if rooms[left] < (LEAST_ROOM if cross else 1):
                raise inputs.bad_request(
                    f"{left_field} leaves {max(rooms[left], 0)} of the model's {ctx.folder.max_model_len} tokens "
                    "to each passage of a document: too few to chunk documents beside it",
                    left_field,
                )
        cuts = cut(right, rooms[left], ctx)
        if len(cuts) > ctx.settings.max_windows:
            raise too_many_windows(where, len(cuts), ctx)
        ctx.admit(len(owners) + len(cuts), right_field)  # a permit per passage, before the next is cut
        for start, end in cuts:
            out_lefts.append(left)
            out_rights.append(right[start:end])
            owners.append(i)
            spans.append((start, end))
    return out_lefts, out_rights, owners, spans


def cut(text: str, tokens: int, ctx: RequestContext) -> list[tuple[int, int]]:
    """A text's passages as character spans of at most `tokens` tokens each, each repeating the last
    OVERLAP tokens (at most half a passage) of the one before; a text that fits is one passage."""
    offsets = ctx.tokenizers.offsets(text)
    if len(offsets) <= tokens:
        return [(0, len(text))]
    overlap = min(OVERLAP, tokens // 2)
    spans, start = [], 0
    while True:
        end = min(start + tokens, len(offsets))
        spans.append((offsets[start][0], offsets[end - 1][1]))
        if end == len(offsets):
            return spans
        start = end - overlap
