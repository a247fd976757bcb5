"""What follows the encoder, one module per output (pooling, Dense, SPLADE, ColBERT, bge-m3), and the
engine's output heads: what it answers for an input, by the name common.wire.Tokens.head gives.

A head answers a list of inputs with one answer per input, in their order, from one forward of
them. A group mixing heads runs each head on its own inputs (answer()); an input that names none
gets its model's default head, decided once at load from its folder (default_head()).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from common.modelfolder import ModelFolder
    from common.wire import Tokens


class Model(Protocol):
    """What the heads ask of engine.runtime.model.PoolingModel (which imports this package)."""

    default_head: str

    def forward(self, items: list[Tokens]) -> Any: ...
    def forward_tokens(self, items: list[Tokens]) -> Any: ...
    def forward_outputs(self, items: list[Tokens]) -> Any: ...


Head = Callable[[Model, list["Tokens"]], Any]

HEADS: dict[str, Head] = {
    # the model's row per input: pooled (and Dense) for embedders, logits for classifiers and
    # cross-encoders, SPLADE weights for sparse models; a CLIP's towers' embeddings
    "pooled": lambda model, items: model.forward(items),
    # each token's row: an embedder's last hidden state, a ColBERT's normalised token vectors
    "tokens": lambda model, items: model.forward_tokens(items),
    # bge-m3's outputs each input names (Tokens.outputs): the three from one forward
    "m3": lambda model, items: model.forward_outputs(items),
}


def default_head(folder: ModelFolder) -> str:
    """The head an input that names none gets: a multi-vector model's answer is its token vectors."""
    return "tokens" if folder.kind == "multi-vector" else "pooled"


def answer(model: Model, items: list[Tokens]) -> Any:
    """The group's answers: one head's as it answers them where all name it (the wire docstring,
    common/wire.py), else a list, each input's answer in its place."""
    names = [item.head or model.default_head for item in items]
    unknown = set(names) - HEADS.keys()
    if unknown:
        raise ValueError(f"no engine head named {', '.join(sorted(unknown))} (there are: {', '.join(HEADS)})")
    if len(set(names)) == 1:
        return HEADS[names[0]](model, items)
    answers = {
        name: iter(HEADS[name](model, [item for item, n in zip(items, names, strict=True) if n == name]))
        for name in dict.fromkeys(names)
    }
    return [next(answers[name]) for name in names]
