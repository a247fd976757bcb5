"""Late chunking: the chunks of one document embedded together, each pooled from token states that
saw the whole document (Jina AI's `late_chunking`), instead of each chunk alone.

The request's inputs are consecutive chunks of one text: joined as given (no separator), encoded
in one pass (or, past the model's maximum, as overlapping windows, as long inputs are chunked),
and each chunk's vector is the mean of the states of the tokens that start inside it (in every
window that holds them), normalised as the model's modules say. Mean-pooled models without Dense
modules only: a CLS vector or a projection after pooling has no per-chunk meaning.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from common.wire import Tokens
from server.core import inputs, outputs
from server.core.inputs import RequestContext
from server.texts.chunking import OVERLAP


@dataclass(frozen=True)
class LateChunks:
    starts: list[int]  # each chunk's first character in the joined text
    offsets: list[list[int | None]]  # per window, each token's start offset (None: special token)


def tokenize(value: object, ctx: RequestContext, prompt: str, field: str = "input") -> tuple[list[Tokens], LateChunks]:
    """The windows of the chunks' joined text, and where each chunk starts in it."""
    info = ctx.folder
    if info.kind != "embedding" or info.pooling != "mean" or info.dense:
        raise inputs.bad_request(
            "late_chunking pools each chunk's token states: it needs a mean-pooled embedding model without "
            f"Dense modules (this one: {info.kind}, {info.pooling} pooling, {len(info.dense)} Dense modules)",
            "late_chunking",
        )
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise inputs.bad_request("late_chunking takes 'input' as a list of texts: the chunks of one document", field)
    chunks: list[str] = value  # type: ignore[assignment]
    ctx.admit(len(chunks), field)
    starts, at = [], len(prompt)
    for chunk in chunks:
        starts.append(at)
        at += len(chunk)
    limit = inputs.max_chars(info) * ctx.settings.max_windows
    if at > limit:
        raise inputs.bad_request(
            f"the chunks take {at} characters together, more than the {limit} that "
            f"{ctx.settings.max_windows} windows of this model take (WARMPOOL_MAX_WINDOWS)",
            field,
        )
    overlap = min(OVERLAP, (info.max_model_len - ctx.tokenizers.special_tokens) // 2)
    windows = ctx.tokenizers.encode_windows_with_offsets(prompt + "".join(chunks), info.max_model_len, overlap)
    if len(windows) > ctx.settings.max_windows:
        raise inputs.bad_request(
            f"the chunks take {len(windows)} windows of {info.max_model_len} tokens, more than "
            f"WARMPOOL_MAX_WINDOWS ({ctx.settings.max_windows})",
            field,
        )
    late = LateChunks(starts, [offsets for _, offsets in windows])
    owners = [_owners(offsets, late.starts, len(prompt)) for offsets in late.offsets]
    empty = set(range(len(chunks))) - {c for row in owners for c in row if c >= 0}
    if empty:
        first = min(empty)
        raise inputs.bad_request(f"{field}[{first}] holds no token of its own: it cannot be pooled", field)
    ctx.admit(len(windows), field)  # the rest of the permits: one per window
    return [tokens._replace(head="tokens") for tokens, _ in windows], late


def _owners(offsets: list[int | None], starts: list[int], prompt_chars: int) -> list[int]:
    """Which chunk each token of a window belongs to (-1: a special token or the prompt's)."""
    return [-1 if o is None or o < prompt_chars else bisect_right(starts, o) - 1 for o in offsets]


def pooled(states: np.ndarray, late: LateChunks, normalize: bool) -> np.ndarray:
    """Each chunk's mean token state over every window, normalised where the model is."""
    width = states[0].shape[1]
    sums, counts = np.zeros((len(late.starts), width)), np.zeros(len(late.starts))
    prompt_chars = late.starts[0]
    for window, offsets in zip(states, late.offsets, strict=True):
        owners = np.asarray(_owners(offsets, late.starts, prompt_chars))
        mine = owners >= 0
        np.add.at(sums, owners[mine], window[mine].astype(np.float64))
        np.add.at(counts, owners[mine], 1)
    means = (sums / counts[:, None]).astype(np.float32)
    return outputs.normalize(means) if normalize else means
