"""Sequence classifiers (a label per input, its probabilities) and cross-encoders (a score per
(query, document) pair, from one forward of the pair): the engine's rows are the head's logits."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from common.modelfolder import ModelFolder
from common.wire import Tokens
from server.core import outputs
from server.core.inputs import RequestContext
from server.kinds.base import OutputKind
from server.kinds.pairs import PairAsk, Pairs, encode_pairs


def label(ctx: RequestContext, index: int) -> str:
    return ctx.folder.id2label.get(index, f"LABEL_{index}")


class Labels(OutputKind):
    """A sequence classifier: the head's logits per input, as labels and their probabilities."""

    name = "labels"
    capabilities: ClassVar[tuple[str, ...]] = ("classify",)


class CrossEncoder(Labels):
    """A reranker: a (query, document) pair's score from one forward of the pair."""

    name = "cross-encoder"
    capabilities: ClassVar[tuple[str, ...]] = ("rerank",)
    reads_pairs = True

    def tei_type(self, folder: ModelFolder) -> dict[str, Any]:
        return {"reranker": super().tei_type(folder)["classifier"]}

    def pairs(self, ask: PairAsk, ctx: RequestContext) -> tuple[list[Tokens], Pairs]:
        return encode_pairs(ask, ctx, cross=True)

    def scores(self, vectors: Any, pairs: Pairs, ctx: RequestContext, raw: bool = False) -> np.ndarray:
        """Logits when `raw`, else the sigmoid, as CrossEncoder.predict gives them."""
        return outputs.scores(vectors, raw)[:, 0]
