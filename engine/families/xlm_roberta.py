"""RoBERTa and XLM-RoBERTa (bge-m3, multilingual-e5, bge-reranker-v2-m3, all-distilroberta) in plain torch.

BERT's encoder under other names; what differs is in the embeddings: positions count from the
padding index + 1, and token types are not an input (the tokenizers give none, so every token
takes type 0). The classifier is RoBERTa's head (dense -> tanh -> out_proj on the first token).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.encoder import encoder_loader, legacy_norm_names
from engine.layers.packed import Packed, offset_positions


class Embeddings(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden = c["hidden_size"]
        self.padding_idx = 1 if c.get("pad_token_id") is None else int(c["pad_token_id"])
        self.word_embeddings = nn.Embedding(c["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], hidden)
        self.token_type_embeddings = nn.Embedding(c.get("type_vocab_size", 2), hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, p: Packed) -> torch.Tensor:
        positions = offset_positions(p, self.padding_idx)
        x = self.word_embeddings(p.ids) + self.token_type_embeddings.weight[0] + self.position_embeddings(positions)
        return self.LayerNorm(x)  # type: ignore[no-any-return]


def _rename(key: str) -> str:
    """Checkpoint names -> ours: drop the task model's `roberta.` prefix; the classification head
    (`classifier.dense`, `classifier.out_proj`) is our head."""
    key = legacy_norm_names(key.removeprefix("roberta."))
    return "head." + key.removeprefix("classifier.") if key.startswith("classifier.") else key


load = encoder_loader(Embeddings, _rename)
