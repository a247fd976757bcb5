"""Qwen3 (Qwen3-Embedding, Qwen3-Reranker) in plain torch, packed without padding.

A decoder: RMSNorm before attention and before the MLP, rotary positions, grouped-query attention
with an RMSNorm over each head's queries and keys (before the rotation), causal attention within
each input (engine.layers.encoder.attend), a SwiGLU MLP and a final RMSNorm. Checkpoints of Qwen3ForCausalLM
name the decoder `model.*`; Qwen3Model's (Qwen3-Embedding's) have no prefix.

An embedding model returns the last hidden states, pooled afterwards (last token). A folder served
as a yes/no reranker (common.modelfolder: Qwen3ForCausalLM without sentence-transformers modules)
returns one logit per input, l_yes - l_no at its last token, from those two rows of the LM head only
(never the whole vocabulary): its sigmoid is softmax([l_no, l_yes])[1], the model card's P(yes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from common.folderjson import ModelError
from engine.layers.encoder import ACTIVATIONS, Rotary, attend, load_checkpoint, rotary_base, rotate, stacked
from engine.layers.packed import Packed

FULL = "full_attention"
DEFAULT_THETA = 10_000.0  # Qwen3Config's, for a config that names no rotary base


def rope_theta(c: dict[str, Any]) -> float:
    """The rotary base; a ModelError for any rotary scaling (YaRN, dynamic, ...), which is not computed
    here (common.native.native_model leaves such folders to transformers)."""
    params, scaling = c.get("rope_parameters") or {}, c.get("rope_scaling") or {}
    kinds = {params.get("rope_type"), scaling.get("rope_type"), scaling.get("type")} - {None, "default"}
    if kinds:
        raise ModelError(f"rope type {next(iter(kinds))!r} is not implemented by the native Qwen3 engine")
    return rotary_base(c, None, "rope_theta", DEFAULT_THETA)


def head_size(c: dict[str, Any]) -> int:
    return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])


class RMSNorm(nn.Module):
    """Qwen3's RMSNorm: normalised in float32, back to the input's dtype, then scaled by the weight."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, bias, eps = c["hidden_size"], bool(c.get("attention_bias")), float(c.get("rms_norm_eps", 1e-6))
        self.heads = c["num_attention_heads"]
        self.kv_heads = int(c.get("num_key_value_heads") or self.heads)
        self.size = head_size(c)
        self.q_proj = nn.Linear(hidden, self.heads * self.size, bias=bias)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.size, bias=bias)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.size, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.size, hidden, bias=bias)
        self.q_norm = RMSNorm(self.size, eps)
        self.k_norm = RMSNorm(self.size, eps)

    def part_slices(self) -> dict[str, tuple[str, slice]]:
        """Where q, k and v lie in the fused projection: a LoRA adapter's update of each goes there."""
        q, kv = self.heads * self.size, self.kv_heads * self.size
        return {
            "q_proj": ("qkv", slice(0, q)),
            "k_proj": ("qkv", slice(q, q + kv)),
            "v_proj": ("qkv", slice(q + kv, q + 2 * kv)),
        }

    def fuse(self) -> None:
        """One projection for q, k and v: one GEMM per layer instead of three."""
        parts = (self.q_proj, self.k_proj, self.v_proj)
        self.qkv = stacked(*parts)
        del self.q_proj, self.k_proj, self.v_proj  # keep one copy in memory

    def forward(self, x: torch.Tensor, p: Packed, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        widths = (self.heads * self.size, self.kv_heads * self.size, self.kv_heads * self.size)
        q, k, v = self.qkv(x).split(widths, dim=-1)
        q = rotate(self.q_norm(q.reshape(-1, self.heads, self.size)), *rotary)
        k = rotate(self.k_norm(k.reshape(-1, self.kv_heads, self.size)), *rotary)
        v = v.reshape(-1, self.kv_heads, self.size)
        return self.o_proj(attend(q, k, v, p, None, causal=True))  # type: ignore[no-any-return]


class MLP(nn.Module):
    """SwiGLU: down(act(gate(x)) * up(x)), gate and up as one projection once fused."""

    # what fuse() stacks: each part's (fused projection, index, parts), where a LoRA adapter's update of it goes
    PARTS = {"gate_proj": ("gate_up", 0, 2), "up_proj": ("gate_up", 1, 2)}

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, inner = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = ACTIVATIONS[c.get("hidden_act", "silu")]

    def fuse(self) -> None:
        self.gate_up = stacked(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(self.act(gate) * up)  # type: ignore[no-any-return]


class Layer(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        eps = float(c.get("rms_norm_eps", 1e-6))
        self.input_layernorm = RMSNorm(c["hidden_size"], eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], eps)
        self.mlp = MLP(c)

    def forward(self, x: torch.Tensor, p: Packed, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), p, rotary)
        return x + self.mlp(self.post_attention_layernorm(x))  # type: ignore[no-any-return]


class Qwen3(nn.Module):
    """The packed last hidden states [T, H]; with score_tokens (no, yes), l_yes - l_no [B, 1] at each
    input's last token."""

    def __init__(self, c: dict[str, Any], score_tokens: tuple[int, int] | None) -> None:
        super().__init__()
        if c.get("use_sliding_window"):
            raise ModelError("sliding-window attention is not implemented by the native Qwen3 engine")
        hidden = c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], hidden)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(hidden, float(c.get("rms_norm_eps", 1e-6)))
        self.rotary = Rotary({FULL: rope_theta(c)}, head_size(c))
        self.score_tokens = score_tokens
        self.tied = bool(c.get("tie_word_embeddings", False))  # Qwen3Config's default
        if score_tokens is not None and not self.tied:  # the checkpoint's own LM head, [vocab, H]
            self.lm_head = nn.Linear(hidden, c["vocab_size"], bias=False)

    def loaded(self, device: torch.device | None) -> None:
        """After the checkpoint (which fused the projections): keep the LM head's yes/no rows alone
        (the embeddings' rows where the head is tied to them), place the rotary tables."""
        if self.score_tokens is not None:
            head = self.embed_tokens if self.tied else self.lm_head
            # [2, H]: no, yes; a buffer, so a compiled forward finds it by name (engine/compiling/package.py)
            self.register_buffer("score", head.weight[list(self.score_tokens)].clone(), persistent=False)
            if not self.tied:
                del self.lm_head
        self.rotary.place(device)

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.embed_tokens(p.ids)
        rotary = self.rotary.tables(p.positions, x.dtype)[FULL]
        for layer in self.layers:
            x = layer(x, p, rotary)
        if self.score_tokens is None:
            return self.norm(x)  # type: ignore[no-any-return]
        last = self.norm(x[p.starts + p.lengths - 1])
        no, yes = F.linear(last, self.score).float().unbind(dim=-1)  # type: ignore[arg-type]
        return (yes - no)[:, None]


def load(
    folder: Path,
    config: dict[str, Any],
    num_labels: int | None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
    score_tokens: tuple[int, int] | None = None,
) -> nn.Module:
    """An embedding model, or with score_tokens a yes/no reranker; common.modelfolder serves no Qwen3
    sequence classifier natively (num_labels is the reranker's one score)."""
    if num_labels and score_tokens is None:
        raise ModelError(f"cannot load model from {folder}: no native Qwen3 sequence classifier")
    model = load_checkpoint(
        lambda: Qwen3(config, score_tokens), folder, lambda key: key.removeprefix("model."), device, dtype
    )
    model.loaded(device)
    return model


def load_scorer(
    folder: Path, config: dict[str, Any], score_tokens: tuple[int, int], device: torch.device | None, dtype: torch.dtype
) -> nn.Module:
    return load(folder, config, 1, device, dtype, score_tokens)
