"""SPLADE after the encoder: BERT's masked-LM head over each token, then SPLADE pooling.

A head module like the classifier's, fed the encoder's packed hidden states [T, H]: the head's
logits [T, V] exist for one group of a batch at a time (384 tokens x 30,522 entries is 47 MB in
float32), and only the pooled [B, V] weights leave the engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.folderjson import ModelError
from common.splade import Splade
from engine.layers.checkpoint import read_checkpoint, renamed_around
from engine.layers.encoder import ACTIVATIONS, legacy_norm_names, no_init
from engine.layers.packed import Packed


class MLMHead(nn.Module):
    """BERT's `cls.predictions`: dense -> activation -> LayerNorm, then the decoder over the
    vocabulary (its weight the word embeddings' where the checkpoint ties them)."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden = c["hidden_size"]
        self.dense = nn.Linear(hidden, hidden)
        self.act = ACTIVATIONS[c.get("hidden_act", "gelu")]
        self.LayerNorm = nn.LayerNorm(hidden, eps=c.get("layer_norm_eps", 1e-12))
        self.decoder = nn.Linear(hidden, c["vocab_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.LayerNorm(self.act(self.dense(x))))  # type: ignore[no-any-return]


def activate(logits: torch.Tensor, splade: Splade) -> torch.Tensor:
    """log(1 + relu(logits)), log1p once more for `log1p_relu`; every weight >= 0."""
    weights = torch.log1p(torch.relu(logits))
    return torch.log1p(weights) if splade.activation == "log1p_relu" else weights


def pool_packed(weights: torch.Tensor, p: Packed, splade: Splade) -> torch.Tensor:
    """Each input's max (or sum) over its own tokens of the packed [T, V] weights: [B, V]."""
    if splade.strategy == "sum":  # summed in float32 whatever the model's dtype, as the reference sums
        sums = weights.new_zeros((p.batch, weights.shape[-1]), dtype=torch.float32)
        return sums.index_add_(0, p.seq, weights.float()).to(weights.dtype)
    if torch.compiler.is_compiling():  # exported: no Python spans; the weights are >= 0, so 0 starts the max
        return weights.new_zeros((p.batch, weights.shape[-1])).index_reduce_(0, p.seq, weights, "amax")
    # one reduction per input: a scatter's [T, V] index, or a padded grid, would outweigh the logits
    return torch.stack([weights[start : start + n].amax(dim=0) for start, n in p.spans])


def pool_padded(logits: torch.Tensor, mask: torch.Tensor, splade: Splade) -> torch.Tensor:
    """The same over a padded [B, L, V] batch: padding weighs 0, as SpladePooling masks it."""
    weights = activate(logits * mask.unsqueeze(-1).to(logits.dtype), splade)
    return weights.sum(dim=1) if splade.strategy == "sum" else weights.max(dim=1).values


class SparseModel(nn.Module):
    """An encoder (packed batch in, hidden states [T, H] out) with the SPLADE head after it: [B, V].
    Its head runs per token, as the encoder's layers do: a LoRA adapter's update there is added to its
    inputs' token rows like any projection's (engine/layers/lora.py)."""

    PER_INPUT: tuple[str, ...] = ()  # no module of it runs on one row per input (engine/layers/lora_heads.py)

    def __init__(self, encoder: nn.Module, head: MLMHead, splade: Splade) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head
        self.splade = splade
        renamed_around(self, "encoder", _head_key)

    def forward(self, p: Packed) -> torch.Tensor:
        return pool_packed(activate(self.head(self.encoder(p)), self.splade), p, self.splade)


_HEAD = "cls.predictions."  # BERT's masked-LM head in its checkpoints (BertForMaskedLM's names)


def head_name(key: str) -> str | None:
    """A checkpoint key of the masked-LM head as MLMHead names it; None for a key outside the head."""
    if not key.startswith(_HEAD):
        return None
    name = legacy_norm_names(key.removeprefix(_HEAD).removeprefix("transform."))
    return "decoder.bias" if name == "bias" else name


def _head_key(key: str) -> str | None:
    name = head_name(key)
    return None if name is None else f"head.{name}"


def load_head(
    folder: Path, config: dict[str, Any], encoder: nn.Module, device: torch.device, dtype: torch.dtype
) -> MLMHead:
    """BERT's masked-LM head from the checkpoint (`cls.predictions.*`), its tensors taken as they
    are mapped (engine.layers.encoder.load_checkpoint); ModelError if it has none."""
    weights = read_checkpoint(folder)
    state: dict[str, torch.Tensor] = {}
    # the head's bias, kept beside the decoder in BERT's checkpoints (and maybe as the decoder's too): it wins
    for key in sorted(weights, key=lambda k: k == f"{_HEAD}bias"):
        name = head_name(key)
        if name is not None:
            state[name] = weights[key]
    if "decoder.weight" not in state:  # tied: the word embeddings are the decoder
        state["decoder.weight"] = encoder.get_parameter("embeddings.word_embeddings.weight")
    with no_init():
        head = MLMHead(config)
    state = {k: v.to(device) for k, v in state.items()}  # no copy on the CPU
    missing, _ = head.load_state_dict(state, strict=False, assign=True)
    if missing:
        raise ModelError(f"cannot load the masked-LM head from {folder}: weights missing for {missing[:5]}")
    return head.to(dtype).eval()
