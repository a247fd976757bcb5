"""MPNet (all-mpnet-base-v2 and its kin) in plain torch.

BERT's encoder under other names, plus a relative position bias added to every layer's attention
scores: T5-style buckets of the distance between two tokens, one learned value per bucket and head,
shared by all layers. It depends on the distance alone, so it is built once at load time for the
longest input the model takes, and each input on the packed layout uses its top-left corner.
Absolute positions count from the padding index + 1, as in RoBERTa.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.layers.encoder import EncoderModel, legacy_norm_names, load_checkpoint
from engine.layers.packed import Packed, offset_positions

# transformers' MPNet fixes these, whatever config.json says: padding index 1 for the positions,
# 32 buckets up to a distance of 128 for the bias.
PADDING_IDX = 1
BUCKETS = 32
MAX_DISTANCE = 128


class Embeddings(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden = c["hidden_size"]
        self.word_embeddings = nn.Embedding(c["vocab_size"], hidden)
        self.position_embeddings = nn.Embedding(c["max_position_embeddings"], hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=c.get("layer_norm_eps", 1e-12))

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.word_embeddings(p.ids) + self.position_embeddings(offset_positions(p, PADDING_IDX))
        return self.LayerNorm(x)  # type: ignore[no-any-return]


class MPNet(EncoderModel):
    def __init__(self, c: dict[str, Any], num_labels: int | None) -> None:
        super().__init__(c, Embeddings(c), num_labels)
        self.relative_attention_bias = nn.Embedding(
            c.get("relative_attention_num_buckets", 32), c["num_attention_heads"]
        )
        # every position, rounded up to 16 so each row of the table starts aligned, as CUDA's
        # memory-efficient attention wants of a bias (else it copies it into a padded one per call)
        self.longest = -(-c["max_position_embeddings"] // 16) * 16
        # a buffer, not a bare attribute, so a compiled forward finds it by name (engine/compiling/package.py)
        self.register_buffer("bias", None, persistent=False)

    def build_bias(self) -> None:
        """The bias for every pair of positions up to the longest input, [heads, longest, longest]."""
        position = torch.arange(self.longest, device=self.relative_attention_bias.weight.device)
        buckets = relative_position_bucket(position[None, :] - position[:, None])
        with torch.no_grad():
            self.bias = self.relative_attention_bias(buckets).permute(2, 0, 1).contiguous()  # type: ignore[assignment]

    def attention_bias(self, p: Packed) -> torch.Tensor | None:
        return self.bias


def relative_position_bucket(relative: torch.Tensor) -> torch.Tensor:
    """transformers' MPNetEncoder.relative_position_bucket: half the buckets for each direction,
    exact distances below a quarter of them, logarithmic ones beyond up to MAX_DISTANCE."""
    half = BUCKETS // 2
    n = -relative
    bucket = (n < 0).to(torch.long) * half
    n = torch.abs(n)
    exact = half // 2
    large = exact + (torch.log(n.float() / exact) / math.log(MAX_DISTANCE / exact) * (half - exact)).to(torch.long)
    large = torch.clamp(large, max=half - 1)
    return bucket + torch.where(n < exact, n, large)


def load(
    folder: Path,
    config: dict[str, Any],
    num_labels: int | None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    model = load_checkpoint(lambda: MPNet(config, num_labels), folder, _rename, device, dtype)
    model.build_bias()
    return model


# MPNet's attention names -> BERT's (engine/layers/encoder.py).
_LAYER_NAMES = (
    (".attention.attn.q.", ".attention.self.query."),
    (".attention.attn.k.", ".attention.self.key."),
    (".attention.attn.v.", ".attention.self.value."),
    (".attention.attn.o.", ".attention.output.dense."),
    (".attention.LayerNorm.", ".attention.output.LayerNorm."),
)


def _rename(key: str) -> str:
    """Checkpoint names -> ours: drop the task model's `mpnet.` prefix; attention under BERT's names;
    the bias table out of the encoder; the classification head is our head."""
    key = legacy_norm_names(key.removeprefix("mpnet."))
    for theirs, ours in _LAYER_NAMES:
        key = key.replace(theirs, ours)
    if key.startswith("encoder.relative_attention_bias."):
        return key.removeprefix("encoder.")
    return "head." + key.removeprefix("classifier.") if key.startswith("classifier.") else key
