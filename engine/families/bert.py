"""BERT-family encoders in plain torch, so the engine serves them without importing transformers.

On these machines `import transformers` plus its model-loading path costs ~3 s of a ~5 s cold
start, more than torch itself; TEI likewise ships its own model implementations. The module
names mirror transformers' BertModel so checkpoints load by name; any model no native family
covers (see common.native.native_model) is loaded with transformers instead.

Batches run packed, without padding: every linear layer (nearly all of the work) sees only real
tokens, and attention runs per input on that input's own tokens, as TEI does with varlen attention
(engine/layers/encoder.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.encoder import encoder_loader, legacy_norm_names
from engine.layers.packed import Packed


class Embeddings(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.word_embeddings(p.ids) + self.token_type_embeddings(p.types) + self.position_embeddings(p.positions)
        return self.LayerNorm(x)  # type: ignore[no-any-return]


def _rename(key: str) -> str:
    """Checkpoint names -> ours: drop the task model's `bert.` prefix; the classifier's pooler and
    linear layer are our head's dense and out_proj."""
    key = legacy_norm_names(key.removeprefix("bert."))
    if key.startswith("pooler.dense."):
        return "head.dense." + key.removeprefix("pooler.dense.")
    if key.startswith("classifier."):
        return "head.out_proj." + key.removeprefix("classifier.")
    return key


load = encoder_loader(Embeddings, _rename)
