"""Texts and images in one space (a CLIP or SigLIP model): a dense vector per input, each through
its own tower; pairs scored by the cosine in the shared space. How each peer's body names its
images is server/vision/multimodal.py's."""

from __future__ import annotations

from typing import Any, ClassVar

from common.modelfolder import ModelFolder
from common.settings import Settings
from common.wire import Tokens
from server.core.inputs import RequestContext
from server.kinds.dense import Dense
from server.kinds.pairs import PairAsk, Pairs
from server.vision import multimodal


def shared_space_pairs(
    lefts: list[multimodal.Item],
    rights: list[multimodal.Item],
    ctx: RequestContext,
    truncate: int | None,
    fields: tuple[str, str],
) -> tuple[list[Tokens], Pairs]:
    """Pairs of texts and images: each distinct input of a side encoded once (a query against N
    images is tokenized once)."""
    left, right = list(dict.fromkeys(lefts)), list(dict.fromkeys(rights))
    ctx.admit(len(left) + len(right), fields[1])  # both encodes below are covered by these permits
    tokens = multimodal.encode(left, ctx, fields[0], truncate).tokens
    tokens += multimodal.encode(right, ctx, fields[1], truncate).tokens
    left_at = {item: i for i, item in enumerate(left)}
    right_at = {item: len(left) + i for i, item in enumerate(right)}
    return tokens, Pairs(len(lefts), False, [left_at[x] for x in lefts], [right_at[x] for x in rights])


class ImageText(Dense):
    """CLIP and SigLIP: texts and images, each through its tower, into one space; pairs scored by the cosine."""

    name = "image-text"
    takes_images: ClassVar[bool] = True

    def card(self, folder: ModelFolder, settings: Settings) -> dict[str, Any]:
        assert folder.vision is not None
        return {"outputs": ["dense"], "pooling": folder.vision.family}  # each tower's own, into the shared space

    def pairs(self, ask: PairAsk, ctx: RequestContext) -> tuple[list[Tokens], Pairs]:
        """Texts as /v1/embeddings encodes them on this model."""
        lefts: list[multimodal.Item] = [("text", t) for t in ask.lefts]
        rights: list[multimodal.Item] = [("text", t) for t in ask.rights]
        return shared_space_pairs(lefts, rights, ctx, ask.truncate, ask.fields)
