"""EmbeddingGemma: Gemma 3's text model with bidirectional attention, in plain torch.

A decoder's layer run as an encoder: token embeddings scaled by sqrt(hidden_size); Gemma's RMSNorm
(x * (1 + weight), in float32) before and after both attention and the MLP; queries and keys
RMS-normed per head, then rotated; grouped-query attention scaled by query_pre_attn_scalar^-0.5
(not head_dim's); a GeGLU MLP (gate and up projections); a final norm. Layers are global or
sliding, each kind with its own rotary base. With use_bidirectional_attention a global layer's
token sees every other, and a sliding layer's those within sliding_window // 2 either way
(transformers keeps sliding_window // 2 + 1 as an exclusive bound): the shared band mask.

Causal Gemma 3 models and ones with attention logit softcapping are left to transformers
(common.native.native_model). final_logit_softcapping caps the language-model head's logits,
which an embedding model never computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.folderjson import ModelError
from engine.layers.encoder import ACTIVATIONS, Rotary, attend, load_checkpoint, rotary_base, rotate
from engine.layers.packed import Packed

FULL, SLIDING = "full_attention", "sliding_attention"
# Gemma3TextConfig's defaults, for configs that predate layer_types and rope_parameters
DEFAULT_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}
OLD_THETA_KEYS = {FULL: "rope_theta", SLIDING: "rope_local_base_freq"}
DEFAULTS = {
    "head_dim": 256,
    "num_key_value_heads": 4,
    "query_pre_attn_scalar": 256,
    "rms_norm_eps": 1e-6,
    "sliding_window": 4096,
    "hidden_activation": "gelu_pytorch_tanh",
}


def setting(c: dict[str, Any], key: str) -> Any:
    """A config value, or Gemma3TextConfig's default where config.json leaves it out (or null)."""
    value = c.get(key)
    return DEFAULTS[key] if value is None else value


def layer_types(c: dict[str, Any]) -> list[str]:
    """Each layer's attention: `layer_types`, or (older configs) every `sliding_window_pattern`-th
    layer global, counting from 1, the others sliding."""
    if c.get("layer_types"):
        return list(c["layer_types"])
    every = int(c.get("sliding_window_pattern", 6))
    return [SLIDING if (i + 1) % every else FULL for i in range(c["num_hidden_layers"])]


def sliding_reach(c: dict[str, Any]) -> int:
    """How far either way a bidirectional sliding layer's token sees: config.json's sliding_window
    // 2 (transformers' config keeps sliding_window // 2 + 1, an exclusive bound, for flash attention)."""
    return int(setting(c, "sliding_window")) // 2


def rope_theta(c: dict[str, Any], kind: str) -> float:
    """The rotary base of `kind` layers: `rope_parameters`, or (older configs) rope_theta for global
    layers and rope_local_base_freq for sliding ones."""
    return rotary_base(c, kind, OLD_THETA_KEYS[kind], DEFAULT_THETA[kind])


class RMSNorm(nn.Module):
    """Gemma's RMSNorm: in float32, scaled by (1 + weight), then back to the input's dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).type_as(x)


class Attention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, bias, eps = c["hidden_size"], bool(c.get("attention_bias")), float(setting(c, "rms_norm_eps"))
        self.heads, self.kv_heads = c["num_attention_heads"], int(setting(c, "num_key_value_heads"))
        size = int(setting(c, "head_dim"))
        self.q_proj = nn.Linear(hidden, self.heads * size, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * size, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * size, bias=bias)
        self.o_proj = nn.Linear(self.heads * size, hidden, bias=bias)
        self.q_norm = RMSNorm(size, eps)
        self.k_norm = RMSNorm(size, eps)
        self.scale = float(setting(c, "query_pre_attn_scalar")) ** -0.5

    def forward(
        self, x: torch.Tensor, p: Packed, rotary: tuple[torch.Tensor, torch.Tensor], reach: int | None
    ) -> torch.Tensor:
        tokens = x.shape[0]
        q = rotate(self.q_norm(self.q_proj(x).view(tokens, self.heads, -1)), *rotary)
        k = rotate(self.k_norm(self.k_proj(x).view(tokens, self.kv_heads, -1)), *rotary)
        v = self.v_proj(x).view(tokens, self.kv_heads, -1)
        # query head h reads key/value head h // (heads / kv_heads). Expanded here, not by attend()'s
        # enable_gqa: CUDA's memory-efficient kernel, the one a band mask needs, takes no grouped heads
        if self.kv_heads != self.heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        return self.o_proj(attend(q, k, v, p, scale=self.scale, reach=reach))  # type: ignore[no-any-return]


class MLP(nn.Module):
    """GeGLU: down(act(gate(x)) * up(x))."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, inner = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = ACTIVATIONS[setting(c, "hidden_activation")]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))  # type: ignore[no-any-return]


class Layer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, eps = c["hidden_size"], float(setting(c, "rms_norm_eps"))
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(c)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def forward(
        self, x: torch.Tensor, p: Packed, rotary: tuple[torch.Tensor, torch.Tensor], reach: int | None
    ) -> torch.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), p, rotary, reach))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))  # type: ignore[no-any-return]


class Gemma3(nn.Module):
    """The packed last hidden states [T, H]."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden = c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(hidden, float(setting(c, "rms_norm_eps")))
        self.kinds = layer_types(c)
        self.embed_scale = torch.tensor(hidden**0.5)  # set in the weights' dtype by place()
        self.reach = sliding_reach(c)
        self.rotary = Rotary({kind: rope_theta(c, kind) for kind in set(self.kinds)}, int(setting(c, "head_dim")))

    def place(self, device: torch.device | None, dtype: torch.dtype) -> None:
        """The rotary tables and the embedding scale onto the loaded model's device; the scale in
        its dtype, as transformers applies it (sqrt(768) = 27.71 is 27.75 in bfloat16)."""
        self.rotary.place(device)
        self.embed_scale = self.embed_scale.to(device=device or "cpu", dtype=dtype)

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.embed_tokens(p.ids) * self.embed_scale
        rotary = self.rotary.tables(p.positions, x.dtype)
        for layer, kind in zip(self.layers, self.kinds, strict=True):
            x = layer(x, p, rotary[kind], self.reach if kind == SLIDING else None)
        return self.norm(x)  # type: ignore[no-any-return]


def load(
    folder: Path,
    config: dict[str, Any],
    num_labels: int | None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    if num_labels:  # common.modelfolder serves only Gemma3TextModel natively: an embedding model
        raise ModelError(f"cannot load model from {folder}: no native Gemma 3 sequence classifier")
    model = load_checkpoint(lambda: Gemma3(config), folder, lambda key: key, device, dtype)
    model.place(device, dtype)
    return model
