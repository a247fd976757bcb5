"""ModernBERT (gte-modernbert, modernbert-embed, gte-reranker-modernbert) in plain torch.

Not BERT's layer: LayerNorm before attention and MLP (none before the first attention), no biases by
default, a GeGLU MLP, rotary positions instead of position embeddings, and attention that
alternates between global and a local window (|i - j| <= local_attention / 2), each kind with its
own rotary base. Attention itself is the shared per-input call (engine.layers.encoder.attend); the local
window is a band mask, which depends on distance alone, so each input uses its top-left corner.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.heads.pooling import pool_packed
from engine.layers.encoder import ACTIVATIONS, Rotary, attend, load_checkpoint, rotary_base, rotate
from engine.layers.packed import Packed

FULL, SLIDING = "full_attention", "sliding_attention"
# ModernBertConfig's defaults, for configs that predate layer_types and rope_parameters
DEFAULT_THETA = {FULL: 160_000.0, SLIDING: 10_000.0}
OLD_THETA_KEYS = {FULL: "global_rope_theta", SLIDING: "local_rope_theta"}


def layer_types(c: dict[str, Any]) -> list[str]:
    """Each layer's attention: `layer_types`, or (older configs) global every n-th layer from the first."""
    if c.get("layer_types"):
        return list(c["layer_types"])
    every = int(c.get("global_attn_every_n_layers", 3))
    return [SLIDING if i % every else FULL for i in range(c["num_hidden_layers"])]


def rope_theta(c: dict[str, Any], kind: str) -> float:
    """The rotary base of `kind` layers: `rope_parameters`, or (older configs) global/local_rope_theta."""
    return rotary_base(c, kind, OLD_THETA_KEYS[kind], DEFAULT_THETA[kind])


def _norm(c: dict[str, Any]) -> nn.LayerNorm:
    return nn.LayerNorm(c["hidden_size"], eps=c.get("norm_eps", 1e-5), bias=c.get("norm_bias", False))


class Embeddings(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.norm = _norm(c)

    def forward(self, p: Packed) -> torch.Tensor:
        return self.norm(self.tok_embeddings(p.ids))  # type: ignore[no-any-return]


class Attention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, bias = c["hidden_size"], c.get("attention_bias", False)
        self.heads = c["num_attention_heads"]
        self.Wqkv = nn.Linear(hidden, 3 * hidden, bias=bias)
        self.Wo = nn.Linear(hidden, hidden, bias=bias)

    def forward(
        self, x: torch.Tensor, p: Packed, rotary: tuple[torch.Tensor, torch.Tensor], reach: int | None
    ) -> torch.Tensor:
        q, k, v = self.Wqkv(x).view(x.shape[0], 3, self.heads, -1).unbind(dim=1)
        q, k = rotate(q, *rotary, in_float32=True), rotate(k, *rotary, in_float32=True)
        return self.Wo(attend(q, k, v, p, reach=reach))  # type: ignore[no-any-return]


class MLP(nn.Module):
    """GeGLU: Wo(act(input) * gate), input and gate the two halves of Wi's output."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, inner, bias = c["hidden_size"], c["intermediate_size"], c.get("mlp_bias", False)
        self.Wi = nn.Linear(hidden, 2 * inner, bias=bias)
        self.Wo = nn.Linear(inner, hidden, bias=bias)
        self.act = ACTIVATIONS[c.get("hidden_activation", "gelu")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner, gate = self.Wi(x).chunk(2, dim=-1)
        return self.Wo(self.act(inner) * gate)  # type: ignore[no-any-return]


class Layer(nn.Module):
    def __init__(self, c: dict[str, Any], index: int) -> None:
        super().__init__()
        self.attn_norm = nn.Identity() if index == 0 else _norm(c)  # the embeddings' norm serves layer 0
        self.attn = Attention(c)
        self.mlp_norm = _norm(c)
        self.mlp = MLP(c)

    def forward(
        self, x: torch.Tensor, p: Packed, rotary: tuple[torch.Tensor, torch.Tensor], reach: int | None
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), p, rotary, reach)
        return x + self.mlp(self.mlp_norm(x))  # type: ignore[no-any-return]


class Head(nn.Module):
    """ModernBertPredictionHead: dense -> activation -> norm, before the classifier."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        self.dense = nn.Linear(c["hidden_size"], c["hidden_size"], bias=c.get("classifier_bias", False))
        self.act = ACTIVATIONS[c.get("classifier_activation", "gelu")]
        self.norm = _norm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))  # type: ignore[no-any-return]


class ModernBert(nn.Module):
    """The packed last hidden states [T, H], or the classifier's logits [B, labels] with labels."""

    def __init__(self, c: dict[str, Any], num_labels: int | None) -> None:
        super().__init__()
        self.embeddings = Embeddings(c)
        self.layers = nn.ModuleList(Layer(c, i) for i in range(c["num_hidden_layers"]))
        self.kinds = layer_types(c)
        self.final_norm = _norm(c)
        if num_labels:
            self.head = Head(c)
            self.classifier = nn.Linear(c["hidden_size"], num_labels)
        self.num_labels = num_labels
        self.pooling = "mean" if c.get("classifier_pooling") == "mean" else "cls"
        self.window = int(c.get("local_attention", 128)) // 2
        size = c["hidden_size"] // c["num_attention_heads"]
        self.rotary = Rotary({kind: rope_theta(c, kind) for kind in (FULL, SLIDING)}, size)

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.embeddings(p)
        rotary = self.rotary.tables(p.positions, x.dtype)
        for layer, kind in zip(self.layers, self.kinds, strict=True):
            x = layer(x, p, rotary[kind], self.window if kind == SLIDING else None)
        x = self.final_norm(x)
        if not self.num_labels:
            return x
        pooled = pool_packed(x, p, "mean") if self.pooling == "mean" else x[p.starts]
        return self.classifier(self.head(pooled))  # type: ignore[no-any-return]


def load(
    folder: Path,
    config: dict[str, Any],
    num_labels: int | None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    model = load_checkpoint(
        lambda: ModernBert(config, num_labels), folder, lambda key: key.removeprefix("model."), device, dtype
    )
    model.rotary.place(device)
    return model
