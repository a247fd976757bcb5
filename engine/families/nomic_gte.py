"""NomicBERT (nomic-embed-text v1, v1.5) and GTE (transformers' `gte`: gte-*-v1.5 ports), one
architecture under two names, in plain torch.

BERT's post-LayerNorm layer with rotary positions in place of position embeddings (Llama's: the
halves rotated, in the model's dtype, one base for every layer), attention from one fused QKV
projection, and a gated MLP down(act(gate(x)) * up(x)): SwiGLU for Nomic, GeGLU for GTE. Embeddings
are words (+ token types), then LayerNorm. What differs between the two: Nomic has no biases, GTE has
them on attention and on the MLP's output; gte-base-en-v1.5 has no token types; the default
activation and rotary base; and the checkpoint names, which transformers keeps in each model's
original layout (Nomic: Wqkv, fc11 = up, fc12 = gate, fc2; GTE: qkv_proj, up_gate_proj = [up; gate]).

Real nomic-embed folders keep the original nomic-bert config (n_embd, n_layer, ..., and switches
such as prenorm): those names are read where transformers' are absent, and common.modelfolder serves
natively only the switch values computed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from common.folderjson import ModelError
from engine.layers.encoder import ACTIVATIONS, Rotary, attend, load_checkpoint, rotary_base, rotate, stacked
from engine.layers.packed import Packed

GLOBAL = "global"  # every layer's rotary kind
# transformers' config keys -> the original nomic-bert config's names for the same values
NOMIC_NAMES = {
    "hidden_size": "n_embd",
    "num_hidden_layers": "n_layer",
    "num_attention_heads": "n_head",
    "intermediate_size": "n_inner",
    "layer_norm_eps": "layer_norm_epsilon",
}
# what both config classes default to
DEFAULTS = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "layer_norm_eps": 1e-12,
}


@dataclass(frozen=True)
class Family:
    prefix: str  # the task models' (…ForMaskedLM) prefix in checkpoint names
    bias: bool  # attention's and the MLP output's
    split_mlp: bool  # up and gate stored apart (Nomic's fc11, fc12), else as one [up; gate]
    defaults: dict[str, Any]  # the config class's defaults where the two differ
    renames: tuple[tuple[str, str], ...]  # checkpoint name pieces -> ours


FAMILIES = {
    "nomic_bert": Family(
        prefix="nomic_bert.",
        bias=False,
        split_mlp=True,
        defaults={"hidden_act": "silu", "type_vocab_size": 2, "rope_theta": 1000.0},
        renames=(
            ("emb_ln.", "embeddings.LayerNorm."),
            ("encoder.layers.", "layers."),
            ("attn.Wqkv.", "qkv."),
            ("attn.out_proj.", "out."),
            ("mlp.fc11.", "mlp.up."),
            ("mlp.fc12.", "mlp.gate."),
            ("mlp.fc2.", "mlp.down."),
            ("norm1.", "attn_norm."),
            ("norm2.", "mlp_norm."),
        ),
    ),
    "gte": Family(
        prefix="gte.",
        bias=True,
        split_mlp=False,
        defaults={"hidden_act": "gelu", "type_vocab_size": 1, "rope_theta": 160_000.0},
        renames=(
            ("encoder.layer.", "layers."),
            ("attention.qkv_proj.", "qkv."),
            ("attention.o_proj.", "out."),
            ("mlp.up_gate_proj.", "mlp.up_gate."),
            ("mlp.down_proj.", "mlp.down."),
            ("attn_ln.", "attn_norm."),
            ("mlp_ln.", "mlp_norm."),
        ),
    ),
}


def setting(c: dict[str, Any], key: str) -> Any:
    """A config value: transformers' key, else (Nomic's original config) its old name, else the
    family's default."""
    for name in (key, NOMIC_NAMES.get(key)):
        if name is not None and c.get(name) is not None:
            return c[name]
    return {**DEFAULTS, **FAMILIES[str(c["model_type"])].defaults}[key]


def rope_theta(c: dict[str, Any]) -> float:
    """`rope_parameters`, or a flat rope_theta, or Nomic's rotary_emb_base, else the family's default."""
    fallback = c.get("rotary_emb_base") or setting(c, "rope_theta")
    return rotary_base(c, None, "rope_theta", float(fallback))


def head_size(c: dict[str, Any]) -> int:
    return int(c.get("head_dim") or setting(c, "hidden_size") // setting(c, "num_attention_heads"))


class Embeddings(nn.Module):
    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        hidden, types = setting(c, "hidden_size"), int(setting(c, "type_vocab_size"))
        self.word_embeddings = nn.Embedding(c["vocab_size"], hidden)
        # gte-base-en-v1.5 (type_vocab_size 0) has none
        self.token_type_embeddings = nn.Embedding(types, hidden) if types else None
        self.LayerNorm = nn.LayerNorm(hidden, eps=float(setting(c, "layer_norm_eps")))

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.word_embeddings(p.ids)
        if self.token_type_embeddings is not None:
            x = x + self.token_type_embeddings(p.types)
        return self.LayerNorm(x)  # type: ignore[no-any-return]


class MLP(nn.Module):
    """Gated: down(act(gate(x)) * up(x)), up and gate one [2 * inner, hidden] projection once joined."""

    def __init__(self, c: dict[str, Any], family: Family) -> None:
        super().__init__()
        hidden, inner = setting(c, "hidden_size"), setting(c, "intermediate_size")
        if family.split_mlp:
            self.up = nn.Linear(hidden, inner, bias=False)
            self.gate = nn.Linear(hidden, inner, bias=False)
        else:
            self.up_gate = nn.Linear(hidden, 2 * inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=family.bias)
        self.act = ACTIVATIONS[setting(c, "hidden_act")]

    def join(self) -> None:
        """One GEMM for up and gate: Nomic's two projections stacked as GTE stores them."""
        if hasattr(self, "up"):
            self.up_gate = stacked(self.up, self.gate)
            del self.up, self.gate  # keep one copy in memory

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up, gate = self.up_gate(x).chunk(2, dim=-1)
        return self.down(self.act(gate) * up)  # type: ignore[no-any-return]


class Layer(nn.Module):
    """Attention, + residual, LayerNorm; MLP, + residual, LayerNorm."""

    def __init__(self, c: dict[str, Any], family: Family) -> None:
        super().__init__()
        hidden, eps = setting(c, "hidden_size"), float(setting(c, "layer_norm_eps"))
        self.heads = int(setting(c, "num_attention_heads"))
        width = self.heads * head_size(c)
        self.qkv = nn.Linear(hidden, 3 * width, bias=family.bias)
        self.out = nn.Linear(width, hidden, bias=family.bias)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.mlp = MLP(c, family)
        self.mlp_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, p: Packed, rotary: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, -1).unbind(dim=1)
        x = self.attn_norm(x + self.out(attend(rotate(q, *rotary), rotate(k, *rotary), v, p, None)))
        return self.mlp_norm(x + self.mlp(x))  # type: ignore[no-any-return]


class RotaryEncoder(nn.Module):
    """The packed last hidden states [T, H]."""

    def __init__(self, c: dict[str, Any]) -> None:
        super().__init__()
        family = FAMILIES[str(c["model_type"])]
        self.embeddings = Embeddings(c)
        self.layers = nn.ModuleList(Layer(c, family) for _ in range(int(setting(c, "num_hidden_layers"))))
        self.rotary = Rotary({GLOBAL: rope_theta(c)}, head_size(c))

    def loaded(self, device: torch.device | None) -> None:
        """After the checkpoint: join each MLP's projections, place the rotary tables."""
        for module in self.modules():
            if isinstance(module, MLP):
                module.join()
        self.rotary.place(device)

    def forward(self, p: Packed) -> torch.Tensor:
        x = self.embeddings(p)
        rotary = self.rotary.tables(p.positions, x.dtype)[GLOBAL]
        for layer in self.layers:
            x = layer(x, p, rotary)
        return x


def rename(family: Family, key: str) -> str:
    """Checkpoint names -> ours: the task model's prefix dropped (GTE's original `new.` too), the
    family's module names ours."""
    key = key.removeprefix(family.prefix).removeprefix("new.")
    for old, new in family.renames:
        key = key.replace(old, new)
    return key


def load(
    folder: Path,
    config: dict[str, Any],
    num_labels: int | None,
    device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    family = FAMILIES[str(config["model_type"])]
    if num_labels:  # common.modelfolder serves only the encoders natively
        raise ModelError(f"cannot load model from {folder}: no native {config['model_type']} sequence classifier")
    model = load_checkpoint(lambda: RotaryEncoder(config), folder, lambda key: rename(family, key), device, dtype)
    model.loaded(device)
    return model
